// The job queue's rules (spec §7) on every transport: offers, claims, leases, attempts,
// commit-then-ack, cancellation, idempotent submission, and recovery from a submission
// or an acknowledgement cut short.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "amp/broker/job_queue.hpp"
#include "amp/subjects.hpp"
#include "broker/cases/broker_helpers.hpp"
#include "broker/cases/faulty_transport.hpp"

namespace amp::broker_testing {
namespace {

class jobs_env {
 public:
  explicit jobs_env(int max_attempts = 3,
                    const std::function<void(bool real_time, broker_config&)>& adjust = {})
      : fx_(make_fixture()),
        t(std::make_shared<faulty_transport>(fx_->shared_transport())),
        cfg(config_for(*fx_)) {
    cfg.default_job.lease = fx_->real_time() ? std::chrono::seconds(1) : std::chrono::seconds(30);
    cfg.default_job.decline_delay =
        fx_->real_time() ? std::chrono::milliseconds(300) : std::chrono::seconds(1);
    cfg.default_job.max_attempts = max_attempts;
    if (adjust) adjust(fx_->real_time(), cfg);
    q = open_queue();
  }

  std::shared_ptr<job_queue> open_queue() {
    job_events ev;
    ev.lease_lost = [this](const participant_name& p, const task_id& id) {
      std::lock_guard lock(mu_);
      lost_.emplace_back(p.str(), id.str());
    };
    ev.cancelled = [this](const participant_name& p, const task_id& id) {
      std::lock_guard lock(mu_);
      cancelled_.emplace_back(p.str(), id.str());
    };
    ev.notify = [this](const task_notice& n) -> result<void> {
      if (fail_notices) return unexpected(errc::unavailable, "inbox away");
      std::lock_guard lock(mu_);
      notices_.push_back(n);
      return {};
    };
    return must(job_queue::open(t, cfg, {}, ev));
  }

  fixture& fx() { return *fx_; }
  void advance(duration d) { fx_->advance(d); }
  duration lease() const { return cfg.default_job.lease; }

  task_id submit(std::string body = R"({"n":1})", std::string key = {},
                 std::optional<int> attempts = {}) {
    return must(q->submit({.job = job,
                           .from = alice,
                           .body = std::move(body),
                           .max_attempts = attempts,
                           .idempotency_key = std::move(key)}))
        .task;
  }

  // What is on offer now (on a real backend, waiting briefly for the first).
  std::vector<offer> offers(std::size_t n = 1) {
    auto wait = fx_->real_time() ? std::chrono::milliseconds(1500) : duration::zero();
    return must(q->fetch(job, n, wait));
  }

  // What is on offer at once.
  std::vector<offer> offers_now(std::size_t n = 1) { return must(q->fetch(job, n, {})); }

  offer one_offer() {
    auto got = offers();
    REQUIRE(got.size() == 1);
    return got.front();
  }

  task_record record(const task_id& id) {
    return must(q->get(id, viewer{.who = alice, .admin = true}));
  }

  std::uint64_t stored_messages() {
    return must(t->stream_info_of(subjects::tasks_stream(cfg.ns))).state.messages;
  }

  std::vector<std::pair<std::string, std::string>> lost() {
    std::lock_guard lock(mu_);
    return lost_;
  }
  std::vector<std::pair<std::string, std::string>> cancelled() {
    std::lock_guard lock(mu_);
    return cancelled_;
  }
  std::vector<task_notice> notices() {
    std::lock_guard lock(mu_);
    return notices_;
  }

 private:
  std::unique_ptr<fixture> fx_;

 public:
  std::shared_ptr<faulty_transport> t;
  broker_config cfg;
  std::shared_ptr<job_queue> q;
  job_name job = jname("resize");
  participant_name alice = pname("alice");
  participant_name w1 = pname("w1");
  participant_name w2 = pname("w2");
  std::atomic<bool> fail_notices{false};

 private:
  std::mutex mu_;
  std::vector<std::pair<std::string, std::string>> lost_;
  std::vector<std::pair<std::string, std::string>> cancelled_;
  std::vector<task_notice> notices_;
};

TEST_CASE("a task goes from submit through offer and claim to completed", "[jobs]") {
  jobs_env env;
  auto id = env.submit(R"({"w":640})");
  auto rec = env.record(id);
  CHECK(rec.state == task_state::queued);
  CHECK(rec.attempt == 0);
  CHECK(rec.max_attempts == 3);
  CHECK(rec.submitted_by == "alice");
  CHECK(rec.job == "resize");

  auto o = env.one_offer();
  CHECK(o.task.task == id.str());
  CHECK(o.attempt == 1);
  CHECK(o.env.from == "alice");
  CHECK(o.env.to == "resize");
  CHECK(o.env.body == R"({"w":640})");

  auto l = must(env.q->claim(o, env.w1));
  CHECK(l.attempt == 1);
  rec = env.record(id);
  CHECK(rec.state == task_state::running);
  CHECK(rec.owner == "w1");
  CHECK(rec.lease_expires_at == l.expires_at);

  auto done = must(env.q->complete(id, env.w1, R"({"ok":true})"));
  CHECK_FALSE(done.duplicate);
  CHECK(done.task.state == task_state::completed);
  rec = env.record(id);
  CHECK(rec.state == task_state::completed);
  CHECK(rec.result == R"({"ok":true})");
  CHECK(eventually([&] { return env.stored_messages() == 0; }));  // acknowledged after the commit

  auto notices = env.notices();
  REQUIRE(notices.size() == 1);
  CHECK(notices[0].to.str() == "alice");
  CHECK(notices[0].type == "amp.task.completed");
  CHECK(notices[0].body == R"({"task":")" + id.str() +
                               R"(","job":"resize","state":"completed","attempt":1,)"
                               R"("result":{"ok":true}})");

  auto again = must(env.q->complete(id, env.w1, R"({"ok":true})"));
  CHECK(again.duplicate);
  CHECK(code_of(env.q->complete(id, env.w2, "1")) == errc::lease_lost);
  CHECK(env.offers().empty());
}

// Waits for an asynchronous operation's completion (a blocking wrapper of our own).
template <class T, class Start>
result<T> await(Start&& start) {
  std::promise<result<T>> p;
  auto f = p.get_future();
  start([&p](result<T> r) { p.set_value(std::move(r)); });
  return f.get();
}

TEST_CASE("the asynchronous forms: submit, claim and complete, and a change made elsewhere",
          "[jobs]") {
  jobs_env env;
  auto submitted = must(await<submit_result>([&](auto done) {
    env.q->async_submit({.job = env.job, .from = env.alice, .body = "7"}, std::move(done));
  }));
  CHECK(submitted.created);
  CHECK(env.record(submitted.task).state == task_state::queued);
  auto o = env.one_offer();
  CHECK(o.task.task == submitted.task.str());
  auto l = must(await<lease>([&](auto done) {
    env.q->async_claim(std::make_shared<const amp::offer>(o), env.w1, std::move(done));
  }));
  CHECK(l.attempt == 1);
  auto done = must(await<completion_result>(
      [&](auto d) { env.q->async_complete(l.task, env.w1, R"({"ok":1})", {}, std::move(d)); }));
  CHECK_FALSE(done.duplicate);
  CHECK(env.record(l.task).state == task_state::completed);
  REQUIRE(eventually([&] { return env.stored_messages() == 0; }));  // acked after the notice
  CHECK(env.notices().size() == 1);

  // A second job queue (another gateway) cancels a task the first one leased, and its word
  // of it is lost: the record the first wrote last is stale, and its complete finds out.
  auto other = env.open_queue();
  auto id = env.submit("8");
  auto l2 = must(env.q->claim(env.one_offer(), env.w1));
  env.t->set_fault([](std::string_view op, std::string_view) -> std::optional<error> {
    if (op == "publish_core") return error(errc::unavailable, "NATS away");
    return std::nullopt;
  });
  must(other->cancel(id, viewer{.who = env.alice}));
  env.t->set_fault({});
  REQUIRE(env.q->holds(id, env.w1));
  CHECK(code_of(await<completion_result>([&](auto d) {
          env.q->async_complete(l2.task, env.w1, "1", {}, std::move(d));
        })) == errc::lease_lost);
  CHECK(env.record(id).state == task_state::cancelled);
  // And a heartbeat elsewhere (a new revision, same holder) does not stop a complete here,
  // not even past the end of the lease as this job queue granted it.
  auto id3 = env.submit("9");
  auto l3 = must(env.q->claim(env.one_offer(), env.w1));
  env.advance(env.lease() * 6 / 10);
  must(other->heartbeat(id3, env.w1));
  env.advance(env.lease() * 6 / 10);
  CHECK(must(await<completion_result>([&](auto d) {
          env.q->async_complete(l3.task, env.w1, "2", {}, std::move(d));
        })).task.state == task_state::completed);
  CHECK(code_of(await<submit_result>([&](auto d) {
          env.q->async_submit({.job = env.job, .from = env.alice, .body = "not json"},
                              std::move(d));
        })) == errc::bad_request);
}

