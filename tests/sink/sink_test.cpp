// The sink over the memory transport and a manual clock, committing to SQLite and files in
// a temporary folder: the guarantees of amp-sink-v1.md one by one.

#include <catch2/catch.hpp>

#include <set>
#include <thread>

#include "amp/broker/job_queue.hpp"
#include "amp/broker/topics.hpp"
#include "amp/sink/sink.hpp"

#include "amp/subjects.hpp"
#include "amp/timestamp.hpp"
#include "amp/transport/memory.hpp"
#include "sink/sink_rig.hpp"
#include "support/process.hpp"

using namespace amp;
using namespace amp::testing;
using namespace std::chrono_literals;

namespace {

struct rig {
  std::shared_ptr<manual_clock> clock = std::make_shared<manual_clock>();
  std::shared_ptr<transport> t = memory_transport::create({.clock = clock});
  std::shared_ptr<topics> events =
      topics::open(t, {.ns = namespace_name::make("demo").value()}).value();
  temp_dir dir;
  std::string db = (dir.path() / "archive.db").string();

  sink::sink_config config(std::vector<std::string> patterns = {">"}) const {
    sink::sink_config c;
    c.name = "archive";
    c.ns = "demo";
    c.topics = std::move(patterns);
    c.max_messages = 64;
    c.targets = {{.kind = sink::target_kind::sqlite, .path = db, .table = "events"}};
    return c;
  }

  std::unique_ptr<sink::sink> make(sink::sink_config c,
                                   std::vector<std::unique_ptr<sink::target>> targets = {}) {
    auto s = sink::sink::create(t, std::move(c), std::move(targets),
                                {.backoff_min = 10ms, .backoff_max = 40ms, .idle_wait = 50ms});
    REQUIRE(s);
    return std::move(*s);
  }

  std::uint64_t publish(const std::string& topic, const std::string& body,
                        const std::string& from = "alice", const std::string& msg_id = "") {
    return publish_event(*events, topic, body, from, msg_id);
  }

  sink::step_result step(sink::sink& s) { return step_with(s, *clock); }

  // Steps until nothing is left to do (at most `limit` steps); moves the clock so that
  // naks with a delay come back.
  void drain(sink::sink& s, int limit = 50) {
    for (int i = 0; i < limit; ++i) {
      auto info = t->consumer_info_of(subjects::topics_stream(events_ns()), "archive");
      REQUIRE(info);
      if (info->num_pending == 0 && info->num_ack_pending == 0) return;
      step(s);
      clock->advance(1s);
    }
    FAIL("the sink did not drain");
  }

  static namespace_name events_ns() { return namespace_name::make("demo").value(); }

  consumer_info consumer() const {
    return t->consumer_info_of("AMP_TOPICS_demo", "archive").value();
  }

  // What sink "archive" stored as the dead letter of the event at `seq` before it was killed
  // ahead of its acknowledgement.
  void store_dead_letter(std::uint64_t seq, const std::string& data, const std::string& msg_id) {
    t->publish({.subject = "amp.demo.dlq.archive",
                .data = data,
                .headers = {{"Amp-Dlq-Reason", "earlier"},
                            {"Amp-Dlq-Stream", "AMP_TOPICS_demo"},
                            {"Amp-Dlq-Seq", std::to_string(seq)}},
                .msg_id = msg_id})
        .value();
  }

  // The messages in the dead-letter stream, oldest first.
  std::vector<message> dead_letters() const {
    std::vector<message> out;
    auto info = t->stream_info_of("AMP_DLQ_demo");
    if (!info) return out;
    for (auto seq = info->state.first_seq; seq != 0 && seq <= info->state.last_seq; ++seq) {
      if (auto m = t->get_message("AMP_DLQ_demo", seq)) out.push_back(*m);
    }
    return out;
  }
};

std::unique_ptr<sink::target> sqlite_target(const std::string& db) {
  return sink::make_target({.kind = sink::target_kind::sqlite, .path = db, .table = "events"})
      .value();
}

}  // namespace

