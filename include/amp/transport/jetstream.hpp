#pragma once

/// \file
/// The JetStream transport: `amp::transport` on a NATS server with JetStream, through
/// cnats. Works with nats-server 2.9 and later, single servers and clusters.
///
/// Threads. Data operations are asynchronous requests multiplexed over one connection:
/// every answer and every pulled message, for however many consumers are being fetched
/// from, arrives on the connection's one reply subscription, and their handlers run on its
/// single cnats delivery thread. Each replay, watch and core subscription has a cnats
/// delivery thread of its own for its callbacks. The thread count thus grows with the
/// replays, watches and core subscriptions open, never with the fetches or the consumers. No
/// handler runs on the caller's thread, except that a request refused before it is sent (a bad
/// name, a connection that is down) completes at once on the calling thread. Timeouts are enforced
/// on the transport clock's timer thread, where a fetch that ends by its `max_wait` may complete
/// too. A slow handler delays every other answer of the transport. A handler must not call a
/// blocking wrapper
/// (`publish`, `fetch`, `kv_get` ...) of the same transport: its answer would be delivered
/// on the very thread that waits for it. Administrative operations block the calling
/// thread for at most `op_timeout`.
///
/// Writes. A thread of the transport reads the connection's socket (cnats's external event
/// loop interface). A publish is written on the thread that made it, right after it, except
/// that what handlers on the reply thread publish is written once the answers already
/// queued behind theirs have been handled (at most 32 of them), all in one write; the amp
/// gateway does the same for what one frame publishes, and amp-server for what the frames
/// of one socket read publish (`session::hold_writes_until_called`). Before any blocking
/// wait, the waiting thread writes what it holds.
///
/// cnats locks. The first connection opens cnats with a lock spin count of 0 (cnats's
/// default spins 2,000 times on a contended mutex before it sleeps, which on a small machine
/// takes the CPU from the thread being waited for); the environment variable
/// `AMP_NATS_LOCK_SPIN` sets another count. An application that called `nats_Open` before
/// keeps its own.
///
/// Outages. cnats reconnects on its own, forever. While the server cannot be reached,
/// every operation answers `unavailable` within `op_timeout`; a request that was sent
/// before the connection dropped may still have been applied, so a publish that answered
/// `unavailable` should be retried with the same `msg_id` (deduplicated by the stream).
/// During a cluster leader election JetStream answers "no responders"; such requests are
/// retried with backoff until `op_timeout`. So are creates of streams, buckets and
/// consumers that nats-server 2.9 answers "error creating store" (seen when several
/// processes make their first objects at once on a new store).
///
/// Fetch. A fetch without `max_wait` answers within about 100 ms, not at once: nats-server
/// 2.9 would keep a no-wait pull that max_ack_pending holds back open for ever, so such
/// pulls carry a 100 ms expiry, which the server also waits out when nothing is there.
/// Fetches on one consumer through one transport take turns, first come first served
/// (pulled messages are told apart by their consumer): a fetch made while another on the
/// same consumer is being served waits for it, then pulls with what is left of its
/// `max_wait`, or takes what is there at once if nothing is left. It answers empty once its
/// `max_wait` has passed and the fetch ahead found nothing or waits for a message (there is
/// none for either), and it never waits for its turn longer than `max_wait` + `op_timeout`.
///
/// Known limits of nats-server 2.9.10 (the Debian package): on a replicated (R3) bucket,
/// two concurrent updates on one revision can both succeed (nats-server issue 4320, fixed in
/// 2.9.21), so compare-and-set is safe on single servers and R1 buckets only there; per-key
/// TTL needs 2.11. Two processes moving work-queue consumer filters at the same moment can
/// both pass the library's overlap check (the server accepts overlapping updates). A
/// rollup moves every consumer of the stream that takes in the rolled-up subject to the
/// rollup's marker, past what it had not yet sent of other subjects (nats-server pull
/// request 3838 fixed it later). So the buckets `ensure_bucket` creates allow message
/// deletes, and a purge writes its marker and then deletes the key's earlier revisions one
/// by one (one STREAM.MSG.GET and one STREAM.MSG.DELETE each; a reader of the key's history
/// meanwhile may still see some of them, and a purge that fails after its marker leaves
/// them to the next purge of the key). A bucket whose stream denies deletes, as cnats and
/// nats.go make them, is purged with a rollup: a watch of it that is behind may miss other
/// keys' changes.

#include <memory>
#include <string>

#include "amp/clock.hpp"
#include "amp/result.hpp"
#include "amp/transport/transport.hpp"

namespace amp {

struct jetstream_options {
  /// Server URL, or several separated by commas (a cluster).
  std::string url = "nats://127.0.0.1:4222";
  /// A NATS credentials file (JWT and NKey seed), if the server requires one.
  std::string creds_file{};
  /// The JetStream domain to use (`$JS.<domain>.API`), for a JetStream reached through a
  /// leaf node or in another domain of a supercluster; empty: the server's own. Letters,
  /// digits, `-` and `_` (`bad_request` otherwise).
  std::string domain{};
  /// TLS: the CA certificates (PEM file) that sign the servers' certificates; a client
  /// certificate chain and its key (PEM files, both or neither) for servers that verify
  /// clients. Any of them, or a `tls://` URL, makes the connection TLS. A file that cannot
  /// be read or used is `bad_request`.
  std::string tls_ca{};
  std::string tls_cert{};
  std::string tls_key{};
  /// Connection name shown by the server's monitoring.
  std::string name = "amp";
  /// Every operation completes within this time (`unavailable` when the server does not
  /// answer in time). A fetch may wait its own `max_wait` on top.
  duration op_timeout = std::chrono::seconds(5);
  /// How long the first connection attempt may take before `connect` fails.
  duration connect_timeout = std::chrono::seconds(2);
  /// Pause between reconnection attempts.
  duration reconnect_wait = std::chrono::milliseconds(250);
  /// The clock for timeouts and timestamps; the system clock when null.
  std::shared_ptr<amp::clock> clock{};
  /// Receives one line ("a handler of … threw: …") for each exception that a completion
  /// handler, subscription handler or watch callback throws; see `transport`. Standard
  /// error when empty. Called on the thread that ran the handler (often a cnats thread);
  /// must not throw.
  std::function<void(std::string_view)> on_handler_error{};
  /// When set, `connect` reads what the server says of itself and calls this once, before
  /// it returns, with a warning for a server in a cluster older than nats-server 2.9.21
  /// (before it, compare-and-set on a replicated KV bucket, on which the task store and the
  /// registry rely, is not safe). Not called otherwise.
  std::function<void(std::string_view)> on_notice{};
};

/// `url` (one NATS URL or several separated by commas) with each server's password or
/// token replaced by `***`, for logs and messages: `nats://amp:***@host:4222`,
/// `nats://***@host`. Thread-safe.
std::string redact_nats_url(std::string_view url);

/// Whether `domain` can name a JetStream domain (`jetstream_options::domain`): 1..64
/// letters, digits, `-` or `_`. Thread-safe.
bool valid_jetstream_domain(std::string_view domain);

/// Factory of JetStream transports.
class jetstream_transport {
 public:
  jetstream_transport() = delete;

  /// Connects and checks that JetStream answers. `unavailable` when the server cannot be
  /// reached or has no JetStream; `bad_request` for a malformed URL or credentials file.
  /// Messages name the URL without its passwords (`redact_nats_url`).
  static result<std::shared_ptr<transport>> connect(jetstream_options options);
};

}  // namespace amp
