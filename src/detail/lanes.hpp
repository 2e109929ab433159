#pragma once

// Admission of one session's requests to an executor, the keyed strand with barriers that
// `docs/protocol.md` describes as the order rules:
// - items start in the order they were pushed, and never overtake one another: the first
//   item that must wait holds back every item behind it;
// - items of one lane (a non-empty key) run one at a time;
// - a barrier runs alone: it waits for everything started before it, and nothing starts
//   while it runs;
// - at most `max_running` items have started and not finished, and at most
//   `max_on_threads` of them hold an executor thread (an item may finish after it has left
//   its thread, when an asynchronous operation answers);
// - at most `max_waiting` items and `max_waiting_bytes` bytes wait; `push` beyond either
//   refuses the item (the caller closes the session).
//
// The queue only decides; the caller runs what it is told to start, then reports each
// started item's return from its thread (`left_thread`) and its end (`finished`), in either
// order. An item of a lane may let its lane go before it ends (`release`): the next item of
// the lane may then start while it still runs (a send that is on its way to the backend,
// whose answer is awaited, is no longer in the way of the next one); such an item reports
// its end with an empty lane. Every call is thread-safe and returns the items that may start
// now, which the caller runs after the call, outside any lock of its own that those items
// take.

#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace amp::detail {

struct lane_limits {
  std::size_t max_waiting = 1024;
  std::size_t max_waiting_bytes = 1 << 20;
  int max_running = 64;
  int max_on_threads = 16;
};

template <class Item>
class lanes {
 public:
  // One item: a barrier, or (barrier false) an item of `lane`, or of no lane (empty: no
  // order to keep beyond never overtaking). `bytes` counts against `max_waiting_bytes`.
  struct entry {
    Item item;
    bool barrier = true;
    std::string lane;
    std::size_t bytes = 0;
  };

  explicit lanes(lane_limits limits) : limits_(limits) {}

  // Queues `e` and returns what may start (`e` perhaps among it); nothing, with `e` not
  // queued, when the queue is full or closed.
  std::optional<std::vector<entry>> push(entry e) {
    std::vector<entry> start;
    std::lock_guard lock(mu_);
    if (closed_ || waiting_.size() >= limits_.max_waiting ||
        waiting_bytes_ + e.bytes > limits_.max_waiting_bytes) {
      return std::nullopt;
    }
    waiting_bytes_ += e.bytes;
    waiting_.push_back(std::move(e));
    startable(start);
    return start;
  }

  // A started item returned from its executor thread.
  std::vector<entry> left_thread() {
    std::vector<entry> start;
    std::lock_guard lock(mu_);
    --on_threads_;
    startable(start);
    return start;
  }

  // A started item (whose barrier flag and lane are given) is over.
  std::vector<entry> finished(bool barrier, std::string_view lane) {
    std::vector<entry> start;
    std::lock_guard lock(mu_);
    --running_;
    if (barrier) barrier_running_ = false;
    if (!lane.empty()) {
      if (auto it = busy_lanes_.find(lane); it != busy_lanes_.end()) busy_lanes_.erase(it);
    }
    startable(start);
    return start;
  }

  // A started item of `lane` lets its lane go before it ends: the lane's next item may start.
  // The item still counts as running until `finished`, which it then reports with an empty
  // lane.
  std::vector<entry> release(std::string_view lane) {
    std::vector<entry> start;
    std::lock_guard lock(mu_);
    if (auto it = busy_lanes_.find(lane); it != busy_lanes_.end()) busy_lanes_.erase(it);
    startable(start);
    return start;
  }

  // Drops what waits and starts nothing more; started items still report their end.
  void close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    waiting_.clear();
    waiting_bytes_ = 0;
  }

  std::size_t waiting() const {
    std::lock_guard lock(mu_);
    return waiting_.size();
  }
  int running() const {
    std::lock_guard lock(mu_);
    return running_;
  }

 private:
  void startable(std::vector<entry>& out) {
    while (!waiting_.empty() && !closed_) {
      auto& e = waiting_.front();
      if (e.barrier) {
        if (running_ > 0) break;
        barrier_running_ = true;
      } else {
        if (barrier_running_ || running_ >= limits_.max_running) break;
        if (on_threads_ >= limits_.max_on_threads) break;
        if (!e.lane.empty() && !busy_lanes_.insert(e.lane).second) break;
      }
      ++running_;
      ++on_threads_;
      waiting_bytes_ -= e.bytes;
      out.push_back(std::move(e));
      waiting_.pop_front();
      if (out.back().barrier) break;
    }
  }

  const lane_limits limits_;
  mutable std::mutex mu_;
  std::deque<entry> waiting_;
  std::size_t waiting_bytes_ = 0;
  int running_ = 0;
  int on_threads_ = 0;
  bool barrier_running_ = false;
  bool closed_ = false;
  std::set<std::string, std::less<>> busy_lanes_;
};

}  // namespace amp::detail
