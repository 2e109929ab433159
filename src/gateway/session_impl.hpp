#pragma once

// One client session of `amp.v1` (private to src/gateway): its state, its output, and its
// ops. The members are defined by op group: session.cpp (frames in, the op table, the checks
// in the spec's order, output, the policy steps shared by several ops), session_lifecycle.cpp
// (hello, bye, close), session_messaging.cpp (inbox and topics), session_registry.cpp
// (register, heartbeat, who, watch) and session_jobs.cpp (submit and the task ops). See
// include/amp/gateway/session.hpp and docs/protocol.md.

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "amp/json.hpp"
#include "amp/timestamp.hpp"
#include "detail/lanes.hpp"
#include "detail/simdjson_adapter.hpp"
#include "gateway/gateway_state.hpp"

namespace amp {

namespace dom = simdjson::dom;

// What the op groups share: reading the members of a parsed frame, measuring a wait.
namespace detail::session_util {

double seconds_since(std::chrono::steady_clock::time_point start);
std::size_t utf8_length(std::string_view s);
std::optional<std::string_view> string_at(dom::element e, std::string_view key);
std::string string_or_empty(dom::element e, std::string_view key);
std::optional<std::int64_t> int_at(dom::element e, std::string_view key);
// The fence a frame carries (spec §7): its `attempt`, with one no attempt can have (outside
// 0..INT_MAX) kept as -1, never current, rather than narrowed to one that might be.
std::optional<int> attempt_of(dom::element frame);
bool bool_or(dom::element e, std::string_view key, bool fallback);
// The member's JSON text, minified; empty when absent.
std::string raw_at(dom::element e, std::string_view key);
header_list headers_at(dom::element e);

}  // namespace detail::session_util

// A topic subscription of a session. Events that arrive before the `ok` of `subscribe` has
// been sent wait in `pending` (bounded like the carrier), so the client sees the `ok` first.
struct sub_state {
  std::string name;
  std::mutex mu;
  bool started = false;
  bool over = false;
  std::optional<std::uint64_t> dropped_at;  // dropped before the ok was sent
  std::vector<std::string> pending;
  std::size_t pending_bytes = 0;
  std::unique_ptr<topic_subscription> s;
};

struct session::impl : std::enable_shared_from_this<session::impl> {
  std::shared_ptr<gateway::impl> gw;
  std::shared_ptr<session_carrier> carrier;
  std::string id;

  // Frames waiting for the executor and running on it, by lane (see `classify`): frames of
  // one lane run one at a time in the order they came; a frame without a lane (`barrier`)
  // runs alone; frames of different lanes run at once (up to k_max_running of a session).
  struct queued_frame {
    std::string text;
    std::string_view op{};   // its op's name (in the op table); empty when not known
    bool on_caller = false;  // it may run on the receiving thread (see `classify`)
  };
  using frame_lanes = detail::lanes<queued_frame>;
  using inbound_frame = frame_lanes::entry;
  std::unique_ptr<frame_lanes> frames;  // set by new_session

  std::atomic<bool> ended{false};    // closed() ran, or a close was asked of the carrier
  std::atomic<bool> cleaned{false};  // closed() ran

  std::mutex mu;
  std::shared_ptr<const identity> ident;  // set once, by hello
  std::shared_ptr<detail::ns_state> ns;
  std::unique_ptr<inbox_reader> reader;
  std::map<std::string, std::shared_ptr<sub_state>, std::less<>> subs;
  std::map<std::uint64_t, operation_ref> branches_in_flight;  // by inbox seq (remember_branch)
  std::uint64_t next_sub = 1;
  timer_id hello_timer = 0;
  bool counted = false;  // counts in the gateway's sessions
  bool pending_counted = true;

  std::mutex out_mu;
  bool close_requested = false;

  // ---- output -------------------------------------------------------------------------

  enum class out_kind {
    reply,   // a reply or a push the client must get: over the hard limit, close
    event,   // a topic event: refused over the soft limit
    forced,  // sent whatever the buffer holds (sub_dropped, the last error before a close)
  };

