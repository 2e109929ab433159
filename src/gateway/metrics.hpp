#pragma once

// The gateway's counters, gauges and the backend latency histogram (spec §10), rendered in
// the Prometheus text exposition format. Every member is thread-safe.

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "amp/clock.hpp"

namespace amp::detail {

class gateway_metrics {
 public:
  void frame_in(std::string_view op) { count(frames_in_, op); }
  void frame_out(std::string_view op) { count(frames_out_, op); }
  void error(std::string_view code) { count(errors_, code); }
  void transition(std::string_view to) { count(transitions_, to); }
  void offer() { offers_.fetch_add(1, std::memory_order_relaxed); }
  void offer_handed() { offers_handed_.fetch_add(1, std::memory_order_relaxed); }
  void lease_expiry() { lease_expiries_.fetch_add(1, std::memory_order_relaxed); }
  void slow_consumer() { slow_consumers_.fetch_add(1, std::memory_order_relaxed); }
  /// Counts one more session unless `max` are open already; false then.
  bool try_open(std::size_t max) {
    auto n = sessions_.load();
    do {
      if (n >= static_cast<std::int64_t>(max)) return false;
    } while (!sessions_.compare_exchange_weak(n, n + 1));
    return true;
  }
  void session_closed() { sessions_.fetch_sub(1, std::memory_order_relaxed); }
  std::int64_t sessions() const { return sessions_.load(std::memory_order_relaxed); }
  /// One backend call of `seconds`.
  void backend(double seconds);

  /// Everything, in the text format; `connections` is the gauge of connections that have
  /// not (yet) completed `hello`.
  std::string render(std::int64_t connections) const;

 private:
  using labelled = std::map<std::string, std::uint64_t, std::less<>>;
  void count(labelled& m, std::string_view label);

  static constexpr std::array<double, 14> k_buckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  mutable std::mutex mu_;
  labelled frames_in_, frames_out_, errors_, transitions_;
  std::array<std::uint64_t, k_buckets.size()> backend_buckets_{};
  std::uint64_t backend_count_ = 0;
  double backend_sum_ = 0;
  std::atomic<std::uint64_t> offers_{0}, offers_handed_{0}, lease_expiries_{0}, slow_consumers_{0};
  std::atomic<std::int64_t> sessions_{0};
};

}  // namespace amp::detail
