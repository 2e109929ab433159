// Benchmark of the JetStream transport against hand-written cnats code doing the same work,
// in one process, against one nats-server, as ratios (amp ÷ direct).
//
// Each operation is measured through `amp::transport` (jetstream_transport::connect) and
// through direct cnats calls on a connection of its own (SendAsap on both sides), with
// 128-byte payloads and a fresh stream or bucket (file storage) per measurement. The amp
// and direct measurements of an operation alternate, and the order flips from run to run,
// so that drift (page cache, the server's store, other load) hits both alike.
//
//   publish (sync)       amp `publish`                  vs js_Publish
//   publish (window W)   amp `async_publish`, W in flight vs js_PublishAsync (MaxPending W)
//                                                          + js_PublishAsyncComplete
//   fetch(B)+ack         amp `fetch` (no wait) + `ack`  vs natsSubscription_Fetch +
//                        (acks confirmed by the server)     natsMsg_AckSync, and a second
//                                                          direct variant with natsMsg_Ack
//                                                          (unconfirmed; one flush at the end)
//   fetch(64)+ack, amp   amp `fetch` + `async_acknowledge` of the whole batch, then waiting for
//   acks pipelined       all 64 confirmations          vs the plain-Ack direct variant
//   kv update (CAS)      amp `kv_update`                vs kvStore_Update
//   kv get               amp `kv_get`                   vs kvStore_Get
//
// Besides throughput it reports per operation the CPU time of the benchmark process (all
// threads), of nats-server (when it started the server itself), and the voluntary context
// switches of the benchmark process (thread hand-offs). Results also go to a JSON file.
//
// Usage: amp-bench-jetstream_transport [--url nats://host:port] [--messages N] [--runs R]
//          [--window W] [--quick] [--out results.json] [--only op,op] [--side amp|direct]
//   Without --url it starts its own nats-server (amp-test-support) with a temporary store.
//   --only takes: sync_publish, async_publish, fetch1, fetch64, kv_update, kv_get.
//   --side runs one side only (for profiling); ratios are then absent.

#include <nats/nats.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "amp/transport/jetstream.hpp"

#include "support/stats.hpp"

#ifdef AMP_BENCH_HAVE_TEST_SUPPORT
#include "support/nats_server.hpp"
#endif

namespace {

using amp::bench::cpu_model;
using amp::bench::json_number;
using amp::bench::json_string;
using amp::bench::max_of;
using amp::bench::median;
using amp::bench::min_of;
using amp::bench::now_utc;
using amp::bench::read_first_line;
using amp::bench::split_list;

using bench_clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "benchmark failed: %s\n", what.c_str());
  std::exit(1);
}

void check(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

template <class T>
T must(amp::result<T> r, const std::string& what) {
  if (!r) fail(what + ": " + r.error().to_string());
  return std::move(*r);
}

void must(const amp::result<void>& r, const std::string& what) {
  if (!r) fail(what + ": " + r.error().to_string());
}

void must_nats(natsStatus s, const std::string& what, jsErrCode ec = static_cast<jsErrCode>(0)) {
  if (s != NATS_OK) {
    const char* last = nats_GetLastError(nullptr);
    fail(what + ": " + natsStatus_GetText(s) + " (jsErrCode " + std::to_string(ec) + ") " +
         (last ? last : ""));
  }
}

// ----- measuring ----------------------------------------------------------------------

// Voluntary context switches of this process (all threads): a count of thread hand-offs.
double context_switches_self() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_nvcsw);
}

