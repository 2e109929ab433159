// amp-sink as a user runs it: its command line, --check, HTTP, SIGTERM, and kill -9 at
// random points while events flow (every event exactly once in SQLite and PostgreSQL).

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <csignal>
#include <random>
#include <set>
#include <thread>

#include "amp/broker/topics.hpp"
#include "amp/json.hpp"
#include "sink/pg_rig.hpp"
#include "sink/sink_rig.hpp"
#include "support/jetstream_connect.hpp"
#include "support/nats_server.hpp"
#include "support/postgres_server.hpp"
#include "support/process.hpp"

#ifndef AMP_SINK_PATH
#error "AMP_SINK_PATH must name the amp-sink binary"
#endif

using namespace amp;
using namespace amp::testing;
using namespace std::chrono_literals;

namespace {

struct finished {
  int status = -1;
  std::string out;
  std::string err;
};

finished run_sink(const temp_dir& dir, const std::vector<std::string>& args) {
  std::vector<std::string> command{AMP_SINK_PATH};
  command.insert(command.end(), args.begin(), args.end());
  const auto pid = spawn(command, dir.path() / "run.out", dir.path() / "run.err");
  finished f;
  if (auto status = reap(pid, 30s)) {
    f.status = *status;
  } else {
    ::kill(pid, SIGKILL);
    reap(pid, 5s);
  }
  f.out = read_file(dir.path() / "run.out");
  f.err = read_file(dir.path() / "run.err");
  return f;
}

// amp-sink running in the background; killed when the object goes.
class sink_process {
 public:
  sink_process(const temp_dir& dir, std::vector<std::string> args) : dir_(dir) {
    std::vector<std::string> command{AMP_SINK_PATH};
    command.insert(command.end(), args.begin(), args.end());
    err_ = dir.path() / fmt::format("sink.err.{}", ++runs_);
    pid_ = spawn(command, dir.path() / "sink.out", err_);
  }
  ~sink_process() { kill(); }
  sink_process(const sink_process&) = delete;
  sink_process& operator=(const sink_process&) = delete;

  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    reap(pid_, 10s);
    pid_ = -1;
  }
  void signal(int sig) const { ::kill(pid_, sig); }
  std::optional<int> wait_exit(std::chrono::milliseconds limit) {
    auto s = reap(pid_, limit);
    if (s) pid_ = -1;
    return s;
  }
  std::string log() const { return read_file(err_); }
  bool wait_for_log(const std::string& text, std::chrono::milliseconds limit = 15s) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (log().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

 private:
  const temp_dir& dir_;
  std::filesystem::path err_;
  static inline int runs_ = 0;
  pid_t pid_ = -1;
};

struct rig {
  nats_server nats = nats_server::start();
  std::shared_ptr<transport> t = connect_jetstream(nats, {});
  std::shared_ptr<topics> events =
      topics::open(t, {.ns = namespace_name::make("demo").value()}).value();
  temp_dir dir;

  std::string config(const std::string& targets, const std::string& extra = "") const {
    return fmt::format(R"({{"nats":{{"url":{}}},"name":"archive",
      "source":{{"ns":"demo","kind":"topics","topics":[">"]}},
      "batch":{{"max_messages":64,"max_wait_ms":20}},"ack_wait_s":2,
      "targets":[{}]{}}})",
                       json_quote(nats.url()), targets, extra);
  }
  std::string sqlite_target() const {
    return fmt::format(R"({{"kind":"sqlite","path":{},"table":"events"}})",
                       json_quote((dir.path() / "archive.db").string()));
  }

  bool drained(std::chrono::milliseconds limit = 30s) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      auto info = t->consumer_info_of("AMP_TOPICS_demo", "archive");
      if (info && info->num_pending == 0 && info->num_ack_pending == 0) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
};

std::uint16_t free_http_port() {
  return static_cast<std::uint16_t>(free_port());
}

}  // namespace

TEST_CASE("amp-sink --help lists every key and --version prints the version", "[sink][program]") {
  temp_dir dir;
  auto help = run_sink(dir, {"--help"});
  CHECK(help.status == 0);
  for (const char* key : {"source.topics", "idempotency.strategy", "on_duplicate",
                          "dlq.max_failures", "batch.max_wait_ms", "--check", "SIGTERM"}) {
    CHECK(help.out.find(key) != std::string::npos);
  }
  auto version = run_sink(dir, {"--version"});
  CHECK(version.status == 0);
  CHECK(version.out.rfind("amp-sink ", 0) == 0);
}

