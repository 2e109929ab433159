// Topics (spec §6): publish with sequence numbers and msg_id dedup, subscriptions from
// each replay start, wildcard patterns, order without gaps, dropping a subscriber that
// cannot keep up (and resuming it without loss), and refusal of bad input.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "amp/broker/topics.hpp"
#include "amp/subjects.hpp"
#include "broker/cases/broker_helpers.hpp"

namespace amp::broker_testing {
namespace {

using namespace std::chrono_literals;

topic tname(std::string_view s) {
  return must(topic::make(s));
}
topic_pattern tpat(std::string_view s) {
  return must(topic_pattern::make(s));
}

struct opened {
  broker_config config;
  std::shared_ptr<topics> tp;
};

opened open_topics(fixture& fx) {
  auto config = config_for(fx);
  auto tp = must(topics::open(fx.shared_transport(), config));
  return {std::move(config), std::move(tp)};
}

/// Publishes `body` on `t` as `from`; returns the sequence.
std::uint64_t publish_ok(topics& tp, std::string_view t, std::string body = "1",
                         std::string from = "alice",
                         std::source_location where = std::source_location::current()) {
  return must(tp.publish({.to = tname(t), .from = std::move(from), .body = std::move(body)}), where)
      .seq;
}

/// The stream's last sequence (0 when nothing was ever stored).
std::uint64_t last_stored(fixture& fx, const topics& tp) {
  return must(fx.transport().stream_info_of(tp.stream())).state.last_seq;
}

/// Collects what a subscription delivers, from whatever thread the transport uses.
/// Refuses events once it holds `capacity` of them (its "bounded buffer").
class event_log {
 public:
  explicit event_log(std::size_t capacity = std::numeric_limits<std::size_t>::max())
      : capacity_(capacity) {}

  std::function<bool(const topic_event&)> on_event() {
    return [this](const topic_event& e) {
      std::lock_guard lock(mu_);
      if (dropped_) ++after_drop_;
      if (events_.size() >= capacity_) {
        refused_.push_back(e.seq);
        return false;
      }
      events_.push_back(e);
      return true;
    };
  }
  std::function<void(std::uint64_t)> on_dropped() {
    return [this](std::uint64_t last) {
      std::lock_guard lock(mu_);
      ++drops_;
      dropped_ = true;
      drop_seq_ = last;
    };
  }

  bool wait_for(std::size_t n, std::chrono::milliseconds timeout = 10s) const {
    return eventually([&] { return size() >= n; }, timeout);
  }
  bool wait_dropped(std::chrono::milliseconds timeout = 10s) const {
    return eventually([&] { return dropped(); }, timeout);
  }

  std::size_t size() const {
    std::lock_guard lock(mu_);
    return events_.size();
  }
  std::vector<topic_event> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }
  std::vector<std::uint64_t> seqs() const {
    std::vector<std::uint64_t> out;
    for (const auto& e : events()) out.push_back(e.seq);
    return out;
  }
  std::vector<std::string> topic_names() const {
    std::vector<std::string> out;
    for (const auto& e : events()) out.push_back(e.t.str());
    return out;
  }
  std::vector<std::string> bodies() const {
    std::vector<std::string> out;
    for (const auto& e : events()) out.push_back(e.env.body);
    return out;
  }
  bool dropped() const {
    std::lock_guard lock(mu_);
    return dropped_;
  }
  std::uint64_t drop_seq() const {
    std::lock_guard lock(mu_);
    return drop_seq_;
  }
  int drops() const {
    std::lock_guard lock(mu_);
    return drops_;
  }
  int after_drop() const {
    std::lock_guard lock(mu_);
    return after_drop_;
  }
  std::vector<std::uint64_t> refused() const {
    std::lock_guard lock(mu_);
    return refused_;
  }

