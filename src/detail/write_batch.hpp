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
// row), so that a queue of answers handled one after another makes one write.
//
// Rules: no thread may block waiting for an answer while its writes are held, so every
// blocking wait calls `flush()` first (`wait_for`, the transport's blocking API); writes held
// when a thread ends are flushed then. Thread-local: no locks; a sink is flushed on the
// thread that deferred to it.

#include <cstddef>
#include <memory>
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
    for (const auto& d : s.deferred) {
      if (!d.owner_before(sink) && !sink.owner_before(d)) return true;
    }
    s.deferred.emplace_back(sink);
    return true;
  }

  // Flushes every sink deferred on this thread.
  static void flush() noexcept {
    auto& s = state();
    s.hold = false;
    s.held = 0;
    s.flush_deferred();
  }

 private:
  struct thread_state {
    int depth = 0;
    bool hold = false;
    int held = 0;
    std::vector<std::weak_ptr<write_sink>> deferred;
    void flush_deferred() noexcept {
      if (deferred.empty()) return;
      auto sinks = std::move(deferred);
      deferred.clear();
      for (auto& d : sinks) {
        if (auto live = d.lock()) live->flush_writes();
      }
    }
    ~thread_state() { flush_deferred(); }
  };
  static thread_state& state() noexcept {
    thread_local thread_state s;
    return s;
  }
};

}  // namespace amp::detail
