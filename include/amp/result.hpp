#pragma once

/// \file
/// `amp::result<T>`: a value or an `amp::error`, with `std::expected`'s member names so
/// that it can become an alias of `std::expected<T, amp::error>` on C++23.

#include <cassert>
#include <stdexcept>
#include <utility>
#include <variant>

#include "amp/error.hpp"

namespace amp {

/// The error type of `result` (named apart because `result` has a member `error()`).
using error_type = error;

/// Wraps an error for construction of a `result`, like `std::unexpected`.
class unexpected {
 public:
  explicit unexpected(error e) : error_(std::move(e)) {}
  unexpected(errc code, std::string message, std::string path = {})
      : error_(code, std::move(message), std::move(path)) {}
  const error& value() const& noexcept { return error_; }
  error&& value() && noexcept { return std::move(error_); }

 private:
  error error_;
};

/// Thrown by `result::value()` when the result holds an error.
class bad_result_access : public std::runtime_error {
 public:
  explicit bad_result_access(const error& e) : std::runtime_error(e.to_string()), error_(e) {}
  const amp::error& error() const noexcept { return error_; }

 private:
  amp::error error_;
};

/// A value of type `T` or an `amp::error`. The compiler warns when one is ignored.
template <class T>
class [[nodiscard]] result {
 public:
  using value_type = T;

  result() requires std::is_default_constructible_v<T> : v_(std::in_place_index<0>) {}
  result(const T& v) : v_(std::in_place_index<0>, v) {}        // NOLINT: implicit by design
  result(T&& v) : v_(std::in_place_index<0>, std::move(v)) {}  // NOLINT
  result(unexpected u) : v_(std::in_place_index<1>, std::move(u).value()) {}  // NOLINT
  result(error_type e) : v_(std::in_place_index<1>, std::move(e)) {}          // NOLINT

  bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  /// The value; throws `bad_result_access` when there is none.
  T& value() & {
    check();
    return std::get<0>(v_);
  }
  const T& value() const& {
    check();
    return std::get<0>(v_);
  }
  T&& value() && {
    check();
    return std::get<0>(std::move(v_));
  }

  T& operator*() & noexcept {
    assert(has_value());
    return std::get<0>(v_);
  }
  const T& operator*() const& noexcept {
    assert(has_value());
    return std::get<0>(v_);
  }
  T&& operator*() && noexcept {
    assert(has_value());
    return std::get<0>(std::move(v_));
  }
  T* operator->() noexcept {
    assert(has_value());
    return &std::get<0>(v_);
  }
  const T* operator->() const noexcept {
    assert(has_value());
    return &std::get<0>(v_);
  }

  /// The error; only valid when `!has_value()`.
  const error_type& error() const& noexcept {
    assert(!has_value());
    return std::get<1>(v_);
  }
  error_type&& error() && noexcept {
    assert(!has_value());
    return std::get<1>(std::move(v_));
  }

  template <class U>
  T value_or(U&& fallback) const& {
    return has_value() ? **this : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  void check() const {
    if (!has_value()) throw bad_result_access(std::get<1>(v_));
  }
  std::variant<T, error_type> v_;
};

/// A success without a value, or an `amp::error`.
template <>
class [[nodiscard]] result<void> {
 public:
  using value_type = void;

  result() = default;
  result(unexpected u) : error_(std::move(u).value()) {}  // NOLINT: implicit by design
  result(error_type e) : error_(std::move(e)) {}          // NOLINT

  bool has_value() const noexcept { return !error_.has_value(); }
  explicit operator bool() const noexcept { return has_value(); }
  /// Throws `bad_result_access` when the result holds an error.
  void value() const {
    if (error_) throw bad_result_access(*error_);
  }
  const error_type& error() const& noexcept {
    assert(!has_value());
    return *error_;
  }
  error_type&& error() && noexcept {
    assert(!has_value());
    return std::move(*error_);
  }

 private:
  std::optional<error_type> error_;
};

}  // namespace amp
