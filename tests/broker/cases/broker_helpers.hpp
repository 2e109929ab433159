#pragma once

// Helpers shared by the broker cases. The cases run unchanged on every transport through
// the conformance fixture: on memory the clock is manual and broker work runs inline (so
// a lease expires inside `fx.advance`); on JetStream time is real and durations short.

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "amp/broker/config.hpp"
#include "amp/names.hpp"
#include "conformance/fixture.hpp"
#include "support/checks.hpp"

namespace amp::broker_testing {

using amp::conformance::fixture;
using amp::conformance::make_fixture;
using amp::testing::code_of;
using amp::testing::must;
using amp::testing::text_of;

/// A configuration in a namespace of its own, file storage, and on a manual clock work
/// that runs inline.
inline broker_config config_for(fixture& fx) {
  broker_config c{.ns = must(namespace_name::make(fx.unique("ns")))};
  if (!fx.real_time()) c.run = inline_executor();
  return c;
}

inline participant_name pname(std::string_view s) {
  return must(participant_name::make(s));
}
inline job_name jname(std::string_view s) {
  return must(job_name::make(s));
}

/// Waits (real time, up to `timeout`) until `condition` holds; true when it did. For
/// events that a backend delivers on its own threads; never a stand-in for `fx.advance`.
inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  return amp::testing::eventually(timeout, condition, std::chrono::milliseconds(5));
}

/// Collects what a callback receives (events arrive on backend threads), in order.
template <class T>
class callback_log {
 public:
  std::function<void(const T&)> callback() {
    return [this](const T& item) {
      std::lock_guard lock(mu_);
      items_.push_back(item);
    };
  }
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return items_.size();
  }
  T at(std::size_t i) const {
    std::lock_guard lock(mu_);
    return items_.at(i);
  }
  std::vector<T> all() const {
    std::lock_guard lock(mu_);
    return items_;
  }
  /// True once at least `n` arrived (at once on memory, where delivery is synchronous;
  /// within `timeout` on a real backend).
  bool reaches(std::size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    return eventually([&] { return size() >= n; }, timeout);
  }

 protected:
  mutable std::mutex mu_;
  std::vector<T> items_;
};

}  // namespace amp::broker_testing
