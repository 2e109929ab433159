// amp-bench-sink: the sink (amp-sink-v1.md, issue 18) against the destination's own limit.
//
// Throughput, for PostgreSQL and SQLite and batches of 1, 16 and 256: N events are stored in
// a namespace's topic stream first; then, timed,
// - the baseline: a plain client (libpq, or the SQLite C API) inserts N rows of the same
//   columns and sizes, `batch` rows per transaction, with no JetStream at all;
// - the sink: amp::sink::sink with `batch.max_messages` = batch, from a new consumer, until
//   every one of the N events is committed and acknowledged.
// Both write to a fresh table of the same database, in the same process, back to back; the
// ratio sink / baseline is taken within each run.
//
// Lag: events published at `--rate` (5,000/s) for `--lag-seconds` while a sink (batch 256,
// max_wait 50 ms, the spec's example) archives them into PostgreSQL; per event, from the
// moment its publish was acknowledged by JetStream (committed to the stream) to the moment
// the sink's acknowledgement of it was confirmed.
//
// It starts its own nats-server and PostgreSQL (fsync on) through the test support library;
// SQLite lives in a temporary folder (WAL, synchronous=FULL, as the sink opens it).
//
//   amp-bench-sink [--events N] [--runs R] [--rate R] [--lag-seconds S] [--quick] [--out FILE]

#include <fmt/format.h>
#include <libpq-fe.h>
#include <nats/nats.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "amp/broker/topics.hpp"
#include "amp/sink/sink.hpp"
#include "amp/timestamp.hpp"
#include "amp/transport/jetstream.hpp"
#include "support/nats_server.hpp"
#include "support/postgres_server.hpp"
#include "support/stats.hpp"

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

struct options {
  int events = 20000;
  int runs = 3;
  int rate = 5000;
  int lag_seconds = 6;
  bool quick = false;
  bool lag = true;
  std::vector<std::string> targets{"postgres", "sqlite"};
  std::vector<int> batches{1, 16, 256};
  std::string out = AMP_BENCH_SINK_OUT;
};

[[noreturn]] void usage(const char* error) {
  std::fprintf(
      stderr,
      "%s%susage: amp-bench-sink [--events N] [--runs R] [--rate R] [--lag-seconds S] "
      "[--targets postgres,sqlite] [--batches 1,16,256] [--no-lag] [--quick] [--out FILE]\n"
      "Defaults: 20000 events per measurement (batch 1: a tenth), 3 runs, 5000 "
      "events/s for 6 s of lag; --quick: 5000 events, 1 run, 3 s of lag.\n",
      error ? error : "", error ? "\n" : "");
  std::exit(error ? 2 : 0);
}

options parse(int argc, char** argv) {
  options o;
  bool events_set = false;
  bool runs_set = false;
  bool lag_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    try {
      if (a == "--events") {
        o.events = std::stoi(next());
        events_set = true;
      } else if (a == "--runs") {
        o.runs = std::stoi(next());
        runs_set = true;
      } else if (a == "--rate") {
        o.rate = std::stoi(next());
      } else if (a == "--lag-seconds") {
        o.lag_seconds = std::stoi(next());
        lag_set = true;
      } else if (a == "--targets") {
        o.targets = amp::bench::split_list(next());
      } else if (a == "--batches") {
        o.batches = amp::bench::int_list(next());
      } else if (a == "--no-lag") {
        o.lag = false;
      } else if (a == "--quick") {
        o.quick = true;
      } else if (a == "--out") {
        o.out = next();
      } else if (a == "--help" || a == "-h") {
        usage(nullptr);
      } else {
        usage(("unknown argument " + a).c_str());
      }
    } catch (const std::logic_error&) {
      usage(("bad value for " + a).c_str());
    }
  }
  if (o.quick) {
    if (!events_set) o.events = 5000;
    if (!runs_set) o.runs = 1;
    if (!lag_set) o.lag_seconds = 3;
  }
  if (o.events < 10 || o.runs < 1 || o.rate < 1 || o.lag_seconds < 1)
    usage("values must be positive");
  return o;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// The body every event carries: about 200 bytes of JSON, as a small business event.
