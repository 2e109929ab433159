#pragma once

// Helpers shared by the conformance cases. Like the cases, they use nothing but
// amp::transport and the conformance fixture, so they hold on every backend.
//
// Time: `fx.advance(d)` is the only way a case lets time pass on the transport's clock.
// Waits for callbacks (replay, watch, async completions) use a generous real-time timeout,
// since every backend delivers promptly; they never stand in for the transport's clock.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "amp/error.hpp"
#include "amp/result.hpp"
#include "amp/transport/transport.hpp"
#include "conformance/fixture.hpp"
#include "support/checks.hpp"

namespace Catch {

template <>
struct StringMaker<amp::kv_op> {
  static std::string convert(amp::kv_op op) {
    switch (op) {
      case amp::kv_op::put: return "put";
      case amp::kv_op::del: return "del";
      case amp::kv_op::purge: return "purge";
      case amp::kv_op::expired: return "expired";
    }
    return "?";
  }
};

}  // namespace Catch

namespace amp::conformance::cases {

using namespace std::chrono_literals;

/// How long a case waits in real time for a callback that the backend should deliver
/// promptly (replay, watch, an async completion).
inline constexpr std::chrono::seconds prompt_timeout{10};

using amp::testing::code_of;
using amp::testing::must;

// ----- streams --------------------------------------------------------------------------

/// A stream configuration with a unique name `<base>_<n>` that captures `<name>.>`, so
/// that its subjects never clash with another case's on a shared server.
inline stream_config stream_cfg(fixture& fx, std::string_view base,
                                retention_policy retention = retention_policy::limits) {
  stream_config c;
  c.name = fx.unique(base);
  c.subjects = {c.name + ".>"};
  c.retention = retention;
  return c;
}

/// `<stream name>.<tail>`: a subject the stream captures.
inline std::string subject_in(const stream_config& c, std::string_view tail) {
  return c.name + "." + std::string(tail);
}

/// Deletes a stream at the end of a case, whatever happened in between.
class stream_guard {
 public:
  stream_guard(transport& t, std::string name) : t_(t), name_(std::move(name)) {}
  stream_guard(const stream_guard&) = delete;
  stream_guard& operator=(const stream_guard&) = delete;
  ~stream_guard() { static_cast<void>(t_.delete_stream(name_)); }

 private:
  transport& t_;
  std::string name_;
};

/// Creates the stream (the case fails otherwise) and deletes it when the guard goes.
[[nodiscard]] inline stream_guard create_stream(
    transport& t, const stream_config& c,
    std::source_location where = std::source_location::current()) {
  must(t.ensure_stream(c), where);
  return stream_guard(t, c.name);
}

inline stream_state state_of(transport& t, std::string_view stream,
                             std::source_location where = std::source_location::current()) {
  return must(t.stream_info_of(stream), where).state;
}

/// Publishes `data` on `subject`; returns the sequence.
inline std::uint64_t publish_ok(transport& t, std::string subject, std::string data = "x",
                                std::source_location where = std::source_location::current()) {
  return must(t.publish({.subject = std::move(subject), .data = std::move(data)}), where).seq;
}

// ----- consumers ------------------------------------------------------------------------

inline consumer_config consumer_cfg(fixture& fx, const stream_config& s, std::string filter = {},
                                    duration ack_wait = 30s) {
  consumer_config c;
  c.stream = s.name;
  c.durable = fx.unique("c");
  c.filter_subject = std::move(filter);
  c.ack_wait = ack_wait;
  return c;
}

/// Fetches without waiting: what is available now, up to `batch`.
inline std::vector<message> fetch_now(
    transport& t, const consumer_config& c, std::size_t batch = 1,
    std::source_location where = std::source_location::current()) {
  return must(t.fetch(c.stream, c.durable, fetch_request{.batch = batch, .max_wait = 0s}), where);
}

inline consumer_info info_of(transport& t, const consumer_config& c,
                             std::source_location where = std::source_location::current()) {
  return must(t.consumer_info_of(c.stream, c.durable), where);
}

inline std::vector<std::uint64_t> seqs_of(const std::vector<message>& ms) {
  std::vector<std::uint64_t> out;
  out.reserve(ms.size());
  for (const auto& m : ms) out.push_back(m.seq);
  return out;
}

inline std::vector<std::uint64_t> seq_range(std::uint64_t first, std::uint64_t last) {
  std::vector<std::uint64_t> out;
  for (auto s = first; s <= last; ++s) out.push_back(s);
  return out;
}

// ----- KV -------------------------------------------------------------------------------

/// Deletes a bucket at the end of a case, whatever happened in between.
class bucket_guard {
 public:
  bucket_guard(transport& t, std::string name) : t_(t), name_(std::move(name)) {}
  bucket_guard(const bucket_guard&) = delete;
  bucket_guard& operator=(const bucket_guard&) = delete;
  ~bucket_guard() { static_cast<void>(t_.delete_bucket(name_)); }

