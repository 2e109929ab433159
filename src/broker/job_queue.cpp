#include "amp/broker/job_queue.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <simdjson.h>

#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "amp/timestamp.hpp"
#include "broker/common.hpp"
#include "detail/simdjson_adapter.hpp"
#include "detail/string_hash.hpp"
#include "detail/wait_for.hpp"

namespace amp {

namespace {

constexpr std::string_view k_task_header = "Amp-Task";
constexpr std::string_view k_max_attempts_header = "Amp-Max-Attempts";
constexpr int k_max_attempts_limit = 100;
constexpr int k_cas_rounds = 8;
// A delivery deferred behind a live lease comes back this long after the lease ends.
constexpr duration k_defer_slack = std::chrono::milliseconds(50);
// A lease whose end could not be judged (the backend away) is looked at again this often.
constexpr duration k_lease_retry = std::chrono::seconds(1);
// Records kept from submit for judging first deliveries (a few hundred bytes each).
constexpr std::size_t k_fresh_max = 16384;

error lease_lost(const task_id& task) {
  return error(errc::lease_lost, fmt::format("no live lease on {}", task.view()));
}

// The fence (spec §7): an `attempt` given with complete, fail or heartbeat must be the
// task's current one.
std::optional<error> fenced(const task_id& task, const task_record& r, std::optional<int> attempt) {
  if (!attempt || *attempt == r.attempt) return std::nullopt;
  return error(errc::lease_lost, fmt::format("attempt {} of {} is not its current attempt ({})",
                                             *attempt, task.view(), r.attempt));
}

error closed_error() {
  return error(errc::unavailable, "job queue closed");
}

// What a job queue tells the others of its namespace when it cancels a running task, on
// `subjects::task_control_subject` (a core message: not stored, gone if nobody listens).
std::string cancelled_control(const task_id& task, const participant_name& holder, int attempt) {
  json_writer w(64 + task.view().size() + holder.view().size());
  w.begin_object();
  w.key("event").string("cancelled").key("task").string(task.view());
  w.key("holder").string(holder.view()).key("attempt").integer(attempt);
  w.end_object();
  return w.take();
}

struct task_control {
  task_id task;
  participant_name holder;
  int attempt = 0;
};

// `cancelled_control`'s text read back; nothing for anything else (another version's
// event, or a message that did not come from a job queue).
std::optional<task_control> read_control(std::string_view text) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object o;
  if (parser.parse(text.data(), text.size()).get(o) != simdjson::SUCCESS) return std::nullopt;
  std::string_view event, task, holder;
  std::int64_t attempt = 0;
  if (o["event"].get(event) != simdjson::SUCCESS || event != "cancelled" ||
      o["task"].get(task) != simdjson::SUCCESS || o["holder"].get(holder) != simdjson::SUCCESS ||
      o["attempt"].get(attempt) != simdjson::SUCCESS || attempt < 1 || attempt > 1000000) {
    return std::nullopt;
  }
  auto t = task_id::make(task);
  auto h = participant_name::make(holder);
  if (!t || !h) return std::nullopt;
  return task_control{*t, *h, static_cast<int>(attempt)};
}

std::string notice_body(const task_record& r) {
  json_writer w(160 + r.result.size() + (r.error ? r.error->message.size() : 0));
  w.begin_object();
  w.key("task").string(r.task);
  w.key("job").string(r.job);
  w.key("state").string(to_string(r.state));
  w.key("attempt").integer(r.attempt);
  if (r.state == task_state::completed) {
    w.key("result").raw(r.result.empty() ? "null" : r.result);
  } else {
    w.key("error");
    detail::write_task_error(w, r.error);
  }
  w.end_object();
  return w.take();
}

message token_message(const task_record& r) {
  message m;
  m.ack_token = r.ack_token;
  return m;
}

}  // namespace

struct job_queue::state : std::enable_shared_from_this<job_queue::state> {
  explicit state(broker_config c) : config(std::move(c)) {}

  // Stores a submit whose message (`data`, stamped `stamped`, its id `id`) and fields are
  // checked: binds the idempotency key, publishes the message, writes the record.
  void submit(std::string data, task_id id, const job_name& job, const participant_name& submitter,
              time_point stamped, int max_attempts, const std::string& idempotency_key,
              completion<submit_result> done);

  std::shared_ptr<transport> t;
  std::shared_ptr<task_store> store;
  broker_config config;
  job_events events;
  executor run;
  std::shared_ptr<detail::worker_pool> pool;
  std::string stream;
  std::unique_ptr<subscription> control;  // what the other job queues of the namespace say

  struct held {
    participant_name holder;
    timer_id timer = 0;
    task_record record;  // as this job queue last wrote it: saves a read before the next write
    // The attempt of a write for this lease that the backend did not answer (0: none): it
    // may still land, so until the task is seen to move on a lapsed lease is not yet lost.
    int unsure_attempt = 0;
  };
  mutable std::mutex mu;
  bool closed = false;
  std::set<std::string, std::less<>> consumers;     // jobs whose consumer is ensured
  std::map<std::string, held, std::less<>> leases;  // by task id
  // Records this job queue creates at submit, by task id, until the first delivery of the
  // task's message is judged: judging it by its record here saves a read. An entry is made
  // before the message is published and is pending until the record is written; a fetch
  // that brings the message sooner waits for it (`when_written`) instead of reading. A task
  // changed meanwhile through another process (cancelled there) is then offered as queued,
  // and its claim's compare-and-set answers `conflict`, as when the change comes just after
  // a read. At most `k_fresh_max`: `fresh_order` holds every id of `fresh_records`, oldest
  // first.
  struct fresh_entry {
    std::optional<task_record> record;  // nothing while pending
    std::vector<std::function<void()>> waiting;
  };
  using fresh_map =
      std::unordered_map<std::string, fresh_entry, detail::string_hash, std::equal_to<>>;
  fresh_map fresh_records;
  std::deque<std::string> fresh_order;

  // ----- small helpers -----------------------------------------------------------------

  // Records keep milliseconds; so does every time the broker hands out.
  time_point now() const {
    return std::chrono::time_point_cast<std::chrono::milliseconds>(t->clock()->now());
  }

  result<void> ensure_job(const job_name& job) {
    {
      std::lock_guard lock(mu);
      if (consumers.contains(job.view())) return {};
    }
    consumer_config c{.stream = stream,
                      .durable = subjects::job_consumer(job),
                      .filter_subject = subjects::job_subject(config.ns, job),
                      .ack_wait = config.job(job).lease,
                      .max_ack_pending = -1,
                      .max_deliver = -1};
    auto r = t->ensure_consumer(c);
    if (!r) return r.error();
    std::lock_guard lock(mu);
    consumers.insert(job.str());
    return {};
  }

  const job_config& job_of(const task_record& r) const {
    auto job = job_name::make(r.job);
    return job ? config.job(*job) : config.default_job;
  }

  void post(std::function<void()> work) { run(std::move(work)); }

  // ----- records created here ------------------------------------------------------------