TEST_CASE("events are committed to the table with the spec's columns, then acknowledged",
          "[sink]") {
  rig r;
  auto s = r.make(r.config());
  const auto published_at = format_timestamp(r.clock->now());
  const auto seq1 = r.publish("news.eu", R"({"n":1})");
  const auto seq2 = r.publish("news.us", R"({"n":2,"s":"é"})", "bob", "m-2");
  REQUIRE(r.step(*s) == sink::step_result::committed);

  auto rows = sqlite_rows(r.db, "events");
  REQUIRE(rows.size() == 2);
  const auto& a = rows.at("AMP_TOPICS_demo:" + std::to_string(seq1));
  CHECK(a.at("stream") == "AMP_TOPICS_demo");
  CHECK(a.at("seq") == std::to_string(seq1));
  CHECK(a.at("subject") == "amp.demo.topic.news.eu");
  CHECK(a.at("topic") == "news.eu");
  CHECK(a.at("sender") == "alice");
  CHECK(a.at("type") == "note");
  CHECK(a.at("body") == R"({"n":1})");
  CHECK(a.at("headers") == "{}");
  CHECK(a.at("ts") == published_at);
  CHECK(a.at("committed_at").size() == 24);
  const auto& b = rows.at("AMP_TOPICS_demo:" + std::to_string(seq2));
  CHECK(b.at("msg_id") == "m-2");
  CHECK(b.at("sender") == "bob");
  CHECK(b.at("body") == R"({"n":2,"s":"é"})");

  const auto info = r.consumer();
  CHECK(info.num_pending == 0);
  CHECK(info.num_ack_pending == 0);
  const auto stats = s->stats();
  CHECK(stats.committed == 2);
  CHECK(stats.acked == 2);
  CHECK(stats.batches == 1);
  CHECK(s->ready());
  CHECK(r.step(*s) == sink::step_result::idle);
}

TEST_CASE("a redelivery of a committed message is recognised as a duplicate: one row", "[sink]") {
  rig r;
  // What a crash between commit and ack leaves: the row stored, the message not acked.
  // Another sink on the same table commits the events first; the sink under test then
  // receives them as a redelivery would bring them.
  auto first = r.make([&] {
    auto c = r.config();
    c.name = "first";
    return c;
  }());
  auto s = r.make(r.config());
  r.publish("news.eu", R"({"n":1})");
  r.publish("news.eu", R"({"n":2})");
  REQUIRE(r.step(*first) == sink::step_result::committed);
  REQUIRE(r.step(*s) == sink::step_result::committed);
  CHECK(sqlite_rows(r.db, "events").size() == 2);
  const auto stats = s->stats();
  CHECK(stats.committed == 0);
  CHECK(stats.duplicates_skipped == 2);
  CHECK(stats.acked == 2);
  CHECK(r.consumer().num_ack_pending == 0);
}

