// A program built against an installed amp, by find_package(amp) and by pkg-config
// (tests/install/CMakeLists.txt). Exits 0 when the public API behaves as documented.

#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <system_error>

#include "amp/clock.hpp"
#include "amp/envelope.hpp"
#include "amp/error.hpp"
#include "amp/names.hpp"
#include "amp/result.hpp"
#include "amp/transport/memory.hpp"

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

  // The transport, the names and the envelope: the library's own dependencies
  // (simdjson, fmt) must come along through the package.
  auto clock = std::make_shared<amp::manual_clock>();
  auto transport = amp::memory_transport::create({.clock = clock});
  expect(transport
             ->ensure_stream({.name = "JOBS",
                              .subjects = {"jobs.*"},
                              .retention = amp::retention_policy::work_queue})
             .has_value(),
         "ensure_stream");
  expect(transport->ensure_consumer({.stream = "JOBS", .durable = "w"}).has_value(),
         "ensure_consumer");
  auto published = transport->publish({.subject = "jobs.resize", .data = "x", .msg_id = "t1"});
  expect(published.has_value() && published.value().seq == 1, "publish");
  auto fetched = transport->fetch("JOBS", "w", {.batch = 1});
  expect(fetched.has_value() && fetched.value().size() == 1, "fetch");
  if (fetched.has_value() && !fetched.value().empty()) {
    expect(transport->ack(fetched.value().front()).has_value(), "ack");
  }
  auto bad_subject = transport->publish({.subject = "jobs. resize"});
  expect(!bad_subject.has_value() && bad_subject.error() == amp::errc::invalid_name,
         "a subject with a space is invalid_name");
  expect(!amp::participant_name::make("Bob").has_value(), "participant names are checked");
  auto env = amp::parse_envelope(
      R"({"id":"m1","from":"alice","to":"bob","ns":"demo","ts":"2026-11-30T12:00:00.123Z","body":{"n":1}})");
  expect(env.has_value() && env.value().body == R"({"n":1})", "parse_envelope");

  if (failures == 0) std::puts("amp consumer: ok");
  return failures == 0 ? 0 : 1;
}
