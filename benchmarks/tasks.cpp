// amp-bench-tasks: the task lifecycle through amp-server over WebSocket (issue 6 item 2):
// a producer submits tasks, a worker with S slots claims and completes each offer, and the
// producer counts the `amp.task.completed` notices in its inbox. Measures tasks/s at 1, 8
// and 64 slots (submits pipelined), with amp-server's and nats-server's CPU, amp-server's
// context switches and nats-server's incoming messages per task, and submit-to-result
// latency at a fixed offered load (with the same costs per task at that load).
//
//   amp-bench-tasks [--backend jetstream|memory] [--tasks N] [--runs R] [--slots LIST]
//                   [--rate R] [--latency-tasks N] [--latency-trace CSV] [--quick]
//                   [--out FILE]
//
// It starts its own nats-server (temporary file store) and amp-server (the binary built
// with it, or $AMP_BENCH_SERVER) on free loopback ports, and the clients are amp::client
// connections.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
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

struct options {
  std::string backend = "jetstream";
  int tasks = 20000;
  int runs = 3;
  std::vector<int> slots = {1, 8, 64};
  double rate = 1000;
  int latency_tasks = 10000;
  int window = 512;
  std::string out = AMP_BENCH_TASKS_OUT;
  std::string latency_trace;  // CSV of every latency run's tasks, when set
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "amp-bench-tasks: %s\n"
               "usage: amp-bench-tasks [--backend jetstream|memory] [--tasks N] [--runs R]\n"
               "       [--slots 1,8,64] [--rate TASKS_PER_S] [--latency-tasks N] [--window W]\n"
               "       [--latency-trace CSV] [--quick] [--out FILE]\n",
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
    if (a == "--backend") {
      o.backend = value();
      if (o.backend != "jetstream" && o.backend != "memory")
        usage("--backend: jetstream or memory");
    } else if (a == "--tasks") {
      o.tasks = std::stoi(value());
    } else if (a == "--runs") {
      o.runs = std::stoi(value());
    } else if (a == "--rate") {
      o.rate = std::stod(value());
    } else if (a == "--latency-tasks") {
      o.latency_tasks = std::stoi(value());
    } else if (a == "--latency-trace") {
      o.latency_trace = value();
    } else if (a == "--window") {
      o.window = std::stoi(value());
    } else if (a == "--slots") {
      o.slots = amp::bench::int_list(value());
    } else if (a == "--quick") {
      o.tasks = 3000;
      o.runs = 1;
      o.latency_tasks = 3000;
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "-h" || a == "--help") {
      usage("help");
    } else {
      usage("unknown argument " + a);
    }
  }
  if (o.tasks < 1 || o.runs < 1 || o.slots.empty() || o.rate <= 0 || o.window < 1)
    usage("bad values");
  return o;
}

// A worker that claims and completes every offer, with the task's body as its result; a
// refusal that is not expected_refusal aborts `run`.
void become_worker(amp::client& w, int slots, countdown& run) {
  w.on_push([&w, &run](const amp::client_frame& f) {
    if (f.op() != "offer") return;
    auto task = f.string_at("/task").value_or("");
    auto body = f.raw_at("/envelope/body").value_or("null");
    auto claim = fmt::format(R"("task":"{}")", task);
    w.async_request("claim", claim, [&w, &run, task, body](amp::result<amp::client_frame> r) {
      if (!r) {
        if (!expected_refusal(r.error())) run.abort("claim: " + r.error().to_string());
        return;
      }
      w.async_request("complete", fmt::format(R"("task":"{}","result":{})", task, body),
                      [&run](amp::result<amp::client_frame> done) {
                        if (!done && !expected_refusal(done.error())) {
                          run.abort("complete: " + done.error().to_string());
                        }
                      });
    });
  });
  auto reg = w.register_worker({"bench"}, slots);
  if (!reg) throw std::runtime_error("register: " + reg.error().to_string());
}

using amp::bench::body_at;

// What the processes under test have spent so far: CPU of amp-server and nats-server,
// amp-server's voluntary context switches, the messages nats-server received (-1 where
// there is no such process or no monitoring port), and the CPU of this process (the
// producer's and the worker's `amp::client`, sharing the machine with the servers).
struct spent {
  double server_cpu = -1, server_switches = -1, nats_cpu = -1, nats_msgs = -1, client_cpu = -1;
};

struct processes {
  pid_t server = -1;
  pid_t nats = -1;
  int nats_http_port = -1;

