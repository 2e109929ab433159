// Daily budgets (spec §8) on every transport: counting and exhaustion, unlimited
// participants, refunds, the UTC day boundary (manual clock only), several gateways
// sharing one counter exactly, an unreachable backend, and names that never reach a key.

#include "amp/gateway/policy.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "amp/timestamp.hpp"
#include "broker/cases/broker_helpers.hpp"
#include "broker/cases/faulty_transport.hpp"

namespace amp::broker_testing {
namespace {

using namespace std::chrono_literals;

// The bucket and key format documented in amp/gateway/policy.hpp.
constexpr std::string_view k_bucket = "AMP_BUDGETS";

std::string day_name(time_point t) {
  std::chrono::year_month_day ymd{std::chrono::floor<std::chrono::days>(t)};
  return fmt::format("{:04}{:02}{:02}", static_cast<int>(ymd.year()),
                     static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()));
}

std::string today(fixture& fx) {
  return day_name(fx.transport().clock()->now());
}

namespace_name ns_of(fixture& fx) {
  return must(namespace_name::make(fx.unique("ns")));
}

policy_config with_budget(std::optional<std::int64_t> per_day) {
  return {.default_policy = {.budget = {.per_day = per_day}}};
}

std::string stored(fixture& fx, const namespace_name& ns, std::string_view who) {
  auto e = fx.transport().kv_get(k_bucket, fmt::format("{}.{}.{}", ns.view(), who, today(fx)));
  return e ? e->value : "(" + text_of(e) + ")";
}

}  // namespace

TEST_CASE("policy: a budget of N per day grants N requests, then budget_exhausted", "[policy]") {
  auto fx = make_fixture();
  auto ns = ns_of(*fx);
  auto pol = must(policy::open(fx->shared_transport(), with_budget(3)));
  for (std::int64_t left : {2, 1, 0}) {
    auto s = must(pol->spend_budget(ns, pname("alice")));
    CHECK(s.counted());
    CHECK(s.day == today(*fx));
    CHECK(s.remaining == left);
  }
  auto r = pol->spend_budget(ns, pname("alice"));
  REQUIRE(code_of(r) == errc::budget_exhausted);
  CHECK_THAT(r.error().message(), Catch::Contains("\"alice\"") && Catch::Contains("renews at"));
  REQUIRE(code_of(pol->spend_budget(ns, pname("alice"))) == errc::budget_exhausted);
  CHECK(stored(*fx, ns, "alice") == "3");  // refusals count nothing

  // Others, and the same participant in another namespace, have their own counters.
  REQUIRE(pol->spend_budget(ns, pname("bob")).has_value());
  REQUIRE(pol->spend_budget(ns_of(*fx), pname("alice")).has_value());

  // The asynchronous form answers the same.
  std::promise<result<budget_spend>> p;
  pol->async_spend_budget(ns, pname("alice"), [&](result<budget_spend> s) { p.set_value(s); });
  REQUIRE(code_of(p.get_future().get()) == errc::budget_exhausted);
}

TEST_CASE("policy: a null budget is unlimited and not counted, overrides per participant",
          "[policy]") {
  auto fx = make_fixture();
  auto ns = ns_of(*fx);
  auto pol = must(policy::open(fx->shared_transport(),
                               {.default_policy = {.budget = {.per_day = std::nullopt}},
                                .participants = {{"metered", {.budget = {.per_day = 2}}},
                                                 {"blocked", {.budget = {.per_day = 0}}}}}));
  for (int i = 0; i < 200; ++i) {
    auto s = must(pol->spend_budget(ns, pname("free")));
    REQUIRE_FALSE(s.counted());
    REQUIRE_FALSE(s.remaining.has_value());
  }
  REQUIRE(pol->spend_budget(ns, pname("metered")).has_value());
  REQUIRE(pol->spend_budget(ns, pname("metered")).has_value());
  REQUIRE(code_of(pol->spend_budget(ns, pname("metered"))) == errc::budget_exhausted);
  REQUIRE(code_of(pol->spend_budget(ns, pname("blocked"))) == errc::budget_exhausted);

  auto keys = must(fx->transport().kv_keys(k_bucket));
  std::erase_if(keys, [&](const std::string& k) { return !k.starts_with(ns.str() + "."); });
  CHECK(keys == std::vector<std::string>{fmt::format("{}.metered.{}", ns.view(), today(*fx))});
}