double cpu_seconds_self() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// CPU seconds (user + system) of another process, from /proc; negative when unknown.
double cpu_seconds_of(pid_t pid) {
  if (pid <= 0) return -1;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(in, text);  // one line
  auto close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(text.substr(close + 2));
  std::string f;
  // Fields after the command: state(3) ... utime(14) stime(15); we start at field 3.
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && (fields >> f); ++i) {
    if (i == 14) utime = std::atof(f.c_str());
    if (i == 15) stime = std::atof(f.c_str());
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

pid_t g_server_pid = -1;

struct sample {
  double ops_per_s = 0;
  double client_us_per_op = 0;        // this process, all threads
  double server_us_per_op = -1;       // nats-server, when known
  double client_switches_per_op = 0;  // voluntary context switches of this process
};

// Times `body`, which performs `n` operations.
template <class F>
sample measure(std::size_t n, F&& body) {
  double c0 = cpu_seconds_self();
  double v0 = context_switches_self();
  double s0 = cpu_seconds_of(g_server_pid);
  auto t0 = bench_clock::now();
  body();
  std::chrono::duration<double> took = bench_clock::now() - t0;
  double c1 = cpu_seconds_self();
  double v1 = context_switches_self();
  double s1 = cpu_seconds_of(g_server_pid);
  sample out;
  auto dn = static_cast<double>(n);
  out.ops_per_s = dn / took.count();
  out.client_us_per_op = (c1 - c0) * 1e6 / dn;
  out.client_switches_per_op = (v1 - v0) / dn;
  if (s0 >= 0 && s1 >= 0) out.server_us_per_op = (s1 - s0) * 1e6 / dn;
  return out;
}

// ----- the direct side: plain cnats ---------------------------------------------------

std::atomic<std::uint64_t> g_async_publish_errors{0};

void on_async_publish_error(jsCtx*, jsPubAckErr* pae, void*) {
  if (pae) g_async_publish_errors.fetch_add(1);
}

struct direct_connection {
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;

  direct_connection(const std::string& url, std::int64_t max_pending) {
    natsOptions* opts = nullptr;
    must_nats(natsOptions_Create(&opts), "natsOptions_Create");
    must_nats(natsOptions_SetURL(opts, url.c_str()), "natsOptions_SetURL");
    must_nats(natsOptions_SetSendAsap(opts, true), "natsOptions_SetSendAsap");
    must_nats(natsOptions_SetName(opts, "amp-bench-direct"), "natsOptions_SetName");
    must_nats(natsConnection_Connect(&nc, opts), "connect (direct)");
    natsOptions_Destroy(opts);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = max_pending;
    jo.PublishAsync.ErrHandler = &on_async_publish_error;
    must_nats(natsConnection_JetStream(&js, nc, &jo), "natsConnection_JetStream");
  }
  ~direct_connection() {
    jsCtx_Destroy(js);
    natsConnection_Close(nc);
    natsConnection_Destroy(nc);
  }
  direct_connection(const direct_connection&) = delete;
  direct_connection& operator=(const direct_connection&) = delete;
};

// ----- configuration --------------------------------------------------------------------

struct config {
  std::string url;
  std::size_t n = 20000;
  int runs = 3;
  std::size_t window = 256;
  std::string out;
  std::set<std::string> only;
  bool run_amp = true;
  bool run_direct = true;
};

const std::string g_payload(128, 'x');
constexpr std::size_t k_keys = 1000;  // KV keys, round-robin
int g_names = 0;
int g_kv_allow_direct = -1;  // the KV stream's AllowDirect, once seen

std::string fresh_name(const char* prefix) {
  return std::string(prefix) + "_" + std::to_string(getpid()) + "_" + std::to_string(++g_names);
}

// A fresh work-queue stream (file storage) capturing `<subject_root>.>`; deleted on exit.
struct scratch_stream {
  amp::transport& t;
  std::string name;
  std::string root;
  scratch_stream(amp::transport& tr, const char* prefix) : t(tr), name(fresh_name(prefix)) {
    root = "bench." + name;
    must(t.ensure_stream({.name = name,
                          .subjects = {root + ".>"},
                          .retention = amp::retention_policy::work_queue,
                          .storage = amp::storage_type::file}),
         "create stream " + name);
  }
  ~scratch_stream() { (void)t.delete_stream(name); }
  std::string subject() const { return root + ".job"; }
};

// A fresh KV bucket (file storage, history 8) with `k_keys` keys; deleted on exit.
struct scratch_bucket {
  amp::transport& t;
  std::string name;
  std::vector<std::string> keys;
  std::vector<std::uint64_t> revisions;
  scratch_bucket(amp::transport& tr, const char* prefix) : t(tr), name(fresh_name(prefix)) {
    must(t.ensure_bucket({.bucket = name, .history = 8, .storage = amp::storage_type::file}),
         "create bucket " + name);
    for (std::size_t k = 0; k < k_keys; ++k) {
      keys.push_back("task." + std::to_string(k));
      revisions.push_back(must(t.kv_create(name, keys.back(), g_payload), "kv_create"));
    }
  }
  ~scratch_bucket() { (void)t.delete_bucket(name); }
};

// ----- the operations -------------------------------------------------------------------
// Each returns one sample; `amp_side` says which side to measure.

sample sync_publish(amp::transport& t, direct_connection& d, std::size_t n, bool amp_side) {
  scratch_stream s(t, "SYNCPUB");
  auto subject = s.subject();
  if (amp_side) {
    return measure(n, [&] {
      for (std::size_t i = 0; i < n; ++i) {
        auto r = t.publish({.subject = subject, .data = g_payload});
        if (!r) fail("amp publish: " + r.error().to_string());
      }
    });
  }
  return measure(n, [&] {
    for (std::size_t i = 0; i < n; ++i) {
      jsPubAck* pa = nullptr;
      jsErrCode ec = static_cast<jsErrCode>(0);
      must_nats(js_Publish(&pa, d.js, subject.c_str(), g_payload.data(),
                           static_cast<int>(g_payload.size()), nullptr, &ec),
                "js_Publish", ec);
      jsPubAck_Destroy(pa);
    }
  });
}

// amp: async_publish with at most `window` in flight, then wait for the last ack.
struct in_flight {
  std::mutex mu;
  std::condition_variable cv;
  std::size_t count = 0;
  std::size_t errors = 0;
  bool waiting = false;
  std::string first_error;
};

sample async_publish(amp::transport& t, direct_connection& d, std::size_t n, std::size_t window,
                     bool amp_side) {
  scratch_stream s(t, "ASYNCPUB");
  auto subject = s.subject();
  sample out;
  if (amp_side) {
    in_flight w;
    out = measure(n, [&] {
      for (std::size_t i = 0; i < n; ++i) {
        {
          std::unique_lock lock(w.mu);
          if (w.count >= window) {
            w.waiting = true;
            w.cv.wait(lock, [&] { return w.count < window; });
            w.waiting = false;
          }
          ++w.count;
        }
        t.async_publish({.subject = subject, .data = g_payload},
                        [&w](amp::result<amp::publish_ack> r) {
                          std::lock_guard lock(w.mu);
                          --w.count;
                          if (!r) {
                            if (w.errors++ == 0) w.first_error = r.error().to_string();
                          }
                          if (w.waiting) w.cv.notify_one();
                        });
      }
      std::unique_lock lock(w.mu);
      w.waiting = true;
      w.cv.wait(lock, [&] { return w.count == 0; });
    });
    check(w.errors == 0, "amp async_publish: " + w.first_error);
  } else {
    g_async_publish_errors = 0;
    out = measure(n, [&] {
      for (std::size_t i = 0; i < n; ++i) {
        must_nats(js_PublishAsync(d.js, subject.c_str(), g_payload.data(),
                                  static_cast<int>(g_payload.size()), nullptr),
                  "js_PublishAsync");
      }
      jsPubOptions po;
      jsPubOptions_Init(&po);
      po.MaxWait = 60000;
      must_nats(js_PublishAsyncComplete(d.js, &po), "js_PublishAsyncComplete");
    });
    check(g_async_publish_errors == 0, "js_PublishAsync reported errors");
  }
  auto info = must(t.stream_info_of(s.name), "stream info");
  check(info.state.messages == n, "every pipelined publish stored");
  return out;
}

// Fills a stream with n messages through cnats (not timed).
void prefill(direct_connection& d, const std::string& subject, std::size_t n) {
  g_async_publish_errors = 0;
  for (std::size_t i = 0; i < n; ++i) {
    must_nats(js_PublishAsync(d.js, subject.c_str(), g_payload.data(),
                              static_cast<int>(g_payload.size()), nullptr),
              "prefill");
  }
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MaxWait = 60000;
  must_nats(js_PublishAsyncComplete(d.js, &po), "prefill complete");
  check(g_async_publish_errors == 0, "prefill errors");
}

// amp_pipelined: the acks of a batch sent at once with `async_acknowledge`, then waited for.
enum class fetch_side { amp, amp_pipelined, direct_ack_sync, direct_ack };

sample fetch_ack(amp::transport& t, direct_connection& d, std::size_t n, std::size_t batch,
                 fetch_side side) {
  scratch_stream s(t, "FETCH");
  must(t.ensure_consumer({.stream = s.name, .durable = "w", .max_ack_pending = -1}),
       "create consumer");
  prefill(d, s.subject(), n);
  sample out;
  if (side == fetch_side::amp) {
    out = measure(n, [&] {
      std::size_t got = 0;
      while (got < n) {
        auto msgs = t.fetch(s.name, "w", {.batch = batch});
        if (!msgs) fail("amp fetch: " + msgs.error().to_string());
        check(!msgs->empty(), "amp fetch returned nothing");
        for (const auto& m : *msgs) {
          auto r = t.ack(m);
          if (!r) fail("amp ack: " + r.error().to_string());
        }
        got += msgs->size();
      }
    });
  } else if (side == fetch_side::amp_pipelined) {
    out = measure(n, [&] {
      std::size_t got = 0;
      in_flight w;
      while (got < n) {
        auto msgs = t.fetch(s.name, "w", {.batch = batch});
        if (!msgs) fail("amp fetch: " + msgs.error().to_string());
        check(!msgs->empty(), "amp fetch returned nothing");
        {
          std::lock_guard lock(w.mu);
          w.count = msgs->size();
        }
        for (const auto& m : *msgs) {
          t.async_acknowledge(m, amp::ack_kind::ack, {}, [&w](amp::result<void> r) {
            std::lock_guard lock(w.mu);
            if (!r && w.errors++ == 0) w.first_error = r.error().to_string();
            if (--w.count == 0) w.cv.notify_one();
          });
        }
        std::unique_lock lock(w.mu);
        w.cv.wait(lock, [&] { return w.count == 0; });
        check(w.errors == 0, "amp async_acknowledge: " + w.first_error);
        got += msgs->size();
      }
    });
  } else {
    natsSubscription* sub = nullptr;
    jsErrCode ec = static_cast<jsErrCode>(0);
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = s.name.c_str();
    so.Consumer = "w";
    auto filter = s.root + ".>";
    must_nats(js_PullSubscribe(&sub, d.js, filter.c_str(), "w", nullptr, &so, &ec),
              "js_PullSubscribe", ec);
    bool sync_ack = side == fetch_side::direct_ack_sync;
    out = measure(n, [&] {
      std::size_t got = 0;
      while (got < n) {
        natsMsgList list{};
        jsErrCode fec = static_cast<jsErrCode>(0);
        must_nats(natsSubscription_Fetch(&list, sub, static_cast<int>(batch), 5000, &fec),
                  "natsSubscription_Fetch", fec);
        check(list.Count > 0, "natsSubscription_Fetch returned nothing");
        for (int i = 0; i < list.Count; ++i) {
          if (sync_ack) {
            jsErrCode aec = static_cast<jsErrCode>(0);
            must_nats(natsMsg_AckSync(list.Msgs[i], nullptr, &aec), "natsMsg_AckSync", aec);
          } else {
            must_nats(natsMsg_Ack(list.Msgs[i], nullptr), "natsMsg_Ack");
          }
        }
        got += static_cast<std::size_t>(list.Count);
        natsMsgList_Destroy(&list);
      }
      // Unconfirmed acks: at least make sure the server has read them.
      if (!sync_ack) must_nats(natsConnection_Flush(d.nc), "flush");
    });
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
  }
  // Every message acked: the work-queue stream ends empty (plain acks may lag a moment).
  for (int i = 0; i < 100; ++i) {
    if (must(t.stream_info_of(s.name), "stream info").state.messages == 0) return out;
    std::this_thread::sleep_for(10ms);
  }
  fail("stream not drained after fetch+ack");
}

sample kv_update(amp::transport& t, direct_connection& d, std::size_t n, bool amp_side) {
  scratch_bucket b(t, "KVUPD");
  auto rev = b.revisions;
  if (amp_side) {
    return measure(n, [&] {
      for (std::size_t i = 0; i < n; ++i) {
        auto k = i % k_keys;
        auto r = t.kv_update(b.name, b.keys[k], g_payload, rev[k]);
        if (!r) fail("amp kv_update: " + r.error().to_string());
        rev[k] = *r;
      }
    });
  }
  kvStore* kv = nullptr;
  must_nats(js_KeyValue(&kv, d.js, b.name.c_str()), "js_KeyValue");
  auto out = measure(n, [&] {
    for (std::size_t i = 0; i < n; ++i) {
      auto k = i % k_keys;
      std::uint64_t next = 0;
      must_nats(kvStore_Update(&next, kv, b.keys[k].c_str(), g_payload.data(),
                               static_cast<int>(g_payload.size()), rev[k]),
                "kvStore_Update");
      rev[k] = next;
    }
  });
  kvStore_Destroy(kv);
  return out;
}

sample kv_get(amp::transport& t, direct_connection& d, std::size_t n, bool amp_side) {
  scratch_bucket b(t, "KVGET");
  if (amp_side) {
    return measure(n, [&] {
      for (std::size_t i = 0; i < n; ++i) {
        auto r = t.kv_get(b.name, b.keys[i % k_keys]);
        if (!r) fail("amp kv_get: " + r.error().to_string());
        if (r->value.size() != g_payload.size()) fail("amp kv_get: wrong value");
      }
    });
  }
  {
    // Which path kvStore_Get takes: a direct get when the bucket's stream allows it.
    jsStreamInfo* si = nullptr;
    jsErrCode ec = static_cast<jsErrCode>(0);
    auto stream = "KV_" + b.name;
    must_nats(js_GetStreamInfo(&si, d.js, stream.c_str(), nullptr, &ec), "stream info", ec);
    g_kv_allow_direct = si->Config->AllowDirect ? 1 : 0;
    jsStreamInfo_Destroy(si);
  }
  kvStore* kv = nullptr;
  must_nats(js_KeyValue(&kv, d.js, b.name.c_str()), "js_KeyValue");
  auto out = measure(n, [&] {
    for (std::size_t i = 0; i < n; ++i) {
      kvEntry* e = nullptr;
      must_nats(kvStore_Get(&e, kv, b.keys[i % k_keys].c_str()), "kvStore_Get");
      if (kvEntry_ValueLen(e) != static_cast<int>(g_payload.size())) fail("kvStore_Get: value");
      kvEntry_Destroy(e);
    }
  });
  kvStore_Destroy(kv);
  return out;
}

// ----- the table --------------------------------------------------------------------------

struct row {
  std::string key;   // --only name
  std::string name;  // shown
  std::string amp_call;
  std::string direct_call;
  std::vector<sample> amp;
  std::vector<sample> direct;
};

template <class F>
std::vector<double> pluck(const std::vector<sample>& s, F f) {
  std::vector<double> out;
  for (const auto& x : s) out.push_back(f(x));
  return out;
}

std::vector<double> ratios(const row& r) {
  std::vector<double> out;
  for (std::size_t i = 0; i < r.amp.size() && i < r.direct.size(); ++i) {
    out.push_back(r.amp[i].ops_per_s / r.direct[i].ops_per_s);
  }
  return out;
}

std::string json_samples(const std::vector<sample>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += "{\"ops_per_s\": " + json_number(s[i].ops_per_s, 1) +
           ", \"client_cpu_us_per_op\": " + json_number(s[i].client_us_per_op, 2) +
           ", \"client_context_switches_per_op\": " + json_number(s[i].client_switches_per_op, 2) +
           ", \"server_cpu_us_per_op\": " +
           json_number(s[i].server_us_per_op >= 0 ? s[i].server_us_per_op : std::nan(""), 2) + "}";
  }
  return out + "]";
}

