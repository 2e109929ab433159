#pragma once

// The transport's one NATS connection and its request multiplexer (every request on one
// wildcard reply subscription, with deadlines on the transport's clock and "no responders"
// retried), and the plumbing of ordered push subscriptions. Internal to the transport.

#include <nats/nats.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "amp/transport/jetstream.hpp"
#include "detail/guarded.hpp"
#include "detail/serial_queue.hpp"
#include "detail/write_batch.hpp"
#include "transport/jetstream/codec.hpp"
#include "transport/jetstream/socket_loop.hpp"

namespace amp::jetstream_detail {

// ----- connection and request multiplexer --------------------------------------------

// Whether this thread is inside a cnats callback: a connection must not be closed there.
inline thread_local int callback_depth = 0;
struct in_callback_scope {
  in_callback_scope() { ++callback_depth; }
  ~in_callback_scope() { --callback_depth; }
  in_callback_scope(const in_callback_scope&) = delete;
  in_callback_scope& operator=(const in_callback_scope&) = delete;
};

// Destroys `m` (not null) on this thread. natsMsg_Destroy hands every message to cnats's
// collector thread and wakes that thread whenever it sleeps: at our rates, two context
// switches for every message. A message whose collector callback is cleared is freed by
// natsMsg_Destroy at once, so this clears it first when `collector_callback_known()`.
void destroy_here(natsMsg* m);

// Whether this cnats keeps a message's collector callback where `destroy_here` expects it
// (the second pointer of the message, which begins with cnats's natsGCItem {next, freeCb}):
// checked once, on a message made for it, against the address of cnats's natsMsg_free.
// When not, `destroy_here` is natsMsg_Destroy: the layout is cnats's private one, and a
// cnats that changes it costs speed, not correctness.
bool collector_callback_known();

struct nats_reply {
  std::string data;
  natsMsg* msg = nullptr;  // valid only during the callback
};

// One outstanding request: each response goes to on_msg until it returns true; a timeout
// calls on_timeout. Exactly one of the two finishes it.
struct pending_request {
  std::mutex mu;
  bool finished = false;
  std::function<bool(natsMsg*)> on_msg;
  std::function<void()> on_timeout;
  timer_id timer = 0;
  std::string pull;  // pulls: the pull key of their consumer
};

// Writes: a publish is written on the publishing thread right after it, or, when that
// thread has a detail::write_batch open, when the batch ends (socket_loop.hpp).
class connection : public detail::write_sink, public std::enable_shared_from_this<connection> {
 public:
  connection(std::shared_ptr<amp::clock> clock, duration op_timeout,
             std::shared_ptr<const detail::handler_error_sink> sink)
      : clock_(std::move(clock)), op_timeout_(op_timeout), sink_(std::move(sink)) {}

  // Requests still outstanding are answered `unavailable` ("transport closed").
  ~connection();

  result<void> open(const jetstream_options& o);

  natsConnection* nc() const { return nc_; }
  jsCtx* js() const { return js_; }
  const std::shared_ptr<amp::clock>& clock() const { return clock_; }
  duration op_timeout() const { return op_timeout_; }
  // The URL of the server connected to now.
  std::string connected_url() const;
  // The JetStream domain, or empty (jetstream_options::domain).
  const std::string& domain() const { return domain_; }
  const std::shared_ptr<const detail::handler_error_sink>& sink() const { return sink_; }
  time_point deadline() const { return clock_->now() + op_timeout_; }

  // Sends one message expecting responses on a fresh reply subject. Returns an error when
  // it cannot be sent (then no callback runs).
  // A pull names its `consumer` (its pull_key): its status messages come to its reply subject,
  // but the messages it pulls keep their stream subject and are routed by the consumer named
  // in their ack subject, to the one pull in flight for that consumer (the caller sends a
  // consumer's pulls one at a time).
  result<void> send(const std::string& subject, std::string_view data, const header_list* headers,
                    time_point deadline, std::function<bool(natsMsg*)> on_msg,
                    std::function<void()> on_timeout, const std::string* consumer = nullptr);

  natsStatus publish_raw(const std::string& subject, const char* reply, std::string_view data,
                         const header_list* headers);
  // Where a request to `subject` goes: JetStream API requests and KV writes by the domain's
  // API prefix when there is a domain (jetstream_options::domain); anything else as it is.
  std::string routed(const std::string& subject) const;