  // Sends one frame; false when it was not sent (closing, or an event over the limit).
  bool emit(std::string frame, std::string_view op, out_kind kind = out_kind::reply);

  void close_locked(int code, std::string reason);

  void request_close(int code, std::string reason);

  // ---- requests -----------------------------------------------------------------------

  struct request {
    std::string_view op;
    std::string id_json;  // the id to echo, or "null"
    bool has_id = false;
    dom::element frame;          // valid only while `process` runs
    std::shared_ptr<void> hold;  // the frame runs until every copy is gone
    // The frame's lane (of a frame that has one) is busy until every copy is gone; an
    // operation that has handed its write to the backend in order may let it go early
    // (`pipelined`). Declared after `hold`, so gone no later than it.
    std::shared_ptr<void> lane;
  };

  // `later(rq)` without the lane: for an operation whose write is on its way to the backend
  // in the order of its lane, so that the lane's next frame need not wait for its answer.
  static request pipelined(const request& rq);

  // The request as an operation that answers later keeps it: without the frame.
  static request later(const request& rq);

  void reply_ok(const request& rq, std::string_view members = {});

  void reply_error(std::string_view id_json, const error& e,
                   std::optional<std::int64_t> retry_after_ms = {},
                   out_kind kind = out_kind::reply);

  void fail(const request& rq, const error& e, std::optional<std::int64_t> retry_after_ms = {});

  void fail(const request& rq, errc code, std::string message);

  // ---- the ops ----------------------------------------------------------------------------

  // Where a frame of an op runs (see `classify`).
  enum class lane_rule {
    barrier,  // alone: after every frame before it, before every frame after it
    none,     // beside anything, in no order (submit, ack, nack)
    task,     // the lane of its `task`, shared by every op on that task (a barrier without one)
    to,       // the lane of its recipient: sends to one participant keep their order
    topic,    // the lane of its topic: publishes on one topic keep their order
  };

  // One op of amp.v1: its name (its shape schema is `frames/<name>`), its lane, what it takes
  // from the participant's ops bucket (nothing for hello and bye, nor for the ops that
  // `admit` rate-limits; the most for those that touch the whole registry), its handler.
  struct op_spec {
    std::string_view name;
    lane_rule lane;
    double cost;
    void (impl::*handle)(request&);
    // The handler never waits for the backend (it answers at once or from a completion),
    // except in the cases `classify` and `runs_here` tell apart: a frame that may start when it
    // arrives runs on the thread that received it, without a hop through the executor.
    bool on_caller = false;
  };

  // Every op a client may send.
  static std::span<const op_spec> ops();
  // The op named `name`; null when there is none.
  static const op_spec* find_op(std::string_view name);

  // ---- inbound --------------------------------------------------------------------------

  // Which lane a frame goes to: its op's `lane_rule`; a frame that is not an object with a
  // known op is a barrier. Also whether it may run on the caller's thread: its op's
  // `on_caller`, but not a submit with an idempotency key (finding its binding blocks) nor a
  // heartbeat with `task` (extending the lease blocks).
  static void classify(inbound_frame& f);

  void receive(std::string_view text);

  // Starts frames that may run: ops that never wait for the backend on this thread (at once
  // with `from_receive`, the thread that received them; else in turn, `detail::run_in_turn`,
  // on the thread where another frame's end let them go), the others on the executor.
  void run(std::vector<inbound_frame> start, bool from_receive = false);

  // Whether an `on_caller` frame may run on the receiving thread after all: not a complete
  // of a lease whose record this gateway did not write for it (reading the record blocks),
  // nor a heartbeat of a session holding leases (extending them blocks). Those run on the
  // executor, within the session's share of its threads.
  bool runs_here(const queued_frame& f);

  // Runs `f` through `process`; lets the frames waiting for it go when its answer is out.
  void start(inbound_frame f);

  void process(std::string_view text, std::shared_ptr<void> hold, std::shared_ptr<void> lane);

