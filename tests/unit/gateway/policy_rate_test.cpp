#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "amp/clock.hpp"
#include "amp/gateway/policy.hpp"
#include "amp/names.hpp"
#include "amp/transport/memory.hpp"
#include "support/checks.hpp"

namespace {

using namespace std::chrono_literals;
using amp::testing::code_of;
using amp::testing::must;

amp::namespace_name ns(std::string_view s) {
  return must(amp::namespace_name::make(s));
}
amp::participant_name pn(std::string_view s) {
  return must(amp::participant_name::make(s));
}

// A policy on a memory transport driven by a manual clock.
struct rig {
  std::shared_ptr<amp::manual_clock> clock = std::make_shared<amp::manual_clock>();
  std::shared_ptr<amp::transport> transport = amp::memory_transport::create({.clock = clock});
  std::shared_ptr<amp::policy> policy;

  explicit rig(amp::policy_config config) { policy = must(amp::policy::open(transport, config)); }
  explicit rig(amp::rate_policy rate) : rig(amp::policy_config{.default_policy = {.rate = rate}}) {}

  amp::rate_verdict take(std::string_view who, std::size_t bytes = 1, std::string_view n = "app") {
    return policy->take_rate(ns(n), pn(who), bytes);
  }
  // How many requests of `bytes` pass now, one after another (stops at the first refusal).
  int drain(std::string_view who, std::size_t bytes = 1, int at_most = 100000) {
    int n = 0;
    while (n < at_most && take(who, bytes).allowed) ++n;
    return n;
  }
};

}  // namespace

TEST_CASE(
    "a participant's rate bucket starts full: burst requests pass at once, then "
    "rate_limited",
    "[policy]") {
  rig r(amp::rate_policy{.per_s = 10, .burst = 5});
  for (int i = 0; i < 5; ++i) REQUIRE(r.take("alice").allowed);
  auto v = r.take("alice");
  REQUIRE_FALSE(v.allowed);
  CHECK(v.retry_after == 100ms);
  CHECK_THAT(v.message, Catch::Contains("retry after 100 ms") && Catch::Contains("\"alice\""));
  auto as_result = v.as_result();
  REQUIRE(code_of(as_result) == amp::errc::rate_limited);
  CHECK(as_result.error().message() == v.message);
  CHECK(r.take("alice").allowed == false);  // still nothing: a refusal took nothing
  REQUIRE(amp::rate_verdict{}.as_result().has_value());
}

TEST_CASE("the rate bucket refills at per_s, never beyond burst, and retry_after is exact",
          "[policy]") {
  SECTION("a whole number of milliseconds") {
    rig r(amp::rate_policy{.per_s = 10, .burst = 5});
    REQUIRE(r.drain("alice") == 5);
    auto v = r.take("alice");
    REQUIRE(v.retry_after == 100ms);
    r.clock->advance(99ms);
    v = r.take("alice");
    REQUIRE_FALSE(v.allowed);
    CHECK(v.retry_after == 1ms);
    r.clock->advance(1ms);
    REQUIRE(r.take("alice").allowed);
    REQUIRE_FALSE(r.take("alice").allowed);

    // Refills at 10 per second: 250 ms is 2.5 tokens.
    r.clock->advance(250ms);
    REQUIRE(r.drain("alice") == 2);
    CHECK(r.take("alice").retry_after == 50ms);

    // A long pause fills it up to burst and no further.
    r.clock->advance(1h);
    REQUIRE(r.drain("alice") == 5);
  }
  SECTION("rounded up to the next millisecond") {
    rig r(amp::rate_policy{.per_s = 3, .burst = 1});
    REQUIRE(r.take("bob").allowed);
    auto v = r.take("bob");
    REQUIRE_FALSE(v.allowed);
    CHECK(v.retry_after == 334ms);  // 333.33... ms
    r.clock->advance(333ms);
    REQUIRE_FALSE(r.take("bob").allowed);
    CHECK(r.take("bob").retry_after == 1ms);
    r.clock->advance(1ms);
    REQUIRE(r.take("bob").allowed);
  }
  SECTION("waiting exactly retry_after always suffices") {
    rig r(amp::rate_policy{.per_s = 7, .burst = 3, .bytes_per_s = 1300, .bytes_burst = 900});
    std::mt19937 rng(42);
    std::uniform_int_distribution<std::size_t> size(1, 700);
    for (int i = 0; i < 2000; ++i) {
      auto bytes = size(rng);
      auto v = r.take("carol", bytes);
      if (v.allowed) continue;
      REQUIRE(v.retry_after >= 1ms);
      if (v.retry_after > 1ms) {
        r.clock->advance(v.retry_after - 1ms);
        REQUIRE_FALSE(r.take("carol", bytes).allowed);
        r.clock->advance(1ms);
      } else {
        r.clock->advance(1ms);
      }
      REQUIRE(r.take("carol", bytes).allowed);
    }
  }
}