  // Before `task`'s message is published by this job queue's submit.
  void expect_fresh(const std::string& task) {
    std::vector<std::function<void()>> evicted;
    {
      std::lock_guard lock(mu);
      if (closed || !fresh_records.try_emplace(task).second) return;
      fresh_order.push_back(task);
      while (fresh_order.size() > k_fresh_max) {
        if (auto it = fresh_records.find(fresh_order.front()); it != fresh_records.end()) {
          for (auto& w : it->second.waiting) evicted.push_back(std::move(w));
          fresh_records.erase(it);
        }
        fresh_order.pop_front();
      }
    }
    for (auto& w : evicted) w();
  }

  // The submission of `task` is over: its record as written, or nothing when it was not
  // (the entry goes, and judging reads the store as for any task).
  void settle_fresh(std::string_view task, std::optional<task_record> written) {
    std::vector<std::function<void()>> waiting;
    {
      std::lock_guard lock(mu);
      auto it = fresh_records.find(task);
      if (it == fresh_records.end()) return;
      waiting.swap(it->second.waiting);
      if (written) {
        it->second.record = std::move(written);
      } else {
        fresh_records.erase(it);
      }
    }
    for (auto& w : waiting) w();
  }

  void forget_fresh(std::string_view task) { settle_fresh(task, std::nullopt); }

  // Forgets every entry, running what waits for one (a fetch waiting on a closed job queue
  // is answered `unavailable`).
  void drop_fresh() {
    fresh_map dropped;
    {
      std::lock_guard lock(mu);
      dropped.swap(fresh_records);
      fresh_order.clear();
    }
    for (auto& [task, e] : dropped) {
      for (auto& w : e.waiting) w();
    }
  }

  ~state() { drop_fresh(); }

  bool is_closed() {
    std::lock_guard lock(mu);
    return closed;
  }

  // Runs `then` once no task of `msgs` has a pending entry: at once, or on the thread that
  // settles the last of them.
  void when_written(const std::vector<message>& msgs, std::function<void()> then) {
    auto left = std::make_shared<std::atomic<std::size_t>>(1);
    auto one_done = [left, then = std::move(then)] {
      if (left->fetch_sub(1) == 1) then();
    };
    {
      std::lock_guard lock(mu);
      for (const auto& m : msgs) {
        auto task = find_header(m.headers, k_task_header);
        if (!task || m.delivery_count != 1) continue;
        auto it = fresh_records.find(*task);
        if (it == fresh_records.end() || it->second.record) continue;
        left->fetch_add(1);
        it->second.waiting.push_back(one_done);
      }
    }
    one_done();
  }

  // The records created here for the tasks of all of `msgs`, taken, when every message is its
  // task's first delivery and every task is still queued with an attempt left: judging the
  // batch then reads and writes nothing. Nothing is taken otherwise.
  std::optional<std::vector<task_record>> take_all_fresh(const std::vector<message>& msgs) {
    std::lock_guard lock(mu);
    std::vector<decltype(fresh_records)::iterator> found;
    found.reserve(msgs.size());
    for (const auto& m : msgs) {
      auto task = find_header(m.headers, k_task_header);
      if (!task || m.delivery_count != 1) return std::nullopt;
      auto it = fresh_records.find(*task);
      if (it == fresh_records.end() || !it->second.record) return std::nullopt;
      const auto& r = *it->second.record;
      if (r.job_seq != m.seq || r.state != task_state::queued || r.attempt >= r.max_attempts ||
          std::find(found.begin(), found.end(), it) != found.end()) {
        return std::nullopt;
      }
      found.push_back(it);
    }
    std::vector<task_record> records;
    records.reserve(found.size());
    for (auto it : found) {
      records.push_back(std::move(*it->second.record));
      fresh_records.erase(it);
    }
    return records;
  }

  // The record created here for the task of `msg` when `msg` is its first delivery.
  std::optional<task_record> take_fresh(std::string_view task, const message& msg) {
    std::lock_guard lock(mu);
    auto it = fresh_records.find(task);
    if (it == fresh_records.end() || !it->second.record) return std::nullopt;
    auto r = std::move(*it->second.record);
    fresh_records.erase(it);
    if (msg.delivery_count != 1 || r.job_seq != msg.seq) return std::nullopt;
    return r;
  }

  // ----- lease bookkeeping and timers ----------------------------------------------------

  void track(const task_record& r, const participant_name& holder) {
    auto task = r.task;
    std::optional<participant_name> displaced;
    {
      std::lock_guard lock(mu);
      if (closed) return;
      auto [it, fresh] = leases.try_emplace(task, held{holder, 0, r});
      if (!fresh) {
        it->second.record = r;
        it->second.unsure_attempt = 0;
        t->clock()->cancel(it->second.timer);  // a heartbeat: one timer per lease
        if (it->second.holder != holder) displaced = it->second.holder;
        it->second.holder = holder;
      }
      it->second.timer = lease_timer(task, holder, r.lease_expires_at);
    }
    // A claim over a lease that ran out elsewhere: its holder lost it.
    if (displaced) emit_lease_lost(*displaced, *task_id::make(task));
  }

  // Looks at `holder`'s lease on `task` at `when` (`mu` held).
  timer_id lease_timer(const std::string& task, const participant_name& holder, time_point when) {
    std::weak_ptr<state> weak = weak_from_this();
    return t->clock()->call_at(when, [weak, task, holder] {
      auto self = weak.lock();
      if (!self) return;
      self->post([weak, task, holder] {
        if (auto s = weak.lock()) s->on_lease_timer(task, holder);
      });
    });
  }

  // The backend did not answer when `holder`'s lease on `task` ended: look again soon. The
  // lease stays tracked (and counted as its holder's load) until it is known to be over.
  void lease_timer_again(const std::string& task, const participant_name& holder) {
    std::lock_guard lock(mu);
    if (closed) return;
    auto it = leases.find(task);
    if (it == leases.end() || it->second.holder != holder) return;
    it->second.timer = lease_timer(task, holder, now() + k_lease_retry);
  }

  // The record of `task` as this job queue last wrote it for `who`'s lease, if it did, while
  // the lease it wrote has not ended (one extended elsewhere may have: then only the store
  // says) and, when the caller names an attempt, of that attempt (another process may have
  // written another). A write based on it fails with `conflict` when anything changed the
  // task since. Under `mu`; the pointer is good while `mu` is held.
  const task_record* written_locked(std::string_view task, const participant_name& who,
                                    std::optional<int> attempt) {
    auto it = leases.find(task);
    if (it == leases.end() || it->second.holder != who) return nullptr;
    const task_record& w = it->second.record;
    if (w.state != task_state::running || w.lease_expires_at <= now()) return nullptr;
    if (attempt && w.attempt != *attempt) return nullptr;
    return &w;
  }

  // `written_locked`, copied.
  std::optional<task_record> written_for(std::string_view task, const participant_name& who,
                                         std::optional<int> attempt) {
    std::lock_guard lock(mu);
    const task_record* w = written_locked(task, who, attempt);
    if (!w) return std::nullopt;
    return *w;
  }

  // Whether `written_locked` has a record, without copying it.
  bool has_written_for(std::string_view task, const participant_name& who,
                       std::optional<int> attempt) {
    std::lock_guard lock(mu);
    return written_locked(task, who, attempt) != nullptr;
  }

  // A write of `attempt` of `who`'s lease on `task` got no answer: it may land later.
  void unsure(std::string_view task, const participant_name& who, int attempt) {
    std::lock_guard lock(mu);
    auto it = leases.find(task);
    if (it != leases.end() && it->second.holder == who) it->second.unsure_attempt = attempt;
  }

