#pragma once

/// \file
/// The configuration of an AMP server (spec §11): a plain struct holding every setting
/// with its default, and the parser that reads it from the JSON of a configuration file
/// and from command-line overrides (`--set key=value`). `amp-server` uses it, and so can
/// anyone who writes a gateway of their own; `server_config::broker_for` turns it into
/// the `broker_config` of a namespace.
///
/// The keys, with their defaults in parentheses and the values they accept:
/// - `listen` (`"127.0.0.1:8080"`): `"host:port"`, a port from 1 to 65535; an IPv6 host in
///   brackets, `"[::1]:8080"` (with a zone: `"[fe80::1%eth0]:80"`).
/// - `tls.cert`, `tls.key` (`null`): certificate chain and private key files (PEM), both
///   or neither; with them the server serves `wss://`.
/// - `nats` (absent): absent or `null`, the embedded in-memory transport (nothing
///   durable); an object, NATS (`{}`: NATS with every default).
/// - `nats.url` (`"nats://127.0.0.1:4222"`): a URL, or several separated by commas.
/// - `nats.creds` (`null`): a NATS credentials file.
/// - `nats.replicas` (`1`): 1..5.
/// - `nats.storage` (`"file"`): `"file"` or `"memory"`.
/// - `nats.domain` (`null`): the JetStream domain to use (a leaf node's amp-server names the
///   hub's), 1..64 letters, digits, `-` or `_`.
/// - `nats.tls.ca`, `nats.tls.cert`, `nats.tls.key` (`null`): TLS to NATS: the CA file that
///   signs the servers' certificates, and a client certificate with its key (both or
///   neither) for servers that verify clients. Any of them, or a `tls://` URL, makes the
///   connection TLS.
/// - `auth.alg` (`"HS256"`): `"HS256"` or `"EdDSA"`.
/// - `auth.secret`, `auth.secret_file` (`null`): HS256, the shared secret or a file
///   holding it.
/// - `auth.public_key_file` (`null`): EdDSA, the Ed25519 public key (PEM).
/// - `auth.audience` (`null`): when given, the `aud` every token must carry.
/// - `auth.leeway_s` (`30`): 0..3600.
/// - `heartbeat_s` (`10`): 1..86400, less than `registry_ttl_s`.
/// - `registry_ttl_s` (`30`): 1..86400, greater than `heartbeat_s`.
/// - `inbox_ack_s` (`30`): 1..86400.
/// - `inbox_window` (`64`): 1..10000.
/// - `inbox_idle_s` (`604800`, 7 days): 60..31536000 (365 days); a participant's inbox
///   consumer idle this long (no session reading, no ack) is removed, its messages kept.
/// - `jobs.<job>.lease_s` (`30`): 1..86400.
/// - `jobs.<job>.max_attempts` (`3`): 1..100.
/// - `jobs.<job>.decline_delay_ms` (`1000`): 0..86400000 (one day).
/// - `limits.max_frame_bytes` (`1048576`, 1 MiB): 1024..67108864 (1 KiB..64 MiB).
/// - `limits.max_body_bytes` (`262144`, 256 KiB): 1..67108864, at most `max_frame_bytes`.
/// - `limits.max_sessions` (`10000`): 1..1000000.
/// - `limits.max_subscriptions` (`64`, per session): 1..10000.
/// - `limits.max_pending` (`1024`, amp's): connections that have not said `hello` yet;
///   1..1000000. One more is closed at once with 1013.
/// - `policy.<p>.rate.per_s` (`1000`): messages per second, a number > 0.
/// - `policy.<p>.rate.burst` (`2000`): the size of the bucket, which starts full; a
///   number >= 1 (a smaller bucket would refuse every message).
/// - `policy.<p>.rate.bytes_per_s` (`10485760`, 10 MiB): bytes of serialized `body` per
///   second, a number > 0.
/// - `policy.<p>.budget.per_day` (`null`, unlimited): `null` or an integer >= 0.
/// - `schemas.<type>` (none): a JSON Schema (draft 7) file for the `body` of messages of
///   that type.
/// - `retention.task_s` (`86400`, amp's): an ended task's record, history and idempotency
///   binding are removed this long after the end; 60..315360000 (10 years). Under 86400
///   breaks the spec's promise of 24 hours: `amp-server` warns at start.
/// - `retention.inbox.max_age_s` (`604800`, 7 days): unacked inbox messages older than
///   this are dropped; 0 (no limit) or 60..315360000.
/// - `retention.inbox.max_bytes` (`0`, no limit): the inbox stream of a namespace holds at
///   most this; when full, `send` is `limit_exceeded`; 0 or 1048576..2^50.
/// - `retention.topics.max_age_s` (`86400`): topic events are kept this long for replay;
///   0 (no limit) or 60..315360000.
/// - `retention.topics.max_bytes` (`0`, no limit): the oldest events go first beyond it;
///   0 or 1048576..2^50.
/// - `retention.namespaces.<ns>.inbox`, `….topics` (none): the same keys for one
///   namespace, each left out taken from `retention.inbox` / `retention.topics`.
///
/// `<job>` is `*` (every job not named) or a job name (`^[a-z][a-z0-9_-]{0,63}$`); `<p>` is
/// `default` or `participants.<name>` with a participant name of the same grammar;
/// `<type>` is a message type (`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`).
///
/// Rules of the file:
/// - An object given in part is merged with its defaults key by key. A named job takes
///   what it leaves out from `jobs."*"`, and `policy.participants.<name>` from
///   `policy.default`, at the time of use: an override of `"*"` or of `default` given
///   later (on the command line) reaches every entry that did not set that key itself.
/// - `null` as the value of an entry of `jobs`, `policy.participants` or `schemas` removes
///   the entry (`jobs."*"`: back to the built-in values); `"tls": null` means no TLS,
///   `"nats": null` the memory transport. Everywhere else a value has one type: a string
///   where a number is expected, or `30` where `"30"` is, is an error. An integer may be
///   written `30.0` or `3e1`, but not `30.5`.
/// - An unknown key, a key given twice in one object, a value of the wrong type or out of
///   range, and an invalid name are errors (`bad_request`) whose message names the key
///   path, e.g. `limits.max_frame_bytes: must be an integer from 1024 to 67108864,
///   not -5`, `unknown key "listn" (did you mean "listen"?)`, `duplicate key
///   "limits.max_sessions"`, `jobs: job name "Resize": upper case 'R' at position 0 …`.
///   A message never shows the value of `auth.secret`, only its kind.
/// - HS256 takes `secret` or `secret_file`, not both, and neither `public_key_file`;
///   EdDSA requires `public_key_file` and takes neither secret. An HS256 configuration
///   without any secret parses (so that `{}` is the configuration of all defaults and a
///   secret may come from an override): the server must refuse to start with it, as
///   `authenticator::make` does for an empty secret.
/// - A UTF-8 byte order mark before the text is ignored; comments are not JSON and are
///   refused.
/// - File paths are taken as written by `parse_server_config` and `set_config_value`;
///   `load_server_config` resolves relative ones against the directory of the file.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "amp/broker/config.hpp"
#include "amp/gateway/auth.hpp"
#include "amp/gateway/policy.hpp"
#include "amp/names.hpp"
#include "amp/result.hpp"
#include "amp/transport/transport.hpp"

