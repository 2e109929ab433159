// Outages: the JetStream transport against a nats-server that is stopped, killed and restarted
// under it. While the server is away every operation answers `unavailable` within a bounded
// time (and asynchronous ones complete exactly once); once it is back the same transport object
// carries on, and nothing that was acknowledged is lost or duplicated.
//
// "Within a bounded time" is checked as "within op_timeout + 3 s" by the steady clock: a sanity
// bound against hangs, not a performance claim.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <string>
#include <thread>
#include <vector>

#include "amp/error.hpp"
#include "amp/result.hpp"
#include "amp/transport/jetstream.hpp"
#include "amp/transport/transport.hpp"
#include "support/checks.hpp"
#include "support/jetstream_connect.hpp"
#include "support/nats_server.hpp"

namespace {

using namespace std::chrono_literals;
using amp::errc;
using amp::testing::eventually;
using amp::testing::nats_server;
using steady = std::chrono::steady_clock;

/// The transports here give up on an absent server after this long.
constexpr auto op_timeout = 1s;
/// The sanity bound on any operation while the server is away.
constexpr auto bound = op_timeout + 3s;

using amp::testing::code_of;
using amp::testing::must;
using amp::testing::text_of;

std::shared_ptr<amp::transport> connect(const nats_server& server) {
  return amp::testing::connect_jetstream(
      server, {.name = "amp-outage-test", .op_timeout = op_timeout, .reconnect_wait = 250ms});
}

/// Polls ping() until the transport reaches the server again.
bool reconnected(amp::transport& t) {
  return eventually(15s, [&] { return t.ping().has_value(); });
}

/// Runs `op` and returns its result and how long it took.
template <class F>
auto timed(F op) {
  auto start = steady::now();
  auto r = op();
  return std::pair(std::move(r), steady::now() - start);
}

/// Checks that `op` answers `unavailable` within the bound.
#define CHECK_UNAVAILABLE_IN_TIME(op)                                                           \
  do {                                                                                          \
    auto [r_, took_] = timed([&] { return op; });                                               \
    INFO(#op << " -> " << text_of(r_) << " after "                                              \
             << std::chrono::duration_cast<std::chrono::milliseconds>(took_).count() << " ms"); \
    CHECK(code_of(r_) == errc::unavailable);                                                    \
    CHECK(took_ < bound);                                                                       \
  } while (false)

/// Observes the completions of an asynchronous operation: how many, the first code, when.
class completion_probe {
 public:
  template <class T>
  static amp::completion<T> handler(const std::shared_ptr<completion_probe>& probe) {
    return [probe](amp::result<T> r) { probe->record(code_of(r)); };
  }

  /// Waits until the first completion, at most until `deadline`.
  bool wait_until(steady::time_point deadline) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return calls_ > 0; });
  }
  int calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }
  errc first_code() const {
    std::lock_guard lock(mu_);
    return first_;
  }

 private:
  void record(errc code) {
    std::lock_guard lock(mu_);
    if (calls_++ == 0) first_ = code;
    cv_.notify_all();
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0;
  errc first_{};
};

amp::outgoing_message numbered(const std::string& subject, int i, const std::string& prefix) {
  return {.subject = subject,
          .data = "message " + std::to_string(i),
          .headers = {{"X-Test-Id", std::to_string(i)}},
          .msg_id = prefix + std::to_string(i)};
}

int id_of(const amp::message& m) {
  auto h = amp::find_header(m.headers, "X-Test-Id");
  return h ? std::stoi(std::string(*h)) : -1;
}

amp::stream_config work_queue(std::string name, std::string subjects) {
  amp::stream_config c;
  c.name = std::move(name);
  c.subjects = {std::move(subjects)};
  c.retention = amp::retention_policy::work_queue;
  return c;
}

amp::consumer_config durable(std::string stream, std::string name, amp::duration ack_wait) {
  amp::consumer_config c;
  c.stream = std::move(stream);
  c.durable = std::move(name);
  c.ack_wait = ack_wait;
  c.max_ack_pending = -1;
  return c;
}

}  // namespace

