#pragma once

/// \file
/// Writing JSON, and checking that text is JSON. `json_writer` is the one writer the
/// library uses to emit JSON (frames, envelopes, records); reading is done with simdjson
/// inside `src/` and never shows in the public headers.

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "amp/result.hpp"

namespace amp {

/// A streaming JSON builder that appends to a `std::string`.
///
/// Commas and colons are placed automatically:
/// \code
///   amp::json_writer w;
///   w.begin_object().key("op").string("ok").key("id").integer(7).end_object();
///   // w.str() == R"({"op":"ok","id":7})"
/// \endcode
///
/// Strings (values and keys) are assumed to be valid UTF-8 and are copied through
/// unchanged except for `"`, `\` and the control characters U+0000..U+001F, which are
/// escaped (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, otherwise `\u00XX`). DEL and
/// non-ASCII characters are written as they are. Nothing is validated: the caller pairs
/// `begin_*` with `end_*`, writes a `key` before each value inside an object and none
/// inside an array (debug builds assert this).
///
/// Threads: an instance is not shared between threads without synchronization; distinct
/// instances are independent.
class json_writer {
 public:
  json_writer() = default;
  /// Reserves room for `capacity` bytes of output.
  explicit json_writer(std::size_t capacity);

  json_writer& begin_object();
  json_writer& end_object();
  json_writer& begin_array();
  json_writer& end_array();

  /// The name of the next member of the current object.
  json_writer& key(std::string_view name);

  /// A string value.
  json_writer& string(std::string_view value);

  /// An integer value, written exactly (any signed or unsigned integer type but `bool`).
  template <std::integral T>
  requires(!std::same_as<T, bool>) json_writer& integer(T value) {
    if constexpr (std::is_signed_v<T>) {
      return write_signed(static_cast<std::int64_t>(value));
    } else {
      return write_unsigned(static_cast<std::uint64_t>(value));
    }
  }

  /// A number, in the shortest form that reads back as the same double (`0.1`, `1e+21`,
  /// `5` for 5.0). NaN and infinities have no JSON form: they are written as `null`.
  json_writer& number(double value);

  json_writer& boolean(bool value);
  json_writer& null();

  /// Splices `json`, which must be one complete serialized JSON value (e.g. an envelope
  /// body), as the next value. It is not checked; use `json_check` first if unsure.
  json_writer& raw(std::string_view json);

  /// The output so far.
  const std::string& str() const& noexcept { return out_; }
  /// Moves the output out; the writer is left empty and ready for a new value.
  std::string take() noexcept;

  /// True when exactly one whole value has been written and every container is closed.
  bool complete() const noexcept { return stack_.empty() && !out_.empty(); }

 private:
  void before_value();
  json_writer& write_signed(std::int64_t value);
  json_writer& write_unsigned(std::uint64_t value);

  std::string out_;
  std::string stack_;        // one '{' or '[' per open container
  bool need_comma_ = false;  // a value or member precedes at this level
  bool after_key_ = false;   // a key was written and awaits its value
};

/// `value` as a JSON string literal, quotes included, escaped as `json_writer` does.
std::string json_quote(std::string_view value);

/// Checks that `text` is exactly one JSON value (surrounding whitespace allowed), in valid
/// UTF-8, with numbers that fit a 64-bit integer or a double.
/// Errors: `bad_request` with the parser's description, e.g. "not valid JSON: The input
/// is not valid UTF-8". Thread-safe.
result<void> json_check(std::string_view text);

}  // namespace amp
