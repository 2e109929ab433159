// amp-bench-cluster: several amp-servers on one 3-node JetStream cluster (replicas 3), the
// scale-out benchmark of issue 16.
//
// scale:    1, 2 and 3 amp-servers on the same cluster, the same clients spread over them
//           (producer i, worker i and inbox sender i on server i mod N; recipient i on
//           server i+1 mod N): task lifecycle (submit → offer → claim → complete → the
//           producer's completion notice) and inbox messages (send → delivery → ack), each
//           as a rate and as a ratio to one server measured in the same run, with the CPU
//           of every amp-server and every nats-server per task and per message; and the
//           CPU per task at a fixed offered load (--paced-rate, 400 tasks/s), which every
//           server count carries, so that its costs do not depend on how far each saturates.
// failover: 2 amp-servers under a paced task load (producers resubmit with the same
//           idempotency key until a submit is answered, and move to the other server when
//           theirs goes); SIGKILL of the NATS node that leads the task store, later of one
//           amp-server. Reports the longest time without a completion after each kill and
//           the tallies: submitted (answered), completed once, completed twice, failed,
//           lost (submitted, never completed): lost must be 0.
//
//   amp-bench-cluster [--servers 1,2,3] [--tasks N] [--messages N] [--runs R]
//                     [--paced-rate TASKS_PER_S] [--rate TASKS_PER_S] [--failover-s S]
//                     [--only scale|failover] [--quick] [--failover-trace CSV] [--out FILE]
//
// Every process (three nats-servers, the amp-servers, the clients in this process) shares
// this machine's cores: see benchmarks/README.md for what that can and cannot show.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "amp/client.hpp"
#include "amp/subjects.hpp"
#include "support/leader_probe.hpp"
#include "support/nats_server.hpp"
#include "support/server_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using namespace amp::bench;
using steady = std::chrono::steady_clock;

struct options {
  std::vector<int> servers = {1, 2, 3};
  int tasks = 12000;
  int messages = 24000;
  int runs = 1;
  double rate = 200;
  int failover_s = 36;
  double paced_rate = 400;  // tasks/s of the scale runs' fixed load
  int paced_s = 15;
  bool scale = true;
  bool failover = true;
  std::string out = AMP_BENCH_CLUSTER_OUT;
  std::string failover_trace;  // CSV: completions per 100 ms of the failover run, when set
};

// Clients of a scale run, the same whatever the number of servers.
constexpr int k_producers = 4;
constexpr int k_workers = 4;
constexpr int k_worker_slots = 16;
constexpr int k_submit_window = 64;  // per producer
constexpr int k_pairs = 6;           // inbox sender → recipient
constexpr int k_send_window = 64;    // per sender

// The job's lease is short so that the tasks a killed amp-server's workers held come back
// soon; attempts are many so that none fails for want of them.
constexpr const char* k_job_config = R"("jobs":{"bench":{"lease_s":3,"max_attempts":100}},)";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "amp-bench-cluster: %s\n"
               "usage: amp-bench-cluster [--servers 1,2,3] [--tasks N] [--messages N] [--runs R]\n"
               "       [--paced-rate TASKS_PER_S] [--rate TASKS_PER_S] [--failover-s S]\n"
               "       [--only scale|failover] [--quick] [--failover-trace CSV] [--out FILE]\n",
               why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--servers") {
      o.servers = int_list(value());
    } else if (a == "--tasks") {
      o.tasks = std::stoi(value());
    } else if (a == "--messages") {
      o.messages = std::stoi(value());
    } else if (a == "--runs") {
      o.runs = std::stoi(value());
    } else if (a == "--rate") {
      o.rate = std::stod(value());
    } else if (a == "--paced-rate") {
      o.paced_rate = std::stod(value());
    } else if (a == "--failover-s") {
      o.failover_s = std::stoi(value());
    } else if (a == "--only") {
      auto v = value();
      if (v != "scale" && v != "failover") usage("--only: scale or failover");
      o.scale = v == "scale";
      o.failover = v == "failover";
    } else if (a == "--quick") {
      o.tasks = 3000;
      o.messages = 6000;
      o.runs = 1;
      o.failover_s = 24;
      o.paced_s = 6;
    } else if (a == "--failover-trace") {
      o.failover_trace = value();
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "-h" || a == "--help") {
      usage("help");
    } else {
      usage("unknown argument " + a);
    }
  }
  bool servers_ok = !o.servers.empty() && std::all_of(o.servers.begin(), o.servers.end(),
                                                      [](int n) { return n >= 1 && n <= 8; });
  if (!servers_ok || o.tasks < k_producers || o.messages < k_pairs || o.runs < 1 || o.rate <= 0 ||
      o.failover_s < 12) {
    usage("bad values");
  }
  return o;
}

