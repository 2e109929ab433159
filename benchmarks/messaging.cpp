// amp-bench-messaging: inbox messages and topic fan-out through amp-server over WebSocket
// (issue 6), with amp::client sessions.
//
//   amp-bench-messaging [--backend jetstream|memory] [--runs R] [--messages N] [--window W]
//                       [--rates 1000,5000,10000] [--seconds S] [--subscribers 100,1000]
//                       [--fanout-deliveries D] [--fanout-rate R] [--quick] [--out FILE]
//
// Inbox: a sender session sends to a receiver session (to K in turn with --recipients K),
// which acks every `message` push. Sends to one recipient keep their order, so amp-server
// stores them one at a time; sends to K recipients are stored K at a time.
// Maximum messages/s with up to `--window` sends in flight, and the latency from just
// before a send to the push at the receiver at fixed offered loads (sends paced).
// Fan-out: one publisher and S subscriber sessions on one topic. Published and delivered
// events/s with publishes pipelined, and the latency from just before a publish to each
// `event` push at a fixed publish rate.
//
// It starts its own nats-server (temporary file store) for JetStream and amp-server (the
// binary built with it) on free loopback ports.

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "amp/client.hpp"
#include "support/body.hpp"
#include "support/nats_server.hpp"
#include "support/server_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using namespace amp::bench;
using steady = std::chrono::steady_clock;

// The longest any phase may take before the benchmark gives up.
constexpr auto k_phase_timeout = 180s;

struct options {
  std::string backend = "jetstream";
  int runs = 3;
  int messages = 20000;
  int window = 512;
  int recipients = 1;
  std::vector<int> rates = {1000, 5000, 10000};
  double seconds = 5;
  std::vector<int> subscribers = {100, 1000};
  long fanout_deliveries = 200000;
  // Publish rate of the latency measurement, one per subscriber count (the last repeats).
  std::vector<int> fanout_rates = {100, 10};
  bool inbox = true, fanout = true;
  std::string out = AMP_BENCH_MESSAGING_OUT;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "amp-bench-messaging: %s\n"
      "usage: amp-bench-messaging [--backend jetstream|memory] [--runs R] [--messages N]\n"
      "       [--window W] [--rates 1000,5000,10000] [--seconds S] [--subscribers 100,1000]\n"
      "       [--fanout-deliveries D] [--fanout-rates 100,10] [--only inbox|fanout]\n"
      "       [--recipients K]\n"
      "       [--quick] [--out FILE]\n"
      "defaults: jetstream, 3 runs, 20000 messages, window 512, 5 s per inbox rate,\n"
      "          200000 deliveries per fan-out throughput run; fan-out latency for 5 s at\n"
      "          100 events/s to 100 subscribers, 10 events/s to 1000 (--fanout-rates pairs\n"
      "          with --subscribers);\n"
      "--quick: 1 run, 3000 messages, 2 s per rate, 20000 deliveries, 2 s at the rate;\n"
      "--recipients K: the inbox sender sends to K receiver sessions in turn (default 1)\n",
      why.c_str());
  std::exit(why == "help" ? 0 : 2);
}

