#pragma once

/// \file
/// The configuration of a sink (`amp-sink-v1.md`): a plain struct holding every setting with
/// its default, and the parser that reads it from JSON and from single-key overrides
/// (`--set key=value`). `amp-sink` uses it, and so can any service that runs a sink.
///
/// The keys, with their defaults in parentheses:
/// - `nats` (`{"url":"nats://127.0.0.1:4222"}`): `url`, `creds`, `domain`, `tls.ca`,
///   `tls.cert`, `tls.key`, as for `amp-server`.
/// - `http` (`null`): `"host:port"` where `/healthz`, `/readyz` and `/metrics` are served;
///   `null`: no HTTP.
/// - `name` (required): the sink's name (wire spec §2: `^[a-z][a-z0-9_-]{0,63}$`); it names
///   the durable consumer and the dead-letter subject `amp.<ns>.dlq.<name>`.
/// - `source.ns` (required): the namespace.
/// - `source.kind` (required): `"topics"` or `"tasks"`.
/// - `source.topics`: with `topics`, 1 to 64 topic patterns (as for `subscribe`); with
///   `tasks`, `null` or absent.
/// - `source.from` (`"all"`): `"new"`, `"all"`, `{"seq":N}` (N >= 1) or `{"time":T}` (an
///   RFC 3339 timestamp); used only when the consumer is first created.
/// - `batch.max_messages` (`256`): 1..10000.
/// - `batch.max_wait_ms` (`50`): 1..60000: how long a batch waits to fill.
/// - `idempotency.strategy` (`"stream_sequence"`): or `"message_id"`, `"payload_field"`.
/// - `idempotency.field` (`null`): with `payload_field`, the JSON Pointer inside `body`
///   (required then, `null` otherwise).
/// - `on_duplicate` (`"skip"`): or `"replace"`, `"fail"`.
/// - `targets` (required): 1 to 16 objects, each with `kind` (`"sqlite"`, `"postgres"`,
///   `"file"`) and `required` (`true`); `sqlite`: `path` and `table`; `postgres`: `dsn` and
///   `table`; `file`: `dir`. A table name is `^[A-Za-z_][A-Za-z0-9_]{0,62}$`.
/// - `dlq.max_failures` (`5`): 1..1000: tries of a message that cannot be written before it
///   is dead-lettered.
/// - `ack_wait_s` (`30`): 1..3600: the consumer's AckWait (amp's; a batch whose target is
///   away is kept in progress meanwhile).
///
/// Errors (every function): `bad_request` with a message that names the key, for text that
/// is not JSON, an unknown key (with a "did you mean"), a key given twice, a value of the
/// wrong type or out of range, or a required key missing. Thread-safe.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "amp/clock.hpp"
#include "amp/result.hpp"

namespace amp::sink {

/// Where a new consumer starts (`source.from`).
struct start_position {
  enum class kind { new_messages, all, sequence, time };
  kind from = kind::all;
  std::uint64_t seq = 0;  ///< with `sequence`
  time_point time{};      ///< with `time`
  friend bool operator==(const start_position&, const start_position&) = default;
};

enum class source_kind { topics, tasks };
enum class key_strategy { stream_sequence, message_id, payload_field };
enum class duplicate_mode { skip, replace, fail };
enum class target_kind { sqlite, postgres, file };

/// One destination.
struct target_config {
  target_kind kind = target_kind::sqlite;
  bool required = true;
  std::string path{};   ///< sqlite: the database file
  std::string dsn{};    ///< postgres: a libpq connection string
  std::string table{};  ///< sqlite, postgres
  std::string dir{};    ///< file: the directory
  friend bool operator==(const target_config&, const target_config&) = default;
};

struct sink_config {
  struct nats_section {
    std::string url = "nats://127.0.0.1:4222";
    std::optional<std::string> creds{};
    std::optional<std::string> domain{};
    std::optional<std::string> tls_ca{};
    std::optional<std::string> tls_cert{};
    std::optional<std::string> tls_key{};
    friend bool operator==(const nats_section&, const nats_section&) = default;
  };
  nats_section nats{};
  std::optional<std::string> http{};  ///< "host:port"
  std::string name{};
  std::string ns{};
  source_kind kind = source_kind::topics;
  std::vector<std::string> topics{};  ///< patterns, with `topics`
  start_position from{};
  std::size_t max_messages = 256;
  std::chrono::milliseconds max_wait{50};
  key_strategy strategy = key_strategy::stream_sequence;
  std::optional<std::string> field{};  ///< JSON Pointer, with `payload_field`
  duplicate_mode on_duplicate = duplicate_mode::skip;
  std::vector<target_config> targets{};
  int max_failures = 5;
  std::chrono::seconds ack_wait{30};
  friend bool operator==(const sink_config&, const sink_config&) = default;
};

/// Reads a whole configuration (a JSON object; missing keys keep their defaults) and
/// checks it (`check_sink_config`).
result<sink_config> parse_sink_config(std::string_view json);

/// Reads the file `path` as `parse_sink_config` does; relative paths inside it (`sqlite`
/// paths, `file` directories, NATS files) are made relative to the file's folder. With
/// `check` false, `check_sink_config` is left to the caller (who may set keys first, as
/// `amp-sink --set` does). Errors also for a file that cannot be read ("cannot read PATH: …").
result<sink_config> load_sink_config(const std::string& path, bool check = true);

/// Sets one key (`source.ns`, `targets`, `batch.max_messages`…) to `value_json`, as if
/// the file had said so (objects are merged key by key, arrays replaced). Does not run
/// `check_sink_config` (several overrides may be needed before it passes); `config` is
/// unchanged on error.
result<void> set_sink_config_value(sink_config& config, std::string_view dotted_key,
                                   std::string_view value_json);

/// The checks that need the whole configuration: `name`, `source.ns` and `targets`
/// present, the patterns valid and given for `topics` only, `idempotency.field` present
/// exactly with `payload_field`, each target's own keys.
result<void> check_sink_config(const sink_config& config);

/// `"skip"`, `"sqlite"`, … as the configuration spells them.
std::string_view to_string(duplicate_mode m) noexcept;
std::string_view to_string(key_strategy s) noexcept;
std::string_view to_string(target_kind k) noexcept;

}  // namespace amp::sink