// N amp-servers on the cluster, each given every node's URL (cnats picks one at random and
// moves to another when it goes).
class fleet {
 public:
  fleet(const amp::testing::nats_cluster& cluster, int n, const std::string& tag) {
    for (int i = 0; i < n; ++i) {
      servers_.push_back(std::make_unique<server_process>(
          server_settings{.nats_url = cluster.urls(),
                          .port = static_cast<std::uint16_t>(amp::testing::free_port()),
                          .name = fmt::format("amp-bench-cluster-{}{}", tag, i),
                          .extra_config = k_job_config,
                          .nats_options = R"(,"replicas":3)",
                          .extra_args = {}}));
    }
  }
  int size() const { return static_cast<int>(servers_.size()); }
  std::string url(int i) const { return servers_[static_cast<std::size_t>(i % size())]->url(); }
  server_process& server(int i) { return *servers_[static_cast<std::size_t>(i)]; }
  std::vector<double> cpu_each() const {
    std::vector<double> v;
    for (const auto& s : servers_) v.push_back(amp::bench::cpu_seconds(s->pid()));
    return v;
  }

 private:
  std::vector<std::unique_ptr<server_process>> servers_;
};

double nats_cpu_seconds(const amp::testing::nats_cluster& cluster) {
  double sum = 0;
  for (int i = 0; i < cluster.size(); ++i) {
    if (cluster.node(i).pid() > 0) sum += amp::bench::cpu_seconds(cluster.node(i).pid());
  }
  return sum;
}

// CPU spent over a run, per item (µs): every amp-server together, the busiest one, every
// nats-server together, and the clients (this process).
struct costs {
  double servers_us = 0, busiest_server_us = 0, nats_us = 0, clients_us = 0;
};

class cpu_meter {
 public:
  cpu_meter(const fleet& f, const amp::testing::nats_cluster& c)
      : fleet_(f),
        cluster_(c),
        servers_(f.cpu_each()),
        nats_(nats_cpu_seconds(c)),
        self_(cpu_seconds_self()) {}
  costs per(int items) const {
    const double us = 1e6 / items;
    auto now = fleet_.cpu_each();
    costs k;
    for (std::size_t i = 0; i < now.size(); ++i) {
      double spent = (now[i] - servers_[i]) * us;
      k.servers_us += spent;
      k.busiest_server_us = std::max(k.busiest_server_us, spent);
    }
    k.nats_us = (nats_cpu_seconds(cluster_) - nats_) * us;
    k.clients_us = (cpu_seconds_self() - self_) * us;
    return k;
  }

 private:
  const fleet& fleet_;
  const amp::testing::nats_cluster& cluster_;
  std::vector<double> servers_;
  double nats_, self_;
};

// Acks a `message` push.
void ack(amp::client& c, const amp::client_frame& m) {
  (void)c.notify("ack", fmt::format(R"("seq":{})", m.int_at("/seq").value_or(0)));
}

// A worker that claims and completes every offer with the task's body as its result, and
// counts the completes the server accepted per task.
class worker {
 public:
  struct tally {
    std::mutex mu;
    std::map<std::string, int> completed;  // task → completes answered ok
    steady::time_point origin = steady::now();
    std::vector<double> completed_at;  // seconds from `origin` of each complete answered ok
    std::string failure;               // an unexpected refusal, when one came
  };

