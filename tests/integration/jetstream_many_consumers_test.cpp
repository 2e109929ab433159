// Many consumers on one connection: the broker keeps a waiting fetch open on the inbox consumer
// of every connected participant, thousands at once. The transport must serve them all without a
// thread per consumer, route every pulled message to the fetch of its own consumer, and let
// fetches on one consumer take turns without one waiting longer than its own max_wait.
//
// Time bounds below are sanity bounds against a fetch that waits for the wrong thing (another
// fetch, or for ever), far from what the operations take: not performance claims.

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
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
using amp::testing::nats_server;
using steady = std::chrono::steady_clock;

using amp::testing::must;
using amp::testing::text_of;

/// The transports of the cases with one consumer; they state bounds in terms of it.
constexpr auto op_timeout = 2s;
constexpr const char* stream_name = "INBOX";

std::shared_ptr<amp::transport> connect(const nats_server& server,
                                        amp::duration timeout = op_timeout) {
  return amp::testing::connect_jetstream(
      server, {.name = "amp-many-consumers-test", .op_timeout = timeout});
}

amp::stream_config inbox_stream() {
  amp::stream_config c;
  c.name = stream_name;
  c.subjects = {"inbox.>"};
  c.retention = amp::retention_policy::work_queue;
  c.storage = amp::storage_type::memory;
  return c;
}

std::string participant(int i) {
  return "p" + std::to_string(i);
}
std::string inbox_of(int i) {
  return "inbox." + participant(i);
}

/// Creates `n` durable consumers through the transport, consumer i on subject inbox_of(i):
/// a concrete filter needs no listing of the others, so this stays linear in `n`.
void create_consumers(amp::transport& t, int n) {
  for (int i = 0; i < n; ++i) {
    must(t.ensure_consumer({.stream = stream_name,
                            .durable = participant(i),
                            .filter_subject = inbox_of(i),
                            .ack_wait = 30s}));
  }
}

/// This process's thread count, from /proc/self/status.
int thread_count() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  FAIL("no Threads: line in /proc/self/status");
  return -1;
}

/// The outcomes of `n` asynchronous fetches, each recorded with its completion time.
class fetch_log {
 public:
  using outcome = amp::result<std::vector<amp::message>>;

  explicit fetch_log(std::size_t n) : outcomes_(n), calls_(n, 0), at_(n) {}

  amp::completion<std::vector<amp::message>> handler(std::size_t i) {
    return [this, i](outcome r) {
      std::lock_guard lock(mu_);
      if (calls_[i]++ == 0) {
        outcomes_[i].emplace(std::move(r));
        at_[i] = steady::now();
        ++completed_;
      }
      cv_.notify_all();
    };
  }

  std::size_t completed() const {
    std::lock_guard lock(mu_);
    return completed_;
  }
  bool done(std::size_t i) const {
    std::lock_guard lock(mu_);
    return calls_[i] > 0;
  }
  /// Waits until fetch `i` has completed, at most until `deadline`.
  bool wait(std::size_t i, steady::time_point deadline) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return calls_[i] > 0; });
  }
  /// Waits until every fetch has completed, at most until `deadline`.
  bool wait_all(steady::time_point deadline) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return completed_ == outcomes_.size(); });
  }
  /// Call after the fetch completed.
  const outcome& of(std::size_t i) const {
    std::lock_guard lock(mu_);
    return *outcomes_[i];
  }
  steady::time_point at(std::size_t i) const {
    std::lock_guard lock(mu_);
    return at_[i];
  }
  int calls(std::size_t i) const {
    std::lock_guard lock(mu_);
    return calls_[i];
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<outcome>> outcomes_;
  std::vector<int> calls_;
  std::vector<steady::time_point> at_;
  std::size_t completed_ = 0;
};

std::chrono::milliseconds ms(steady::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d);
}

}  // namespace