 private:
  mutable std::mutex mu_;
  std::size_t capacity_;
  std::vector<topic_event> events_;
  std::vector<std::uint64_t> refused_;
  bool dropped_ = false;
  std::uint64_t drop_seq_ = 0;
  int drops_ = 0;
  int after_drop_ = 0;
};

std::unique_ptr<topic_subscription> subscribe_ok(
    topics& tp, std::string_view pattern, replay_from from, event_log& log,
    std::source_location where = std::source_location::current()) {
  return must(tp.subscribe(tpat(pattern), from, log.on_event(), log.on_dropped()), where);
}

/// On a real backend, gives events that should not come a moment to show up anyway.
/// (The memory transport delivers at once, so there is nothing to wait for.)
void settle(fixture& fx) {
  if (fx.real_time()) std::this_thread::sleep_for(200ms);
}

TEST_CASE("publish stores the envelope on the topic and returns its stream sequence", "[topics]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  const auto before = fx->transport().clock()->now();

  auto r = must(tp->publish({.to = tname("news.eu"),
                             .from = "alice",
                             .body = R"({ "headline" : "rain",  "n" : [1, 2] })",
                             .type = "news.item",
                             .headers = {{"lang", "en"}, {"src", "wire"}},
                             .msg_id = "m-1"}));
  CHECK(r.seq == 1);
  CHECK(r.msg_id == "m-1");
  CHECK_FALSE(r.duplicate);

  auto second = must(tp->publish({.to = tname("news.us"), .from = "bob", .body = "42"}));
  auto third = must(tp->publish({.to = tname("news.us"), .from = "$broker", .body = "null"}));
  CHECK(second.seq == 2);
  CHECK(third.seq == 3);
  // Without msg_id the broker makes a unique one, which is the envelope's id.
  CHECK(second.msg_id.rfind("m_", 0) == 0);
  CHECK(third.msg_id != second.msg_id);
  CHECK_FALSE(second.duplicate);

  // Stored as JSON on the topic's subject.
  auto stored = must(fx->transport().get_message(tp->stream(), 1));
  CHECK(stored.subject == subjects::topic_subject(config.ns, tname("news.eu")));
  auto env = must(parse_envelope(stored.data));
  CHECK(env.id == "m-1");

  event_log log;
  auto sub = subscribe_ok(*tp, ">", replay_from::all(), log);
  REQUIRE(log.wait_for(3));
  sub->stop();
  auto events = log.events();
  REQUIRE(events.size() == 3);
  const auto& e = events[0];
  CHECK(e.seq == 1);
  CHECK(e.t.str() == "news.eu");
  CHECK(e.env.id == "m-1");
  CHECK(e.env.from == "alice");
  CHECK(e.env.to == "news.eu");
  CHECK(e.env.ns == config.ns.str());
  CHECK(e.env.type == "news.item");
  CHECK(e.env.body == R"({"headline":"rain","n":[1,2]})");
  CHECK(e.env.headers ==
        std::vector<std::pair<std::string, std::string>>{{"lang", "en"}, {"src", "wire"}});
  CHECK(e.env.ts >= std::chrono::time_point_cast<std::chrono::milliseconds>(before));
  CHECK(e.env.ts <= fx->transport().clock()->now());
  CHECK(events[1].env.id == second.msg_id);
  CHECK(events[1].env.from == "bob");
  CHECK(events[2].env.from == "$broker");
  CHECK(events[2].env.body == "null");
}

result<publish_result> publish_sealed(topics& tp, sealed_envelope env) {
  std::promise<result<publish_result>> answer;
  tp.async_publish(std::move(env),
                   [&](result<publish_result> r) { answer.set_value(std::move(r)); });
  return answer.get_future().get();
}

TEST_CASE(
    "a sealed envelope is published as it was sealed, refused for another namespace or with "
    "reply_to",
    "[topics]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  auto now = fx->transport().clock()->now();
  auto sealed = must(sealed_envelope::seal(
      {.from = "alice", .to = "news.eu", .body = R"([ 1, 2 ])", .type = "news.item"},
      config.ns.view(), now));
  const envelope expected = sealed.get();
  auto elsewhere = must(
      sealed_envelope::seal({.from = "alice", .to = "news.eu", .body = "1"}, "elsewhere", now));
  auto refused = publish_sealed(*tp, elsewhere);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == errc::bad_request);
  auto answering = must(sealed_envelope::seal(
      {.from = "alice", .to = "news.eu", .body = "1", .reply_to = "alice", .correlation = "c"},
      config.ns.view(), now));
  refused = publish_sealed(*tp, answering);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == errc::bad_request);
  CHECK(last_stored(*fx, *tp) == 0);

  auto r = must(publish_sealed(*tp, sealed));
  CHECK(r.seq == 1);
  CHECK(r.msg_id == expected.id);
  CHECK(must(publish_sealed(*tp, sealed)).duplicate);
  auto stored = must(fx->transport().get_message(tp->stream(), 1));
  CHECK(stored.subject == subjects::topic_subject(config.ns, tname("news.eu")));
  CHECK(stored.data == sealed.json());
  CHECK(must(parse_envelope(stored.data)) == expected);
  CHECK(last_stored(*fx, *tp) == 1);
}