  // Writes what cnats has buffered (detail::write_sink).
  void flush_writes() noexcept override;

  // A request with one answer. "No responders" (no stream leader, or nobody listening)
  // is retried with backoff until the deadline unless `on_no_responders` decides.
  // `on_no_responders`, if given, is asked once, at the first "no responders", whether
  // to keep trying: it answers with an error to finish with, or nothing to retry.
  using responders_check = std::function<void(std::function<void(std::optional<error>)>)>;
  void request(std::string subject, std::string data, header_list headers, time_point deadline,
               completion<nats_reply> done, responders_check on_no_responders = {});

  // Blocking JetStream API request returning the parsed JSON.
  result<std::string> api(const std::string& subject, std::string payload);

 private:
  struct request_state {
    std::string subject;
    std::string data;
    header_list headers;
    time_point deadline;
    completion<nats_reply> done;
    responders_check on_no_responders;
    int attempts = 0;
  };

  void attempt(const std::shared_ptr<request_state>& st);

  // `no_responders`: the server said nobody serves the subject (rather than: the request
  // could not be sent while the connection is down).
  void retry_later(const std::shared_ptr<request_state>& st, bool no_responders);

  // What the reply subscription's callback holds instead of the connection: it lives until
  // cnats says that no callback runs any more (on_reply_complete), after the connection.
  struct reply_anchor {
    std::weak_ptr<connection> conn;
  };

  static void on_reply(natsConnection*, natsSubscription*, natsMsg* m, void* closure);

  static void on_reply_complete(void* closure) { delete static_cast<reply_anchor*>(closure); }

  // A message delivered to a pull that already ended: back to the stream at once.
  void hand_back(natsMsg* m);

  // Answers and pull statuses come to "<prefix><token>" or "<prefix>p<token>"; pulled
  // messages keep their stream subject and go to the pull in flight for their consumer.
  void dispatch(natsMsg* m);

  void deliver(std::uint64_t token, natsMsg* m);

  // The request of `token`, no longer pending (its pull unlinked); null when there is none.
  std::shared_ptr<pending_request> take(std::uint64_t token);

  void expire(std::uint64_t token);

  void forget(std::uint64_t token);

  // With mu_ held. A message of the ended pull that arrives later is handed back, unless the
  // consumer's next pull is in flight already.
  void unlink_pull(const pending_request& p, std::uint64_t token);

  std::shared_ptr<amp::clock> clock_;
  duration op_timeout_;
  std::shared_ptr<const detail::handler_error_sink> sink_;
  std::unique_ptr<socket_loop> loop_;
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
  natsSubscription* mux_sub_ = nullptr;
  std::string prefix_;
  // "$JS.<domain>.API." with a domain (JetStream API requests are sent there), else empty.
  std::string api_prefix_;
  std::string domain_;
  std::atomic<std::uint64_t> last_token_{0};
  std::mutex mu_;
  std::unordered_map<std::uint64_t, std::shared_ptr<pending_request>> pending_;
  std::unordered_map<std::string, std::uint64_t> pulls_;  // pull key -> the pull in flight
};

// ----- subscriptions (ordered push consumers) ----------------------------------------

class js_subscription final : public subscription {
 public:
  explicit js_subscription(std::shared_ptr<serial_queue> q) : queue_(std::move(q)) {}
  ~js_subscription() override {
    stop();
    if (sub_) natsSubscription_Destroy(sub_);
  }
  void stop() noexcept override {
    std::call_once(stopped_, [this] {
      if (sub_) natsSubscription_Unsubscribe(sub_);
    });
    queue_->stop();
  }
  void attach(natsSubscription* sub) { sub_ = sub; }

 private:
  std::shared_ptr<serial_queue> queue_;
  natsSubscription* sub_ = nullptr;
  std::once_flag stopped_;
};

// What the cnats callback of an ordered consumer needs; owned by the callback closure.
struct push_state {
  detail::handler_error_sink sink;
  std::shared_ptr<serial_queue> queue;
  std::function<void(natsMsg*)> handle;  // runs on the cnats thread, pushes to the queue
};

void on_push(natsConnection*, natsSubscription*, natsMsg* m, void* closure);

void free_push_state(void* closure);

}  // namespace amp::jetstream_detail
