#pragma once

/// \file
/// Time as amp sees it: a clock that reads the time and runs callbacks at a time point.
/// Production code uses `system_clock_source`; tests use `manual_clock` and move time
/// forward by hand, so that lease expiry or a TTL takes no real time.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

namespace amp {

/// Wall-clock time points with millisecond-or-better resolution.
using time_point = std::chrono::system_clock::time_point;
using duration = std::chrono::system_clock::duration;

/// Identifies a timer set with `clock::call_at`; 0 is never a valid id.
using timer_id = std::uint64_t;

/// A source of time and timers. Implementations are thread-safe.
class clock {
 public:
  virtual ~clock() = default;
  clock(const clock&) = delete;
  clock& operator=(const clock&) = delete;

  /// The current time.
  virtual time_point now() const noexcept = 0;

  /// Runs `fn` once, no earlier than `at` by this clock. Callbacks never run while the
  /// clock holds a lock of its own, so they may call back into the clock.
  /// Thread: `system_clock_source` runs them on its single timer thread, in deadline
  /// order; `manual_clock` runs them on the thread that calls `advance`/`set`.
  virtual timer_id call_at(time_point at, std::function<void()> fn) = 0;

  /// Cancels a timer. Returns true if it had not started; a callback already running
  /// on another thread is not waited for.
  virtual bool cancel(timer_id id) noexcept = 0;

 protected:
  clock() = default;
};

/// The real time (`std::chrono::system_clock`), with a timer thread started on first use.
class system_clock_source final : public clock {
 public:
  system_clock_source();
  ~system_clock_source() override;  ///< Stops the timer thread; pending timers never run.

  time_point now() const noexcept override;
  timer_id call_at(time_point at, std::function<void()> fn) override;
  bool cancel(timer_id id) noexcept override;

  /// A process-wide instance, for components given no clock.
  static std::shared_ptr<clock> shared();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// A clock that only moves when told to. Starts at `start` (default 2026-01-01T00:00:00Z).
class manual_clock final : public clock {
 public:
  explicit manual_clock(time_point start = default_start());
  ~manual_clock() override;

  time_point now() const noexcept override;
  timer_id call_at(time_point at, std::function<void()> fn) override;
  bool cancel(timer_id id) noexcept override;

  /// Moves time forward by `d` (negative values are ignored), running every timer that
  /// falls due, in deadline order, each with `now()` equal to its deadline; timers that
  /// those callbacks set within the interval run too. Runs on the calling thread.
  void advance(duration d);

  /// Moves time to `t` if it is later than now, as `advance` does.
  void set(time_point t);

  /// Number of timers that have not run or been cancelled.
  std::size_t pending_timers() const;

  static time_point default_start();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace amp