void write_json(const config& c, const std::vector<row>& rows, const std::string& load_before,
                const std::string& load_after, const std::string& started) {
  std::filesystem::path out(c.out);
  if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
  std::ofstream f(out);
  if (!f) fail("cannot write " + c.out);
  f << "{\n";
  f << "  \"benchmark\": \"amp-bench-jetstream_transport\",\n";
  f << "  \"started\": " << json_string(started) << ",\n";
  f << "  \"messages\": " << c.n << ",\n  \"runs\": " << c.runs << ",\n";
  f << "  \"window\": " << c.window << ",\n  \"payload_bytes\": " << g_payload.size() << ",\n";
  f << "  \"kv_keys\": " << k_keys << ",\n";
  f << "  \"storage\": \"file\",\n";
  f << "  \"kv_stream_allow_direct\": "
    << (g_kv_allow_direct < 0 ? "null"
        : g_kv_allow_direct   ? "true"
                              : "false")
    << ",\n";
  f << "  \"server\": " << json_string(c.url.empty() ? "own nats-server (amp-test-support)" : c.url)
    << ",\n";
  f << "  \"cnats\": " << json_string(nats_GetVersion()) << ",\n";
  f << "  \"machine\": {\"cpus\": " << std::thread::hardware_concurrency()
    << ", \"cpu\": " << json_string(cpu_model())
    << ", \"loadavg_before\": " << json_string(load_before)
    << ", \"loadavg_after\": " << json_string(load_after) << "},\n";
  f << "  \"operations\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    auto q = ratios(r);
    f << "    {\"name\": " << json_string(r.name) << ", \"amp\": " << json_string(r.amp_call)
      << ", \"direct\": " << json_string(r.direct_call) << ",\n";
    f << "     \"amp_ops_per_s\": {\"min\": "
      << json_number(min_of(pluck(r.amp, [](auto& s) { return s.ops_per_s; })), 1)
      << ", \"median\": "
      << json_number(median(pluck(r.amp, [](auto& s) { return s.ops_per_s; })), 1)
      << ", \"max\": " << json_number(max_of(pluck(r.amp, [](auto& s) { return s.ops_per_s; })), 1)
      << "},\n";
    f << "     \"direct_ops_per_s\": {\"min\": "
      << json_number(min_of(pluck(r.direct, [](auto& s) { return s.ops_per_s; })), 1)
      << ", \"median\": "
      << json_number(median(pluck(r.direct, [](auto& s) { return s.ops_per_s; })), 1)
      << ", \"max\": "
      << json_number(max_of(pluck(r.direct, [](auto& s) { return s.ops_per_s; })), 1) << "},\n";
    f << "     \"ratio\": {\"min\": " << json_number(min_of(q), 3)
      << ", \"median\": " << json_number(median(q), 3) << ", \"max\": " << json_number(max_of(q), 3)
      << "},\n";
    f << "     \"amp_runs\": " << json_samples(r.amp) << ",\n";
    f << "     \"direct_runs\": " << json_samples(r.direct) << "}"
      << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
}