TEST_CASE("a repeated msg_id from the same sender on the same topic is stored once", "[topics]") {
  auto fx = make_fixture();
  auto config = config_for(*fx);
  // Short on a real server, so that the window can pass within the case.
  config.duplicate_window = fx->real_time() ? 500ms : 2min;
  auto tp = must(topics::open(fx->shared_transport(), config));
  auto publish = [&](std::string_view t, std::string from, std::string msg_id,
                     std::string body = "1") {
    return must(tp->publish({.to = tname(t),
                             .from = std::move(from),
                             .body = std::move(body),
                             .msg_id = std::move(msg_id)}));
  };

  auto first = publish("news.eu", "alice", "m1");
  CHECK(first.seq == 1);
  CHECK_FALSE(first.duplicate);

  // The same sender, topic and msg_id: the first sequence, nothing stored (even when the
  // body differs).
  auto again = publish("news.eu", "alice", "m1", "2");
  CHECK(again.seq == 1);
  CHECK(again.duplicate);
  CHECK(again.msg_id == "m1");

  // Another sender, or another topic, is another event.
  auto other_sender = publish("news.eu", "bob", "m1");
  CHECK(other_sender.seq == 2);
  CHECK_FALSE(other_sender.duplicate);
  auto other_topic = publish("news.us", "alice", "m1");
  CHECK(other_topic.seq == 3);
  CHECK_FALSE(other_topic.duplicate);
  auto broker = publish("news.eu", "$broker", "m1");
  CHECK(broker.seq == 4);

  // The asynchronous publish dedups the same way.
  std::mutex mu;
  std::optional<result<publish_result>> async_answer;
  tp->async_publish({.to = tname("news.eu"), .from = "alice", .body = "3", .msg_id = "m1"},
                    [&](result<publish_result> r) {
                      std::lock_guard lock(mu);
                      async_answer = std::move(r);
                    });
  REQUIRE(eventually([&] {
    std::lock_guard lock(mu);
    return async_answer.has_value();
  }));
  {
    std::lock_guard lock(mu);
    REQUIRE(async_answer->has_value());
    CHECK((*async_answer)->seq == 1);
    CHECK((*async_answer)->duplicate);
  }
  CHECK(last_stored(*fx, *tp) == 4);

  // Once the window has passed, the msg_id is new again.
  fx->advance(config.duplicate_window * 2);
  auto later = publish("news.eu", "alice", "m1");
  CHECK_FALSE(later.duplicate);
  CHECK(later.seq == 5);

  event_log log;
  auto sub = subscribe_ok(*tp, "news.eu", replay_from::all(), log);
  REQUIRE(log.wait_for(4));
  settle(*fx);
  sub->stop();
  CHECK(log.seqs() == std::vector<std::uint64_t>{1, 2, 4, 5});
  CHECK(log.bodies() == std::vector<std::string>{"1", "1", "1", "1"});
}

TEST_CASE("a subscription from new sees only events published after it", "[topics]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  publish_ok(*tp, "news.eu", "1");
  publish_ok(*tp, "news.eu", "2");

  event_log log;
  SECTION("by default") {
    auto sub = subscribe_ok(*tp, "news.>", {}, log);
    publish_ok(*tp, "news.eu", "3");
    publish_ok(*tp, "news.us", "4");
    REQUIRE(log.wait_for(2));
    settle(*fx);
    sub->stop();
  }
  SECTION("when asked") {
    auto sub = subscribe_ok(*tp, "news.>", replay_from::new_events(), log);
    publish_ok(*tp, "news.eu", "3");
    publish_ok(*tp, "news.us", "4");
    REQUIRE(log.wait_for(2));
    settle(*fx);
    sub->stop();
  }
  CHECK(log.seqs() == std::vector<std::uint64_t>{3, 4});
  CHECK(log.bodies() == std::vector<std::string>{"3", "4"});
}

TEST_CASE("a subscription from all replays every stored matching event, then live ones",
          "[topics]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  publish_ok(*tp, "news.eu", "1");
  publish_ok(*tp, "sports.eu", "2");
  publish_ok(*tp, "news.us", "3");

  event_log log;
  auto sub = subscribe_ok(*tp, "news.*", replay_from::all(), log);
  REQUIRE(log.wait_for(2));
  publish_ok(*tp, "sports.us", "4");
  publish_ok(*tp, "news.eu", "5");
  REQUIRE(log.wait_for(3));
  settle(*fx);
  sub->stop();
  CHECK(log.seqs() == std::vector<std::uint64_t>{1, 3, 5});
  CHECK(log.topic_names() == std::vector<std::string>{"news.eu", "news.us", "news.eu"});
  CHECK(sub->last_seq() == 5);
  CHECK_FALSE(sub->dropped());
}

