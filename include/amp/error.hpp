#pragma once

/// \file
/// Error codes shared by every layer of amp (spec §9), and the error value carried by
/// `amp::result`.

#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace amp {

/// The error codes of the wire protocol (spec §9). Every failure in the library is one
/// of these; backend statuses (cnats, JetStream error codes) are translated at the
/// transport boundary and never escape it. Zero is "no error".
enum class errc {
  bad_request = 1,    ///< malformed frame or argument: shape and types
  unauthenticated,    ///< no valid session or token
  forbidden,          ///< the identity lacks the grant
  invalid_name,       ///< a name outside the grammar of spec §2
  invalid_envelope,   ///< a document failed its JSON Schema
  payload_too_large,  ///< a body or message over the configured size
  not_found,          ///< no such object (key, message, consumer, task, offer …)
  conflict,           ///< the object moved on: stale revision, existing key, config mismatch
  lease_lost,         ///< the caller no longer holds the lease
  rate_limited,       ///< over the token-bucket rate
  budget_exhausted,   ///< over the daily budget
  limit_exceeded,     ///< over a configured count (sessions, subscriptions, stream limits)
  unavailable,        ///< the backend cannot be reached; nothing was stored
  internal,           ///< a bug or an unexpected backend answer
};

/// The category of `amp::errc`; its name is "amp" and its messages are the wire codes.
const std::error_category& amp_category() noexcept;

/// Makes a `std::error_code` in `amp_category()`.
std::error_code make_error_code(errc e) noexcept;

/// The wire spelling of a code, e.g. `"lease_lost"`.
std::string_view to_string(errc e) noexcept;

/// Parses a wire spelling; `std::nullopt` for an unknown one.
std::optional<errc> errc_from_string(std::string_view code) noexcept;

/// A failure: a code, a message for humans that says what is wrong, and, where a
/// document failed validation, the JSON Pointer of the failing value.
class error {
 public:
  error(errc code, std::string message, std::string path = {})
      : code_(code), message_(std::move(message)), path_(std::move(path)) {}

  errc code() const noexcept { return code_; }
  std::error_code error_code() const noexcept { return make_error_code(code_); }
  const std::string& message() const noexcept { return message_; }
  /// JSON Pointer of the failing value for `invalid_envelope`, otherwise empty.
  const std::string& path() const noexcept { return path_; }

  /// "code: message", for logs.
  std::string to_string() const;

  friend bool operator==(const error& a, errc b) noexcept { return a.code_ == b; }

 private:
  errc code_;
  std::string message_;
  std::string path_;
};

}  // namespace amp

template <>
struct std::is_error_code_enum<amp::errc> : std::true_type {};