void print_tables(const std::vector<row>& rows) {
  std::printf("\n%-36s %10s %10s %8s %8s %8s\n", "operation", "amp/s", "direct/s", "ratio", "min",
              "max");
  for (const auto& r : rows) {
    auto q = ratios(r);
    std::printf("%-36s %10.0f %10.0f %8.3f %8.3f %8.3f\n", r.name.c_str(),
                median(pluck(r.amp, [](auto& s) { return s.ops_per_s; })),
                median(pluck(r.direct, [](auto& s) { return s.ops_per_s; })), median(q), min_of(q),
                max_of(q));
  }
  std::printf(
      "\nPer operation, medians: CPU us of this process (cli, all threads) and of "
      "nats-server (srv), voluntary context switches of this process (cs)\n");
  std::printf("%-36s %10s %10s %10s %10s %8s %8s\n", "operation", "amp cli", "dir cli", "amp srv",
              "dir srv", "amp cs", "dir cs");
  for (const auto& r : rows) {
    auto srv = [](const std::vector<sample>& s) {
      auto v = pluck(s, [](auto& x) { return x.server_us_per_op; });
      return (v.empty() || v.front() < 0) ? std::nan("") : median(v);
    };
    std::printf("%-36s %10.1f %10.1f %10.1f %10.1f %8.2f %8.2f\n", r.name.c_str(),
                median(pluck(r.amp, [](auto& s) { return s.client_us_per_op; })),
                median(pluck(r.direct, [](auto& s) { return s.client_us_per_op; })), srv(r.amp),
                srv(r.direct),
                median(pluck(r.amp, [](auto& s) { return s.client_switches_per_op; })),
                median(pluck(r.direct, [](auto& s) { return s.client_switches_per_op; })));
  }
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: amp-bench-jetstream_transport [--url URL] [--messages N] [--runs R] "
               "[--window W] [--quick] [--out FILE] [--only op,...] [--side amp|direct]\n"
               "  ops: sync_publish async_publish fetch1 fetch64 kv_update kv_get\n");
  std::exit(2);
}

