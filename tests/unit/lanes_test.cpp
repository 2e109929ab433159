// detail::lanes, the admission of one session's frames: order, lanes, barriers and limits.

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "detail/lanes.hpp"

namespace {

using amp::detail::lane_limits;
using lanes = amp::detail::lanes<int>;
using entry = lanes::entry;

entry in_lane(int id, std::string lane, std::size_t bytes = 0) {
  return entry{.item = id, .barrier = false, .lane = std::move(lane), .bytes = bytes};
}
entry barrier(int id) {
  return entry{.item = id, .barrier = true, .lane = {}, .bytes = 0};
}
entry free_item(int id) {
  return in_lane(id, "");
}

std::vector<int> ids(const std::vector<entry>& es) {
  std::vector<int> out;
  for (const auto& e : es) out.push_back(e.item);
  return out;
}

// Pushes and returns the ids that started.
std::vector<int> push(lanes& l, entry e) {
  auto start = l.push(std::move(e));
  REQUIRE(start);
  return ids(*start);
}

}  // namespace

TEST_CASE("lanes: one lane runs one at a time in order, different lanes run at once", "[lanes]") {
  lanes l(lane_limits{});
  CHECK(push(l, in_lane(1, "task:a")) == std::vector{1});
  CHECK(push(l, in_lane(2, "task:b")) == std::vector{2});
  CHECK(push(l, in_lane(3, "task:a")).empty());  // a is busy
  CHECK(l.left_thread().empty());
  CHECK(l.left_thread().empty());
  CHECK(ids(l.finished(false, "task:b")).empty());  // 3 waits for a, not b
  CHECK(ids(l.finished(false, "task:a")) == std::vector{3});
  CHECK(l.running() == 1);
  CHECK(l.waiting() == 0);
}

TEST_CASE("lanes: an item that releases its lane lets the next of the lane start while it runs",
          "[lanes]") {
  lanes l(lane_limits{
      .max_waiting = 16, .max_waiting_bytes = 1 << 20, .max_running = 2, .max_on_threads = 4});
  CHECK(push(l, in_lane(1, "to:bob")) == std::vector{1});
  CHECK(push(l, in_lane(2, "to:bob")).empty());
  CHECK(push(l, in_lane(3, "to:bob")).empty());
  CHECK(ids(l.release("to:bob")) == std::vector{2});  // 1 still runs
  CHECK(l.running() == 2);
  // max_running holds 3 back although its lane is free once 2 lets it go.
  CHECK(l.release("to:bob").empty());
  CHECK(ids(l.finished(false, "")) == std::vector{3});
  // 3 holds the lane: 4 waits for it, not for 2.
  CHECK(push(l, in_lane(4, "to:bob")).empty());
  CHECK(l.finished(false, "").empty());                       // 2 ends (it had released its lane)
  CHECK(ids(l.finished(false, "to:bob")) == std::vector{4});  // 3 ends, lane and all
  CHECK(l.running() == 1);
  CHECK(l.waiting() == 0);
}

TEST_CASE("lanes: a waiting frame holds back every later one, even of a free lane", "[lanes]") {
  lanes l(lane_limits{});
  CHECK(push(l, in_lane(1, "to:bob")) == std::vector{1});
  CHECK(push(l, in_lane(2, "to:bob")).empty());
  CHECK(push(l, in_lane(3, "to:carol")).empty());
  CHECK(push(l, free_item(4)).empty());
  CHECK(l.waiting() == 3);
  (void)l.left_thread();
  CHECK(ids(l.finished(false, "to:bob")) == std::vector{2, 3, 4});
}

TEST_CASE("lanes: a barrier waits for what started before it and runs alone", "[lanes]") {
  lanes l(lane_limits{});
  CHECK(push(l, in_lane(1, "task:a")) == std::vector{1});
  CHECK(push(l, free_item(2)) == std::vector{2});
  CHECK(push(l, barrier(3)).empty());
  CHECK(push(l, in_lane(4, "task:z")).empty());  // behind the barrier
  (void)l.left_thread();
  (void)l.left_thread();
  CHECK(ids(l.finished(false, "task:a")).empty());
  CHECK(ids(l.finished(false, "")) == std::vector{3});  // the barrier alone
  CHECK(l.left_thread().empty());
  CHECK(ids(l.finished(true, "")) == std::vector{4});

  SECTION("two barriers in a row start one after the other") {
    CHECK(push(l, barrier(5)).empty());
    CHECK(push(l, barrier(6)).empty());
    (void)l.left_thread();
    CHECK(ids(l.finished(false, "task:z")) == std::vector{5});
    (void)l.left_thread();
    CHECK(ids(l.finished(true, "")) == std::vector{6});
  }
}