  // `unavailable` when `rec` shows `who`'s lease lapsed but not moved on while a write of
  // that attempt through this job queue has no known outcome: `lease_lost` could be false
  // (the write may still land, as when a stream's leader dies with it in flight).
  std::optional<error> undecided(const task_id& task, const participant_name& who,
                                 const task_record& rec) {
    if (rec.state != task_state::running || rec.owner != who.str()) return std::nullopt;
    std::lock_guard lock(mu);
    auto it = leases.find(task.view());
    if (it == leases.end() || it->second.holder != who ||
        it->second.unsure_attempt != rec.attempt) {
      return std::nullopt;
    }
    return error(
        errc::unavailable,
        fmt::format("an earlier change of {} has no known outcome yet; try again", task.view()));
  }

  // The answer when the store shows `who`'s lease on `task` not live (`rec`, or no record):
  // `unavailable` while a write of it may still land (see `undecided`); else `lease_lost`.
  // A task that moved on (ended, or another holder or attempt) is no longer `who`'s load
  // here; one still running as `who`'s, its lease lapsed, is left to the lease's timer,
  // which moves it on.
  error not_live(const task_id& task, const participant_name& who, const task_record* rec) {
    if (rec) {
      if (auto wait = undecided(task, who, *rec)) return *wait;
    }
    if (!rec || rec->state != task_state::running || rec->owner != who.str()) {
      untrack(task.view(), who);
    }
    return lease_lost(task);
  }

  // Forgets `holder`'s lease on `task` (not a newer holder's); true when it was there.
  bool untrack(std::string_view task, const participant_name& holder) {
    std::lock_guard lock(mu);
    auto it = leases.find(task);
    if (it == leases.end() || it->second.holder != holder) return false;
    t->clock()->cancel(it->second.timer);
    leases.erase(it);
    return true;
  }

  void on_lease_timer(const std::string& task_str, const participant_name& holder) {
    int attempt = 0;
    {
      std::lock_guard lock(mu);
      if (closed) return;
      auto it = leases.find(task_str);
      if (it == leases.end() || it->second.holder != holder) return;
      attempt = it->second.record.attempt;
    }
    auto task = task_id::make(task_str);
    if (!task) return;
    for (int round = 0; round < k_cas_rounds; ++round) {
      auto rec = store->get(config.ns, *task);
      if (!rec) {
        if (rec.error().code() != errc::not_found) return lease_timer_again(task_str, holder);
        if (untrack(task_str, holder)) emit_lease_lost(holder, *task);
        return;
      }
      // Ended by its holder (a complete or fail whose answer was lost): over, not lost.
      if ((rec->state == task_state::completed || rec->state == task_state::failed) &&
          rec->owner == holder.str() && rec->attempt == attempt) {
        untrack(task_str, holder);
        return;
      }
      // Over, or moved on to another attempt (perhaps the holder's own, claimed through
      // another process): the lease held here is lost, and a newer one is not taken over.
      if (rec->state != task_state::running || rec->owner != holder.str() ||
          rec->attempt != attempt) {
        if (untrack(task_str, holder)) emit_lease_lost(holder, *task);
        return;
      }
      if (rec->lease_expires_at > now()) {  // extended elsewhere: wait for the new end
        track(*rec, holder);
        return;
      }
      auto moved = expire(std::move(*rec));
      if (!moved) {
        if (moved.error().code() == errc::conflict) continue;
        return lease_timer_again(task_str, holder);
      }
      if (untrack(task_str, holder)) emit_lease_lost(holder, *task);
      return;
    }
    lease_timer_again(task_str, holder);
  }

  // Another job queue of the namespace cancelled a running task. If its holder's lease is
  // held here, the record is read (it is the truth: a core message proves nothing) and, when
  // it says cancelled, the holder is told here.
  void on_control(const message& m) {
    auto c = read_control(m.data);
    if (!c) return;
    {
      std::lock_guard lock(mu);
      auto it = leases.find(c->task.view());
      if (closed || it == leases.end() || it->second.holder != c->holder ||
          it->second.record.attempt != c->attempt) {
        return;
      }
    }
    std::weak_ptr<state> weak = weak_from_this();
    post([weak, c = std::move(*c)] {
      auto self = weak.lock();
      if (!self) return;
      auto rec = self->store->get(self->config.ns, c.task);
      if (!rec || rec->state != task_state::cancelled || rec->attempt != c.attempt) return;
      if (self->untrack(c.task.view(), c.holder))
        self->emit(self->events.cancelled, c.holder, c.task);
    });
  }

  void emit_lease_lost(const participant_name& holder, const task_id& task) {
    emit(events.lease_lost, holder, task);
  }

  // Runs an event on the executor unless the job queue is closed by then.
  void emit(const std::function<void(const participant_name&, const task_id&)>& cb,
            const participant_name& holder, const task_id& task) {
    if (!cb) return;
    std::weak_ptr<state> weak = weak_from_this();
    post([weak, cb, holder, task] {
      auto self = weak.lock();
      if (!self) return;
      {
        std::lock_guard lock(self->mu);
        if (self->closed) return;
      }
      cb(holder, task);
    });
  }

  // ----- transitions -----------------------------------------------------------------------

  // A running task whose lease ended: back to queued, or failed once attempts are spent.
  // The message is left to AckWait (it redelivers when the lease ends) unless it must go.
  result<task_record> expire(task_record r) {
    auto ts = now();
    if (r.attempt >= r.max_attempts) {
      r.state = task_state::failed;
      r.error = task_error{
          "attempts_exhausted",
          fmt::format("the lease of attempt {} of {} expired", r.attempt, r.max_attempts)};
      r.lease_expires_at = {};
      r.updated_at = ts;
      auto done = store->update(std::move(r));
      if (!done) return done;
      finish(*done, ack_kind::term);
      return done;
    }
    r.state = task_state::queued;
    r.owner.clear();
    r.lease_expires_at = {};
    r.ack_token.clear();
    r.updated_at = ts;
    return store->update(std::move(r));
  }

  // After a terminal state is committed: tell the submitter, then let the message go. A
  // failed notice leaves the message for a redelivery, which notifies again. With
  // `events.async_notify` both steps run in the background, in that order.
  // Without the message at hand (a queued task cancelled), the notice is recorded as sent
  // instead: the message's later delivery lets it go without telling again.
  void finish(const task_record& r, ack_kind kind) {
    if (events.async_notify && !events.notify) {
      auto n = notice_of(r);
      if (!n) return r.ack_token.empty() ? void() : let_go(token_message(r), kind);
      std::optional<message> token;
      if (!r.ack_token.empty()) token = token_message(r);
      std::optional<task_record> to_mark;
      if (!token) to_mark = r;
      return events.async_notify(*n, [self = shared_from_this(), token = std::move(token),
                                      to_mark = std::move(to_mark), kind](result<void> sent) {
        if (!sent) return;
        if (token) return self->let_go(*token, kind);
        self->mark_notified(*to_mark);
      });
    }
    if (!notify(r)) return;
    if (r.ack_token.empty()) {
      if (notice_of(r)) mark_notified(r);
      return;
    }
    if (kind == ack_kind::ack) {
      t->acknowledge(token_message(r), ack_kind::ack);
    } else {
      t->acknowledge(token_message(r), ack_kind::term);
    }
  }