TEST_CASE("a subscription from last starts at the latest event matching its pattern", "[topics]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  publish_ok(*tp, "news.eu", "1");     // 1
  publish_ok(*tp, "news.us", "2");     // 2
  publish_ok(*tp, "sports.eu", "3");   // 3
  publish_ok(*tp, "news.eu.fr", "4");  // 4
  publish_ok(*tp, "sports.us", "5");   // 5

  event_log log;
  SECTION("with a * pattern") {
    auto sub = subscribe_ok(*tp, "news.*", replay_from::last(), log);
    REQUIRE(log.wait_for(1));
    publish_ok(*tp, "sports.eu", "6");  // 6
    publish_ok(*tp, "news.eu", "7");    // 7
    REQUIRE(log.wait_for(2));
    settle(*fx);
    sub->stop();
    CHECK(log.seqs() == std::vector<std::uint64_t>{2, 7});
  }
  SECTION("with a > pattern") {
    auto sub = subscribe_ok(*tp, "news.>", replay_from::last(), log);
    REQUIRE(log.wait_for(1));
    publish_ok(*tp, "news.us", "6");  // 6
    REQUIRE(log.wait_for(2));
    settle(*fx);
    sub->stop();
    CHECK(log.seqs() == std::vector<std::uint64_t>{4, 6});
  }
  SECTION("with a leading * pattern") {
    auto sub = subscribe_ok(*tp, "*.eu", replay_from::last(), log);
    REQUIRE(log.wait_for(1));
    publish_ok(*tp, "news.eu", "6");  // 6
    REQUIRE(log.wait_for(2));
    settle(*fx);
    sub->stop();
    CHECK(log.seqs() == std::vector<std::uint64_t>{3, 6});
  }
  SECTION("when nothing matches yet") {
    auto sub = subscribe_ok(*tp, "weather.>", replay_from::last(), log);
    publish_ok(*tp, "news.eu", "6");     // 6
    publish_ok(*tp, "weather.eu", "7");  // 7
    REQUIRE(log.wait_for(1));
    settle(*fx);
    sub->stop();
    CHECK(log.seqs() == std::vector<std::uint64_t>{7});
  }
}

TEST_CASE("a subscription from a sequence starts with the first matching event at or after it",
          "[topics]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  publish_ok(*tp, "news.eu");    // 1
  publish_ok(*tp, "sports.eu");  // 2
  publish_ok(*tp, "news.eu");    // 3
  publish_ok(*tp, "sports.eu");  // 4
  publish_ok(*tp, "news.us");    // 5

  event_log log;
  SECTION("on a matching event") {
    auto sub = subscribe_ok(*tp, "news.>", replay_from::sequence(3), log);
    REQUIRE(log.wait_for(2));
    publish_ok(*tp, "news.eu");  // 6
    REQUIRE(log.wait_for(3));
    settle(*fx);
    sub->stop();
    CHECK(log.seqs() == std::vector<std::uint64_t>{3, 5, 6});
  }
  SECTION("on an event of another topic") {
    auto sub = subscribe_ok(*tp, "news.>", replay_from::sequence(4), log);
    REQUIRE(log.wait_for(1));
    publish_ok(*tp, "news.eu");  // 6
    REQUIRE(log.wait_for(2));
    settle(*fx);
    sub->stop();
    CHECK(log.seqs() == std::vector<std::uint64_t>{5, 6});
  }
  SECTION("beyond the end of the stream") {
    auto sub = subscribe_ok(*tp, "news.>", replay_from::sequence(7), log);
    publish_ok(*tp, "news.eu");  // 6
    publish_ok(*tp, "news.eu");  // 7
    REQUIRE(log.wait_for(1));
    settle(*fx);
    sub->stop();
    CHECK(log.seqs() == std::vector<std::uint64_t>{7});
  }
}

TEST_CASE("a subscription from a time starts with the first event stored at or after it",
          "[topics][time]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  publish_ok(*tp, "news.eu", "1");
  publish_ok(*tp, "news.eu", "2");
  fx->advance(fx->real_time() ? 300ms : 1s);
  const auto start = fx->transport().clock()->now();
  publish_ok(*tp, "sports.eu", "3");
  publish_ok(*tp, "news.eu", "4");
  publish_ok(*tp, "news.us", "5");

  event_log log;
  auto sub = subscribe_ok(*tp, "news.*", replay_from::at_time(start), log);
  REQUIRE(log.wait_for(2));
  publish_ok(*tp, "news.eu", "6");
  REQUIRE(log.wait_for(3));
  settle(*fx);
  sub->stop();
  CHECK(log.seqs() == std::vector<std::uint64_t>{4, 5, 6});

  // A time before every event replays them all.
  event_log everything;
  auto all = subscribe_ok(*tp, "news.*", replay_from::at_time(start - 1h), everything);
  REQUIRE(everything.wait_for(5));
  settle(*fx);
  all->stop();
  CHECK(everything.seqs() == std::vector<std::uint64_t>{1, 2, 4, 5, 6});

  // A time still to come: only what is stored from then on.
  const auto step = fx->real_time() ? 500ms : 1s;
  event_log future;
  auto later = subscribe_ok(*tp, "news.*",
                            replay_from::at_time(fx->transport().clock()->now() + step), future);
  publish_ok(*tp, "news.eu", "7");
  fx->advance(step);
  publish_ok(*tp, "news.eu", "8");
  REQUIRE(future.wait_for(1));
  settle(*fx);
  later->stop();
  CHECK(future.bodies() == std::vector<std::string>{"8"});
}

