// amp-bench-sessions: many idle sessions on amp-server (issue 6). N connected sessions, each
// hello'd and registered in the presence registry, send `heartbeat` at the cadence the
// server asks for (`heartbeat_s` of the hello reply); the benchmark measures amp-server's
// resident memory per session and its CPU use while they heartbeat.
//
//   amp-bench-sessions [--backend jetstream|memory] [--runs R] [--sessions N] [--window S]
//                      [--in-flight K] [--register none|presence|worker] [--quick]
//                      [--out FILE]
//
// amp::client runs a thread per connection, so the sessions are made by a light load
// generator here: websocketpp clients on one asio io_context (one thread for all of them),
// connecting with at most K handshakes in flight. Every run starts a fresh amp-server (and
// nats-server for JetStream) so that "before" is a server that has never held a session.

#include <unistd.h>

#include <websocketpp/client.hpp>
#include <websocketpp/config/asio_no_tls_client.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "support/nats_server.hpp"
#include "support/server_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using namespace amp::bench;
using steady = std::chrono::steady_clock;

struct options {
  std::string backend = "jetstream";
  int runs = 3;
  int sessions = 10000;
  double window_s = 30;
  int in_flight = 100;
  std::string register_mode = "presence";
  bool quick = false;
  std::string out = AMP_BENCH_SESSIONS_OUT;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "amp-bench-sessions: %s\n"
               "usage: amp-bench-sessions [--backend jetstream|memory] [--runs R] [--sessions N]\n"
               "       [--window SECONDS] [--in-flight K] [--register none|presence|worker]\n"
               "       [--quick] [--out FILE]\n"
               "defaults: jetstream, 3 runs, 10000 sessions, a 30 s window, 100 handshakes in\n"
               "          flight, presence (register with no jobs and 0 slots);\n"
               "          the window starts registry_ttl_s + 2 s after the last session is live;\n"
               "--quick: 1 run, 5 s settling, a 10 s window; 10000 sessions on memory, 3000 on\n"
               "         JetStream\n",
               why.c_str());
  std::exit(why == "help" ? 0 : 2);
}

options parse(int argc, char** argv) {
  options o;
  std::optional<int> runs;
  std::optional<double> window;
  std::optional<int> sessions;
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
    } else if (a == "--sessions") {
      sessions = std::stoi(value());
    } else if (a == "--window") {
      window = std::stod(value());
    } else if (a == "--in-flight") {
      o.in_flight = std::stoi(value());
    } else if (a == "--register") {
      o.register_mode = value();
      if (o.register_mode != "none" && o.register_mode != "presence" && o.register_mode != "worker")
        usage("--register: none, presence or worker");
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "-h" || a == "--help") {
      usage("help");
    } else {
      usage("unknown argument " + a);
    }
  }
  if (o.quick) {
    o.runs = 1;
    o.window_s = 10;
    // JetStream connects a few hundred sessions a second here: 10,000 would take the
    // quick run well over a minute.
    if (o.backend == "jetstream") o.sessions = 3000;
  }
  if (sessions) o.sessions = *sessions;
  if (runs) o.runs = *runs;
  if (window) o.window_s = *window;
  if (o.runs < 1 || o.sessions < 1 || o.window_s <= 0 || o.in_flight < 1) usage("bad values");
  return o;
}

// The client side of a connection: a small read buffer, since the frames are small.
struct small_client_config : websocketpp::config::asio_client {
  using type = small_client_config;
  static const std::size_t connection_read_buffer_size = 4096;
};
using ws_client = websocketpp::client<small_client_config>;

// The load generator: every connection on one io_context, run by one thread.
class load_generator {
 public:
  enum class state { waiting, connecting, hello, registering, live, closed, failed };

  struct session {
    int index = 0;
    state st = state::waiting;
    ws_client::connection_ptr con;
    std::int64_t next_id = 1;
    steady::time_point next_heartbeat{};
    steady::time_point heartbeat_sent{};
    bool heartbeat_outstanding = false;
  };

