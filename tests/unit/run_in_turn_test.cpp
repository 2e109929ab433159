// detail::run_in_turn: work given while the thread runs work given there waits its turn
// instead of nesting; each thread has its own turns.

#include <catch2/catch.hpp>

#include <string>
#include <thread>
#include <vector>

#include "detail/run_in_turn.hpp"

namespace {

using amp::detail::run_in_turn;

TEST_CASE("run_in_turn runs work at once on an idle thread", "[run_in_turn]") {
  int ran = 0;
  run_in_turn([&] { ++ran; });
  CHECK(ran == 1);
  run_in_turn([&] { ++ran; });
  CHECK(ran == 2);
}

TEST_CASE("run_in_turn runs work given from inside work after it, in order", "[run_in_turn]") {
  std::vector<std::string> log;
  run_in_turn([&] {
    log.push_back("a begins");
    run_in_turn([&] {
      log.push_back("b");
      run_in_turn([&] { log.push_back("d"); });
    });
    run_in_turn([&] { log.push_back("c"); });
    log.push_back("a ends");
  });
  CHECK(log == std::vector<std::string>{"a begins", "a ends", "b", "c", "d"});
}

TEST_CASE("run_in_turn keeps a long chain of work flat", "[run_in_turn]") {
  // Each piece gives the next: nested calls would go 100,000 frames deep.
  constexpr int k_chain = 100000;
  int done = 0;
  int deepest = 0;
  int depth = 0;
  std::function<void()> step = [&] {
    ++depth;
    deepest = std::max(deepest, depth);
    if (++done < k_chain) run_in_turn(step);
    --depth;
  };
  run_in_turn(step);
  CHECK(done == k_chain);
  CHECK(deepest == 1);
}

TEST_CASE("run_in_turn keeps each thread's turns apart", "[run_in_turn]") {
  std::vector<std::string> log;
  run_in_turn([&] {
    // Another thread is idle: its work runs at once there, not after this one.
    bool ran_there = false;
    std::thread([&] { run_in_turn([&] { ran_there = true; }); }).join();
    CHECK(ran_there);
    log.push_back("here");
  });
  CHECK(log == std::vector<std::string>{"here"});
}

}  // namespace
