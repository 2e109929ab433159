#pragma once

/// \file
/// A small client for AMP over WebSocket, the `amp.v1` protocol of the reference server
/// (spec `amp-ws-v1.md`): used by the examples, the end-to-end tests, the benchmarks and
/// the `amp` command-line tool.
///
/// \code
///   auto c = amp::client::connect({.url = "ws://127.0.0.1:8080/amp", .token = jwt});
///   if (!c) return fail(c.error());               // unauthenticated, unavailable, …
///   auto& bob = **c;
///   bob.on_push([](const amp::client_frame& f) {   // messages, offers, events, …
///     if (f.op() == "message") std::puts(f.raw_at("/envelope").value_or("").c_str());
///   });
///   auto sent = bob.send("alice", R"({"hi":1})");  // waits for the server's ok
///   if (sent) std::printf("seq %lld\n", static_cast<long long>(sent->seq));
/// \endcode
///
/// Threads: each client runs one I/O thread of its own. Requests may be made from any
/// number of threads at once; the blocking ones wait for their reply and must not be made
/// on the I/O thread (from a push, close or reply handler): there they fail at once with
/// `bad_request` instead of waiting forever. Handlers run on the I/O thread, one at a
/// time, in the order the frames arrived; they must not block, and should hand longer work
/// to another thread.
///
/// Nothing here throws but `std::bad_alloc`; every fallible call returns `amp::result`.
/// The WebSocket and TLS implementation (websocketpp, Asio, OpenSSL) and the JSON reader
/// (simdjson) stay inside the library.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "amp/clock.hpp"
#include "amp/result.hpp"

namespace amp {

namespace detail {
struct client_frame_access;
}

/// The subprotocol the client offers in its handshake.
inline constexpr std::string_view client_subprotocol = "amp.v1";

/// How `client::connect` reaches a server.
struct client_options {
  /// `ws://HOST:PORT/PATH` or `wss://HOST:PORT/PATH`.
  std::string url = "ws://127.0.0.1:8080/amp";
  /// The JWT sent in `hello` (see `mint_token` in `amp/gateway/auth.hpp`).
  std::string token;
  /// The longest `connect` waits for the connection to open and `hello` to be answered.
  duration connect_timeout = std::chrono::seconds(5);
  /// The longest a request waits for its reply.
  duration request_timeout = std::chrono::seconds(10);
  /// `wss://` only: verify the server's certificate chain and host name.
  bool verify_peer = true;
  /// `wss://` only: a PEM file of trusted certificates; empty: the system's store.
  std::string ca_file;
};

/// One JSON frame received from the server: its text, its `op`, and readers of its
/// members by JSON Pointer (RFC 6901: `""` is the whole frame, `"/envelope/from"` a
/// member of a member, `"/participants/0"` an array element).
///
/// A reader returns `std::nullopt` when the member is missing or has another type.
/// Frames are immutable and cheap to copy (copies share one parsed document); they may be
/// kept and read from any thread.
class client_frame {
 public:
  /// An empty frame: no text, `op()` empty, every reader `std::nullopt`.
  client_frame();

  /// Parses `text`, which must be one JSON object.
  /// Errors: `bad_request` with the parser's description, or "not a JSON object".
  static result<client_frame> parse(std::string text);

  /// The frame as received.
  const std::string& text() const noexcept;
  /// The `op` member (`"ok"`, `"error"`, `"message"`, `"offer"` …); empty when there is
  /// none or the text is not a JSON object.
  const std::string& op() const noexcept;

  /// True when the member exists (with any value, `null` included).
  bool has(std::string_view pointer) const;
  /// A string member, unescaped.
  std::optional<std::string> string_at(std::string_view pointer) const;
  /// An integer member that fits `std::int64_t` (`17`, not `17.5` or `"17"`).
  std::optional<std::int64_t> int_at(std::string_view pointer) const;
  /// A number member, as a double.
  std::optional<double> number_at(std::string_view pointer) const;
  /// A boolean member.
  std::optional<bool> bool_at(std::string_view pointer) const;
  /// Any member as minified JSON text (`{"w":640}`, `"text"`, `null`); `raw_at("")` is
  /// the whole frame.
  std::optional<std::string> raw_at(std::string_view pointer) const;
  /// The number of elements of an array member, or of members of an object member.
  std::optional<std::size_t> size_at(std::string_view pointer) const;