TEST_CASE(
    "outage: while the server is stopped every operation answers unavailable in time, and "
    "after its restart the same transport resumes where it was",
    "[jetstream][outage]") {
  auto server = nats_server::start();
  auto tp = connect(server);
  auto& t = *tp;
  CHECK(t.connection_epoch() == 0);

  auto stream = work_queue("OUT", "out.>");
  constexpr auto ack_wait = 3s;  // the unacked messages come back this long after the restart
  auto consumer = durable("OUT", "worker", ack_wait);
  amp::kv_config bucket{.bucket = "state", .history = 8};
  must(t.ensure_stream(stream));
  must(t.ensure_consumer(consumer));
  must(t.ensure_bucket(bucket));
  // Where the publishes refused during the outage go, so that OUT holds only acknowledged
  // ones. (Whether a refused publish stays unstored is the case after this one.)
  must(t.ensure_stream(work_queue("LOST", "lost.>")));

  std::vector<std::uint64_t> seq_of;
  for (int i = 0; i < 10; ++i) seq_of.push_back(must(t.publish(numbered("out.job", i, "m"))).seq);
  auto first = must(t.fetch("OUT", "worker", {.batch = 4, .max_wait = 0s}));
  REQUIRE(first.size() == 4);
  for (int i = 0; i < 4; ++i) REQUIRE(id_of(first[i]) == i);
  must(t.ack(first[0]));
  must(t.ack(first[1]));
  // first[2] and first[3] stay delivered and unacked over the outage.

  auto r1 = must(t.kv_put("state", "a", "1"));
  auto r2 = must(t.kv_update("state", "a", "2", r1));
  auto rb = must(t.kv_put("state", "b", "x"));

  server.stop();

  // The blocking forms.
  CHECK_UNAVAILABLE_IN_TIME(t.ping());
  CHECK_UNAVAILABLE_IN_TIME(t.publish(numbered("lost.job", 100, "m")));
  CHECK_UNAVAILABLE_IN_TIME(t.fetch("OUT", "worker", {.batch = 1, .max_wait = 0s}));
  CHECK_UNAVAILABLE_IN_TIME(t.ack(first[2]));
  CHECK_UNAVAILABLE_IN_TIME(t.kv_get("state", "a"));
  CHECK_UNAVAILABLE_IN_TIME(t.kv_update("state", "a", "lost", r2));
  CHECK_UNAVAILABLE_IN_TIME(t.kv_put("state", "c", "lost"));
  CHECK_UNAVAILABLE_IN_TIME(t.kv_create("state", "d", "lost"));
  CHECK_UNAVAILABLE_IN_TIME(t.ensure_stream(stream));
  CHECK_UNAVAILABLE_IN_TIME(t.ensure_consumer(consumer));
  CHECK_UNAVAILABLE_IN_TIME(t.ensure_bucket(bucket));
  CHECK_UNAVAILABLE_IN_TIME(t.stream_info_of("OUT"));
  CHECK_UNAVAILABLE_IN_TIME(t.consumer_info_of("OUT", "worker"));

  // The asynchronous forms, all at once: each completes with unavailable, exactly once (checked
  // again at the end of the case, long after).
  struct pending {
    const char* what;
    std::shared_ptr<completion_probe> probe = std::make_shared<completion_probe>();
  };
  std::vector<pending> async_ops = {{"async_publish"}, {"async_fetch"},  {"async_acknowledge"},
                                    {"async_kv_get"},  {"async_kv_put"}, {"async_kv_update"}};
  auto started = steady::now();
  t.async_publish(numbered("lost.job", 101, "m"),
                  completion_probe::handler<amp::publish_ack>(async_ops[0].probe));
  t.async_fetch("OUT", "worker", {.batch = 1, .max_wait = 0s},
                completion_probe::handler<std::vector<amp::message>>(async_ops[1].probe));
  t.async_acknowledge(first[3], amp::ack_kind::ack, amp::duration::zero(),
                      completion_probe::handler<void>(async_ops[2].probe));
  t.async_kv_get("state", "a", completion_probe::handler<amp::kv_entry>(async_ops[3].probe));
  t.async_kv_put("state", "c", "lost", std::nullopt,
                 completion_probe::handler<std::uint64_t>(async_ops[4].probe));
  t.async_kv_update("state", "a", "lost", r2, std::nullopt,
                    completion_probe::handler<std::uint64_t>(async_ops[5].probe));
  for (auto& op : async_ops) {
    INFO(op.what);
    REQUIRE(op.probe->wait_until(started + bound));
    CHECK(op.probe->first_code() == errc::unavailable);
  }

  server.restart();
  REQUIRE(reconnected(t));
  CHECK(t.connection_epoch() == 1);  // what core subscribers missed is to be looked for

  // KV: the acknowledged values are there, revisions continue after them.
  auto a = must(t.kv_get("state", "a"));
  CHECK(a.value == "2");
  CHECK(a.revision == r2);
  CHECK(must(t.kv_get("state", "b")).value == "x");
  CHECK(code_of(t.kv_get("state", "c")) == errc::not_found);
  CHECK(code_of(t.kv_get("state", "d")) == errc::not_found);
  CHECK(code_of(t.kv_update("state", "a", "stale", r1)) == errc::conflict);
  auto r3 = must(t.kv_update("state", "a", "3", r2));
  CHECK(r3 > rb);
  auto history = must(t.kv_history("state", "a"));
  REQUIRE(history.size() == 3);
  CHECK(history[0].revision == r1);
  CHECK(history[1].revision == r2);
  CHECK(history[2].revision == r3);
  CHECK(history[2].value == "3");

  // The stream: the two acked messages are gone, the eight others are there.
  auto info = must(t.stream_info_of("OUT"));
  CHECK(info.state.messages == 8);
  CHECK(info.state.last_seq == seq_of.back());
  CHECK(code_of(t.get_message("OUT", seq_of[0])) == errc::not_found);
  CHECK(code_of(t.get_message("OUT", seq_of[1])) == errc::not_found);

  // The durable consumer resumes: new messages at once, the two unacked ones after their
  // AckWait, the acked ones never.
  std::map<int, std::uint64_t> deliveries;  // id -> delivery count when it came
  std::vector<int> unexpected_ids;
  bool all = eventually(20s, [&] {
    auto got = t.fetch("OUT", "worker", {.batch = 10, .max_wait = 1s});
    if (!got) return false;
    for (const auto& m : *got) {
      int id = id_of(m);
      if (id < 2 || id > 9 || deliveries.count(id) > 0) unexpected_ids.push_back(id);
      deliveries[id] = m.delivery_count;
      must(t.ack(m));
    }
    return deliveries.size() >= 8;
  });
  INFO("delivered ids: " << deliveries.size());
  CHECK(all);
  CHECK(unexpected_ids.empty());
  for (int id = 2; id <= 9; ++id) CHECK(deliveries.count(id) == 1);
  CHECK(deliveries[2] >= 2);  // delivered before the outage: this is a redelivery
  CHECK(deliveries[3] >= 2);
  CHECK(must(t.stream_info_of("OUT")).state.messages == 0);
  // Nothing comes back, not even after another AckWait.
  CHECK(must(t.fetch("OUT", "worker", {.batch = 10, .max_wait = ack_wait + 1s})).empty());

  for (auto& op : async_ops) {
    INFO(op.what);
    CHECK(op.probe->calls() == 1);
  }
}