TEST_CASE("the bytes limit is independent of the message limit", "[policy]") {
  // Burst window 1 s: the bytes bucket holds 1000 bytes.
  rig r(amp::rate_policy{.per_s = 1000, .burst = 1000, .bytes_per_s = 1000});
  REQUIRE(r.take("alice", 600).allowed);
  auto v = r.take("alice", 600);
  REQUIRE_FALSE(v.allowed);
  CHECK(v.retry_after == 200ms);
  CHECK_THAT(v.message, Catch::Contains("bytes per second"));
  // The refusal took nothing: 400 bytes are still there, and messages are plentiful.
  REQUIRE(r.take("alice", 400).allowed);
  REQUIRE_FALSE(r.take("alice", 1).allowed);
  // Small bodies are paced by bytes, not by the message rate.
  r.clock->advance(10ms);
  REQUIRE(r.drain("alice", 1) == 10);

  SECTION("a body larger than the whole bytes bucket passes when it is full, then is paid off") {
    r.clock->advance(1h);
    REQUIRE(r.take("alice", 5000).allowed);  // 4000 bytes of debt
    auto w = r.take("alice", 1);
    REQUIRE_FALSE(w.allowed);
    CHECK(w.retry_after == 4001ms);
  }
  SECTION("the message limit holds whatever the bytes allow") {
    rig m(amp::rate_policy{.per_s = 1, .burst = 2, .bytes_per_s = 1e9});
    REQUIRE(m.drain("bob", 1) == 2);
    auto w = m.take("bob", 1);
    CHECK(w.retry_after == 1000ms);
    CHECK_THAT(w.message, Catch::Contains("messages per second"));
  }
  SECTION("by default the bytes bucket holds the bytes of the burst window") {
    CHECK(amp::rate_policy{}.bytes_capacity() == 2.0 * 10485760);
    CHECK(amp::rate_policy{.per_s = 10, .burst = 5, .bytes_per_s = 100}.bytes_capacity() == 50);
    rig d(amp::rate_policy{.per_s = 1000, .burst = 10, .bytes_per_s = 10000});  // 100 bytes
    REQUIRE(d.take("carol", 100).allowed);
    REQUIRE_FALSE(d.take("carol", 1).allowed);
  }
}

TEST_CASE(
    "per-participant policies override the default, buckets are per namespace and "
    "participant",
    "[policy]") {
  rig r(amp::policy_config{
      .default_policy = {.rate = {.per_s = 1, .burst = 2}},
      .participants = {{"vip", {.rate = {.per_s = 100, .burst = 50}}}},
  });
  CHECK(r.policy->policy_of(pn("vip")).rate.burst == 50);
  CHECK(r.policy->policy_of(pn("alice")).rate.burst == 2);
  REQUIRE(r.drain("vip") == 50);
  CHECK(r.take("vip").retry_after == 10ms);
  REQUIRE(r.drain("alice") == 2);
  CHECK(r.take("alice").retry_after == 1000ms);
  // The same participant in another namespace, and another participant, have their own.
  REQUIRE(r.take("alice", 1, "other").allowed);
  REQUIRE(r.take("bob").allowed);
}

