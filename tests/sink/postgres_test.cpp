// The sink on JetStream (a real nats-server) into a real PostgreSQL: commit-then-ack,
// duplicates, rows PostgreSQL refuses, the database stopped under load, ended tasks.

#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "amp/broker/job_queue.hpp"
#include "amp/broker/topics.hpp"
#include "amp/sink/sink.hpp"
#include "sink/pg_rig.hpp"
#include "sink/sink_rig.hpp"
#include "support/jetstream_connect.hpp"
#include "support/nats_server.hpp"
#include "support/postgres_server.hpp"

using namespace amp;
using namespace amp::testing;
using namespace std::chrono_literals;

namespace {

struct rig {
  nats_server nats = nats_server::start();
  postgres_server pg = postgres_server::start({.fsync = false});
  std::shared_ptr<transport> t = connect_jetstream(nats, {});
  broker_config broker{.ns = namespace_name::make("demo").value()};
  std::shared_ptr<topics> events = topics::open(t, broker).value();

  sink::sink_config config(std::string name = "archive") const {
    sink::sink_config c;
    c.name = std::move(name);
    c.ns = "demo";
    c.topics = {">"};
    c.max_messages = 64;
    c.max_wait = 20ms;
    c.targets = {{.kind = sink::target_kind::postgres, .dsn = pg.dsn(), .table = "events"}};
    return c;
  }

  // What the sinks logged, shown when a drain fails.
  std::shared_ptr<std::mutex> log_mutex = std::make_shared<std::mutex>();
  std::shared_ptr<std::vector<std::string>> log = std::make_shared<std::vector<std::string>>();

  std::unique_ptr<sink::sink> make(sink::sink_config c, sink::sink_options o = {}) {
    if (!o.log) {
      o.log = [m = log_mutex, l = log](std::string_view level, std::string_view event,
                                       std::string_view detail) {
        std::lock_guard lock(*m);
        l->push_back(fmt::format("{} {} {}", level, event, detail));
      };
    }
    o.backoff_min = 20ms;
    o.backoff_max = 200ms;
    o.idle_wait = 100ms;
    auto s = sink::sink::create(t, std::move(c), {}, std::move(o));
    INFO((s ? "" : s.error().message()));
    REQUIRE(s);
    return std::move(*s);
  }

  std::uint64_t publish(const std::string& topic, const std::string& body,
                        const std::string& from = "alice", const std::string& msg_id = "") {
    return publish_event(*events, topic, body, from, msg_id);
  }

  std::string rows() const { return pg_value(pg.dsn(), "SELECT count(*) FROM events"); }
  std::size_t rows_of(const std::string& table) const {
    try {
      return std::stoull(pg_value(pg.dsn(), "SELECT count(*) FROM " + table));
    } catch (const std::runtime_error&) {
      return 0;  // not created yet
    }
  }

  // Steps until the consumer has nothing pending or in flight.
  void drain(sink::sink& s, const std::string& name = "archive") {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto info = t->consumer_info_of("AMP_TOPICS_demo", name);
      REQUIRE(info);
      if (info->num_pending == 0 && info->num_ack_pending == 0) return;
      s.step();
    }
    auto info = t->consumer_info_of("AMP_TOPICS_demo", name).value();
    const auto st = s.stats();
    std::lock_guard lock(*log_mutex);
    FAIL(
        fmt::format("the sink did not drain: pending {}, ack pending {}, redelivered {}, "
                    "delivered up to {}, acked up to {}; committed {}, acked {}, failures {}, "
                    "transient {}, dead-lettered {}; log:\n{}",
                    info.num_pending, info.num_ack_pending, info.num_redelivered,
                    info.delivered_stream_seq, info.ack_floor_stream_seq, st.committed, st.acked,
                    st.failures, st.transient_failures, st.dead_lettered, fmt::join(*log, "\n")));
  }
};

}  // namespace