  /// The frame as a minified JSON object without its `op` and `id` members: the result
  /// fields of an `ok` reply (`{"seq":17,"msg_id":"…","duplicate":false}`). `{}` for an
  /// empty frame.
  std::string result_json() const;

 private:
  struct impl;
  friend struct detail::client_frame_access;
  explicit client_frame(std::shared_ptr<const impl> p) noexcept;
  std::shared_ptr<const impl> impl_;
};

/// Optional fields of a `send` (spec §5).
struct message_options {
  std::string type;          ///< the envelope's `type`; empty: none
  std::string msg_id;        ///< deduplication id; empty: the server makes one
  std::string reply_to;      ///< empty: none
  std::string correlation;   ///< empty: none
  std::string headers_json;  ///< a JSON object of string values; empty: none
};

/// The server's answer to a `send`.
struct send_receipt {
  std::int64_t seq = 0;    ///< the inbox stream sequence the recipient sees
  std::string msg_id;      ///< the envelope id
  bool duplicate = false;  ///< a repeated `msg_id`: stored once, `seq` is the first one's
};

/// Optional fields of a `publish` (spec §6).
struct publish_options {
  std::string type;          ///< empty: none
  std::string msg_id;        ///< deduplication id per sender and topic; empty: none
  std::string headers_json;  ///< a JSON object of string values; empty: none
};

/// The server's answer to a `publish`.
struct publish_receipt {
  std::int64_t seq = 0;
  bool duplicate = false;
};

/// Where a subscription starts (spec §6): `"new"`, `"all"`, `"last"`, `{"seq":N}` or
/// `{"time":"RFC 3339"}`.
struct subscribe_from {
  enum class kind { new_events, all, last, seq, time };
  kind from = kind::new_events;
  std::int64_t seq = 0;  ///< for `kind::seq`: the first sequence wanted
  std::string time;      ///< for `kind::time`: an RFC 3339 timestamp

  static subscribe_from at_seq(std::int64_t n) { return {kind::seq, n, {}}; }
  static subscribe_from at_time(std::string rfc3339) { return {kind::time, 0, std::move(rfc3339)}; }

  /// Parses the command-line spelling: `new`, `all`, `last`, `seq:N` (N >= 1) or
  /// `time:RFC3339`. Errors: `bad_request` saying what is wrong.
  static result<subscribe_from> parse(std::string_view text);