  void let_go(const message& token, ack_kind kind) { t->acknowledge(token, kind); }

  // Records that `r`'s submitter was told (a conflict: it changed since, and is left be).
  void mark_notified(task_record r) {
    r.notified = true;
    store->async_update(std::move(r), [](result<task_record>) {});
  }

  std::optional<task_notice> notice_of(const task_record& r) const {
    auto to = participant_name::make(r.submitted_by);
    if (!to) return std::nullopt;
    return task_notice{.to = *to,
                       .type = fmt::format("amp.task.{}", to_string(r.state)),
                       .body = notice_body(r),
                       .msg_id = fmt::format("{}.{}", r.task, to_string(r.state))};
  }

  bool notify(const task_record& r) {
    if (!events.notify && !events.async_notify) return true;
    auto n = notice_of(r);
    if (!n) return true;
    if (events.notify) return events.notify(*n).has_value();
    return detail::wait_for<void>([&](auto done) { events.async_notify(*n, std::move(done)); })
        .has_value();
  }

  // ----- deliveries ------------------------------------------------------------------------

  // Judges one delivered job message by the task's record (`first`, when read already, for
  // the first round): an offer, or nothing.
  std::optional<offer> judge(message msg, std::optional<result<task_record>> first = {}) {
    auto header = find_header(msg.headers, k_task_header);
    auto task = task_id::make(header.value_or(""));
    auto env = parse_envelope(msg.data);
    if (!task || !env) {  // not ours to offer, ever
      t->acknowledge(msg, ack_kind::term);
      return std::nullopt;
    }
    for (int round = 0; round < k_cas_rounds; ++round) {
      auto rec = round == 0 && first ? std::move(*first) : store->get(config.ns, *task);
      if (!rec && rec.error().code() == errc::not_found) {
        rec = adopt(*task, *env, msg);
        if (!rec && rec.error().code() == errc::conflict) continue;
      }
      if (!rec) {  // the backend is away: let it come back later
        t->acknowledge(msg, ack_kind::nak, std::chrono::seconds(1));
        return std::nullopt;
      }
      if (rec->job_seq != 0 && msg.seq != 0 && rec->job_seq != msg.seq) {
        // A second message of the task: a keyed retry published it again after the first
        // was stored but before its record was, past the duplicate window. The record names
        // the task's message; this one is dropped, offering and telling nothing.
        t->acknowledge(msg, ack_kind::term);
        return std::nullopt;
      }
      switch (rec->state) {
        case task_state::completed:
        case task_state::failed:
        case task_state::cancelled: {
          if (rec->notified || notify(*rec)) t->acknowledge(msg, ack_kind::ack);
          return std::nullopt;
        }
        case task_state::running: {
          auto ts = now();
          if (rec->lease_expires_at > ts) {
            t->acknowledge(msg, ack_kind::nak, rec->lease_expires_at - ts + k_defer_slack);
            return std::nullopt;
          }
          auto holder = participant_name::make(rec->owner);
          auto moved = expire(std::move(*rec));
          if (!moved) {
            if (moved.error().code() == errc::conflict) continue;
            t->acknowledge(msg, ack_kind::nak, std::chrono::seconds(1));
            return std::nullopt;
          }
          if (holder && untrack(task->view(), *holder)) emit_lease_lost(*holder, *task);
          // Ended: `expire` notified and termed it; if the notice failed, the message
          // stays for a redelivery that sends it again.
          if (is_terminal(moved->state)) return std::nullopt;
          return make_offer(std::move(*moved), std::move(*env), std::move(msg));
        }
        case task_state::queued: {
          if (rec->attempt >= rec->max_attempts) {  // cannot happen through this code
            rec->state = task_state::failed;
            rec->error = task_error{"attempts_exhausted", "no attempts left"};
            rec->updated_at = now();
            auto done = store->update(std::move(*rec));
            if (!done && done.error().code() == errc::conflict) continue;
            if (done && notify(*done)) t->acknowledge(msg, ack_kind::term);
            return std::nullopt;
          }
          return make_offer(std::move(*rec), std::move(*env), std::move(msg));
        }
      }
    }
    t->acknowledge(msg, ack_kind::nak);
    return std::nullopt;
  }

  offer make_offer(task_record r, envelope env, message msg) {
    auto job = job_of(r);
    offer o;
    o.attempt = r.attempt + 1;
    o.task = std::move(r);
    o.env = std::move(env);
    o.lease = job.lease;
    // From the delivery, not from now: the consumer's AckWait (the job's lease) brings the
    // message again from about then, however long the judging took.
    auto from = msg.delivered_at == time_point{}
                    ? now()
                    : std::chrono::time_point_cast<std::chrono::milliseconds>(msg.delivered_at);
    o.lapses_at = from + job.lease;
    o.msg = std::move(msg);
    return o;
  }

  // The record of a task whose submission stopped between publish and record.
  result<task_record> adopt(const task_id& task, const envelope& env, const message& msg) {
    task_record r;
    r.task = task.str();
    r.ns = config.ns.str();
    r.job = env.to;
    r.state = task_state::queued;
    r.submitted_by = env.from;
    r.created_at = env.ts;
    r.updated_at = now();
    r.job_seq = msg.seq;
    auto job = job_name::make(env.to);
    r.max_attempts = job ? config.job(*job).max_attempts : config.default_job.max_attempts;
    if (auto h = find_header(msg.headers, k_max_attempts_header)) {
      int n = 0;
      auto [p, ec] = std::from_chars(h->data(), h->data() + h->size(), n);
      if (ec == std::errc{} && p == h->data() + h->size() && n >= 1 && n <= k_max_attempts_limit) {
        r.max_attempts = n;
      }
    }
    return store->create(std::move(r));
  }

  // Once the records of the batch's tasks submitted here are written: judged at once on this
  // thread when that needs no store (`take_all_fresh`), else `judge_all` on the executor.
  void judge_later(std::vector<message> msgs, completion<std::vector<offer>> done) {
    // Shared: `when_written` may hold a copy of the continuation per pending task.
    auto batch = std::make_shared<std::vector<message>>(std::move(msgs));
    auto finish = std::make_shared<completion<std::vector<offer>>>(std::move(done));
    std::weak_ptr<state> weak = weak_from_this();
    when_written(*batch, [weak, batch, finish] {
      auto self = weak.lock();
      if (!self || self->is_closed()) return (*finish)(closed_error());
      if (auto records = self->take_all_fresh(*batch)) {
        std::vector<offer> out;
        for (std::size_t i = 0; i < batch->size(); ++i) {
          auto o = self->judge(std::move((*batch)[i]), std::move((*records)[i]));
          if (o) out.push_back(std::move(*o));
        }
        return (*finish)(std::move(out));
      }
      self->post([weak, batch, finish] {
        auto me = weak.lock();
        if (!me) return (*finish)(closed_error());
        (*finish)(me->judge_all(std::move(*batch)));
      });
    });
  }