TEST_CASE(
    "events are committed to PostgreSQL as jsonb, one transaction per batch, then "
    "acknowledged",
    "[sink][postgres]") {
  rig r;
  auto s = r.make(r.config());
  const auto seq = r.publish("news.eu", R"({"n":1,"tags":["a","b"]})");
  for (int i = 2; i <= 100; ++i) r.publish("news.eu", fmt::format(R"({{"n":{}}})", i));
  r.drain(*s);
  CHECK(r.rows() == "100");
  auto row = pg_query(r.pg.dsn(), fmt::format("SELECT stream, seq, subject, topic, sender, type, "
                                              "body->'tags'->>1, headers::text, "
                                              "pg_typeof(body)::text, pg_typeof(ts)::text "
                                              "FROM events WHERE key = 'AMP_TOPICS_demo:{}'",
                                              seq));
  REQUIRE(row.size() == 1);
  CHECK(row[0] == std::vector<std::string>{"AMP_TOPICS_demo", std::to_string(seq),
                                           "amp.demo.topic.news.eu", "news.eu", "alice", "note",
                                           "b", "{}", "jsonb", "timestamp with time zone"});
  const auto stats = s->stats();
  CHECK(stats.committed == 100);
  CHECK(stats.acked == 100);
  CHECK(stats.batches >= 2);  // batches of at most 64

  SECTION("a second sink on the table meets the same messages as duplicates, not errors") {
    auto other = r.make(r.config("replay"));
    r.drain(*other, "replay");
    CHECK(r.rows() == "100");
    CHECK(other->stats().duplicates_skipped == 100);
    CHECK(other->stats().committed == 0);
  }
}

TEST_CASE("PostgreSQL resolves one key of two messages as on_duplicate says", "[sink][postgres]") {
  rig r;
  auto c = r.config();
  c.strategy = sink::key_strategy::message_id;
  const std::string mode = GENERATE("skip", "replace", "fail");
  c.on_duplicate = mode == "skip"      ? sink::duplicate_mode::skip
                   : mode == "replace" ? sink::duplicate_mode::replace
                                       : sink::duplicate_mode::fail;
  c.max_failures = 1;
  auto s = r.make(c);
  r.publish("news.eu", R"({"v":"first"})", "alice", "k1");
  r.drain(*s);
  r.publish("news.eu", R"({"v":"second"})", "bob", "k1");
  r.drain(*s);
  CHECK(r.rows() == "1");
  const auto body = pg_value(r.pg.dsn(), "SELECT body->>'v' FROM events WHERE key = 'k1'");
  CHECK(body == (mode == "replace" ? "second" : "first"));
  const auto dlq = r.t->stream_info_of("AMP_DLQ_demo").value().state.messages;
  CHECK(dlq == (mode == "fail" ? 1U : 0U));
}

TEST_CASE("a row PostgreSQL refuses is dead-lettered: the rest of its batch is committed",
          "[sink][postgres]") {
  rig r;
  auto c = r.config();
  c.max_failures = 2;
  auto s = r.make(c);
  r.publish("news.eu", R"({"n":1})");
  // jsonb cannot hold U+0000 (SQLSTATE 22P05); SQLite and files could.
  const auto refused = r.publish("news.eu", R"({"text":"nul\u0000here"})");
  r.publish("news.eu", R"({"n":3})");
  r.drain(*s);
  CHECK(r.rows() == "2");
  auto dead = r.t->get_message("AMP_DLQ_demo", 1);
  REQUIRE(dead);
  CHECK(dead->subject == "amp.demo.dlq.archive");
  CHECK(find_header(dead->headers, "Amp-Dlq-Seq") == std::to_string(refused));
  CHECK(find_header(dead->headers, "Amp-Dlq-Reason")->find("22P05") != std::string_view::npos);
  const auto original = r.t->get_message("AMP_TOPICS_demo", refused).value();
  CHECK(dead->data == original.data);
  // Its headers too, the message id that amp-server's publication carries among them.
  REQUIRE(find_header(original.headers, "Nats-Msg-Id"));
  for (const auto& [name, value] : original.headers)
    CHECK(find_header(dead->headers, name) == value);
  CHECK(s->stats().dead_lettered == 1);
}