config parse_args(int argc, char** argv) {
  config c;
#ifdef AMP_BENCH_DEFAULT_OUT
  c.out = AMP_BENCH_DEFAULT_OUT;
#else
  c.out = "benchmarks/results/jetstream_transport.json";
#endif
  bool n_set = false, runs_set = false, quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--url") {
      c.url = next();
    } else if (a == "--messages") {
      c.n = std::strtoull(next().c_str(), nullptr, 10);
      n_set = true;
    } else if (a == "--runs") {
      c.runs = std::atoi(next().c_str());
      runs_set = true;
    } else if (a == "--window") {
      c.window = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--out") {
      c.out = next();
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--only") {
      for (auto& o : split_list(next())) c.only.insert(o);
    } else if (a == "--side") {
      auto s = next();
      if (s == "amp") {
        c.run_direct = false;
      } else if (s == "direct") {
        c.run_amp = false;
      } else {
        usage();
      }
    } else {
      usage();
    }
  }
  if (quick) {
    if (!n_set) c.n = 2000;
    if (!runs_set) c.runs = 1;
  }
  if (c.n == 0 || c.runs < 1 || c.window == 0) usage();
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  auto c = parse_args(argc, argv);
  auto started = now_utc();

#ifdef AMP_BENCH_HAVE_TEST_SUPPORT
  std::optional<amp::testing::nats_server> server;
  if (c.url.empty()) {
    server.emplace(amp::testing::nats_server::start());
    g_server_pid = server->pid();
  }
  std::string url = c.url.empty() ? server->url() : c.url;