TEST_CASE("on_duplicate decides between two messages with one key", "[sink]") {
  rig r;
  auto c = r.config();
  c.strategy = sink::key_strategy::message_id;
  // One msg_id from two senders: two events, one key.
  SECTION("skip keeps the first and counts the second") {
    c.on_duplicate = sink::duplicate_mode::skip;
    auto s = r.make(c);
    r.publish("news.eu", R"({"v":"first"})", "alice", "k1");
    REQUIRE(r.step(*s) == sink::step_result::committed);
    r.publish("news.eu", R"({"v":"second"})", "bob", "k1");
    REQUIRE(r.step(*s) == sink::step_result::committed);
    auto rows = sqlite_rows(r.db, "events");
    REQUIRE(rows.size() == 1);
    CHECK(rows.at("k1").at("body") == R"({"v":"first"})");
    CHECK(s->stats().duplicates_skipped == 1);
    CHECK(r.consumer().num_ack_pending == 0);
  }
  SECTION("skip within one batch keeps the first") {
    c.on_duplicate = sink::duplicate_mode::skip;
    auto s = r.make(c);
    r.publish("news.eu", R"({"v":"first"})", "alice", "k1");
    r.publish("news.eu", R"({"v":"second"})", "bob", "k1");
    REQUIRE(r.step(*s) == sink::step_result::committed);
    CHECK(sqlite_rows(r.db, "events").at("k1").at("body") == R"({"v":"first"})");
    CHECK(s->stats().duplicates_skipped == 1);
    CHECK(s->stats().acked == 2);
  }
  SECTION("replace stores the last, in one batch or across batches") {
    c.on_duplicate = sink::duplicate_mode::replace;
    auto s = r.make(c);
    r.publish("news.eu", R"({"v":"first"})", "alice", "k1");
    r.publish("news.eu", R"({"v":"second"})", "bob", "k1");
    REQUIRE(r.step(*s) == sink::step_result::committed);
    CHECK(sqlite_rows(r.db, "events").at("k1").at("body") == R"({"v":"second"})");
    r.publish("news.eu", R"({"v":"third"})", "carol", "k1");
    REQUIRE(r.step(*s) == sink::step_result::committed);
    auto rows = sqlite_rows(r.db, "events");
    REQUIRE(rows.size() == 1);
    CHECK(rows.at("k1").at("body") == R"({"v":"third"})");
    CHECK(rows.at("k1").at("sender") == "carol");
    CHECK(r.consumer().num_ack_pending == 0);
  }
  SECTION("fail dead-letters the second after its tries, and keeps the first") {
    c.on_duplicate = sink::duplicate_mode::fail;
    c.max_failures = 2;
    auto s = r.make(c);
    r.publish("news.eu", R"({"v":"first"})", "alice", "k1");
    REQUIRE(r.step(*s) == sink::step_result::committed);
    const auto second = r.publish("news.eu", R"({"v":"second"})", "bob", "k1");
    r.drain(*s);
    auto rows = sqlite_rows(r.db, "events");
    REQUIRE(rows.size() == 1);
    CHECK(rows.at("k1").at("body") == R"({"v":"first"})");
    auto dead = r.dead_letters();
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].subject == "amp.demo.dlq.archive");
    CHECK(find_header(dead[0].headers, "Amp-Dlq-Seq") == std::to_string(second));
    CHECK(find_header(dead[0].headers, "Amp-Dlq-Stream") == "AMP_TOPICS_demo");
    CHECK(find_header(dead[0].headers, "Amp-Dlq-Reason")->find("on_duplicate: fail") !=
          std::string_view::npos);
    CHECK(s->stats().dead_lettered == 1);
    CHECK(s->stats().failures == 2);
  }
}

TEST_CASE(
    "a message that can never be written is dead-lettered after max_failures tries, "
    "then acknowledged: the rest of its batch is committed",
    "[sink]") {
  rig r;
  auto c = r.config();
  c.strategy = sink::key_strategy::payload_field;
  c.field = "/order";
  c.max_failures = 3;
  auto s = r.make(c);
  r.publish("shop.orders", R"({"order":"o-1"})");
  const auto bad = r.publish("shop.orders", R"({"item":"no order"})");
  r.publish("shop.orders", R"({"order":17})");
  const auto wrong_type = r.publish("shop.orders", R"({"order":[1]})");
  REQUIRE(r.step(*s) == sink::step_result::committed);
  auto rows = sqlite_rows(r.db, "events");
  CHECK(rows.size() == 2);
  CHECK(rows.count("o-1") == 1);
  CHECK(rows.count("17") == 1);
  // Not acknowledged yet: tried once each.
  CHECK(r.consumer().num_ack_pending == 2);
  CHECK(r.dead_letters().empty());

  r.drain(*s);
  CHECK(sqlite_rows(r.db, "events").size() == 2);
  auto dead = r.dead_letters();
  REQUIRE(dead.size() == 2);
  CHECK(find_header(dead[0].headers, "Amp-Dlq-Seq") == std::to_string(bad));
  CHECK(find_header(dead[0].headers, "Amp-Dlq-Reason") ==
        R"(payload_field "/order": missing from body)");
  CHECK(find_header(dead[1].headers, "Amp-Dlq-Seq") == std::to_string(wrong_type));
  CHECK(find_header(dead[1].headers, "Amp-Dlq-Reason")->find("must be a string or an integer") !=
        std::string_view::npos);
  // The original body and headers go with it (its Nats-Msg-Id too), and the three.
  const auto original = r.t->get_message("AMP_TOPICS_demo", bad).value();
  CHECK(dead[0].data == original.data);
  REQUIRE(find_header(original.headers, "Nats-Msg-Id"));
  for (const auto& [name, value] : original.headers)
    CHECK(find_header(dead[0].headers, name) == value);
  CHECK(dead[0].headers.size() == original.headers.size() + 3);
  CHECK(r.consumer().num_ack_pending == 0);
  const auto stats = s->stats();
  CHECK(stats.dead_lettered == 2);
  CHECK(stats.failures == 6);
}