TEST_CASE("two claims of one task never both succeed", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  auto o = env.one_offer();
  constexpr int k_racers = 8;
  std::atomic<int> won{0};
  std::atomic<int> conflicts{0};
  std::vector<std::thread> racers;
  for (int i = 0; i < k_racers; ++i) {
    racers.emplace_back([&, i] {
      auto r = env.q->claim(o, pname("w" + std::to_string(i)));
      if (r) {
        ++won;
      } else if (r.error().code() == errc::conflict) {
        ++conflicts;
      }
    });
  }
  for (auto& r : racers) r.join();
  CHECK(won == 1);
  CHECK(conflicts == k_racers - 1);
  CHECK(env.record(id).attempt == 1);
}

TEST_CASE("a first delivery of a task submitted here is judged without reading its record",
          "[jobs]") {
  jobs_env env;
  std::atomic<int> reads{0};
  env.t->set_fault([&](std::string_view op, std::string_view) -> std::optional<error> {
    if (op == "kv_get") ++reads;
    return std::nullopt;
  });
  auto a = env.submit("1");
  auto b = env.submit("2");
  auto got = env.offers(2);
  REQUIRE(got.size() == 2);
  CHECK(reads == 0);
  CHECK(got[0].task.state == task_state::queued);
  CHECK(got[0].attempt == 1);
  auto& of_a = got[0].task.task == a.str() ? got[0] : got[1];
  auto& of_b = got[0].task.task == a.str() ? got[1] : got[0];
  CHECK(of_b.task.task == b.str());
  // The record an offer carries is the stored one: its claim writes over it.
  CHECK(of_a.task == env.record(a));
  reads = 0;
  must(env.q->release(of_b));
  auto again = env.one_offer();  // a redelivery is judged by the store
  CHECK(again.task.task == b.str());
  CHECK(reads >= 1);
  must(env.q->claim(of_a, env.w1));
  must(env.q->claim(again, env.w2));
  CHECK(env.record(a).owner == "w1");
  CHECK(env.record(b).owner == "w2");
  env.t->set_fault({});
}

TEST_CASE("a fetch waiting when a task is submitted here offers it without reading its record",
          "[jobs]") {
  jobs_env env;
  CHECK(env.offers_now().empty());  // makes the job's consumer
  std::atomic<int> reads{0};
  env.t->set_fault([&](std::string_view op, std::string_view) -> std::optional<error> {
    if (op == "kv_get") ++reads;
    return std::nullopt;
  });
  // The message may come before the record is written: the fetch waits for the write.
  std::promise<result<std::vector<offer>>> fetched;
  env.q->async_fetch(env.job, 1, std::chrono::seconds(10),
                     [&](result<std::vector<offer>> r) { fetched.set_value(std::move(r)); });
  auto id = env.submit("1");
  auto got = must(fetched.get_future().get());
  REQUIRE(got.size() == 1);
  CHECK(got[0].task.task == id.str());
  CHECK(reads == 0);
  CHECK(got[0].task == env.record(id));
  must(env.q->claim(got[0], env.w1));
  CHECK(env.record(id).owner == "w1");
  env.t->set_fault({});
}

// Whether this thread is running work of a `marking` executor.
thread_local bool t_on_executor = false;

// `inner`, with its work marked (t_on_executor) while it runs.
executor marking(executor inner) {
  return [inner = std::move(inner)](std::function<void()> work) {
    inner([work = std::move(work)] {
      const bool was = t_on_executor;
      t_on_executor = true;
      work();
      t_on_executor = was;
    });
  };
}

// One thread of its own running what it is given, in order; for real-time backends, whose
// transport threads must not run the executor's work.
class thread_executor {
 public:
  thread_executor()
      : thread_([this] {
          std::unique_lock lock(mu_);
          for (;;) {
            cv_.wait(lock, [this] { return stop_ || !work_.empty(); });
            if (work_.empty()) return;
            auto next = std::move(work_.front());
            work_.pop_front();
            lock.unlock();
            next();
            lock.lock();
          }
        }) {}
  ~thread_executor() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  thread_executor(const thread_executor&) = delete;
  thread_executor& operator=(const thread_executor&) = delete;