  load_generator(std::string url, std::string ns, int sessions, int in_flight,
                 std::string register_mode)
      : url_(std::move(url)),
        ns_(std::move(ns)),
        register_mode_(std::move(register_mode)),
        in_flight_limit_(in_flight),
        sessions_(static_cast<std::size_t>(sessions)) {
    for (int i = 0; i < sessions; ++i) sessions_[static_cast<std::size_t>(i)].index = i;
    // Tokens are minted before the clock starts: HMAC-SHA256 is not what is measured.
    tokens_.reserve(sessions_.size());
    for (int i = 0; i < sessions; ++i) tokens_.push_back(token(participant(i), ns_));
    client_.clear_access_channels(websocketpp::log::alevel::all);
    client_.clear_error_channels(websocketpp::log::elevel::all);
    client_.init_asio(&io_);
    client_.set_open_handshake_timeout(30000);
    client_.set_close_handshake_timeout(5000);
  }

  ~load_generator() { stop(); }

  // Starts connecting; `heartbeat_s` is the cadence every live session keeps.
  void start(int heartbeat_s) {
    heartbeat_interval_ = std::chrono::seconds(heartbeat_s);
    started_at_ = steady::now();
    asio::post(io_, [this] {
      for (int i = 0; i < in_flight_limit_; ++i) launch_next();
      arm_tick();
    });
    thread_ = std::thread([this] { io_.run(); });
  }