  spent now() const {
    spent s;
    s.server_cpu = cpu_seconds(server);
    s.server_switches = context_switches(server);
    if (nats > 0) {
      s.nats_cpu = cpu_seconds(nats);
      s.nats_msgs = server_in_msgs(nats_http_port);
    }
    s.client_cpu = amp::bench::cpu_seconds_self();
    return s;
  }
};

// Per task between two readings; -1 for what either reading lacks.
spent per_task(const spent& before, const spent& after, int n) {
  auto per = [n](double a, double b, double scale) {
    return a < 0 || b < 0 ? -1.0 : (b - a) * scale / n;
  };
  return {per(before.server_cpu, after.server_cpu, 1e6),
          per(before.server_switches, after.server_switches, 1),
          per(before.nats_cpu, after.nats_cpu, 1e6), per(before.nats_msgs, after.nats_msgs, 1),
          per(before.client_cpu, after.client_cpu, 1e6)};
}

struct throughput_result {
  double tasks_per_s = 0;
  double seconds = 0;
  spent costs;  // per task
};

// Submits `n` tasks with at most `window` submits in flight; returns when every completion
// notice arrived.
throughput_result run_throughput(const std::string& url, const processes& measured, int n,
                                 int slots, int window, int run) {
  auto ns = fmt::format("tp{}s{}r{}", ::getpid() % 100000, slots, run);
  countdown finished;
  finished.left = n;
  auto worker = connect(url, "worker", ns);
  become_worker(*worker, slots, finished);
  heartbeats alive(*worker);
  auto producer = connect(url, "producer", ns);
  producer->on_push([&](const amp::client_frame& f) {
    if (f.op() != "message") return;
    (void)producer->notify("ack", fmt::format(R"("seq":{})", f.int_at("/seq").value_or(0)));
    if (f.string_at("/envelope/type") == "amp.task.completed") finished.done();
  });
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  auto before = measured.now();
  auto start = steady::now();
  for (int i = 0; i < n; ++i) {
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return in_flight < window; });
      ++in_flight;
    }
    auto fields = fmt::format(R"("job":"bench","body":{})", body_at(0));
    producer->async_request("submit", fields, [&](amp::result<amp::client_frame> r) {
      if (!r) finished.abort("submit: " + r.error().to_string());
      std::lock_guard lock(mu);
      --in_flight;
      cv.notify_one();
    });
  }
  if (!finished.wait(600s)) {
    throw std::runtime_error("throughput run did not finish: " + finished.unfinished());
  }
  double seconds = std::chrono::duration<double>(steady::now() - start).count();
  auto costs = per_task(before, measured.now(), n);
  producer->on_push({});
  worker->on_push({});
  return {n / seconds, seconds, costs};
}

// One task of a latency run: when it was submitted (ms from the run's start) and its latency.
struct traced_task {
  double submitted_ms = 0, latency_ms = 0;
};

struct latency_result {
  double p50_ms = 0, p99_ms = 0, p999_ms = 0, achieved_rate = 0;
  spent costs;                     // per task, at the offered load
  std::vector<traced_task> tasks;  // in order of completion
};

