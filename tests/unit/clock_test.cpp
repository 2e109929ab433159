#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include "amp/clock.hpp"

using namespace std::chrono_literals;

TEST_CASE("manual clock runs due timers in deadline order at their deadlines", "[clock]") {
  amp::manual_clock clock;
  auto t0 = clock.now();
  std::vector<std::pair<int, amp::time_point>> ran;
  clock.call_at(t0 + 3s, [&] { ran.emplace_back(3, clock.now()); });
  clock.call_at(t0 + 1s, [&] { ran.emplace_back(1, clock.now()); });
  auto cancelled = clock.call_at(t0 + 2s, [&] { ran.emplace_back(2, clock.now()); });
  REQUIRE(clock.cancel(cancelled));
  REQUIRE_FALSE(clock.cancel(cancelled));

  clock.advance(500ms);
  REQUIRE(ran.empty());
  clock.advance(3s);
  REQUIRE(ran.size() == 2);
  REQUIRE(ran[0] == std::make_pair(1, t0 + 1s));
  REQUIRE(ran[1] == std::make_pair(3, t0 + 3s));
  REQUIRE(clock.now() == t0 + 3500ms);
  REQUIRE(clock.pending_timers() == 0);
}

TEST_CASE("manual clock runs timers that callbacks set inside the advanced interval", "[clock]") {
  amp::manual_clock clock;
  auto t0 = clock.now();
  int chain = 0;
  std::function<void()> step = [&] {
    if (++chain < 5) clock.call_at(clock.now() + 1s, step);
  };
  clock.call_at(t0 + 1s, step);
  clock.advance(10s);
  REQUIRE(chain == 5);
  clock.advance(-5s);
  REQUIRE(clock.now() == t0 + 10s);
}

TEST_CASE("system clock runs a timer on its own thread", "[clock]") {
  amp::system_clock_source clock;
  std::promise<std::thread::id> ran;
  clock.call_at(clock.now() + 5ms, [&] { ran.set_value(std::this_thread::get_id()); });
  auto f = ran.get_future();
  REQUIRE(f.wait_for(10s) == std::future_status::ready);
  bool other_thread = f.get() != std::this_thread::get_id();
  REQUIRE(other_thread);
}