TEST_CASE(
    "several topic patterns share one consumer on their narrowest filter: what none "
    "matches is acknowledged without a row",
    "[sink]") {
  rig r;
  auto s = r.make(r.config({"news.eu.*", "news.us.>"}));
  CHECK(r.consumer().config.filter_subject == "amp.demo.topic.news.>");
  r.publish("news.eu.sport", "1");
  r.publish("news.asia.sport", "2");
  r.publish("news.us.politics.local", "3");
  r.publish("weather.eu", "4");
  REQUIRE(r.step(*s) == sink::step_result::committed);
  auto rows = sqlite_rows(r.db, "events");
  std::set<std::string> topics;
  for (const auto& entry : rows) topics.insert(entry.second.at("topic"));
  CHECK(topics == std::set<std::string>{"news.eu.sport", "news.us.politics.local"});
  CHECK(s->stats().passed_over == 1);
  CHECK(r.consumer().num_ack_pending == 0);

  SECTION("a restart with other patterns changes the filter and goes on where it was") {
    s.reset();
    auto again = r.make(r.config({"weather.>", "news.>"}));
    CHECK(r.consumer().config.filter_subject == "amp.demo.topic.>");
    r.publish("weather.eu", "5");
    REQUIRE(r.step(*again) == sink::step_result::committed);
    CHECK(sqlite_rows(r.db, "events").size() == 3);
  }
}

TEST_CASE(
    "while a required target is away nothing is acknowledged and the sink is not "
    "ready: the batch is committed once it is back",
    "[sink]") {
  rig r;
  auto flaky = std::make_unique<switchable_target>(sqlite_target(r.db));
  auto away = flaky->away;
  std::vector<std::unique_ptr<sink::target>> targets;
  targets.push_back(std::move(flaky));
  auto s = r.make(r.config(), std::move(targets));
  r.publish("news.eu", "1");
  REQUIRE(r.step(*s) == sink::step_result::committed);
  CHECK(s->ready());

  *away = true;
  r.publish("news.eu", "2");
  r.publish("news.eu", "3");
  CHECK(r.step(*s) == sink::step_result::transient);
  CHECK_FALSE(s->ready());
  CHECK(s->backoff() > duration::zero());
  CHECK(r.step(*s) == sink::step_result::transient);
  CHECK(r.consumer().num_ack_pending == 2);
  CHECK(s->stats().acked == 1);
  CHECK(s->stats().transient_failures == 2);
  // Kept in progress across AckWait: not redelivered meanwhile.
  r.clock->advance(20s);
  CHECK(r.step(*s) == sink::step_result::transient);
  r.clock->advance(20s);
  CHECK(r.consumer().num_redelivered == 0);

  *away = false;
  REQUIRE(r.step(*s) == sink::step_result::committed);
  CHECK(s->ready());
  CHECK(sqlite_rows(r.db, "events").size() == 3);
  CHECK(r.consumer().num_ack_pending == 0);
  CHECK(r.dead_letters().empty());
  CHECK(s->stats().committed == 3);
}

TEST_CASE("an optional target that fails does not hold the acknowledgement back", "[sink]") {
  rig r;
  auto c = r.config();
  c.targets.push_back({.kind = sink::target_kind::file,
                       .required = false,
                       .dir = (r.dir.path() / "files").string()});
  auto side = std::make_unique<switchable_target>(sink::make_target(c.targets[1]).value());
  auto away = side->away;
  *away = true;
  std::vector<std::unique_ptr<sink::target>> targets;
  targets.push_back(sqlite_target(r.db));
  targets.push_back(std::move(side));
  auto s = r.make(c, std::move(targets));
  r.publish("news.eu", "1");
  REQUIRE(r.step(*s) == sink::step_result::committed);
  CHECK(sqlite_rows(r.db, "events").size() == 1);
  CHECK(r.consumer().num_ack_pending == 0);
  CHECK(s->stats().optional_failures == 1);
  CHECK(s->ready());

  SECTION("and writes again once it is back (after its pause)") {
    *away = false;
    r.clock->advance(11s);
    const auto seq = r.publish("news.eu", "2");
    REQUIRE(r.step(*s) == sink::step_result::committed);
    CHECK(std::filesystem::exists(r.dir.path() / "files" /
                                  ("AMP_TOPICS_demo%3A" + std::to_string(seq) + ".json")));
  }
}