namespace amp {

/// What `policy.participants.<name>` sets; each key left out comes from `policy.default`.
struct participant_policy_override {
  std::optional<double> per_s;        ///< `rate.per_s`
  std::optional<double> burst;        ///< `rate.burst`
  std::optional<double> bytes_per_s;  ///< `rate.bytes_per_s`
  std::optional<double> ops_per_s;    ///< `ops.per_s` (amp's, not the spec's)
  std::optional<double> ops_burst;    ///< `ops.burst`
  /// `budget.per_day`: not given (outer empty), or given as a limit or as `null`
  /// (unlimited, inner empty).
  std::optional<std::optional<std::int64_t>> per_day;

  /// `base` with the keys this override sets replaced.
  participant_policy over(const participant_policy& base) const;

  friend bool operator==(const participant_policy_override&,
                         const participant_policy_override&) = default;
};

/// The limits of a stream, in the units of the file (`retention.inbox`, `retention.topics`).
struct stream_limits {
  std::int64_t max_age_s = 0;  ///< 0: no age limit; else 60..315360000
  std::int64_t max_bytes = 0;  ///< 0: no size limit; else 1048576..2^50

  friend bool operator==(const stream_limits&, const stream_limits&) = default;
};

/// What `retention.namespaces.<ns>.inbox` (or `.topics`) sets; each key left out comes
/// from `retention.inbox` (`.topics`).
struct stream_limits_override {
  std::optional<std::int64_t> max_age_s;
  std::optional<std::int64_t> max_bytes;

  /// `base` with the keys this override sets replaced.
  stream_limits over(const stream_limits& base) const;

  friend bool operator==(const stream_limits_override&, const stream_limits_override&) = default;
};

/// A job's lease, attempts and decline delay, in the units of the file (spec §7, §11).
struct job_settings {
  int lease_s = 30;                      ///< 1..86400: lease length and the consumer's AckWait
  int max_attempts = 3;                  ///< 1..100: when the submitter does not say
  std::int64_t decline_delay_ms = 1000;  ///< 0..86400000: wait before re-offering a decline

  /// The same settings as the broker takes them.
  job_config to_job_config() const;

