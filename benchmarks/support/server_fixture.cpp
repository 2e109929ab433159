#include "support/server_fixture.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
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
    : server_process(server_settings{.nats_url = nats_url,
                                     .port = port,
                                     .name = name,
                                     .extra_config = {},
                                     .nats_options = {},
                                     .extra_args = {}}) {}

server_process::server_process(server_settings s) : port_(s.port) {
  dir_ = std::filesystem::temp_directory_path() / fmt::format("{}-{}", s.name, ::getpid());
  std::filesystem::create_directories(dir_);
  auto config = dir_ / "config.json";
  std::ofstream(config) << fmt::format(
      R"({{"listen":"127.0.0.1:{}",{}{}"auth":{{"secret":"{}"}},)"
      R"("limits":{{"max_sessions":100000}},)"
      R"("policy":{{"default":{{"rate":{{"per_s":1000000,"burst":1000000,"bytes_per_s":1e12}},)"
      R"("ops":{{"per_s":1e9,"burst":1e9}}}}}}}})",
      s.port,
      s.nats_url.empty() ? ""
                         : fmt::format(R"("nats":{{"url":"{}"{}}},)", s.nats_url, s.nats_options),
      s.extra_config, k_secret);
  auto log = (dir_ / "server.log").string();
  const char* chosen = std::getenv("AMP_BENCH_SERVER");
  std::string path = chosen && *chosen ? chosen : AMP_SERVER_PATH;
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

bool expected_refusal(const amp::error& e) {
  return e.code() == amp::errc::conflict || e.code() == amp::errc::not_found ||
         e.code() == amp::errc::lease_lost;
}

heartbeats::heartbeats(amp::client& w)
    : thread_([this, &w] {
        auto every = std::chrono::seconds(std::max(1, w.heartbeat_s()));
        std::unique_lock lock(mu_);
        while (!cv_.wait_for(lock, every, [this] { return stop_; })) {
          lock.unlock();
          if (auto r = w.heartbeat(); !r) {
            std::fprintf(stderr, "heartbeat: %s\n", r.error().to_string().c_str());
          }
          lock.lock();
        }
      }) {}

heartbeats::~heartbeats() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void countdown::done() {
  std::lock_guard lock(mu);
  if (--left == 0) cv.notify_all();
}

void countdown::abort(std::string why) {
  std::lock_guard lock(mu);
  if (aborted.empty()) aborted = std::move(why);
  cv.notify_all();
}

std::string countdown::unfinished() {
  std::lock_guard lock(mu);
  return fmt::format("{} left{}{}", left, aborted.empty() ? "" : "; ", aborted);
}

bool countdown::wait(std::chrono::seconds limit) {
  std::unique_lock lock(mu);
  cv.wait_for(lock, limit, [&] { return left <= 0 || !aborted.empty(); });
  return left <= 0;
}

}  // namespace amp::bench