std::string body_of(int i) {
  return fmt::format(
      R"({{"order":"o-{}","customer":"c-{}","amount":{}.{:02},"currency":"EUR","lines":[{{"sku":"s-{}","qty":{}}}],"note":"benchmark event for the sink"}})",
      i, i % 977, i % 1000, i % 100, i % 331, 1 + i % 7);
}

// The rows the baseline inserts: the columns and sizes the sink's rows have.
std::vector<amp::sink::row> rows_for(int n, const std::string& stream) {
  std::vector<amp::sink::row> rows;
  rows.reserve(static_cast<std::size_t>(n));
  const auto ts = amp::format_timestamp(std::chrono::system_clock::now());
  for (int i = 0; i < n; ++i) {
    const auto seq = static_cast<std::uint64_t>(i + 1);
    rows.push_back({.key = fmt::format("{}:{}", stream, seq),
                    .stream = stream,
                    .seq = seq,
                    .subject = "amp.bench.topic.orders.eu",
                    .topic = "orders.eu",
                    .msg_id = fmt::format("m{:020}", seq),
                    .sender = "producer",
                    .type = "order",
                    .ts = ts,
                    .body = body_of(i),
                    .headers = "{}"});
  }
  return rows;
}

// ----- the baselines: plain clients ------------------------------------------------------

void pg_exec(PGconn* c, const std::string& sql) {
  PGresult* r = PQexec(c, sql.c_str());
  const auto s = PQresultStatus(r);
  const std::string error = PQresultErrorMessage(r);
  PQclear(r);
  check(s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK, "postgres: " + sql + ": " + error);
}

const char* k_pg_table =
    "CREATE TABLE {} (key text PRIMARY KEY, stream text NOT NULL, seq bigint NOT NULL, "
    "subject text NOT NULL, topic text, msg_id text NOT NULL, sender text NOT NULL, type text, "
    "ts timestamptz NOT NULL, body jsonb NOT NULL, headers jsonb NOT NULL, "
    "committed_at timestamptz NOT NULL DEFAULT now())";

// Rows per second of `rows` inserted `batch` per transaction with one multi-row INSERT each.
double pg_baseline(const std::string& dsn, const std::string& table,
                   const std::vector<amp::sink::row>& rows, std::size_t batch) {
  PGconn* c = PQconnectdb(dsn.c_str());
  check(PQstatus(c) == CONNECTION_OK, "postgres: cannot connect");
  pg_exec(c, fmt::format(fmt::runtime(k_pg_table), table));
  const auto start = steady::now();
  for (std::size_t first = 0; first < rows.size(); first += batch) {
    const auto n = std::min(batch, rows.size() - first);
    std::string sql = fmt::format(
        "INSERT INTO {} (key, stream, seq, subject, topic, msg_id, sender, type, ts, body, "
        "headers, committed_at) VALUES ",
        table);
    std::vector<std::string> seqs;
    seqs.reserve(n);
    std::vector<const char*> values;
    int p = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto& r = rows[first + i];
      sql += fmt::format(
          "{}(${},${},${}::bigint,${},${},${},${},${},${}::timestamptz,${}::jsonb,"
          "${}::jsonb,now())",
          i == 0 ? "" : ",", p + 1, p + 2, p + 3, p + 4, p + 5, p + 6, p + 7, p + 8, p + 9, p + 10,
          p + 11);
      p += 11;
      seqs.push_back(std::to_string(r.seq));
      values.insert(values.end(),
                    {r.key.c_str(), r.stream.c_str(), seqs.back().c_str(), r.subject.c_str(),
                     r.topic->c_str(), r.msg_id.c_str(), r.sender.c_str(), r.type.c_str(),
                     r.ts.c_str(), r.body.c_str(), r.headers.c_str()});
    }
    pg_exec(c, "BEGIN");
    PGresult* res = PQexecParams(c, sql.c_str(), static_cast<int>(values.size()), nullptr,
                                 values.data(), nullptr, nullptr, 0);
    const bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    const std::string error = PQresultErrorMessage(res);
    PQclear(res);
    check(ok, "postgres insert: " + error);
    pg_exec(c, "COMMIT");
  }
  const double seconds = std::chrono::duration<double>(steady::now() - start).count();
  PQfinish(c);
  return static_cast<double>(rows.size()) / seconds;
}

