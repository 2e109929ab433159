#pragma once

/// \file
/// The session gateway (spec `amp.v1`): a `gateway` per process serves any number of
/// `session`s, one per client connection. A session takes the client's frames in
/// (`session::receive`) and hands its frames out through a `session_carrier`; it knows
/// nothing of sockets, so any carrier can drive it: `amp-server` carries it over
/// WebSocket, `examples/ndjson_gateway.cpp` over newline-delimited JSON on TCP, the tests
/// over a vector of strings.
///
/// ```cpp
/// auto gw = amp::gateway::open({.config = cfg, .backend = transport});
/// auto s = (*gw)->open_session(std::make_shared<my_carrier>(socket));
/// s->receive(R"({"op":"hello","id":1,"token":"..."})");   // for every text frame
/// s->closed();                                            // when the connection ends
/// ```
///
/// Threads. `receive`, `receive_binary` and `closed` never block on the backend: they
/// queue the frame and hand it to the gateway's executor, except the ops that never wait
/// for the backend (`ack`, `nack`, `claim`, `complete` of a lease this gateway granted or
/// extended, `send`, `publish`, `submit` without an idempotency key), which run at once on
/// the calling thread when nothing before them holds them back (that thread may still wait
/// for room in the NATS connection's socket, as any thread that publishes does). Frames of
/// one session that act on different things run at once (up to 64); frames on the same task
/// run one at a time in the order received; sends to the same recipient and publishes on
/// the same topic are handed to the backend one at a time in the order received, without
/// waiting for one another's answers; every other op (hello, register, heartbeat, bye,
/// subscribe, watch, who …) waits for what came before it and runs alone
/// (docs/protocol.md). Replies to concurrent requests may come in any order; each carries
/// its request's `id`. The carrier is called from the calling thread, the executor's
/// threads and the transport's threads, never concurrently for one session.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "amp/broker/config.hpp"
#include "amp/gateway/config.hpp"
#include "amp/result.hpp"
#include "amp/transport/transport.hpp"

namespace amp {

/// WebSocket close codes a session asks its carrier for (spec §1, §3).
namespace close_code {
inline constexpr int normal = 1000;            ///< after `bye`
inline constexpr int going_away = 1001;        ///< the gateway shuts down
inline constexpr int policy_violation = 1008;  ///< the client does not read its frames
inline constexpr int too_big = 1009;           ///< a frame over `max_frame_bytes` (the carrier's)
inline constexpr int try_again_later = 1013;   ///< over `max_sessions`
inline constexpr int unauthenticated = 4401;   ///< failed or missing `hello`
}  // namespace close_code

/// What carries one session's frames to its client. Implemented by the embedder.
///
/// A session calls these one at a time (never concurrently for one session), from any
/// thread; they must not block. After `close` it calls nothing more.
class session_carrier {
 public:
  virtual ~session_carrier() = default;
  /// Queues one text frame (a JSON object) for the client.
  virtual void send(std::string frame) = 0;
  /// The bytes queued by `send` and not yet handed to the network. The session keeps
  /// this bounded (see `gateway_options::outbound_limit_bytes`).
  virtual std::size_t buffered_bytes() const = 0;
  /// Closes the connection with a WebSocket close code (`close_code`) and a reason,
  /// after the frames already queued. The carrier then calls `session::closed`.
  virtual void close(int code, std::string reason) = 0;