  worker(const std::string& url, const std::string& ns, int index, int slots, tally& t)
      : client_(connect(url, fmt::format("worker{}", index), ns)) {
    amp::client& w = *client_;
    w.on_push([&w, &t](const amp::client_frame& f) {
      if (f.op() != "offer") return;
      auto task = f.string_at("/task").value_or("");
      auto body = f.raw_at("/envelope/body").value_or("null");
      w.async_request(
          "claim", fmt::format(R"("task":"{}")", task),
          [&w, &t, task, body](amp::result<amp::client_frame> r) {
            if (!r) return note(t, "claim", r.error());
            w.async_request(
                "complete", fmt::format(R"("task":"{}","result":{})", task, body),
                [&t, task](amp::result<amp::client_frame> done) {
                  if (!done) return note(t, "complete", done.error());
                  auto now = steady::now();
                  std::lock_guard lock(t.mu);
                  ++t.completed[task];
                  t.completed_at.push_back(std::chrono::duration<double>(now - t.origin).count());
                });
          });
    });
    if (auto reg = w.register_worker({"bench"}, slots); !reg) {
      throw std::runtime_error("register: " + reg.error().to_string());
    }
    alive_.emplace(w);
  }
  ~worker() {
    alive_.reset();
    client_->on_push({});
  }
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

 private:
  // A refusal a worker meets in a cluster without anything being wrong: the offer or the
  // lease moved on, or the server or its NATS node went away mid-request (the lease then
  // lapses and the task is offered again).
  static void note(tally& t, const char* what, const amp::error& e) {
    if (expected_refusal(e) || e.code() == amp::errc::unavailable) {
      return;
    }
    std::lock_guard lock(t.mu);
    if (t.failure.empty()) t.failure = fmt::format("{}: {}", what, e.to_string());
  }

  std::unique_ptr<amp::client> client_;
  std::optional<heartbeats> alive_;
};

// ---------------------------------------------------------------------------------------
// scale

struct scale_result {
  double tasks_per_s = 0, messages_per_s = 0;
  costs per_task, per_message;
  costs per_paced_task;  // at options::paced_rate
};

// Sends `count` requests `op` (`fields`) on `c` with at most `window` awaiting their answer,
// the k-th not before `start` + k/`rate` when `rate` is above 0; a refusal aborts `run`.
// Returns when every answer came.
void send_windowed(amp::client& c, const char* op, const std::string& fields, int count, int window,
                   double rate, steady::time_point start, countdown& run) {
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  auto interval = std::chrono::duration<double>(1 / std::max(rate, 1e-9));
  for (int k = 0; k < count; ++k) {
    if (rate > 0) {
      std::this_thread::sleep_until(start +
                                    std::chrono::duration_cast<steady::duration>(interval * k));
    }
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return in_flight < window; });
      ++in_flight;
    }
    c.async_request(op, fields, [&, op](amp::result<amp::client_frame> r) {
      if (!r) run.abort(fmt::format("{}: {}", op, r.error().to_string()));
      std::lock_guard lock(mu);
      --in_flight;
      cv.notify_one();
    });
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return in_flight == 0; });
}

// Spreads `n` requests `op` over `clients` (a thread each, `send_windowed`, the i-th with
// `fields(i)`, at `rate` per second in all when above 0) and waits until `done` has counted
// down; returns the rate from the first request to the end, with the CPU per request in
// `spent`. Throws `std::runtime_error` when `done` does not finish in 600 s.
double drive(std::vector<std::unique_ptr<amp::client>>& clients, const char* op,
             const std::function<std::string(int)>& fields, int n, int window, double rate,
             countdown& done, const cpu_meter& meter, costs& spent) {
  const int k = static_cast<int>(clients.size());
  auto start = steady::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < k; ++i) {
    int share = n / k + (i < n % k ? 1 : 0);
    threads.emplace_back(
        [&c = *clients[static_cast<std::size_t>(i)], op, text = fields(i), share, window, rate, k,
         start, &done] { send_windowed(c, op, text, share, window, rate / k, start, done); });
  }
  for (auto& t : threads) t.join();
  bool finished = done.wait(600s);
  double seconds = std::chrono::duration<double>(steady::now() - start).count();
  spent = meter.per(n);
  if (!finished)
    throw std::runtime_error(fmt::format("{} run did not finish: {}", op, done.unfinished()));
  return n / seconds;
}