 private:
  transport& t_;
  std::string name_;
};

inline kv_config bucket_cfg(fixture& fx, std::string_view base, int history = 1) {
  kv_config c;
  c.bucket = fx.unique(base);
  c.history = history;
  return c;
}

[[nodiscard]] inline bucket_guard create_bucket(
    transport& t, const kv_config& c,
    std::source_location where = std::source_location::current()) {
  must(t.ensure_bucket(c), where);
  return bucket_guard(t, c.bucket);
}

// ----- callbacks ------------------------------------------------------------------------

/// Collects what a callback receives, from whatever thread it runs on, and lets the case
/// wait (in real time, up to `prompt_timeout`) until enough has arrived.
template <class T>
class collector {
 public:
  void add(const T& item) {
    {
      std::lock_guard lock(mutex_);
      items_.push_back(item);
    }
    cv_.notify_all();
  }

  /// Waits until at least `n` items arrived; false on timeout.
  bool wait_for(std::size_t n, std::chrono::milliseconds timeout = prompt_timeout) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return items_.size() >= n; });
  }

  std::vector<T> items() const {
    std::lock_guard lock(mutex_);
    return items_;
  }

  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return items_.size();
  }

 protected:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<T> items_;
};

/// Records the messages of an ordered replay.
class replay_log : public collector<message> {
 public:
  std::function<void(const message&)> callback() {
    return [this](const message& m) { add(m); };
  }
  std::vector<std::uint64_t> seqs() const { return seqs_of(items()); }
};

/// Records the entries of a KV watch and when it caught up.
class watch_log : public collector<kv_entry> {
 public:
  kv_watch_handlers handlers() {
    return kv_watch_handlers{
        .on_entry = [this](const kv_entry& e) { add(e); },
        .on_caught_up =
            [this] {
              {
                std::lock_guard lock(mutex_);
                if (caught_up_calls_++ == 0) entries_before_caught_up_ = items_.size();
              }
              cv_.notify_all();
            },
    };
  }

  /// Waits for `on_caught_up`; false on timeout.
  bool wait_caught_up(std::chrono::milliseconds timeout = prompt_timeout) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return caught_up_calls_ > 0; });
  }

  int caught_up_calls() const {
    std::lock_guard lock(mutex_);
    return caught_up_calls_;
  }

  /// How many entries arrived before the first `on_caught_up`.
  std::size_t entries_before_caught_up() const {
    std::lock_guard lock(mutex_);
    return entries_before_caught_up_;
  }

 private:
  int caught_up_calls_ = 0;
  std::size_t entries_before_caught_up_ = 0;
};

/// A completion handler that counts its calls and keeps the first result.
template <class T>
class completion_probe {
 public:
  completion_probe() : state_(std::make_shared<state>()) { future_ = state_->promise.get_future(); }

  completion<T> handler() {
    return [s = state_](result<T> r) {
      if (s->calls.fetch_add(1) == 0) s->promise.set_value(std::move(r));
    };
  }

  /// Whether the handler has run.
  bool done(std::chrono::milliseconds timeout = 0ms) {
    return future_.wait_for(timeout) == std::future_status::ready;
  }

  /// The first result; fails the case when none arrives within `prompt_timeout`.
  result<T> get() {
    if (!done(prompt_timeout)) FAIL("the completion handler did not run");
    return future_.get();
  }

  int calls() const { return state_->calls.load(); }

 private:
  struct state {
    std::atomic<int> calls{0};
    std::promise<result<T>> promise;
  };
  std::shared_ptr<state> state_;
  std::future<result<T>> future_;
};

}  // namespace amp::conformance::cases
