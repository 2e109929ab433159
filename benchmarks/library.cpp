// amp-bench-library: the task lifecycle through the amp library in-process (issue 6, item 2):
// the same life amp-server gives a task, with the broker API called directly (no gateway, no
// WebSocket), on JetStream (a nats-server it starts, file storage) and on the memory
// transport (system clock). Set against amp-bench-tasks it tells what the gateway costs;
// against amp-bench-ceiling, what the broker's own design costs.
//
// One task's life: a producer thread calls job_queue::async_submit (at most `--window` in
// flight); the worker's fetch pump (job_queue::async_fetch, as the gateway's pump does) hands
// each offer to job_queue::async_claim, and a completer thread calls job_queue::async_complete
// with the task's body as the result (as a gateway worker does for a `complete` frame);
// complete commits the outcome, and the broker then sends the submitter's notice (inbox, from
// `$broker`) and acks the job message. A task counts when its `amp.task.completed` notice
// reaches the producer's inbox reader (inbox::attach), which acks it. Offers + leases never
// exceed S slots: the pump asks for at most S minus what is held.
//
// Latency: submits (async_submit) paced at `--rate` by 4 pacing threads (each takes the next
// due time), 8 slots; from the submit call to the notice.
//
// Every measurement gets a fresh transport and namespace (on JetStream its streams and
// buckets, the shared task bucket included, are deleted afterwards) and is checked: every
// task noticed exactly once (first delivery, attempt 1, the right body back), the worker made
// exactly N claims and N completions without error, the job stream and its consumer end
// empty with nothing pending or redelivered, the inbox stream ends empty, and every record
// reads `completed`. A failed check or a wait that times out exits with status 1.
//
//   amp-bench-library [--backend jetstream|memory|both] [--tasks N] [--runs R]
//                     [--slots 1,8,64] [--window W] [--rate R] [--latency-tasks N]
//                     [--quick] [--out FILE]

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "amp/broker/broker.hpp"
#include "amp/subjects.hpp"
#include "amp/transport/jetstream.hpp"
#include "amp/transport/memory.hpp"
#include "support/body.hpp"
#include "support/nats_server.hpp"
#include "support/stats.hpp"

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

// ----- failing loudly ---------------------------------------------------------------------

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "amp-bench-library: FAILED: %s\n", what.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  // Threads may be blocked in the library: leave without running destructors. The
  // nats-server child dies with the process (PR_SET_PDEATHSIG).
  std::_Exit(1);
}

void check(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

template <class T>
T must(amp::result<T> r, const std::string& what) {
  if (!r) fail(what + ": " + r.error().to_string());
  return std::move(r).value();
}

// ----- options ----------------------------------------------------------------------------

struct options {
  std::vector<std::string> backends = {"jetstream", "memory"};
  int tasks = 20000;
  int runs = 3;
  std::vector<int> slots = {1, 8, 64};
  int window = 512;
  double rate = 1000;
  int latency_tasks = 10000;
  bool quick = false;
  std::string out = AMP_BENCH_DEFAULT_OUT;
};

[[noreturn]] void usage(const std::string& why, int status = 2) {
  std::fprintf(
      status == 0 ? stdout : stderr,
      "%s%susage: amp-bench-library [--backend jetstream|memory|both] [--tasks N] [--runs R]\n"
      "       [--slots 1,8,64] [--window W] [--rate TASKS_PER_S] [--latency-tasks N]\n"
      "       [--quick] [--out FILE]\n"
      "defaults: both backends, 20000 tasks, 3 runs, slots 1,8,64, window 512 submits,\n"
      "1000 tasks/s over 10000 tasks for latency; --quick: 3000 tasks, 1 run, 3000 for latency.\n"
      "Writes {\"jetstream\":{...},\"memory\":{...}} (the backends run) to --out.\n",
      status == 0 ? "" : "amp-bench-library: ", status == 0 ? "" : (why + "\n").c_str());
  std::exit(status);
}

options parse(int argc, char** argv) {
  options o;
  bool tasks_set = false, runs_set = false, latency_set = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--backend") {
        auto b = value();
        if (b == "both") {
          o.backends = {"jetstream", "memory"};
        } else if (b == "jetstream" || b == "memory") {
          o.backends = {b};
        } else {
          usage("--backend: jetstream, memory or both");
        }
      } else if (a == "--tasks") {
        o.tasks = std::stoi(value());
        tasks_set = true;
      } else if (a == "--runs") {
        o.runs = std::stoi(value());
        runs_set = true;
      } else if (a == "--slots") {
        o.slots = amp::bench::int_list(value());
      } else if (a == "--window") {
        o.window = std::stoi(value());
      } else if (a == "--rate") {
        o.rate = std::stod(value());
      } else if (a == "--latency-tasks") {
        o.latency_tasks = std::stoi(value());
        latency_set = true;
      } else if (a == "--quick") {
        o.quick = true;
      } else if (a == "--out") {
        o.out = value();
      } else if (a == "-h" || a == "--help") {
        usage("", 0);
      } else {
        usage("unknown argument " + a);
      }
    } catch (const std::exception&) {
      usage("bad value for " + a);
    }
  }
  if (o.quick) {  // explicit values win over --quick's
    if (!tasks_set) o.tasks = 3000;
    if (!runs_set) o.runs = 1;
    if (!latency_set) o.latency_tasks = 3000;
  }
  bool slots_ok = !o.slots.empty() && std::all_of(o.slots.begin(), o.slots.end(),
                                                  [](int s) { return s >= 1 && s <= 1024; });
  if (o.tasks < 1 || o.runs < 1 || !slots_ok || o.window < 1 || o.rate <= 0 ||
      o.latency_tasks < 1) {
    usage("bad values");
  }
  return o;
}