// Submits `n` tasks spread over the producers, as fast as the submit windows allow, or at
// `rate` tasks/s in all when it is above 0; returns tasks/s from the first submit to the
// last completion notice.
double run_tasks(fleet& f, const amp::testing::nats_cluster& cluster, int n, const std::string& ns,
                 double rate, costs& spent) {
  worker::tally wt;
  std::vector<std::unique_ptr<worker>> workers;
  for (int i = 0; i < k_workers; ++i) {
    workers.push_back(std::make_unique<worker>(f.url(i), ns, i, k_worker_slots, wt));
  }
  countdown finished;
  finished.left = n;
  std::vector<std::unique_ptr<amp::client>> producers;
  for (int i = 0; i < k_producers; ++i) {
    producers.push_back(connect(f.url(i), fmt::format("producer{}", i), ns));
    amp::client& p = *producers.back();
    p.on_push([&p, &finished](const amp::client_frame& m) {
      if (m.op() != "message") return;
      ack(p, m);
      if (m.string_at("/envelope/type") == "amp.task.completed") finished.done();
    });
  }
  cpu_meter meter(f, cluster);
  auto per_s = drive(
      producers, "submit", [](int) { return std::string(R"("job":"bench","body":{"n":1})"); }, n,
      k_submit_window, rate, finished, meter, spent);
  std::lock_guard lock(wt.mu);
  if (!wt.failure.empty()) throw std::runtime_error("task run: " + wt.failure);
  return per_s;
}

double run_messages(fleet& f, const amp::testing::nats_cluster& cluster, int n,
                    const std::string& ns, costs& spent) {
  countdown received;
  received.left = n;
  std::vector<std::unique_ptr<amp::client>> recipients, senders;
  for (int i = 0; i < k_pairs; ++i) {
    recipients.push_back(connect(f.url(i + 1), fmt::format("recipient{}", i), ns));
    amp::client& r = *recipients.back();
    r.on_push([&r, &received](const amp::client_frame& fr) {
      if (fr.op() != "message") return;
      ack(r, fr);
      received.done();
    });
    senders.push_back(connect(f.url(i), fmt::format("sender{}", i), ns));
  }
  cpu_meter meter(f, cluster);
  return drive(
      senders, "send",
      [](int i) { return fmt::format(R"("to":"recipient{}","body":{{"n":1}})", i); }, n,
      k_send_window, 0, received, meter, spent);
}

scale_result run_scale(amp::testing::nats_cluster& cluster, int n_servers, const options& o,
                       int run) {
  fleet f(cluster, n_servers, fmt::format("s{}r{}-", n_servers, run));
  scale_result r;
  auto tag = fmt::format("{}n{}r{}", ::getpid() % 100000, n_servers, run);
  r.tasks_per_s = run_tasks(f, cluster, o.tasks, "sct" + tag, 0, r.per_task);
  auto paced = static_cast<int>(o.paced_rate * o.paced_s);
  (void)run_tasks(f, cluster, paced, "scp" + tag, o.paced_rate, r.per_paced_task);
  r.messages_per_s = run_messages(f, cluster, o.messages, "scm" + tag, r.per_message);
  return r;
}

// ---------------------------------------------------------------------------------------
// failover

// What the producers of a failover run saw, keyed by idempotency key.
struct ledger {
  std::mutex mu;
  std::map<int, std::string> submitted;  // key → task id (the submit was answered)
  int task_id_changed = 0;               // a resubmit answered with another task id
  std::map<int, double> completed;       // key → seconds from the start, first notice
  int notices_again = 0;                 // completion notices for a key seen before
  std::set<int> failed;                  // keys with an amp.task.failed notice
};