TEST_CASE("wildcard patterns match exactly the topics the grammar says", "[topics]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  const std::vector<std::string> all_topics{"news",         "news.eu",   "news.us",
                                            "news.eu.fr",   "sports.eu", "sports.eu.fr",
                                            "news.eu.fr.x", "eu"};
  for (const auto& t : all_topics) publish_ok(*tp, t);

  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {"news.*", {"news.eu", "news.us"}},
      {"news.>", {"news.eu", "news.us", "news.eu.fr", "news.eu.fr.x"}},
      {"*.eu", {"news.eu", "sports.eu"}},
      {"*.eu.>", {"news.eu.fr", "sports.eu.fr", "news.eu.fr.x"}},
      {"*.*.fr", {"news.eu.fr", "sports.eu.fr"}},
      {"*", {"news", "eu"}},
      {"news", {"news"}},
      {"news.eu", {"news.eu"}},
      {">", all_topics},
  };
  // All at once, so that a real backend needs only one moment to settle.
  std::vector<std::unique_ptr<event_log>> logs;
  std::vector<std::unique_ptr<topic_subscription>> subs;
  for (const auto& [pattern, expected] : cases) {
    logs.push_back(std::make_unique<event_log>());
    subs.push_back(subscribe_ok(*tp, pattern, replay_from::all(), *logs.back()));
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].first);
    CHECK(logs[i]->wait_for(cases[i].second.size()));
  }
  settle(*fx);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].first);
    subs[i]->stop();
    CHECK(logs[i]->topic_names() == cases[i].second);
  }
}

TEST_CASE("events arrive in stream order, each once, without gaps across interleaved topics",
          "[topics][concurrency]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  constexpr int publishers = 4;
  constexpr int each = 150;
  // Publishers 0 and 1 publish on topics the subscription matches; 2 and 3 on others.
  auto topic_of = [](int p) { return tname((p < 2 ? "news.p" : "misc.p") + std::to_string(p)); };

  std::mutex mu;
  std::vector<std::pair<std::uint64_t, int>> matching;  // (seq, publisher)
  std::atomic<int> failures{0};
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  // Some events are stored before the subscription starts, the rest while it replays.
  for (int i = 0; i < 20; ++i) {
    auto r = tp->publish({.to = topic_of(i % publishers), .from = "alice", .body = "0"});
    if (!r) ++failures;
    if (r && i % publishers < 2) matching.emplace_back(r->seq, -1);
  }
  for (int p = 0; p < publishers; ++p) {
    threads.emplace_back([&, p] {
      ++started;
      for (int i = 0; i < each; ++i) {
        auto r = tp->publish({.to = topic_of(p), .from = "alice", .body = std::to_string(i + 1)});
        if (!r) {
          ++failures;
          continue;
        }
        if (p < 2) {
          std::lock_guard lock(mu);
          matching.emplace_back(r->seq, p);
        }
      }
    });
  }
  while (started.load() < publishers) std::this_thread::yield();
  event_log log;
  auto sub = subscribe_ok(*tp, "news.>", replay_from::all(), log);
  for (auto& th : threads) th.join();
  REQUIRE(failures.load() == 0);
  const std::size_t expected_count = 10 + 2 * each;
  REQUIRE(log.wait_for(expected_count, 30s));
  settle(*fx);
  sub->stop();

  std::sort(matching.begin(), matching.end());
  std::vector<std::uint64_t> expected;
  for (const auto& [seq, p] : matching) expected.push_back(seq);
  CHECK(log.seqs() == expected);
  // Each publisher's events arrive in the order it published them.
  std::vector<int> next(2, 1);
  bool in_order = true;
  for (const auto& e : log.events()) {
    if (e.env.body == "0") continue;
    const int p = e.t.str().back() - '0';
    if (e.env.body != std::to_string(next[static_cast<std::size_t>(p)]++)) in_order = false;
  }
  CHECK(in_order);
}