// ----- the body, the names ------------------------------------------------------------------

using amp::bench::body_at;
using amp::bench::context_switches_self;
using amp::bench::cpu_seconds;
using amp::bench::cpu_seconds_self;
using amp::bench::json_of;
using amp::bench::read_first_line;
using amp::bench::server_in_msgs;
using amp::bench::summarize;
using amp::bench::summary;

const amp::job_name& bench_job() {
  static const auto j = amp::job_name::make("bench").value();
  return j;
}
const amp::participant_name& producer_name() {
  static const auto p = amp::participant_name::make("producer").value();
  return p;
}
const amp::participant_name& worker_name() {
  static const auto p = amp::participant_name::make("worker").value();
  return p;
}

// The string value of `"key":"..."` in a flat JSON text, or empty.
std::string_view string_member(std::string_view json, std::string_view key) {
  auto at = json.find(fmt::format(R"("{}":")", key));
  if (at == std::string_view::npos) return {};
  auto from = at + key.size() + 4;
  auto to = json.find('"', from);
  return to == std::string_view::npos ? std::string_view{} : json.substr(from, to - from);
}

// The integer value of `"key":N`, or -1.
std::int64_t int_member(std::string_view json, std::string_view key) {
  auto at = json.find(fmt::format(R"("{}":)", key));
  if (at == std::string_view::npos) return -1;
  return std::strtoll(json.data() + at + key.size() + 3, nullptr, 10);
}

struct backend_env {
  std::string name;  // "jetstream" or "memory"
  std::string url;   // jetstream
  pid_t server_pid = -1;
  int http_port = -1;
};

// What one measurement costs besides time: CPU of this process and of nats-server, and the
// messages nats-server received.
struct meter {
  const backend_env& env;
  double cpu = cpu_seconds_self();
  double switches = context_switches_self();
  double server = cpu_seconds(env.server_pid);
  double in_msgs = server_in_msgs(env.http_port);

  explicit meter(const backend_env& e) : env(e) {}

  struct costs {
    double client_us = -1, client_switches = -1, server_us = -1, server_msgs = -1;  // per task
  };
  costs per_task(int n) const {
    costs c;
    auto dn = static_cast<double>(n);
    c.client_us = (cpu_seconds_self() - cpu) * 1e6 / dn;
    c.client_switches = (context_switches_self() - switches) / dn;
    double srv = cpu_seconds(env.server_pid);
    if (server >= 0 && srv >= 0) c.server_us = (srv - server) * 1e6 / dn;
    double msgs = server_in_msgs(env.http_port);
    if (in_msgs >= 0 && msgs >= 0) c.server_msgs = (msgs - in_msgs) / dn;
    return c;
  }
};

// ----- one measurement's broker -----------------------------------------------------------

int g_measurements = 0;

// A fresh transport and namespace with its broker; on JetStream, deletes what the namespace
// made (and the shared task bucket) when done.
struct bench_broker {
  std::shared_ptr<amp::transport> t;
  std::shared_ptr<amp::broker> b;
  amp::namespace_name ns = amp::namespace_name::make("x").value();
  bool jetstream = false;

  explicit bench_broker(const backend_env& env) : jetstream(env.name == "jetstream") {
    ns = must(amp::namespace_name::make(fmt::format("lib{}x{}", ::getpid(), ++g_measurements)),
              "namespace name");
    if (jetstream) {
      amp::jetstream_options jo;
      jo.url = env.url;
      jo.name = "amp-bench-library";
      t = must(amp::jetstream_transport::connect(jo), "connect to nats-server");
    } else {
      t = amp::memory_transport::create();
    }
    b = must(amp::broker::open(t, {.ns = ns}), "broker::open");
  }

  // Closes the broker; on JetStream deletes the namespace's streams and buckets.
  void finish() {
    b.reset();
    if (!jetstream) return;
    (void)t->delete_stream(amp::subjects::tasks_stream(ns));
    (void)t->delete_stream(amp::subjects::inbox_stream(ns));
    (void)t->delete_stream(amp::subjects::topics_stream(ns));
    (void)t->delete_bucket(amp::subjects::registry_bucket(ns));
    (void)t->delete_bucket(amp::subjects::task_state_bucket());
  }
};

// ----- the producer's inbox ---------------------------------------------------------------

// Receives the producer's notices, acks each, and counts them by task.
class notice_sink {
 public:
  notice_sink(amp::broker& b, int expected, std::string expected_body, steady::time_point origin)
      : expected_(expected), expected_body_(std::move(expected_body)), origin_(origin) {
    seen_.reserve(static_cast<std::size_t>(expected));
    if (expected_body_.empty()) latencies_.reserve(static_cast<std::size_t>(expected));
    reader_ = must(
        b.inbox().attach(producer_name(), [this](const amp::inbox_message& m) { on_message(m); }),
        "inbox attach");
    acker_ = reader_.get();
  }
  ~notice_sink() { stop(); }

  void stop() {
    if (reader_) reader_->stop();
  }

  // Waits until `expected` notices arrived; fails when none came for `stall`.
  steady::time_point wait_all(std::chrono::seconds stall, const std::string& what) {
    std::unique_lock lock(mu_);
    auto last = completed_;
    auto last_change = steady::now();
    while (completed_ < expected_) {
      cv_.wait_for(lock, 1s);
      if (completed_ != last) {
        last = completed_;
        last_change = steady::now();
      } else if (steady::now() - last_change > stall) {
        fail(fmt::format("{}: {} of {} completion notices after no progress for {} s", what,
                         completed_, expected_, stall.count()));
      }
    }
    return last_at_;
  }

  // Checks that every task in `submitted` was noticed exactly once and nothing else came.
  void verify(const std::vector<std::string>& submitted, const std::string& what) {
    std::lock_guard lock(mu_);
    check(problems_.empty(), what + ": " + problems_);
    check(static_cast<int>(submitted.size()) == expected_,
          fmt::format("{}: {} tasks submitted for {}", what, submitted.size(), expected_));
    check(completed_ == expected_ && static_cast<int>(seen_.size()) == expected_,
          fmt::format("{}: {} notices for {} distinct tasks, {} expected", what, completed_,
                      seen_.size(), expected_));
    for (const auto& id : submitted) {
      auto it = seen_.find(id);
      check(it != seen_.end(), what + ": no notice for " + id);
      check(it->second == 1, fmt::format("{}: {} notices for {}", what, it->second, id));
    }
  }

  std::vector<double> latencies_ms() {
    std::lock_guard lock(mu_);
    return latencies_;
  }

 private:
  void on_message(const amp::inbox_message& m) {
    auto* reader = acker_.load();
    auto acked = reader ? reader->ack(m.seq)
                        : amp::result<void>(amp::unexpected(amp::errc::internal, "no reader yet"));
    auto now = steady::now();
    std::lock_guard lock(mu_);
    if (!acked) problems_ += fmt::format("ack of {}: {}; ", m.seq, acked.error().to_string());
    if (m.delivery != 1)
      problems_ += fmt::format("notice {} delivered {} times; ", m.seq, m.delivery);
    if (m.env.type != "amp.task.completed" || m.env.from != amp::broker_sender) {
      problems_ += fmt::format("unexpected message {} from {}; ", m.env.type, m.env.from);
      return;
    }
    std::string_view body = m.env.body;
    auto task = std::string(string_member(body, "task"));
    if (task.empty() || string_member(body, "state") != "completed" ||
        int_member(body, "attempt") != 1) {
      problems_ += fmt::format("unexpected notice {}; ", body);
      return;
    }
    if (!expected_body_.empty()) {
      auto at = body.find(R"("result":)");
      if (at == std::string_view::npos ||
          body.substr(at + 9, expected_body_.size()) != expected_body_) {
        problems_ += fmt::format("notice without the body: {}; ", body);
      }
    } else {
      auto t0 = int_member(body, "t0");
      auto at = std::chrono::duration_cast<std::chrono::nanoseconds>(now - origin_).count();
      latencies_.push_back(static_cast<double>(at - t0) / 1e6);
    }
    if (++seen_[task] == 1) ++completed_;
    last_at_ = now;
    if (completed_ == expected_) cv_.notify_all();
  }

  const int expected_;
  const std::string expected_body_;  // empty: latency mode (the body carries t0)
  const steady::time_point origin_;
  std::unique_ptr<amp::inbox_reader> reader_;
  std::atomic<amp::inbox_reader*> acker_{nullptr};  // reader_, for the callback
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, int> seen_;
  int completed_ = 0;
  steady::time_point last_at_{};
  std::vector<double> latencies_;
  std::string problems_;
};

// ----- the worker -----------------------------------------------------------------------

// A worker with `slots` slots: a fetch pump (async_fetch for what is free, on the broker's
// executor, as the gateway's pump) hands each offer to job_queue::async_claim; a claimed
// task goes to the completer thread, which calls job_queue::async_complete (as a gateway
// worker thread does for a client's `complete` frame: async_complete must not be called
// from a transport thread, where its completion runs). Offers + leases never exceed `slots`.
class worker {
 public:
  worker(amp::job_queue& q, int slots) : q_(q), slots_(static_cast<std::size_t>(slots)) {
    completer_ = std::thread([this] { run(); });
    pump();
  }
  ~worker() { stop(); }

  // Stops the pump and the completer; waits (bounded) for the fetch and the tasks that are
  // out.
  void stop() {
    {
      std::unique_lock lock(mu_);
      if (stopped_) return;
      stopping_ = true;
      cv_.notify_all();
      // A fetch answers within its max_wait (1 s) plus the transport's op_timeout (5 s).
      if (!cv_.wait_for(lock, 15s, [&] { return !fetching_ && working_ == 0; }))
        fail("worker: a fetch or a task never came back");
      stopped_ = true;
    }
    completer_.join();
  }

  void verify(int n, const std::string& what) {
    std::lock_guard lock(mu_);
    check(errors_.empty(), what + ": worker errors: " + errors_);
    check(claims_ == n && completions_ == n,
          fmt::format("{}: {} claims and {} completions for {} tasks", what, claims_, completions_,
                      n));
    check(held_ == 0 && claimed_.empty(), what + ": the worker still holds offers");
  }

 private:
  void pump() {
    std::size_t n = 0;
    {
      std::lock_guard lock(mu_);
      n = reserve();
    }
    if (n > 0) fetch(n);
  }

  // How many offers to fetch now (0: none); reserves them. Called under `mu_`.
  std::size_t reserve() {
    if (stopping_ || fetching_ || held_ >= slots_) return 0;
    auto n = slots_ - held_;
    held_ += n;  // until the answer says how many came
    fetching_ = true;
    return n;
  }

  void fetch(std::size_t n) {
    q_.async_fetch(bench_job(), n, 1s, [this, n](amp::result<std::vector<amp::offer>> r) {
      std::size_t again = 0;
      {
        std::lock_guard lock(mu_);
        fetching_ = false;
        held_ -= n - (r ? r->size() : 0);
        if (!r) errors_ += "fetch: " + r.error().to_string() + "; ";
        if (r) working_ += r->size();
        again = reserve();
        cv_.notify_all();
      }
      if (r) {
        for (auto& o : *r) claim(std::move(o));
      }
      if (again > 0) fetch(again);
    });
  }

  void claim(amp::offer o) {
    auto held = std::make_shared<const amp::offer>(std::move(o));
    q_.async_claim(held, worker_name(), [this, held](amp::result<amp::lease> l) {
      std::size_t again = 0;
      {
        std::lock_guard lock(mu_);
        if (l) {
          ++claims_;
          claimed_.emplace_back(l->task, held->env.body);
          cv_.notify_all();
          return;
        }
        again = settle("claim: " + l.error().to_string());
      }
      if (again > 0) fetch(again);
    });
  }

  // A task is over for the worker (under `mu_`): its slot is free. Returns what to fetch
  // (see `reserve`); without a fetch, `stop` may return as soon as the lock is released, so
  // the caller must not touch `this` after it.
  std::size_t settle(const std::string& problem) {
    if (!problem.empty()) errors_ += problem + "; ";
    --held_;
    --working_;
    cv_.notify_all();
    return reserve();
  }

  void run() {
    for (;;) {
      std::optional<std::pair<amp::task_id, std::string>> next;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return (stopping_ && working_ == 0) || !claimed_.empty(); });
        if (claimed_.empty()) return;
        next.emplace(std::move(claimed_.front()));
        claimed_.pop_front();
      }
      auto task = next->first;
      q_.async_complete(task, worker_name(), std::move(next->second), {},
                        [this, task](amp::result<amp::completion_result> c) {
                          std::size_t again = 0;
                          {
                            std::lock_guard lock(mu_);
                            std::string problem;
                            if (!c) {
                              problem = "complete: " + c.error().to_string();
                            } else if (c->duplicate) {
                              problem = "complete: duplicate of " + task.str();
                            } else {
                              ++completions_;
                            }
                            again = settle(problem);
                          }
                          if (again > 0) fetch(again);
                        });
    }
  }

  amp::job_queue& q_;
  const std::size_t slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<amp::task_id, std::string>> claimed_;  // waiting for the completer
  std::size_t held_ = 0;     // offers and leases, plus those a fetch may bring
  std::size_t working_ = 0;  // offers given to async_claim and not yet settled
  bool fetching_ = false;
  bool stopping_ = false;
  bool stopped_ = false;
  int claims_ = 0;
  int completions_ = 0;
  std::string errors_;
  std::thread completer_;
};

