#pragma once

// What the benchmarks through amp-server share (amp-bench-tasks, amp-bench-messaging,
// amp-bench-sessions): amp-server as a child process, tokens, amp::client connections with
// retry, a countdown; and through support/stats.hpp, summaries and readers of /proc.

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "amp/client.hpp"
#include "support/stats.hpp"

namespace amp::bench {

/// The HS256 secret amp-server is configured with.
inline constexpr std::string_view k_secret = "bench-secret-bench-secret-bench-secret";

/// How amp-server is started.
struct server_settings {
  /// `nats://…`; empty: the memory transport.
  std::string nats_url;
  std::uint16_t port = 0;
  /// The temporary directory is `<tmp>/<name>-<pid>`.
  std::string name = "amp-bench";
  /// Configuration members added to the generated configuration, each followed by a comma
  /// (`"heartbeat_s":10,`); they must not repeat `listen`, `nats`, `auth`, `limits` or
  /// `policy`.
  std::string extra_config;
  /// Members added to the generated `nats` object, each preceded by a comma
  /// (`,"replicas":3`); only with `nats_url`.
  std::string nats_options;
  /// Command-line arguments added after `--config FILE` (`--io-threads`, `--workers` …).
  std::vector<std::string> extra_args;
};

/// amp-server as a child process, on a free port, with its own configuration file: HS256
/// with `k_secret`, `max_sessions` 100,000 and rate limits (messages, bytes and op tokens)
/// far above any benchmark. The binary is the amp-server built with the benchmark, or the
/// one the environment variable `AMP_BENCH_SERVER` names (to compare two builds with one
/// benchmark binary). Its stderr goes to a log file in its temporary directory. The child
/// gets SIGKILL if the thread that started it exits (start it from the main thread); the
/// destructor stops it with SIGTERM and removes the directory.
class server_process {
 public:
  server_process(const std::string& nats_url, std::uint16_t port,
                 const std::string& name = "amp-bench");
  explicit server_process(server_settings settings);
  ~server_process();
  server_process(const server_process&) = delete;
  server_process& operator=(const server_process&) = delete;

  /// `ws://127.0.0.1:PORT/amp`.
  std::string url() const;
  pid_t pid() const noexcept { return pid_; }
  /// True while the child runs (reaps it if it exited).
  bool running();
  /// The last `lines` lines of the server's log.
  std::string log_tail(std::size_t lines = 20) const;

 private:
  std::filesystem::path dir_;
  std::uint16_t port_;
  pid_t pid_ = -1;
};

/// A token for `sub` in `ns`, valid for an hour, granting everything but admin.
std::string token(const std::string& sub, const std::string& ns);

/// Connects an amp::client (request timeout 60 s), retrying for about 5 s while the server
/// is not up yet. Throws `std::runtime_error` when it cannot.
std::unique_ptr<amp::client> connect(const std::string& url, const std::string& sub,
                                     const std::string& ns);

/// True for a refusal of `claim` or `complete` a task run can meet without being wrong:
/// the offer moved on, or the lease did (the task is offered again). Anything else
/// (`rate_limited`, say) means the measurement is not what it claims.
bool expected_refusal(const amp::error& e);

/// Heartbeats a client every `heartbeat_s` (at least every second) on a thread of its own,
/// from construction to destruction: a worker's registry entry lapses after
/// `registry_ttl_s` without one, and then it is offered nothing. A failed heartbeat is
/// reported on stderr and the next one tried on time.
class heartbeats {
 public:
  explicit heartbeats(amp::client& w);
  ~heartbeats();
  heartbeats(const heartbeats&) = delete;
  heartbeats& operator=(const heartbeats&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

/// Counts down, and wakes a waiter at zero.
struct countdown {
  std::mutex mu;
  std::condition_variable cv;
  long left = 0;
  std::string aborted;  ///< why the run cannot finish; empty while it can
  void done();
  /// Ends the wait at once: what the run waits for will not come (the first reason stays).
  void abort(std::string why);
  /// True when everything counted down within `limit`; false on timeout or abort.
  bool wait(std::chrono::seconds limit);
  /// What is left, and why the run was aborted if it was: "12 left; claim: rate_limited …".
  std::string unfinished();
};

}  // namespace amp::bench
