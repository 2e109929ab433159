#pragma once

// What the transports do with an exception thrown by a handler they call: catch it where
// they call it (a cnats thread, the clock's timer thread, a publisher), report it, and go
// on as if the handler had returned. An exception must never unwind through cnats's C
// frames or leave a transport's bookkeeping half done.

#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "amp/result.hpp"
#include "amp/transport/transport.hpp"

namespace amp::detail {

/// Receives one line per exception: "a handler of <where> threw: <what>".
using handler_error_sink = std::function<void(std::string_view)>;

/// Reports the exception being handled; call it only from a catch block. Never throws.
/// Without a sink the line goes to standard error.
inline void report_current_exception(const handler_error_sink& sink,
                                     std::string_view where) noexcept {
  try {
    std::string line = "a handler of ";
    line += where;
    line += " threw: ";
    try {
      throw;
    } catch (const std::exception& e) {
      line += e.what();
    } catch (...) {
      line += "an exception that is not a std::exception";
    }
    if (sink) {
      sink(line);
    } else {
      std::fprintf(stderr, "amp: %s\n", line.c_str());
    }
  } catch (...) {  // the sink threw, or no memory for the line: nothing more can be done
  }
}

/// Calls `f()`, reporting (not propagating) what it throws.
template <class F>
void call_guarded(const handler_error_sink& sink, std::string_view where, F&& f) noexcept {
  try {
    std::forward<F>(f)();
  } catch (...) {
    report_current_exception(sink, where);
  }
}

/// `done`, wrapped so that an exception it throws is reported instead of propagated.
template <class T>
completion<T> guarded(completion<T> done, std::shared_ptr<const handler_error_sink> sink,
                      const char* where) {
  if (!done) {
    return done;
  }
  return [done = std::move(done), sink = std::move(sink), where](result<T> r) {
    call_guarded(*sink, where, [&] { done(std::move(r)); });
  };
}

}  // namespace amp::detail