// Submits at `rate` tasks/s (one at a time, paced) with 8 worker slots; the latency of a
// task is from its submit to its completion notice at the producer.
latency_result run_latency(const std::string& url, const processes& measured, int n, double rate,
                           int run) {
  auto ns = fmt::format("lat{}r{}", ::getpid() % 100000, run);
  countdown finished;
  finished.left = n;
  auto worker = connect(url, "worker", ns);
  become_worker(*worker, 8, finished);
  heartbeats alive(*worker);
  auto producer = connect(url, "producer", ns);
  auto origin = steady::now();
  std::vector<traced_task> traced;
  traced.reserve(static_cast<std::size_t>(n));
  std::mutex mu;
  producer->on_push([&](const amp::client_frame& f) {
    if (f.op() != "message") return;
    (void)producer->notify("ack", fmt::format(R"("seq":{})", f.int_at("/seq").value_or(0)));
    if (f.string_at("/envelope/type") != "amp.task.completed") return;
    auto t0 = f.int_at("/envelope/body/result/t0");
    if (!t0) return;
    auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now() - origin).count();
    {
      std::lock_guard lock(mu);
      traced.push_back({static_cast<double>(*t0) / 1e6, static_cast<double>(now - *t0) / 1e6});
    }
    finished.done();
  });
  auto interval = std::chrono::duration<double>(1.0 / rate);
  auto before = measured.now();
  auto start = steady::now();
  for (int i = 0; i < n; ++i) {
    auto due = start + std::chrono::duration_cast<steady::duration>(interval * i);
    std::this_thread::sleep_until(due);
    auto t0 = std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now() - origin).count();
    producer->async_request("submit", fmt::format(R"("job":"bench","body":{})", body_at(t0)),
                            [&finished](amp::result<amp::client_frame> r) {
                              if (!r) finished.abort("submit: " + r.error().to_string());
                            });
  }
  auto sent_seconds = std::chrono::duration<double>(steady::now() - start).count();
  if (!finished.wait(600s)) {
    throw std::runtime_error("latency run did not finish: " + finished.unfinished());
  }
  auto costs = per_task(before, measured.now(), n);
  producer->on_push({});
  worker->on_push({});
  std::vector<double> latencies;
  for (const auto& t : traced) latencies.push_back(t.latency_ms);
  std::sort(latencies.begin(), latencies.end());
  auto pct = [&](double p) {
    auto i = static_cast<std::size_t>(p * static_cast<double>(latencies.size() - 1));
    return latencies[i];
  };
  return {pct(0.50), pct(0.99), pct(0.999), n / sent_seconds, costs, std::move(traced)};
}

}  // namespace