TEST_CASE("lanes: at most max_running started and max_on_threads on threads", "[lanes]") {
  lanes l(lane_limits{.max_running = 3, .max_on_threads = 2});
  CHECK(push(l, free_item(1)) == std::vector{1});
  CHECK(push(l, free_item(2)) == std::vector{2});
  CHECK(push(l, free_item(3)).empty());           // two on threads
  CHECK(ids(l.left_thread()) == std::vector{3});  // 1 answers later: a thread is free
  CHECK(push(l, free_item(4)).empty());
  CHECK(l.left_thread().empty());  // three running, though only one on a thread
  CHECK(ids(l.finished(false, "")) == std::vector{4});
  CHECK(l.running() == 3);
}

TEST_CASE("lanes: beyond max_waiting frames or bytes a frame is refused, and nothing changes",
          "[lanes]") {
  lanes l(lane_limits{.max_waiting = 2, .max_waiting_bytes = 100});
  CHECK(push(l, in_lane(1, "a", 10)) == std::vector{1});
  CHECK(push(l, in_lane(2, "a", 10)).empty());
  CHECK(push(l, in_lane(3, "a", 10)).empty());
  CHECK_FALSE(l.push(in_lane(4, "b", 1)).has_value());  // two waiting: refused, none starts
  CHECK(l.waiting() == 2);
  (void)l.left_thread();
  CHECK(ids(l.finished(false, "a")) == std::vector{2});
  CHECK_FALSE(l.push(in_lane(5, "a", 91)).has_value());  // 10 + 91 bytes
  CHECK(push(l, in_lane(6, "a", 90)).empty());           // exactly 100
  CHECK(l.waiting() == 2);
}

TEST_CASE("lanes: close drops what waits and refuses more, started frames still end", "[lanes]") {
  lanes l(lane_limits{});
  CHECK(push(l, in_lane(1, "a")) == std::vector{1});
  CHECK(push(l, in_lane(2, "a")).empty());
  l.close();
  CHECK(l.waiting() == 0);
  CHECK_FALSE(l.push(free_item(3)).has_value());
  (void)l.left_thread();
  CHECK(l.finished(false, "a").empty());
  CHECK(l.running() == 0);
}

TEST_CASE("lanes: random interleavings keep order, lanes and barriers", "[lanes]") {
  auto seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int run = 0; run < 200; ++run) {
    lane_limits limits{.max_waiting = 64,
                       .max_waiting_bytes = 1 << 20,
                       .max_running = 1 + static_cast<int>(rng() % 6),
                       .max_on_threads = 1 + static_cast<int>(rng() % 4)};
    lanes l(limits);
    struct started {
      entry e;
      bool on_thread = true;
    };
    std::vector<started> live;
    int next_id = 0;
    int next_start = 0;  // the id the next start must have: no overtaking
    int ended = 0;
    auto accept = [&](std::vector<entry> start) {
      for (auto& e : start) {
        REQUIRE(e.item == next_start);
        ++next_start;
        for (const auto& s : live) {
          REQUIRE_FALSE(s.e.barrier);  // nothing starts while a barrier runs
          if (!e.lane.empty()) REQUIRE(s.e.lane != e.lane);
        }
        if (e.barrier) REQUIRE(live.empty());
        live.push_back(started{std::move(e)});
      }
      REQUIRE(static_cast<int>(live.size()) <= limits.max_running);
      auto on_threads =
          std::count_if(live.begin(), live.end(), [](auto& s) { return s.on_thread; });
      REQUIRE(on_threads <= limits.max_on_threads);
    };
    const int total = 60;
    while (ended < total) {
      auto roll = rng() % 3;
      if (roll == 0 && next_id < total) {
        entry e;
        switch (rng() % 4) {
          case 0: e = barrier(next_id); break;
          case 1: e = free_item(next_id); break;
          default: e = in_lane(next_id, "l" + std::to_string(rng() % 3)); break;
        }
        ++next_id;
        auto start = l.push(std::move(e));
        REQUIRE(start);
        accept(std::move(*start));
      } else if (roll == 1) {
        std::vector<std::size_t> on;
        for (std::size_t i = 0; i < live.size(); ++i)
          if (live[i].on_thread) on.push_back(i);
        if (on.empty()) continue;
        live[on[rng() % on.size()]].on_thread = false;
        accept(l.left_thread());
      } else {
        std::vector<std::size_t> off;
        for (std::size_t i = 0; i < live.size(); ++i)
          if (!live[i].on_thread) off.push_back(i);
        if (off.empty()) {
          if (next_id == total && live.empty()) FAIL("frames wait with nothing running");
          continue;
        }
        auto i = off[rng() % off.size()];
        auto e = std::move(live[i].e);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        ++ended;
        accept(l.finished(e.barrier, e.lane));
      }
    }
    REQUIRE(next_start == total);
    REQUIRE(l.running() == 0);
    REQUIRE(l.waiting() == 0);
  }
}