// ----- checks on the backend ----------------------------------------------------------------

void verify_backend(bench_broker& bb, const std::vector<std::string>& ids, const std::string& body,
                    const std::string& what) {
  auto& t = *bb.t;
  // The acks of the job messages and of the notices may land after the notice (the broker
  // may send the notice, then ack, in the background; the producer's acks are asynchronous):
  // give them a moment.
  auto tasks_stream = amp::subjects::tasks_stream(bb.ns);
  auto inbox_stream = amp::subjects::inbox_stream(bb.ns);
  auto deadline = steady::now() + 10s;
  for (;;) {
    auto jobs = must(t.stream_info_of(tasks_stream), what + ": tasks stream info");
    auto ci = must(t.consumer_info_of(tasks_stream, amp::subjects::job_consumer(bench_job())),
                   what + ": job consumer info");
    auto in = must(t.stream_info_of(inbox_stream), what + ": inbox stream info");
    bool settled = jobs.state.messages == 0 && ci.num_ack_pending == 0 && in.state.messages == 0;
    if (settled || steady::now() > deadline) {
      check(jobs.state.messages == 0,
            fmt::format("{}: {} job messages left in the stream", what, jobs.state.messages));
      check(ci.num_pending == 0 && ci.num_ack_pending == 0 && ci.num_redelivered == 0,
            fmt::format("{}: job consumer: {} pending, {} ack pending, {} redelivered", what,
                        ci.num_pending, ci.num_ack_pending, ci.num_redelivered));
      check(in.state.messages == 0,
            fmt::format("{}: {} notices left in the inbox stream", what, in.state.messages));
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  // Every record, read back with up to 256 reads in flight.
  std::mutex mu;
  std::condition_variable cv;
  std::size_t in_flight = 0, done = 0;
  std::string problems;
  auto bucket = amp::subjects::task_state_bucket();
  for (const auto& id : ids) {
    {
      std::unique_lock lock(mu);
      if (!cv.wait_for(lock, 30s, [&] { return in_flight < 256; })) {
        fail(what + ": reading the records timed out");
      }
      ++in_flight;
    }
    auto key = amp::subjects::task_key(bb.ns, amp::task_id::make(id).value());
    t.async_kv_get(bucket, key, [&, id](amp::result<amp::kv_entry> e) {
      std::string problem;
      if (!e) {
        problem = id + ": " + e.error().to_string();
      } else if (auto r = amp::parse_task_record(e->value); !r) {
        problem = id + ": " + r.error().to_string();
      } else if (r->state != amp::task_state::completed || r->attempt != 1 ||
                 r->owner != worker_name().str() || (!body.empty() && r->result != body)) {
        problem = id + ": " + amp::to_json(*r);
      }
      std::lock_guard lock(mu);
      if (!problem.empty() && problems.size() < 2000) problems += problem + "; ";
      --in_flight;
      ++done;
      cv.notify_all();
    });
  }
  std::unique_lock lock(mu);
  if (!cv.wait_for(lock, 60s, [&] { return in_flight == 0; })) {
    fail(what + ": reading the records timed out");
  }
  check(problems.empty(), what + ": records: " + problems);
  check(done == ids.size(), what + ": not every record was read");
}

// ----- the measurements ---------------------------------------------------------------------

struct throughput_sample {
  double tasks_per_s = 0;
  double seconds = 0;
  meter::costs costs;
};

throughput_sample run_throughput(const backend_env& env, const options& o, int slots, int run) {
  auto what = fmt::format("{} throughput, {} slots, run {}", env.name, slots, run + 1);
  bench_broker bb(env);
  auto& q = bb.b->jobs();
  const auto body = body_at(0);
  const int n = o.tasks;
  notice_sink sink(*bb.b, n, body, steady::now());
  auto w = std::make_unique<worker>(q, slots);

  // One producer thread; at most `window` submits in flight.
  std::vector<std::string> all;
  all.reserve(static_cast<std::size_t>(n));
  int submit_errors = 0;
  std::string first_error;
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  meter m(env);
  auto start = steady::now();
  std::thread producer([&] {
    for (int i = 0; i < n; ++i) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return in_flight < o.window; });
        ++in_flight;
      }
      q.async_submit({.job = bench_job(), .from = producer_name(), .body = body},
                     [&](amp::result<amp::submit_result> r) {
                       std::lock_guard lock(mu);
                       --in_flight;
                       cv.notify_all();
                       if (!r || !r->created) {
                         if (submit_errors++ == 0)
                           first_error = r ? "not created" : r.error().to_string();
                         return;
                       }
                       all.push_back(r->task.str());
                     });
    }
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
  });
  auto end = sink.wait_all(30s, what);
  auto costs = m.per_task(n);
  producer.join();
  check(submit_errors == 0,
        fmt::format("{}: {} submits failed, first: {}", what, submit_errors, first_error));
  w->stop();
  sink.verify(all, what);
  w->verify(n, what);
  verify_backend(bb, all, body, what);
  sink.stop();
  w.reset();
  bb.finish();
  double seconds = std::chrono::duration<double>(end - start).count();
  return {n / seconds, seconds, costs};
}