TEST_CASE("a bad policy configuration is refused at open", "[policy]") {
  auto t = amp::memory_transport::create({.clock = std::make_shared<amp::manual_clock>()});
  auto open_with = [&](amp::participant_policy p) {
    return amp::policy::open(t, {.participants = {{"bob", p}}});
  };
  auto nan = std::numeric_limits<double>::quiet_NaN();
  auto inf = std::numeric_limits<double>::infinity();
  for (auto [p, field] : std::vector<std::pair<amp::participant_policy, std::string>>{
           {{.rate = {.per_s = 0}}, "rate.per_s"},
           {{.rate = {.per_s = nan}}, "rate.per_s"},
           {{.rate = {.burst = 0.5}}, "rate.burst"},
           {{.rate = {.burst = inf}}, "rate.burst"},
           {{.rate = {.bytes_per_s = -1}}, "rate.bytes_per_s"},
           {{.rate = {.bytes_burst = 0}}, "rate.bytes_burst"},
           {{.budget = {.per_day = -1}}, "budget.per_day"},
           {{.ops = {.per_s = 0}}, "ops.per_s"},
           {{.ops = {.burst = 9}}, "ops.burst"},
       }) {
    auto r = open_with(p);
    REQUIRE(code_of(r) == amp::errc::bad_request);
    CHECK_THAT(r.error().message(), Catch::Contains("policy.participants.bob." + field));
  }
  auto d = amp::policy::open(t, {.default_policy = {.rate = {.per_s = -5}}});
  REQUIRE(code_of(d) == amp::errc::bad_request);
  CHECK_THAT(d.error().message(), Catch::Contains("policy.default.rate.per_s"));

  for (auto name : {"Bob", "a.b", "", "$broker", "x y", ">"}) {
    auto r = amp::policy::open(t, {.participants = {{name, {}}}});
    CHECK(code_of(r) == amp::errc::invalid_name);
  }
  REQUIRE(code_of(amp::policy::open(nullptr, {})) == amp::errc::bad_request);
}

TEST_CASE("without budgets nothing is counted and the backend is not touched", "[policy]") {
  rig r(amp::policy_config{});
  auto s = must(r.policy->spend_budget(ns("app"), pn("alice")));
  CHECK_FALSE(s.counted());
  CHECK_FALSE(s.remaining.has_value());
  REQUIRE(r.policy->refund_budget(s).has_value());
  CHECK(code_of(r.transport->kv_keys("AMP_BUDGETS")) == amp::errc::not_found);
}