  // Waits until every session is live (true), or one failed or `limit` passed (false).
  bool wait_live(std::chrono::seconds limit) {
    auto deadline = steady::now() + limit;
    while (steady::now() < deadline) {
      if (failed_ > 0 || closed_ > 0) return false;
      if (live_ == static_cast<long>(sessions_.size())) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  // The connect rate over each tenth of the sessions, in order: whether it falls as the
  // server holds more.
  std::vector<double> connect_rates_by_tenth() {
    std::lock_guard lock(mu_);
    std::vector<double> out;
    auto prev = started_at_;
    const double tenth = std::max<double>(1, static_cast<double>(sessions_.size() / 10));
    for (auto t : tenths_) {
      out.push_back(tenth / std::chrono::duration<double>(t - prev).count());
      prev = t;
    }
    return out;
  }

  double connect_seconds() const {
    return std::chrono::duration<double>(all_live_at_ - started_at_).count();
  }

  // Runs `f` on the I/O thread and waits for it.
  template <class F>
  auto on_io(F f) {
    // Shared: on a timeout the posted work may still run after this returns.
    auto task = std::make_shared<std::packaged_task<decltype(f())()>>(std::move(f));
    auto result = task->get_future();
    asio::post(io_, [task] { (*task)(); });
    if (result.wait_for(30s) != std::future_status::ready)
      throw std::runtime_error("the load generator's thread did not answer in 30 s");
    return result.get();
  }

  struct counters {
    long sent = 0, ok = 0, errors = 0, live = 0, closed = 0, failed = 0;
  };
  counters snapshot() {
    return on_io([this] {
      return counters{sent_, ok_, errors_, live_.load(), closed_.load(), failed_.load()};
    });
  }
  void measure_rtt(bool on) {
    on_io([this, on] {
      measuring_ = on;
      if (on) rtt_ms_.clear();
      return 0;
    });
  }
  std::vector<double> rtts() {
    return on_io([this] { return rtt_ms_; });
  }
  std::string first_problem() {
    std::lock_guard lock(mu_);
    return first_problem_;
  }

  // Closes every connection (closing handshake), waits for them, stops the thread.
  void stop() {
    if (!thread_.joinable()) return;
    try {
      on_io([this] {
        stopping_ = true;
        tick_.cancel();
        for (auto& s : sessions_) {
          if (!s.con) continue;
          websocketpp::lib::error_code ec;
          if (s.st == state::connecting) {
            s.con->terminate(ec);
          } else if (s.st != state::closed && s.st != state::failed) {
            s.con->close(websocketpp::close::status::normal, "", ec);
          }
        }
        return 0;
      });
    } catch (const std::exception&) {
    }
    auto deadline = steady::now() + 30s;
    while (steady::now() < deadline && open_connections_ > 0) std::this_thread::sleep_for(10ms);
    still_open_ = open_connections_.load();
    io_.stop();
    thread_.join();
    for (auto& s : sessions_) s.con.reset();
  }
  // Connections whose closing handshake had not ended 30 s after `stop` began.
  long still_open() const { return still_open_; }

 private:
  static std::string participant(int i) { return fmt::format("idle{:05}", i); }

  void problem(const std::string& what) {
    std::lock_guard lock(mu_);
    if (first_problem_.empty()) first_problem_ = what;
  }

  void launch_next() {
    if (stopping_ || next_ >= sessions_.size()) return;
    auto& s = sessions_[next_++];
    websocketpp::lib::error_code ec;
    s.con = client_.get_connection(url_, ec);
    if (ec) {
      ++failed_;
      problem("get_connection: " + ec.message());
      return;
    }
    s.con->add_subprotocol("amp.v1", ec);
    s.st = state::connecting;
    ++open_connections_;
    session* sp = &s;
    s.con->set_open_handler([this, sp](websocketpp::connection_hdl) { on_open(*sp); });
    s.con->set_message_handler([this, sp](websocketpp::connection_hdl, ws_client::message_ptr m) {
      on_message(*sp, m->get_payload());
    });
    s.con->set_fail_handler([this, sp](websocketpp::connection_hdl) {
      --open_connections_;
      sp->st = state::failed;
      ++failed_;
      problem(
          fmt::format("session {} failed to connect: {}", sp->index, sp->con->get_ec().message()));
      launch_next();
    });
    s.con->set_close_handler([this, sp](websocketpp::connection_hdl) {
      --open_connections_;
      if (sp->st == state::live) --live_;
      sp->st = state::closed;
      if (!stopping_) {
        ++closed_;
        problem(fmt::format("session {} was closed by the server: {} {}", sp->index,
                            sp->con->get_remote_close_code(), sp->con->get_remote_close_reason()));
      }
    });
    client_.connect(s.con);
  }

  void send(session& s, const std::string& text) {
    websocketpp::lib::error_code ec = s.con->send(text, websocketpp::frame::opcode::text);
    if (ec) problem(fmt::format("session {}: cannot send: {}", s.index, ec.message()));
  }

  void on_open(session& s) {
    s.st = state::hello;
    send(s, fmt::format(R"({{"op":"hello","id":{},"token":"{}"}})", s.next_id++,
                        tokens_[static_cast<std::size_t>(s.index)]));
  }

  void become_live(session& s) {
    s.st = state::live;
    // The first heartbeat at a random point of the interval: spread, as real clients are.
    std::uniform_int_distribution<long> spread(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(heartbeat_interval_).count());
    s.next_heartbeat = steady::now() + std::chrono::milliseconds(spread(rng_));
    const long live = ++live_;
    const long tenth = std::max<long>(1, static_cast<long>(sessions_.size()) / 10);
    if (live % tenth == 0) {
      std::lock_guard lock(mu_);
      tenths_.push_back(steady::now());
    }
    if (live == static_cast<long>(sessions_.size())) all_live_at_ = steady::now();
    launch_next();
  }

  void on_message(session& s, const std::string& text) {
    const bool ok = text.find(R"("op":"ok")") != std::string::npos;
    const bool error = text.find(R"("op":"error")") != std::string::npos;
    if (!ok && !error) return;  // a push: none is expected, none matters here
    if (error) {
      ++errors_;
      problem(fmt::format("session {}: {}", s.index, text));
      if (s.st != state::live) {
        s.st = state::failed;
        ++failed_;
      }
      return;
    }
    switch (s.st) {
      case state::hello:
        if (register_mode_ == "none") return become_live(s);
        s.st = state::registering;
        send(s, fmt::format(R"({{"op":"register","id":{},"jobs":[{}],"slots":{}}})", s.next_id++,
                            register_mode_ == "worker" ? R"("idle")" : "",
                            register_mode_ == "worker" ? 1 : 0));
        return;
      case state::registering: return become_live(s);
      case state::live:
        if (s.heartbeat_outstanding) {
          s.heartbeat_outstanding = false;
          ++ok_;
          if (measuring_) {
            rtt_ms_.push_back(
                std::chrono::duration<double, std::milli>(steady::now() - s.heartbeat_sent)
                    .count());
          }
        }
        return;
      default: return;
    }
  }

  void arm_tick() {
    tick_.expires_after(20ms);
    tick_.async_wait([this](const asio::error_code& ec) {
      if (ec || stopping_) return;
      auto now = steady::now();
      for (auto& s : sessions_) {
        if (s.st != state::live || s.next_heartbeat > now) continue;
        s.next_heartbeat += heartbeat_interval_;
        if (s.heartbeat_outstanding) {
          ++late_;  // the previous reply has not come: count it, send anyway
        }
        s.heartbeat_outstanding = true;
        s.heartbeat_sent = now;
        ++sent_;
        send(s, fmt::format(R"({{"op":"heartbeat","id":{}}})", s.next_id++));
      }
      arm_tick();
    });
  }

  // The io_context first: it must outlive the endpoint, the timer and the connections.
  asio::io_context io_;
  std::string url_, ns_, register_mode_;
  int in_flight_limit_;
  std::vector<std::string> tokens_;
  ws_client client_;
  asio::steady_timer tick_{io_};
  std::vector<session> sessions_;
  std::thread thread_;
  std::mt19937 rng_{42};
  std::size_t next_ = 0;
  steady::duration heartbeat_interval_ = 10s;
  steady::time_point started_at_{}, all_live_at_{};
  bool stopping_ = false;
  bool measuring_ = false;
  std::vector<double> rtt_ms_;
  long sent_ = 0, ok_ = 0, errors_ = 0, late_ = 0;
  std::atomic<long> live_{0}, closed_{0}, failed_{0}, open_connections_{0};
  long still_open_ = 0;
  std::mutex mu_;
  std::string first_problem_;
  std::vector<steady::time_point> tenths_;
};

struct run_result {
  double rss_before_mib = 0, rss_after_mib = 0, kib_per_session = 0;
  double cpu_percent = 0, nats_cpu_percent = -1, connect_per_s = 0, heartbeats_per_s = 0;
  double rtt_p50 = 0, rtt_p99 = 0, bench_rss_mib = 0, close_s = 0, server_stop_s = 0;
  int heartbeat_s = 0, settle_s = 0;
  std::vector<double> connect_by_tenth;
};

run_result run_once(const options& o, int run) {
  std::optional<amp::testing::nats_server> nats;
  if (o.backend == "jetstream") nats.emplace(amp::testing::nats_server::start());
  auto port = static_cast<std::uint16_t>(amp::testing::free_port());
  std::optional<server_process> server;
  server.emplace(nats ? nats->url() : std::string(), port, "amp-bench-sessions");
  auto ns = fmt::format("idle{}r{}", ::getpid() % 100000, run);

  // One session opens the namespace (streams, buckets, the registry's watches): what every
  // later session shares is in "before".
  auto probe = connect(server->url(), "probe", ns);
  if (o.register_mode != "none") {
    auto reg = o.register_mode == "worker" ? probe->register_worker({"idle"}, 1)
                                           : probe->register_worker({}, 0);
    if (!reg) throw std::runtime_error("probe register: " + reg.error().to_string());
  }
  const int heartbeat_s = probe->heartbeat_s();
  const int registry_ttl_s = probe->registry_ttl_s();
  std::this_thread::sleep_for(1s);
  const long rss_before = rss_kib(server->pid());

  load_generator gen(server->url(), ns, o.sessions, o.in_flight, o.register_mode);
  gen.start(heartbeat_s);
  const auto connect_limit = std::chrono::seconds(60 + o.sessions / 50);
  if (!gen.wait_live(connect_limit)) {
    auto c = gen.snapshot();
    throw std::runtime_error(fmt::format(
        "run {}: {} of {} sessions live ({} failed, {} closed) after {} s; first problem: {}\n"
        "amp-server log tail:\n{}",
        run + 1, c.live, o.sessions, c.failed, c.closed, connect_limit.count(), gen.first_problem(),
        server->log_tail()));
  }
  run_result r;
  const double connect_per_s = o.sessions / gen.connect_seconds();
  std::printf("run %d: %d sessions live in %.2f s (%.0f connects/s, hello%s)\n", run + 1,
              o.sessions, gen.connect_seconds(), connect_per_s,
              o.register_mode == "none" ? " only" : " + register");
  r.connect_by_tenth = gen.connect_rates_by_tenth();
  std::string tenths;
  for (double v : r.connect_by_tenth) tenths += fmt::format(" {:.0f}", v);
  std::printf("run %d: connects/s over each tenth of the sessions:%s\n", run + 1, tenths.c_str());
  std::fflush(stdout);

  // Settle: the connecting burst's work drains and every registry entry has been written
  // for longer than its TTL, so that whatever a write's TTL sets off later (the memory
  // transport's expiry timers, the sweeper) is in the window. --quick waits 5 s only.
  const int settle_s = o.quick ? 5 : std::max(5, registry_ttl_s + 2);
  std::this_thread::sleep_for(std::chrono::seconds(settle_s));
  gen.measure_rtt(true);
  auto c0 = gen.snapshot();
  const double cpu0 = cpu_seconds(server->pid());
  const double nats0 = nats ? cpu_seconds(nats->pid()) : 0;
  const auto t0 = steady::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.window_s));
  const double wall = std::chrono::duration<double>(steady::now() - t0).count();
  const double cpu1 = cpu_seconds(server->pid());
  const double nats1 = nats ? cpu_seconds(nats->pid()) : 0;
  auto c1 = gen.snapshot();
  gen.measure_rtt(false);
  const long rss_after = rss_kib(server->pid());
  const long bench_rss = rss_kib(::getpid());