#else
  if (c.url.empty()) {
    std::fprintf(stderr, "built without amp-test-support: pass --url\n");
    return 2;
  }
  std::string url = c.url;
#endif

  auto t = must(amp::jetstream_transport::connect({.url = url, .name = "amp-bench-amp"}),
                "jetstream_transport::connect");
  direct_connection d(url, static_cast<std::int64_t>(c.window));

  auto load_before = read_first_line("/proc/loadavg");
  std::printf(
      "JetStream transport vs direct cnats %s, %s, file storage, %zu operations per "
      "measurement, 128-byte payloads, %d runs, window %zu\n",
      nats_GetVersion(), c.url.empty() ? "own nats-server" : url.c_str(), c.n, c.runs, c.window);
  std::printf("load average before: %s\n", load_before.c_str());

  std::vector<row> rows;
  auto add = [&](std::string key, std::string name, std::string amp_call, std::string direct_call) {
    rows.push_back(
        {std::move(key), std::move(name), std::move(amp_call), std::move(direct_call), {}, {}});
    return rows.size() - 1;
  };
  auto wanted = [&](const std::string& key) { return c.only.empty() || c.only.count(key) > 0; };

  auto window_name = "publish (window " + std::to_string(c.window) + ")";
  std::size_t r_sync = add("sync_publish", "publish (sync)", "publish", "js_Publish");
  std::size_t r_async = add("async_publish", window_name, "async_publish",
                            "js_PublishAsync + js_PublishAsyncComplete");
  std::size_t r_f1 =
      add("fetch1", "fetch(1)+ack", "fetch + ack", "natsSubscription_Fetch + natsMsg_AckSync");
  std::size_t r_f1p = add("fetch1", "fetch(1)+ack [direct: plain Ack]", "fetch + ack",
                          "natsSubscription_Fetch + natsMsg_Ack (unconfirmed)");
  std::size_t r_f64 =
      add("fetch64", "fetch(64)+ack", "fetch + ack", "natsSubscription_Fetch + natsMsg_AckSync");
  std::size_t r_f64p = add("fetch64", "fetch(64)+ack [direct: plain Ack]", "fetch + ack",
                           "natsSubscription_Fetch + natsMsg_Ack (unconfirmed)");
  std::size_t r_f64a = add("fetch64", "fetch(64)+ack [amp pipelined, Ack]",
                           "fetch + async_acknowledge of the whole batch, then wait for all",
                           "natsSubscription_Fetch + natsMsg_Ack (unconfirmed)");
  std::size_t r_upd = add("kv_update", "kv update (CAS)", "kv_update", "kvStore_Update");
  std::size_t r_get = add("kv_get", "kv get", "kv_get", "kvStore_Get");

  // Two sides measured in alternating order; the order flips every run.
  auto pair = [&](int run, std::size_t r, const std::function<sample(bool)>& op, bool record) {
    bool amp_first = run % 2 == 0;
    for (int k = 0; k < 2; ++k) {
      bool amp_side = (k == 0) == amp_first;
      if (amp_side ? !c.run_amp : !c.run_direct) continue;
      auto s = op(amp_side);
      if (record) (amp_side ? rows[r].amp : rows[r].direct).push_back(s);
    }
  };
  // fetch: the amp measurement(s) and the two direct ones (AckSync, Ack), rotated every run.
  // With a batch above 1 also amp with the batch's acks pipelined, beside plain Ack.
  auto fetch_all = [&](int run, std::size_t n, std::size_t batch, std::size_t r_sync_ack,
                       std::size_t r_plain, std::optional<std::size_t> r_pipelined, bool record) {
    std::vector<fetch_side> order{fetch_side::amp, fetch_side::direct_ack_sync,
                                  fetch_side::direct_ack};
    if (r_pipelined) order.insert(order.begin() + 2, fetch_side::amp_pipelined);
    for (std::size_t k = 0; k < order.size(); ++k) {
      auto side = order[(k + static_cast<std::size_t>(run)) % order.size()];
      bool amp_side = side == fetch_side::amp || side == fetch_side::amp_pipelined;
      if (amp_side ? !c.run_amp : !c.run_direct) continue;
      auto s = fetch_ack(*t, d, n, batch, side);
      if (!record) continue;
      switch (side) {
        case fetch_side::amp:
          rows[r_sync_ack].amp.push_back(s);
          rows[r_plain].amp.push_back(s);
          break;
        case fetch_side::amp_pipelined: rows[*r_pipelined].amp.push_back(s); break;
        case fetch_side::direct_ack_sync: rows[r_sync_ack].direct.push_back(s); break;
        case fetch_side::direct_ack:
          rows[r_plain].direct.push_back(s);
          if (r_pipelined) rows[*r_pipelined].direct.push_back(s);
          break;
      }
    }
  };

  auto one_round = [&](int run, std::size_t n, bool record) {
    if (wanted("sync_publish")) {
      pair(
          run, r_sync, [&](bool a) { return sync_publish(*t, d, n, a); }, record);
    }
    if (wanted("async_publish")) {
      pair(
          run, r_async, [&](bool a) { return async_publish(*t, d, n, c.window, a); }, record);
    }
    if (wanted("fetch1")) fetch_all(run, n, 1, r_f1, r_f1p, std::nullopt, record);
    if (wanted("fetch64")) fetch_all(run, n, 64, r_f64, r_f64p, r_f64a, record);
    if (wanted("kv_update")) {
      pair(
          run, r_upd, [&](bool a) { return kv_update(*t, d, n, a); }, record);
    }
    if (wanted("kv_get")) {
      pair(
          run, r_get, [&](bool a) { return kv_get(*t, d, n, a); }, record);
    }
  };

  // Warm-up: everything once, briefly, not recorded.
  std::printf("warm-up...\n");
  std::fflush(stdout);
  one_round(0, std::max<std::size_t>(200, c.n / 10), false);
  for (int run = 0; run < c.runs; ++run) {
    std::printf("run %d/%d (%s first)...\n", run + 1, c.runs, run % 2 == 0 ? "amp" : "direct");
    std::fflush(stdout);
    one_round(run, c.n, true);
  }
  auto load_after = read_first_line("/proc/loadavg");

  std::vector<row> shown;
  for (auto& r : rows) {
    if (!r.amp.empty() || !r.direct.empty()) shown.push_back(r);
  }
  print_tables(shown);
  if (g_kv_allow_direct >= 0) {
    std::printf("\nKV bucket stream AllowDirect: %s\n", g_kv_allow_direct ? "yes" : "no");
  }
  std::printf("load average after: %s\n", load_after.c_str());
  write_json(c, shown, load_before, load_after, started);
  std::printf("results written to %s\n", c.out.c_str());
  return 0;
}