TEST_CASE("the file target writes one JSON file per message and resolves keys stored already",
          "[sink][files]") {
  temp_dir dir;
  auto t =
      sink::make_target({.kind = sink::target_kind::file, .dir = (dir.path() / "out").string()})
          .value();
  REQUIRE(t->open());
  sink::row a{.key = "k/1",
              .stream = "S",
              .seq = 1,
              .subject = "amp.demo.topic.x",
              .topic = "x",
              .msg_id = "m1",
              .sender = "alice",
              .type = "",
              .ts = "2026-01-01T00:00:00.000Z",
              .body = R"({"v":1})",
              .headers = R"({"h":"1"})"};
  auto other = a;
  other.seq = 2;
  other.body = R"({"v":2})";
  auto w = t->write({&a, 1}, sink::duplicate_mode::skip);
  REQUIRE(w);
  CHECK(w->outcomes == std::vector{sink::row_outcome::written});
  const auto file = dir.path() / "out" / "k%2F1.json";
  auto text = read_file(file);
  CHECK(text.find(R"("key":"k/1","stream":"S","seq":1,"subject":"amp.demo.topic.x","topic":"x",)"
                  R"("msg_id":"m1","sender":"alice","type":null,"ts":"2026-01-01T00:00:00.000Z",)"
                  R"("body":{"v":1},"headers":{"h":"1"},"committed_at":")") == 1);
  CHECK(t->write({&a, 1}, sink::duplicate_mode::fail)->outcomes ==
        std::vector{sink::row_outcome::same});
  CHECK(t->write({&other, 1}, sink::duplicate_mode::skip)->outcomes ==
        std::vector{sink::row_outcome::skipped});
  CHECK(t->write({&other, 1}, sink::duplicate_mode::fail)->outcomes ==
        std::vector{sink::row_outcome::duplicate});
  CHECK(read_file(file).find(R"("body":{"v":1})") != std::string::npos);
  CHECK(t->write({&other, 1}, sink::duplicate_mode::replace)->outcomes ==
        std::vector{sink::row_outcome::replaced});
  CHECK(read_file(file).find(R"("body":{"v":2})") != std::string::npos);
  // Nothing but the files themselves is left in the folder.
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path() / "out")) {
    ++entries;
  }
  CHECK(entries == 1);
}