TEST_CASE("a bad configuration stops amp-sink at start with a message naming the key",
          "[sink][program]") {
  temp_dir dir;
  auto status_of = [&](const std::string& text) {
    const auto file = dir.write("c.json", text);
    return run_sink(dir, {"--config", file.string()});
  };
  auto r = status_of("{\"name\": \"a\",");
  CHECK(r.status == 2);
  CHECK(r.err.find("not valid JSON") != std::string::npos);
  r = status_of(R"({"name":"a","on_duplicat":"skip"})");
  CHECK(r.status == 2);
  CHECK(r.err.find(R"(unknown key "on_duplicat" (did you mean "on_duplicate"?))") !=
        std::string::npos);
  r = status_of(R"({"name":"a","batch":{"max_messages":100000}})");
  CHECK(r.status == 2);
  CHECK(r.err.find("batch.max_messages: must be an integer from 1 to 10000") != std::string::npos);
  r = run_sink(dir, {"--config", (dir.path() / "missing.json").string()});
  CHECK(r.status == 2);
  CHECK(r.err.find("cannot read") != std::string::npos);
  r = run_sink(dir, {"--bogus"});
  CHECK(r.status == 2);
  CHECK(r.err.find("unknown option \"--bogus\"") != std::string::npos);
}

TEST_CASE("amp-sink --check opens every target and looks for the source, consuming nothing",
          "[sink][program]") {
  rig r;
  publish_event(*r.events, "news.eu", "1");
  const auto file = r.dir.write("c.json", r.config(r.sqlite_target()));
  auto ok = run_sink(r.dir, {"--config", file.string(), "--check"});
  INFO(ok.err);
  CHECK(ok.status == 0);
  CHECK(ok.out.find("ok sqlite ") != std::string::npos);
  CHECK(ok.out.find("ok source AMP_TOPICS_demo filter amp.demo.topic.> (1 messages)") !=
        std::string::npos);
  CHECK(std::filesystem::exists(r.dir.path() / "archive.db"));
  CHECK_FALSE(r.t->consumer_info_of("AMP_TOPICS_demo", "archive"));

  // A namespace never used has no stream yet: the sink would wait for it.
  auto fresh = r.config(r.sqlite_target());
  fresh.replace(fresh.find(R"("ns":"demo")"), 11, R"("ns":"fresh")");
  auto waits = run_sink(r.dir, {"--config", r.dir.write("fresh.json", fresh).string(), "--check"});
  CHECK(waits.status == 0);
  CHECK(waits.out.find("wait source AMP_TOPICS_fresh filter amp.fresh.topic.>: not there yet") !=
        std::string::npos);

  // Keys the file lacks may come from --set (and its absence is then named).
  auto partial = r.config(r.sqlite_target());
  partial.replace(partial.find(R"("name":"archive",)"), 17, "");
  partial.replace(partial.find(R"("ns":"demo",)"), 12, "");
  const auto partial_file = r.dir.write("partial.json", partial);
  auto lacking = run_sink(r.dir, {"--config", partial_file.string(), "--check"});
  CHECK(lacking.status == 2);
  CHECK(lacking.err.find("name: is required") != std::string::npos);
  auto completed = run_sink(r.dir, {"--config", partial_file.string(), "--set", R"(name="late")",
                                    "--set", R"(source.ns="demo")", "--check"});
  INFO(completed.err);
  CHECK(completed.status == 0);
  CHECK(completed.out.find("ok source AMP_TOPICS_demo") != std::string::npos);

  const auto bad =
      r.dir.write("bad.json", r.config(R"({"kind":"postgres","dsn":"host=127.0.0.1 port=1 dbname=x",
        "table":"events"})"));
  auto failed = run_sink(r.dir, {"--config", bad.string(), "--check"});
  CHECK(failed.status == 1);
  CHECK(failed.err.find("postgres host=127.0.0.1 port=1 dbname=x:events: cannot connect") !=
        std::string::npos);
}

TEST_CASE(
    "amp-sink serves health, readiness and metrics, and SIGTERM finishes the batch and "
    "exits 0",
    "[sink][program]") {
  rig r;
  const auto port = free_http_port();
  const auto file = r.dir.write(
      "c.json", r.config(r.sqlite_target(), fmt::format(R"(,"http":"127.0.0.1:{}")", port)));
  sink_process p(r.dir, {"--config", file.string()});
  REQUIRE(p.wait_for_log("\"running\""));
  for (int i = 0; i < 10; ++i) publish_event(*r.events, "news.eu", fmt::format("{}", i));
  REQUIRE(r.drained());
  CHECK(http_get(port, "/healthz").status == 200);
  CHECK(http_get(port, "/readyz").status == 200);
  const auto metrics = http_get(port, "/metrics");
  CHECK(metrics.status == 200);
  CHECK(metrics.body.find("amp_sink_messages_committed_total{sink=\"archive\"} 10") !=
        std::string::npos);
  CHECK(metrics.body.find("amp_sink_commit_seconds_count{sink=\"archive\"}") != std::string::npos);
  CHECK(metrics.body.find("amp_sink_lag{sink=\"archive\"}") != std::string::npos);
  CHECK(http_get(port, "/nothing").status == 404);
  CHECK(sqlite_rows((r.dir.path() / "archive.db").string(), "events").size() == 10);

  p.signal(SIGTERM);
  CHECK(p.wait_exit(10s) == 0);
  CHECK(p.log().find("\"stopped\"") != std::string::npos);
}