  /// The JSON value of the `from` field.
  std::string to_json() const;
};

/// Optional fields of a `submit` (spec §7).
struct submit_options {
  std::string type;             ///< empty: none
  std::string headers_json;     ///< a JSON object of string values; empty: none
  int max_attempts = 0;         ///< 1..100; 0: the job's default
  std::string idempotency_key;  ///< empty: none
};

/// The server's answer to a `submit`.
struct submit_receipt {
  std::string task;
  bool created = false;  ///< false: the idempotency key named an existing task
};

/// The server's answer to a `claim`.
struct claim_receipt {
  std::string task;
  int attempt = 0;
  std::string lease_expires_at;  ///< RFC 3339
};

/// The server's answer to a `complete`.
struct complete_receipt {
  std::string task;
  bool duplicate = false;  ///< this participant had already completed it
};

/// How a `fail` asks for a retry.
struct fail_options {
  bool retry = true;  ///< offer again while attempts are left
  /// Wait before the task is offered again; `std::nullopt`: the server's default.
  std::optional<std::chrono::milliseconds> retry_delay;
  /// The attempt the claim returned (the fence, §7): `lease_lost` if it is no longer the
  /// task's current one. `std::nullopt`: not sent.
  std::optional<int> attempt;
};

/// The server's answer to a `fail`.
struct fail_receipt {
  std::string task;
  std::string state;  ///< `"queued"` (will be offered again) or `"failed"`
  int attempt = 0;
};

/// Optional fields of a `scatter` (spec §12).
struct scatter_options {
  std::string bodies_json;   ///< a JSON object: member → that member's own body; empty: none
  std::string type;          ///< empty: none
  std::string headers_json;  ///< a JSON object of string values; empty: none
  int quorum = 0;            ///< 0: a multicast, which gathers nothing
  /// With a quorum: the deadline after the start (100 ms to 24 h).
  std::chrono::milliseconds timeout{0};
  bool partial_on_timeout = false;  ///< `on_timeout` `partial` (else the server's `failed`)
  bool include_self = false;        ///< the initiator may be in its own audience
  std::string idempotency_key;      ///< empty: none
};

/// The server's answer to a `scatter`.
struct scatter_receipt {
  std::string operation;
  bool created = false;  ///< false: the idempotency key named an existing operation
  std::vector<std::string> members;
};

/// The server's answer to a `reply`.
struct reply_receipt {
  std::string operation;
  std::string state;       ///< the operation's state after the reply
  bool duplicate = false;  ///< the branch had replied already: no vote added
};

/// A connection to an AMP server, with a session opened by `hello`.
///
/// Every request is sent with an integer `id` and matched with its reply by that id,
/// whatever the order replies come in. An `ok` reply is returned as a `client_frame`, an
/// `error` reply as an `amp::error` with the code of the wire (spec §9), the server's
/// message and, for `invalid_envelope`, the `path`; `rate_limited` appends the server's
/// `retry_after_ms` to the message. Failures that are not the server's:
/// - `bad_request`: fields that do not make a JSON frame (nothing is sent), or a blocking
///   request made on the I/O thread;
/// - `payload_too_large`: a frame over the server's `max_frame_bytes` (nothing is sent;
///   the server would close the connection with 1009);
/// - `unavailable`: no reply within `request_timeout` (the request may still take effect),
///   or the connection closed before the reply came (ditto), or was already closed.
///
/// Frames that are not replies to a pending request (`message`, `offer`, `event`,
/// `presence`, `lease_lost`, `cancelled`, `sub_dropped`, an `error` with `id` null, and a
/// reply that came after its request timed out or answers a frame sent by `send_frame`)
/// are pushes, delivered to the push handler.
class client {
 public:
  using push_handler = std::function<void(const client_frame&)>;
  using close_handler = std::function<void(int code, const std::string& reason)>;
  using reply_handler = std::function<void(result<client_frame>)>;

  /// Opens the WebSocket (offering the subprotocol `amp.v1`), sends `hello` with
  /// `options.token` and waits for the server's answer, all within
  /// `options.connect_timeout`.
  /// Errors: `bad_request` for a URL that is not `ws://` or `wss://` or that does not
  /// parse, or an unreadable `ca_file`; `unavailable` when the server cannot be reached,
  /// refuses the handshake, fails TLS verification or does not answer in time;
  /// `unauthenticated` (the server's message, e.g. an expired token) when the token is
  /// refused (the server then closes with 4401); `limit_exceeded` over the server's
  /// `max_sessions` (closed with 1013); any other code the server answers `hello` with.
  static result<std::unique_ptr<client>> connect(client_options options);

  /// Closes the connection (code 1000) if it is open, fails the requests still pending
  /// (`unavailable`) and stops the I/O thread. Must not run on the I/O thread.
  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  /// The session as `hello` opened it (spec §3).
  const std::string& participant() const noexcept;
  const std::string& ns() const noexcept;
  const std::string& session() const noexcept;
  /// How often the server wants `heartbeat` from a worker, in seconds.
  int heartbeat_s() const noexcept;
  /// How long a registry entry lives without a heartbeat, in seconds.
  int registry_ttl_s() const noexcept;
  /// The largest frame the server accepts.
  std::size_t max_frame_bytes() const noexcept;
  /// The server's name and version, e.g. `amp-server/0.1.0`.
  const std::string& server() const noexcept;
  /// The whole `ok` reply to `hello`.
  const client_frame& welcome() const noexcept;
  const client_options& options() const noexcept;