TEST_CASE("policy: a refund gives a unit back on the day it was spent, never below zero",
          "[policy]") {
  auto fx = make_fixture();
  auto ns = ns_of(*fx);
  auto pol = must(policy::open(fx->shared_transport(), with_budget(2)));
  auto a = must(pol->spend_budget(ns, pname("alice")));
  auto b = must(pol->spend_budget(ns, pname("alice")));
  REQUIRE(code_of(pol->spend_budget(ns, pname("alice"))) == errc::budget_exhausted);
  must(pol->refund_budget(a));
  CHECK(stored(*fx, ns, "alice") == "1");
  auto c = must(pol->spend_budget(ns, pname("alice")));
  CHECK(c.remaining == 0);
  REQUIRE(code_of(pol->spend_budget(ns, pname("alice"))) == errc::budget_exhausted);

  must(pol->refund_budget(b));
  must(pol->refund_budget(c));
  must(pol->refund_budget(a));  // once too often: stays at zero
  CHECK(stored(*fx, ns, "alice") == "0");
  REQUIRE(pol->spend_budget(ns, pname("alice")).has_value());
  REQUIRE(pol->spend_budget(ns, pname("alice")).has_value());
  REQUIRE(code_of(pol->spend_budget(ns, pname("alice"))) == errc::budget_exhausted);
}

TEST_CASE("policy: budget_exhausted lasts until the UTC day turns", "[policy]") {
  auto fx = make_fixture();
  if (fx->real_time()) {
    SUCCEED("a day cannot pass on a real backend; counting and exhaustion are tested above");
    return;
  }
  auto ns = ns_of(*fx);
  auto pol = must(policy::open(fx->shared_transport(), with_budget(2)));
  auto clock = fx->transport().clock();
  // The manual clock starts at 2026-01-01T00:00:00Z; go to the middle of the day.
  fx->advance(12h);
  auto first = must(pol->spend_budget(ns, pname("alice")));
  CHECK(first.day == "20260101");
  must(pol->spend_budget(ns, pname("alice")));
  auto r = pol->spend_budget(ns, pname("alice"));
  REQUIRE(code_of(r) == errc::budget_exhausted);
  CHECK_THAT(r.error().message(), Catch::Contains("renews at 2026-01-02T00:00:00.000Z"));

  fx->advance(12h - 1ms);  // 23:59:59.999
  REQUIRE(code_of(pol->spend_budget(ns, pname("alice"))) == errc::budget_exhausted);
  fx->advance(1ms);  // midnight UTC
  auto next = must(pol->spend_budget(ns, pname("alice")));
  CHECK(next.day == "20260102");
  CHECK(next.remaining == 1);

  // A refund of yesterday's spend goes to yesterday's counter, not today's.
  must(pol->refund_budget(first));
  CHECK(must(fx->transport().kv_get(k_bucket, ns.str() + ".alice.20260101")).value == "1");
  CHECK(must(fx->transport().kv_get(k_bucket, ns.str() + ".alice.20260102")).value == "1");

  // Past days go with the bucket's age limit.
  fx->advance(48h);
  must(pol->spend_budget(ns, pname("alice")));
  auto keys = must(fx->transport().kv_keys(k_bucket));
  std::erase_if(keys, [&](const std::string& k) { return !k.starts_with(ns.str() + "."); });
  CHECK(keys == std::vector<std::string>{ns.str() + ".alice.20260104"});
}

