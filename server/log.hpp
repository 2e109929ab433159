#pragma once

// The structured log of amp-server: one JSON object per line on stderr, the same shape as
// the gateway's lines ({"ts","level","event",...}), so that one reader takes both.

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

#include "amp/json.hpp"

namespace amp::server {

/// One line being built: `ts`, `level` and `event` first, then the fields in order.
class log_event {
 public:
  log_event(std::string_view level, std::string_view event);

  log_event& field(std::string_view key, std::string_view value);
  log_event& field(std::string_view key, const char* value) {
    return field(key, std::string_view(value));
  }
  log_event& field(std::string_view key, std::int64_t value);
  log_event& field(std::string_view key, std::uint64_t value);
  log_event& field(std::string_view key, int value) {
    return field(key, static_cast<std::int64_t>(value));
  }
  log_event& field(std::string_view key, bool value);

  /// The finished line, without its newline.
  std::string take();

 private:
  amp::json_writer writer_;
};

/// Writes whole lines to a stream, one write per line, from any thread.
class logger {
 public:
  explicit logger(std::FILE* out = stderr) : out_(out) {}
  logger(const logger&) = delete;
  logger& operator=(const logger&) = delete;

  /// Writes `json` (one JSON object) and a newline, and flushes.
  void write(std::string_view json);
  void write(log_event event) { write(event.take()); }

 private:
  std::mutex mutex_;
  std::FILE* out_;
};

}  // namespace amp::server