  // Judges a fetched batch; the records of its tasks are read together first.
  std::vector<offer> judge_all(std::vector<message> msgs) {
    std::vector<task_id> tasks;
    std::vector<std::size_t> read_for;  // msgs[read_for[i]] is the message of tasks[i]
    for (std::size_t i = 0; i < msgs.size(); ++i) {
      if (auto task = task_id::make(find_header(msgs[i].headers, k_task_header).value_or(""))) {
        tasks.push_back(std::move(*task));
        read_for.push_back(i);
      }
    }
    std::vector<std::optional<result<task_record>>> first(msgs.size());
    std::vector<task_id> unread;
    std::vector<std::size_t> unread_for;
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      if (auto r = take_fresh(tasks[i].view(), msgs[read_for[i]])) {
        first[read_for[i]] = std::move(*r);
      } else {
        unread.push_back(std::move(tasks[i]));
        unread_for.push_back(read_for[i]);
      }
    }
    if (unread.size() > 1) {
      auto records = store->get_many(config.ns, unread);
      for (std::size_t i = 0; i < records.size(); ++i) first[unread_for[i]] = std::move(records[i]);
    }
    std::vector<offer> out;
    for (std::size_t i = 0; i < msgs.size(); ++i) {
      if (auto o = judge(std::move(msgs[i]), std::move(first[i]))) out.push_back(std::move(*o));
    }
    return out;
  }

  // The record of `task` to base `who`'s next write on: in round 0 the one this job queue
  // wrote last for `who`'s live lease when there is one (a stale one makes the write fail
  // with `conflict`, and round 1 reads), read from the store otherwise. A record of another
  // attempt than the one the caller names is read again: another process may have written
  // that attempt.
  result<task_record> latest(const task_id& task, const participant_name& who, int round,
                             std::optional<int> attempt = std::nullopt) {
    if (round == 0) {
      if (auto w = written_for(task.view(), who, attempt)) return std::move(*w);
    }
    return store->get(config.ns, task);
  }

  // The record of `task` if `who` holds a live lease on it (see `latest`).
  result<task_record> held_by(const task_id& task, const participant_name& who, int round,
                              std::optional<int> attempt = std::nullopt) {
    auto rec = latest(task, who, round, attempt);
    if (!rec) {
      if (rec.error().code() == errc::not_found) return not_live(task, who, nullptr);
      return rec;
    }
    if (auto stale = fenced(task, *rec, attempt)) return *stale;
    if (rec->state != task_state::running || rec->owner != who.str() ||
        rec->lease_expires_at <= now()) {
      return not_live(task, who, &*rec);
    }
    return rec;
  }

  // The record a claim of `o` by `who` writes; `not_found` when the offer lapsed.
  result<task_record> claim_record(const offer& o, const participant_name& who) {
    auto ts = now();
    if (ts >= o.lapses_at) {
      return unexpected(errc::not_found, fmt::format("the offer of {} lapsed", o.task.task));
    }
    task_record r = o.task;
    r.state = task_state::running;
    r.attempt = o.attempt;
    r.error.reset();  // an earlier attempt's failure is in the history
    r.owner = who.str();
    r.holders.push_back(who.str());
    r.lease_expires_at = ts + o.lease;
    r.updated_at = ts;
    r.ack_token = o.msg.ack_token;
    r.job_seq = o.msg.seq;
    return r;
  }

  // Whether `now` is `offered` at another revision, nothing else changed.
  static bool stale_revision_only(const task_record& offered, task_record now) {
    if (now.revision == offered.revision) return false;
    now.revision = offered.revision;
    return now == offered;
  }

  // The answer to a claim once its write is done. A lost compare-and-set is read (blocking):
  // it may have been lost to this very claim, sent before.
  result<lease> claimed(const offer& o, const participant_name& who, result<task_record> stored) {
    auto task = task_id::make(o.task.task);
    if (!task) return task.error();
    if (!stored) {
      if (stored.error().code() != errc::conflict) return stored.error();
      auto now_rec = store->get(config.ns, *task);
      if (now_rec && now_rec->state == task_state::running && now_rec->owner == who.str() &&
          now_rec->ack_token == o.msg.ack_token) {
        return lease{*task, now_rec->attempt, now_rec->lease_expires_at,
                     now_rec->job};  // a repeated claim
      }
      if (now_rec && stale_revision_only(o.task, *now_rec)) {
        // The offer was read at a revision the store does not have (a replica behind or
        // astray; the read above went to the leader): nothing changed, so claim again.
        offer again = o;
        again.task = *now_rec;
        auto r = claim_record(again, who);
        if (!r) return r.error();
        auto retried = store->update(std::move(*r));
        if (retried || retried.error().code() != errc::conflict) {
          return claimed(again, who, std::move(retried));
        }
      }
      return unexpected(errc::conflict, fmt::format("task {} moved on", o.task.task));
    }
    // No `in_progress` to restart AckWait: a task that ends within its lease (nearly all)
    // is acknowledged before the message comes again, and one that runs on is delivered
    // again a little before its lease ends (AckWait ran from the delivery, not the claim),
    // judged running and held back until then (`judge`), or kept by its heartbeats.
    track(*stored, who);
    return lease{*task, stored->attempt, stored->lease_expires_at, stored->job};
  }

  // What completing `rec` for `who` comes to: an answer without a write (a repeated
  // complete, a lease that is not `who`'s), or nothing, with `rec` made the record to write.
  std::optional<result<completion_result>> completing(task_record& rec, const task_id& task,
                                                      const participant_name& who,
                                                      const std::string& result_json,
                                                      std::optional<int> attempt) {
    if (auto stale = fenced(task, rec, attempt)) return *stale;
    if (rec.state == task_state::completed && rec.owner == who.str()) {
      return completion_result{std::move(rec), true};
    }
    if (rec.state != task_state::running || rec.owner != who.str() ||
        rec.lease_expires_at <= now()) {
      return not_live(task, who, &rec);
    }
    rec.state = task_state::completed;
    rec.result = result_json;
    rec.error.reset();
    rec.lease_expires_at = {};
    rec.updated_at = now();
    return std::nullopt;
  }

  // After the completed record is stored.
  completion_result completed(const task_id& task, const participant_name& who,
                              task_record stored) {
    untrack(task.view(), who);
    finish(stored, ack_kind::ack);
    return completion_result{std::move(stored), false};
  }

  // `complete`'s compare-and-set rounds, from `first_round` (see `latest`).
  result<completion_result> complete_from(const task_id& task, const participant_name& who,
                                          const std::string& result_json,
                                          std::optional<int> attempt, int first_round) {
    for (int round = first_round; round < k_cas_rounds; ++round) {
      auto rec = latest(task, who, round, attempt);
      if (!rec) {
        if (rec.error().code() == errc::not_found) return not_live(task, who, nullptr);
        return rec.error();
      }
      if (auto answer = completing(*rec, task, who, result_json, attempt)) {
        return std::move(*answer);
      }
      int writing = rec->attempt;
      auto stored = store->update(std::move(*rec));
      if (stored) return completed(task, who, std::move(*stored));
      if (stored.error().code() != errc::conflict) {
        unsure(task.view(), who, writing);
        return stored.error();
      }
    }
    return unexpected(errc::unavailable, fmt::format("task {} kept changing", task.view()));
  }

  bool may_see(const task_record& r, const viewer& by) const {
    if (by.admin || r.submitted_by == by.who.str()) return true;
    return std::find(r.holders.begin(), r.holders.end(), by.who.str()) != r.holders.end();
  }
};

// ----- job_queue ---------------------------------------------------------------------------

