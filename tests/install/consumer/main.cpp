// A program built against an installed amp, by find_package(amp) and by pkg-config
// (tests/install/CMakeLists.txt). Exits 0 when the public API behaves as documented.

#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <system_error>

#include "amp/clock.hpp"
#include "amp/error.hpp"
#include "amp/result.hpp"

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "amp consumer: FAILED: %s\n", what);
    ++failures;
  }
}

amp::result<int> refuse() {
  return amp::unexpected(amp::errc::conflict, "stale revision");
}

}  // namespace

int main() {
  amp::result<int> ok = 42;
  expect(ok.has_value() && *ok == 42, "result<int> holds its value");

  amp::result<int> bad = refuse();
  expect(!bad.has_value(), "result<int> holds an error");
  expect(!bad.has_value() && bad.error() == amp::errc::conflict, "the error is conflict");
  expect(!bad.has_value() && bad.error().message() == "stale revision", "the message is kept");

  expect(amp::to_string(amp::errc::lease_lost) == "lease_lost", "to_string(lease_lost)");
  expect(amp::errc_from_string("not_found") == amp::errc::not_found, "errc_from_string");
  std::error_code code = amp::errc::unavailable;
  expect(std::string(code.category().name()) == "amp", "the error category is named amp");

  amp::manual_clock manual;
  const amp::time_point start = manual.now();
  int fired = 0;
  manual.call_at(start + std::chrono::seconds(5), [&fired] { ++fired; });
  manual.advance(std::chrono::seconds(4));
  expect(fired == 0 && manual.pending_timers() == 1, "a timer waits for its deadline");
  manual.advance(std::chrono::seconds(1));
  expect(fired == 1 && manual.pending_timers() == 0, "a timer runs at its deadline");
  expect(manual.now() - start == std::chrono::seconds(5), "manual_clock advances");

  // The real clock runs timers on a thread of its own: this links Threads.
  amp::system_clock_source real;
  std::promise<void> ran;
  real.call_at(real.now() + std::chrono::milliseconds(1), [&ran] { ran.set_value(); });
  expect(ran.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready,
         "system_clock_source runs a timer");

  if (failures == 0)
    std::puts("amp consumer: ok");
  return failures == 0 ? 0 : 1;
}