  friend bool operator==(const job_settings&, const job_settings&) = default;
};

/// What `jobs.<name>` sets; each key left out comes from `jobs."*"`.
struct job_override {
  std::optional<int> lease_s;
  std::optional<int> max_attempts;
  std::optional<std::int64_t> decline_delay_ms;

  /// `base` with the keys this override sets replaced.
  job_settings over(const job_settings& base) const;

  friend bool operator==(const job_override&, const job_override&) = default;
};

/// The settings of a server (spec §11). A default-constructed value is the configuration
/// of `{}`: the spec's defaults, the memory transport, HS256 without a secret.
///
/// The members mirror the keys of the file, in its units; `parse_server_config` fills
/// them and `check_server_config` tells whether a value built or changed by hand is
/// valid. A plain value: copy it, compare it, share it read-only between threads.
struct server_config {
  /// `listen`: the address to bind. The host as written (a name or an IPv4 address), or
  /// an IPv6 address without its brackets (`::1` for `"[::1]:8080"`).
  std::string listen_host = "127.0.0.1";
  /// `listen`: the port, 1..65535.
  std::uint16_t listen_port = 8080;

  /// `tls`: serve `wss://` when both are given.
  struct tls_section {
    std::optional<std::string> cert;  ///< `tls.cert`: certificate chain file (PEM)
    std::optional<std::string> key;   ///< `tls.key`: private key file (PEM)

    /// True when TLS is configured.
    bool enabled() const noexcept { return cert.has_value() && key.has_value(); }

    friend bool operator==(const tls_section&, const tls_section&) = default;
  } tls;

  /// `nats`: the NATS server that holds the data.
  struct nats_section {
    std::string url = "nats://127.0.0.1:4222";  ///< `nats.url`: comma-separated for a cluster
    std::optional<std::string> creds;           ///< `nats.creds`: credentials file
    int replicas = 1;                           ///< `nats.replicas`: 1..5
    storage_type storage = storage_type::file;  ///< `nats.storage`: "file" or "memory"
    std::optional<std::string> domain;          ///< `nats.domain`: JetStream domain
    std::optional<std::string> tls_ca;          ///< `nats.tls.ca`: CA certificates (PEM)
    std::optional<std::string> tls_cert;        ///< `nats.tls.cert`: client certificate (PEM)
    std::optional<std::string> tls_key;         ///< `nats.tls.key`: its private key (PEM)

    friend bool operator==(const nats_section&, const nats_section&) = default;
  };
  /// Absent (`nats` missing or `null`): the embedded in-memory transport, nothing durable.
  std::optional<nats_section> nats;

  /// `auth`: how `hello` tokens are checked (spec §3).
  struct auth_section {
    jwt_alg alg = jwt_alg::hs256;                ///< `auth.alg`: "HS256" or "EdDSA"
    std::optional<std::string> secret;           ///< `auth.secret` (HS256)
    std::optional<std::string> secret_file;      ///< `auth.secret_file` (HS256)
    std::optional<std::string> public_key_file;  ///< `auth.public_key_file` (EdDSA, PEM)
    std::optional<std::string> audience;         ///< `auth.audience`: checked when given
    int leeway_s = 30;                           ///< `auth.leeway_s`: 0..3600

    friend bool operator==(const auth_section&, const auth_section&) = default;
  } auth;

  int heartbeat_s = 10;     ///< told to clients in `hello`; 1..86400, < `registry_ttl_s`
  int registry_ttl_s = 30;  ///< registry entries expire after this; 1..86400
  int inbox_ack_s = 30;     ///< unacked inbox messages come again after this; 1..86400
  int inbox_window = 64;    ///< unacked inbox messages in flight per participant; 1..10000
  /// A participant's inbox consumer idle this long is removed (messages kept); 60..31536000
  int inbox_idle_s = 604800;

  /// `jobs."*"`: every job not in `jobs`.
  job_settings default_job;
  /// `jobs.<name>`, by valid job name: what each named job sets itself.
  std::map<std::string, job_override, std::less<>> jobs;

  /// `limits` (spec §1, §3, §6, §8).
  struct limits_section {
    std::size_t max_frame_bytes = 1048576;  ///< larger frames close with 1009; 1 KiB..64 MiB
    std::size_t max_body_bytes = 262144;    ///< `payload_too_large`; 1..`max_frame_bytes`
    std::size_t max_sessions = 10000;       ///< `hello` over it: `limit_exceeded`; 1..1000000
    std::size_t max_subscriptions = 64;     ///< per session; 1..10000
    std::size_t max_pending = 1024;         ///< connections before `hello`; 1..1000000

    friend bool operator==(const limits_section&, const limits_section&) = default;
  } limits;

  /// `policy.default`: the limits of every participant not in `participant_policies`.
  participant_policy default_policy;
  /// `policy.participants.<name>`, by valid participant name.
  std::map<std::string, participant_policy_override, std::less<>> participant_policies;

