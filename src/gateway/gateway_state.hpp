#pragma once

// What the gateway and its sessions share (private to src/gateway). Lock order, outermost
// first: ns_state::mu, then session::impl::mu, then session::impl::out_mu. Nothing is held
// across a blocking backend call.

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "amp/broker/broker.hpp"
#include "amp/gateway/auth.hpp"
#include "amp/gateway/policy.hpp"
#include "amp/gateway/session.hpp"
#include "amp/schema.hpp"
#include "broker/common.hpp"
#include "gateway/metrics.hpp"

namespace amp {
namespace detail {

// An offer sent to a session and neither claimed nor declined yet.
struct open_offer {
  std::shared_ptr<const offer> o;  // shared with the claim that takes it
  timer_id lapse = 0;
  std::uint64_t serial = 0;  // this gateway's number for the offer: redeliveries share `seq`
};

// A session's part in the job work of its namespace: what it registered, the offers open
// to it and the leases it holds (claimed through it, or extended through it).
struct worker {
  std::weak_ptr<session::impl> s;
  std::string who;  // the participant
  bool registered = false;
  std::vector<job_name> jobs;
  int slots = 0;
  std::string meta = "{}";
  std::map<std::string, open_offer, std::less<>> offers;
  std::map<std::string, std::string, std::less<>> leases;  // task -> its job
  int claiming = 0;  // offers taken by a claim whose answer has not come: their slots stay taken

  int busy() const { return static_cast<int>(offers.size() + leases.size()) + claiming; }
};

// A worker of another gateway (one of its sessions), as that gateway last told
// (work_exchange.cpp).
struct remote_worker {
  std::string who;  // the participant
  std::vector<job_name> jobs;
  int slots = 0;
  int busy = 0;  // raised here by each offer handed to it, until that gateway tells again
  time_point heard{};
  std::uint64_t seq = 0;  // of the telling this comes from: an older one does not undo it
};

// Another gateway serving the namespace, with workers.
struct peer_gateway {
  std::map<std::string, remote_worker, std::less<>> workers;  // by that gateway's key
  time_point heard{};
};

// What this gateway last told the others of one of its workers.
struct told_worker {
  std::vector<job_name> jobs;
  int slots = 0;
  int busy = 0;
  bool operator==(const told_worker&) const = default;
};

// One namespace served by this gateway: its broker, the registry as this gateway sees it,
// and the job work of its sessions.
struct ns_state {
  namespace_name ns;
  std::shared_ptr<broker> b;
  std::unique_ptr<subscription> presence;  // the registry watch

  std::mutex mu;
  std::map<std::string, registry_entry, std::less<>> live;  // participant -> entry
  std::map<const void*, std::weak_ptr<session::impl>> watchers;
  std::unordered_map<const void*, worker> workers;  // every authenticated session
  std::set<std::string, std::less<>> fetching;      // jobs with a fetch in flight
  std::set<std::string, std::less<>> retry_armed;   // jobs waiting to fetch again after an error
  std::uint64_t offers_made = 0;                    // numbers the open offers

  // The other gateways of the namespace and their workers (work_exchange.cpp).
  std::unique_ptr<subscription> work_heard;                // amp.<ns>.ctl.work
  std::unique_ptr<subscription> work_handed;               // amp.<ns>.ctl.work.<this gateway>
  std::map<std::string, peer_gateway, std::less<>> peers;  // by gateway id
  std::map<const void*, told_worker> told;                 // the registered workers as last told
  bool announced = false;      // said hello: it has registered workers, and the others know it
  bool telling = false;        // a telling is on its way to the executor
  bool tell_all = false;       // and it tells all the workers here
  std::uint64_t tellings = 0;  // numbers the tellings (`seq`), in the order they are made
  timer_id refresh = 0;

  explicit ns_state(namespace_name n) : ns(std::move(n)) {}
};

// A fetch started while a `complete` frees a slot (gateway::impl::fetch_ahead): what it
// brings is offered once the complete has its outcome, so the fetch's round trip overlaps
// the complete's instead of following it.
struct fetch_ahead {
  explicit fetch_ahead(job_name j) : job(std::move(j)) {}
  job_name job;
  std::mutex mu;
  bool settled = false;                           // the complete has its outcome
  std::optional<result<std::vector<offer>>> got;  // the fetch came back first
};

// What the gateway asks of a session (defined with it in session.cpp).
std::shared_ptr<session::impl> new_session(std::shared_ptr<gateway::impl> gw,
                                           std::shared_ptr<session_carrier> carrier,
                                           std::string id);
// Sends a frame the client must get (a push); false when the session is closing.
bool push(session::impl& s, std::string frame, std::string_view op);
void close(session::impl& s, int code, std::string reason);
// `{"op":op,"task":task}`: what a holder is told (`lease_lost`, `cancelled`).
std::string task_push(std::string_view op, const task_id& task);
const std::string& id_of(const session::impl& s);

}  // namespace detail

struct gateway::impl : std::enable_shared_from_this<gateway::impl> {
  gateway_options opts;
  std::optional<authenticator> auth;
  std::shared_ptr<policy> pol;
  std::map<std::string, json_schema, std::less<>> body_schemas;
  std::shared_ptr<detail::worker_pool> pool;
  executor run;
  // How many frames of one session may be on the executor's threads at once.
  int session_threads = 1;
  std::shared_ptr<amp::clock> clk;
  detail::gateway_metrics metrics;

  std::mutex mu;
  struct ns_slot {
    std::mutex opening;
    std::shared_ptr<detail::ns_state> opened;  // guarded by the gateway's mu
  };
  std::map<std::string, std::shared_ptr<ns_slot>, std::less<>> namespaces;
  std::map<const void*, std::weak_ptr<session::impl>> all_sessions;