TEST_CASE(
    "outage: a server killed with SIGKILL mid-publish loses no acknowledged message and "
    "retries with the same msg_id store each message once",
    "[jetstream][outage]") {
  auto server = nats_server::start();
  auto tp = connect(server);
  auto& t = *tp;
  must(t.ensure_stream(work_queue("KILL", "kill.>")));
  must(t.ensure_consumer(durable("KILL", "drain", 30s)));

  constexpr int n = 3000;
  struct outcome {
    std::atomic<int> acknowledged{0};  // publishes that returned ok
    std::atomic<int> unavailable{0};   // answers that were retried
    std::atomic<int> duplicates{0};    // ok answers that said "duplicate"
    std::vector<int> failed;           // ids given up on, or answered with another error
    std::vector<std::string> errors;
  } out;

  std::thread publisher([&] {
    for (int i = 0; i < n; ++i) {
      auto give_up = steady::now() + 30s;
      for (;;) {
        auto r = t.publish(numbered("kill.job", i, "k"));
        if (r) {
          if (r->duplicate) ++out.duplicates;
          ++out.acknowledged;
          break;
        }
        if (r.error().code() == errc::unavailable && steady::now() < give_up) {
          ++out.unavailable;
          std::this_thread::sleep_for(10ms);
          continue;
        }
        out.failed.push_back(i);
        out.errors.push_back(r.error().to_string());
        break;
      }
    }
  });

  auto wait_until = steady::now() + 20s;
  while (out.acknowledged < n / 4 && steady::now() < wait_until) std::this_thread::sleep_for(1ms);
  bool started = out.acknowledged >= n / 4;
  int before_kill = out.acknowledged;
  server.kill();
  server.restart();
  int at_restart = out.acknowledged;
  publisher.join();
  REQUIRE(started);

  INFO("acknowledged before the kill: " << before_kill
                                        << ", when the server was back: " << at_restart
                                        << ", unavailable answers retried: " << out.unavailable
                                        << ", duplicates: " << out.duplicates);
  INFO("first error: " << (out.errors.empty() ? std::string("none") : out.errors.front()));
  // The kill came in the middle of the traffic, which went on after the restart.
  CHECK(before_kill < n);
  CHECK(at_restart < n);
  REQUIRE(out.failed.empty());
  REQUIRE(out.acknowledged == n);

  // Every message once in the stream ...
  REQUIRE(reconnected(t));
  CHECK(must(t.stream_info_of("KILL")).state.messages == static_cast<std::uint64_t>(n));

  // ... and once through the consumer.
  std::vector<int> count(n, 0);
  int foreign = 0;
  int drained = 0;
  eventually(30s, [&] {
    auto got = t.fetch("KILL", "drain", {.batch = 250, .max_wait = 1s});
    if (!got) return false;
    for (const auto& m : *got) {
      int id = id_of(m);
      if (id < 0 || id >= n) {
        ++foreign;
      } else if (count[id]++ == 0) {
        ++drained;
      }
      must(t.ack(m));
    }
    return drained == n && got->empty();
  });
  std::vector<int> missing, doubled;
  for (int i = 0; i < n; ++i) {
    if (count[i] == 0) missing.push_back(i);
    if (count[i] > 1) doubled.push_back(i);
  }
  INFO("missing: " << missing.size() << " (first " << (missing.empty() ? -1 : missing.front())
                   << "), delivered twice: " << doubled.size());
  CHECK(foreign == 0);
  CHECK(missing.empty());
  CHECK(doubled.empty());
  CHECK(must(t.stream_info_of("KILL")).state.messages == 0);
}