options parse(int argc, char** argv) {
  options o;
  bool quick = false;
  std::optional<int> runs, messages;
  std::optional<double> seconds;
  std::optional<long> deliveries;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--backend") {
      o.backend = value();
      if (o.backend != "jetstream" && o.backend != "memory")
        usage("--backend: jetstream or memory");
    } else if (a == "--runs") {
      runs = std::stoi(value());
    } else if (a == "--messages") {
      messages = std::stoi(value());
    } else if (a == "--window") {
      o.window = std::stoi(value());
    } else if (a == "--rates") {
      o.rates = int_list(value());
    } else if (a == "--seconds") {
      seconds = std::stod(value());
    } else if (a == "--recipients") {
      o.recipients = std::stoi(value());
      if (o.recipients < 1 || o.recipients > 100) usage("--recipients: 1 to 100");
    } else if (a == "--subscribers") {
      o.subscribers = int_list(value());
    } else if (a == "--fanout-deliveries") {
      deliveries = std::stol(value());
    } else if (a == "--fanout-rates") {
      o.fanout_rates = int_list(value());
    } else if (a == "--only") {
      auto only = value();
      if (only != "inbox" && only != "fanout") usage("--only: inbox or fanout");
      o.inbox = only == "inbox";
      o.fanout = only == "fanout";
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "-h" || a == "--help") {
      usage("help");
    } else {
      usage("unknown argument " + a);
    }
  }
  if (quick) {
    o.runs = 1;
    o.messages = 3000;
    o.seconds = 2;
    o.fanout_deliveries = 20000;
  }
  // Explicit values win over --quick, wherever they stand.
  if (runs) o.runs = *runs;
  if (messages) o.messages = *messages;
  if (seconds) o.seconds = *seconds;
  if (deliveries) o.fanout_deliveries = *deliveries;
  if (o.runs < 1 || o.messages < 1 || o.window < 1 || o.rates.empty() || o.seconds <= 0 ||
      o.fanout_deliveries < 1 || o.fanout_rates.empty())
    usage("bad values");
  for (int r : o.rates)
    if (r < 1) usage("bad rate");
  for (int s : o.subscribers)
    if (s < 1) usage("bad subscriber count");
  for (int r : o.fanout_rates)
    if (r < 1) usage("bad fan-out rate");
  return o;
}

using amp::bench::body_at;

double cpu_of_this_process() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// CPU of amp-server and of this process over a phase, in % of one core.
struct cpu_meter {
  pid_t server;
  double server0, self0;
  steady::time_point t0 = steady::now();
  explicit cpu_meter(pid_t pid)
      : server(pid), server0(cpu_seconds(pid)), self0(cpu_of_this_process()) {}
  std::pair<double, double> percent() const {
    double wall = std::chrono::duration<double>(steady::now() - t0).count();
    return {100 * (cpu_seconds(server) - server0) / wall,
            100 * (cpu_of_this_process() - self0) / wall};
  }
};

// Waits for an in-flight window slot; released by the reply handlers.
struct window_gate {
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  std::atomic<int> failed{0};
  std::string first_error;
  void acquire(int window) {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, k_phase_timeout, [&] { return in_flight < window; }))
      throw std::runtime_error("no reply to a request in flight for 180 s");
    ++in_flight;
  }
  void release(const amp::result<amp::client_frame>& r) {
    std::lock_guard lock(mu);
    if (!r && failed++ == 0) first_error = r.error().to_string();
    --in_flight;
    cv.notify_one();
  }
  void wait_idle() {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, k_phase_timeout, [&] { return in_flight == 0; }))
      throw std::runtime_error("replies missing after 180 s");
  }
  void check(const char* what) {
    std::lock_guard lock(mu);
    if (failed > 0)
      throw std::runtime_error(
          fmt::format("{}: {} requests failed, the first: {}", what, failed.load(), first_error));
  }
};

// ---- inbox --------------------------------------------------------------------------------

// The receiver's side: acks every message, counts them and records their latency.
struct receiver_state {
  steady::time_point origin;
  int recipients = 1;
  // The receiver of the i-th send: bob, or bob0 ... bob<K-1> in turn.
  std::string recipient(int i) const {
    return recipients == 1 ? std::string("bob") : fmt::format("bob{}", i % recipients);
  }
  std::mutex mu;
  std::vector<double> latencies_ms;
  countdown left;
  std::atomic<long> errors{0};
  std::string first_error;
  bool record = false;

  void reset(long n, bool record_latency) {
    std::lock_guard lock(mu);
    latencies_ms.clear();
    if (record_latency) latencies_ms.reserve(static_cast<std::size_t>(n));
    record = record_latency;
    std::lock_guard lock2(left.mu);
    left.left = n;
  }
};

void become_receiver(amp::client& bob, receiver_state& st) {
  bob.on_push([&bob, &st](const amp::client_frame& f) {
    if (f.op() == "error") {
      std::lock_guard lock(st.mu);
      if (st.errors++ == 0) st.first_error = f.text();
      return;
    }
    if (f.op() != "message") return;
    auto now = ns_since(st.origin);
    (void)bob.notify("ack", fmt::format(R"("seq":{})", f.int_at("/seq").value_or(0)));
    if (f.int_at("/delivery").value_or(1) != 1) return;  // a redelivery is not a new message
    auto t0 = f.int_at("/envelope/body/t0");
    {
      std::lock_guard lock(st.mu);
      if (st.record && t0) st.latencies_ms.push_back(static_cast<double>(now - *t0) / 1e6);
    }
    st.left.done();
  });
}

