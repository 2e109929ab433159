#include "server/server_process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "support/nats_server.hpp"
#include "support/process.hpp"

#ifndef AMP_SERVER_PATH
#error "AMP_SERVER_PATH must name the amp-server binary"
#endif

namespace amp::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> with_binary(const std::vector<std::string>& args) {
  std::vector<std::string> all{server_process::binary()};
  all.insert(all.end(), args.begin(), args.end());
  return all;
}

}  // namespace

std::string server_process::binary() {
  return AMP_SERVER_PATH;
}

server_process::finished server_process::run(const std::vector<std::string>& args,
                                             std::chrono::milliseconds limit) {
  temp_dir dir;
  const pid_t pid = spawn(with_binary(args), dir.path() / "stdout", dir.path() / "stderr");
  finished result;
  if (auto status = reap(pid, limit)) {
    result.status = *status;
  } else {
    ::kill(pid, SIGKILL);
    reap(pid, 5s);
  }
  result.out = read_file(dir.path() / "stdout");
  result.err = read_file(dir.path() / "stderr");
  return result;
}

server_process server_process::start(std::vector<std::string> args) {
  std::string last_log;
  for (int attempt = 0; attempt < 3; ++attempt) {
    server_process p;
    std::random_device random;
    p.dir_ = fs::temp_directory_path() /
             ("amp-server-run-" + std::to_string(::getpid()) + "-" + std::to_string(random()));
    fs::create_directories(p.dir_);
    p.out_path_ = p.dir_ / "stdout";
    p.err_path_ = p.dir_ / "stderr";
    p.port_ = static_cast<std::uint16_t>(free_port());
    p.args_ = args;
    p.args_.push_back("--listen");
    p.args_.push_back("127.0.0.1:" + std::to_string(p.port_));
    if (p.spawn_and_wait()) return p;
    last_log = p.log();
    // A port taken between free_port() and the bind: try another one.
    if (last_log.find("cannot listen") == std::string::npos) break;
  }
  throw std::runtime_error("amp-server did not start listening; its stderr:\n" + last_log);
}

bool server_process::spawn_and_wait() {
  ++runs_;
  pid_ = spawn(with_binary(args_), out_path_, err_path_);
  const auto deadline = std::chrono::steady_clock::now() + 15s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (log().find("\"event\":\"listening\"") != std::string::npos) return true;
    if (auto status = reap(pid_, 0ms)) {
      pid_ = -1;
      return false;
    }
    std::this_thread::sleep_for(20ms);
  }
  kill_now();
  return false;
}

void server_process::restart() {
  kill_now();
  std::error_code ec;
  fs::rename(err_path_, dir_ / ("stderr." + std::to_string(runs_)), ec);
  fs::rename(out_path_, dir_ / ("stdout." + std::to_string(runs_)), ec);
  if (!spawn_and_wait()) {
    throw std::runtime_error("amp-server did not start listening again on port " +
                             std::to_string(port_) + "; its stderr:\n" + log());
  }
}

server_process::~server_process() {
  kill_now();
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

server_process::server_process(server_process&& other) noexcept
    : dir_(std::exchange(other.dir_, {})),
      out_path_(std::move(other.out_path_)),
      err_path_(std::move(other.err_path_)),
      args_(std::move(other.args_)),
      runs_(other.runs_),
      port_(other.port_),
      pid_(std::exchange(other.pid_, -1)) {}

void server_process::kill_now() noexcept {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  reap(pid_, 5s);
  pid_ = -1;
}

std::string server_process::url(bool tls) const {
  return std::string(tls ? "wss" : "ws") + "://127.0.0.1:" + std::to_string(port_) + "/amp";
}

std::string server_process::log() const {
  return read_file(err_path_);
}

bool server_process::wait_for_log(const std::string& text, std::chrono::milliseconds limit) const {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (log().find(text) != std::string::npos) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
}

void server_process::signal(int sig) const {
  if (pid_ > 0) ::kill(pid_, sig);
}

std::optional<int> server_process::wait_exit(std::chrono::milliseconds limit) {
  if (pid_ <= 0) return std::nullopt;
  auto status = reap(pid_, limit);
  if (status) pid_ = -1;
  return status;
}

std::uint64_t server_process::resident_bytes() const {
  if (pid_ <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      std::uint64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

}  // namespace amp::testing
