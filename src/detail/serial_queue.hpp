#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "detail/guarded.hpp"

namespace amp::detail {

// Runs callbacks one at a time in the order they were pushed, on whichever thread drains
// it, never under the pusher's locks. Pushing happens under the owner's lock (which fixes
// the order); draining happens after the owner has unlocked.
//
// A callback that throws is reported to the queue's sink and counts as run: the next one
// runs, and stop() never waits for a drain that an exception abandoned.
class serial_queue {
 public:
  serial_queue() = default;
  explicit serial_queue(handler_error_sink sink) : sink_(std::move(sink)) {}

  void push(std::function<void()> fn) {
    std::lock_guard lock(mu_);
    if (!stopped_) q_.push_back(std::move(fn));
  }

  // Runs what is queued unless another thread is already doing so.
  void drain() {
    std::unique_lock lock(mu_);
    if (draining_) return;
    draining_ = true;
    drainer_ = std::this_thread::get_id();
    while (!q_.empty() && !stopped_) {
      auto fn = std::move(q_.front());
      q_.pop_front();
      lock.unlock();
      call_guarded(sink_, "a subscription or watch", fn);
      lock.lock();
    }
    draining_ = false;
    drainer_ = {};
    idle_.notify_all();
  }

  // After stop() returns no callback runs, unless stop() was called from a callback,
  // in which case none runs after that callback returns.
  void stop() noexcept {
    std::unique_lock lock(mu_);
    stopped_ = true;
    q_.clear();
    if (draining_ && drainer_ != std::this_thread::get_id()) {
      idle_.wait(lock, [this] { return !draining_; });
    }
  }

  bool stopped() const {
    std::lock_guard lock(mu_);
    return stopped_;
  }

 private:
  handler_error_sink sink_;
  mutable std::mutex mu_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> q_;
  bool draining_ = false;
  bool stopped_ = false;
  std::thread::id drainer_;
};

}  // namespace amp::detail