  if (c1.errors > 0 || c1.closed > 0 || c1.failed > 0 || c1.live != o.sessions) {
    throw std::runtime_error(
        fmt::format("run {}: {} errors, {} sessions closed, {} failed, {} live; first problem: "
                    "{}\namp-server log tail:\n{}",
                    run + 1, c1.errors, c1.closed, c1.failed, c1.live, gen.first_problem(),
                    server->log_tail()));
  }
  // Every heartbeat sent before the window's last second must have been answered.
  const long unanswered = c1.sent - c1.ok;
  if (unanswered > o.sessions / 10 + 100) {
    throw std::runtime_error(
        fmt::format("run {}: {} heartbeats unanswered at the end of the window ({} sent)", run + 1,
                    unanswered, c1.sent));
  }
  auto rtts = gen.rtts();
  std::sort(rtts.begin(), rtts.end());

  r.heartbeat_s = heartbeat_s;
  r.settle_s = settle_s;
  r.rss_before_mib = rss_before / 1024.0;
  r.rss_after_mib = rss_after / 1024.0;
  r.kib_per_session = static_cast<double>(rss_after - rss_before) / o.sessions;
  r.cpu_percent = 100 * (cpu1 - cpu0) / wall;
  if (nats) r.nats_cpu_percent = 100 * (nats1 - nats0) / wall;
  r.connect_per_s = connect_per_s;
  r.heartbeats_per_s = static_cast<double>(c1.ok - c0.ok) / wall;
  r.rtt_p50 = percentile(rtts, 0.50);
  r.rtt_p99 = percentile(rtts, 0.99);
  r.bench_rss_mib = bench_rss / 1024.0;
  std::printf(
      "run %d: amp-server RSS %.1f -> %.1f MiB (%.1f KiB/session), CPU %.1f%% of a core%s, "
      "%.0f heartbeats/s, heartbeat round trip p50 %.2f ms p99 %.2f ms\n",
      run + 1, r.rss_before_mib, r.rss_after_mib, r.kib_per_session, r.cpu_percent,
      nats ? fmt::format(" (nats-server {:.1f}%)", r.nats_cpu_percent).c_str() : "",
      r.heartbeats_per_s, r.rtt_p50, r.rtt_p99);
  std::fflush(stdout);