// A producer that submits paced tasks with idempotency keys, resubmits every key not yet
// answered, and reconnects (to its own server, else the next one) when its connection goes.
class producer {
 public:
  // `origin` (times are seconds from it) is read only once messages come.
  producer(const fleet& f, int home, const std::string& ns, int index, ledger& l,
           const steady::time_point& origin)
      : fleet_(f),
        home_(home),
        ns_(ns),
        name_(fmt::format("producer{}", index)),
        ledger_(l),
        origin_(origin) {
    attach();
  }
  // Closes the connections first: a late answer's callback may still use the members.
  ~producer() {
    std::shared_ptr<amp::client> last;
    std::vector<std::shared_ptr<amp::client>> old;
    {
      std::lock_guard lock(mu_);
      last = std::move(client_);
      old = std::move(old_);
    }
    if (last) last->on_push({});
    last.reset();
    old.clear();
  }
  producer(const producer&) = delete;
  producer& operator=(const producer&) = delete;

  // Sends (or resends) the submit of `key`; an unanswered one is resent by `retry`.
  void submit(int key) {
    {
      std::lock_guard lock(mu_);
      pending_[key] = steady::now();
    }
    auto c = current();
    if (!c) return;
    c->async_request(
        "submit",
        fmt::format(R"("job":"bench","body":{{"k":{}}},"idempotency_key":"k{}")", key, key),
        [this, key](amp::result<amp::client_frame> r) {
          if (!r) return;
          auto task = r->string_at("/task").value_or("");
          {
            std::lock_guard lock(ledger_.mu);
            auto [at, fresh] = ledger_.submitted.emplace(key, task);
            if (!fresh && at->second != task) ++ledger_.task_id_changed;
          }
          std::lock_guard lock(mu_);
          pending_.erase(key);
        });
  }

  // Resubmits the keys sent more than two seconds ago and not answered yet (reconnecting
  // first when the connection is gone); returns how many are unanswered.
  std::size_t retry() {
    std::vector<int> again;
    {
      std::lock_guard lock(mu_);
      auto due = steady::now() - 2s;
      for (auto& [k, sent] : pending_)
        if (sent < due) again.push_back(k);
    }
    for (int k : again) submit(k);
    std::lock_guard lock(mu_);
    return pending_.size();
  }

 private:
  std::shared_ptr<amp::client> current() {
    std::unique_lock lock(mu_);
    if (client_ && !client_->wait_closed(0ms)) return client_;
    lock.unlock();
    attach();
    lock.lock();
    return client_ && !client_->wait_closed(0ms) ? client_ : nullptr;
  }

  void attach() {
    for (int i = 0; i < fleet_.size(); ++i) {
      amp::client_options co;
      co.url = fleet_.url(home_ + i);
      co.token = token(name_, ns_);
      co.connect_timeout = 2s;
      co.request_timeout = 5s;
      auto c = amp::client::connect(co);
      if (!c) continue;
      std::shared_ptr<amp::client> fresh = std::move(*c);
      amp::client* raw = fresh.get();
      raw->on_push([this, raw](const amp::client_frame& f) { on_message(*raw, f); });
      std::lock_guard lock(mu_);
      if (client_) {
        client_->on_push({});
        old_.push_back(std::move(client_));
      }
      client_ = fresh;
      return;
    }
  }

  void on_message(amp::client& c, const amp::client_frame& f) {
    if (f.op() != "message") return;
    ack(c, f);
    auto type = f.string_at("/envelope/type").value_or("");
    auto key = f.int_at("/envelope/body/result/k");
    double at = std::chrono::duration<double>(steady::now() - origin_).count();
    std::lock_guard lock(ledger_.mu);
    if (type == "amp.task.completed" && key) {
      auto k = static_cast<int>(*key);
      if (!ledger_.completed.emplace(k, at).second) ++ledger_.notices_again;
    } else if (type == "amp.task.failed") {
      // The body has no result; the task id names it.
      auto task = f.string_at("/envelope/body/task").value_or("");
      for (auto& [k, t] : ledger_.submitted)
        if (t == task) ledger_.failed.insert(k);
    }
  }