 protected:
  session_carrier() = default;
};

/// One line of the gateway's structured log: `event` names what happened
/// (`session_open`, `session_closed`, `hello_failed`, `backend_error`, `slow_consumer`,
/// `lease_expired` …), `json` is the whole line, a JSON object with `ts`, `level`,
/// `event` and the details.
struct log_line {
  std::string_view level;  ///< `info`, `warn` or `error`
  std::string_view event;
  std::string_view json;
};

/// How a gateway is made.
struct gateway_options {
  /// The server's settings (spec §11); `nats` only says which backend `backend` is.
  /// Must pass `check_server_config`.
  server_config config{};
  /// The backend (memory or JetStream). Its clock is the gateway's clock: a
  /// `manual_clock` makes the `hello` deadline, offers and heartbeats deterministic.
  std::shared_ptr<transport> backend;
  /// What `hello` reports as `server`.
  std::string server_name = "amp-server/0.1.0";
  /// Where the operations of sessions and the broker's timer work run. Empty: a pool of
  /// `workers` threads owned by the gateway. `send`, `publish`, `submit` (without an
  /// idempotency key), `claim` and `complete` wait for the backend without a thread; every other
  /// operation holds its thread while it waits, so `workers` bounds those in flight.
  /// `inline_executor()` runs everything on the calling thread (memory transport only; for
  /// deterministic tests).
  executor run{};
  /// The threads of the gateway's pool, or, with `run`, how many threads `run` has. One
  /// session has at most `workers / 4` frames (at least 1) on the executor at once, so
  /// that a session whose frames wait for the backend cannot hold every thread; up to
  /// 64 more of its frames may be waiting for the backend without a thread.
  std::size_t workers = 16;
  /// A session whose carrier holds more than this is a slow consumer: its topic
  /// subscriptions are dropped (`sub_dropped`) rather than queue more events; when it
  /// holds more than 4 times this, whatever frame comes next, the session is closed with
  /// 1008 (its inbox messages and offers go back to the backend and are delivered again).
  std::size_t outbound_limit_bytes = 4u << 20;
  /// How long a connection may take to say `hello` (spec §3: 5 s).
  duration hello_timeout = std::chrono::seconds(5);
  /// How often `ready()` asks the backend whether it answers.
  duration readiness_interval = std::chrono::seconds(1);
  /// Receives every log line; may be called from any thread, concurrently. Empty: none.
  std::function<void(const log_line&)> log{};
};

class session;

/// One gateway per process: authentication, policy, a broker per namespace (opened on
/// first use), offers, metrics. Thread-safe; share it.
class gateway : public std::enable_shared_from_this<gateway> {
 public:
  /// Loads the keys and the body schemas named in the configuration and opens the
  /// policy (blocks on the backend when budgets are configured).
  /// Errors: `bad_request` naming the key (a configuration `check_server_config`
  /// refuses, a secret or key `authenticator::make` refuses, a schema file that cannot
  /// be read or is not a JSON Schema); `unavailable` (the backend).
  static result<std::shared_ptr<gateway>> open(gateway_options options);
  ~gateway();
  gateway(const gateway&) = delete;
  gateway& operator=(const gateway&) = delete;

  /// A new session on `carrier`, waiting for its `hello` (the deadline starts now).
  std::shared_ptr<session> open_session(std::shared_ptr<session_carrier> carrier);

  /// Sessions that completed `hello` and are not closed.
  std::size_t sessions() const noexcept;
  /// True while the backend answered its last ping (`readiness_interval`). Non-blocking.
  bool ready() const noexcept;
  /// The metrics in the Prometheus text format (spec §10), every name starting `amp_`.
  std::string metrics_text() const;
  /// The configuration in use.
  const server_config& config() const noexcept;

  /// Closes every session with 1001 (going away); later `hello`s are refused the same
  /// way. Open offers are handed back; leases stay in the store for the next gateway.
  /// Blocks until the work in flight has finished. Idempotent.
  void shutdown();

  struct impl;
  explicit gateway(std::shared_ptr<impl> p);

 private:
  std::shared_ptr<impl> impl_;
};

/// One client connection (spec §1, §3). Made by `gateway::open_session`.
class session {
 public:
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  /// One text frame from the client (UTF-8; one JSON object). Never throws, never blocks
  /// on the backend. Frames after `closed` (or after the session asked to close) are
  /// ignored. What handling the frame on this thread publishes to a JetStream backend is
  /// written in one write when this returns (or later: `hold_writes_until_called`).
  void receive(std::string_view text);
  /// A binary frame from the client: answered with `bad_request` (spec §1).
  void receive_binary();

  /// For a carrier whose thread receives frames in turns and can run a function after a
  /// turn (an event loop that handles what one socket read brought, then a handler it was
  /// posted): what the frames received on this thread, of any session, publish to a
  /// JetStream backend is written when the returned function runs, in one write, instead of
  /// one write per frame. Returns an empty function when this thread already holds its
  /// writes for one that has not run. The function must run, once, on any thread (until it
  /// does, the writes wait); a blocking wait on this thread writes what is held first.
  /// Never blocks.
  static std::function<void()> hold_writes_until_called();

  /// The connection is gone: open offers go back at once, subscriptions and the inbox
  /// reader stop, the session no longer counts. Leases stay (they live by heartbeats).
  /// Idempotent.
  void closed();

  /// The session id (`hello`'s `session`), assigned at creation.
  const std::string& id() const noexcept;

  struct impl;
  explicit session(std::shared_ptr<impl> p);

 private:
  std::shared_ptr<impl> impl_;
};

}  // namespace amp
