#pragma once

// The envelope schema (schemas/envelope.json) checked by hand, as a fast path: every
// envelope the broker seals or reads back went through valijson, ~a fifth of amp-server's
// CPU on the task path over the memory transport. `surely_valid_envelope` answers true
// only for a document the schema accepts; for anything else (including some documents
// the schema would accept, such as strings holding a NUL) it answers false and the caller
// asks the schema, which also says what failed. tests/unit/envelope_check_test.cpp checks
// it against the schema on valid and broken envelopes.

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "detail/name_rules.hpp"

namespace amp::detail {

namespace envelope_check {

// Code points as valijson counts them (UTF-8 lead bytes); nothing when `s` holds a NUL,
// where valijson stops counting.
inline std::optional<std::size_t> code_points(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) {
    if (c == '\0') return std::nullopt;
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  }
  return n;
}

inline bool length_within(std::string_view s, std::size_t min, std::size_t max) {
  auto n = code_points(s);
  return n && *n >= min && *n <= max;
}

// `^[^\x00-\x1f\x7f]{1,512}$` and 1..128 characters (an id, a header name).
inline bool printable_id(std::string_view s) {
  if (s.empty() || s.size() > 512) return false;
  for (char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b <= 0x1f || b == 0x7f) return false;
  }
  return length_within(s, 1, 128);
}

// `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$` (ASCII: 1..128 characters too).
inline bool type_name(std::string_view s) {
  auto alnum = [](char c) { return is_digit(c) || is_lower(c) || (c >= 'A' && c <= 'Z'); };
  if (s.empty() || s.size() > 128 || !alnum(s[0])) return false;
  for (std::size_t i = 1; i < s.size(); ++i) {
    if (!(alnum(s[i]) || s[i] == '.' || s[i] == '_' || s[i] == '-')) return false;
  }
  return true;
}

// `^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})$`
inline bool timestamp_shape(std::string_view s) {
  constexpr std::string_view k_shape = "dddd-dd-ddTdd:dd:dd";
  if (s.size() < k_shape.size()) return false;
  for (std::size_t i = 0; i < k_shape.size(); ++i) {
    const char want = k_shape[i];
    const char c = s[i];
    if (want == 'd' ? !is_digit(c) : want == 'T' ? (c != 'T' && c != 't') : c != want) return false;
  }
  std::size_t at = k_shape.size();
  if (at < s.size() && s[at] == '.') {
    const std::size_t start = ++at;
    while (at < s.size() && is_digit(s[at])) ++at;
    if (at == start || at - start > 9) return false;
  }
  const auto rest = s.substr(at);
  if (rest == "Z" || rest == "z") return true;
  return rest.size() == 6 && (rest[0] == '+' || rest[0] == '-') && is_digit(rest[1]) &&
         is_digit(rest[2]) && rest[3] == ':' && is_digit(rest[4]) && is_digit(rest[5]);
}

inline bool string_that(simdjson::dom::element value, bool (*check)(std::string_view)) {
  std::string_view s;
  return !value.get_string().get(s) && check(s);
}

inline bool headers_ok(simdjson::dom::element value) {
  simdjson::dom::object headers;
  if (value.get_object().get(headers)) return false;
  std::size_t n = 0;
  for (auto [name, v] : headers) {
    if (++n > 64 || !printable_id(name)) return false;
    std::string_view text;
    if (v.get_string().get(text) || !length_within(text, 0, 4096)) return false;
  }
  return true;
}

// `^o_[0-9a-z]{1,62}$` (an operation id).
inline bool operation_id_shape(std::string_view s) {
  if (s.size() < 3 || s.size() > 64 || !s.starts_with("o_")) return false;
  for (char c : s.substr(2)) {
    if (!is_digit(c) && !is_lower(c)) return false;
  }
  return true;
}

// `{"id","branch","attempt","reply_by"}`: all four, `attempt` an integer 1..2^31-1,
// `reply_by` null or a timestamp.
inline bool operation_ok(simdjson::dom::element value) {
  simdjson::dom::object operation;
  if (value.get_object().get(operation)) return false;
  unsigned required = 0;
  for (auto [key, v] : operation) {
    bool ok = true;
    if (key == "id") {
      required |= 1;
      ok = string_that(v, operation_id_shape);
    } else if (key == "branch") {
      required |= 2;
      ok = string_that(v, is_single_token_name);
    } else if (key == "attempt") {
      required |= 4;
      std::int64_t n = 0;
      ok = v.type() == simdjson::dom::element_type::INT64 && !v.get_int64().get(n) && n >= 1 &&
           n <= 2147483647;
    } else if (key == "reply_by") {
      required |= 8;
      ok = v.is_null() || string_that(v, timestamp_shape);
    }
    if (!ok) return false;
  }
  return required == 15;
}

}  // namespace envelope_check

/// True only when `root` satisfies the envelope schema; false when it does not, or when
/// this cannot tell (the schema decides then). Every member is looked at, duplicates too.
/// Thread-safe.
inline bool surely_valid_envelope(simdjson::dom::element root) {
  using namespace envelope_check;
  simdjson::dom::object object;
  if (root.get_object().get(object)) return false;
  unsigned required = 0;  // id, from, to, ns, ts, body: one bit each
  for (auto [key, value] : object) {
    bool ok = true;
    if (key == "id") {
      required |= 1;
      ok = string_that(value, printable_id);
    } else if (key == "from") {
      required |= 2;
      ok = string_that(
          value, [](std::string_view s) { return s == broker_sender || is_single_token_name(s); });
    } else if (key == "to") {
      required |= 4;
      ok = string_that(value, is_topic_name);
    } else if (key == "ns") {
      required |= 8;
      ok = string_that(value, is_single_token_name);
    } else if (key == "ts") {
      required |= 16;
      ok = string_that(value, timestamp_shape);
    } else if (key == "body") {
      required |= 32;
    } else if (key == "type") {
      ok = string_that(value, type_name);
    } else if (key == "headers") {
      ok = headers_ok(value);
    } else if (key == "reply_to") {
      ok = string_that(value, is_single_token_name);
    } else if (key == "correlation") {
      ok = string_that(value, [](std::string_view s) { return length_within(s, 1, 256); });
    } else if (key == "operation") {
      ok = operation_ok(value);
    }
    if (!ok) return false;
  }
  return required == 63;
}

}  // namespace amp::detail