  // The identity and namespace of an authenticated session (every op but hello), shared, not
  // copied. Callers name the two through references, not a structured binding: their lambdas
  // capture them, which clang before 16 refuses for bindings (the fuzz build is clang 14).
  std::pair<std::shared_ptr<const identity>, std::shared_ptr<detail::ns_state>> who();

  // ---- hello ----------------------------------------------------------------------------

  void start_hello_deadline();

  void on_hello(request& rq);

  // ---- inbox ----------------------------------------------------------------------------

  void deliver(const inbox_message& m);

  // The policy checks of send, publish and submit, in the spec's order after the
  // envelope: rate, then budget. Returns the spend to refund if the operation fails.
  // `count_budget` may decide after the rate passed whether the budget counts (false: a
  // resubmission), or fail the request itself (then it returns an error).
  std::optional<budget_spend> admit(const request& rq, const identity& me, std::size_t body_bytes,
                                    const std::function<result<bool>()>& count_budget = {});
  // The rate part of `admit`: false (and answered rate_limited) when the rate refuses.
  bool take_rate(const request& rq, const identity& me, std::size_t body_bytes);

  // `admit` without blocking (send, publish, submit without a key): the rate, then the
  // budget, spent asynchronously; `then(rq, spend)` runs once the budget is spent (at once
  // without a budget, else on the thread of whichever spend drives the counter), with a
  // `later` copy of the request: the frame keeps its lane until `then` returns.
  void admit_async(const request& rq, const identity& me, std::size_t body_bytes,
                   std::function<void(const request&, const budget_spend&)> then);

  void refund(const budget_spend& spend);

  result<void> check_body(std::string_view body);

  // The envelope sealed (the envelope rules), then its body checked against the schema of
  // its type (`invalid_envelope`).
  result<sealed_envelope> check_envelope(const identity& me, std::string to, std::string body,
                                         std::string type, header_list headers, std::string msg_id,
                                         std::string reply_to = {}, std::string correlation = {});

  void on_send(request& rq);

  // The completion that answers a send or publish (see `answer_stored`) when the backend has.
  // It does not keep the frame's lane: once the write is handed to the backend, which stores
  // writes handed to it one after another in that order, the lane's next frame may go out
  // while this one awaits its answer (sends to one recipient, publishes on one topic).
  template <class Stored>
  completion<Stored> answer_later(const request& rq, const budget_spend& spend) {
    return [self = shared_from_this(), rq = pipelined(rq), spend,
            started = std::chrono::steady_clock::now()](result<Stored> stored) {
      self->gw->metrics.backend(detail::session_util::seconds_since(started));
      if ((!stored || stored->duplicate) && spend.counted()) {
        // A failure or a duplicate gives the budget unit back (a duplicate costs rate, not
        // budget), then is answered. Asynchronously: this may run inside the spend's own
        // completion (the memory transport answers at once), where a refund that waited
        // for the budget's counter would wait for itself.
        return self->gw->pol->async_refund_budget(spend, [self, rq, stored](result<void>) {
          self->gw->run_here([&] { self->answer_stored(rq, stored); });
        });
      }
      self->answer_stored(rq, stored);
    };
  }

  // The answer to a send or publish (`send_result`, `publish_result`).
  template <class Stored>
  void answer_stored(const request& rq, const result<Stored>& stored) {
    if (!stored) return fail(rq, stored.error());
    json_writer w;
    w.begin_object().key("seq").integer(stored->seq).key("msg_id").string(stored->msg_id);
    w.key("duplicate").boolean(stored->duplicate).end_object();
    reply_members(rq, w.take());
  }

  void reply_members(const request& rq, const std::string& object_json);

  void on_ack(request& rq);

  // ---- topics ---------------------------------------------------------------------------

  void on_publish(request& rq);

  result<replay_from> replay_of(dom::element frame);

  void on_subscribe(request& rq);

  // Tells the client its subscription was dropped, and forgets it.
  void announce_drop(const std::shared_ptr<sub_state>& state, std::uint64_t last_seq);

  void on_unsubscribe(request& rq);