struct latency_sample {
  double p50_ms = 0, p99_ms = 0, p999_ms = 0, achieved_rate = 0, max_start_lag_ms = 0;
};

latency_sample run_latency(const backend_env& env, const options& o, int run) {
  auto what = fmt::format("{} latency, run {}", env.name, run + 1);
  constexpr int k_slots = 8;
  constexpr int k_pacers = 4;
  bench_broker bb(env);
  auto& q = bb.b->jobs();
  const int n = o.latency_tasks;
  const auto origin = steady::now();
  notice_sink sink(*bb.b, n, {}, origin);
  auto w = std::make_unique<worker>(q, k_slots);

  const auto interval = std::chrono::duration<double>(1.0 / o.rate);
  std::atomic<int> next{0};
  std::atomic<int> submit_errors{0};
  std::atomic<std::int64_t> max_lag_ns{0};
  std::vector<std::string> all;
  std::mutex ids_mu;
  std::atomic<int> pending{0};
  const auto start = steady::now() + 10ms;
  std::vector<std::thread> pacers;
  for (int k = 0; k < k_pacers; ++k) {
    pacers.emplace_back([&, k] {
      for (int i; (i = next++) < n;) {
        auto due = start + std::chrono::duration_cast<steady::duration>(interval * i);
        std::this_thread::sleep_until(due);
        auto now = steady::now();
        auto lag = std::chrono::duration_cast<std::chrono::nanoseconds>(now - due).count();
        for (auto m = max_lag_ns.load(); lag > m && !max_lag_ns.compare_exchange_weak(m, lag);) {
        }
        auto t0 = std::chrono::duration_cast<std::chrono::nanoseconds>(now - origin).count();
        ++pending;
        q.async_submit({.job = bench_job(), .from = producer_name(), .body = body_at(t0)},
                       [&](amp::result<amp::submit_result> r) {
                         if (!r || !r->created) {
                           ++submit_errors;
                         } else {
                           std::lock_guard lock(ids_mu);
                           all.push_back(r->task.str());
                         }
                         --pending;
                       });
      }
    });
  }
  for (auto& p : pacers) p.join();
  for (auto waited = 0ms; pending > 0 && waited < 30s; waited += 10ms) {
    std::this_thread::sleep_for(10ms);
  }
  check(pending == 0, what + ": submits never answered");
  double sent_seconds = std::chrono::duration<double>(steady::now() - start).count();
  check(submit_errors == 0, fmt::format("{}: {} submits failed", what, submit_errors.load()));
  sink.wait_all(30s, what);
  w->stop();
  sink.verify(all, what);
  w->verify(n, what);
  verify_backend(bb, all, {}, what);
  auto lat = sink.latencies_ms();
  sink.stop();
  w.reset();
  bb.finish();
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) {
    return lat[static_cast<std::size_t>(p * static_cast<double>(lat.size() - 1))];
  };
  return {pct(0.50), pct(0.99), pct(0.999), n / sent_seconds,
          static_cast<double>(max_lag_ns.load()) / 1e6};
}