void wait_received(receiver_state& st, window_gate& gate, const char* what) {
  auto deadline = steady::now() + k_phase_timeout;
  while (!st.left.wait(std::chrono::seconds(1))) {
    // A failed send (the connection closed, say) fails the phase at once.
    gate.check(what);
    if (steady::now() > deadline) {
      std::lock_guard lock(st.left.mu);
      throw std::runtime_error(fmt::format("{}: {} messages not received after {} s", what,
                                           st.left.left, k_phase_timeout.count()));
    }
  }
  if (st.errors > 0)
    throw std::runtime_error(fmt::format("{}: error pushes, the first: {}", what, st.first_error));
}

struct inbox_max_result {
  double msgs_per_s = 0, seconds = 0, server_cpu = 0, bench_cpu = 0;
};

inbox_max_result inbox_max(amp::client& alice, receiver_state& st, pid_t server, int n,
                           int window) {
  st.reset(n, false);
  window_gate gate;
  cpu_meter cpu(server);
  auto start = steady::now();
  for (int i = 0; i < n; ++i) {
    gate.acquire(window);
    alice.async_request(
        "send", fmt::format(R"("to":"{}","type":"bench","body":{})", st.recipient(i), body_at(0)),
        [&gate](amp::result<amp::client_frame> r) { gate.release(r); });
  }
  wait_received(st, gate, "inbox throughput");
  double seconds = std::chrono::duration<double>(steady::now() - start).count();
  auto [server_cpu, bench_cpu] = cpu.percent();
  gate.wait_idle();
  gate.check("inbox throughput");
  return {n / seconds, seconds, server_cpu, bench_cpu};
}

struct latency_result {
  double p50 = 0, p99 = 0, p999 = 0, achieved = 0;
};

latency_result inbox_latency(amp::client& alice, receiver_state& st, double rate, int n,
                             int window) {
  st.reset(n, true);
  window_gate gate;
  auto interval = std::chrono::duration<double>(1.0 / rate);
  auto start = steady::now();
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_until(start +
                                  std::chrono::duration_cast<steady::duration>(interval * i));
    gate.acquire(window);
    alice.async_request("send",
                        fmt::format(R"("to":"{}","type":"bench","body":{})", st.recipient(i),
                                    body_at(ns_since(st.origin))),
                        [&gate](amp::result<amp::client_frame> r) { gate.release(r); });
  }
  auto sent_seconds = std::chrono::duration<double>(steady::now() - start).count();
  wait_received(st, gate, "inbox latency");
  gate.wait_idle();
  gate.check("inbox latency");
  std::vector<double> v;
  {
    std::lock_guard lock(st.mu);
    v = st.latencies_ms;
  }
  std::sort(v.begin(), v.end());
  return {percentile(v, 0.50), percentile(v, 0.99), percentile(v, 0.999), n / sent_seconds};
}

// ---- fan-out ------------------------------------------------------------------------------

// One subscriber session: counts the events of the current phase and records latencies.
struct subscriber {
  std::unique_ptr<amp::client> c;
  std::vector<double> latencies_ms;  // written on the client's I/O thread during a phase
};

struct fanout_state {
  steady::time_point origin;
  countdown left;  // deliveries still expected in this phase
  std::atomic<bool> record{false};
  std::mutex mu;
  std::atomic<long> dropped{0};
  std::atomic<long> errors{0};
  std::string first_problem;
  steady::time_point last_delivery;

  void problem(const std::string& what) {
    std::lock_guard lock(mu);
    if (first_problem.empty()) first_problem = what;
  }
};