TEST_CASE("policy: two gateways share one budget exactly under concurrent spending", "[policy]") {
  auto fx = make_fixture();
  auto ns = ns_of(*fx);
  constexpr std::int64_t per_day = 60;
  auto one = must(policy::open(fx->shared_transport(), with_budget(per_day)));
  auto two = must(policy::open(fx->shared_transport(), with_budget(per_day)));

  constexpr int threads_per_gateway = 4;
  constexpr int spends_per_thread = 25;
  std::atomic<int> granted{0}, exhausted{0};
  std::mutex mu;
  std::vector<std::string> other_errors;
  std::set<std::int64_t> remaining_seen;
  std::latch start(2 * threads_per_gateway);
  auto spender = [&](policy& pol) {
    start.arrive_and_wait();
    for (int i = 0; i < spends_per_thread; ++i) {
      auto r = pol.spend_budget(ns, pname("alice"));
      std::lock_guard lock(mu);
      if (r) {
        ++granted;
        remaining_seen.insert(*r->remaining);
      } else if (r.error().code() == errc::budget_exhausted) {
        ++exhausted;
      } else {
        other_errors.push_back(r.error().to_string());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_per_gateway; ++t) {
    threads.emplace_back(spender, std::ref(*one));
    threads.emplace_back(spender, std::ref(*two));
  }
  for (auto& t : threads) t.join();
  CHECK(other_errors.empty());
  CHECK(granted == per_day);
  CHECK(exhausted == 2 * threads_per_gateway * spends_per_thread - per_day);
  CHECK(stored(*fx, ns, "alice") == std::to_string(per_day));
  // Every unit was granted once: the remainders seen are exactly 0..per_day-1.
  CHECK(remaining_seen.size() == static_cast<std::size_t>(per_day));

  SECTION("asynchronous spends fired at once from both gateways") {
    auto bob_ns = ns_of(*fx);
    constexpr int fired = 150;
    std::atomic<int> ok{0}, answered{0};
    std::atomic<int> bad{0};
    for (int i = 0; i < fired; ++i) {
      (i % 2 ? *one : *two).async_spend_budget(bob_ns, pname("bob"), [&](result<budget_spend> r) {
        if (r) {
          ++ok;
        } else if (r.error().code() != errc::budget_exhausted) {
          ++bad;
        }
        ++answered;
      });
    }
    REQUIRE(eventually([&] { return answered == fired; }));
    CHECK(bad == 0);
    CHECK(ok == per_day);
  }
}

TEST_CASE("policy: when the backend is away a spend is unavailable and counts nothing",
          "[policy]") {
  auto fx = make_fixture();
  auto ns = ns_of(*fx);
  auto faulty = std::make_shared<faulty_transport>(fx->shared_transport());
  auto pol = must(policy::open(faulty, with_budget(5)));
  must(pol->spend_budget(ns, pname("alice")));

  // First every read and write fails; then only the writes (a read succeeds).
  for (bool reads_fail : {true, false}) {
    faulty->set_fault([reads_fail](std::string_view op, std::string_view) -> std::optional<error> {
      if (op != "kv_get" || reads_fail) return error(errc::unavailable, "backend away");
      return std::nullopt;
    });
    auto r = pol->spend_budget(ns, pname("alice"));
    REQUIRE(code_of(r) == errc::unavailable);
    faulty->set_fault({});
    CHECK(stored(*fx, ns, "alice") == "1");
  }
  auto s = must(pol->spend_budget(ns, pname("alice")));
  CHECK(s.remaining == 3);

  // A refund that cannot reach the backend fails and the unit stays spent.
  faulty->set_fault([](std::string_view, std::string_view) -> std::optional<error> {
    return error(errc::unavailable, "backend away");
  });
  REQUIRE(code_of(pol->refund_budget(s)) == errc::unavailable);
  faulty->set_fault({});
  CHECK(stored(*fx, ns, "alice") == "2");
}

TEST_CASE("policy: bad names never reach a budget key", "[policy]") {
  auto fx = make_fixture();
  auto ns = ns_of(*fx);
  for (auto bad : {"Bob", "a.b", "a*", ">", "*", "", "$broker", "x y", "b\nc", "bob.>"}) {
    CHECK(code_of(participant_name::make(bad)) == errc::invalid_name);
    CHECK(code_of(namespace_name::make(bad)) == errc::invalid_name);
    CHECK(code_of(policy::open(fx->shared_transport(),
                               {.participants = {{bad, {.budget = {.per_day = 1}}}}})) ==
          errc::invalid_name);
  }
  auto pol = must(policy::open(fx->shared_transport(), with_budget(10)));
  for (auto good : {"a-b", "a_b", "z9"}) must(pol->spend_budget(ns, pname(good)));

  auto keys = must(fx->transport().kv_keys(k_bucket));
  std::erase_if(keys, [&](const std::string& k) { return !k.starts_with(ns.str() + "."); });
  auto day = today(*fx);
  CHECK(keys == std::vector<std::string>{ns.str() + ".a-b." + day, ns.str() + ".a_b." + day,
                                         ns.str() + ".z9." + day});
  std::regex shape(R"(^[a-z][a-z0-9_-]{0,63}\.[a-z][a-z0-9_-]{0,63}\.[0-9]{8}$)");
  for (const auto& k : must(fx->transport().kv_keys(k_bucket))) {
    CHECK(std::regex_match(k, shape));
  }
}

}  // namespace amp::broker_testing
