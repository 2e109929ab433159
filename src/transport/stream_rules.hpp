#pragma once

// Configuration rules that every transport enforces alike, before anything reaches a
// backend: names, impossible settings, and what JetStream itself refuses.

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>

#include "amp/subjects.hpp"
#include "amp/transport/transport.hpp"

namespace amp::detail {

// The header that carries a message's `msg_id` (JetStream's deduplication id).
inline constexpr std::string_view k_msg_id_header = "Nats-Msg-Id";

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
  if (c.inactive_threshold < duration::zero()) {
    return unexpected(
        errc::bad_request,
        fmt::format("consumer \"{}\": inactive_threshold must not be negative", c.durable));
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

// The first setting in which two configurations differ, for a `conflict` message; empty
// when they are equal.
inline std::string_view retention_name(retention_policy r) {
  switch (r) {
    case retention_policy::limits: return "limits";
    case retention_policy::work_queue: return "work_queue";
    case retention_policy::interest: return "interest";
  }
  return "?";
}

inline std::string differing_setting(const stream_config& a, const stream_config& b) {
  if (a.subjects != b.subjects) return "subjects";
  if (a.retention != b.retention) {
    return fmt::format("retention ({} vs {})", retention_name(a.retention),
                       retention_name(b.retention));
  }
  if (a.storage != b.storage) return "storage";
  if (a.max_msgs != b.max_msgs) return fmt::format("max_msgs ({} vs {})", a.max_msgs, b.max_msgs);
  if (a.max_bytes != b.max_bytes) return "max_bytes";
  if (a.max_msgs_per_subject != b.max_msgs_per_subject) return "max_msgs_per_subject";
  if (a.max_msg_size != b.max_msg_size) return "max_msg_size";
  if (a.max_age != b.max_age) return "max_age";
  if (a.discard != b.discard) return "discard";
  if (a.duplicate_window != b.duplicate_window) return "duplicate_window";
  if (a.replicas != b.replicas) return "replicas";
  return {};
}

// The first setting that `update_stream` cannot change and that differs; empty when none.
inline std::string fixed_setting_change(const stream_config& a, const stream_config& b) {
  if (a.subjects != b.subjects) return "subjects";
  if (a.retention != b.retention) return "retention";
  if (a.storage != b.storage) return "storage";
  if (a.replicas != b.replicas) return "replicas";
  return {};
}

inline std::string differing_setting(const consumer_config& a, const consumer_config& b) {
  if (a.filter_subject != b.filter_subject) {
    return fmt::format("filter_subject (\"{}\" vs \"{}\")", a.filter_subject, b.filter_subject);
  }
  if (a.ack_wait != b.ack_wait) return "ack_wait";
  if (a.max_ack_pending != b.max_ack_pending) return "max_ack_pending";
  if (a.max_deliver != b.max_deliver) return "max_deliver";
  if (a.inactive_threshold != b.inactive_threshold) return "inactive_threshold";
  if (a.deliver != b.deliver || a.start_seq != b.start_seq || a.start_time != b.start_time) {
    return "deliver policy";
  }
  return {};
}

}  // namespace amp::detail
