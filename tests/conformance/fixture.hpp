#pragma once

// The conformance suite's view of a backend: the cases in cases/ are written against
// amp::transport and this fixture only, so the very same cases run on every transport.

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "amp/transport/transport.hpp"

namespace amp::conformance {

class fixture {
 public:
  virtual ~fixture() = default;

  virtual amp::transport& transport() = 0;
  /// The same transport, shared (what the broker primitives take).
  virtual std::shared_ptr<amp::transport> shared_transport() = 0;

  /// Lets at least `d` pass on the transport's clock: a manual clock is advanced at once;
  /// a real backend sleeps `d` plus a little slack for its timers.
  virtual void advance(amp::duration d) = 0;

  /// A stream/consumer/bucket name unique to this test run, from `base` (letters, digits,
  /// `_`); names never collide between cases that share a server.
  virtual std::string unique(std::string_view base) = 0;

  /// Whether `advance` takes real time (then cases keep durations short).
  virtual bool real_time() const = 0;

  /// The lines the transport gave its `on_handler_error` so far, in order.
  std::vector<std::string> handler_errors() const {
    std::lock_guard lock(errors_mutex_);
    return handler_errors_;
  }

 protected:
  /// What the fixture passes as the transport's `on_handler_error`.
  std::function<void(std::string_view)> error_sink() {
    return [this](std::string_view line) {
      std::lock_guard lock(errors_mutex_);
      handler_errors_.emplace_back(line);
    };
  }

 private:
  mutable std::mutex errors_mutex_;
  std::vector<std::string> handler_errors_;
};

/// Defined once per backend (memory_fixture.cpp, jetstream_fixture.cpp).
std::unique_ptr<fixture> make_fixture();

}  // namespace amp::conformance