  const fleet& fleet_;
  int home_;
  std::string ns_, name_;
  ledger& ledger_;
  const steady::time_point& origin_;
  std::mutex mu_;
  std::shared_ptr<amp::client> client_;
  std::vector<std::shared_ptr<amp::client>> old_;  // closed ones, kept for their threads
  std::map<int, steady::time_point> pending_;      // key → when last sent, until answered
};

struct failover_result {
  double node_killed_at_s = 0, server_killed_at_s = 0;
  double node_gap_s = 0, server_gap_s = 0;
  std::string killed_node;
  int submitted = 0, completed_once = 0, completed_twice = 0, failed = 0, lost = 0;
  int task_id_changed = 0, notices_again = 0;
  double drained_at_s = 0;
};

// The longest stretch without a completion from `from` to `to` (seconds from the start),
// counting the stretch from `from` to the first completion after it.
double longest_gap(const std::vector<double>& times, double from, double to) {
  double last = from, gap = 0;
  for (double t : times) {
    if (t < from) continue;
    if (t > to) break;
    gap = std::max(gap, t - last);
    last = t;
  }
  return std::max(gap, to - last);
}

failover_result run_failover(amp::testing::nats_cluster& cluster, const options& o) {
  fleet f(cluster, 2, "f");
  auto ns_text = fmt::format("fo{}", ::getpid() % 100000);
  worker::tally wt;
  std::vector<std::unique_ptr<worker>> workers;
  for (int i = 0; i < 4; ++i)
    workers.push_back(std::make_unique<worker>(f.url(i), ns_text, i, 8, wt));
  ledger book;
  steady::time_point origin;  // once every client is connected
  std::vector<std::unique_ptr<producer>> producers;
  for (int i = 0; i < 2; ++i)
    producers.push_back(std::make_unique<producer>(f, i, ns_text, i, book, origin));
  origin = steady::now();
  {
    std::lock_guard lock(wt.mu);
    wt.origin = origin;
  }

  failover_result r;
  const double load_s = o.failover_s;
  r.node_killed_at_s = load_s / 3;
  r.server_killed_at_s = 2 * load_s / 3;
  amp::testing::leader_probe probe(cluster.url_list());
  auto store = "KV_" + amp::subjects::task_state_bucket();

  std::vector<std::thread> pacers;
  int total = static_cast<int>(o.rate * load_s);
  for (int i = 0; i < 2; ++i) {
    pacers.emplace_back([&, i] {
      auto& p = *producers[static_cast<std::size_t>(i)];
      auto interval = std::chrono::duration<double>(2.0 / o.rate);
      auto last_retry = steady::now();
      for (int k = i; k < total; k += 2) {
        std::this_thread::sleep_until(
            origin + std::chrono::duration_cast<steady::duration>(interval * (k / 2)));
        p.submit(k);
        if (steady::now() - last_retry > 1s) {
          p.retry();
          last_retry = steady::now();
        }
      }
    });
  }
  auto at = [&](double s) {
    return origin + std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(s));
  };
  std::this_thread::sleep_until(at(r.node_killed_at_s));
  auto leader = probe.leader_of(store.c_str());
  int victim = leader ? cluster.node_index_by_name(*leader) : 0;
  if (victim < 0) victim = 0;
  r.killed_node = fmt::format("n{}{}", victim + 1, leader ? " (task store leader)" : "");
  cluster.kill(victim);
  std::this_thread::sleep_until(at(r.server_killed_at_s));
  ::kill(f.server(1).pid(), SIGKILL);
  for (auto& t : pacers) t.join();

  // Drain: resubmit what was not answered, wait for every answered key to complete.
  auto deadline = steady::now() + 90s;
  while (steady::now() < deadline) {
    std::size_t unanswered = 0;
    for (auto& p : producers) unanswered += p->retry();
    {
      std::lock_guard lock(book.mu);
      bool all = unanswered == 0 && book.submitted.size() == static_cast<std::size_t>(total);
      std::size_t ended = book.completed.size() + book.failed.size();
      if (all && ended >= book.submitted.size()) break;
    }
    std::this_thread::sleep_for(500ms);
  }
  r.drained_at_s = std::chrono::duration<double>(steady::now() - origin).count();
  producers.clear();
  workers.clear();

  std::lock_guard lock(book.mu);
  std::lock_guard wl(wt.mu);
  // The service is the completes the workers got answered; the notices to the producers
  // follow (those pushed to a session that died come again after `inbox_ack_s`).
  std::vector<double> times = wt.completed_at, notices;
  std::sort(times.begin(), times.end());
  for (auto& [k, t] : book.completed) notices.push_back(t);
  if (!o.failover_trace.empty()) {
    std::ofstream trace(o.failover_trace);
    trace << "second,completes,notices\n";
    std::map<int, int> completes, noticed;
    for (double t : times) ++completes[static_cast<int>(t * 10)];
    for (double t : notices) ++noticed[static_cast<int>(t * 10)];
    for (int tenth = 0; tenth <= static_cast<int>(r.drained_at_s * 10); ++tenth)
      trace << fmt::format("{:.1f},{},{}\n", tenth / 10.0, completes[tenth], noticed[tenth]);
  }
  r.node_gap_s = longest_gap(times, r.node_killed_at_s, r.server_killed_at_s);
  r.server_gap_s = longest_gap(times, r.server_killed_at_s, load_s);
  std::set<std::string> twice;
  for (auto& [task, times_ok] : wt.completed)
    if (times_ok > 1) twice.insert(task);
  r.completed_twice = static_cast<int>(twice.size());
  r.submitted = static_cast<int>(book.submitted.size());
  for (auto& [k, task] : book.submitted) {
    if (book.completed.count(k)) {
      if (!twice.count(task)) ++r.completed_once;
    } else if (book.failed.count(k)) {
      ++r.failed;
    } else {
      ++r.lost;
    }
  }
  if (!wt.failure.empty())
    std::fprintf(stderr, "amp-bench-cluster: worker: %s\n", wt.failure.c_str());
  r.task_id_changed = book.task_id_changed;
  r.notices_again = book.notices_again;
  return r;
}

