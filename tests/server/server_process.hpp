#pragma once

// amp-server as a child process of a test: started with its command line, its stdout and
// stderr kept in files of a fresh temporary directory, stopped by signal or killed when
// the object goes (also when a test fails and unwinds; PR_SET_PDEATHSIG covers a test
// process that is killed). Not thread-safe: use an object from one thread.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "support/process.hpp"

namespace amp::testing {

class server_process {
 public:
  /// The amp-server binary (AMP_SERVER_PATH, set by the build).
  static std::string binary();

  /// Runs amp-server with `args` to its end (killed after `limit`): for the runs that
  /// stop at once (--help, a bad configuration).
  struct finished {
    int status = -1;  ///< the exit status, or -1 when it did not exit by itself in time
    std::string out;  ///< stdout
    std::string err;  ///< stderr
  };
  static finished run(const std::vector<std::string>& args,
                      std::chrono::milliseconds limit = std::chrono::seconds(10));

  /// Starts amp-server with `args` and `--listen 127.0.0.1:<free port>` and waits (at most
  /// 15 s) for its `listening` log line. Tries another port when the one chosen was taken
  /// meanwhile. @throws std::runtime_error with its stderr when it does not come up.
  static server_process start(std::vector<std::string> args);

  ~server_process();
  server_process(server_process&& other) noexcept;
  server_process& operator=(server_process&&) = delete;
  server_process(const server_process&) = delete;

  std::uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  /// "ws://127.0.0.1:PORT/amp" (or "wss://" with `tls`).
  std::string url(bool tls = false) const;

  /// Everything written to stderr (the log) so far.
  std::string log() const;
  /// Waits (at most `limit`) until the log holds `text`.
  bool wait_for_log(const std::string& text,
                    std::chrono::milliseconds limit = std::chrono::seconds(10)) const;

  void signal(int sig) const;
  /// Starts the server again with the same command line on the same port, after a SIGKILL if
  /// it still runs, and waits (at most 15 s) for its `listening` log line. log() then shows
  /// the new run; the earlier runs' logs stay in its directory as stderr.1, stderr.2, ….
  /// @throws std::runtime_error with its stderr when it does not come up (e.g. the port was
  ///         taken by another process meanwhile).
  void restart();
  /// Waits (at most `limit`) for the process to exit; its exit status (128 + signal when a
  /// signal ended it), or nothing on timeout.
  std::optional<int> wait_exit(std::chrono::milliseconds limit);
  /// The resident set size of the process in bytes (from /proc), 0 when unknown.
  std::uint64_t resident_bytes() const;

 private:
  server_process() = default;
  void kill_now() noexcept;
  // Spawns with args_ and waits for `listening`: true when it listens; false (the process
  // gone, pid_ -1) otherwise.
  bool spawn_and_wait();

  std::filesystem::path dir_;
  std::filesystem::path out_path_;
  std::filesystem::path err_path_;
  std::vector<std::string> args_;  // the command line, --listen included
  int runs_ = 0;                   // processes started so far
  std::uint16_t port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace amp::testing