TEST_CASE(
    "PostgreSQL stopped and restarted under load: nothing lost, nothing acknowledged "
    "before its commit",
    "[sink][postgres]") {
  rig r;
  std::mutex mutex;
  std::vector<std::uint64_t> acked;
  sink::sink_options o;
  o.on_acked = [&](const sink::acked_batch& batch) {
    std::lock_guard lock(mutex);
    acked.insert(acked.end(), batch.seqs.begin(), batch.seqs.end());
  };
  auto s = r.make(r.config(), o);
  std::thread runner([&] { s->run(); });

  constexpr int k_events = 3000;
  std::atomic<bool> published{false};
  std::thread publisher([&] {
    for (int i = 0; i < k_events; ++i) {
      r.publish("load.test", fmt::format(R"({{"i":{}}})", i));
      if (i % 100 == 0) std::this_thread::sleep_for(10ms);
    }
    published = true;
  });

  std::this_thread::sleep_for(150ms);
  r.pg.stop();
  // While it is down: the sink says so, and acknowledges nothing more.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (s->ready() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK_FALSE(s->ready());
  std::size_t acked_when_down = 0;
  {
    std::lock_guard lock(mutex);
    acked_when_down = acked.size();
  }
  std::this_thread::sleep_for(1s);
  {
    std::lock_guard lock(mutex);
    CHECK(acked.size() == acked_when_down);
  }
  CHECK(s->stats().transient_failures > 0);
  r.pg.restart();
  publisher.join();
  const auto drained = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < drained) {
    auto info = r.t->consumer_info_of("AMP_TOPICS_demo", "archive").value();
    if (published && info.num_pending == 0 && info.num_ack_pending == 0) break;
    std::this_thread::sleep_for(50ms);
  }
  s->stop();
  runner.join();

  CHECK(r.rows() == std::to_string(k_events));
  CHECK(pg_value(r.pg.dsn(), "SELECT count(DISTINCT body->>'i') FROM events") ==
        std::to_string(k_events));
  // Every acknowledged message has its row.
  std::set<std::uint64_t> stored;
  for (const auto& row : pg_query(r.pg.dsn(), "SELECT seq FROM events")) {
    stored.insert(std::stoull(row[0]));
  }
  std::lock_guard lock(mutex);
  for (auto seq : acked) CHECK(stored.count(seq) == 1);
  CHECK(std::set<std::uint64_t>(acked.begin(), acked.end()).size() >= k_events);
  CHECK(s->ready());
}

TEST_CASE("an idle sink says not ready while PostgreSQL is stopped, and ready once it is back",
          "[sink][postgres]") {
  rig r;
  // Idle steps of 100 ms: a probe every third one or so.
  auto s = r.make(r.config(), {.probe_every = 300ms});
  r.publish("news.eu", R"({"n":1})");
  r.drain(*s);
  REQUIRE(s->ready());
  auto until = [&](bool ready) {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (s->ready() != ready && std::chrono::steady_clock::now() < deadline) {
      CHECK(s->step() == sink::step_result::idle);
    }
    return s->ready() == ready;
  };
  r.pg.stop();
  CHECK(until(false));
  CHECK(s->stats().transient_failures == 0);  // nothing was written
  r.pg.restart();
  CHECK(until(true));
  r.publish("news.eu", R"({"n":2})");
  r.drain(*s);
  CHECK(r.rows() == "2");
}

TEST_CASE("ended tasks are written once each, as their final record", "[sink][postgres][tasks]") {
  rig r;
  auto jobs = job_queue::open(r.t, r.broker).value();
  auto c = r.config();
  c.kind = sink::source_kind::tasks;
  c.topics.clear();
  c.strategy = sink::key_strategy::message_id;
  c.targets[0].table = "tasks";
  const auto [done, failed, cancelled, running] = end_three_of_four_tasks(*jobs, 500ms);

  auto s = r.make(c);
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (r.rows_of("tasks") < 3 && std::chrono::steady_clock::now() < until) s->step();
  for (int i = 0; i < 5; ++i) s->step();  // anything more would come now

  auto rows = pg_query(r.pg.dsn(),
                       "SELECT key, msg_id, sender, type, body->>'state', topic, "
                       "stream FROM tasks ORDER BY body->>'state'");
  REQUIRE(rows.size() == 3);
  CHECK(rows[0] == std::vector<std::string>{cancelled.task.str(), cancelled.task.str(), "alice",
                                            "review", "cancelled", "<null>", "KV_AMP_TASK_STATE"});
  CHECK(rows[1][0] == done.task.str());
  CHECK(rows[1][4] == "completed");
  CHECK(rows[2][0] == failed.task.str());
  CHECK(rows[2][4] == "failed");
  CHECK(pg_value(r.pg.dsn(), fmt::format("SELECT count(*) FROM tasks WHERE key = '{}'",
                                         running.task.str())) == "0");
}