  std::atomic<bool> ready{false};
  std::atomic<std::uint64_t> seen_epoch{0};  // the backend's connection_epoch at the last look
  std::atomic<bool> shutting_down{false};
  std::atomic<std::int64_t> pending_connections{0};
  std::atomic<std::int64_t> in_flight{0};  // executor work not finished yet
  timer_id ready_timer = 0;

  // Runs `work` on the executor, counted in `in_flight` (shutdown waits for it).
  void post(std::function<void()> work);
  // Runs `work` on this thread, an exception logged as `post` does.
  void run_here(const std::function<void()>& work);
  // The namespace, its broker opened on first use. Blocks.
  result<std::shared_ptr<detail::ns_state>> ns_for(const namespace_name& ns);
  // Offers work of `job` to the free slots of the sessions of `ns`.
  void pump(const std::shared_ptr<detail::ns_state>& ns, const job_name& job);
  // A fetch's offers to the least loaded eligible workers (the rest handed back), then `pump`
  // again: in turn on this thread when the job's consumer is set up (nothing blocks then),
  // else on the executor. Never blocks: any thread, a transport's included.
  void deliver_offers(const std::shared_ptr<detail::ns_state>& ns, const job_name& job,
                      result<std::vector<offer>> r);
  void pump_all(const std::shared_ptr<detail::ns_state>& ns, const std::vector<job_name>& jobs);
  // Called as the worker `worker` sends `complete` for `task`: starts the fetch that the
  // slot it frees would start, counting that slot as free already, when the task's job has
  // no fetch out and its consumer is set up. Null when it starts none. Whatever the
  // complete's outcome, the caller then calls fetch_ahead_settled, after it freed the slot
  // (or found it still held): the offers go out then, to workers with a free slot (the
  // others are handed back).
  std::shared_ptr<detail::fetch_ahead> fetch_ahead(const std::shared_ptr<detail::ns_state>& ns,
                                                   const void* worker, std::string_view task);
  void fetch_ahead_settled(const std::shared_ptr<detail::ns_state>& ns,
                           const std::shared_ptr<detail::fetch_ahead>& ahead);
  // A session's offer is over (claimed elsewhere, lapsed, declined or its session left):
  // hand it back to the queue when `release`, then offer again. A lapsed offer is not
  // handed back: the consumer's AckWait brings it again, and by then another gateway may
  // have it, so a nak could only disturb that one.
  void offer_done(const std::shared_ptr<detail::ns_state>& ns, const offer& o, bool release);
  // Offers `o` to the least loaded eligible worker of this gateway or, when `may_hand` and
  // a worker of another gateway is less loaded, hands it to that gateway; with no taker,
  // hands it back to the queue (false). Never blocks.
  bool place_offer(const std::shared_ptr<detail::ns_state>& ns, const job_name& job,
                   std::shared_ptr<const offer> o, bool may_hand);

  // ---- the gateways of a namespace as one broker (spec §13; work_exchange.cpp) ----
  // This gateway's id among the others: a subject token.
  std::string id;
  // Hears what the other gateways of `ns` say of their workers, and the offers they hand
  // to this one's; starts telling them of this one's. Blocks (two subscriptions).
  result<void> open_exchange(const std::shared_ptr<detail::ns_state>& ns);
  // The workers of `ns` here may have changed: tells the other gateways, on the executor,
  // once for any number of calls meanwhile: a hello when the first registers, a bye when
  // the last leaves, and what changed while other gateways with workers are known, at most
  // once per `k_tell_after` (so that a busy gateway says one message per interval, not
  // one per claim and complete). Cheap when nothing changed; any thread; `ns.mu` not held.
  // With `all`, every worker is told, changed or not, and whether or not another gateway is
  // known, without waiting.
  void workers_changed(const std::shared_ptr<detail::ns_state>& ns, bool all = false);
  // The telling `workers_changed` started (on the executor).
  void tell_workers(const std::shared_ptr<detail::ns_state>& ns);
  // The other gateway whose worker should take an offer of `job` rather than `local` (the
  // best eligible worker here, or null): one less loaded (busy/slots), live in the
  // registry. Counts the offer against that worker. `ns.mu` held.
  std::optional<std::string> hand_to(detail::ns_state& ns, const job_name& job,
                                     const detail::worker* local, time_point now);
  // `op` (`lease_lost` or `cancelled`) for `holder`, who has no session here: the other
  // gateways push it to the holder's sessions there, once the task's record confirms it.
  void tell_holder_elsewhere(detail::ns_state& ns, std::string_view op,
                             const participant_name& holder, const task_id& task);
  // What another gateway said with `tell_holder_elsewhere` (`data`: `{"task","holder"}`).
  void heard_of_holder(const std::shared_ptr<detail::ns_state>& ns, std::string_view op,
                       std::string_view data);
  // Sends `o` to gateway `peer`; false when it could not be sent.
  bool hand_over(detail::ns_state& ns, const std::string& peer, const offer& o);
  // Times a backend call into `amp_backend_seconds`.
  template <class F>
  auto timed(F&& f) {
    auto start = std::chrono::steady_clock::now();
    auto r = f();
    metrics.backend(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return r;
  }
  // One structured log line; `fields` is a list of JSON members without braces
  // (`"session":"…","code":…`), possibly empty.
  void log(std::string_view level, std::string_view event, std::string_view fields = {});
  void check_ready();
  // Every namespace's inbox fetches now (the backend is back: a message stored while it
  // was cut off woke no parked participant).
  void look_again();
};

}  // namespace amp