TEST_CASE(
    "a subscriber that cannot keep up is dropped and resumes from last_seq + 1 "
    "without loss or repeat",
    "[topics][slow]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  constexpr int total = 3000;
  constexpr std::size_t capacity = 700;  // what one subscription takes before it refuses
  std::vector<std::uint64_t> published;  // sequences of the matching events
  std::atomic<int> failures{0};
  auto publish_one = [&](int i) {
    auto r = tp->publish(
        {.to = tname(i % 2 ? "feed.a" : "feed.b.c"), .from = "alice", .body = std::to_string(i)});
    if (r) {
      published.push_back(r->seq);
    } else {
      ++failures;
    }
    // Events the pattern does not match, so that sequences are not consecutive.
    if (i % 3 == 0 && !tp->publish({.to = tname("other.x"), .from = "alice", .body = "-1"})) {
      ++failures;
    }
  };
  // A third is stored before the first subscription; the rest comes while it runs.
  for (int i = 0; i < total / 3; ++i) publish_one(i);
  std::thread publisher([&] {
    for (int i = total / 3; i < total; ++i) publish_one(i);
  });

  std::vector<topic_event> received;
  std::uint64_t resume = 0;  // 0: the first subscription replays everything
  int rounds = 0;
  while (received.size() < static_cast<std::size_t>(total)) {
    REQUIRE(++rounds <= 10);
    event_log log(capacity);
    auto sub = subscribe_ok(*tp, "feed.>",
                            resume == 0 ? replay_from::all() : replay_from::sequence(resume), log);
    const std::size_t wanted = std::min(capacity, total - received.size());
    REQUIRE(eventually([&] { return log.dropped() || log.size() >= wanted; }, 60s));
    if (log.size() == wanted && wanted < capacity) {
      settle(*fx);
    } else {
      REQUIRE(log.wait_dropped(60s));
    }
    sub->stop();
    auto events = log.events();
    received.insert(received.end(), events.begin(), events.end());
    if (log.dropped()) {
      // The refused event is the one after the last taken; last_seq sits just before it.
      const auto refused = log.refused();
      REQUIRE(refused.size() == 1);
      CHECK(log.drops() == 1);
      CHECK(log.drop_seq() == refused.front() - 1);
      CHECK(log.drop_seq() >= events.back().seq);
      CHECK(sub->dropped());
      CHECK(sub->last_seq() == log.drop_seq());
      resume = log.drop_seq() + 1;
    }
    CHECK(log.after_drop() == 0);
  }
  publisher.join();
  REQUIRE(failures.load() == 0);
  CHECK(rounds == (total + static_cast<int>(capacity) - 1) / static_cast<int>(capacity));

  // Exactly the matching events, once each, in the order they were published.
  std::vector<std::uint64_t> seqs;
  bool bodies_in_order = true;
  for (std::size_t i = 0; i < received.size(); ++i) {
    seqs.push_back(received[i].seq);
    if (received[i].env.body != std::to_string(i)) bodies_in_order = false;
  }
  CHECK(seqs == published);
  CHECK(bodies_in_order);
}

TEST_CASE("a subscriber that refuses its first event resumes at that event", "[topics][slow]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  publish_ok(*tp, "news.eu", "1");  // 1, before the subscription

  event_log refusing(0);
  auto sub = subscribe_ok(*tp, "news.*", replay_from::new_events(), refusing);
  publish_ok(*tp, "sports.eu", "2");  // 2
  const auto refused = publish_ok(*tp, "news.us", "3");
  publish_ok(*tp, "news.eu", "4");  // after the drop: not delivered to it
  REQUIRE(refusing.wait_dropped());
  settle(*fx);
  CHECK(refusing.drop_seq() == refused - 1);
  CHECK(refusing.size() == 0);
  CHECK(refusing.refused() == std::vector<std::uint64_t>{refused});
  CHECK(refusing.after_drop() == 0);
  CHECK(sub->dropped());

  event_log resumed;
  auto again = subscribe_ok(*tp, "news.*", replay_from::sequence(refusing.drop_seq() + 1), resumed);
  REQUIRE(resumed.wait_for(2));
  settle(*fx);
  again->stop();
  CHECK(resumed.bodies() == std::vector<std::string>{"3", "4"});
}