TEST_CASE("the SQLite target refuses a table of another shape, and creates a missing one",
          "[sink]") {
  temp_dir dir;
  const auto db = (dir.path() / "x.db").string();
  auto t =
      sink::make_target({.kind = sink::target_kind::sqlite, .path = db, .table = "events"}).value();
  REQUIRE(t->open());
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(db.c_str(), &raw) == SQLITE_OK);
  REQUIRE(sqlite3_exec(raw, "CREATE TABLE other (id INTEGER PRIMARY KEY, note TEXT)", nullptr,
                       nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(raw);
  auto wrong =
      sink::make_target({.kind = sink::target_kind::sqlite, .path = db, .table = "other"}).value();
  auto opened = wrong->open();
  REQUIRE_FALSE(opened);
  CHECK(opened.error().message().find("has no column \"key\"") != std::string::npos);
}

TEST_CASE("the sink refuses a bad configuration before touching the backend", "[sink]") {
  rig r;
  auto c = r.config();
  c.name = "Bad Name";
  auto s = sink::sink::create(r.t, c);
  REQUIRE_FALSE(s);
  CHECK(s.error().code() == errc::bad_request);
  CHECK(r.t->consumer_names("AMP_TOPICS_demo").value().empty());
}

TEST_CASE("from says where a new consumer starts, and counts only when it is first made",
          "[sink]") {
  rig r;
  r.publish("news.eu", "1");
  const auto second = r.publish("news.eu", "2");
  r.publish("news.eu", "3");
  auto c = r.config();
  SECTION("new: only what comes after") {
    c.from = {.from = sink::start_position::kind::new_messages};
    auto s = r.make(c);
    const auto later = r.publish("news.eu", "4");
    REQUIRE(r.step(*s) == sink::step_result::committed);
    auto rows = sqlite_rows(r.db, "events");
    REQUIRE(rows.size() == 1);
    CHECK(rows.begin()->second.at("seq") == std::to_string(later));
  }
  SECTION("a sequence: from that event on") {
    c.from = {.from = sink::start_position::kind::sequence, .seq = second};
    auto s = r.make(c);
    REQUIRE(r.step(*s) == sink::step_result::committed);
    CHECK(sqlite_rows(r.db, "events").size() == 2);
    SECTION("and a restart with another from goes on where it was") {
      s.reset();
      c.from = {.from = sink::start_position::kind::all};
      auto again = r.make(c);
      r.publish("news.eu", "5");
      REQUIRE(r.step(*again) == sink::step_result::committed);
      CHECK(sqlite_rows(r.db, "events").size() == 3);
      CHECK(r.consumer().config.start_seq == second);
    }
  }
  SECTION("a sequence beyond the end: from that sequence, what comes before passed over") {
    c.from = {.from = sink::start_position::kind::sequence, .seq = 10};
    auto s = r.make(c);
    for (int i = 4; i <= 12; ++i) r.publish("news.eu", std::to_string(i));
    r.drain(*s);
    auto rows = sqlite_rows(r.db, "events");
    std::set<std::string> seqs;
    for (const auto& [key, row] : rows) seqs.insert(row.at("seq"));
    CHECK(seqs == std::set<std::string>{"10", "11", "12"});
    CHECK(s->stats().passed_over == 6);  // 4 to 9
  }
  SECTION("a time: from the first event stored at or after it") {
    r.clock->advance(1min);
    const auto at = r.clock->now();
    r.publish("news.eu", R"("late")");
    c.from = {.from = sink::start_position::kind::time, .time = at};
    auto s = r.make(c);
    REQUIRE(r.step(*s) == sink::step_result::committed);
    auto rows = sqlite_rows(r.db, "events");
    REQUIRE(rows.size() == 1);
    CHECK(rows.begin()->second.at("body") == "\"late\"");
  }
}

TEST_CASE("a message folded into another one with its key waits for that one's fate", "[sink]") {
  rig r;
  auto c = r.config();
  c.strategy = sink::key_strategy::message_id;
  c.on_duplicate = sink::duplicate_mode::skip;
  c.max_failures = 2;
  std::vector<std::unique_ptr<sink::target>> targets;
  targets.push_back(std::make_unique<refusing_target>(sqlite_target(r.db), "poison"));
  auto s = r.make(c, std::move(targets));
  // One key, two messages in one batch; the first is one the target refuses.
  const auto poison = r.publish("news.eu", R"({"v":"poison"})", "alice", "k1");
  r.publish("news.eu", R"({"v":"good"})", "bob", "k1");
  REQUIRE(r.step(*s) == sink::step_result::committed);
  // Neither is acknowledged: the first failed, the second stood behind it.
  CHECK(r.consumer().num_ack_pending == 2);
  r.drain(*s);
  auto rows = sqlite_rows(r.db, "events");
  REQUIRE(rows.size() == 1);
  CHECK(rows.at("k1").at("body") == R"({"v":"good"})");
  auto dead = r.dead_letters();
  REQUIRE(dead.size() == 1);
  CHECK(find_header(dead[0].headers, "Amp-Dlq-Seq") == std::to_string(poison));
}

TEST_CASE("a dead letter keeps the original's own headers, not JetStream's expectations",
          "[sink]") {
  rig r;
  auto c = r.config();
  c.strategy = sink::key_strategy::payload_field;
  c.field = "/order";
  c.max_failures = 1;
  const auto event = r.publish("shop.orders", R"({"item":"no order"})");
  // The same event again, published on NATS with headers of its own and no message id.
  auto raw = r.t->get_message("AMP_TOPICS_demo", event).value();
  const auto seq =
      r.t->publish({.subject = raw.subject,
                    .data = raw.data,
                    .headers = {{"X-Custom", "kept"}, {"Nats-Expected-Stream", "AMP_TOPICS_demo"}}})
          .value()
          .seq;
  const auto own_id = "archive:AMP_TOPICS_demo:" + std::to_string(seq);
  SECTION("a message without an id gets the sink's own as its dead letter's") {
    auto s = r.make(c);
    r.drain(*s);
    auto dead = r.dead_letters();
    REQUIRE(dead.size() == 2);
    CHECK(find_header(dead[1].headers, "Amp-Dlq-Seq") == std::to_string(seq));
    CHECK(find_header(dead[1].headers, "X-Custom") == "kept");
    CHECK_FALSE(find_header(dead[1].headers, "Nats-Expected-Stream"));
    CHECK(find_header(dead[1].headers, "Nats-Msg-Id") == own_id);
    CHECK(dead[1].headers.size() == 5);
  }
  SECTION("which a dead letter stored before a lost acknowledgement holds already") {
    auto s = r.make(c);  // makes AMP_DLQ_demo
    r.store_dead_letter(seq, raw.data, own_id);
    r.drain(*s);
    auto dead = r.dead_letters();
    REQUIRE(dead.size() == 2);  // the one above and the original event's
    CHECK(find_header(dead[0].headers, "Amp-Dlq-Reason") == "earlier");
    CHECK(find_header(dead[1].headers, "Amp-Dlq-Seq") == std::to_string(event));
    CHECK(s->stats().dead_lettered == 1);
  }
}

TEST_CASE(
    "a dead letter stored before a lost acknowledgement is not stored twice, and another "
    "sink's of the same message is stored too",
    "[sink]") {
  rig r;
  auto c = r.config();
  c.strategy = sink::key_strategy::payload_field;
  c.field = "/order";
  c.max_failures = 1;
  const auto bad = r.publish("shop.orders", R"({"item":"no order"})");
  const auto original = r.t->get_message("AMP_TOPICS_demo", bad).value();
  const auto id = std::string(find_header(original.headers, "Nats-Msg-Id").value());
  auto make_dlq = r.make(c);  // makes AMP_DLQ_demo
  r.store_dead_letter(bad, original.data, id);
  r.drain(*make_dlq);
  auto dead = r.dead_letters();
  REQUIRE(dead.size() == 1);
  CHECK(find_header(dead[0].headers, "Amp-Dlq-Reason") == "earlier");
  CHECK(make_dlq->stats().dead_lettered == 0);

  SECTION("another sink dead-letters the same message: its own entry, the id set aside") {
    auto other = r.make([&] {
      auto o = c;
      o.name = "second";
      return o;
    }());
    for (int i = 0; i < 20 && r.dead_letters().size() < 2; ++i) {
      r.step(*other);
      r.clock->advance(1s);
    }
    dead = r.dead_letters();
    REQUIRE(dead.size() == 2);
    CHECK(dead[1].subject == "amp.demo.dlq.second");
    CHECK(find_header(dead[1].headers, "Amp-Dlq-Seq") == std::to_string(bad));
    CHECK(find_header(dead[1].headers, "Amp-Dlq-Msg-Id") == id);
    CHECK(find_header(dead[1].headers, "Nats-Msg-Id") ==
          "second:AMP_TOPICS_demo:" + std::to_string(bad));
    CHECK(other->stats().dead_lettered == 1);
    CHECK(r.t->consumer_info_of("AMP_TOPICS_demo", "second")->num_ack_pending == 0);
  }
}

TEST_CASE("ended tasks are written once each on the memory transport too", "[sink][tasks]") {
  rig r;
  auto jobs = job_queue::open(r.t, {.ns = rig::events_ns()}).value();
  auto c = r.config({});
  c.kind = sink::source_kind::tasks;
  c.strategy = sink::key_strategy::message_id;
  c.targets[0].table = "tasks";
  const auto alice = participant_name::make("alice").value();
  const auto [done, failed, cancelled, running] = end_three_of_four_tasks(*jobs, 0ms);

  auto s = r.make(c);
  REQUIRE(r.step(*s) == sink::step_result::committed);
  auto rows = sqlite_rows(r.db, "tasks");
  REQUIRE(rows.size() == 3);
  CHECK(rows.count(running.task.str()) == 0);
  const auto& row = rows.at(cancelled.task.str());
  CHECK(row.at("stream") == "KV_AMP_TASK_STATE");
  CHECK(row.at("subject") == "$KV.AMP_TASK_STATE.demo." + cancelled.task.str());
  CHECK(row.at("sender") == "alice");
  CHECK(row.at("type") == "review");
  CHECK(row.at("topic") == "<null>");
  CHECK(row.at("body").find(R"("state":"cancelled")") != std::string::npos);
  CHECK(rows.at(done.task.str()).at("body").find(R"("state":"completed")") != std::string::npos);
  CHECK(rows.at(failed.task.str()).at("body").find(R"("state":"failed")") != std::string::npos);
  // Read to the end, and acknowledged: the running task ending later is the only row to come.
  r.step(*s);
  const auto info = r.t->consumer_info_of("KV_AMP_TASK_STATE", "archive").value();
  CHECK(info.num_pending == 0);
  CHECK(info.num_ack_pending == 0);
  REQUIRE(jobs->cancel(running.task, {.who = alice}));
  REQUIRE(r.step(*s) == sink::step_result::committed);
  rows = sqlite_rows(r.db, "tasks");
  CHECK(rows.size() == 4);
  CHECK(rows.count(running.task.str()) == 1);
  CHECK(s->stats().committed == 4);
  // Each ended once: the revision that marks the canceller as told is passed over.
  CHECK(s->stats().duplicates_skipped == 0);
  CHECK(s->stats().passed_over > 0);
}

TEST_CASE("an idle sink probes its required targets, and ready follows them", "[sink]") {
  rig r;
  auto flaky = std::make_unique<switchable_target>(sqlite_target(r.db));
  auto away = flaky->away;
  auto probes = flaky->probes;
  std::vector<std::unique_ptr<sink::target>> targets;
  targets.push_back(std::move(flaky));
  auto s = r.make(r.config(), std::move(targets));
  REQUIRE(r.step(*s) == sink::step_result::idle);
  CHECK(s->ready());
  *away = true;
  // Idle steps (each ~50 ms of the clock) probe once probe_every (5 s) has passed, not before.
  const auto went = r.clock->now();
  while (s->ready() && r.clock->now() - went < 10s) {
    REQUIRE(r.step(*s) == sink::step_result::idle);
    if (r.clock->now() - went < 4500ms) CHECK(probes->load() == 0);
  }
  CHECK_FALSE(s->ready());
  CHECK(probes->load() == 1);
  // 5 s after the step that found it ready (which ended a little before `went`).
  CHECK(r.clock->now() - went >= 4500ms);
  CHECK(r.clock->now() - went < 5500ms);
  // Away, it is opened again at every idle step until it answers.
  REQUIRE(r.step(*s) == sink::step_result::idle);
  CHECK_FALSE(s->ready());
  *away = false;
  REQUIRE(r.step(*s) == sink::step_result::idle);
  CHECK(s->ready());
  r.publish("news.eu", R"({"n":1})");
  REQUIRE(r.step(*s) == sink::step_result::committed);
  CHECK(sqlite_rows(r.db, "events").size() == 1);
}

TEST_CASE("stop is heard while a batch waits to fill, however long batch.max_wait_ms is",
          "[sink]") {
  rig r;
  auto c = r.config();
  c.max_wait = 20s;
  auto s = r.make(c);
  r.publish("news.eu", R"({"n":1})");
  const auto began = r.clock->now();
  auto stepping = std::async(std::launch::async, [&] { return r.step(*s); });
  // Half a second on: the batch holds the event and waits for more.
  while (r.clock->now() - began < 500ms) std::this_thread::yield();
  s->stop();
  REQUIRE(stepping.get() == sink::step_result::committed);
  CHECK(r.clock->now() - began < 10s);  // not the 20 s the batch could have waited
  CHECK(sqlite_rows(r.db, "events").size() == 1);
}

TEST_CASE("a sink given only messages without a row still probes its targets", "[sink]") {
  rig r;
  auto flaky = std::make_unique<switchable_target>(sqlite_target(r.db));
  auto away = flaky->away;
  std::vector<std::unique_ptr<sink::target>> targets;
  targets.push_back(std::move(flaky));
  // Two patterns share the filter news.>: news.asia.* is passed over.
  auto s = r.make(r.config({"news.eu.*", "news.us.>"}), std::move(targets));
  REQUIRE(r.step(*s) == sink::step_result::idle);
  REQUIRE(s->ready());
  *away = true;
  const auto went = r.clock->now();
  while (s->ready() && r.clock->now() - went < 10s) {
    r.publish("news.asia.sport", "1");
    r.step(*s);
    r.clock->advance(100ms);
  }
  CHECK_FALSE(s->ready());
  CHECK(r.clock->now() - went < 6s);
  CHECK(s->stats().passed_over > 0);
}