std::string costs_json(const std::vector<costs>& v) {
  std::vector<double> s, b, n, c;
  for (const auto& k : v) {
    s.push_back(k.servers_us);
    b.push_back(k.busiest_server_us);
    n.push_back(k.nats_us);
    c.push_back(k.clients_us);
  }
  return fmt::format(
      R"({{"amp_servers_cpu_us":{},"busiest_amp_server_cpu_us":{},"nats_servers_cpu_us":{},"clients_cpu_us":{}}})",
      json_of(summarize(s)), json_of(summarize(b)), json_of(summarize(n)), json_of(summarize(c)));
}

}  // namespace

int run(const options& o) {
  auto loadavg_before = read_first_line("/proc/loadavg");
  auto cluster = amp::testing::nats_cluster::start(3);
  std::string scale_json, failover_json;
  if (o.scale) {
    std::map<int, std::vector<double>> tasks, messages;
    std::map<int, std::vector<costs>> task_costs, message_costs, paced_costs;
    for (int r = 0; r < o.runs; ++r) {
      for (int n : o.servers) {
        auto s = run_scale(cluster, n, o, r);
        std::printf(
            "servers=%d run=%d: %.0f tasks/s (per task: amp-servers %.0f us CPU, busiest %.0f, "
            "nats-servers %.0f, clients %.0f); %.0f messages/s (per message: amp-servers %.0f "
            "us, nats-servers %.0f); at %.0f tasks/s per task: amp-servers %.0f us, busiest %.0f, "
            "nats-servers %.0f\n",
            n, r + 1, s.tasks_per_s, s.per_task.servers_us, s.per_task.busiest_server_us,
            s.per_task.nats_us, s.per_task.clients_us, s.messages_per_s, s.per_message.servers_us,
            s.per_message.nats_us, o.paced_rate, s.per_paced_task.servers_us,
            s.per_paced_task.busiest_server_us, s.per_paced_task.nats_us);
        std::fflush(stdout);
        tasks[n].push_back(s.tasks_per_s);
        messages[n].push_back(s.messages_per_s);
        task_costs[n].push_back(s.per_task);
        paced_costs[n].push_back(s.per_paced_task);
        message_costs[n].push_back(s.per_message);
      }
    }
    int base = o.servers.front();
    double base_tasks = summarize(tasks[base]).median;
    double base_messages = summarize(messages[base]).median;
    std::printf("\n%-10s %12s %8s %14s %8s\n", "servers", "tasks/s", "ratio", "messages/s",
                "ratio");
    for (int n : o.servers) {
      double t = summarize(tasks[n]).median, m = summarize(messages[n]).median;
      std::printf("%-10d %12.0f %8.2f %14.0f %8.2f\n", n, t, t / base_tasks, m, m / base_messages);
      scale_json += fmt::format(
          R"({}"{}":{{"tasks_per_s":{},"tasks_ratio":{},"messages_per_s":{},"messages_ratio":{},)"
          R"("per_task":{},"per_message":{},"per_task_paced":{}}})",
          scale_json.empty() ? "" : ",", n, json_of(summarize(tasks[n])),
          json_number(t / base_tasks, 3), json_of(summarize(messages[n])),
          json_number(m / base_messages, 3), costs_json(task_costs[n]),
          costs_json(message_costs[n]), costs_json(paced_costs[n]));
    }
  }
  if (o.failover) {
    auto r = run_failover(cluster, o);
    std::printf(
        "\nfailover (%d s at %.0f tasks/s, 2 amp-servers): SIGKILL %s at %.0f s: longest gap "
        "%.2f s; SIGKILL of an amp-server at %.0f s: longest gap %.2f s; drained at %.0f s\n"
        "submitted %d, completed once %d, completed twice %d, failed %d, lost %d (resubmits "
        "answered with another task id %d, completion notices seen again %d)\n",
        o.failover_s, o.rate, r.killed_node.c_str(), r.node_killed_at_s, r.node_gap_s,
        r.server_killed_at_s, r.server_gap_s, r.drained_at_s, r.submitted, r.completed_once,
        r.completed_twice, r.failed, r.lost, r.task_id_changed, r.notices_again);
    failover_json = fmt::format(
        R"("failover":{{"load_s":{},"offered_tasks_per_s":{},"amp_servers":2,"killed_node":{},)"
        R"("node_killed_at_s":{},"node_gap_s":{},"server_killed_at_s":{},"server_gap_s":{},)"
        R"("drained_at_s":{},"submitted":{},"completed_once":{},"completed_twice":{},)"
        R"("failed":{},"lost":{},"task_id_changed":{},"notices_again":{}}})",
        o.failover_s, o.rate, json_string(r.killed_node), json_number(r.node_killed_at_s, 1),
        json_number(r.node_gap_s, 3), json_number(r.server_killed_at_s, 1),
        json_number(r.server_gap_s, 3), json_number(r.drained_at_s, 1), r.submitted,
        r.completed_once, r.completed_twice, r.failed, r.lost, r.task_id_changed, r.notices_again);
  }
  auto json = fmt::format(
      R"({{"benchmark":"amp-bench-cluster","via":"amp-servers over WebSocket on a 3-node JetStream cluster (replicas 3), amp::client",)"
      R"("tasks":{},"messages":{},"runs":{},"paced_tasks_per_s":{},"paced_s":{},"producers":{},"workers":{},"worker_slots":{},"inbox_pairs":{},)"
      R"("machine":{},"scale":{{{}}}{}{}}})",
      o.tasks, o.messages, o.runs, o.paced_rate, o.paced_s, k_producers, k_workers, k_worker_slots,
      k_pairs, machine_json(loadavg_before), scale_json, failover_json.empty() ? "" : ",",
      failover_json);
  std::ofstream(o.out) << json << "\n";
  std::printf("\nwritten to %s\n", o.out.c_str());
  return 0;
}

int main(int argc, char** argv) {
  auto o = parse(argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "amp-bench-cluster: %s\n", e.what());
    return 1;
  }
}