TEST_CASE("a subscriber dropped while stored events are replayed gets nothing more",
          "[topics][slow]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  for (int i = 0; i < 50; ++i) publish_ok(*tp, "news.eu", std::to_string(i));

  event_log log(10);
  auto sub = subscribe_ok(*tp, "news.eu", replay_from::all(), log);
  REQUIRE(log.wait_dropped());
  publish_ok(*tp, "news.eu", "50");
  settle(*fx);
  CHECK(log.size() == 10);
  CHECK(log.drop_seq() == 10);
  CHECK(log.drops() == 1);
  CHECK(log.after_drop() == 0);
  CHECK(log.refused() == std::vector<std::uint64_t>{11});
  CHECK(sub->last_seq() == 10);
}

TEST_CASE("bad input is refused with a precise error and stores nothing", "[topics]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  publish_ok(*tp, "news.eu");
  const auto before = last_stored(*fx, *tp);
  event_log log;
  auto sub = subscribe_ok(*tp, ">", replay_from::new_events(), log);

  auto attempt = [&](topic_message m) { return tp->publish(std::move(m)); };
  auto msg = [](std::string from, std::string body) {
    return topic_message{.to = tname("news.eu"), .from = std::move(from), .body = std::move(body)};
  };

  SECTION("a body that is not one JSON value is bad_request") {
    for (const std::string& body :
         std::vector<std::string>{"", "{", "1 2", "{\"a\":1} x", "nope", "\"\xff\"", "[1,]"}) {
      CAPTURE(body);
      CHECK(code_of(attempt(msg("alice", body))) == errc::bad_request);
    }
    // Shape comes first: a bad body with a bad sender is still bad_request.
    CHECK(code_of(attempt(msg("Bob", "{"))) == errc::bad_request);
  }
  SECTION("a sender that is neither a participant nor $broker is invalid_name") {
    for (const std::string& from :
         std::vector<std::string>{"", "Bob", "$brokers", "$Broker", "broker$", "al ice", "a.b", "*",
                                  "1abc", std::string(65, 'a')}) {
      CAPTURE(from);
      auto r = attempt(msg(from, "1"));
      CHECK(code_of(r) == errc::invalid_name);
      if (!r) CHECK(r.error().message().find("from") != std::string::npos);
    }
  }
  SECTION("bad envelope fields are invalid_envelope with their path") {
    auto m = msg("alice", "1");
    m.type = "not a type";
    auto r = attempt(m);
    CHECK(code_of(r) == errc::invalid_envelope);
    if (!r) CHECK(r.error().path() == "/type");

    m = msg("alice", "1");
    m.msg_id = std::string(129, 'x');
    r = attempt(m);
    CHECK(code_of(r) == errc::invalid_envelope);
    if (!r) CHECK(r.error().path() == "/id");

    m = msg("alice", "1");
    m.msg_id = "line\nbreak";
    CHECK(code_of(attempt(m)) == errc::invalid_envelope);

    m = msg("alice", "1");
    m.headers = {{"k", "1"}, {"k", "2"}};
    CHECK(code_of(attempt(m)) == errc::invalid_envelope);

    m = msg("alice", "1");
    m.headers = {{"", "1"}};
    CHECK(code_of(attempt(m)) == errc::invalid_envelope);
  }
  SECTION("the asynchronous publish refuses the same way, at once") {
    std::optional<result<publish_result>> answer;
    tp->async_publish(msg("Bob", "1"), [&](result<publish_result> r) { answer = std::move(r); });
    REQUIRE(answer.has_value());
    CHECK(code_of(*answer) == errc::invalid_name);
  }
  SECTION("a subscription needs a callback and a real start sequence") {
    CHECK(code_of(tp->subscribe(tpat("news.>"), replay_from::all(), {}, {})) == errc::bad_request);
    CHECK(code_of(tp->subscribe(tpat("news.>"), replay_from::sequence(0), log.on_event(),
                                log.on_dropped())) == errc::bad_request);
  }

  CHECK(last_stored(*fx, *tp) == before);
  // Nothing reached a subscriber either.
  publish_ok(*tp, "news.eu", "\"marker\"");
  REQUIRE(log.wait_for(1));
  settle(*fx);
  sub->stop();
  CHECK(log.bodies() == std::vector<std::string>{"\"marker\""});
}