  executor get() {
    return [this](std::function<void()> work) {
      {
        std::lock_guard lock(mu_);
        work_.push_back(std::move(work));
      }
      cv_.notify_one();
    };
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> work_;
  bool stop_ = false;
  std::thread thread_;
};

// What an async_fetch answered, and whether it answered on the executor.
struct fetched_where {
  bool on_executor = false;
  result<std::vector<offer>> offers;
};

fetched_where fetch_async(jobs_env& env, std::size_t n) {
  std::promise<fetched_where> fetched;
  env.q->async_fetch(env.job, n, std::chrono::seconds(10), [&](result<std::vector<offer>> r) {
    fetched.set_value({t_on_executor, std::move(r)});
  });
  return fetched.get_future().get();
}

TEST_CASE("a batch of tasks submitted here and queued is judged without the executor", "[jobs]") {
  thread_executor own;  // outlives the job queue
  jobs_env env(3, [&](bool real_time, broker_config& c) {
    c.run = marking(real_time ? own.get() : inline_executor());
  });
  CHECK(env.offers_now().empty());  // makes the job's consumer
  std::atomic<int> reads{0};
  env.t->set_fault([&](std::string_view op, std::string_view) -> std::optional<error> {
    if (op == "kv_get") ++reads;
    return std::nullopt;
  });
  auto a = env.submit("1");
  auto got = fetch_async(env, 1);
  CHECK_FALSE(got.on_executor);
  auto offers = must(std::move(got.offers));
  REQUIRE(offers.size() == 1);
  CHECK(offers[0].task.task == a.str());
  CHECK(reads == 0);
  CHECK(offers[0].task == env.record(a));
  must(env.q->claim(offers[0], env.w1));
  CHECK(env.record(a).owner == "w1");

  // A batch with a task submitted through another job queue is judged on the executor: that
  // task's record is read (the one kept here still serves the other task).
  auto other = env.open_queue();
  auto b = env.submit("2");
  auto c = must(other->submit({.job = env.job, .from = env.alice, .body = "3"})).task;
  std::set<std::string> offered;
  for (int i = 0; i < 5 && offered.size() < 2; ++i) {
    got = fetch_async(env, 2);
    for (auto& o : must(std::move(got.offers))) {
      offered.insert(o.task.task);
      if (o.task.task == c.str()) CHECK(got.on_executor);
      must(env.q->claim(o, env.w2));
    }
  }
  CHECK(offered == std::set<std::string>{b.str(), c.str()});
  CHECK(reads >= 1);
  CHECK(env.record(c).owner == "w2");
  env.t->set_fault({});
}

TEST_CASE("a task cancelled elsewhere before its first delivery is never claimed", "[jobs]") {
  jobs_env env;
  auto other = env.open_queue();  // another gateway on the same backend
  auto here = env.submit("1");
  auto there = env.submit("2");
  must(other->cancel(there, viewer{.who = env.alice}));
  must(env.q->cancel(here, viewer{.who = env.alice}));
  // The one cancelled here is not offered; the one cancelled elsewhere may be, on the record
  // this job queue created, and its claim finds the change.
  std::vector<offer> stale;
  for (int i = 0; i < 3 && stale.empty(); ++i) stale = env.offers(2);
  if (!env.fx().real_time()) CHECK(stale.size() == 1);  // a backend with one delivery order
  for (auto& o : stale) {
    CHECK(o.task.task == there.str());
    CHECK(code_of(env.q->claim(o, env.w1)) == errc::conflict);
  }
  CHECK(env.record(here).state == task_state::cancelled);
  CHECK(env.record(there).state == task_state::cancelled);
  // Both messages go once delivered again (AckWait); each submitter notice has one msg_id
  // (a repeat, when the delivery comes before `notified` is written, is deduplicated by it).
  env.advance(env.lease() + std::chrono::seconds(1));
  CHECK(env.offers(2).empty());
  REQUIRE(eventually([&] { return env.stored_messages() == 0; }));
  std::set<std::string> notices;
  for (const auto& n : env.notices()) notices.insert(n.msg_id);
  CHECK(notices == std::set<std::string>{here.str() + ".cancelled", there.str() + ".cancelled"});
}

TEST_CASE("an offer read at a revision the store does not have is claimed, a changed one is not",
          "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  auto o = env.one_offer();
  // As a replica that diverged answers a read: the same record at another revision.
  auto stale = o;
  stale.task.revision += 1000;
  auto l = must(env.q->claim(stale, env.w1));
  CHECK(l.attempt == 1);
  auto rec = env.record(id);
  CHECK(rec.state == task_state::running);
  CHECK(rec.owner == "w1");
  // A record that changed since the offer was read is not claimed over.
  auto changed = o;
  changed.task.revision += 1000;
  CHECK(code_of(env.q->claim(changed, env.w2)) == errc::conflict);
  CHECK(env.record(id).owner == "w1");
  CHECK(env.record(id).attempt == 1);
}

TEST_CASE("only the live lease holder completes, others get lease_lost", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  CHECK(code_of(env.q->complete(id, env.w2, "1")) == errc::lease_lost);
  CHECK(code_of(env.q->fail(id, env.w2, {"x", "y"}, true, {})) == errc::lease_lost);
  CHECK(code_of(env.q->heartbeat(id, env.w2)) == errc::lease_lost);
  CHECK(code_of(env.q->complete(id, env.w1, "not json")) == errc::bad_request);
  CHECK(env.record(id).state == task_state::running);
  CHECK(env.stored_messages() == 1);
}

TEST_CASE("an expired lease: lease_lost, offered again, late complete refused", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  env.advance(env.lease() + std::chrono::milliseconds(100));
  REQUIRE(eventually([&] { return !env.lost().empty(); }));
  CHECK(env.lost() == std::vector<std::pair<std::string, std::string>>{{"w1", id.str()}});
  auto rec = env.record(id);
  CHECK(rec.state == task_state::queued);
  CHECK(rec.owner.empty());
  CHECK(rec.attempt == 1);

  auto o = env.one_offer();
  CHECK(o.attempt == 2);
  CHECK(code_of(env.q->complete(id, env.w1, "1")) == errc::lease_lost);
  CHECK(env.stored_messages() == 1);  // the stale holder's ack was never sent
  must(env.q->claim(o, env.w2));
  must(env.q->complete(id, env.w2, "2"));
  rec = env.record(id);
  CHECK(rec.state == task_state::completed);
  CHECK(rec.holders == std::vector<std::string>{"w1", "w2"});
  auto history = must(env.q->history(id, viewer{.who = env.w1}));
  CHECK(history.front().state == task_state::queued);
  CHECK(history.back().state == task_state::completed);
}

TEST_CASE("heartbeats keep a lease alive past its length", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  for (int i = 0; i < 3; ++i) {
    env.advance(env.lease() * 6 / 10);
    auto l = must(env.q->heartbeat(id, env.w1));
    CHECK(l.expires_at > env.t->clock()->now());
  }
  auto all = env.q->heartbeat_all(env.w1);
  REQUIRE(all.size() == 1);
  CHECK(all[0].task == id);
  CHECK(must(all[0].extended).task == id);
  CHECK(env.offers_now().empty());  // never redelivered while the lease lives
  must(env.q->complete(id, env.w1, "true"));
  CHECK(env.lost().empty());
}

TEST_CASE("heartbeat_all extends each lease on its own, and a lease found lost stops counting",
          "[jobs]") {
  jobs_env env;
  std::vector<task_id> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(env.submit(std::to_string(i)));
  auto offers = env.offers(3);
  REQUIRE(offers.size() == 3);
  for (const auto& o : offers) must(env.q->claim(o, env.w1));
  std::sort(ids.begin(), ids.end());
  CHECK(env.q->leases_of(env.w1) == ids);
  auto refused = ids[0];
  env.t->set_fault([&](std::string_view op, std::string_view key) -> std::optional<error> {
    if (op == "kv_update" && key.find(refused.view()) != std::string_view::npos) {
      return error(errc::unavailable, "backend away");
    }
    return std::nullopt;
  });
  env.advance(env.lease() / 2);
  auto all = env.q->heartbeat_all(env.w1);
  env.t->set_fault({});
  REQUIRE(all.size() == 3);
  CHECK(all[0].task == refused);
  CHECK(code_of(all[0].extended) == errc::unavailable);
  for (int i = 1; i < 3; ++i) {  // the refusal of the first did not stop these
    CHECK(all[i].task == ids[i]);
    REQUIRE(all[i].extended.has_value());
    CHECK(all[i].extended->expires_at == env.record(ids[i]).lease_expires_at);
    CHECK(env.record(ids[i]).lease_expires_at > env.t->clock()->now() + env.lease() * 9 / 10);
  }
  CHECK(env.q->leases_of(env.w1) == ids);  // refused, not lost: still its load
  must(env.q->heartbeat(refused, env.w1));

  // Elsewhere the lease on ids[1] moved to w2. Its next heartbeat here is lease_lost, and
  // the lease is no longer w1's load (it was until its timer fired).
  auto r = must(env.q->store()->get(env.cfg.ns, ids[1]));
  r.owner = "w2";
  r.attempt = 2;
  must(env.q->store()->update(r));
  CHECK(code_of(env.q->heartbeat(ids[1], env.w1)) == errc::lease_lost);
  // A fenced heartbeat (another attempt) says nothing about w1's live lease on ids[2].
  CHECK(code_of(env.q->heartbeat(ids[2], env.w1, 7)) == errc::lease_lost);
  CHECK(env.q->leases_of(env.w1) == std::vector<task_id>{ids[0], ids[2]});
}

TEST_CASE("max_attempts expired leases end the task failed: attempts_exhausted", "[jobs]") {
  jobs_env env;
  auto id = env.submit("1", {}, 2);
  for (int attempt = 1; attempt <= 2; ++attempt) {
    auto o = env.one_offer();
    CHECK(o.attempt == attempt);
    must(env.q->claim(o, env.w1));
    env.advance(env.lease() + std::chrono::milliseconds(100));
    REQUIRE(eventually([&] { return env.record(id).state != task_state::running; }));
  }
  auto rec = env.record(id);
  CHECK(rec.state == task_state::failed);
  REQUIRE(rec.error.has_value());
  CHECK(rec.error->code == "attempts_exhausted");
  CHECK(rec.attempt == 2);
  CHECK(env.offers().empty());
  CHECK(eventually([&] { return env.stored_messages() == 0; }));
  REQUIRE(env.notices().size() == 1);
  CHECK(env.notices()[0].type == "amp.task.failed");
}

TEST_CASE("an expired lease found by a redelivery, with no timer of ours, is judged too",
          "[jobs]") {
  jobs_env env;
  auto id = env.submit("1", {}, 1);
  must(env.q->claim(env.one_offer(), env.w1));
  env.q->close();  // the gateway that granted the lease is gone
  env.q = env.open_queue();
  env.advance(env.lease() + std::chrono::milliseconds(100));
  CHECK(env.offers().empty());
  auto rec = env.record(id);
  CHECK(rec.state == task_state::failed);
  CHECK(rec.error->code == "attempts_exhausted");
  CHECK(eventually([&] { return env.stored_messages() == 0; }));
}

TEST_CASE("fail retries after the delay while attempts remain, then fails", "[jobs]") {
  jobs_env env(2);
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  auto r = must(env.q->fail(id, env.w1, {"busy", "try later"}, true, env.lease() / 2));
  CHECK(r.state == task_state::queued);
  CHECK(r.attempt == 1);
  CHECK(r.owner.empty());
  if (!env.fx().real_time()) CHECK(env.offers().empty());  // not before the delay
  env.advance(env.lease() / 2 + std::chrono::milliseconds(50));
  auto o = env.one_offer();
  CHECK(o.attempt == 2);
  must(env.q->claim(o, env.w2));
  r = must(env.q->fail(id, env.w2, {"broken", "no"}, true, {}));
  CHECK(r.state == task_state::failed);  // no attempts left
  CHECK(r.error == task_error{"broken", "no"});
  CHECK(eventually([&] { return env.stored_messages() == 0; }));
  CHECK(env.notices().at(0).type == "amp.task.failed");
}

TEST_CASE("fail without retry ends the task at once", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  auto r = must(env.q->fail(id, env.w1, {"bad_input", "cannot"}, false, {}));
  CHECK(r.state == task_state::failed);
  CHECK(r.attempt == 1);
  CHECK(env.offers().empty());
}

TEST_CASE("a declined offer comes back after decline_delay without an attempt", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->decline(env.one_offer()));
  if (!env.fx().real_time()) CHECK(env.offers().empty());
  env.advance(env.cfg.default_job.decline_delay + std::chrono::milliseconds(50));
  auto o = env.one_offer();
  CHECK(o.attempt == 1);
  CHECK(env.record(id).attempt == 0);
  must(env.q->release(o));
  CHECK(env.one_offer().attempt == 1);  // released: back at once
}