// cnats 3.4.1 checks its reconnect buffer's limit before appending, so even with the
// transport's 1-byte buffer the first message written after a disconnect would be buffered
// and sent after the reconnect, long after the transport answered `unavailable`. The
// transport refuses to write while the connection is not up; this holds it to that.
TEST_CASE(
    "outage: a write answered unavailable while the server is away is not applied when it "
    "comes back",
    "[jetstream][outage]") {
  auto server = nats_server::start();
  auto tp = connect(server);
  auto& t = *tp;
  must(t.ensure_stream(work_queue("LATE", "late.>")));
  must(t.ensure_bucket({.bucket = "late", .history = 4}));
  auto before = must(t.kv_put("late", "k", "before"));

  server.stop();
  REQUIRE(code_of(t.ping()) == errc::unavailable);  // the transport knows the server is away
  auto put = t.kv_put("late", "k", "refused");
  INFO("kv_put: " << text_of(put));
  REQUIRE(code_of(put) == errc::unavailable);
  auto sent = t.publish({.subject = "late.job", .data = "refused"});
  INFO("publish: " << text_of(sent));
  REQUIRE(code_of(sent) == errc::unavailable);

  server.restart();
  REQUIRE(reconnected(t));
  // Give anything cnats held back time to arrive (it flushes right after reconnecting).
  REQUIRE(t.kv_put("late", "other", "after").has_value());
  auto k = must(t.kv_get("late", "k"));
  INFO("value of k: " << k.value << " at revision " << k.revision);
  CHECK(k.value == "before");
  CHECK(k.revision == before);
  CHECK(must(t.stream_info_of("LATE")).state.messages == 0);
}

