#include "amp/json.hpp"

#include <array>
#include <cassert>
#include <charconv>
#include <cmath>

#include "detail/simdjson_adapter.hpp"

namespace amp {
namespace {

constexpr char hex_digits[] = "0123456789abcdef";

bool needs_escape(unsigned char c) {
  return c < 0x20 || c == '"' || c == '\\';
}

void append_escaped(std::string& out, std::string_view s) {
  out.push_back('"');
  std::size_t run = 0;  // start of the bytes not yet copied
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (!needs_escape(c)) {
      continue;
    }
    out.append(s.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\b': out.append("\\b"); break;
      case '\f': out.append("\\f"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      default: {
        const char u[] = {'\\', 'u', '0', '0', hex_digits[c >> 4], hex_digits[c & 0xF]};
        out.append(u, sizeof u);
      }
    }
  }
  out.append(s.data() + run, s.size() - run);
  out.push_back('"');
}

}  // namespace

json_writer::json_writer(std::size_t capacity) {
  out_.reserve(capacity);
}

void json_writer::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  assert((!stack_.empty() && stack_.back() == '[') || (stack_.empty() && out_.empty()));
  if (need_comma_) {
    out_.push_back(',');
  }
}

json_writer& json_writer::begin_object() {
  before_value();
  out_.push_back('{');
  stack_.push_back('{');
  need_comma_ = false;
  return *this;
}

json_writer& json_writer::end_object() {
  assert(!stack_.empty() && stack_.back() == '{' && !after_key_);
  out_.push_back('}');
  stack_.pop_back();
  need_comma_ = true;
  return *this;
}

json_writer& json_writer::begin_array() {
  before_value();
  out_.push_back('[');
  stack_.push_back('[');
  need_comma_ = false;
  return *this;
}

json_writer& json_writer::end_array() {
  assert(!stack_.empty() && stack_.back() == '[');
  out_.push_back(']');
  stack_.pop_back();
  need_comma_ = true;
  return *this;
}

json_writer& json_writer::key(std::string_view name) {
  assert(!stack_.empty() && stack_.back() == '{' && !after_key_);
  if (need_comma_) {
    out_.push_back(',');
  }
  append_escaped(out_, name);
  out_.push_back(':');
  after_key_ = true;
  need_comma_ = false;
  return *this;
}

json_writer& json_writer::string(std::string_view value) {
  before_value();
  append_escaped(out_, value);
  need_comma_ = true;
  return *this;
}

namespace {

template <class Integer>
void append_integer(std::string& out, Integer value) {
  std::array<char, 24> buf{};
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value);
  assert(ec == std::errc());
  out.append(buf.data(), end);
}

}  // namespace

json_writer& json_writer::write_signed(std::int64_t value) {
  before_value();
  append_integer(out_, value);
  need_comma_ = true;
  return *this;
}

json_writer& json_writer::write_unsigned(std::uint64_t value) {
  before_value();
  append_integer(out_, value);
  need_comma_ = true;
  return *this;
}

json_writer& json_writer::number(double value) {
  if (!std::isfinite(value)) {
    return null();
  }
  before_value();
  std::array<char, 32> buf{};
  // Without a format, to_chars writes the shortest text that reads back exactly.
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value);
  assert(ec == std::errc());
  out_.append(buf.data(), end);
  need_comma_ = true;
  return *this;
}

json_writer& json_writer::boolean(bool value) {
  before_value();
  out_.append(value ? "true" : "false");
  need_comma_ = true;
  return *this;
}

json_writer& json_writer::null() {
  before_value();
  out_.append("null");
  need_comma_ = true;
  return *this;
}

json_writer& json_writer::raw(std::string_view json) {
  before_value();
  out_.append(json);
  need_comma_ = true;
  return *this;
}

std::string json_writer::take() noexcept {
  std::string out = std::move(out_);
  out_.clear();
  stack_.clear();
  need_comma_ = false;
  after_key_ = false;
  return out;
}

std::string json_quote(std::string_view value) {
  std::string out;
  out.reserve(value.size() + 2);
  append_escaped(out, value);
  return out;
}

result<void> json_check(std::string_view text) {
  // One parser per thread: a dom::parser is not thread-safe, and reusing it keeps its
  // buffers (sized by the largest document this thread has checked).
  thread_local simdjson::dom::parser parser;
  detail::parser_release release(parser);
  if (auto code = parser.parse(text.data(), text.size()).error()) {
    return detail::not_json_error(code);
  }
  return {};
}

}  // namespace amp