TEST_CASE("an offer neither claimed nor declined lapses and is offered again", "[jobs]") {
  jobs_env env;
  env.submit();
  auto o = env.one_offer();
  env.advance(env.lease() + std::chrono::milliseconds(100));
  CHECK(code_of(env.q->claim(o, env.w1)) == errc::not_found);
  auto again = env.one_offer();
  CHECK(again.attempt == 1);
  must(env.q->claim(again, env.w2));
}

TEST_CASE("an offer lapses a lease after its delivery, however long judging it took", "[jobs]") {
  jobs_env env;
  auto other = env.open_queue();  // submitted elsewhere, so judging reads the record
  must(other->submit({.job = env.job, .from = env.alice, .body = "1"}));
  auto slow = env.lease() / 2;
  std::atomic<bool> once{true};
  env.t->set_fault([&](std::string_view op, std::string_view) -> std::optional<error> {
    if (op == "kv_get" && once.exchange(false)) env.advance(slow);  // a slow read of the record
    return std::nullopt;
  });
  auto before = env.t->clock()->now();
  auto o = env.one_offer();
  env.t->set_fault({});
  REQUIRE_FALSE(once);
  CHECK(o.msg.delivered_at >= before);
  CHECK(o.msg.delivered_at + slow <= env.t->clock()->now());
  CHECK(o.lapses_at <= o.msg.delivered_at + env.lease());
  CHECK(o.lapses_at >= o.msg.delivered_at + env.lease() - std::chrono::milliseconds(1));
}

TEST_CASE("cancel: queued and running tasks end, terminal is conflict, others not_found",
          "[jobs]") {
  jobs_env env;
  auto queued = env.submit("1");
  auto running = env.submit("2");
  auto offers = env.offers(2);
  REQUIRE(offers.size() == 2);
  auto& o = offers[0].task.task == running.str() ? offers[0] : offers[1];
  auto& other = offers[0].task.task == running.str() ? offers[1] : offers[0];
  must(env.q->claim(o, env.w1));
  must(env.q->release(other));

  CHECK(code_of(env.q->cancel(queued, viewer{.who = env.w1})) == errc::not_found);
  CHECK(must(env.q->cancel(queued, viewer{.who = env.alice})).state == task_state::cancelled);
  CHECK(must(env.q->cancel(running, viewer{.who = env.w2, .admin = true})).state ==
        task_state::cancelled);
  REQUIRE(eventually([&] { return !env.cancelled().empty(); }));
  CHECK(env.cancelled() == std::vector<std::pair<std::string, std::string>>{{"w1", running.str()}});
  CHECK(code_of(env.q->complete(running, env.w1, "1")) == errc::lease_lost);
  CHECK(code_of(env.q->cancel(queued, viewer{.who = env.alice})) == errc::conflict);
  CHECK(env.offers(2).empty());  // the queued one's message is dropped when delivered
  CHECK(eventually([&] { return env.stored_messages() == 0; }));
  std::set<std::string> notices;  // repeats carry the same msg_id
  for (const auto& n : env.notices()) notices.insert(n.msg_id);
  CHECK(notices ==
        std::set<std::string>{queued.str() + ".cancelled", running.str() + ".cancelled"});
}

TEST_CASE("a running task cancelled through another job queue: its holder's job queue is told",
          "[jobs][several]") {
  jobs_env env;
  callback_log<std::string> elsewhere;  // events of the other job queue (another gateway)
  job_events ev;
  ev.cancelled = [&](const participant_name& p, const task_id& id) {
    elsewhere.callback()(p.str() + " " + id.str());
  };
  ev.lease_lost = ev.cancelled;
  auto other = must(job_queue::open(env.t, env.cfg, {}, ev));
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  REQUIRE(env.q->holds(id, env.w1));

  CHECK(must(other->cancel(id, viewer{.who = env.alice})).state == task_state::cancelled);
  REQUIRE(eventually([&] { return !env.cancelled().empty(); }));
  CHECK(env.cancelled() == std::vector<std::pair<std::string, std::string>>{{"w1", id.str()}});
  CHECK_FALSE(env.q->holds(id, env.w1));  // no longer counted as w1's load
  CHECK(env.q->leases_of(env.w1).empty());
  CHECK(code_of(env.q->complete(id, env.w1, "1")) == errc::lease_lost);
  CHECK(elsewhere.size() == 0);
  CHECK(env.lost().empty());
}

TEST_CASE("a cancel said on the control subject changes nothing unless the record says it",
          "[jobs][several]") {
  jobs_env env;
  auto id = env.submit();
  auto o = env.one_offer();
  auto l = must(env.q->claim(o, env.w1));
  auto control = [&](std::string data) {
    must(env.t->publish_core(
        {.subject = subjects::task_control_subject(env.cfg.ns), .data = std::move(data)}));
  };
  // Not cancelled in the store (anyone on NATS may send this), another attempt, another
  // holder, not JSON: the lease stays.
  auto said = [&](std::string_view holder, int attempt) {
    return fmt::format(R"({{"event":"cancelled","task":"{}","holder":"{}","attempt":{}}})",
                       id.view(), holder, attempt);
  };
  control(said("w1", l.attempt));
  control(said("w2", l.attempt));
  control(said("w1", l.attempt + 1));
  control("not json");
  control(R"({"event":"cancelled","task":"../x","holder":"w1","attempt":1})");
  // Then a real cancel of another task held through this job queue by w2, said the same way
  // (published by hand: the cancel below goes through this job queue, which tells w2 itself).
  auto id2 = env.submit();
  auto o2 = env.one_offer();
  must(env.q->claim(o2, env.w2));
  auto other = env.open_queue();
  must(other->cancel(id2, viewer{.who = env.alice}));
  REQUIRE(eventually([&] { return env.cancelled().size() == 1; }));
  CHECK(env.cancelled() == std::vector<std::pair<std::string, std::string>>{{"w2", id2.str()}});
  CHECK(env.q->holds(id, env.w1));
  CHECK(env.record(id).state == task_state::running);
  CHECK(must(env.q->complete(id, env.w1, "1")).task.state == task_state::completed);
}

TEST_CASE("an offer handed to another job queue is claimed and completed there, once",
          "[jobs][several]") {
  jobs_env env;
  auto other = env.open_queue();  // another gateway's
  auto id = env.submit();
  auto o = env.one_offer();
  auto text = env.q->offer_text(o);
  auto handed = must(other->offer_from_text(text));
  CHECK(handed.task == o.task);
  CHECK(handed.attempt == o.attempt);
  CHECK(handed.lapses_at == o.lapses_at);
  CHECK(handed.env.id == o.env.id);
  CHECK(handed.msg.ack_token == o.msg.ack_token);
  auto l = must(other->claim(handed, env.w2));
  CHECK(l.attempt == 1);
  CHECK(other->holds(id, env.w2));
  CHECK(code_of(env.q->claim(o, env.w1)) == errc::conflict);  // one claim of a task wins
  CHECK(must(other->complete(id, env.w2, "7", l.attempt)).task.state == task_state::completed);
  auto rec = env.record(id);
  CHECK(rec.state == task_state::completed);
  CHECK(rec.owner == "w2");
  // An offer lapses at the latest a lease from now, whatever the text says.
  auto id2 = env.submit();
  auto o2 = env.one_offer();
  o2.lapses_at += std::chrono::hours(5);
  auto lapses = must(other->offer_from_text(env.q->offer_text(o2))).lapses_at;
  CHECK(lapses <= env.t->clock()->now() + o2.lease);
  CHECK(lapses < o2.lapses_at);
  (void)id2;
}

TEST_CASE("an offer text that is not one is refused and changes nothing", "[jobs][several]") {
  jobs_env env;
  auto id = env.submit();
  auto o = env.one_offer();
  auto good = env.q->offer_text(o);
  auto refused = [&](std::string text) {
    auto r = env.q->offer_from_text(text);
    return !r && r.error().code() == errc::bad_request;
  };
  CHECK(refused(""));
  CHECK(refused("not json"));
  CHECK(refused("[]"));
  CHECK(refused("{}"));
  auto with = [&](std::string_view from, std::string_view to) {
    auto t = good;
    auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    t.replace(at, from.size(), to);
    return t;
  };
  CHECK(refused(with(R"("attempt":1)", R"("attempt":2)")));    // not the next attempt
  CHECK(refused(with(R"("attempt":1)", R"("attempt":"1")")));  // of the wrong type
  CHECK(refused(with(R"(\"state\":\"queued\")", R"(\"state\":\"running\")")));
  CHECK(refused(with(R"(\"ns\":\")", R"(\"ns\":\"x)")));    // another namespace
  CHECK(refused(with(R"("ack":")", R"("ack":"","x":")")));  // no ack token
  CHECK(refused(with(R"("lapses_at":")", R"("lapses_at":"x)")));
  CHECK(refused(with(R"(\"to\":\"resize\")", R"(\"to\":\"other\")")));  // another job's envelope
  auto other_ns_cfg = env.cfg;
  other_ns_cfg.ns = namespace_name::make("elsewhere").value();
  auto elsewhere = must(job_queue::open(env.t, other_ns_cfg, {}, {}));
  CHECK(code_of(elsewhere->offer_from_text(good)) == errc::bad_request);
  // The offer itself is untouched: claimed as usual.
  CHECK(must(env.q->claim(o, env.w1)).attempt == 1);
  CHECK(env.record(id).state == task_state::running);
}

