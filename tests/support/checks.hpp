#pragma once

// Catch2 helpers for amp::result shared by the conformance and integration tests.

#include <catch2/catch.hpp>

#include <chrono>
#include <source_location>
#include <string>
#include <thread>
#include <utility>

#include "amp/error.hpp"
#include "amp/result.hpp"

namespace Catch {

// Prints error codes by their wire names, and a success (errc{}) as "ok".
template <>
struct StringMaker<amp::errc> {
  static std::string convert(amp::errc e) {
    if (e == amp::errc{}) return "ok";
    return std::string(amp::to_string(e));
  }
};

}  // namespace Catch

namespace amp::testing {

/// The error code of `r`, or `errc{}` (printed "ok") when it holds a value.
template <class T>
amp::errc code_of(const amp::result<T>& r) {
  return r.has_value() ? amp::errc{} : r.error().code();
}

/// "ok", or the error as "code: message".
template <class T>
std::string text_of(const amp::result<T>& r) {
  return r.has_value() ? std::string("ok") : r.error().to_string();
}

/// The value of `r`; fails the case (naming the caller's line) when it holds an error.
template <class T>
T must(amp::result<T> r, std::source_location where = std::source_location::current()) {
  if (!r.has_value()) {
    FAIL("expected success at " << where.file_name() << ":" << where.line() << ", got "
                                << r.error().to_string());
  }
  return std::move(r).value();
}

inline void must(amp::result<void> r,
                 std::source_location where = std::source_location::current()) {
  if (!r.has_value()) {
    FAIL("expected success at " << where.file_name() << ":" << where.line() << ", got "
                                << r.error().to_string());
  }
}

/// Retries `attempt` (true on success) every `poll` until it succeeds or `timeout` passes;
/// true when it succeeded. For what a backend does on its own threads, in real time.
template <class F>
bool eventually(std::chrono::milliseconds timeout, F&& attempt,
                std::chrono::milliseconds poll = std::chrono::milliseconds(50)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (attempt()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(poll);
  }
}

}  // namespace amp::testing