namespace {

enum class away { stopped, killed };

void take_away(nats_server& server, away how) {
  if (how == away::stopped) {
    server.stop();
  } else {
    server.kill();
  }
}

void waiting_fetch_completes(away how) {
  auto server = nats_server::start();
  auto tp = connect(server);
  auto& t = *tp;
  must(t.ensure_stream(work_queue("WAIT", "wait.>")));
  must(t.ensure_consumer(durable("WAIT", "waiter", 30s)));
  constexpr auto max_wait = 5s;

  auto async_probe = std::make_shared<completion_probe>();
  std::optional<amp::result<std::vector<amp::message>>> blocking;
  auto started = steady::now();
  t.async_fetch("WAIT", "waiter", {.batch = 1, .max_wait = max_wait},
                completion_probe::handler<std::vector<amp::message>>(async_probe));
  std::thread waiter(
      [&] { blocking = t.fetch("WAIT", "waiter", {.batch = 1, .max_wait = max_wait}); });
  // Let both pulls reach the server before it goes (not a timing assertion).
  std::this_thread::sleep_for(300ms);
  take_away(server, how);

  bool completed = async_probe->wait_until(started + max_wait + bound);
  waiter.join();
  auto took = steady::now() - started;
  INFO(
      "both completed after " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                              << " ms");
  REQUIRE(completed);
  CHECK(took < max_wait + bound);
  // Empty (max_wait passed) or unavailable: never a message, never a hang.
  auto code = async_probe->first_code();
  CHECK((code == errc{} || code == errc::unavailable));
  REQUIRE(blocking.has_value());
  INFO("blocking fetch: " << text_of(*blocking));
  CHECK(
      (code_of(*blocking) == errc::unavailable || (blocking->has_value() && (*blocking)->empty())));

  // The abandoned pulls do not swallow what comes after the restart.
  server.restart();
  REQUIRE(reconnected(t));
  must(t.publish({.subject = "wait.job", .data = "after", .msg_id = "after"}));
  auto got = must(t.fetch("WAIT", "waiter", {.batch = 1, .max_wait = 5s}));
  REQUIRE(got.size() == 1);
  CHECK(got[0].data == "after");
  must(t.ack(got[0]));
  CHECK(async_probe->calls() == 1);
}

/// A KV watch and an ordered replay set up before the server goes away deliver what is
/// written after it is back, in order, without gaps or repeats. `down` is how long it stays
/// away (longer than cnats's missed-heartbeat detection of ordered consumers, or not).
void watch_and_replay_resume(away how, std::chrono::milliseconds down) {
  auto server = nats_server::start();
  auto tp = connect(server);
  auto& t = *tp;
  amp::stream_config events;
  events.name = "EV";
  events.subjects = {"ev.>"};
  must(t.ensure_stream(events));
  must(t.ensure_bucket({.bucket = "cfg", .history = 8}));

  std::mutex mu;
  std::vector<std::uint64_t> replayed;  // stream sequences
  std::vector<std::string> replayed_data;
  std::vector<std::string> watched;  // values of key k
  must(t.publish({.subject = "ev.x", .data = "e1"}));
  must(t.kv_put("cfg", "k", "v1"));
  auto replay = must(t.subscribe_ordered({.stream = "EV", .start = amp::deliver_policy::all},
                                         [&](const amp::message& m) {
                                           std::lock_guard lock(mu);
                                           replayed.push_back(m.seq);
                                           replayed_data.push_back(m.data);
                                         }));
  auto watch = must(t.kv_watch("cfg", {}, {.on_entry = [&](const amp::kv_entry& e) {
                                 std::lock_guard lock(mu);
                                 watched.push_back(e.value);
                               }}));
  auto seen = [&](std::size_t events_n, std::size_t values_n) {
    return eventually(30s, [&] {
      std::lock_guard lock(mu);
      return replayed.size() >= events_n && watched.size() >= values_n;
    });
  };
  REQUIRE(seen(1, 1));

  take_away(server, how);
  std::this_thread::sleep_for(down);  // the outage itself, not a timing assertion
  server.restart();
  REQUIRE(reconnected(t));
  auto back = steady::now();

  must(t.publish({.subject = "ev.x", .data = "e2"}));
  must(t.kv_put("cfg", "k", "v2"));
  must(t.publish({.subject = "ev.x", .data = "e3"}));
  must(t.kv_put("cfg", "k", "v3"));
  bool delivered = seen(3, 3);
  auto took = steady::now() - back;
  replay->stop();
  watch->stop();
  std::lock_guard lock(mu);  // the callbacks have stopped; the lock is for the reader's sake
  INFO("after the restart: replay has "
       << replayed.size() << ", watch has " << watched.size() << " after "
       << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
  CHECK(delivered);
  CHECK(replayed == std::vector<std::uint64_t>{1, 2, 3});
  CHECK(replayed_data == std::vector<std::string>{"e1", "e2", "e3"});
  CHECK(watched == std::vector<std::string>{"v1", "v2", "v3"});
}

}  // namespace

TEST_CASE(
    "outage: a fetch waiting when the server is stopped completes in time, and the next "
    "fetch after the restart gets what is published",
    "[jetstream][outage]") {
  waiting_fetch_completes(away::stopped);
}

TEST_CASE(
    "outage: a fetch waiting when the server is killed completes in time, and the next "
    "fetch after the restart gets what is published",
    "[jetstream][outage]") {
  waiting_fetch_completes(away::killed);
}

TEST_CASE(
    "outage: a KV watch and an ordered replay resume after the server is stopped and "
    "restarted",
    "[jetstream][outage]") {
  watch_and_replay_resume(away::stopped, 0ms);
}

TEST_CASE(
    "outage: a KV watch and an ordered replay resume after the server is killed and "
    "restarted",
    "[jetstream][outage]") {
  watch_and_replay_resume(away::killed, 0ms);
}

TEST_CASE(
    "outage: a KV watch and an ordered replay resume after the server was away longer "
    "than their heartbeats",
    "[jetstream][outage]") {
  watch_and_replay_resume(away::killed, 12s);
}

// The last reference to a transport's connection can be dropped by a reply handler on a
// cnats delivery thread, right after a blocking call returned and its caller dropped the
// transport. The connection must then neither lock the request being answered again nor
// close itself on that thread; if it did, the delivery thread would hang and no transport
// in the process would get an answer again.
TEST_CASE(
    "outage: a transport dropped right after a call leaves the other transports of the "
    "process working",
    "[jetstream][outage]") {
  auto server = nats_server::start();
  {
    auto setup = connect(server);
    must(setup->ensure_stream(work_queue("DROP", "drop.>")));
    must(setup->ensure_consumer(durable("DROP", "dropper", 30s)));
  }
  constexpr int rounds = 100;
  for (int round = 0; round < rounds; ++round) {
    auto t = connect(server);
    must(t->publish({.subject = "drop.job", .data = std::to_string(round)}));
    auto got = must(t->fetch("DROP", "dropper", {.batch = 1, .max_wait = 1s}));
    REQUIRE(got.size() == 1);
    must(t->ack(got[0]));
    t.reset();  // at once, while the ack's reply handler may still be unwinding
  }
  auto survivor =
      amp::jetstream_transport::connect({.url = server.url(), .op_timeout = op_timeout});
  INFO("connect after the drops: " << text_of(survivor));
  REQUIRE(survivor.has_value());
  CHECK(must((*survivor)->stream_info_of("DROP")).state.messages == 0);
}