result<submit_result> submit_sealed(job_queue& q, sealed_envelope env,
                                    job_submit_options options = {}) {
  std::promise<result<submit_result>> answer;
  q.async_submit(std::move(env), std::move(options),
                 [&](result<submit_result> r) { answer.set_value(std::move(r)); });
  return answer.get_future().get();
}

TEST_CASE("a sealed job message is stored as it was sealed, under its id as the task", "[jobs]") {
  jobs_env env;
  auto now = env.fx().transport().clock()->now();
  auto id = env.q->store()->new_id();
  auto sealed = must(sealed_envelope::seal({.from = "alice",
                                            .to = "resize",
                                            .body = R"({ "w" : 640 })",
                                            .type = "img.resize",
                                            .headers = {{"k", "v"}},
                                            .msg_id = id.str()},
                                           env.cfg.ns.view(), now));
  const envelope expected = sealed.get();
  auto submitted = must(submit_sealed(*env.q, std::move(sealed), {.max_attempts = 2}));
  CHECK(submitted.task == id);
  CHECK(submitted.created);
  auto rec = env.record(id);
  CHECK(rec.state == task_state::queued);
  CHECK(rec.job == "resize");
  CHECK(rec.submitted_by == "alice");
  CHECK(rec.max_attempts == 2);
  CHECK(rec.created_at == expected.ts);
  auto offered = env.one_offer();
  CHECK(offered.task.task == id.str());
  CHECK(offered.env == expected);
  must(env.q->claim(offered, env.w1));
  CHECK(env.record(id).owner == "w1");
}

TEST_CASE(
    "a sealed job message for another namespace, from the broker, with another id or "
    "emptied stores nothing",
    "[jobs]") {
  jobs_env env;
  auto now = env.fx().transport().clock()->now();
  auto seal = [&](std::string from, std::string msg_id, std::string_view ns) {
    return must(sealed_envelope::seal(
        {.from = std::move(from), .to = "resize", .body = "1", .msg_id = std::move(msg_id)}, ns,
        now));
  };
  auto r = submit_sealed(*env.q, seal("alice", env.q->store()->new_id().str(), "elsewhere"));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::bad_request);
  CHECK(r.error().message().find("elsewhere") != std::string::npos);
  r = submit_sealed(*env.q, seal("$broker", env.q->store()->new_id().str(), env.cfg.ns.view()));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_name);
  CHECK(r.error().message().rfind("from: ", 0) == 0);
  r = submit_sealed(*env.q, seal("alice", "m-1", env.cfg.ns.view()));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::bad_request);
  CHECK(r.error().message().find("task id") != std::string::npos);
  auto taken = seal("alice", env.q->store()->new_id().str(), env.cfg.ns.view());
  CHECK_FALSE(std::string(std::move(taken).json()).empty());
  r = submit_sealed(*env.q, std::move(taken));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::bad_request);
  r = submit_sealed(*env.q, seal("alice", env.q->store()->new_id().str(), env.cfg.ns.view()),
                    {.max_attempts = 0});
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::bad_request);
  CHECK(r.error().message().find("max_attempts") != std::string::npos);
  CHECK(env.stored_messages() == 0);
  CHECK(env.offers_now().empty());
}

TEST_CASE("the same idempotency key returns the same task", "[jobs]") {
  jobs_env env;
  auto a = must(env.q->submit(
      {.job = env.job, .from = env.alice, .body = "1", .idempotency_key = "order-42"}));
  CHECK(a.created);
  for (int i = 0; i < 3; ++i) {
    auto b = must(env.q->submit(
        {.job = env.job, .from = env.alice, .body = "1", .idempotency_key = "order-42"}));
    CHECK(b.task == a.task);
    CHECK_FALSE(b.created);
  }
  auto other = must(
      env.q->submit({.job = env.job, .from = env.w1, .body = "1", .idempotency_key = "order-42"}));
  CHECK(other.task != a.task);
  CHECK(other.created);
  CHECK(env.stored_messages() == 2);
  CHECK(code_of(env.q->submit({.job = env.job,
                               .from = env.alice,
                               .body = "1",
                               .idempotency_key = std::string(257, 'k')})) == errc::bad_request);
}

TEST_CASE("task ids are unique and sort by creation", "[jobs]") {
  jobs_env env;
  std::vector<std::string> ids;
  for (int i = 0; i < 50; ++i) {
    ids.push_back(env.q->store()->new_id().str());
    if (i % 10 == 0) env.advance(std::chrono::milliseconds(2));
  }
  CHECK(std::is_sorted(ids.begin(), ids.end()));
  CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end());
}

TEST_CASE("bad submissions change nothing", "[jobs]") {
  jobs_env env;
  auto submit = [&](submit_request r) { return code_of(env.q->submit(std::move(r))); };
  CHECK(submit({.job = env.job, .from = env.alice, .body = "1", .max_attempts = 0}) ==
        errc::bad_request);
  CHECK(submit({.job = env.job, .from = env.alice, .body = "1", .max_attempts = 101}) ==
        errc::bad_request);
  CHECK(submit({.job = env.job, .from = env.alice, .body = "{"}) == errc::bad_request);
  CHECK(submit({.job = env.job, .from = env.alice, .body = R"(1,"from":"x")"}) ==
        errc::bad_request);
  CHECK(submit({.job = env.job, .from = env.alice, .body = "1", .type = "bad type"}) ==
        errc::invalid_envelope);
  CHECK(eventually([&] { return env.stored_messages() == 0; }));
  CHECK(env.offers().empty());
}

TEST_CASE("a submission cut short after the publish is adopted, not lost", "[jobs]") {
  jobs_env env;
  env.t->set_fault([](std::string_view op, std::string_view key) -> std::optional<error> {
    if (op == "kv_create" && key.find(".t_") != std::string_view::npos) {
      return error(errc::unavailable, "injected: crash before the record");
    }
    return std::nullopt;
  });
  // The message is stored, so the task exists: its id is the answer, not an error that
  // would invite a second submission.
  auto r = must(env.q->submit({.job = env.job, .from = env.alice, .body = R"({"a":1})"}));
  env.t->set_fault({});
  CHECK(code_of(env.q->get(r.task, viewer{.who = env.alice})) == errc::not_found);

  auto o = env.one_offer();  // the message is there: its record is made from it
  CHECK(o.task.state == task_state::queued);
  CHECK(o.task.submitted_by == "alice");
  CHECK(o.task.max_attempts == 3);
  CHECK(o.env.body == R"({"a":1})");
  auto id = must(task_id::make(o.task.task));
  CHECK(id == r.task);
  must(env.q->claim(o, env.w1));
  must(env.q->complete(id, env.w1, "1"));
  CHECK(env.record(id).state == task_state::completed);
}

TEST_CASE("a keyed submission cut short is finished by its retry, once", "[jobs]") {
  jobs_env env;
  for (std::string step : {"publish", "kv_create"}) {
    DYNAMIC_SECTION("cut after the idempotency key, at " << step) {
      env.t->set_fault([step](std::string_view op, std::string_view key) -> std::optional<error> {
        bool task_key = key.find(".t_") != std::string_view::npos;
        if (op == step && (op == "publish" || task_key)) {
          return error(errc::unavailable, "injected");
        }
        return std::nullopt;
      });
      submit_request req{
          .job = env.job, .from = env.alice, .body = "7", .idempotency_key = "k-" + step};
      auto first = env.q->submit(req);
      // Cut before the publish: nothing stored, `unavailable`. After it: the task exists.
      CHECK(code_of(first) == (step == "publish" ? errc::unavailable : errc{}));
      env.t->set_fault({});
      auto retry = must(env.q->submit(req));
      if (first) CHECK(retry.task == first->task);
      CHECK_FALSE(retry.created);
      auto again = must(env.q->submit(req));
      CHECK(again.task == retry.task);
      CHECK(env.record(retry.task).state == task_state::queued);
      auto offers = env.offers(5);
      REQUIRE(offers.size() == 1);
      CHECK(offers[0].task.task == retry.task.str());
    }
  }
}

