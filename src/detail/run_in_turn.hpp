#pragma once

// Work run on the calling thread in turn: at once when the thread is not already running work
// given here, else right after that work returns, in the order given. Work that gives more
// work (a frame whose end lets the next frame start, which ends at once, and so on) then runs
// it one after another instead of ever deeper in the same stack. Thread-local: no locks.

#include <deque>
#include <functional>
#include <utility>

namespace amp::detail {

// Runs `work` (not empty) on this thread in turn (see above). `work` must not throw: what it
// throws leaves the work queued behind it to the next call on this thread.
inline void run_in_turn(std::function<void()> work) {
  struct turns {
    bool running = false;
    std::deque<std::function<void()>> queued;
  };
  thread_local turns t;
  t.queued.push_back(std::move(work));
  if (t.running) return;
  t.running = true;
  while (!t.queued.empty()) {
    auto next = std::move(t.queued.front());
    t.queued.pop_front();
    next();
  }
  t.running = false;
}

}  // namespace amp::detail