// ----- summaries and output -------------------------------------------------------------------

// One backend's figures: prints the table, returns the JSON object (amp-bench-tasks' shape).
std::string measure(const backend_env& env, const options& o) {
  auto loadavg_before = read_first_line("/proc/loadavg");
  std::map<int, summary> throughput, client_cpu, client_switches, server_cpu, server_msgs;
  for (int slots : o.slots) {
    std::vector<double> v, cc, cs, sc, sm;
    for (int r = 0; r < o.runs; ++r) {
      auto t = run_throughput(env, o, slots, r);
      std::string server;
      if (t.costs.server_us >= 0) server += fmt::format(", nats-server {:.0f}", t.costs.server_us);
      if (t.costs.server_msgs >= 0) {
        server += fmt::format("; messages into nats-server per task {:.1f}", t.costs.server_msgs);
      }
      std::printf(
          "%s throughput slots=%d run=%d: %.0f tasks/s (%d tasks in %.2f s; CPU us/task: "
          "client %.0f%s; context switches/task %.1f)\n",
          env.name.c_str(), slots, r + 1, t.tasks_per_s, o.tasks, t.seconds, t.costs.client_us,
          server.c_str(), t.costs.client_switches);
      std::fflush(stdout);
      v.push_back(t.tasks_per_s);
      cc.push_back(t.costs.client_us);
      cs.push_back(t.costs.client_switches);
      sc.push_back(t.costs.server_us);
      sm.push_back(t.costs.server_msgs);
    }
    throughput[slots] = summarize(v);
    client_cpu[slots] = summarize(cc);
    client_switches[slots] = summarize(cs);
    server_cpu[slots] = summarize(sc);
    server_msgs[slots] = summarize(sm);
  }
  std::vector<double> p50, p99, p999, achieved, lag;
  for (int r = 0; r < o.runs; ++r) {
    auto l = run_latency(env, o, r);
    std::printf(
        "%s latency at %.0f tasks/s run=%d: p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms "
        "(achieved %.0f/s, latest submit start %.2f ms after its due time)\n",
        env.name.c_str(), o.rate, r + 1, l.p50_ms, l.p99_ms, l.p999_ms, l.achieved_rate,
        l.max_start_lag_ms);
    std::fflush(stdout);
    p50.push_back(l.p50_ms);
    p99.push_back(l.p99_ms);
    p999.push_back(l.p999_ms);
    achieved.push_back(l.achieved_rate);
    lag.push_back(l.max_start_lag_ms);
  }
  auto loadavg_after = read_first_line("/proc/loadavg");

  std::printf("\namp library in-process, task lifecycle (%s backend, %d tasks per run, %d runs)\n",
              env.name.c_str(), o.tasks, o.runs);
  std::printf("%-26s %12s %12s %12s %14s %14s\n", "figure", "min", "median", "max",
              "client us/task", "server us/task");
  for (auto& [slots, s] : throughput) {
    auto server_us = server_cpu[slots].median;
    std::printf("%-26s %12.0f %12.0f %12.0f %14.0f %14s\n",
                fmt::format("tasks/s, {} slots", slots).c_str(), s.min, s.median, s.max,
                client_cpu[slots].median,
                server_us >= 0 ? fmt::format("{:.0f}", server_us).c_str() : "-");
  }
  auto s50 = summarize(p50), s99 = summarize(p99), s999 = summarize(p999);
  const std::pair<const char*, const summary*> rows[] = {
      {"p50", &s50}, {"p99", &s99}, {"p99.9", &s999}};
  for (auto [label, s] : rows) {
    std::printf("%-26s %12.2f %12.2f %12.2f\n",
                fmt::format("{} ms at {:.0f}/s", label, o.rate).c_str(), s->min, s->median, s->max);
  }
  std::printf("\n");

  auto keyed = [](const std::map<int, summary>& m) {
    std::string out;
    for (auto& [slots, s] : m)
      out += (out.empty() ? "" : ",") + fmt::format(R"("{}":{})", slots, json_of(s));
    return out;
  };
  auto cpu = read_first_line("/proc/cpuinfo", "model name");
  return fmt::format(
      R"({{"benchmark":"amp-bench-library","via":"amp library in-process","backend":"{}",)"
      R"("storage":"{}","tasks":{},"runs":{},"quick":{},"window":{},"body_bytes":{},)"
      R"("machine":{{"cpus":{},"cpu":"{}","loadavg_before":"{}","loadavg_after":"{}"}},)"
      R"("throughput_tasks_per_s":{{{}}},)"
      R"("client_cpu_us_per_task":{{{}}},)"
      R"("client_context_switches_per_task":{{{}}},)"
      R"("server_cpu_us_per_task":{{{}}},)"
      R"("server_msgs_in_per_task":{{{}}},)"
      R"("latency":{{"offered_tasks_per_s":{},"tasks":{},"worker_slots":8,"achieved_tasks_per_s":{},)"
      R"("max_submit_start_lag_ms":{},"p50_ms":{},"p99_ms":{},"p999_ms":{}}}}})",
      env.name, env.name == "jetstream" ? "file" : "memory", o.tasks, o.runs,
      o.quick ? "true" : "false", o.window, body_at(0).size(), std::thread::hardware_concurrency(),
      cpu.substr(cpu.find(':') == std::string::npos ? 0 : cpu.find(':') + 2), loadavg_before,
      loadavg_after, keyed(throughput), keyed(client_cpu), keyed(client_switches),
      env.name == "jetstream" ? keyed(server_cpu) : "",
      env.name == "jetstream" ? keyed(server_msgs) : "", o.rate, o.latency_tasks,
      json_of(summarize(achieved)), json_of(summarize(lag)), json_of(s50), json_of(s99),
      json_of(s999));
}

}  // namespace

int main(int argc, char** argv) {
  auto o = parse(argc, argv);
  std::string json;
  for (const auto& backend : o.backends) {
    backend_env env;
    env.name = backend;
    std::optional<amp::testing::nats_server> nats;
    if (backend == "jetstream") {
      env.http_port = amp::testing::free_port();
      nats.emplace(amp::testing::nats_server::start(
          {.jetstream = true, .extra_config = fmt::format("http_port: {}\n", env.http_port)}));
      env.url = nats->url();
      env.server_pid = nats->pid();
      if (server_in_msgs(env.http_port) < 0) env.http_port = -1;  // no monitoring: no counts
    }
    json += (json.empty() ? "" : ",\n") + fmt::format(R"("{}":{})", backend, measure(env, o));
  }
  std::ofstream out(o.out);
  out << "{" << json << "}\n";
  out.close();
  check(static_cast<bool>(out), "cannot write " + o.out);
  std::printf("written to %s\n", o.out.c_str());
  return 0;
}