TEST_CASE("a keyed retry past the duplicate window: the second message is dropped, not offered",
          "[jobs]") {
  jobs_env env(3, [](bool real_time, broker_config& c) {
    if (real_time) c.duplicate_window = std::chrono::seconds(1);
  });
  env.t->set_fault([](std::string_view op, std::string_view key) -> std::optional<error> {
    if (op == "kv_create" && key.find(".t_") != std::string_view::npos) {
      return error(errc::unavailable, "injected: crash before the record");
    }
    return std::nullopt;
  });
  submit_request req{.job = env.job, .from = env.alice, .body = "5", .idempotency_key = "late"};
  auto first = must(env.q->submit(req));
  env.t->set_fault({});
  env.advance(env.cfg.duplicate_window + std::chrono::milliseconds(500));
  // The record is missing, so the retry cannot know the message is stored: it publishes
  // again, and the stream no longer knows the message id.
  auto retry = must(env.q->submit(req));
  CHECK(retry.task == first.task);
  CHECK_FALSE(retry.created);
  CHECK(env.stored_messages() == 2);

  auto offers = env.offers(5);
  REQUIRE(offers.size() == 1);
  must(env.q->claim(offers[0], env.w1));
  must(env.q->complete(first.task, env.w1, "1"));
  CHECK(env.offers(5).empty());
  REQUIRE(eventually([&] { return env.stored_messages() == 0; }));
  std::vector<std::string> told;
  for (const auto& n : env.notices()) told.push_back(n.msg_id);
  CHECK(told == std::vector<std::string>{first.task.str() + ".completed"});
  CHECK(env.record(first.task).attempt == 1);
}

TEST_CASE("a queued task cancelled: its submitter is told once, also when the message comes late",
          "[jobs]") {
  jobs_env env(3, [](bool real_time, broker_config& c) {
    if (real_time) c.duplicate_window = std::chrono::seconds(1);
  });
  auto told = env.submit("1");
  auto untold = env.submit("2");
  must(env.q->cancel(told, viewer{.who = env.alice}));
  env.fail_notices = true;  // this notice cannot be sent now: the delivery sends it
  must(env.q->cancel(untold, viewer{.who = env.alice}));
  env.fail_notices = false;
  auto ends = [&](const task_id& id) {
    auto all = env.notices();
    return std::count_if(all.begin(), all.end(),
                         [&](const task_notice& n) { return n.msg_id == id.str() + ".cancelled"; });
  };
  CHECK(ends(told) == 1);
  CHECK(ends(untold) == 0);
  REQUIRE(eventually([&] { return env.record(told).notified; }));
  CHECK_FALSE(env.record(untold).notified);
  // Past the duplicate window that would hide a repeat, the messages are delivered.
  env.advance(env.cfg.duplicate_window + std::chrono::seconds(1));
  CHECK(env.offers(2).empty());
  REQUIRE(eventually([&] { return env.stored_messages() == 0; }));
  CHECK(ends(told) == 1);
  CHECK(ends(untold) == 1);
  // The revision that records the notice stands in for the cancel in the history.
  auto history = must(env.q->history(told, viewer{.who = env.alice}));
  REQUIRE(history.size() == 2);
  CHECK(history[0].state == task_state::queued);
  CHECK(history[1].state == task_state::cancelled);
  CHECK(history[1].revision == env.record(told).revision);
}

TEST_CASE("an outcome committed but not acknowledged is acked on redelivery, not redone",
          "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  env.t->set_fault([](std::string_view op, std::string_view) -> std::optional<error> {
    if (op == "ack") return error(errc::unavailable, "injected: crash before the ack");
    return std::nullopt;
  });
  must(env.q->complete(id, env.w1, "1"));
  env.t->set_fault({});
  CHECK(env.stored_messages() == 1);
  env.advance(env.lease() + std::chrono::milliseconds(100));
  CHECK(env.offers().empty());  // redelivered, recognised, acknowledged
  CHECK(eventually([&] { return env.stored_messages() == 0; }));
  CHECK(env.record(id).state == task_state::completed);
  CHECK(env.notices().size() == 2);  // the notice again, under the same msg_id
  CHECK(env.notices()[0].msg_id == env.notices()[1].msg_id);
}

TEST_CASE("a notice that cannot be sent keeps the message until it is", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  env.fail_notices = true;
  must(env.q->complete(id, env.w1, "1"));
  CHECK(env.stored_messages() == 1);
  env.fail_notices = false;
  env.advance(env.lease() + std::chrono::milliseconds(100));
  CHECK(env.offers().empty());
  CHECK(eventually([&] { return env.stored_messages() == 0; }));
  CHECK(env.notices().size() == 1);
}

TEST_CASE("a failed notice on an exhausted lease is sent again, not lost", "[jobs]") {
  jobs_env env(1);
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  env.q->close();  // the gateway that granted the lease is gone
  env.q = env.open_queue();
  env.fail_notices = true;
  env.advance(env.lease() + std::chrono::milliseconds(100));
  CHECK(env.offers_now().empty());
  CHECK(env.record(id).state == task_state::failed);
  CHECK(env.stored_messages() == 1);  // kept for the notice
  env.fail_notices = false;
  env.advance(env.lease() + std::chrono::milliseconds(100));
  CHECK(env.offers().empty());
  CHECK(eventually([&] { return env.stored_messages() == 0; }));
  REQUIRE(env.notices().size() == 1);
  CHECK(env.notices()[0].type == "amp.task.failed");
}

TEST_CASE("a lease timer that loses its race leaves the new holder's lease alone", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  auto o = env.one_offer();
  must(env.q->claim(o, env.w1));
  std::atomic<bool> armed{true};
  std::atomic<bool> claimed{false};
  // While w1's lease timer is about to write, another gateway expires the lease and w2
  // claims the task through this same job queue.
  env.t->set_fault([&](std::string_view op, std::string_view key) -> std::optional<error> {
    if (op != "kv_update" || key.find(id.view()) == std::string_view::npos) return std::nullopt;
    if (!armed.exchange(false)) return std::nullopt;
    auto r = must(env.q->store()->get(env.cfg.ns, id));
    r.state = task_state::queued;
    r.owner.clear();
    r.lease_expires_at = {};
    r = must(env.q->store()->update(r));
    offer again = o;
    again.task = r;
    again.attempt = r.attempt + 1;
    again.lapses_at = env.t->clock()->now() + env.lease();
    claimed = env.q->claim(again, env.w2).has_value();
    return std::nullopt;
  });
  env.advance(env.lease() + std::chrono::milliseconds(100));
  REQUIRE(eventually([&] { return !armed && !env.lost().empty(); }));
  env.t->set_fault({});
  CHECK(claimed);
  CHECK(env.lost() == std::vector<std::pair<std::string, std::string>>{{"w1", id.str()}});
  CHECK(env.q->leases_of(env.w2) == std::vector<task_id>{id});
  auto all = env.q->heartbeat_all(env.w2);
  REQUIRE(all.size() == 1);
  CHECK(all[0].extended.has_value());
  must(env.q->complete(id, env.w2, "2"));
}

TEST_CASE("the fence: an attempt that is not the current one gets lease_lost", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  env.advance(env.lease() + std::chrono::milliseconds(100));
  REQUIRE(eventually([&] { return !env.lost().empty(); }));
  // The same participant claims attempt 2 through another process (job queue).
  auto other = env.open_queue();
  auto again = must(other->fetch(env.job, 1, env.fx().real_time() ? env.lease() * 2 : duration{}));
  REQUIRE(again.size() == 1);
  auto l = must(other->claim(again.front(), env.w1));
  REQUIRE(l.attempt == 2);

  CHECK(code_of(env.q->complete(id, env.w1, "1", 1)) == errc::lease_lost);
  CHECK(code_of(env.q->fail(id, env.w1, {"x", "y"}, true, {}, 1)) == errc::lease_lost);
  CHECK(code_of(env.q->heartbeat(id, env.w1, 1)) == errc::lease_lost);
  CHECK(code_of(env.q->complete(id, env.w1, "3", 3)) == errc::lease_lost);
  auto rec = env.record(id);
  CHECK(rec.state == task_state::running);
  CHECK(rec.attempt == 2);
  CHECK(env.stored_messages() == 1);

  must(env.q->heartbeat(id, env.w1, 2));  // adopts attempt 2 here
  auto done = must(env.q->complete(id, env.w1, R"("two")", 2));
  CHECK_FALSE(done.duplicate);
  CHECK(must(env.q->complete(id, env.w1, R"("two")", 2)).duplicate);
  CHECK(must(env.q->complete(id, env.w1, R"("two")")).duplicate);
  CHECK(code_of(env.q->complete(id, env.w1, "1", 1)) == errc::lease_lost);
  CHECK(env.record(id).result == R"("two")");
}

