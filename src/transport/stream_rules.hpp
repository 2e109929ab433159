#pragma once

// Configuration rules that every transport enforces alike, before anything reaches a
// backend: names, impossible settings, and what JetStream itself refuses.

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "amp/subjects.hpp"
#include "amp/transport/transport.hpp"

namespace amp::detail {

// The filter a consumer without one has.
inline std::string filter_or_all(const std::string& f) {
  return f.empty() ? ">" : f;
}

// JetStream refuses a stream whose own subjects overlap (one message, two filters).
inline result<void> check_own_overlap(const stream_config& c) {
  for (std::size_t i = 0; i < c.subjects.size(); ++i) {
    for (std::size_t j = i + 1; j < c.subjects.size(); ++j) {
      if (subjects::filters_overlap(c.subjects[i], c.subjects[j])) {
        return unexpected(errc::bad_request,
                          fmt::format("stream \"{}\": subjects \"{}\" and \"{}\" overlap", c.name,
                                      c.subjects[i], c.subjects[j]));
      }
    }
  }
  return {};
}

inline result<void> validate(const stream_config& c) {
  if (auto r = subjects::check_stream_name(c.name); !r) return r;
  if (c.subjects.empty()) {
    return unexpected(errc::bad_request, fmt::format("stream \"{}\" needs subjects", c.name));
  }
  for (const auto& s : c.subjects) {
    if (auto r = subjects::check_filter(s); !r) return r;
  }
  if (auto r = check_own_overlap(c); !r) return r;
  if (c.replicas < 1 || c.replicas > 5) {
    return unexpected(errc::bad_request, fmt::format("stream \"{}\": replicas must be 1..5, not {}",
                                                     c.name, c.replicas));
  }
  if (c.max_age < duration::zero() || c.duplicate_window < duration::zero()) {
    return unexpected(errc::bad_request,
                      fmt::format("stream \"{}\": durations must not be negative", c.name));
  }
  return {};
}

inline result<void> validate(const consumer_config& c) {
  if (auto r = subjects::check_stream_name(c.stream); !r) return r;
  if (auto r = subjects::check_consumer_name(c.durable); !r) return r;
  if (!c.filter_subject.empty()) {
    if (auto r = subjects::check_filter(c.filter_subject); !r) return r;
  }
  if (c.ack_wait <= duration::zero()) {
    return unexpected(errc::bad_request,
                      fmt::format("consumer \"{}\": ack_wait must be positive", c.durable));
  }
  if (c.max_ack_pending == 0 || c.max_deliver == 0) {
    return unexpected(errc::bad_request,
                      fmt::format("consumer \"{}\": max_ack_pending and max_deliver must be "
                                  "positive or -1",
                                  c.durable));
  }
  return {};
}

inline result<void> validate(const kv_config& c) {
  if (auto r = subjects::check_bucket_name(c.bucket); !r) return r;
  if (c.history < 1 || c.history > 64) {
    return unexpected(errc::bad_request, fmt::format("bucket \"{}\": history must be 1..64, not {}",
                                                     c.bucket, c.history));
  }
  if (c.replicas < 1 || c.replicas > 5) {
    return unexpected(errc::bad_request,
                      fmt::format("bucket \"{}\": replicas must be 1..5", c.bucket));
  }
  if (c.ttl < duration::zero()) {
    return unexpected(errc::bad_request,
                      fmt::format("bucket \"{}\": ttl must not be negative", c.bucket));
  }
  return {};
}

// A consumer's filter must lie in its stream, and a work-queue consumer delivers all.
inline result<void> check_consumer_fits(const stream_config& s, const consumer_config& c) {
  auto filter = filter_or_all(c.filter_subject);
  bool inside = std::any_of(s.subjects.begin(), s.subjects.end(), [&](const auto& sub) {
    return subjects::filters_overlap(sub, filter);
  });
  if (!inside) {
    return unexpected(errc::bad_request,
                      fmt::format("consumer \"{}\": filter \"{}\" matches no subject of stream "
                                  "\"{}\"",
                                  c.durable, filter, c.stream));
  }
  if (s.retention == retention_policy::work_queue && c.deliver != deliver_policy::all) {
    return unexpected(
        errc::bad_request,
        fmt::format("consumer \"{}\": a work-queue stream needs deliver policy all", c.durable));
  }
  return {};
}

}  // namespace amp::detail
