#pragma once

// What every benchmark program may share, with no server in it: min / median / max
// summaries in JSON, machine facts, percentiles, readers of /proc, command-line lists.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace amp::bench {

/// A figure over the runs.
struct summary {
  double min = 0, median = 0, max = 0;
  std::vector<double> runs;
};
summary summarize(std::vector<double> v);
/// `{"min":…,"median":…,"max":…,"runs":[…]}`, two decimals.
std::string json_of(const summary& s);

/// The first line of a file that starts with `prefix` (any line when empty); empty when
/// none.
std::string read_first_line(const char* path, std::string_view prefix = {});
/// `{"cpus":N,"cpu":"model","loadavg_before":"…","loadavg_after":"<now>"}`.
std::string machine_json(const std::string& loadavg_before);

/// Raises this process's soft limit of open files to the hard limit; returns the limit.
std::uint64_t raise_fd_limit();
/// VmRSS of a process in KiB (from /proc/PID/status); -1 when unreadable.
long rss_kib(pid_t pid);
/// utime + stime of a process in seconds (from /proc/PID/stat); -1 when unreadable.
double cpu_seconds(pid_t pid);

/// Voluntary context switches of a process, summed over its live threads (from
/// /proc/PID/task/*/status): a count of thread hand-offs; -1 when unreadable.
double context_switches(pid_t pid);
/// `in_msgs` of a nats-server's /varz on `http_port` (the messages clients sent it:
/// publishes, KV writes and gets, acks, pull requests, API calls); -1 when it does not
/// answer or `http_port` is not positive.
double server_in_msgs(int http_port);

/// utime + stime of this process in seconds (getrusage, every thread).
double cpu_seconds_self();
/// Voluntary context switches of this process: a count of thread hand-offs.
double context_switches_self();

/// The median (mean of the middle two for an even count), least and greatest; NaN when empty.
double median(std::vector<double> v);
double min_of(const std::vector<double>& v);
double max_of(const std::vector<double>& v);
/// `v` with `decimals` decimals, `null` for NaN or infinity.
std::string json_number(double v, int decimals);
/// `s` quoted for JSON (quotes and backslashes escaped; no control characters expected).
std::string json_string(const std::string& s);
/// The CPU model from /proc/cpuinfo, "unknown" when unreadable.
std::string cpu_model();
/// The time now, RFC 3339 UTC to the second.
std::string now_utc();
/// "a,b,,c" as {"a","b","c"}.
std::vector<std::string> split_list(const std::string& s);

/// "1,8,64" as numbers (a command-line list); `std::invalid_argument` for a bad item.
std::vector<int> int_list(const std::string& list);

/// Percentile `p` (0..1) of sorted values (nearest rank below, as the first benchmarks did).
double percentile(const std::vector<double>& sorted, double p);

/// Nanoseconds of the steady clock since `origin`.
std::int64_t ns_since(std::chrono::steady_clock::time_point origin);

}  // namespace amp::bench
