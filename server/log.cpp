#include "log.hpp"

#include <chrono>

#include "amp/timestamp.hpp"

namespace amp::server {

log_event::log_event(std::string_view level, std::string_view event) : writer_(256) {
  writer_.begin_object()
      .key("ts")
      .string(amp::format_timestamp(std::chrono::system_clock::now()))
      .key("level")
      .string(level)
      .key("event")
      .string(event);
}

log_event& log_event::field(std::string_view key, std::string_view value) {
  writer_.key(key).string(value);
  return *this;
}

log_event& log_event::field(std::string_view key, std::int64_t value) {
  writer_.key(key).integer(value);
  return *this;
}

log_event& log_event::field(std::string_view key, std::uint64_t value) {
  writer_.key(key).integer(value);
  return *this;
}

log_event& log_event::field(std::string_view key, bool value) {
  writer_.key(key).boolean(value);
  return *this;
}

std::string log_event::take() {
  writer_.end_object();
  return writer_.take();
}

void logger::write(std::string_view json) {
  std::lock_guard lock(mutex_);
  std::fwrite(json.data(), 1, json.size(), out_);
  std::fputc('\n', out_);
  std::fflush(out_);
}

}  // namespace amp::server