TEST_CASE(
    "many consumers: waiting fetches on 2,000 consumers at once add no threads, and each "
    "gets the message of its own consumer only",
    "[jetstream][fetch][many]") {
  constexpr int consumers_n = 2000;
  constexpr int every = 20;  // a message for every 20th consumer: 100 in all
  // Long enough that every fetch still waits when the messages are published, on a busy
  // machine too.
  constexpr auto max_wait = 5s;

  auto server = nats_server::start();
  auto tp = connect(server, 5s);  // 2,000 consumer checks and pulls go out at once
  auto& t = *tp;
  must(t.ensure_stream(inbox_stream()));
  create_consumers(t, consumers_n);

  const int before = thread_count();
  fetch_log log(consumers_n);
  const auto started = steady::now();
  for (int i = 0; i < consumers_n; ++i) {
    // Batch 2: a fetch that also took another consumer's message would show it.
    t.async_fetch(stream_name, participant(i), {.batch = 2, .max_wait = max_wait},
                  log.handler(static_cast<std::size_t>(i)));
  }
  // While they wait (nothing is published yet: none can complete before max_wait).
  int peak = before;
  for (int k = 0; k < 10; ++k) {
    std::this_thread::sleep_for(100ms);
    peak = std::max(peak, thread_count());
  }
  INFO("threads: " << before << " before the fetches, at most " << peak << " while they wait");
  CHECK(log.completed() == 0);
  CHECK(peak < 40);
  CHECK(peak <= before + 4);

  for (int i = 0; i < consumers_n; i += every) {
    must(t.publish({.subject = inbox_of(i), .data = "for " + participant(i)}));
  }
  const bool all = log.wait_all(started + max_wait + 5s + 20s);
  INFO("completed " << log.completed() << " of " << consumers_n << " after "
                    << ms(steady::now() - started).count() << " ms");
  REQUIRE(all);

  std::vector<amp::message> delivered;
  int wrong = 0;
  for (int i = 0; i < consumers_n; ++i) {
    const auto& r = log.of(static_cast<std::size_t>(i));
    if (!r.has_value() || log.calls(static_cast<std::size_t>(i)) != 1) {
      ++wrong;
      UNSCOPED_INFO("fetch on " << participant(i) << ": " << text_of(r) << ", "
                                << log.calls(static_cast<std::size_t>(i)) << " completions");
      continue;
    }
    const bool addressed = i % every == 0;
    const bool right = addressed
                           ? r->size() == 1 && (*r)[0].data == "for " + participant(i) &&
                                 (*r)[0].subject == inbox_of(i) &&
                                 (*r)[0].consumer == participant(i) && (*r)[0].delivery_count == 1
                           : r->empty();
    if (!right) {
      ++wrong;
      std::string got;
      for (const auto& m : *r) got += " [" + m.subject + " \"" + m.data + "\" " + m.consumer + "]";
      UNSCOPED_INFO("fetch on " << participant(i) << " got " << r->size() << ":" << got);
    }
    delivered.insert(delivered.end(), r->begin(), r->end());
  }
  CHECK(wrong == 0);
  CHECK(delivered.size() == static_cast<std::size_t>(consumers_n / every));

  // Nothing was handed back or delivered twice: acking what the fetches got empties the stream.
  for (const auto& m : delivered) must(t.ack(m));
  auto state = must(t.stream_info_of(stream_name)).state;
  CHECK(state.messages == 0);
  CHECK(state.last_seq == static_cast<std::uint64_t>(consumers_n / every));
}

