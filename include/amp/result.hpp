#pragma once

/// \file
/// `amp::result<T>`: a value or an `amp::error`, with `std::expected`'s member names so
/// that it can become an alias of `std::expected<T, amp::error>` on C++23.
///
/// The monadic members are C++23's too: `and_then(f)` calls `f` with the value and returns
/// its `result` (the error passes through untouched), `transform(f)` wraps what `f` returns
/// in a `result`, `or_else(f)` calls `f` with the error and returns its `result` (a value
/// passes through), `transform_error(f)` replaces the error with what `f` returns. For
/// `result<void>`, `f` of `and_then` and `transform` takes no argument. None of them
/// throws unless `f` does; `f` runs on the calling thread, at most once.

#include <cassert>
#include <functional>
#include <optional>
#include <stdexcept>
#include <type_traits>
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

template <class T>
class result;

namespace detail {
template <class R>
struct is_result : std::false_type {};
template <class T>
struct is_result<result<T>> : std::true_type {};
// The type a function returns, without reference or const.
template <class F, class... Args>
using result_of_call = std::remove_cvref_t<std::invoke_result_t<F, Args...>>;
// `f(args...)` as a result: what `transform` returns on a value.
template <class F, class... Args>
auto call_into_result(F&& f, Args&&... args) {
  using U = result_of_call<F, Args...>;
  if constexpr (std::is_void_v<U>) {
    std::invoke(std::forward<F>(f), std::forward<Args>(args)...);
    return result<U>();
  } else {
    return result<U>(std::invoke(std::forward<F>(f), std::forward<Args>(args)...));
  }
}
}  // namespace detail

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
  template <class U>
  T value_or(U&& fallback) && {
    return has_value() ? std::move(**this) : static_cast<T>(std::forward<U>(fallback));
  }

  template <class F>
  auto and_then(F&& f) const& {
    using R = detail::result_of_call<F, const T&>;
    static_assert(detail::is_result<R>::value, "and_then's function must return a result");
    return has_value() ? std::invoke(std::forward<F>(f), **this) : R(error());
  }
  template <class F>
  auto and_then(F&& f) && {
    using R = detail::result_of_call<F, T&&>;
    static_assert(detail::is_result<R>::value, "and_then's function must return a result");
    return has_value() ? std::invoke(std::forward<F>(f), std::move(**this))
                       : R(std::move(*this).error());
  }

  template <class F>
  auto transform(F&& f) const& {
    using R = result<detail::result_of_call<F, const T&>>;
    if (!has_value()) return R(error());
    return detail::call_into_result(std::forward<F>(f), **this);
  }
  template <class F>
  auto transform(F&& f) && {
    using R = result<detail::result_of_call<F, T&&>>;
    if (!has_value()) return R(std::move(*this).error());
    return detail::call_into_result(std::forward<F>(f), std::move(**this));
  }

  template <class F>
  result or_else(F&& f) const& {
    static_assert(std::is_same_v<detail::result_of_call<F, const error_type&>, result>,
                  "or_else's function must return the same result type");
    return has_value() ? *this : std::invoke(std::forward<F>(f), error());
  }
  template <class F>
  result or_else(F&& f) && {
    static_assert(std::is_same_v<detail::result_of_call<F, error_type&&>, result>,
                  "or_else's function must return the same result type");
    return has_value() ? std::move(*this)
                       : std::invoke(std::forward<F>(f), std::move(*this).error());
  }

  template <class F>
  result transform_error(F&& f) const& {
    return has_value() ? *this : result(error_type(std::invoke(std::forward<F>(f), error())));
  }
  template <class F>
  result transform_error(F&& f) && {
    return has_value()
               ? std::move(*this)
               : result(error_type(std::invoke(std::forward<F>(f), std::move(*this).error())));
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

  template <class F>
  auto and_then(F&& f) const& {
    using R = detail::result_of_call<F>;
    static_assert(detail::is_result<R>::value, "and_then's function must return a result");
    return has_value() ? std::invoke(std::forward<F>(f)) : R(error());
  }
  template <class F>
  auto and_then(F&& f) && {
    using R = detail::result_of_call<F>;
    static_assert(detail::is_result<R>::value, "and_then's function must return a result");
    return has_value() ? std::invoke(std::forward<F>(f)) : R(std::move(*this).error());
  }

  template <class F>
  auto transform(F&& f) const& {
    using R = result<detail::result_of_call<F>>;
    if (!has_value()) return R(error());
    return detail::call_into_result(std::forward<F>(f));
  }

  template <class F>
  result or_else(F&& f) const& {
    static_assert(std::is_same_v<detail::result_of_call<F, const error_type&>, result>,
                  "or_else's function must return result<void>");
    return has_value() ? *this : std::invoke(std::forward<F>(f), error());
  }

  template <class F>
  result transform_error(F&& f) const& {
    return has_value() ? *this : result(error_type(std::invoke(std::forward<F>(f), error())));
  }

 private:
  std::optional<error_type> error_;
};

}  // namespace amp