  probe.reset();
  const auto closing = steady::now();
  gen.stop();
  r.close_s = std::chrono::duration<double>(steady::now() - closing).count();
  if (gen.still_open() > 0) {
    std::printf("run %d: warning: %ld connections still open 30 s after closing began\n", run + 1,
                gen.still_open());
  }
  const auto stopping = steady::now();
  server.reset();
  r.server_stop_s = std::chrono::duration<double>(steady::now() - stopping).count();
  std::printf("run %d: the sessions closed in %.2f s, amp-server stopped in %.2f s\n", run + 1,
              r.close_s, r.server_stop_s);
  std::fflush(stdout);
  return r;
}

int run(const options& o) {
  const auto limit = raise_fd_limit();
  if (limit < static_cast<std::uint64_t>(o.sessions) + 200) {
    throw std::runtime_error(fmt::format(
        "this process may open only {} files, {} sessions need more", limit, o.sessions));
  }
  const auto loadavg_before = read_first_line("/proc/loadavg");
  std::vector<run_result> results;
  for (int r = 0; r < o.runs; ++r) results.push_back(run_once(o, r));

  auto figure = [&](auto member) {
    std::vector<double> v;
    for (auto& r : results) v.push_back(r.*member);
    return summarize(v);
  };
  auto before = figure(&run_result::rss_before_mib), after = figure(&run_result::rss_after_mib),
       per = figure(&run_result::kib_per_session), cpu = figure(&run_result::cpu_percent),
       nats_cpu = figure(&run_result::nats_cpu_percent),
       connects = figure(&run_result::connect_per_s), hb = figure(&run_result::heartbeats_per_s),
       p50 = figure(&run_result::rtt_p50), p99 = figure(&run_result::rtt_p99),
       bench_rss = figure(&run_result::bench_rss_mib), close = figure(&run_result::close_s);
  std::string tenths;
  for (std::size_t i = 0; i < results[0].connect_by_tenth.size(); ++i) {
    std::vector<double> v;
    for (auto& r : results) v.push_back(i < r.connect_by_tenth.size() ? r.connect_by_tenth[i] : 0);
    tenths += (tenths.empty() ? "" : ",") + json_of(summarize(v));
  }

  std::printf(
      "\namp-server with %d idle sessions (%s backend, %s, heartbeat every %d s, %.0f s "
      "window, %d runs)\n",
      o.sessions, o.backend.c_str(), o.register_mode.c_str(), results[0].heartbeat_s, o.window_s,
      o.runs);
  std::printf("%-36s%12s%12s%12s\n", "figure", "min", "median", "max");
  auto row = [](const char* name, const summary& s, const char* format) {
    std::printf("%-36s", name);
    for (double v : {s.min, s.median, s.max}) std::printf(format, v);
    std::printf("\n");
  };
  row("RSS before, MiB", before, "%12.1f");
  row("RSS with the sessions, MiB", after, "%12.1f");
  row("RSS per session, KiB", per, "%12.1f");
  row("CPU, % of one core", cpu, "%12.1f");
  if (o.backend == "jetstream") row("nats-server CPU, % of one core", nats_cpu, "%12.1f");
  row("connects/s (hello + register)", connects, "%12.0f");
  row("heartbeats/s answered", hb, "%12.0f");
  row("heartbeat round trip p50, ms", p50, "%12.2f");
  row("heartbeat round trip p99, ms", p99, "%12.2f");

  auto json = fmt::format(
      R"({{"benchmark":"amp-bench-sessions",)"
      R"("via":"amp-server over WebSocket, websocketpp load generator on one io_context",)"
      R"("backend":"{}","storage":"{}","runs":{},"sessions":{},"register":"{}",)"
      R"("heartbeat_interval_s":{},"settle_s":{},"window_s":{},"connect_in_flight":{},"machine":{},)"
      R"("rss_mib_before":{},"rss_mib_after":{},"rss_kib_per_session":{},)"
      R"("cpu_percent_of_core":{},"nats_cpu_percent_of_core":{},"connect_per_s":{},)"
      R"("connect_per_s_by_tenth":[{}],"heartbeats_per_s":{},"heartbeat_rtt_p50_ms":{},)"
      R"("heartbeat_rtt_p99_ms":{},"close_s":{},"benchmark_rss_mib":{}}})",
      o.backend, o.backend == "jetstream" ? "file" : "memory", o.runs, o.sessions, o.register_mode,
      results[0].heartbeat_s, results[0].settle_s, o.window_s, o.in_flight,
      machine_json(loadavg_before), json_of(before), json_of(after), json_of(per), json_of(cpu),
      o.backend == "jetstream" ? json_of(nats_cpu) : std::string("null"), json_of(connects), tenths,
      json_of(hb), json_of(p50), json_of(p99), json_of(close), json_of(bench_rss));
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
    std::fprintf(stderr, "amp-bench-sessions: %s\n", e.what());
    return 1;
  }
}