job_queue::job_queue(std::shared_ptr<state> s) : s_(std::move(s)) {}

job_queue::~job_queue() {
  close();
}

void job_queue::close() {
  std::map<std::string, state::held, std::less<>> left;
  std::unique_ptr<subscription> control;
  {
    std::lock_guard lock(s_->mu);
    s_->closed = true;
    left.swap(s_->leases);
    control.swap(s_->control);
  }
  if (control) control->stop();
  for (auto& [task, h] : left) s_->t->clock()->cancel(h.timer);
  s_->drop_fresh();
}

result<std::shared_ptr<job_queue>> job_queue::open(std::shared_ptr<transport> t,
                                                   const broker_config& config,
                                                   std::shared_ptr<task_store> store,
                                                   job_events events) {
  stream_config sc{.name = subjects::tasks_stream(config.ns),
                   .subjects = {subjects::job_subjects(config.ns)},
                   .retention = retention_policy::work_queue,
                   .storage = config.storage,
                   .duplicate_window = config.duplicate_window,
                   .replicas = config.replicas};
  if (auto r = t->ensure_stream(sc); !r) return r.error();
  if (!store) {
    auto opened = task_store::open(t, config);
    if (!opened) return opened.error();
    store = *opened;
  }
  auto s = std::make_shared<state>(config);
  s->t = std::move(t);
  s->store = std::move(store);
  s->events = std::move(events);
  s->run = detail::executor_for(config, s->pool);
  s->stream = sc.name;
  std::weak_ptr<state> weak = s;
  auto control =
      s->t->subscribe_core(subjects::task_control_subject(config.ns), [weak](const message& m) {
        if (auto st = weak.lock()) st->on_control(m);
      });
  if (!control) return control.error();
  s->control = std::move(*control);
  return std::make_shared<job_queue>(std::move(s));
}

const job_config& job_queue::config_of(const job_name& job) const {
  return s_->config.job(job);
}

const std::shared_ptr<task_store>& job_queue::store() const noexcept {
  return s_->store;
}

result<submit_result> job_queue::submit(submit_request req) {
  return detail::wait_for<submit_result>(
      [&](auto done) { async_submit(std::move(req), std::move(done)); });
}

namespace {

result<int> attempts_for(const job_config& job, std::optional<int> asked) {
  int max_attempts = asked.value_or(job.max_attempts);
  if (max_attempts < 1 || max_attempts > k_max_attempts_limit) {
    return unexpected(errc::bad_request, fmt::format("max_attempts must be 1 to {}, not {}",
                                                     k_max_attempts_limit, max_attempts));
  }
  return max_attempts;
}

}  // namespace

void job_queue::state::submit(std::string data, task_id id, const job_name& job,
                              const participant_name& submitter, time_point stamped,
                              int max_attempts, const std::string& idempotency_key,
                              completion<submit_result> done) {
  // No consumer here: the tasks stream keeps the message (work-queue retention) until the
  // first fetch of the job, by a worker that may take it, makes the job's consumer. A
  // submitter cannot make consumers by naming jobs nobody works on.

  bool created = true;
  std::string idem_key;
  if (!idempotency_key.empty()) {
    auto bound = store->bind_idempotency_key(config.ns, submitter, idempotency_key, id);
    if (!bound) return done(bound.error());
    idem_key = bound->key;
    if (!bound->bound) {
      created = false;
      id = bound->task;
      auto existing = store->get(config.ns, id);
      if (existing) return done(submit_result{id, false});
      if (existing.error().code() != errc::not_found) return done(existing.error());
      // An earlier submission was cut short: finish it, under its task id.
      auto env = parse_envelope(data);
      if (!env) return done(env.error());
      env->id = id.str();
      data = to_json(*env);
    }
  }

  outgoing_message msg{
      .subject = subjects::job_subject(config.ns, job),
      .data = std::move(data),
      .headers = {{std::string(k_task_header), id.str()},
                  {std::string(k_max_attempts_header), std::to_string(max_attempts)}},
      .msg_id = id.str()};
  task_record r;
  r.task = id.str();
  r.ns = config.ns.str();
  r.job = job.str();
  r.state = task_state::queued;
  r.max_attempts = max_attempts;
  r.submitted_by = submitter.str();
  r.created_at = stamped;
  r.updated_at = stamped;
  r.idem_key = std::move(idem_key);
  std::weak_ptr<state> weak = weak_from_this();
  if (created) expect_fresh(r.task);
  t->async_publish(std::move(msg), [weak, r = std::move(r), id, created,
                                    done = std::move(done)](result<publish_ack> published) mutable {
    auto self = weak.lock();
    if (!published) {
      if (self) self->settle_fresh(id.view(), std::nullopt);
      return done(std::move(published).error());
    }
    if (!self) return done(submit_result{id, created});
    r.job_seq = published->seq;
    // The message is durable now, so the task exists whatever happens to its record:
    // a `conflict` means a fetch adopted it already; any other failure leaves the
    // record to be made by the fetch that adopts the message. Answering an error here
    // would invite a second submission.
    self->store->async_create(std::move(r), [weak, id, created, done = std::move(done)](
                                                result<task_record> stored) mutable {
      if (auto still = weak.lock()) {
        still->settle_fresh(id.view(), stored ? std::optional(std::move(*stored)) : std::nullopt);
      }
      done(submit_result{id, created});
    });
  });
}

void job_queue::async_submit(submit_request req, completion<submit_result> done) {
  auto attempts = attempts_for(s_->config.job(req.job), req.max_attempts);
  if (!attempts) return done(attempts.error());
  auto id = s_->store->new_id();
  auto sealed = sealed_envelope::seal({.from = req.from.str(),
                                       .to = req.job.str(),
                                       .body = std::move(req.body),
                                       .type = std::move(req.type),
                                       .headers = std::move(req.headers),
                                       .msg_id = id.str()},
                                      s_->config.ns.view(), s_->now());
  if (!sealed) return done(sealed.error());
  const auto stamped = sealed->get().ts;
  s_->submit(std::move(*sealed).json(), std::move(id), req.job, req.from, stamped, *attempts,
             req.idempotency_key, std::move(done));
}

void job_queue::async_submit(sealed_envelope sealed, job_submit_options options,
                             completion<submit_result> done) {
  if (auto r = detail::check_sealed_for(sealed, s_->config.ns); !r) return done(r.error());
  auto job = job_name::make(sealed.get().to);
  if (!job) return done(unexpected(errc::invalid_name, "to: " + job.error().message()));
  auto from = participant_name::make(sealed.get().from);
  if (!from) return done(unexpected(errc::invalid_name, "from: " + from.error().message()));
  auto id = task_id::make(sealed.get().id);
  if (!id) {
    return done(unexpected(errc::bad_request, "the sealed job message's id is not a task id: " +
                                                  id.error().message()));
  }
  auto attempts = attempts_for(s_->config.job(*job), options.max_attempts);
  if (!attempts) return done(attempts.error());
  const auto stamped = sealed.get().ts;
  s_->submit(std::move(sealed).json(), std::move(*id), *job, *from, stamped, *attempts,
             options.idempotency_key, std::move(done));
}

