// A randomized run of the job queue with an invariant checker. Workers on several threads
// complete, fail (with and without retry), decline, ignore, release, or crash (stop
// heartbeating) at random, and try to claim what others hold. Afterwards: every task is in
// exactly one terminal state, no task was completed twice, no claim went beyond
// max_attempts, and no job message was acknowledged or termed before its outcome was
// committed to the task store (checked at the moment of every ack).
//
// The seed is printed; AMP_SEED=<n> replays a run's decisions (thread interleaving aside).

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "amp/broker/job_queue.hpp"
#include "amp/subjects.hpp"
#include "broker/cases/broker_helpers.hpp"
#include "broker/cases/faulty_transport.hpp"

namespace amp::broker_testing {
namespace {

std::uint64_t seed_of_run() {
  if (const char* s = std::getenv("AMP_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

class checker {
 public:
  // Called by the transport before every acknowledgement.
  std::optional<error> before(std::string_view op, std::string_view token) {
    if (op != "ack" && op != "term") return std::nullopt;
    std::string task;
    {
      std::lock_guard lock(mu_);
      auto it = task_of_token_.find(std::string(token));
      if (it == task_of_token_.end()) {
        ++unknown_acks_;  // the queue's own acks of redelivered, already ended tasks
        return std::nullopt;
      }
      task = it->second;
    }
    auto rec = store->get(ns, must(task_id::make(task)));
    if (!rec || !is_terminal(rec->state)) {
      std::lock_guard lock(mu_);
      violations_.push_back(std::string(op) + " of " + task + " before its outcome was committed");
    }
    return std::nullopt;
  }

  void offered(const offer& o) {
    std::lock_guard lock(mu_);
    task_of_token_[o.msg.ack_token] = o.task.task;
  }
  void claimed(const std::string& task) {
    std::lock_guard lock(mu_);
    ++claims_[task];
  }
  void completed(const std::string& task) {
    std::lock_guard lock(mu_);
    ++completions_[task];
  }
  void noticed(const task_notice& n) {
    std::lock_guard lock(mu_);
    notices_[n.msg_id.substr(0, n.msg_id.find('.'))].insert(n.type);
  }
  void violation(std::string what) {
    std::lock_guard lock(mu_);
    violations_.push_back(std::move(what));
  }
  std::size_t noticed_tasks() {
    std::lock_guard lock(mu_);
    return notices_.size();
  }

  std::shared_ptr<task_store> store;
  namespace_name ns = must(namespace_name::make("x"));

  std::mutex mu_;
  std::unordered_map<std::string, std::string> task_of_token_;
  std::map<std::string, int> claims_;
  std::map<std::string, int> completions_;
  std::map<std::string, std::set<std::string>> notices_;
  std::vector<std::string> violations_;
  std::size_t unknown_acks_ = 0;
};

enum class action { complete, fail_retry, fail_final, decline, ignore, release, crash };

action pick(std::mt19937_64& rng) {
  // complete 40%, fail with retry 15%, fail for good 5%, decline 10%, ignore 10%,
  // release 5%, crash 15%
  static constexpr std::pair<int, action> table[] = {
      {40, action::complete}, {55, action::fail_retry}, {60, action::fail_final},
      {70, action::decline},  {80, action::ignore},     {85, action::release},
      {100, action::crash}};
  int roll = static_cast<int>(rng() % 100);
  for (auto [limit, a] : table) {
    if (roll < limit) return a;
  }
  return action::complete;
}

void run_invariants(std::size_t tasks, int threads) {
  auto seed = seed_of_run();
  WARN("job invariants: " << tasks << " tasks, seed " << seed << " (replay: AMP_SEED=" << seed
                          << ")");
  auto fx = make_fixture();
  auto t = std::make_shared<faulty_transport>(fx->shared_transport());
  auto cfg = config_for(*fx);
  bool real = fx->real_time();
  cfg.default_job.lease = real ? std::chrono::seconds(1) : std::chrono::seconds(30);
  cfg.default_job.decline_delay = real ? std::chrono::milliseconds(100) : std::chrono::seconds(1);
  auto check = std::make_shared<checker>();
  check->ns = cfg.ns;
  check->store = must(task_store::open(fx->shared_transport(), cfg));
  job_events ev;
  ev.notify = [check](const task_notice& n) -> result<void> {
    check->noticed(n);
    return {};
  };
  auto q = must(job_queue::open(t, cfg, check->store, ev));
  t->set_fault(
      [check](std::string_view op, std::string_view what) { return check->before(op, what); });

  auto job = jname("work");
  std::mt19937_64 master(seed);
  std::map<std::string, int> max_attempts;
  for (std::size_t i = 0; i < tasks; ++i) {
    int attempts = 1 + static_cast<int>(master() % 4);
    auto id = must(q->submit({.job = job,
                              .from = pname("submitter"),
                              .body = std::to_string(i),
                              .max_attempts = attempts}))
                  .task;
    max_attempts[id.str()] = attempts;
  }

  std::atomic<bool> finished{false};
  // One generator per worker for the whole run: a worker made again for each step of the
  // manual clock must not start its decisions over. (Started over, a worker whose first
  // decision is to ignore or decline left the last task unclaimed for ever whenever its
  // thread always fetched first, as it tends to on a loaded machine.)
  std::vector<std::mt19937_64> rngs;
  for (int i = 0; i < threads; ++i) rngs.emplace_back(seed + 1 + static_cast<std::uint64_t>(i));
  auto worker = [&](int index, std::size_t rounds) {
    auto& rng = rngs[static_cast<std::size_t>(index)];
    auto me = pname("w" + std::to_string(index));
    auto rival = pname("r" + std::to_string(index));
    std::vector<offer> claimed_by_me;
    for (std::size_t round = 0; round < rounds && !finished; ++round) {
      auto got = q->fetch(job, 8, real ? std::chrono::milliseconds(200) : duration::zero());
      if (!got) {
        check->violation("fetch: " + got.error().to_string());
        return;
      }
      if (got->empty() && !real) return;
      for (auto& o : *got) {
        check->offered(o);
        auto id = must(task_id::make(o.task.task));
        auto a = pick(rng);
        if (a == action::decline) {
          (void)q->decline(o);
          continue;
        }
        if (a == action::ignore) continue;
        auto l = q->claim(o, me);
        if (!l) {
          if (l.error().code() != errc::conflict && l.error().code() != errc::not_found)
            check->violation("claim: " + l.error().to_string());
          continue;
        }
        check->claimed(o.task.task);
        if (l->attempt > o.task.max_attempts) {
          check->violation("claim beyond max_attempts on " + o.task.task);
        }
        // A rival with the same offer must never get it too.
        if (rng() % 4 == 0 && q->claim(o, rival)) {
          check->violation("second claim of " + o.task.task + " succeeded");
        }
        switch (a) {
          case action::complete: {
            auto r = q->complete(id, me, std::to_string(rng() % 1000));
            if (r && !r->duplicate) check->completed(o.task.task);
            if (r && rng() % 4 == 0) {
              auto again = q->complete(id, me, "0");
              if (!again || !again->duplicate) check->violation("repeat complete not duplicate");
            }
            if (!r && r.error().code() != errc::lease_lost) {
              check->violation("complete: " + r.error().to_string());
            }
            break;
          }
          case action::fail_retry:
            (void)q->fail(id, me, {"flaky", "again"}, true,
                          real ? std::chrono::milliseconds(50) : std::chrono::seconds(2));
            break;
          case action::fail_final: (void)q->fail(id, me, {"broken", "no"}, false, {}); break;
          case action::release: (void)q->release_lease(id, me); break;
          case action::crash: break;  // silence: the lease runs out
          default: break;
        }
        claimed_by_me.push_back(o);
      }
      // An old offer claimed before must never be claimed again.
      if (!claimed_by_me.empty() && rng() % 3 == 0) {
        const auto& old = claimed_by_me[rng() % claimed_by_me.size()];
        if (q->claim(old, rival)) check->violation("stale offer of " + old.task.task + " claimed");
      }
    }
  };

  auto all_noticed = [&] { return check->noticed_tasks() == tasks; };
  if (real) {
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) pool.emplace_back(worker, i, std::size_t{1} << 30);
    bool done = eventually(all_noticed, std::chrono::minutes(4));
    finished = true;
    for (auto& th : pool) th.join();
    REQUIRE(done);
  } else {
    for (int step = 0; step < 2000 && !all_noticed(); ++step) {
      std::vector<std::thread> pool;
      for (int i = 0; i < threads; ++i) pool.emplace_back(worker, i, 64);
      for (auto& th : pool) th.join();
      fx->advance(std::chrono::seconds(7));
    }
    REQUIRE(all_noticed());
  }

  // The checker's verdicts.
  std::lock_guard lock(check->mu_);
  for (const auto& v : check->violations_) FAIL_CHECK(v);
  CHECK(check->violations_.empty());
  std::map<task_state, int> states;
  for (const auto& [task, attempts] : max_attempts) {
    auto id = must(task_id::make(task));
    auto rec = must(check->store->get(cfg.ns, id));
    ++states[rec.state];
    if (!is_terminal(rec.state)) FAIL_CHECK(task << " ended " << to_string(rec.state));
    if (check->notices_[task].size() != 1) FAIL_CHECK(task << " has notices of several ends");
    if (check->notices_[task].count("amp.task." + std::string(to_string(rec.state))) != 1) {
      FAIL_CHECK(task << " notice does not match " << to_string(rec.state));
    }
    int completions = check->completions_[task];
    if (completions > 1) FAIL_CHECK(task << " completed " << completions << " times");
    if ((rec.state == task_state::completed) != (completions == 1)) {
      FAIL_CHECK(task << " is " << to_string(rec.state) << " after " << completions
                      << " completions");
    }
    if (check->claims_[task] > attempts || rec.attempt > attempts) {
      FAIL_CHECK(task << " claimed " << check->claims_[task] << " times, max " << attempts);
    }
  }
  CHECK(states[task_state::completed] > 0);
  CHECK(states[task_state::failed] > 0);
  CHECK(eventually([&] {
    return must(fx->transport().stream_info_of(subjects::tasks_stream(cfg.ns))).state.messages == 0;
  }));
  WARN("ended: " << states[task_state::completed] << " completed, " << states[task_state::failed]
                 << " failed; " << check->unknown_acks_ << " acks of redelivered ended tasks");
}

TEST_CASE("randomized workers never break the job queue's invariants", "[jobs][invariants]") {
  auto fx = make_fixture();
  bool real = fx->real_time();
  fx.reset();
  run_invariants(real ? 1000 : 10000, 4);
}

}  // namespace
}  // namespace amp::broker_testing