TEST_CASE("a complete without an answer is not lease_lost while its write may still land",
          "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  // The stream's leader dies with the complete's write in flight: no answer.
  env.t->hold_updates([&](std::string_view key) { return key.find(id.view()) != key.npos; });
  CHECK(code_of(env.q->complete(id, env.w1, "42", 1)) == errc::unavailable);
  env.advance(env.lease() + std::chrono::milliseconds(100));
  // The lease has lapsed, but the write may still land: the retry cannot say lease_lost.
  auto retry = env.q->complete(id, env.w1, "42", 1);
  CHECK(code_of(retry) == errc::unavailable);
  CHECK(env.record(id).state == task_state::running);
  REQUIRE(env.t->land_held() >= 1);  // the next leader applies it
  CHECK(env.record(id).state == task_state::completed);
  auto again = must(env.q->complete(id, env.w1, "42", 1));
  CHECK(again.duplicate);
  CHECK(again.task.result == "42");
  env.advance(std::chrono::seconds(2));  // the lease timer finds it ended by its holder
  REQUIRE(eventually([&] { return env.q->leases_of(env.w1).empty(); }));
  CHECK(env.lost().empty());
  CHECK(env.offers_now(2).empty());  // the redelivered message tells the submitter, once
  std::vector<std::string> told;
  for (const auto& n : env.notices()) told.push_back(n.msg_id);
  CHECK(told == std::vector<std::string>{id.str() + ".completed"});
}

TEST_CASE("a lease timer does not take over a newer attempt of the same holder", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  // Elsewhere the lease ran out and w1 claimed attempt 2, with a lease of its own.
  auto r = must(env.q->store()->get(env.cfg.ns, id));
  r.attempt = 2;
  r.lease_expires_at = env.t->clock()->now() + env.lease() * 3;
  must(env.q->store()->update(r));
  env.advance(env.lease() + std::chrono::milliseconds(100));
  REQUIRE(eventually([&] { return !env.lost().empty(); }));
  CHECK(env.lost() == std::vector<std::pair<std::string, std::string>>{{"w1", id.str()}});
  CHECK(env.q->leases_of(env.w1).empty());
  auto rec = env.record(id);
  CHECK(rec.state == task_state::running);  // attempt 2 is left alone
  CHECK(rec.attempt == 2);
}

TEST_CASE("a lease_lost answer forgets the lease when the task moved on, not for the fence",
          "[jobs]") {
  jobs_env env;
  auto other = env.open_queue();  // another gateway
  // The fence (another attempt than the live one) says nothing about the live lease.
  auto fenced = env.submit("1");
  auto l = must(env.q->claim(env.one_offer(), env.w1));
  CHECK(code_of(env.q->complete(fenced, env.w1, "1", l.attempt + 1)) == errc::lease_lost);
  CHECK(code_of(env.q->heartbeat(fenced, env.w1, l.attempt + 1)) == errc::lease_lost);
  CHECK(env.q->leases_of(env.w1) == std::vector<task_id>{fenced});
  must(env.q->complete(fenced, env.w1, "1"));
  CHECK(env.q->leases_of(env.w1).empty());
  // Cancelled elsewhere, and the other gateway's word of it lost: complete, fail and
  // heartbeat each answer lease_lost and the lease is no longer w1's load here.
  env.t->set_fault([](std::string_view op, std::string_view) -> std::optional<error> {
    if (op == "publish_core") return error(errc::unavailable, "NATS away");
    return std::nullopt;
  });
  auto cancel_under_w1 = [&](const std::string& body) {
    auto id = env.submit(body);
    must(env.q->claim(env.one_offer(), env.w1));
    must(other->cancel(id, viewer{.who = env.alice}));
    CHECK(env.q->leases_of(env.w1) == std::vector<task_id>{id});
    return id;
  };
  auto a = cancel_under_w1("2");
  CHECK(code_of(env.q->complete(a, env.w1, "1")) == errc::lease_lost);
  CHECK(env.q->leases_of(env.w1).empty());
  auto b = cancel_under_w1("3");
  CHECK(code_of(env.q->fail(b, env.w1, {"x", "y"}, false, {})) == errc::lease_lost);
  CHECK(env.q->leases_of(env.w1).empty());
  auto c = cancel_under_w1("4");
  CHECK(code_of(env.q->heartbeat(c, env.w1)) == errc::lease_lost);
  CHECK(env.q->leases_of(env.w1).empty());
}

TEST_CASE("a lease timer that cannot read the task looks again until it can", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  std::atomic<int> refused{0};
  env.t->set_fault([&](std::string_view op, std::string_view key) -> std::optional<error> {
    if (op != "kv_get" || key.find(id.view()) == std::string_view::npos) return std::nullopt;
    ++refused;
    return error(errc::unavailable, "backend away");
  });
  env.advance(env.lease() + std::chrono::milliseconds(100));
  REQUIRE(eventually([&] { return refused > 0; }));
  CHECK(env.lost().empty());
  CHECK(env.q->leases_of(env.w1) == std::vector<task_id>{id});  // still its holder's load
  env.t->set_fault({});
  env.advance(std::chrono::seconds(2));
  REQUIRE(eventually([&] { return !env.lost().empty(); }));
  CHECK(env.lost() == std::vector<std::pair<std::string, std::string>>{{"w1", id.str()}});
  CHECK(env.q->leases_of(env.w1).empty());
  CHECK(env.record(id).state == task_state::queued);
}

TEST_CASE("submit makes no consumer: the job's first fetch does, and finds the task", "[jobs]") {
  jobs_env env;
  auto stream = subjects::tasks_stream(env.cfg.ns);
  auto consumer = subjects::job_consumer(env.job);
  auto id = env.submit();
  CHECK(code_of(env.t->consumer_info_of(stream, consumer)) == errc::not_found);
  CHECK(env.stored_messages() == 1);
  auto o = env.one_offer();
  CHECK(o.task.task == id.str());
  CHECK(env.t->consumer_info_of(stream, consumer).has_value());
}

TEST_CASE("tasks are visible to their submitter, holders and admins only", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  CHECK(code_of(env.q->get(id, viewer{.who = env.alice})) == errc{});
  CHECK(code_of(env.q->get(id, viewer{.who = env.w1})) == errc{});
  CHECK(code_of(env.q->get(id, viewer{.who = env.w2})) == errc::not_found);
  CHECK(code_of(env.q->get(id, viewer{.who = env.w2, .admin = true})) == errc{});
  CHECK(code_of(env.q->history(id, viewer{.who = env.w2})) == errc::not_found);
  auto missing = must(task_id::make("t_nothere"));
  CHECK(code_of(env.q->get(missing, viewer{.who = env.alice, .admin = true})) == errc::not_found);
}

TEST_CASE("an ended task's record, history and binding go once its retention has passed",
          "[jobs][retention]") {
  jobs_env env(3, [](bool real_time, broker_config& c) {
    c.task_retention = real_time ? std::chrono::seconds(2) : std::chrono::hours(24);
  });
  const auto keep = env.cfg.task_retention;
  auto id = env.submit(R"({"n":1})", "order-42");
  auto waiting = env.submit(R"({"n":2})", "order-43");  // never claimed: never ends
  auto offers = env.offers(2);
  REQUIRE(offers.size() == 2);
  const auto& o = offers[0].task.task == id.str() ? offers[0] : offers[1];
  must(env.q->claim(o, env.w1));
  must(env.q->complete(id, env.w1, R"({"ok":true})"));
  CHECK(eventually([&] { return env.stored_messages() == 1; }));  // the other task's

  // Kept for the retention after the end.
  env.advance(keep / 2);
  CHECK(env.record(id).state == task_state::completed);
  CHECK_FALSE(
      must(env.q->submit(
               {.job = env.job, .from = env.alice, .body = "{}", .idempotency_key = "order-42"}))
          .created);
  // Then removed: the record and its history, and the key is free for a new task.
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    env.advance(keep / 5);
    gone = code_of(env.q->get(id, viewer{.who = env.alice, .admin = true})) == errc::not_found;
  }
  CHECK(gone);
  CHECK(code_of(env.q->history(id, viewer{.who = env.alice, .admin = true})) == errc::not_found);
  CHECK(code_of(env.t->kv_history(subjects::task_state_bucket(),
                                  subjects::task_key(env.cfg.ns, id))) == errc::not_found);
  auto again = must(env.q->submit(
      {.job = env.job, .from = env.alice, .body = "{}", .idempotency_key = "order-42"}));
  CHECK(again.created);
  CHECK(again.task != id);
  // A task that has not ended is kept, however long it waits.
  CHECK(env.record(waiting).state == task_state::queued);
  CHECK_FALSE(
      must(env.q->submit(
               {.job = env.job, .from = env.alice, .body = "{}", .idempotency_key = "order-43"}))
          .created);
  // Every end was taken: the stream of ends is empty.
  CHECK(must(env.t->stream_info_of(subjects::ended_stream(env.cfg.ns))).state.messages == 0);
}