  /// `schemas`: message type -> JSON Schema file for its `body`.
  std::map<std::string, std::string, std::less<>> schemas;

  /// `retention` (amp's): how long what the broker stores is kept.
  struct retention_section {
    int task_s = 86400;  ///< ended tasks kept this long; 60..315360000 (spec: >= 86400)
    stream_limits inbox{.max_age_s = 604800, .max_bytes = 0};
    stream_limits topics{.max_age_s = 86400, .max_bytes = 0};
    /// `namespaces.<ns>`, by valid namespace name.
    struct namespace_override {
      stream_limits_override inbox;
      stream_limits_override topics;
      friend bool operator==(const namespace_override&, const namespace_override&) = default;
    };
    std::map<std::string, namespace_override, std::less<>> namespaces;

    /// The inbox and topic limits of `ns`: its entry of `namespaces` over `inbox` and
    /// `topics`.
    stream_limits inbox_of(std::string_view ns) const;
    stream_limits topics_of(std::string_view ns) const;

    friend bool operator==(const retention_section&, const retention_section&) = default;
  } retention;

  /// `listen` as written in the file: `host:port`, an IPv6 host in brackets.
  std::string listen() const;

  /// The settings of `job`: its entry of `jobs` merged over `default_job`, or
  /// `default_job`.
  job_settings job(std::string_view job) const;

  /// The limits of `participant`: its entry of `participant_policies` merged over
  /// `default_policy`, or `default_policy`.
  participant_policy policy_for(std::string_view participant) const;

  /// The configuration of `policy::open`: `default_policy`, every entry of
  /// `participant_policies` merged over it, and the storage and replicas of the budget
  /// bucket as `broker_for` chooses them. `rate_policy::bytes_burst` stays unset (the file
  /// has no key for it).
  policy_config to_policy_config() const;

  /// The broker configuration of namespace `ns`: storage and replicas from `nats`
  /// (`storage_type::memory` and 1 replica without it), `inbox_ack_wait`,
  /// `inbox_window` and `registry_ttl` from the keys of the same names, `default_job`
  /// from `jobs."*"` and `jobs` with every named job merged over it, `task_retention`
  /// and the inbox and topic limits from `retention` (with `ns`'s entry). The other
  /// members keep the defaults of `broker_config`.
  broker_config broker_for(const namespace_name& ns) const;

  friend bool operator==(const server_config&, const server_config&) = default;
};

/// Reads a configuration from the JSON text of a file: the defaults, with what `json`
/// gives merged over them, then `check_server_config`. Errors: `bad_request` with a
/// message that names the key path and what is wrong (see the file comment), or
/// `not valid JSON: …` with the parser's description. Thread-safe.
result<server_config> parse_server_config(std::string_view json);

/// Reads the file at `path` and parses it as `parse_server_config` does; then every
/// relative file path in it (`tls.cert`, `tls.key`, `nats.creds`, `auth.secret_file`,
/// `auth.public_key_file`, `schemas.*`) is made relative to the directory of `path`.
/// Errors: `bad_request`, with the message `cannot read <path>: <reason>` when the file
/// cannot be read (missing, a directory, unreadable, over 16 MiB), and otherwise
/// `<path>: ` followed by the message of `parse_server_config`.
result<server_config> load_server_config(const std::string& path);

/// Sets one key, as a command-line override `--set limits.max_sessions=100` does:
/// `dotted_key` is a key path (`listen`, `nats.url`, `jobs.resize.lease_s`,
/// `policy.participants.bob.rate.per_s`, `schemas.review.request`: after `schemas.`
/// the rest is one message type, dots included) and `value_json` its value as JSON text
/// (`100`, `"0.0.0.0:9000"` with its quotes, `null`, `{"lease_s":10}`). An object value is
/// merged as in the file; `null` removes as in the file.
///
/// The value is checked as the file's would be, with the same messages. The rules between
/// keys (TLS both or neither, the keys of `auth.alg`, `heartbeat_s` < `registry_ttl_s`,
/// `max_body_bytes` <= `max_frame_bytes`) are not, since an override may need the next
/// one to be right: run `check_server_config` after the last one. On error `config` is
/// unchanged. Errors: `bad_request`, e.g. `limits.max_sessions: not valid JSON: …` or
/// `unknown key "limits.max_session" (did you mean "limits.max_sessions"?)`.
result<void> set_config_value(server_config& config, std::string_view dotted_key,
                              std::string_view value_json);

/// Checks every value and every rule between keys listed in the file comment, for a
/// configuration built or changed by hand. Errors: `bad_request` naming the key path, as
/// `parse_server_config` does; the first problem found wins.
result<void> check_server_config(const server_config& config);

}  // namespace amp
