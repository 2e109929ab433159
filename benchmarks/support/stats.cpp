#include "support/stats.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

namespace amp::bench {

summary summarize(std::vector<double> v) {
  summary s;
  s.runs = v;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = v[v.size() / 2];
  return s;
}

std::string json_of(const summary& s) {
  std::string runs;
  for (auto r : s.runs) runs += (runs.empty() ? "" : ",") + fmt::format("{:.2f}", r);
  return fmt::format(R"({{"min":{:.2f},"median":{:.2f},"max":{:.2f},"runs":[{}]}})", s.min,
                     s.median, s.max, runs);
}

std::string read_first_line(const char* path, std::string_view prefix) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (prefix.empty() || line.rfind(prefix, 0) == 0) return line;
  }
  return {};
}

std::string machine_json(const std::string& loadavg_before) {
  auto cpu = read_first_line("/proc/cpuinfo", "model name");
  return fmt::format(R"({{"cpus":{},"cpu":"{}","loadavg_before":"{}","loadavg_after":"{}"}})",
                     std::thread::hardware_concurrency(),
                     cpu.substr(cpu.find(':') == std::string::npos ? 0 : cpu.find(':') + 2),
                     loadavg_before, read_first_line("/proc/loadavg"));
}

std::uint64_t raise_fd_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<std::uint64_t>(limit.rlim_cur);
}

long rss_kib(pid_t pid) {
  auto path = fmt::format("/proc/{}/status", pid);
  auto line = read_first_line(path.c_str(), "VmRSS:");
  if (line.empty()) return -1;
  return std::strtol(line.c_str() + 6, nullptr, 10);
}

double cpu_seconds(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  std::getline(in, stat);  // one line
  // The command name may hold spaces: the fields are counted after its closing parenthesis.
  auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  long utime = 0, stime = 0;
  // After the name: state (3) … utime is field 14, stime 15.
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::strtol(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtol(field.c_str(), nullptr, 10);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double context_switches(pid_t pid) {
  std::error_code ec;
  std::filesystem::directory_iterator threads(fmt::format("/proc/{}/task", pid), ec);
  if (ec) return -1;
  double sum = 0;
  for (const auto& t : threads) {
    auto line = read_first_line((t.path() / "status").c_str(), "voluntary_ctxt_switches:");
    if (!line.empty()) sum += std::strtod(line.c_str() + line.find(':') + 1, nullptr);
  }
  return sum;
}

double server_in_msgs(int http_port) {
  if (http_port <= 0) return -1;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(http_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string text;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::string req = "GET /varz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t got; (got = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
        text.append(buf, static_cast<std::size_t>(got));
      }
    }
  }
  ::close(fd);
  auto at = text.find("\"in_msgs\":");
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + 10, nullptr);
}

double cpu_seconds_self() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double context_switches_self() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_nvcsw);
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  auto m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double min_of(const std::vector<double>& v) {
  return v.empty() ? std::nan("") : *std::min_element(v.begin(), v.end());
}

double max_of(const std::vector<double>& v) {
  return v.empty() ? std::nan("") : *std::max_element(v.begin(), v.end());
}

std::string json_number(double v, int decimals) {
  if (std::isnan(v) || std::isinf(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown";
}

std::string now_utc() {
  std::time_t now = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::vector<int> int_list(const std::string& list) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos < list.size()) {
    auto comma = list.find(',', pos);
    out.push_back(std::stoi(list.substr(pos, comma - pos)));
    pos = comma == std::string::npos ? list.size() : comma + 1;
  }
  return out;
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  auto i = static_cast<std::size_t>(p * static_cast<double>(sorted.size() - 1));
  return sorted[i];
}

std::int64_t ns_since(std::chrono::steady_clock::time_point origin) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              origin)
      .count();
}

}  // namespace amp::bench