int run(const options& o) {
  std::optional<amp::testing::nats_server> nats;
  processes measured;
  if (o.backend == "jetstream") {
    measured.nats_http_port = amp::testing::free_port();
    nats.emplace(amp::testing::nats_server::start(
        {.jetstream = true,
         .extra_config = fmt::format("http_port: {}\n", measured.nats_http_port)}));
    measured.nats = nats->pid();
  }
  auto port = static_cast<std::uint16_t>(amp::testing::free_port());
  server_process server(nats ? nats->url() : std::string(), port, "amp-bench-tasks");
  measured.server = server.pid();
  const auto url = server.url();
  auto loadavg_before = read_first_line("/proc/loadavg");

  std::map<int, summary> throughput;
  std::map<int, std::map<std::string, summary>> costs;  // per slots, per figure
  for (int slots : o.slots) {
    std::vector<double> v;
    std::map<std::string, std::vector<double>> c;
    for (int r = 0; r < o.runs; ++r) {
      auto t = run_throughput(url, measured, o.tasks, slots, o.window, r);
      std::printf(
          "throughput slots=%d run=%d: %.0f tasks/s (%d tasks in %.2f s); per task: amp-server "
          "%.0f us CPU, %.1f context switches; nats-server %.0f us CPU, %.1f messages in; "
          "clients %.0f us CPU\n",
          slots, r + 1, t.tasks_per_s, o.tasks, t.seconds, t.costs.server_cpu,
          t.costs.server_switches, t.costs.nats_cpu, t.costs.nats_msgs, t.costs.client_cpu);
      std::fflush(stdout);
      v.push_back(t.tasks_per_s);
      c["amp_server_cpu_us"].push_back(t.costs.server_cpu);
      c["amp_server_context_switches"].push_back(t.costs.server_switches);
      c["clients_cpu_us"].push_back(t.costs.client_cpu);
      if (nats) {
        c["nats_server_cpu_us"].push_back(t.costs.nats_cpu);
        c["nats_server_in_msgs"].push_back(t.costs.nats_msgs);
      }
    }
    throughput[slots] = summarize(v);
    for (auto& [figure, runs] : c) costs[slots][figure] = summarize(runs);
  }
  std::vector<double> p50, p99, p999, achieved;
  std::map<std::string, std::vector<double>> paced;  // costs per task at the offered load
  std::optional<std::ofstream> trace;
  if (!o.latency_trace.empty()) {
    trace.emplace(o.latency_trace);
    if (!*trace) throw std::runtime_error("cannot write " + o.latency_trace);
    *trace << "run,submitted_ms,latency_ms\n";
  }
  for (int r = 0; r < o.runs; ++r) {
    auto l = run_latency(url, measured, o.latency_tasks, o.rate, r);
    if (trace) {
      for (const auto& t : l.tasks)
        *trace << fmt::format("{},{:.3f},{:.3f}\n", r + 1, t.submitted_ms, t.latency_ms);
    }
    std::printf(
        "latency at %.0f tasks/s run=%d: p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms; per task: "
        "amp-server %.0f us CPU, %.1f context switches; nats-server %.0f us CPU, %.1f messages "
        "in; clients %.0f us CPU\n",
        o.rate, r + 1, l.p50_ms, l.p99_ms, l.p999_ms, l.costs.server_cpu, l.costs.server_switches,
        l.costs.nats_cpu, l.costs.nats_msgs, l.costs.client_cpu);
    std::fflush(stdout);
    paced["amp_server_cpu_us"].push_back(l.costs.server_cpu);
    paced["amp_server_context_switches"].push_back(l.costs.server_switches);
    paced["clients_cpu_us"].push_back(l.costs.client_cpu);
    if (nats) {
      paced["nats_server_cpu_us"].push_back(l.costs.nats_cpu);
      paced["nats_server_in_msgs"].push_back(l.costs.nats_msgs);
    }
    p50.push_back(l.p50_ms);
    p99.push_back(l.p99_ms);
    p999.push_back(l.p999_ms);
    achieved.push_back(l.achieved_rate);
  }

  std::printf("\namp-server task lifecycle (%s backend, %d tasks per run, %d runs)\n",
              o.backend.c_str(), o.tasks, o.runs);
  std::printf("%-24s %12s %12s %12s\n", "figure", "min", "median", "max");
  for (auto& [slots, s] : throughput) {
    std::printf("%-24s %12.0f %12.0f %12.0f\n", fmt::format("tasks/s, {} slots", slots).c_str(),
                s.min, s.median, s.max);
  }
  auto s50 = summarize(p50), s99 = summarize(p99), s999 = summarize(p999);
  std::printf("%-24s %12.2f %12.2f %12.2f\n", fmt::format("p50 ms at {:.0f}/s", o.rate).c_str(),
              s50.min, s50.median, s50.max);
  std::printf("%-24s %12.2f %12.2f %12.2f\n", fmt::format("p99 ms at {:.0f}/s", o.rate).c_str(),
              s99.min, s99.median, s99.max);

  for (auto& [slots, figures] : costs) {
    for (auto& [figure, s] : figures) {
      std::printf("%-24s %12.1f %12.1f %12.1f\n",
                  fmt::format("{}, {} slots", figure, slots).c_str(), s.min, s.median, s.max);
    }
  }
  std::string paced_json;
  for (auto& [figure, runs] : paced) {
    auto s = summarize(runs);
    std::printf("%-24s %12.1f %12.1f %12.1f\n",
                fmt::format("{}, at {:.0f}/s", figure, o.rate).c_str(), s.min, s.median, s.max);
    paced_json += (paced_json.empty() ? "" : ",") + fmt::format(R"("{}":{})", figure, json_of(s));
  }

  std::string tp, per;
  for (auto& [slots, s] : throughput)
    tp += (tp.empty() ? "" : ",") + fmt::format(R"("{}":{})", slots, json_of(s));
  for (auto& [slots, figures] : costs) {
    std::string f;
    for (auto& [figure, s] : figures)
      f += (f.empty() ? "" : ",") + fmt::format(R"("{}":{})", figure, json_of(s));
    per += (per.empty() ? "" : ",") + fmt::format(R"("{}":{{{}}})", slots, f);
  }
  auto json = fmt::format(
      R"({{"benchmark":"amp-bench-tasks","via":"amp-server over WebSocket, amp::client","backend":"{}",)"
      R"("storage":"file","tasks":{},"runs":{},"window":{},"body_bytes":{},)"
      R"("machine":{},)"
      R"("throughput_tasks_per_s":{{{}}},"per_task":{{{}}},)"
      R"("latency":{{"offered_tasks_per_s":{},"tasks":{},"worker_slots":8,"achieved_tasks_per_s":{},)"
      R"("p50_ms":{},"p99_ms":{},"p999_ms":{},"per_task":{{{}}}}}}})",
      o.backend, o.tasks, o.runs, o.window, body_at(0).size(), machine_json(loadavg_before), tp,
      per, o.rate, o.latency_tasks, json_of(summarize(achieved)), json_of(s50), json_of(s99),
      json_of(s999), paced_json);
  std::ofstream(o.out) << json << "\n";
  std::printf("\nwritten to %s\n", o.out.c_str());
  return 0;
}

int main(int argc, char** argv) {
  auto o = parse(argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "amp-bench-tasks: %s\n", e.what());
    return 1;
  }
}