  /// Sets the handler of pushes, replacing the previous one; it runs on the I/O thread.
  /// Pushes that arrive while no handler is set (for instance the inbox backlog that
  /// arrives right after `hello`) are kept, and delivered in order to the next handler set.
  /// Off the I/O thread, returns once `handler` is in place (and the backlog delivered to
  /// it): the previous handler is not running and will not run again, so `on_push({})`
  /// detaches a handler whose captures are about to go away. On the I/O thread (from a
  /// handler), the change happens right after the current handler returns.
  void on_push(push_handler handler);
  /// Sets the handler called once, on the I/O thread, when the connection closes (by
  /// either side, or because it failed: code 1006). When it has already closed, `handler`
  /// runs at once on the calling thread. Pushes received before the close reach the push
  /// handler, if one is set, before this runs.
  ///
  /// What the handlers refer to must outlive them: declare it before the client, or
  /// detach the handlers (`on_push({})`) before it goes away.
  void on_close(close_handler handler);

  /// Sends `{"op":<op>,"id":<n>,<fields_json>}` and waits for the reply: the `ok` frame,
  /// or the error it answers (see the class comment). `fields_json` holds the members to
  /// add (`"to":"bob","body":1`) or a JSON object of them (`{"to":"bob","body":1}`); it
  /// must not hold `op` or `id`. Thread-safe; not on the I/O thread.
  result<client_frame> request(std::string_view op, std::string_view fields_json = {});

  /// As `request`, without waiting: `handler` gets the reply or the error on the I/O
  /// thread (on the calling thread when the frame cannot be sent at all). Thread-safe,
  /// also on the I/O thread.
  void async_request(std::string_view op, std::string_view fields_json, reply_handler handler);

  /// Sends a request without `id` (`{"op":"ack","seq":17}`): the server sends no `ok`, and
  /// reports a failure as an `error` push with `id` null. Errors: `bad_request`,
  /// `payload_too_large` and, when closed, `unavailable`, as for `request`. Thread-safe.
  result<void> notify(std::string_view op, std::string_view fields_json = {});

  /// Sends `text` as a text frame, unchecked (even invalid JSON): for tests. Errors:
  /// `unavailable` when the connection is closed. Thread-safe.
  result<void> send_frame(std::string text);
  /// Sends `bytes` as a binary frame: for tests. Thread-safe.
  result<void> send_binary(std::string bytes);

  // Requests of spec §4 to §7. Each waits for its reply as `request` does, and returns
  // the reply's fields, the server's error, or one of the client's errors listed above.
  // Bodies and results are JSON text (`body_json`, `result_json`); text that is not one
  // JSON value is `bad_request` and is not sent.