result<std::vector<offer>> job_queue::fetch(const job_name& job, std::size_t n, duration max_wait) {
  if (n == 0) return std::vector<offer>{};
  if (auto r = s_->ensure_job(job); !r) return r.error();
  auto msgs = s_->t->fetch(s_->stream, subjects::job_consumer(job),
                           fetch_request{.batch = n, .max_wait = max_wait});
  if (!msgs) return msgs.error();
  return s_->judge_all(std::move(*msgs));
}

void job_queue::async_fetch(const job_name& job, std::size_t n, duration max_wait,
                            completion<std::vector<offer>> done) {
  if (n == 0) {
    return s_->post([done = std::move(done)] { done(std::vector<offer>{}); });
  }
  if (auto r = s_->ensure_job(job); !r) {
    return s_->post([done = std::move(done), e = r.error()] { done(e); });
  }
  std::weak_ptr<state> weak = s_;
  s_->t->async_fetch(s_->stream, subjects::job_consumer(job),
                     fetch_request{.batch = n, .max_wait = max_wait},
                     [weak, done = std::move(done)](result<std::vector<message>> msgs) mutable {
                       auto s = weak.lock();
                       if (!s) return done(closed_error());
                       if (!msgs) {
                         return s->post([done = std::move(done), e = msgs.error()] { done(e); });
                       }
                       s->judge_later(std::move(*msgs), std::move(done));
                     });
}

bool job_queue::fetch_ready(const job_name& job) const {
  std::lock_guard lock(s_->mu);
  return s_->consumers.contains(job.view());
}

result<lease> job_queue::claim(const offer& o, const participant_name& who) {
  auto r = s_->claim_record(o, who);
  if (!r) return r.error();
  return s_->claimed(o, who, s_->store->update(std::move(*r)));
}

void job_queue::async_claim(std::shared_ptr<const offer> o, const participant_name& who,
                            completion<lease> done) {
  auto r = s_->claim_record(*o, who);
  if (!r) return done(r.error());
  std::weak_ptr<state> weak = s_;
  s_->store->async_update(std::move(*r), [weak, o = std::move(o), who, done = std::move(done)](
                                             result<task_record> stored) mutable {
    auto s = weak.lock();
    if (!s) return done(closed_error());
    if (stored || stored.error().code() != errc::conflict) {
      return done(s->claimed(*o, who, std::move(stored)));
    }
    // A lost compare-and-set is judged by reading the record, which blocks: not on the
    // transport's thread.
    s->post([s, o = std::move(o), who = std::move(who), stored = std::move(stored),
             done = std::move(done)]() mutable { done(s->claimed(*o, who, std::move(stored))); });
  });
}

result<void> job_queue::decline(const offer& o) {
  auto job = job_name::make(o.task.job);
  auto delay = job ? s_->config.job(*job).decline_delay : s_->config.default_job.decline_delay;
  return s_->t->nak(o.msg, delay);
}

result<void> job_queue::release(const offer& o) {
  s_->t->acknowledge(o.msg, ack_kind::nak);
  return {};
}

std::string job_queue::offer_text(const offer& o) const {
  json_writer w(640 + o.msg.data.size() + o.task.result.size());
  w.begin_object();
  w.key("record").string(to_stored_json(o.task)).key("revision").integer(o.task.revision);
  w.key("attempt").integer(o.attempt);
  w.key("lapses_at").string(format_timestamp(o.lapses_at));
  w.key("envelope").string(o.msg.data);
  w.key("stream").string(o.msg.stream).key("subject").string(o.msg.subject);
  w.key("seq").integer(o.msg.seq).key("consumer").string(o.msg.consumer);
  w.key("delivery").integer(o.msg.delivery_count).key("ack").string(o.msg.ack_token);
  w.end_object();
  return w.take();
}

result<offer> job_queue::offer_from_text(std::string_view text) const {
  auto bad = [](std::string_view why) {
    return unexpected(errc::bad_request, fmt::format("not an offer: {}", why));
  };
  thread_local simdjson::dom::parser parser;
  detail::parser_release release(parser);
  simdjson::dom::object o;
  if (parser.parse(text.data(), text.size()).get(o) != simdjson::SUCCESS)
    return bad("not a JSON object");
  std::string_view record, lapses, env_text, ack;
  std::uint64_t revision = 0, seq = 0, delivery = 0;
  std::int64_t attempt = 0;
  if (o["record"].get(record) || o["revision"].get(revision) || o["attempt"].get(attempt) ||
      o["lapses_at"].get(lapses) || o["envelope"].get(env_text) || o["ack"].get(ack) ||
      o["seq"].get(seq) || o["delivery"].get(delivery)) {
    return bad("a member is missing or of the wrong type");
  }
  auto rec = parse_task_record(record);
  if (!rec) return bad(rec.error().message());
  auto job = job_name::make(rec->job);
  if (rec->ns != s_->config.ns.view() || !job || !task_id::make(rec->task)) {
    return bad("not a task of this namespace");
  }
  if (rec->state != task_state::queued || attempt != rec->attempt + 1 ||
      rec->attempt >= rec->max_attempts || ack.empty()) {
    return bad("not a queued task with an attempt left");
  }
  auto lapses_at = parse_timestamp(lapses);
  auto env = parse_envelope(env_text);
  if (!lapses_at || !env || env->to != rec->job) return bad("bad lapses_at or envelope");
  offer made;
  made.lease = s_->config.job(*job).lease;
  // Never longer than a whole lease from now, whatever the sender's clock says.
  made.lapses_at = std::min(*lapses_at, s_->now() + made.lease);
  made.attempt = static_cast<int>(attempt);
  made.env = std::move(*env);
  made.task = std::move(*rec);
  made.task.revision = revision;
  made.msg.data = std::string(env_text);
  for (auto [key, field] :
       {std::pair{"stream", &made.msg.stream}, std::pair{"subject", &made.msg.subject},
        std::pair{"consumer", &made.msg.consumer}}) {
    std::string_view v;
    if (o[key].get(v) == simdjson::SUCCESS) *field = std::string(v);
  }
  made.msg.seq = seq;
  made.msg.delivery_count = delivery;
  made.msg.ack_token = std::string(ack);
  return made;
}

result<lease> job_queue::heartbeat(const task_id& task, const participant_name& who,
                                   std::optional<int> attempt) {
  for (int round = 0; round < k_cas_rounds; ++round) {
    auto rec = s_->held_by(task, who, round, attempt);
    if (!rec) return rec.error();
    rec->lease_expires_at = s_->now() + s_->job_of(*rec).lease;
    rec->updated_at = s_->now();
    int writing = rec->attempt;
    auto stored = s_->store->update(std::move(*rec));
    if (!stored) {
      if (stored.error().code() == errc::conflict) continue;
      s_->unsure(task.view(), who, writing);
      return stored.error();
    }
    s_->t->acknowledge(token_message(*stored), ack_kind::in_progress);
    s_->track(*stored, who);
    return lease{task, stored->attempt, stored->lease_expires_at, stored->job};
  }
  return unexpected(errc::unavailable, fmt::format("task {} kept changing", task.view()));
}

std::vector<task_id> job_queue::leases_of(const participant_name& who) const {
  std::vector<task_id> out;
  std::lock_guard lock(s_->mu);
  for (const auto& [task, h] : s_->leases) {
    if (h.holder == who) {
      if (auto id = task_id::make(task)) out.push_back(*id);
    }
  }
  return out;
}