  // Stops a subscription whose callback may be running on this very thread, and destroys it
  // later on the executor (its callbacks hold its state: dropping it breaks that cycle).
  void retire(std::unique_ptr<topic_subscription> s);

  ~impl();

  static void stop_sub(sub_state& state);

  // ---- registry -------------------------------------------------------------------------

  int load_of(const identity& me, detail::ns_state& st);

  void remember_entry(detail::ns_state& st, const registry_entry& e);

  void on_register(request& rq);

  // Refreshes the entry; one that expired while this session stayed registered comes back.
  void refresh_entry(const identity& me, const std::shared_ptr<detail::ns_state>& st);

  // The entry of a session that stayed registered, registered again (it expired). Blocks.
  void register_again(const identity& me, const std::shared_ptr<detail::ns_state>& st);

  // Whether this session holds leases (a heartbeat extends them, which blocks).
  bool holds_leases(detail::ns_state& st);

  void on_heartbeat(request& rq);

  // A heartbeat of a session holding no lease: refreshes the entry without waiting, then
  // answers `{"leases":[]}` from the backend's answer (on its thread).
  void heartbeat_alone(const request& rq, std::shared_ptr<const identity> me,
                       std::shared_ptr<detail::ns_state> st);

  void on_who(request& rq);

  void on_watch(request& rq);

  // ---- jobs -----------------------------------------------------------------------------

  void on_submit(request& rq);

  // Stores an admitted submit (its job message sealed with the task's id) and answers it
  // from the backend's completion.
  void submit(const request& rq, detail::ns_state& st, sealed_envelope env,
              job_submit_options options, const budget_spend& spend);
  void answer_submitted(const request& rq, const submit_result& submitted);

  // Takes the open offer of `task` away from this session, cancelling its lapse timer;
  // nothing when there is none. `claiming`: the offer's slot stays taken, as a lease, while the
  // claim is in flight (the claim's answer keeps or drops it), so that no other offer takes that
  // slot meanwhile.
  std::shared_ptr<const offer> take_offer(detail::ns_state& st, std::string_view task,
                                          bool claiming);

  void on_claim(request& rq);

  void on_decline(request& rq);

  // The lease of `task` is over for this session (completed, failed, lost, released): its
  // slot is free, so the job (`job`, or the one the session held it for) is offered again.
  void lease_over(const std::shared_ptr<detail::ns_state>& st, std::string_view task,
                  std::string_view job);

  // `lease_lost` for `task`: the session's lease is over, unless the participant still holds
  // it here (the frame named another attempt than the live one).
  void lease_refused(const std::shared_ptr<detail::ns_state>& st, const participant_name& who,
                     const task_id& task);

  void on_complete(request& rq);

  void on_fail(request& rq);

  void on_cancel(request& rq);

  void on_task(request& rq);

  // ---- operations (session_operations.cpp) ----------------------------------------------

  void on_scatter(request& rq);
  // The members of `audience` (`online`: live registry entries; `all`: every inbox of the
  // ns), `me` left out unless `include_self`. Errors: the backend's.
  result<std::vector<participant_name>> resolve_audience(detail::ns_state& st,
                                                         const participant_name& me,
                                                         std::string_view audience,
                                                         bool include_self);
  void on_reply(request& rq);
  void on_operation(request& rq);
  void on_retry(request& rq);
  // `cancel` with `operation` (on_cancel hands it here).
  void cancel_operation(request& rq);
  // A branch delivered to this session (its envelope's `operation` names this participant's
  // branch): remembered by seq until it is acked (`take_branch_locked`, under `mu`, in the
  // ack's own critical section), which records the branch as delivered and then answers the
  // ack (`branch_delivered`).
  void remember_branch(const inbox_message& m);
  std::optional<operation_ref> take_branch_locked(std::uint64_t seq);
  void branch_delivered(const operation_ref& ref, const request& ack);

  // ---- bye and close --------------------------------------------------------------------

  void on_bye(request& rq);

  // The connection is gone: hand back open offers, stop the reader and subscriptions.
  void on_closed();
};

}  // namespace amp