TEST_CASE(
    "an ended task that can never be written is dead-lettered (without the task store's "
    "own headers)",
    "[sink][postgres][tasks]") {
  rig r;
  auto jobs = job_queue::open(r.t, r.broker).value();
  auto c = r.config();
  c.kind = sink::source_kind::tasks;
  c.topics.clear();
  c.strategy = sink::key_strategy::payload_field;
  c.field = "/result/order";
  c.max_failures = 1;
  c.targets[0].table = "tasks";
  const auto alice = participant_name::make("alice").value();
  const auto review = job_name::make("review").value();
  auto task = jobs->submit({.job = review, .from = alice, .body = R"({"doc":1})"}).value();
  REQUIRE(jobs->cancel(task.task, {.who = alice}));  // ends without a result
  auto s = r.make(c);
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  std::optional<message> dead;
  while (!dead && std::chrono::steady_clock::now() < deadline) {
    s->step();
    if (auto m = r.t->get_message("AMP_DLQ_demo", 1)) dead = *m;
  }
  REQUIRE(dead);
  CHECK(dead->subject == "amp.demo.dlq.archive");
  CHECK(find_header(dead->headers, "Amp-Dlq-Stream") == "KV_AMP_TASK_STATE");
  CHECK(find_header(dead->headers, "Amp-Dlq-Reason")->find("/result/order") !=
        std::string_view::npos);
  for (const auto& [name, value] : dead->headers) CHECK_FALSE(name.starts_with("Nats-Expected"));
  CHECK(r.rows_of("tasks") == 0);
}

TEST_CASE(
    "a table dropped under the sink is the target's failure: nothing is dead-lettered, "
    "the table is made again",
    "[sink][postgres]") {
  rig r;
  auto c = r.config();
  c.max_failures = 1;
  auto s = r.make(c);
  r.publish("news.eu", "1");
  r.drain(*s);
  REQUIRE(r.rows() == "1");
  pg_query(r.pg.dsn(), "DROP TABLE events");
  r.publish("news.eu", "2");
  r.publish("news.eu", "3");
  r.drain(*s);
  CHECK(r.rows() == "2");
  CHECK_FALSE(r.t->stream_info_of("AMP_DLQ_demo").value().state.messages > 0);
  CHECK(s->stats().transient_failures >= 1);
  CHECK(s->stats().dead_lettered == 0);
}

TEST_CASE(
    "a batch of ten thousand rows (more parameters than one statement takes) is written "
    "in parts within one transaction",
    "[sink][postgres]") {
  auto pg = postgres_server::start({.fsync = false});
  auto t = sink::make_target({.kind = sink::target_kind::postgres, .dsn = pg.dsn(), .table = "big"})
               .value();
  REQUIRE(t->open());
  auto rows_from = [](std::uint64_t first, std::uint64_t count, std::string_view stream) {
    std::vector<sink::row> rows;
    for (std::uint64_t seq = first; seq < first + count; ++seq) {
      rows.push_back({.key = fmt::format("k{}", seq),
                      .stream = std::string(stream),
                      .seq = seq,
                      .subject = "amp.demo.topic.big",
                      .topic = "big",
                      .msg_id = fmt::format("m{}", seq),
                      .sender = "alice",
                      .type = "note",
                      .ts = "2026-12-07T00:00:00.000Z",
                      .body = fmt::format(R"({{"n":{}}})", seq),
                      .headers = "{}"});
    }
    return rows;
  };
  auto count = [&](sink::row_outcome o, const sink::batch_result& r) {
    return std::count(r.outcomes.begin(), r.outcomes.end(), o);
  };
  // 6,000 keys first; then 10,000 rows, 6,000 of them on those keys: the keys stored
  // already are read back and replaced in parts too.
  auto first = t->write(rows_from(0, 6000, "S"), sink::duplicate_mode::skip);
  REQUIRE(first);
  CHECK(count(sink::row_outcome::written, *first) == 6000);
  const auto mode = GENERATE(sink::duplicate_mode::skip, sink::duplicate_mode::replace);
  const bool replace = mode == sink::duplicate_mode::replace;
  auto second = t->write(rows_from(0, 10000, "T"), mode);
  REQUIRE(second);
  CHECK(count(sink::row_outcome::written, *second) == 4000);
  CHECK(count(replace ? sink::row_outcome::replaced : sink::row_outcome::skipped, *second) == 6000);
  CHECK(pg_value(pg.dsn(), "SELECT count(*) FROM big") == "10000");
  CHECK(pg_value(pg.dsn(), "SELECT count(*) FROM big WHERE stream = 'S'") ==
        (replace ? "0" : "6000"));
  // The same batch redelivered: its rows are recognised as its own where they were stored.
  auto again = t->write(rows_from(0, 10000, "T"), mode);
  REQUIRE(again);
  CHECK(count(sink::row_outcome::same, *again) == (replace ? 10000 : 4000));
  CHECK(count(sink::row_outcome::skipped, *again) == (replace ? 0 : 6000));
}