bool job_queue::holds(const task_id& task, const participant_name& who) const {
  std::lock_guard lock(s_->mu);
  auto it = s_->leases.find(task.view());
  return it != s_->leases.end() && it->second.holder == who;
}

bool job_queue::completes_from_written(const task_id& task, const participant_name& who,
                                       std::optional<int> attempt) const {
  return s_->has_written_for(task.view(), who, attempt);
}

std::vector<job_queue::heartbeat_outcome> job_queue::heartbeat_all(const participant_name& who) {
  std::vector<heartbeat_outcome> out;
  for (auto& task : leases_of(who)) {
    auto l = heartbeat(task, who);
    out.push_back(heartbeat_outcome{std::move(task), std::move(l)});
  }
  return out;
}

result<task_record> job_queue::release_lease(const task_id& task, const participant_name& who) {
  for (int round = 0; round < k_cas_rounds; ++round) {
    auto rec = s_->held_by(task, who, round);
    if (!rec) return rec;
    auto token = token_message(*rec);
    auto moved = s_->expire(std::move(*rec));
    if (!moved) {
      if (moved.error().code() == errc::conflict) continue;
      return moved;
    }
    s_->untrack(task.view(), who);
    if (moved->state == task_state::queued) s_->t->acknowledge(token, ack_kind::nak);
    return moved;
  }
  return unexpected(errc::unavailable, fmt::format("task {} kept changing", task.view()));
}

result<completion_result> job_queue::complete(const task_id& task, const participant_name& who,
                                              std::string result_json, std::optional<int> attempt) {
  if (auto r = json_check(result_json); !r) {
    return unexpected(errc::bad_request, "result: " + r.error().message());
  }
  return s_->complete_from(task, who, result_json, attempt, 0);
}

void job_queue::async_complete(const task_id& task, const participant_name& who,
                               std::string result_json, std::optional<int> attempt,
                               completion<completion_result> done) {
  if (auto r = json_check(result_json); !r) {
    return done(unexpected(errc::bad_request, "result: " + r.error().message()));
  }
  auto rec = s_->written_for(task.view(), who, attempt);
  if (!rec) {
    // Not written for a live lease here (see completes_from_written): read it first, which
    // blocks, so on the executor.
    return s_->post(
        [s = s_, task, who, result_json = std::move(result_json), attempt, done = std::move(done)] {
          done(s->complete_from(task, who, result_json, attempt, 1));
        });
  }
  if (auto answer = s_->completing(*rec, task, who, result_json, attempt)) {
    return done(std::move(*answer));
  }
  std::weak_ptr<state> weak = s_;
  int writing = rec->attempt;
  s_->store->async_update(
      std::move(*rec), [weak, task, who, result_json = std::move(result_json), attempt, writing,
                        done = std::move(done)](result<task_record> stored) mutable {
        auto s = weak.lock();
        if (!s) return done(closed_error());
        if (stored) {
          // With a blocking `notify`, the notice and ack block: not on the transport's thread.
          if (s->events.async_notify && !s->events.notify) {
            return done(s->completed(task, who, std::move(*stored)));
          }
          return s->post([s, task = std::move(task), who = std::move(who),
                          stored = std::move(*stored), done = std::move(done)]() mutable {
            done(s->completed(task, who, std::move(stored)));
          });
        }
        if (stored.error().code() != errc::conflict) {
          s->unsure(task.view(), who, writing);
          return done(std::move(stored).error());
        }
        // The task changed since this job queue wrote it: read it (blocking, so not on the
        // transport's thread) and try again.
        s->post([s, task = std::move(task), who = std::move(who),
                 result_json = std::move(result_json), attempt, done = std::move(done)] {
          done(s->complete_from(task, who, result_json, attempt, 1));
        });
      });
}

result<task_record> job_queue::fail(const task_id& task, const participant_name& who,
                                    task_error error, bool retry, duration retry_delay,
                                    std::optional<int> attempt) {
  for (int round = 0; round < k_cas_rounds; ++round) {
    auto rec = s_->held_by(task, who, round, attempt);
    if (!rec) return rec;
    auto token = token_message(*rec);
    rec->error = error;
    rec->lease_expires_at = {};
    rec->updated_at = s_->now();
    bool again = retry && rec->attempt < rec->max_attempts;
    if (again) {
      rec->state = task_state::queued;
      rec->owner.clear();
      rec->ack_token.clear();
    } else {
      rec->state = task_state::failed;
    }
    int writing = rec->attempt;
    auto stored = s_->store->update(std::move(*rec));
    if (!stored) {
      if (stored.error().code() == errc::conflict) continue;
      s_->unsure(task.view(), who, writing);
      return stored;
    }
    s_->untrack(task.view(), who);
    if (again) {
      s_->t->acknowledge(token, ack_kind::nak, std::max(retry_delay, duration::zero()));
    } else {
      if (s_->notify(*stored)) s_->t->acknowledge(token, ack_kind::term);
    }
    return stored;
  }
  return unexpected(errc::unavailable, fmt::format("task {} kept changing", task.view()));
}

result<task_record> job_queue::cancel(const task_id& task, const viewer& by) {
  for (int round = 0; round < k_cas_rounds; ++round) {
    auto rec = s_->store->get(s_->config.ns, task);
    if (!rec) return rec;
    if (!by.admin && rec->submitted_by != by.who.str()) {
      return unexpected(errc::not_found, fmt::format("no task {}", task.view()));
    }
    s_->forget_fresh(task.view());
    if (is_terminal(rec->state)) {
      return unexpected(errc::conflict,
                        fmt::format("task {} already {}", task.view(), to_string(rec->state)));
    }
    bool was_running = rec->state == task_state::running;
    auto holder = participant_name::make(rec->owner);
    const int attempt = rec->attempt;
    rec->state = task_state::cancelled;
    rec->error = task_error{"cancelled", fmt::format("cancelled by {}", by.who.view())};
    rec->lease_expires_at = {};
    rec->updated_at = s_->now();
    auto stored = s_->store->update(std::move(*rec));
    if (!stored) {
      if (stored.error().code() == errc::conflict) continue;
      return stored;
    }
    if (was_running && holder) {
      if (s_->untrack(task.view(), *holder)) {
        s_->emit(s_->events.cancelled, *holder, task);
      } else {
        // Held through another job queue (another gateway): tell it. Lost, the holder
        // learns at its lease's end (`lease_lost`), or from its next heartbeat or complete.
        static_cast<void>(
            s_->t->publish_core({.subject = subjects::task_control_subject(s_->config.ns),
                                 .data = cancelled_control(task, *holder, attempt)}));
      }
    }
    // A queued task's message is dropped when it is next delivered.
    s_->finish(*stored, ack_kind::term);
    return stored;
  }
  return unexpected(errc::unavailable, fmt::format("task {} kept changing", task.view()));
}

result<task_record> job_queue::get(const task_id& task, const viewer& by) {
  auto rec = s_->store->get(s_->config.ns, task);
  if (!rec) return rec;
  if (!s_->may_see(*rec, by)) {
    return unexpected(errc::not_found, fmt::format("no task {}", task.view()));
  }
  return rec;
}

result<std::vector<task_record>> job_queue::history(const task_id& task, const viewer& by) {
  auto rec = get(task, by);
  if (!rec) return rec.error();
  return s_->store->history(s_->config.ns, task);
}

}  // namespace amp