TEST_CASE("stored messages that are not events are skipped", "[topics]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  auto& t = fx->transport();
  const auto subject = subjects::topic_subject(config.ns, tname("news.eu"));
  auto raw = [&](std::string data) {
    return must(t.publish({.subject = subject, .data = data})).seq;
  };

  publish_ok(*tp, "news.eu", "1");  // 1
  raw("not json");                  // 2
  raw(R"({"a":1})");                // 3: JSON, not an envelope
  // 4: an envelope whose topic is not its subject's
  raw(R"({"id":"x","from":"alice","to":"news.us","ns":")" + config.ns.str() +
      R"(","ts":"2026-01-01T00:00:00.000Z","body":1})");
  // 5: an envelope of another namespace
  raw(R"({"id":"y","from":"alice","to":"news.eu","ns":"elsewhere","ts":"2026-01-01T00:00:00.000Z","body":1})");
  publish_ok(*tp, "news.eu", "6");  // 6

  event_log log;
  auto sub = subscribe_ok(*tp, "news.>", replay_from::all(), log);
  REQUIRE(log.wait_for(2));
  raw("");  // 7
  settle(*fx);
  CHECK(log.seqs() == std::vector<std::uint64_t>{1, 6});
  // Skipped messages count as passed: resuming after last_seq repeats nothing.
  CHECK(eventually([&] { return sub->last_seq() == 7; }));
  sub->stop();
}

TEST_CASE("after stop returns no event is delivered", "[topics]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);
  publish_ok(*tp, "news.eu", "1");

  event_log stopped;
  auto sub = subscribe_ok(*tp, "news.>", replay_from::all(), stopped);
  REQUIRE(stopped.wait_for(1));
  SECTION("stop") {
    sub->stop();
    sub->stop();  // idempotent
    CHECK(sub->last_seq() == 1);
    CHECK_FALSE(sub->dropped());
  }
  SECTION("destroying the subscription") {
    sub.reset();
  }
  for (int i = 0; i < 5; ++i) publish_ok(*tp, "news.eu");

  event_log witness;
  auto other = subscribe_ok(*tp, "news.>", replay_from::all(), witness);
  REQUIRE(witness.wait_for(6));
  settle(*fx);
  other->stop();
  CHECK(stopped.size() == 1);
  CHECK(stopped.drops() == 0);
}

TEST_CASE("stop from inside on_event ends the subscription after that event", "[topics]") {
  auto fx = make_fixture();
  auto [config, tp] = open_topics(*fx);

  std::atomic<topic_subscription*> self{nullptr};
  std::atomic<int> seen{0};
  std::atomic<int> drops{0};
  auto sub = must(tp->subscribe(
      tpat("news.>"), replay_from::new_events(),
      [&](const topic_event&) {
        if (++seen == 2) self.load()->stop();
        return true;
      },
      [&](std::uint64_t) { ++drops; }));
  self = sub.get();
  for (int i = 0; i < 5; ++i) publish_ok(*tp, "news.eu");

  event_log witness;
  auto other = subscribe_ok(*tp, "news.>", replay_from::all(), witness);
  REQUIRE(witness.wait_for(5));
  REQUIRE(eventually([&] { return seen.load() >= 2; }));
  settle(*fx);
  other->stop();
  CHECK(seen.load() == 2);
  CHECK(drops.load() == 0);
  CHECK(sub->last_seq() == 2);
}

TEST_CASE("several topics instances on one namespace share its events and dedup", "[topics]") {
  auto fx = make_fixture();
  auto config = config_for(*fx);
  auto a = must(topics::open(fx->shared_transport(), config));
  auto b = must(topics::open(fx->shared_transport(), config));
  CHECK(a->stream() == subjects::topics_stream(config.ns));
  CHECK(b->stream() == a->stream());

  event_log log;
  auto sub = subscribe_ok(*b, "news.>", replay_from::all(), log);
  auto first =
      must(a->publish({.to = tname("news.eu"), .from = "alice", .body = "1", .msg_id = "k"}));
  auto again =
      must(b->publish({.to = tname("news.eu"), .from = "alice", .body = "1", .msg_id = "k"}));
  CHECK(again.duplicate);
  CHECK(again.seq == first.seq);
  REQUIRE(log.wait_for(1));
  settle(*fx);
  sub->stop();
  CHECK(log.seqs() == std::vector<std::uint64_t>{first.seq});

  // Other limits are taken by the stream (the last configuration to open wins), keeping
  // its events; another storage is refused and changes nothing.
  auto different = config;
  different.topic_max_age = std::chrono::hours(1);
  must(topics::open(fx->shared_transport(), different));
  auto info = must(fx->transport().stream_info_of(a->stream()));
  CHECK(info.config.max_age == std::chrono::hours(1));
  CHECK(info.state.messages == 1);
  auto elsewhere = different;
  elsewhere.storage =
      config.storage == storage_type::file ? storage_type::memory : storage_type::file;
  CHECK(code_of(topics::open(fx->shared_transport(), elsewhere)) == errc::conflict);
  CHECK(must(fx->transport().stream_info_of(a->stream())).config.storage == config.storage);
}

}  // namespace
}  // namespace amp::broker_testing
