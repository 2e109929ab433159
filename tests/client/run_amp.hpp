// Runs the `amp` binary built with the tests (AMP_CLI_PATH) and collects what it printed.

#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "process.hpp"

namespace amp::testing {

/// What one run of the `amp` binary printed and returned.
struct cli_run {
  int status = -1;
  std::string out;
  std::string err;
};

/// Runs `amp args...` with `input` on stdin, AMP_URL and AMP_TOKEN cleared; a run that takes
/// longer than 20 s is killed and fails the case.
inline cli_run run_amp(std::vector<std::string> args, std::string input = {}) {
  cli::process_spec spec;
  spec.argv = {AMP_CLI_PATH};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.input = std::move(input);
  spec.error_tail = std::size_t{1} << 20;
  spec.env = {{"AMP_URL", ""}, {"AMP_TOKEN", ""}};
  cli::process_control control;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock lock(mutex);
    if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return done; })) control.kill();
  });
  auto outcome = cli::run_process(spec, &control);
  {
    std::lock_guard lock(mutex);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
  REQUIRE(outcome.started);
  CHECK_FALSE(outcome.killed);
  return {outcome.exit_code, std::move(outcome.output), std::move(outcome.error_output)};
}

/// The lines of `text`, without their newlines.
inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace amp::testing
