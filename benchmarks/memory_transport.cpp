// Micro-benchmark of the memory transport: publish, fetch+ack and KV update per second,
// each reported beside a baseline measured in the same process: the same work done on
// plain standard containers under one mutex (no subjects, timers, dedup or handlers).
// The ratio says what the emulation of JetStream semantics costs over bare bookkeeping.
//
// Usage: amp-bench-memory_transport [--messages N] [--runs R]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "amp/transport/memory.hpp"

namespace {

using bench_clock = std::chrono::steady_clock;

struct figure {
  const char* name;
  double amp_per_s;
  double baseline_per_s;
};

template <class F>
double per_second(std::size_t n, F&& body) {
  auto start = bench_clock::now();
  body();
  std::chrono::duration<double> took = bench_clock::now() - start;
  return static_cast<double>(n) / took.count();
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "benchmark failed: %s\n", what);
    std::exit(1);
  }
}

// The baseline: a queue and a versioned map with the minimum of bookkeeping.
struct baseline {
  std::mutex mu;
  std::uint64_t seq = 0;
  std::map<std::uint64_t, std::string> queue;
  std::map<std::uint64_t, int> pending;
  std::unordered_map<std::string, std::pair<std::string, std::uint64_t>> kv;
  std::uint64_t kv_seq = 0;

  std::uint64_t publish(std::string data) {
    std::lock_guard lock(mu);
    queue.emplace(++seq, std::move(data));
    return seq;
  }
  std::vector<std::pair<std::uint64_t, std::string>> fetch(std::size_t batch) {
    std::lock_guard lock(mu);
    std::vector<std::pair<std::uint64_t, std::string>> out;
    for (auto it = queue.begin(); it != queue.end() && out.size() < batch; ++it) {
      if (pending.count(it->first)) continue;
      pending.emplace(it->first, 1);
      out.emplace_back(it->first, it->second);
    }
    return out;
  }
  void ack(std::uint64_t s) {
    std::lock_guard lock(mu);
    pending.erase(s);
    queue.erase(s);
  }
  bool update(const std::string& key, std::string value, std::uint64_t expected) {
    std::lock_guard lock(mu);
    auto& slot = kv[key];
    if (slot.second != expected) return false;
    slot = {std::move(value), ++kv_seq};
    return true;
  }
};

figure run_publish(std::size_t n, const std::string& payload) {
  auto t = amp::memory_transport::create();
  check(t->ensure_stream({.name = "BENCH",
                          .subjects = {"bench.>"},
                          .retention = amp::retention_policy::work_queue})
            .has_value(),
        "stream");
  double amp_rate = per_second(n, [&] {
    for (std::size_t i = 0; i < n; ++i) {
      t->async_publish({.subject = "bench.job", .data = payload},
                       [](amp::result<amp::publish_ack> r) { check(r.has_value(), "publish"); });
    }
  });
  baseline b;
  double base_rate = per_second(n, [&] {
    for (std::size_t i = 0; i < n; ++i) b.publish(payload);
  });
  return {"publish", amp_rate, base_rate};
}

figure run_fetch_ack(std::size_t n, const std::string& payload, std::size_t batch) {
  auto t = amp::memory_transport::create();
  check(t->ensure_stream({.name = "BENCH",
                          .subjects = {"bench.>"},
                          .retention = amp::retention_policy::work_queue})
            .has_value(),
        "stream");
  check(t->ensure_consumer({.stream = "BENCH", .durable = "w", .max_ack_pending = -1}).has_value(),
        "consumer");
  for (std::size_t i = 0; i < n; ++i) {
    check(t->publish({.subject = "bench.job", .data = payload}).has_value(), "publish");
  }
  baseline b;
  for (std::size_t i = 0; i < n; ++i) b.publish(payload);

  double amp_rate = per_second(n, [&] {
    std::size_t got = 0;
    while (got < n) {
      auto msgs = t->fetch("BENCH", "w", {.batch = batch});
      check(msgs.has_value() && !msgs->empty(), "fetch");
      for (const auto& m : *msgs) {
        t->async_acknowledge(m, amp::ack_kind::ack, {},
                             [](amp::result<void> r) { check(r.has_value(), "ack"); });
      }
      got += msgs->size();
    }
  });
  double base_rate = per_second(n, [&] {
    std::size_t got = 0;
    while (got < n) {
      auto msgs = b.fetch(batch);
      check(!msgs.empty(), "baseline fetch");
      for (const auto& m : msgs) b.ack(m.first);
      got += msgs.size();
    }
  });
  check(t->stream_info_of("BENCH").value().state.messages == 0, "queue drained");
  return {batch == 1 ? "fetch(1)+ack" : "fetch(64)+ack", amp_rate, base_rate};
}

figure run_kv_update(std::size_t n, const std::string& payload) {
  auto t = amp::memory_transport::create();
  check(t->ensure_bucket({.bucket = "BENCH", .history = 8}).has_value(), "bucket");
  constexpr std::size_t keys = 1000;
  std::vector<std::uint64_t> rev(keys);
  std::vector<std::string> names(keys);
  for (std::size_t k = 0; k < keys; ++k) {
    names[k] = "task." + std::to_string(k);
    rev[k] = t->kv_create("BENCH", names[k], payload).value();
  }
  double amp_rate = per_second(n, [&] {
    for (std::size_t i = 0; i < n; ++i) {
      auto k = i % keys;
      t->async_kv_update("BENCH", names[k], payload, rev[k], std::nullopt,
                         [&rev, k](amp::result<std::uint64_t> r) {
                           check(r.has_value(), "update");
                           rev[k] = *r;
                         });
    }
  });
  baseline b;
  std::vector<std::uint64_t> brev(keys, 0);
  for (std::size_t k = 0; k < keys; ++k) {
    b.update(names[k], payload, 0);
    brev[k] = b.kv_seq;
  }
  double base_rate = per_second(n, [&] {
    for (std::size_t i = 0; i < n; ++i) {
      auto k = i % keys;
      check(b.update(names[k], payload, brev[k]), "baseline update");
      brev[k] = b.kv_seq;
    }
  });
  return {"kv update (CAS)", amp_rate, base_rate};
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = 200000;
  int runs = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--messages")) n = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--runs")) runs = std::atoi(argv[i + 1]);
  }
  const std::string payload(128, 'x');
  std::printf("memory transport, %zu operations per figure, 128-byte payloads, median of %d runs\n",
              n, runs);
  std::printf("%-18s %14s %14s %8s\n", "operation", "amp ops/s", "baseline ops/s", "ratio");
  using runner = figure (*)(std::size_t, const std::string&);
  std::vector<std::pair<const char*, runner>> all{
      {"publish", run_publish},
      {"fetch(1)+ack", [](std::size_t m, const std::string& p) { return run_fetch_ack(m, p, 1); }},
      {"fetch(64)+ack",
       [](std::size_t m, const std::string& p) { return run_fetch_ack(m, p, 64); }},
      {"kv update", run_kv_update}};
  for (auto& [name, fn] : all) {
    std::vector<figure> got;
    for (int r = 0; r < runs; ++r) got.push_back(fn(n, payload));
    std::sort(got.begin(), got.end(),
              [](const figure& a, const figure& b) { return a.amp_per_s < b.amp_per_s; });
    const auto& med = got[got.size() / 2];
    std::printf("%-18s %14.0f %14.0f %8.2f\n", med.name, med.amp_per_s, med.baseline_per_s,
                med.amp_per_s / med.baseline_per_s);
  }
  return 0;
}