// Runs `f(i)` for i in [0, n) on `threads` threads.
template <class F>
void parallel_for(int n, int threads, F f) {
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  std::mutex mu;
  std::exception_ptr failure;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) {
        try {
          f(i);
        } catch (...) {
          std::lock_guard lock(mu);
          if (!failure) failure = std::current_exception();
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

struct fanout_throughput_result {
  double published_per_s = 0, delivered_per_s = 0, server_cpu = 0, bench_cpu = 0;
};

struct fanout_latency_result {
  double p50 = 0, p99 = 0, p999 = 0, published_per_s = 0, delivered_per_s = 0;
};

class fanout_bench {
 public:
  fanout_bench(const std::string& url, int subscribers, int run_tag) : subs_(subscribers) {
    auto ns = fmt::format("fan{}s{}r{}", ::getpid() % 100000, subscribers, run_tag);
    st_.origin = steady::now();
    publisher_ = connect(url, "publisher", ns);
    auto start = steady::now();
    parallel_for(subscribers, 8, [&](int i) {
      auto& s = subs_[static_cast<std::size_t>(i)];
      s.c = connect(url, fmt::format("sub{:05}", i), ns);
      s.c->on_push([this, &s](const amp::client_frame& f) { on_push(s, f); });
      auto sub = s.c->subscribe("bench.fan", {}, "s1");
      if (!sub) throw std::runtime_error("subscribe: " + sub.error().to_string());
    });
    setup_seconds_ = std::chrono::duration<double>(steady::now() - start).count();
  }

  ~fanout_bench() {
    publisher_.reset();
    // Each client closes with a closing handshake: in parallel.
    parallel_for(static_cast<int>(subs_.size()), 8, [&](int i) {
      auto& s = subs_[static_cast<std::size_t>(i)];
      if (s.c) s.c->on_push({});
      s.c.reset();
    });
  }

  double setup_seconds() const { return setup_seconds_; }

  fanout_throughput_result throughput(pid_t server, int events, int window) {
    begin(events, false);
    window_gate gate;
    cpu_meter cpu(server);
    auto start = steady::now();
    for (int i = 0; i < events; ++i) {
      gate.acquire(window);
      publisher_->async_request(
          "publish", fmt::format(R"("topic":"bench.fan","type":"bench","body":{})", body_at(0)),
          [&gate](amp::result<amp::client_frame> r) { gate.release(r); });
    }
    gate.wait_idle();
    double published = std::chrono::duration<double>(steady::now() - start).count();
    gate.check("fan-out throughput");
    finish(gate, "fan-out throughput");
    double delivered = std::chrono::duration<double>(st_.last_delivery - start).count();
    auto [server_cpu, bench_cpu] = cpu.percent();
    return {events / published,
            static_cast<double>(events) * static_cast<double>(subs_.size()) / delivered, server_cpu,
            bench_cpu};
  }

  fanout_latency_result latency(double rate, int events, int window) {
    begin(events, true);
    window_gate gate;
    auto interval = std::chrono::duration<double>(1.0 / rate);
    auto start = steady::now();
    for (int i = 0; i < events; ++i) {
      std::this_thread::sleep_until(start +
                                    std::chrono::duration_cast<steady::duration>(interval * i));
      gate.acquire(window);
      publisher_->async_request("publish",
                                fmt::format(R"("topic":"bench.fan","type":"bench","body":{})",
                                            body_at(ns_since(st_.origin))),
                                [&gate](amp::result<amp::client_frame> r) { gate.release(r); });
    }
    double published = std::chrono::duration<double>(steady::now() - start).count();
    gate.wait_idle();
    gate.check("fan-out latency");
    finish(gate, "fan-out latency");
    double delivered = std::chrono::duration<double>(st_.last_delivery - start).count();
    std::vector<double> all;
    all.reserve(static_cast<std::size_t>(events) * subs_.size());
    for (auto& s : subs_) all.insert(all.end(), s.latencies_ms.begin(), s.latencies_ms.end());
    std::sort(all.begin(), all.end());
    return {percentile(all, 0.50), percentile(all, 0.99), percentile(all, 0.999),
            events / published,
            static_cast<double>(events) * static_cast<double>(subs_.size()) / delivered};
  }

 private:
  void on_push(subscriber& s, const amp::client_frame& f) {
    if (f.op() == "event") {
      auto now = ns_since(st_.origin);
      if (st_.record) {
        if (auto t0 = f.int_at("/envelope/body/t0"))
          s.latencies_ms.push_back(static_cast<double>(now - *t0) / 1e6);
      }
      std::lock_guard lock(st_.left.mu);
      st_.last_delivery = steady::now();
      if (--st_.left.left == 0) st_.left.cv.notify_all();
      return;
    }
    if (f.op() == "sub_dropped") {
      ++st_.dropped;
      st_.problem("a subscriber was dropped: " + f.text());
      std::lock_guard lock(st_.left.mu);
      st_.left.cv.notify_all();
    } else if (f.op() == "error") {
      ++st_.errors;
      st_.problem("error push: " + f.text());
    }
  }

  void begin(int events, bool record) {
    for (auto& s : subs_) {
      s.latencies_ms.clear();
      if (record) s.latencies_ms.reserve(static_cast<std::size_t>(events));
    }
    st_.record = record;
    std::lock_guard lock(st_.left.mu);
    st_.left.left = static_cast<long>(events) * static_cast<long>(subs_.size());
  }

  void finish(window_gate& gate, const char* what) {
    auto deadline = steady::now() + k_phase_timeout;
    bool done = false;
    long left = 0;
    while (true) {
      std::unique_lock lock(st_.left.mu);
      done = st_.left.cv.wait_for(lock, 1s, [&] { return st_.left.left <= 0 || st_.dropped > 0; });
      left = st_.left.left;
      lock.unlock();
      if (done || steady::now() > deadline) break;
      gate.check(what);  // a failed publish fails the phase at once
    }
    if (st_.dropped > 0 || st_.errors > 0) {
      std::lock_guard plock(st_.mu);
      throw std::runtime_error(fmt::format("{}: {} subscriptions dropped, {} errors; {}", what,
                                           st_.dropped.load(), st_.errors.load(),
                                           st_.first_problem));
    }
    if (!done) {
      throw std::runtime_error(
          fmt::format("{}: {} deliveries missing after {} s", what, left, k_phase_timeout.count()));
    }
  }

  // Declared first: the clients' handlers use it until the clients are gone.
  fanout_state st_;
  std::vector<subscriber> subs_;
  std::unique_ptr<amp::client> publisher_;
  double setup_seconds_ = 0;
};

struct fanout_figures {
  int subscribers = 0;
  int rate = 0;
  int events = 0;
  int latency_events = 0;
  double setup_s = 0;
  std::vector<double> published, delivered, server_cpu, bench_cpu;
  std::vector<double> l_published, l_delivered, p50, p99, p999;
};

void print_row(const std::string& name, const summary& s, const char* format = "%12.0f") {
  std::printf("%-44s", name.c_str());
  for (double v : {s.min, s.median, s.max}) std::printf(format, v);
  std::printf("\n");
}

int measure(const options& o, server_process& server);

int run(const options& o) {
  std::optional<amp::testing::nats_server> nats;
  if (o.backend == "jetstream") nats.emplace(amp::testing::nats_server::start());
  auto port = static_cast<std::uint16_t>(amp::testing::free_port());
  server_process server(nats ? nats->url() : std::string(), port, "amp-bench-messaging");
  try {
    return measure(o, server);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(e.what()) + "\namp-server log tail:\n" +
                             server.log_tail());
  }
}

int measure(const options& o, server_process& server) {
  const auto url = server.url();
  const auto loadavg_before = read_first_line("/proc/loadavg");
  const auto rlimit = raise_fd_limit();
  if (rlimit < 2200)
    std::fprintf(stderr, "warning: only %llu open files allowed\n",
                 static_cast<unsigned long long>(rlimit));

  // ---- inbox
  std::vector<double> max_rates, max_server_cpu, max_bench_cpu;
  std::vector<std::vector<latency_result>> lat(o.rates.size());
  for (int r = 0; o.inbox && r < o.runs; ++r) {
    auto ns = fmt::format("inbox{}r{}", ::getpid() % 100000, r);
    receiver_state st;
    st.origin = steady::now();
    st.recipients = o.recipients;
    std::vector<std::unique_ptr<amp::client>> bobs;
    for (int k = 0; k < o.recipients; ++k) {
      bobs.push_back(connect(url, st.recipient(k), ns));
      become_receiver(*bobs.back(), st);
    }
    auto alice = connect(url, "alice", ns);
    // Warm-up: the streams and consumers exist, the connections are hot.
    inbox_max(*alice, st, server.pid(), std::min(500, o.messages), o.window);
    auto m = inbox_max(*alice, st, server.pid(), o.messages, o.window);
    std::printf(
        "inbox max run=%d: %.0f msgs/s (%d in %.2f s; amp-server %.0f%% of a core, "
        "benchmark %.0f%%)\n",
        r + 1, m.msgs_per_s, o.messages, m.seconds, m.server_cpu, m.bench_cpu);
    std::fflush(stdout);
    max_rates.push_back(m.msgs_per_s);
    max_server_cpu.push_back(m.server_cpu);
    max_bench_cpu.push_back(m.bench_cpu);
    for (std::size_t i = 0; i < o.rates.size(); ++i) {
      int n = std::max(1, static_cast<int>(o.rates[i] * o.seconds));
      auto l = inbox_latency(*alice, st, o.rates[i], n, o.window);
      std::printf(
          "inbox latency at %d/s run=%d: achieved %.0f/s, p50 %.2f ms, p99 %.2f ms, "
          "p99.9 %.2f ms (%d messages)\n",
          o.rates[i], r + 1, l.achieved, l.p50, l.p99, l.p999, n);
      std::fflush(stdout);
      lat[i].push_back(l);
    }
    for (auto& bob : bobs) bob->on_push({});
  }

  // ---- fan-out
  std::vector<fanout_figures> fan;
  for (std::size_t k = 0; o.fanout && k < o.subscribers.size(); ++k) {
    const int subs = o.subscribers[k];
    fanout_figures f;
    f.subscribers = subs;
    f.rate = o.fanout_rates[std::min(k, o.fanout_rates.size() - 1)];
    f.events = static_cast<int>(std::max<long>(10, o.fanout_deliveries / subs));
    f.latency_events = std::max(1, static_cast<int>(f.rate * o.seconds));
    fanout_bench bench(url, subs, 0);
    f.setup_s = bench.setup_seconds();
    std::printf("fan-out %d subscribers: connected and subscribed in %.2f s\n", subs, f.setup_s);
    std::fflush(stdout);
    bench.throughput(server.pid(), std::min(f.events, 20), o.window);  // warm-up
    for (int r = 0; r < o.runs; ++r) {
      auto t = bench.throughput(server.pid(), f.events, o.window);
      std::printf(
          "fan-out %d subs run=%d: published %.0f events/s, delivered %.0f events/s "
          "(%d events; amp-server %.0f%% of a core, benchmark %.0f%%)\n",
          subs, r + 1, t.published_per_s, t.delivered_per_s, f.events, t.server_cpu, t.bench_cpu);
      std::fflush(stdout);
      f.published.push_back(t.published_per_s);
      f.delivered.push_back(t.delivered_per_s);
      f.server_cpu.push_back(t.server_cpu);
      f.bench_cpu.push_back(t.bench_cpu);
      auto l = bench.latency(f.rate, f.latency_events, o.window);
      std::printf(
          "fan-out %d subs latency at %d events/s run=%d: delivered %.0f/s, p50 %.2f "
          "ms, p99 %.2f ms, p99.9 %.2f ms\n",
          subs, f.rate, r + 1, l.delivered_per_s, l.p50, l.p99, l.p999);
      std::fflush(stdout);
      f.l_published.push_back(l.published_per_s);
      f.l_delivered.push_back(l.delivered_per_s);
      f.p50.push_back(l.p50);
      f.p99.push_back(l.p99);
      f.p999.push_back(l.p999);
    }
    fan.push_back(std::move(f));
  }

  // ---- summary
  std::printf("\namp-server messaging (%s backend, %d runs)\n", o.backend.c_str(), o.runs);
  std::printf("%-44s%12s%12s%12s\n", "figure", "min", "median", "max");
  if (o.inbox)
    print_row("inbox msgs/s (max, window " + std::to_string(o.window) + ")", summarize(max_rates));
  for (std::size_t i = 0; o.inbox && i < o.rates.size(); ++i) {
    std::vector<double> a, p50, p99, p999;
    for (auto& l : lat[i]) {
      a.push_back(l.achieved);
      p50.push_back(l.p50);
      p99.push_back(l.p99);
      p999.push_back(l.p999);
    }
    print_row(fmt::format("inbox at {}/s: achieved/s", o.rates[i]), summarize(a));
    print_row(fmt::format("inbox at {}/s: p50 ms", o.rates[i]), summarize(p50), "%12.2f");
    print_row(fmt::format("inbox at {}/s: p99 ms", o.rates[i]), summarize(p99), "%12.2f");
    print_row(fmt::format("inbox at {}/s: p99.9 ms", o.rates[i]), summarize(p999), "%12.2f");
  }
  for (auto& f : fan) {
    print_row(fmt::format("fan-out {} subs: published events/s", f.subscribers),
              summarize(f.published));
    print_row(fmt::format("fan-out {} subs: delivered events/s", f.subscribers),
              summarize(f.delivered));
    print_row(fmt::format("fan-out {} subs at {}/s: p50 ms", f.subscribers, f.rate),
              summarize(f.p50), "%12.2f");
    print_row(fmt::format("fan-out {} subs at {}/s: p99 ms", f.subscribers, f.rate),
              summarize(f.p99), "%12.2f");
  }

  // ---- JSON
  std::string latency_json;
  for (std::size_t i = 0; o.inbox && i < o.rates.size(); ++i) {
    std::vector<double> a, p50, p99, p999;
    for (auto& l : lat[i]) {
      a.push_back(l.achieved);
      p50.push_back(l.p50);
      p99.push_back(l.p99);
      p999.push_back(l.p999);
    }
    latency_json += fmt::format(
        R"({}{{"offered_per_s":{},"messages":{},"achieved_per_s":{},"p50_ms":{},"p99_ms":{},"p999_ms":{}}})",
        i == 0 ? "" : ",", o.rates[i], std::max(1, static_cast<int>(o.rates[i] * o.seconds)),
        json_of(summarize(a)), json_of(summarize(p50)), json_of(summarize(p99)),
        json_of(summarize(p999)));
  }
  std::string fan_json;
  for (auto& f : fan) {
    fan_json += fmt::format(
        R"({}{{"subscribers":{},"setup_s":{:.2f},)"
        R"("throughput":{{"events":{},"window":{},"published_per_s":{},"delivered_per_s":{},)"
        R"("server_cpu_percent_of_core":{},"benchmark_cpu_percent_of_core":{}}},)"
        R"("latency":{{"offered_events_per_s":{},"events":{},"published_per_s":{},)"
        R"("delivered_per_s":{},"p50_ms":{},"p99_ms":{},"p999_ms":{}}}}})",
        fan_json.empty() ? "" : ",", f.subscribers, f.setup_s, f.events, o.window,
        json_of(summarize(f.published)), json_of(summarize(f.delivered)),
        json_of(summarize(f.server_cpu)), json_of(summarize(f.bench_cpu)), f.rate, f.latency_events,
        json_of(summarize(f.l_published)), json_of(summarize(f.l_delivered)),
        json_of(summarize(f.p50)), json_of(summarize(f.p99)), json_of(summarize(f.p999)));
  }
  std::string inbox_json = "null";
  if (o.inbox) {
    inbox_json = fmt::format(
        R"({{"messages":{},"window":{},"recipients":{},"max_msgs_per_s":{},)"
        R"("server_cpu_percent_of_core":{},"benchmark_cpu_percent_of_core":{},"latency":[{}]}})",
        o.messages, o.window, o.recipients, json_of(summarize(max_rates)),
        json_of(summarize(max_server_cpu)), json_of(summarize(max_bench_cpu)), latency_json);
  }
  auto json = fmt::format(
      R"({{"benchmark":"amp-bench-messaging","via":"amp-server over WebSocket, amp::client",)"
      R"("backend":"{}","storage":"{}","runs":{},"body_bytes":{},"machine":{},)"
      R"("inbox":{},"fanout":[{}]}})",
      o.backend, o.backend == "jetstream" ? "file" : "memory", o.runs, body_at(0).size(),
      machine_json(loadavg_before), inbox_json, fan_json);
  std::ofstream(o.out) << json << "\n";
  std::printf("\nwritten to %s\n", o.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto o = parse(argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "amp-bench-messaging: %s\n", e.what());
    return 1;
  }
}
