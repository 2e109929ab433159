#pragma once

// How the fuzz targets assert: a failed check prints where, the condition and a detail
// (the value that broke it), then aborts, which libFuzzer reports as a crash and saves the
// input that caused it.

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace amp::fuzz {

[[noreturn]] inline void check_failed(const char* file, int line, const char* condition,
                                      std::string_view detail) {
  std::fprintf(stderr, "%s:%d: check failed: %s\n", file, line, condition);
  if (!detail.empty()) {
    std::fprintf(stderr, "  %.*s\n", static_cast<int>(detail.size()), detail.data());
  }
  std::abort();
}

}  // namespace amp::fuzz

/// Aborts with `detail` (anything that converts to std::string_view; evaluated only on
/// failure) when `condition` is false.
#define AMP_FUZZ_CHECK(condition, detail)                                  \
  do {                                                                     \
    if (!(condition)) {                                                    \
      ::amp::fuzz::check_failed(__FILE__, __LINE__, #condition, (detail)); \
    }                                                                      \
  } while (false)