TEST_CASE("full rate buckets are forgotten, which changes nothing a participant notices",
          "[policy]") {
  SECTION("10,000 participants: memory goes back down once they are idle") {
    rig r(amp::rate_policy{.per_s = 10, .burst = 5});
    for (int i = 0; i < 10000; ++i) REQUIRE(r.take("p" + std::to_string(i)).allowed);
    CHECK(r.policy->held_rate_buckets() == 10000);
    r.clock->advance(1s);  // 100 ms refills one token; one second lets a sweep run
    REQUIRE(r.take("p0").allowed);
    CHECK(r.policy->held_rate_buckets() == 1);
    // A forgotten participant starts full, as it would have been.
    REQUIRE(r.drain("p1") == 5);
  }
  SECTION("a bucket that is not full is kept through a sweep") {
    rig r(amp::rate_policy{.per_s = 1, .burst = 5});
    REQUIRE(r.drain("slow") == 5);
    r.clock->advance(2s);
    REQUIRE(r.take("other").allowed);  // sweeps
    CHECK(r.policy->held_rate_buckets() == 2);
    REQUIRE(r.drain("slow") == 2);
    CHECK(r.take("slow").retry_after == 1000ms);
  }
  SECTION("against a bucket that is never forgotten, over a random run") {
    // Reference: exact integer token buckets in thousandths of a token or byte, whole ms.
    struct reference {
      std::int64_t per_s, burst, bytes_per_s, bytes_cap;
      std::int64_t msgs, bytes;  // thousandths
      std::int64_t at_ms = 0;
      std::pair<bool, std::int64_t> take(std::int64_t now_ms, std::int64_t body) {
        auto dt = now_ms - at_ms;
        at_ms = now_ms;
        msgs = std::min(burst * 1000, msgs + dt * per_s);
        bytes = std::min(bytes_cap * 1000, bytes + dt * bytes_per_s);
        auto need = std::min(body, bytes_cap) * 1000;
        auto ceil_div = [](std::int64_t a, std::int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; };
        auto wait = std::max(ceil_div(1000 - msgs, per_s), ceil_div(need - bytes, bytes_per_s));
        if (wait == 0) {
          msgs -= 1000;
          bytes -= body * 1000;
          return {true, 0};
        }
        return {false, wait};
      }
    };
    amp::rate_policy rate{.per_s = 20, .burst = 4, .bytes_per_s = 3000, .bytes_burst = 1000};
    rig r(rate);
    std::map<std::string, reference> refs;
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> who(0, 5), step(0, 3), size(1, 1500);
    std::uniform_int_distribution<int> pause_ms(0, 400);
    std::int64_t now_ms = 0;
    std::size_t most_held = 0;
    for (int i = 0; i < 20000; ++i) {
      if (step(rng) == 0) {
        auto d = pause_ms(rng) * (step(rng) == 0 ? 10 : 1);
        r.clock->advance(std::chrono::milliseconds(d));
        now_ms += d;
      }
      auto name = "p" + std::to_string(who(rng));
      auto body = size(rng);
      auto [it, fresh] =
          refs.try_emplace(name, reference{20, 4, 3000, 1000, 4000, 1000000, now_ms});
      auto want = it->second.take(now_ms, body);
      auto got = r.take(name, static_cast<std::size_t>(body));
      REQUIRE(got.allowed == want.first);
      REQUIRE(got.retry_after.count() == want.second);
      most_held = std::max(most_held, r.policy->held_rate_buckets());
    }
    CHECK(most_held <= 6);
    CHECK(most_held >= 1);
  }
}

TEST_CASE("concurrent requests of one participant never get more than the bucket holds",
          "[policy]") {
  rig r(amp::rate_policy{.per_s = 1, .burst = 1000});
  std::atomic<int> allowed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        if (r.take("alice").allowed) ++allowed;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(allowed == 1000);
}

TEST_CASE("every other op has a bucket of its own: registry ops take 100 tokens, others one",
          "[policy]") {
  rig r(amp::policy_config{.default_policy = {.ops = {.per_s = 100, .burst = 30}}});
  auto& p = *r.policy;
  // 30 tokens: two registry ops (10 each) and 10 cheap ones, then nothing.
  REQUIRE(p.take_ops(ns("app"), pn("alice"), amp::registry_op_cost).allowed);
  REQUIRE(p.take_ops(ns("app"), pn("alice"), amp::registry_op_cost).allowed);
  for (int i = 0; i < 10; ++i) REQUIRE(p.take_ops(ns("app"), pn("alice"), 1).allowed);
  auto v = p.take_ops(ns("app"), pn("alice"), 1);
  REQUIRE_FALSE(v.allowed);
  CHECK(v.retry_after == 10ms);
  CHECK_THAT(v.message, Catch::Contains("op tokens per second") && Catch::Contains("\"alice\""));
  // 10 tokens come back in 100 ms at 100 per second.
  CHECK(p.take_ops(ns("app"), pn("alice"), amp::registry_op_cost).retry_after == 100ms);
  r.clock->advance(100ms);
  REQUIRE(p.take_ops(ns("app"), pn("alice"), amp::registry_op_cost).allowed);
  // Buckets are per participant and namespace, and apart from the message bucket.
  REQUIRE(p.take_ops(ns("app"), pn("bob"), amp::registry_op_cost).allowed);
  REQUIRE(p.take_ops(ns("other"), pn("alice"), amp::registry_op_cost).allowed);
  REQUIRE(r.take("alice").allowed);
}