TEST_CASE("many consumers: two fetches waiting on one consumer are both served, first come first",
          "[jetstream][fetch][many]") {
  constexpr auto max_wait = 10s;
  auto server = nats_server::start();
  auto tp = connect(server);
  auto& t = *tp;
  must(t.ensure_stream(inbox_stream()));
  amp::consumer_config c{.stream = stream_name, .durable = "solo", .filter_subject = "inbox.solo"};
  must(t.ensure_consumer(c));

  fetch_log log(2);
  const auto started = steady::now();
  t.async_fetch(stream_name, "solo", {.batch = 1, .max_wait = max_wait}, log.handler(0));
  t.async_fetch(stream_name, "solo", {.batch = 1, .max_wait = max_wait}, log.handler(1));
  std::this_thread::sleep_for(300ms);  // let them start waiting; not a timing assertion
  CHECK(log.completed() == 0);

  must(t.publish({.subject = "inbox.solo", .data = "first"}));
  must(t.publish({.subject = "inbox.solo", .data = "second"}));
  REQUIRE(log.wait_all(started + max_wait + op_timeout + 5s));
  const auto& a = log.of(0);
  const auto& b = log.of(1);
  INFO("first fetch: " << text_of(a) << "; second fetch: " << text_of(b));
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  REQUIRE(a->size() == 1);
  REQUIRE(b->size() == 1);
  CHECK((*a)[0].data == "first");
  CHECK((*b)[0].data == "second");
  // Both were woken by a message, not by max_wait.
  CHECK(log.at(1) - started < max_wait);
  must(t.ack((*a)[0]));
  must(t.ack((*b)[0]));
  CHECK(must(t.stream_info_of(stream_name)).state.messages == 0);
}

TEST_CASE(
    "many consumers: a fetch behind a waiting one on the same consumer still answers within "
    "its own max_wait",
    "[jetstream][fetch][many]") {
  constexpr auto long_wait = 30s;
  constexpr auto short_wait = 1s;
  constexpr auto slack = 3s;
  auto server = nats_server::start();
  auto tp = connect(server);
  auto& t = *tp;
  must(t.ensure_stream(inbox_stream()));
  amp::consumer_config c{.stream = stream_name, .durable = "solo", .filter_subject = "inbox.solo"};
  must(t.ensure_consumer(c));

  fetch_log log(3);
  const auto started = steady::now();
  t.async_fetch(stream_name, "solo", {.batch = 1, .max_wait = long_wait}, log.handler(0));
  std::this_thread::sleep_for(300ms);  // let it start waiting; not a timing assertion

  SECTION("a waiting fetch behind it") {
    const auto queued = steady::now();
    t.async_fetch(stream_name, "solo", {.batch = 1, .max_wait = short_wait}, log.handler(1));
    REQUIRE(log.wait(1, queued + short_wait + op_timeout + slack));
    INFO("answered after " << ms(log.at(1) - queued).count() << " ms");
    CHECK(log.at(1) - queued < short_wait + op_timeout + slack);
    REQUIRE(log.of(1).has_value());
    CHECK(log.of(1)->empty());
  }
  SECTION("a no-wait fetch behind it") {
    const auto queued = steady::now();
    t.async_fetch(stream_name, "solo", {.batch = 1, .max_wait = 0s}, log.handler(1));
    REQUIRE(log.wait(1, queued + op_timeout + slack));
    INFO("answered after " << ms(log.at(1) - queued).count() << " ms");
    CHECK(log.at(1) - queued < op_timeout + slack);
    REQUIRE(log.of(1).has_value());
    CHECK(log.of(1)->empty());
  }
  // The fetch ahead is still waiting, and gets what comes now.
  CHECK_FALSE(log.done(0));
  must(t.publish({.subject = "inbox.solo", .data = "late"}));
  REQUIRE(log.wait(0, started + long_wait + op_timeout + slack));
  const auto& a = log.of(0);
  INFO("first fetch: " << text_of(a));
  REQUIRE(a.has_value());
  REQUIRE(a->size() == 1);
  CHECK((*a)[0].data == "late");
  CHECK(log.at(0) - started < long_wait);
  // And a fetch after them finds nothing left behind.
  t.async_fetch(stream_name, "solo", {.batch = 5, .max_wait = 0s}, log.handler(2));
  REQUIRE(log.wait(2, steady::now() + op_timeout + slack));
  REQUIRE(log.of(2).has_value());
  CHECK(log.of(2)->empty());
  must(t.ack((*a)[0]));
  CHECK(must(t.stream_info_of(stream_name)).state.messages == 0);
}