TEST_CASE(
    "ends held back until they fall due are removed then, also when more of them wait than "
    "the sweeper holds at once and the backend brings them back late",
    "[jobs][retention]") {
  jobs_env env(3, [](bool real_time, broker_config& c) {
    c.task_retention = real_time ? std::chrono::seconds(2) : std::chrono::hours(24);
  });
  const bool real_time = env.fx().real_time();
  const auto keep = env.cfg.task_retention;
  // A handed-back end comes back a little after the time the sweeper asked for.
  env.t->late_naks(real_time ? std::chrono::milliseconds(300) : std::chrono::seconds(1));
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  must(env.q->complete(id, env.w1, "1"));
  // Ends of 1,100 more tasks (gone already), all due with the first: more than the 1,024
  // the sweeper may hold back, so that it finds nothing to take while it waits for them.
  const auto ends = subjects::ended_stream(env.cfg.ns);
  for (int i = 0; i < 1100; ++i) {
    must(env.t->publish(
        {.subject = subjects::ended_subject(env.cfg.ns), .data = "t_gone" + std::to_string(i)}));
  }
  // Gone soon after the retention, not an idle period (10 minutes) later.
  const auto step = real_time ? std::chrono::milliseconds(500) : std::chrono::seconds(5);
  env.advance(keep);
  bool gone = false;
  for (int i = 0; i < 40 && !gone; ++i) {
    env.advance(step);
    gone = code_of(env.q->get(id, viewer{.who = env.alice, .admin = true})) == errc::not_found &&
           must(env.t->stream_info_of(ends)).state.messages == 0;
  }
  INFO("ends left: " << must(env.t->stream_info_of(ends)).state.messages);
  CHECK(gone);
}

TEST_CASE("an ended task whose removal fails is kept and removed once the backend answers again",
          "[jobs][retention]") {
  jobs_env env(3, [](bool real_time, broker_config& c) {
    c.task_retention = real_time ? std::chrono::seconds(2) : std::chrono::hours(24);
  });
  const auto keep = env.cfg.task_retention;
  std::atomic<int> refused{0};
  env.t->set_fault([&](std::string_view op, std::string_view) -> std::optional<error> {
    if (op != "kv_erase") return std::nullopt;
    ++refused;
    return error(errc::unavailable, "backend away");
  });
  auto id = env.submit(R"({"n":1})", "order-7");
  must(env.q->claim(env.one_offer(), env.w1));
  must(env.q->complete(id, env.w1, "1"));
  const auto step = env.fx().real_time() ? std::chrono::milliseconds(500) : std::chrono::seconds(5);
  env.advance(keep);
  for (int i = 0; i < 6; ++i) env.advance(step);
  REQUIRE(eventually([&] { return refused.load() > 0; }));
  // Nothing removed while the backend refuses: the record and the key's binding stay.
  CHECK(env.record(id).state == task_state::completed);
  CHECK_FALSE(
      must(env.q->submit(
               {.job = env.job, .from = env.alice, .body = "{}", .idempotency_key = "order-7"}))
          .created);
  env.t->set_fault({});
  bool gone = false;
  for (int i = 0; i < 40 && !gone; ++i) {
    env.advance(step);
    gone = code_of(env.q->get(id, viewer{.who = env.alice, .admin = true})) == errc::not_found;
  }
  CHECK(gone);
  CHECK(must(env.q->submit(
                 {.job = env.job, .from = env.alice, .body = "{}", .idempotency_key = "order-7"}))
            .created);
}

TEST_CASE("a deleted stream of ends is made again: tasks still end and are still removed",
          "[jobs][retention]") {
  jobs_env env(3, [](bool real_time, broker_config& c) {
    c.task_retention = real_time ? std::chrono::seconds(2) : std::chrono::hours(24);
  });
  const auto ends = subjects::ended_stream(env.cfg.ns);
  must(env.t->delete_stream(ends));
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  must(env.q->complete(id, env.w1, "1"));
  CHECK(env.record(id).state == task_state::completed);
  // The end, refused with the stream gone, is sent again once the stream is made again.
  REQUIRE(eventually([&] {
    auto info = env.t->stream_info_of(ends);
    return info && info->state.messages == 1;
  }));
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    env.advance(env.cfg.task_retention / 5);
    gone = code_of(env.q->get(id, viewer{.who = env.alice, .admin = true})) == errc::not_found;
  }
  CHECK(gone);
}

TEST_CASE("an end the backend refuses is sent again: the task ends at once and is still removed",
          "[jobs][retention]") {
  jobs_env env(3, [](bool real_time, broker_config& c) {
    c.task_retention = real_time ? std::chrono::seconds(2) : std::chrono::hours(24);
  });
  const auto ends = subjects::ended_stream(env.cfg.ns);
  const auto ended = subjects::ended_subject(env.cfg.ns);
  std::atomic<int> refused{0};
  env.t->set_fault([&](std::string_view op, std::string_view subject) -> std::optional<error> {
    if (op != "publish" || subject != ended) return std::nullopt;
    ++refused;
    return error(errc::unavailable, "backend away");
  });
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  // The write that ends the task does not wait for its end.
  must(env.q->complete(id, env.w1, "1"));
  CHECK(env.record(id).state == task_state::completed);
  // Sent again after a pause (500 ms, then doubling), until stored.
  for (int i = 0; i < 30 && refused.load() < 3; ++i) {
    env.advance(std::chrono::seconds(1));
    (void)eventually([&] { return refused.load() >= 3; }, std::chrono::milliseconds(50));
  }
  REQUIRE(refused.load() >= 3);
  CHECK(must(env.t->stream_info_of(ends)).state.messages == 0);
  env.t->set_fault({});
  bool stored = false;
  for (int i = 0; i < 60 && !stored; ++i) {
    env.advance(std::chrono::seconds(1));
    stored = eventually([&] { return must(env.t->stream_info_of(ends)).state.messages == 1; },
                        std::chrono::milliseconds(50));
  }
  REQUIRE(stored);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    env.advance(env.cfg.task_retention / 5);
    gone = code_of(env.q->get(id, viewer{.who = env.alice, .admin = true})) == errc::not_found;
  }
  CHECK(gone);
}

TEST_CASE("a task store with no retention keeps ended tasks and makes no stream of ends",
          "[jobs][retention]") {
  jobs_env env(3, [](bool, broker_config& c) { c.task_retention = duration::zero(); });
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  must(env.q->complete(id, env.w1, "1"));
  env.advance(env.fx().real_time() ? std::chrono::seconds(2) : std::chrono::hours(48));
  CHECK(env.record(id).state == task_state::completed);
  CHECK(code_of(env.t->stream_info_of(subjects::ended_stream(env.cfg.ns))) == errc::not_found);
}

TEST_CASE("releasing a lease (bye) returns the task at once", "[jobs]") {
  jobs_env env;
  auto id = env.submit();
  must(env.q->claim(env.one_offer(), env.w1));
  auto r = must(env.q->release_lease(id, env.w1));
  CHECK(r.state == task_state::queued);
  CHECK(env.q->leases_of(env.w1).empty());
  auto o = env.one_offer();
  CHECK(o.attempt == 2);
  CHECK(env.lost().empty());
}

TEST_CASE("each job has its own lease and max_attempts", "[jobs]") {
  jobs_env env;
  auto thumbs = jname("thumbs");
  job_config custom = env.cfg.default_job;
  custom.lease = env.lease() * 2;
  custom.max_attempts = 1;
  env.cfg.jobs["thumbs"] = custom;
  env.q = env.open_queue();
  CHECK(env.q->config_of(thumbs) == custom);
  CHECK(env.q->config_of(env.job) == env.cfg.default_job);

  auto id = must(env.q->submit({.job = thumbs, .from = env.alice, .body = "1"})).task;
  CHECK(env.record(id).max_attempts == 1);
  auto wait = env.fx().real_time() ? std::chrono::milliseconds(1500) : duration::zero();
  auto offers = must(env.q->fetch(thumbs, 1, wait));
  REQUIRE(offers.size() == 1);
  CHECK(offers[0].lease == custom.lease);
  auto l = must(env.q->claim(offers[0], env.w1));
  CHECK(l.expires_at - env.t->clock()->now() > env.lease());
  env.advance(env.lease() + std::chrono::milliseconds(100));  // the default lease: still held
  CHECK(env.record(id).state == task_state::running);
  env.advance(env.lease());
  REQUIRE(eventually([&] { return env.record(id).state == task_state::failed; }));
  CHECK(env.record(id).error->code == "attempts_exhausted");  // one attempt only
}

}  // namespace
}  // namespace amp::broker_testing