TEST_CASE("an http address that cannot be served stops amp-sink before it makes its consumer",
          "[sink][program]") {
  rig r;
  // Hold a port, as another program would.
  const int held = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(held >= 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  at.sin_port = 0;
  REQUIRE(::bind(held, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0);
  REQUIRE(::listen(held, 1) == 0);
  socklen_t len = sizeof at;
  REQUIRE(::getsockname(held, reinterpret_cast<sockaddr*>(&at), &len) == 0);
  const auto port = ntohs(at.sin_port);
  const auto file = r.dir.write(
      "c.json", r.config(r.sqlite_target(), fmt::format(R"(,"http":"127.0.0.1:{}")", port)));
  auto run = run_sink(r.dir, {"--config", file.string()});
  ::close(held);
  CHECK(run.status == 1);
  CHECK(run.err.find(std::to_string(port)) != std::string::npos);
  CHECK(code_of(r.t->consumer_info_of("AMP_TOPICS_demo", "archive")) == errc::not_found);
}

TEST_CASE("/readyz says 503 while PostgreSQL is down, and nothing is acknowledged meanwhile",
          "[sink][program][postgres]") {
  rig r;
  postgres_server pg = postgres_server::start({.fsync = false});
  const auto port = free_http_port();
  const auto file = r.dir.write(
      "c.json", r.config(fmt::format(R"({{"kind":"postgres","dsn":{},"table":"events"}})",
                                     json_quote(pg.dsn())),
                         fmt::format(R"(,"http":"127.0.0.1:{}")", port)));
  sink_process p(r.dir, {"--config", file.string()});
  REQUIRE(p.wait_for_log("\"running\""));
  publish_event(*r.events, "news.eu", "1");
  REQUIRE(r.drained());
  pg.stop();
  publish_event(*r.events, "news.eu", "2");
  const auto deadline = std::chrono::steady_clock::now() + 15s;
  while (http_get(port, "/readyz").status != 503 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  CHECK(http_get(port, "/readyz").status == 503);
  CHECK(http_get(port, "/healthz").status == 200);
  std::this_thread::sleep_for(500ms);
  auto info = r.t->consumer_info_of("AMP_TOPICS_demo", "archive").value();
  CHECK(info.num_ack_pending + info.num_pending == 1);
  CHECK(p.log().find("target_unavailable") != std::string::npos);
  pg.restart();
  REQUIRE(r.drained());
  CHECK(http_get(port, "/readyz").status == 200);
  CHECK(pg_value(pg.dsn(), "SELECT count(*) FROM events") == "2");
}

TEST_CASE(
    "amp-sink killed at random points while events flow: after a restart every event is "
    "in SQLite and PostgreSQL exactly once",
    "[sink][program][postgres][kill]") {
  rig r;
  postgres_server pg = postgres_server::start({.fsync = false});
  const auto file = r.dir.write(
      "c.json", r.config(r.sqlite_target() +
                         fmt::format(R"(,{{"kind":"postgres","dsn":{},"table":"events"}})",
                                     json_quote(pg.dsn()))));
  constexpr int k_events = 2000;
  std::set<std::uint64_t> published;
  std::atomic<bool> publishing{true};
  std::thread publisher([&] {
    for (int i = 0; i < k_events; ++i) {
      published.insert(publish_event(*r.events, "load.kill", fmt::format(R"({{"i":{}}})", i)));
      if (i % 50 == 0) std::this_thread::sleep_for(20ms);
    }
    publishing = false;
  });
  std::mt19937 random(std::random_device{}());
  int kills = 0;
  while (publishing || kills < 20) {
    sink_process p(r.dir, {"--config", file.string()});
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(50, 400)(random)));
    p.kill();
    ++kills;
  }
  publisher.join();
  sink_process last(r.dir, {"--config", file.string()});
  REQUIRE(last.wait_for_log("\"running\""));
  REQUIRE(r.drained(60s));
  last.signal(SIGTERM);
  CHECK(last.wait_exit(10s) == 0);

  INFO("kills: " << kills);
  const auto rows = sqlite_rows((r.dir.path() / "archive.db").string(), "events");
  std::set<std::uint64_t> in_sqlite;
  for (const auto& [key, row] : rows) in_sqlite.insert(std::stoull(row.at("seq")));
  CHECK(rows.size() == k_events);
  CHECK(in_sqlite == published);
  std::set<std::uint64_t> in_pg;
  for (const auto& row : pg_query(pg.dsn(), "SELECT seq FROM events")) {
    in_pg.insert(std::stoull(row[0]));
  }
  CHECK(pg_value(pg.dsn(), "SELECT count(*) FROM events") == std::to_string(k_events));
  CHECK(in_pg == published);
}
