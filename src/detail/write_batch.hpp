#pragma once

// Writes to a backend held back while a thread handles one piece of input, and sent together
// when it is done: what the handling of a frame or of a backend answer publishes goes out in
// one write instead of one write per message.
//
// A thread opens a batch (`write_batch`) around the handling of its input. A backend
// connection that has buffered a write asks `defer`: true when a batch is open on this
// thread, which then flushes the connection once when its outermost batch closes; false
// when the connection must write now. A batch around input of which more is already queued
// may `hold` its writes for the next batch on this thread (at most k_max_held batches in a
// row), so that a queue of answers handled one after another makes one write. A thread that
// handles input in turns and can run something after a turn (an event loop: frames read
// together, then a posted handler) may `keep_until_later`: the writes of its batches wait
// for the function that returns, which may run on any thread.
//
// Rules: no thread may block waiting for an answer while its writes are held, so every
// blocking wait calls `flush()` first (`wait_for`, the transport's blocking API); writes held
// when a thread ends are flushed then. Thread-local: no locks; a sink is flushed on the
// thread that deferred to it.

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace amp::detail {

class write_sink {
 public:
  virtual ~write_sink() = default;
  // Sends what the sink has buffered. Any thread; must not throw.
  virtual void flush_writes() noexcept = 0;
};

class write_batch {
 public:
  static constexpr int k_max_held = 32;

  write_batch() noexcept { ++state().depth; }
  ~write_batch() {
    auto& s = state();
    if (--s.depth > 0) return;
    if (s.hold && s.held < k_max_held) {
      s.hold = false;
      ++s.held;
      return;
    }
    if (s.hand_to_later()) {
      s.held = 0;
      return;
    }
    flush();
  }
  write_batch(const write_batch&) = delete;
  write_batch& operator=(const write_batch&) = delete;

  // Keeps the writes of this thread's batch for its next batch instead of flushing them at
  // the end of the outermost one (more input is queued for this thread).
  void hold() noexcept { state().hold = true; }

  static bool open() noexcept { return state().depth > 0; }

  // `sink` has buffered a write: true when this thread's batch will flush it; false (no
  // batch open) when the caller must flush it itself.
  static bool defer(const std::shared_ptr<write_sink>& sink) {
    auto& s = state();
    if (s.depth == 0) return false;
    add_once(s.deferred, sink);
    return true;
  }

  // From now on, the writes of this thread's batches are kept past their end until the
  // returned function runs (once, on any thread), which flushes them all. Empty when this
  // thread already keeps its writes for a function that has not run. A blocking wait on this
  // thread (`flush`) flushes what is kept at once, and the batches after it flush as usual.
  // The caller must run the function: until it does, kept writes wait for this thread's next
  // `flush`.
  static std::function<void()> keep_until_later() {
    auto& s = state();
    if (s.later && !s.later->finished()) return {};
    s.later = std::make_shared<kept>();
    return [k = s.later] { k->flush(); };
  }

  // Flushes every sink deferred on this thread, and what it keeps for later.
  static void flush() noexcept {
    auto& s = state();
    s.hold = false;
    s.held = 0;
    s.flush_deferred();
    if (auto k = std::exchange(s.later, nullptr)) k->flush();
  }

 private:
  using sinks = std::vector<std::weak_ptr<write_sink>>;

  static void add_once(sinks& to, const std::weak_ptr<write_sink>& sink) {
    for (const auto& d : to) {
      if (!d.owner_before(sink) && !sink.owner_before(d)) return;
    }
    to.push_back(sink);
  }

  static void flush_all(const sinks& all) noexcept {
    for (const auto& d : all) {
      if (auto live = d.lock()) live->flush_writes();
    }
  }

  // Writes kept by `keep_until_later`, shared with the function that flushes them.
  class kept {
   public:
    bool finished() {
      std::lock_guard lock(mu_);
      return finished_;
    }
    // False when the function has run already: the caller flushes `more` itself.
    bool take(sinks& more) {
      std::lock_guard lock(mu_);
      if (finished_) return false;
      for (const auto& d : more) add_once(sinks_, d);
      more.clear();
      return true;
    }
    void flush() noexcept {
      sinks all;
      {
        std::lock_guard lock(mu_);
        if (finished_) return;
        finished_ = true;
        all = std::move(sinks_);
      }
      flush_all(all);
    }

   private:
    std::mutex mu_;
    bool finished_ = false;
    sinks sinks_;
  };

  struct thread_state {
    int depth = 0;
    bool hold = false;
    int held = 0;
    sinks deferred;
    std::shared_ptr<kept> later;
    void flush_deferred() noexcept {
      if (deferred.empty()) return;
      auto all = std::move(deferred);
      deferred.clear();
      flush_all(all);
    }
    // True when what this thread deferred now waits for `later`'s function.
    bool hand_to_later() {
      if (!later) return false;
      if (later->take(deferred)) return true;
      later.reset();
      return false;
    }
    ~thread_state() {
      flush_deferred();
      if (later) later->flush();
    }
  };
  static thread_state& state() noexcept {
    thread_local thread_state s;
    return s;
  }
};

}  // namespace amp::detail
