#include "support/server_fixture.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "amp/gateway/auth.hpp"

namespace amp::bench {

using namespace std::chrono_literals;

server_process::server_process(const std::string& nats_url, std::uint16_t port,
                               const std::string& name)
    : server_process(server_settings{
          .nats_url = nats_url, .port = port, .name = name, .extra_config = {}, .extra_args = {}}) {
}

server_process::server_process(server_settings s) : port_(s.port) {
  dir_ = std::filesystem::temp_directory_path() / fmt::format("{}-{}", s.name, ::getpid());
  std::filesystem::create_directories(dir_);
  auto config = dir_ / "config.json";
  std::ofstream(config) << fmt::format(
      R"({{"listen":"127.0.0.1:{}",{}{}"auth":{{"secret":"{}"}},)"
      R"("limits":{{"max_sessions":100000}},)"
      R"("policy":{{"default":{{"rate":{{"per_s":1000000,"burst":1000000,"bytes_per_s":1e12}}}}}}}})",
      s.port, s.nats_url.empty() ? "" : fmt::format(R"("nats":{{"url":"{}"}},)", s.nats_url),
      s.extra_config, k_secret);
  auto log = (dir_ / "server.log").string();
  std::string path = AMP_SERVER_PATH;
  std::vector<std::string> args = {path, "--config", config.string()};
  args.insert(args.end(), s.extra_args.begin(), s.extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) throw std::runtime_error("cannot open " + log + ": " + std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child == 0) {
    // Only async-signal-safe calls until exec: the benchmark may have other threads.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(log_fd, STDERR_FILENO);
    ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(log_fd);
  if (child < 0) throw std::runtime_error("cannot start " + path + ": fork failed");
  pid_ = child;
}

server_process::~server_process() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    // With thousands of connections the closing handshakes take a few seconds.
    auto deadline = std::chrono::steady_clock::now() + 20s;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string server_process::url() const {
  return fmt::format("ws://127.0.0.1:{}/amp", port_);
}

bool server_process::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == 0) return true;
  pid_ = -1;
  return false;
}

std::string server_process::log_tail(std::size_t lines) const {
  std::ifstream in(dir_ / "server.log");
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  std::string out;
  for (auto& l : tail) out += l + "\n";
  return out;
}

std::string token(const std::string& sub, const std::string& ns) {
  return amp::mint_token(
             {.sub = sub,
              .ns = ns,
              .exp = std::chrono::system_clock::now() + 1h,
              .amp_json =
                  R"({"send":["*"],"submit":["*"],"work":["*"],"publish":[">"],"subscribe":[">"]})"},
             amp::jwt_alg::hs256, k_secret)
      .value();
}

std::unique_ptr<amp::client> connect(const std::string& url, const std::string& sub,
                                     const std::string& ns) {
  for (int attempt = 0;; ++attempt) {
    amp::client_options o;
    o.url = url;
    o.token = token(sub, ns);
    o.request_timeout = 60s;
    auto c = amp::client::connect(o);
    if (c) return std::move(*c);
    if (attempt > 100) throw std::runtime_error("cannot connect: " + c.error().to_string());
    std::this_thread::sleep_for(50ms);
  }
}

void countdown::done() {
  std::lock_guard lock(mu);
  if (--left == 0) cv.notify_all();
}

bool countdown::wait(std::chrono::seconds limit) {
  std::unique_lock lock(mu);
  return cv.wait_for(lock, limit, [&] { return left <= 0; });
}

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