double sqlite_baseline(const std::string& path, const std::string& table,
                       const std::vector<amp::sink::row>& rows, std::size_t batch) {
  sqlite3* db = nullptr;
  check(sqlite3_open(path.c_str(), &db) == SQLITE_OK, "sqlite: cannot open " + path);
  auto exec = [&](const std::string& sql) {
    check(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK,
          "sqlite: " + sql + ": " + sqlite3_errmsg(db));
  };
  exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL");
  exec(fmt::format(
      "CREATE TABLE {} (key TEXT PRIMARY KEY NOT NULL, stream TEXT NOT NULL, seq INTEGER NOT "
      "NULL, subject TEXT NOT NULL, topic TEXT, msg_id TEXT NOT NULL, sender TEXT NOT NULL, "
      "type TEXT, ts TEXT NOT NULL, body TEXT NOT NULL, headers TEXT NOT NULL, committed_at TEXT "
      "NOT NULL)",
      table));
  sqlite3_stmt* insert = nullptr;
  const auto sql = fmt::format("INSERT INTO {} VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", table);
  check(sqlite3_prepare_v2(db, sql.c_str(), -1, &insert, nullptr) == SQLITE_OK, "sqlite prepare");
  auto text = [&](int i, const std::string& v) {
    sqlite3_bind_text(insert, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
  };
  const auto start = steady::now();
  for (std::size_t first = 0; first < rows.size(); first += batch) {
    exec("BEGIN IMMEDIATE");
    const auto committed_at = amp::format_timestamp(std::chrono::system_clock::now());
    for (std::size_t i = first; i < std::min(rows.size(), first + batch); ++i) {
      const auto& r = rows[i];
      text(1, r.key);
      text(2, r.stream);
      sqlite3_bind_int64(insert, 3, static_cast<sqlite3_int64>(r.seq));
      text(4, r.subject);
      text(5, *r.topic);
      text(6, r.msg_id);
      text(7, r.sender);
      text(8, r.type);
      text(9, r.ts);
      text(10, r.body);
      text(11, r.headers);
      text(12, committed_at);
      check(sqlite3_step(insert) == SQLITE_DONE,
            std::string("sqlite insert: ") + sqlite3_errmsg(db));
      sqlite3_reset(insert);
    }
    exec("COMMIT");
  }
  const double seconds = std::chrono::duration<double>(steady::now() - start).count();
  sqlite3_finalize(insert);
  sqlite3_close(db);
  return static_cast<double>(rows.size()) / seconds;
}

// ----- CPU spent ----------------------------------------------------------------------------

// Microseconds of CPU per message that nats-server and this process spent over a phase.
struct cpu_meter {
  pid_t server;
  double server_start = amp::bench::cpu_seconds(server);
  double self_start = amp::bench::cpu_seconds_self();

  struct per_message {
    double server_us = 0;
    double self_us = 0;
  };
  per_message per(int n) const {
    return {.server_us = (amp::bench::cpu_seconds(server) - server_start) * 1e6 / n,
            .self_us = (amp::bench::cpu_seconds_self() - self_start) * 1e6 / n};
  }
};

// A timed phase: messages (rows) per second and the CPU it cost per message.
struct phase {
  double rate = 0;
  cpu_meter::per_message cpu{};
};

// ----- the sink ---------------------------------------------------------------------------

struct bench_rig {
  amp::testing::nats_server nats = amp::testing::nats_server::start();
  amp::testing::postgres_server pg = amp::testing::postgres_server::start();
  std::shared_ptr<amp::transport> t;
  std::filesystem::path dir;
  int next_ns = 0;

  bench_rig() {
    auto connected = amp::jetstream_transport::connect({.url = nats.url()});
    check(connected.has_value(), "cannot connect to nats-server");
    t = *connected;
    dir = std::filesystem::temp_directory_path() / fmt::format("amp-bench-sink-{}", ::getpid());
    std::filesystem::create_directories(dir);
  }
  ~bench_rig() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  // A fresh namespace holding `n` stored events; its topics.
  std::pair<std::string, std::shared_ptr<amp::topics>> namespace_with(int n) {
    const auto ns = fmt::format("bench{}", ++next_ns);
    auto events = amp::topics::open(t, {.ns = amp::namespace_name::make(ns).value()}).value();
    std::atomic<int> left{n};
    std::mutex m;
    std::condition_variable cv;
    std::atomic<int> in_flight{0};
    for (int i = 0; i < n; ++i) {
      while (in_flight.load() > 512) std::this_thread::yield();
      ++in_flight;
      events->async_publish({.to = amp::topic::make("orders.eu").value(),
                             .from = "producer",
                             .body = body_of(i),
                             .type = "order"},
                            [&](amp::result<amp::publish_result> r) {
                              if (!r)
                                std::fprintf(stderr, "publish: %s\n", r.error().message().c_str());
                              --in_flight;
                              if (--left == 0) {
                                std::lock_guard lock(m);
                                cv.notify_all();
                              }
                            });
    }
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return left.load() == 0; });
    return {ns, events};
  }

  amp::sink::target_config target(const std::string& kind, const std::string& table) const {
    if (kind == "postgres") {
      return {.kind = amp::sink::target_kind::postgres, .dsn = pg.dsn(), .table = table};
    }
    return {.kind = amp::sink::target_kind::sqlite,
            .path = (dir / (table + ".db")).string(),
            .table = table};
  }

  // Messages per second of a raw cnats pull consumer (no amp, no destination) draining `n`
  // stored events of `ns`, `batch` per fetch, each acknowledged (+ACK, not confirmed) at
  // once: what JetStream itself allows a sink at that batch size. With `ack_all`, the
  // consumer's AckPolicy is "all" and only the last message of each fetch is acknowledged
  // (it acknowledges every one before it): what JetStream allows without an acknowledgement
  // per message.
  phase raw_drain(const std::string& ns, int n, std::size_t batch, bool ack_all = false) {
    const auto stream = "AMP_TOPICS_" + ns;
    const char* durable = ack_all ? "raw_all" : "raw";
    natsConnection* nc = nullptr;
    jsCtx* js = nullptr;
    natsSubscription* sub = nullptr;
    check(natsConnection_ConnectTo(&nc, nats.url().c_str()) == NATS_OK, "cnats connect");
    check(natsConnection_JetStream(&js, nc, nullptr) == NATS_OK, "cnats jetstream");
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = durable;
    cc.AckPolicy = ack_all ? js_AckAll : js_AckExplicit;
    cc.AckWait = std::chrono::nanoseconds(30s).count();
    cc.MaxAckPending = 20000;
    check(js_AddConsumer(nullptr, js, stream.c_str(), &cc, nullptr, nullptr) == NATS_OK,
          "raw consumer");
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream.c_str();
    so.Consumer = durable;
    const auto subject = fmt::format("amp.{}.topic.>", ns);
    check(js_PullSubscribe(&sub, js, subject.c_str(), durable, nullptr, &so, nullptr) == NATS_OK,
          "cnats pull subscribe");
    int got = 0;
    const cpu_meter cpu{nats.pid()};
    const auto start = steady::now();
    while (got < n) {
      natsMsgList list{};
      const auto st = natsSubscription_Fetch(&list, sub, static_cast<int>(batch), 5000, nullptr);
      check(st == NATS_OK, "cnats fetch");
      if (ack_all) {
        if (list.Count > 0) natsMsg_Ack(list.Msgs[list.Count - 1], nullptr);
      } else {
        for (int i = 0; i < list.Count; ++i) natsMsg_Ack(list.Msgs[i], nullptr);
      }
      got += list.Count;
      natsMsgList_Destroy(&list);
    }
    check(natsConnection_Flush(nc) == NATS_OK, "cnats flush");
    const double seconds = std::chrono::duration<double>(steady::now() - start).count();
    const auto spent = cpu.per(n);
    natsSubscription_Destroy(sub);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return {.rate = n / seconds, .cpu = spent};
  }

  // Rows per second of the sink draining `n` stored events of `ns`.
  phase sink_rate(const std::string& ns, int n, const std::string& kind, std::size_t batch,
                  const std::string& table) {
    amp::sink::sink_config c;
    c.name = "bench";
    c.ns = ns;
    c.topics = {">"};
    c.max_messages = batch;
    c.targets = {target(kind, table)};
    auto s = amp::sink::sink::create(t, c).value();
    const cpu_meter cpu{nats.pid()};
    const auto start = steady::now();
    while (s->stats().committed < static_cast<std::uint64_t>(n)) {
      const auto r = s->step();
      check(r != amp::sink::step_result::transient, "the sink failed transiently");
    }
    const double seconds = std::chrono::duration<double>(steady::now() - start).count();
    const auto spent = cpu.per(n);
    const auto stats = s->stats();
    check(stats.acked == static_cast<std::uint64_t>(n), "not every event was acknowledged");
    return {.rate = n / seconds, .cpu = spent};
  }
};

