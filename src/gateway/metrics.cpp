#include "gateway/metrics.hpp"

#include <fmt/format.h>

namespace amp::detail {

void gateway_metrics::count(labelled& m, std::string_view label) {
  std::lock_guard lock(mu_);
  auto it = m.find(label);
  if (it == m.end()) it = m.emplace(std::string(label), 0).first;
  ++it->second;
}

void gateway_metrics::backend(double seconds) {
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < k_buckets.size(); ++i) {
    if (seconds <= k_buckets[i]) ++backend_buckets_[i];
  }
  ++backend_count_;
  backend_sum_ += seconds;
}

namespace {

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

std::string gateway_metrics::render(std::int64_t connections) const {
  std::string out;
  std::lock_guard lock(mu_);
  auto labelled_counter = [&](std::string_view name, std::string_view label, const labelled& m,
                              std::string_view help) {
    header(out, name, "counter", help);
    for (const auto& [value, n] : m)
      out += fmt::format("{}{{{}=\"{}\"}} {}\n", name, label, value, n);
  };
  header(out, "amp_sessions", "gauge", "Sessions that completed hello and are open.");
  out += fmt::format("amp_sessions {}\n", sessions_.load());
  header(out, "amp_connections_pending", "gauge", "Connections that have not completed hello.");
  out += fmt::format("amp_connections_pending {}\n", connections);
  labelled_counter("amp_frames_in_total", "op", frames_in_, "Frames received, by op.");
  labelled_counter("amp_frames_out_total", "op", frames_out_, "Frames sent, by op.");
  labelled_counter("amp_errors_total", "code", errors_, "Error frames sent, by code.");
  labelled_counter("amp_task_transitions_total", "to", transitions_,
                   "Task state transitions made through this gateway, by new state.");
  header(out, "amp_offers_total", "counter", "Offers sent to workers.");
  out += fmt::format("amp_offers_total {}\n", offers_.load());
  header(out, "amp_offers_handed_total", "counter",
         "Fetched tasks handed to another gateway for a less loaded worker there.");
  out += fmt::format("amp_offers_handed_total {}\n", offers_handed_.load());
  header(out, "amp_lease_expiries_total", "counter", "Leases that ran out without a heartbeat.");
  out += fmt::format("amp_lease_expiries_total {}\n", lease_expiries_.load());
  header(out, "amp_slow_consumers_total", "counter",
         "Subscriptions dropped or sessions closed because the client did not read.");
  out += fmt::format("amp_slow_consumers_total {}\n", slow_consumers_.load());
  header(out, "amp_backend_seconds", "histogram", "Latency of backend operations.");
  for (std::size_t i = 0; i < k_buckets.size(); ++i) {
    out += fmt::format("amp_backend_seconds_bucket{{le=\"{}\"}} {}\n", k_buckets[i],
                       backend_buckets_[i]);
  }
  out += fmt::format("amp_backend_seconds_bucket{{le=\"+Inf\"}} {}\n", backend_count_);
  out += fmt::format("amp_backend_seconds_sum {}\n", backend_sum_);
  out += fmt::format("amp_backend_seconds_count {}\n", backend_count_);
  return out;
}

}  // namespace amp::detail