  /// `send` (§5): a message to `to`'s inbox.
  result<send_receipt> send(std::string_view to, std::string_view body_json,
                            const message_options& options = {});
  /// `ack` (§5) of the inbox message `seq`.
  result<void> ack(std::int64_t seq);
  /// `nack` (§5): deliver `seq` again after `delay`.
  result<void> nack(std::int64_t seq,
                    std::chrono::milliseconds delay = std::chrono::milliseconds(0));
  /// `publish` (§6) to `topic`.
  result<publish_receipt> publish(std::string_view topic, std::string_view body_json,
                                  const publish_options& options = {});
  /// `subscribe` (§6) to `pattern`, as `sub` (empty: the server names it); returns the
  /// subscription's name. Events arrive as `event` pushes.
  result<std::string> subscribe(std::string_view pattern, const subscribe_from& from = {},
                                std::string_view sub = {});
  /// `unsubscribe` (§6).
  result<void> unsubscribe(std::string_view sub);
  /// `submit` (§7) a task to `job`.
  result<submit_receipt> submit(std::string_view job, std::string_view body_json,
                                const submit_options& options = {});
  /// `register` (§4) for `jobs` with `slots` (0..1024) and optional `meta_json` (an
  /// object); returns `expires_in_s`. Offers arrive as `offer` pushes.
  result<std::int64_t> register_worker(const std::vector<std::string>& jobs, int slots = 1,
                                       std::string_view meta_json = {});
  /// `heartbeat` (§4): refreshes the registry entry and extends every lease held; the
  /// reply holds `leases`.
  result<client_frame> heartbeat();
  /// `heartbeat` (§4) of one task's lease, adopting it for this session; returns the new
  /// `expires_at`. With `attempt` (the claim's), `lease_lost` once it is not current.
  result<std::string> heartbeat(std::string_view task, std::optional<int> attempt = std::nullopt);
  /// `claim` (§7) an offered task.
  result<claim_receipt> claim(std::string_view task);
  /// `decline` (§7) an offered task.
  result<void> decline(std::string_view task);
  /// `complete` (§7) a claimed task with `result_json`. With `attempt` (the claim's: the
  /// fence), `lease_lost` when that attempt is no longer the task's current one.
  result<complete_receipt> complete(std::string_view task, std::string_view result_json,
                                    std::optional<int> attempt = std::nullopt);
  /// `fail` (§7) a claimed task with an error `code` and `message`.
  result<fail_receipt> fail(std::string_view task, std::string_view code, std::string_view message,
                            const fail_options& options = {});
  /// `cancel` (§7) a task (its submitter, or an admin).
  result<void> cancel(std::string_view task);
  /// `scatter` (§12) to the members `to`. Branch messages arrive at the members as
  /// `message` pushes whose envelope has `operation`; the initiator's notice of the end
  /// arrives as a `message` from `$broker` of type `amp.operation.<state>`.
  result<scatter_receipt> scatter(const std::vector<std::string>& to, std::string_view body_json,
                                  const scatter_options& options = {});
  /// `scatter` (§12) to an audience: `"online"` or `"all"`.
  result<scatter_receipt> scatter_to_audience(std::string_view audience, std::string_view body_json,
                                              const scatter_options& options = {});
  /// `reply` (§12) to this participant's branch of `operation` at `attempt`.
  result<reply_receipt> reply(std::string_view operation, int attempt, bool accept = true,
                              std::string_view body_json = "null");
  /// `operation` (§12): the reply holds `operation` (the record, as this participant may
  /// see it).
  result<client_frame> operation(std::string_view operation);
  /// `retry` (§12) of `member`'s branch; returns the branch's new attempt.
  result<int> retry(std::string_view operation, std::string_view member);
  /// `cancel` (§12) of an operation; the reply holds `state` and `branches` (member →
  /// `already_completed`, `stopped` or `unknown`).
  result<client_frame> cancel_operation(std::string_view operation);
  /// `task` (§7): the reply holds `task` (the record) and, with `history`, `history`.
  result<client_frame> task(std::string_view task, bool history = false);
  /// `who` (§4): the reply holds `participants`, those registered for `job` if not empty.
  result<client_frame> who(std::string_view job = {});
  /// `watch` (§4): the reply holds `participants`; `presence` pushes follow.
  result<client_frame> watch();
  /// `bye` (§4): leaves the registry, releases the leases and waits until the server
  /// closes the connection (within `request_timeout`).
  result<void> bye();

  /// Closes the connection with `code` (if it is open) and waits for the closing
  /// handshake to end (at most about a second); pending requests fail with `unavailable`.
  /// On the I/O thread it only starts the close.
  void close(int code = 1000, std::string_view reason = {});
  /// True until the connection closes.
  bool is_open() const noexcept;
  /// Blocks until the connection is closed or `timeout` passes; true when closed.
  bool wait_closed(duration timeout) const;
  /// The close code the server sent (4401, 1009, 1001, 1000 …), or 1006 when the
  /// connection ended without one; `std::nullopt` while it is open.
  std::optional<int> close_code() const;
  /// The reason the server gave with its close code.
  std::string close_reason() const;

 private:
  struct impl;
  explicit client(std::unique_ptr<impl> p) noexcept;
  result<scatter_receipt> scatter_frame(std::string_view audience_member,
                                        std::string_view audience_json, std::string_view body_json,
                                        const scatter_options& options);
  std::unique_ptr<impl> impl_;
};

}  // namespace amp
