#pragma once

// The two schema passes over a client frame (schemas/frames/<op>.json for shape and types,
// schemas/frames/names.json for name grammars) checked by hand for the frames of the task
// and inbox path, as a fast path: valijson ran twice on every frame. `surely_valid_frame`
// answers true only for a frame both passes accept; for anything else (including some
// frames they would accept, such as a 1.0 where an integer goes) it answers false and the
// caller asks the schemas, which also say what failed. tests/unit/frame_check_test.cpp
// checks it against the schemas on valid and broken frames.

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string_view>

#include "detail/envelope_check.hpp"
#include "detail/name_rules.hpp"

namespace amp::detail {

namespace frame_check {

inline constexpr std::int64_t k_max_safe_integer = 9007199254740991;  // 2^53 - 1

// An integer simdjson holds as int64 within [low, high]; false for 1.0, 1e3 and the like,
// which the schemas decide.
inline bool integer_within(simdjson::dom::element value, std::int64_t low, std::int64_t high) {
  std::int64_t i = 0;
  if (value.type() != simdjson::dom::element_type::INT64 || value.get_int64().get(i)) return false;
  return i >= low && i <= high;
}

// `id`: a string of at most 64 characters, or an integer within ±(2^53-1).
inline bool request_id(simdjson::dom::element value) {
  std::string_view s;
  if (!value.get_string().get(s)) return envelope_check::length_within(s, 0, 64);
  return integer_within(value, -k_max_safe_integer, k_max_safe_integer);
}

// `^t_[0-9a-z]{1,62}$`
inline bool task_id_text(std::string_view s) {
  if (s.size() < 3 || s.size() > 64 || s.substr(0, 2) != "t_") return false;
  for (char c : s.substr(2)) {
    if (!is_digit(c) && !is_lower(c)) return false;
  }
  return true;
}

// `idempotency_key`: 1 to 256 bytes (the pattern counts bytes; the length, characters).
inline bool idempotency_key_text(std::string_view s) {
  return !s.empty() && s.size() <= 256 && envelope_check::code_points(s).has_value();
}

inline bool string_headers(simdjson::dom::element value) {
  simdjson::dom::object headers;
  if (value.get_object().get(headers)) return false;
  for (auto [name, v] : headers) {
    if (!v.is_string()) return false;
  }
  return true;
}

enum class hot_op { ack, nack, claim, complete, submit, heartbeat };

inline std::optional<hot_op> hot_op_of(std::string_view op) {
  if (op == "ack") return hot_op::ack;
  if (op == "nack") return hot_op::nack;
  if (op == "claim") return hot_op::claim;
  if (op == "complete") return hot_op::complete;
  if (op == "submit") return hot_op::submit;
  if (op == "heartbeat") return hot_op::heartbeat;
  return std::nullopt;
}

// The members `op` knows beside `op` and `id`: true when `key`'s value passes, and the bit
// of a required member in `required`. Unknown members pass (the schemas ignore them).
inline bool member_ok(hot_op op, std::string_view key, simdjson::dom::element value,
                      unsigned& required) {
  switch (op) {
    case hot_op::ack:
    case hot_op::nack:
      if (key == "seq") {
        required |= 1;
        return integer_within(value, 1, k_max_safe_integer);
      }
      if (key == "delay_ms" && op == hot_op::nack) return integer_within(value, 0, 86400000);
      return true;
    case hot_op::claim:
    case hot_op::complete:
    case hot_op::heartbeat:
      if (key == "task") {
        required |= 1;
        return envelope_check::string_that(value, task_id_text);
      }
      if (key == "attempt" && op != hot_op::claim) {
        return integer_within(value, -k_max_safe_integer, k_max_safe_integer);
      }
      return true;  // `result` of complete: any value
    case hot_op::submit:
      if (key == "job") {
        required |= 1;
        return envelope_check::string_that(value, is_single_token_name);
      }
      if (key == "body") {
        required |= 2;
        return true;
      }
      if (key == "type") return value.is_string();
      if (key == "headers") return string_headers(value);
      if (key == "max_attempts") return integer_within(value, 1, 100);
      if (key == "idempotency_key") return envelope_check::string_that(value, idempotency_key_text);
      return true;
  }
  return false;
}

inline unsigned required_of(hot_op op) {
  switch (op) {
    case hot_op::ack:
    case hot_op::nack:
    case hot_op::claim:
    case hot_op::complete: return 1;
    case hot_op::heartbeat: return 0;
    case hot_op::submit: return 3;
  }
  return ~0U;
}

}  // namespace frame_check

/// True only when `frame` satisfies both `frames/<op>` and `frames/names` (`op` being the
/// frame's own `op`, as the caller read it); false when it does not, when this cannot tell,
/// or for an op without a fast path (the schemas decide then). The ops with one: ack, nack,
/// claim, complete, submit, heartbeat. Every member is looked at, duplicates too.
/// Thread-safe.
inline bool surely_valid_frame(std::string_view op, simdjson::dom::element frame) {
  using namespace frame_check;
  const auto which = hot_op_of(op);
  if (!which) return false;
  simdjson::dom::object object;
  if (frame.get_object().get(object)) return false;
  unsigned required = 0;
  bool has_op = false;
  for (auto [key, value] : object) {
    bool ok = true;
    if (key == "op") {
      std::string_view s;
      ok = !value.get_string().get(s) && s == op;
      has_op = true;
    } else if (key == "id") {
      ok = request_id(value);
    } else {
      ok = member_ok(*which, key, value, required);
    }
    if (!ok) return false;
  }
  const unsigned need = required_of(*which);
  return has_op && (required & need) == need;
}

}  // namespace amp::detail