struct lag_result {
  double achieved = std::nan("");
  // Per event: from the sink's commit of its batch to the confirmation of its ack (the window
  // in which a crash makes a duplicate), and from its storage in the stream to that ack.
  double committed_p50 = std::nan(""), committed_p99 = std::nan(""), committed_max = std::nan("");
  double stored_p50 = std::nan(""), stored_p99 = std::nan(""), stored_max = std::nan("");
  std::size_t events = 0;
};

// Events at `o.rate` for `o.lag_seconds` into PostgreSQL through a sink with the spec's
// example batch (256, 50 ms).
lag_result measure_lag(bench_rig& rig, const options& o) {
  auto [ns, events] = rig.namespace_with(0);
  amp::sink::sink_config c;
  c.name = "lag";
  c.ns = ns;
  c.topics = {">"};
  c.from = {.from = amp::sink::start_position::kind::new_messages};
  c.max_messages = 256;
  c.max_wait = 50ms;
  c.targets = {rig.target("postgres", "lag")};
  std::mutex m;
  std::map<std::uint64_t, steady::time_point> stored_at;
  std::map<std::uint64_t, steady::time_point> acked_at;
  std::vector<double> committed_lags;
  amp::sink::sink_options so;
  so.on_acked = [&](const amp::sink::acked_batch& b) {
    const double window = std::chrono::duration<double, std::milli>(b.acked - b.committed).count();
    std::lock_guard lock(m);
    for (auto seq : b.seqs) {
      acked_at.emplace(seq, b.acked);
      committed_lags.push_back(window);
    }
  };
  auto s = amp::sink::sink::create(rig.t, c, {}, so).value();
  std::thread runner([&] { s->run(); });
  const int total = o.rate * o.lag_seconds;
  const auto start = steady::now();
  std::atomic<int> published{0};
  for (int i = 0; i < total; ++i) {
    std::this_thread::sleep_until(start + std::chrono::nanoseconds(1'000'000'000LL * i / o.rate));
    events->async_publish({.to = amp::topic::make("orders.eu").value(),
                           .from = "producer",
                           .body = body_of(i),
                           .type = "order"},
                          [&](amp::result<amp::publish_result> r) {
                            const auto now = steady::now();
                            if (r) {
                              std::lock_guard lock(m);
                              stored_at.emplace(r->seq, now);
                            }
                            ++published;
                          });
  }
  const double publish_seconds = std::chrono::duration<double>(steady::now() - start).count();
  const auto deadline = steady::now() + 60s;
  for (;;) {
    {
      std::lock_guard lock(m);
      if (acked_at.size() >= static_cast<std::size_t>(total)) break;
    }
    check(steady::now() < deadline, "the lag run did not finish");
    std::this_thread::sleep_for(10ms);
  }
  s->stop();
  runner.join();
  std::vector<double> lags;
  {
    std::lock_guard lock(m);
    for (const auto& [seq, at] : acked_at) {
      auto it = stored_at.find(seq);
      if (it == stored_at.end()) continue;
      lags.push_back(std::chrono::duration<double, std::milli>(at - it->second).count());
    }
  }
  std::sort(lags.begin(), lags.end());
  std::sort(committed_lags.begin(), committed_lags.end());
  check(!lags.empty() && !committed_lags.empty(), "no lag measured");
  lag_result out;
  out.achieved = total / publish_seconds;
  out.committed_p50 = amp::bench::percentile(committed_lags, 0.5);
  out.committed_p99 = amp::bench::percentile(committed_lags, 0.99);
  out.committed_max = committed_lags.back();
  out.stored_p50 = amp::bench::percentile(lags, 0.5);
  out.stored_p99 = amp::bench::percentile(lags, 0.99);
  out.stored_max = lags.back();
  out.events = lags.size();
  std::printf(
      "lag at %d events/s (achieved %.0f): committed-to-acked p50 %.2f ms, p99 %.2f ms, "
      "max %.2f ms; stored-to-acked p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
      o.rate, out.achieved, out.committed_p50, out.committed_p99, out.committed_max, out.stored_p50,
      out.stored_p99, out.stored_max);
  return out;
}

struct pair_result {
  std::vector<double> sink, baseline, ratio, raw, raw_ratio;
  // CPU per message (µs): nats-server and the benchmark's process, sink and raw drain.
  std::vector<double> sink_server_us, sink_self_us, raw_server_us, raw_self_us;
  // The raw drain with AckPolicy all (one acknowledgement per fetch).
  std::vector<double> raw_all, raw_all_server_us;
};

std::string summary_json(const std::vector<double>& v) {
  return amp::bench::json_of(amp::bench::summarize(v));
}

}  // namespace

int main(int argc, char** argv) {
  const auto o = parse(argc, argv);
  const auto loadavg_before = amp::bench::read_first_line("/proc/loadavg");
  try {
    bench_rig rig;
    std::map<std::string, std::map<std::size_t, pair_result>> results;
    std::vector<double> ceiling;
    int table_no = 0;
    for (int run = 1; run <= o.runs; ++run) {
      {
        // JetStream's own drain rate with large pulls: the most any consumer could take.
        auto [ns, events] = rig.namespace_with(o.events);
        const auto drained = rig.raw_drain(ns, o.events, 4096);
        ceiling.push_back(drained.rate);
        std::printf(
            "run %d raw cnats drain, fetch 4096: %8.0f msgs/s (CPU per message: nats-server "
            "%.1f us, client %.1f us)\n",
            run, drained.rate, drained.cpu.server_us, drained.cpu.self_us);
      }
      for (const auto& kind : o.targets) {
        for (const int b : o.batches) {
          const auto batch = static_cast<std::size_t>(b);
          const int n = batch == 1 ? std::max(200, o.events / 10) : o.events;
          const auto rows = rows_for(n, "AMP_TOPICS_bench");
          auto [ns, events] = rig.namespace_with(n);
          const auto base_table = fmt::format("baseline{}", ++table_no);
          const auto sink_table = fmt::format("sink{}", table_no);
          double baseline = 0;
          if (kind == "postgres") {
            baseline = pg_baseline(rig.pg.dsn(), base_table, rows, batch);
          } else {
            baseline =
                sqlite_baseline((rig.dir / (base_table + ".db")).string(), base_table, rows, batch);
          }
          const auto sunk = rig.sink_rate(ns, n, kind, batch, sink_table);
          const auto drained = rig.raw_drain(ns, n, batch);
          const auto drained_all = rig.raw_drain(ns, n, batch, true);
          const double sink = sunk.rate;
          const double raw = drained.rate;
          auto& r = results[kind][batch];
          r.sink.push_back(sink);
          r.baseline.push_back(baseline);
          r.ratio.push_back(sink / baseline);
          r.raw.push_back(raw);
          r.raw_ratio.push_back(sink / raw);
          r.sink_server_us.push_back(sunk.cpu.server_us);
          r.sink_self_us.push_back(sunk.cpu.self_us);
          r.raw_server_us.push_back(drained.cpu.server_us);
          r.raw_self_us.push_back(drained.cpu.self_us);
          r.raw_all.push_back(drained_all.rate);
          r.raw_all_server_us.push_back(drained_all.cpu.server_us);
          std::printf(
              "run %d %-8s batch %3zu: sink %8.0f rows/s, baseline %8.0f rows/s, ratio "
              "%.2f; raw JetStream drain %8.0f msgs/s (sink / raw %.2f); CPU per message: "
              "sink %.1f us + nats-server %.1f us, raw drain %.1f us + nats-server %.1f us\n",
              run, kind.c_str(), batch, sink, baseline, sink / baseline, raw, sink / raw,
              sunk.cpu.self_us, sunk.cpu.server_us, drained.cpu.self_us, drained.cpu.server_us);
          std::printf(
              "run %d %-8s batch %3zu: raw drain with AckPolicy all (one ack per fetch) %8.0f "
              "msgs/s, nats-server %.1f us per message\n",
              run, kind.c_str(), batch, drained_all.rate, drained_all.cpu.server_us);
          std::fflush(stdout);
        }
      }
    }

    lag_result lag;
    if (o.lag) lag = measure_lag(rig, o);
    std::string targets;
    for (const auto& [kind, by_batch] : results) {
      std::string batches;
      for (const auto& [batch, r] : by_batch) {
        batches += fmt::format(
            R"({}"{}":{{"sink_rows_per_s":{},"baseline_rows_per_s":{},"ratio":{},)"
            R"("raw_drain_msgs_per_s":{},"sink_vs_raw_drain":{},)"
            R"("cpu_us_per_msg":{{"sink":{},"sink_nats_server":{},"raw_drain":{},)"
            R"("raw_drain_nats_server":{},"raw_drain_ack_all_nats_server":{}}},)"
            R"("raw_drain_ack_all_msgs_per_s":{}}})",
            batches.empty() ? "" : ",", batch, summary_json(r.sink), summary_json(r.baseline),
            summary_json(r.ratio), summary_json(r.raw), summary_json(r.raw_ratio),
            summary_json(r.sink_self_us), summary_json(r.sink_server_us),
            summary_json(r.raw_self_us), summary_json(r.raw_server_us),
            summary_json(r.raw_all_server_us), summary_json(r.raw_all));
      }
      targets += fmt::format(R"({}"{}":{{{}}})", targets.empty() ? "" : ",", kind, batches);
    }
    const auto json = fmt::format(
        R"({{"benchmark":"amp-bench-sink","written":"{}","quick":{},"runs":{},"events":{},)"
        R"("raw_drain_ceiling_msgs_per_s":{},)"
        R"("machine":{},"targets":{{{}}},"lag":{{"offered_per_s":{},"achieved_per_s":{},)"
        R"("events":{},"committed_to_acked":{{"p50_ms":{},"p99_ms":{},"max_ms":{}}},)"
        R"("stored_to_acked":{{"p50_ms":{},"p99_ms":{},"max_ms":{}}}}}}})",
        amp::bench::now_utc(), o.quick ? "true" : "false", o.runs, o.events, summary_json(ceiling),
        amp::bench::machine_json(loadavg_before), targets, o.rate,
        amp::bench::json_number(lag.achieved, 0), lag.events,
        amp::bench::json_number(lag.committed_p50, 2),
        amp::bench::json_number(lag.committed_p99, 2),
        amp::bench::json_number(lag.committed_max, 2), amp::bench::json_number(lag.stored_p50, 2),
        amp::bench::json_number(lag.stored_p99, 2), amp::bench::json_number(lag.stored_max, 2));
    std::ofstream(o.out) << json << "\n";
    std::printf("wrote %s\n", o.out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "amp-bench-sink: %s\n", e.what());
    return 1;
  }
  return 0;
}
