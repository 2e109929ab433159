#include "support/nats_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

namespace amp::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

struct nats_server::cluster_config {
  std::string name;
  int port = -1;
  std::vector<int> routes;
};

namespace {

constexpr int single_ready_timeout_ms = 10'000;
constexpr int cluster_ready_timeout_ms = 20'000;
constexpr int stop_timeout_ms = 5'000;
constexpr int start_attempts = 3;
constexpr const char* dir_prefix = "amp-nats-";

/// A start that failed; `port_taken` says whether another port (or a later try) may help.
struct start_failure : std::runtime_error {
  start_failure(const std::string& what, bool taken)
      : std::runtime_error(what), port_taken(taken) {}
  bool port_taken;
};

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

/// Binds `count` distinct loopback ports at once (so none repeats), then releases them.
std::vector<int> free_ports(int count) {
  std::vector<int> fds;
  std::vector<int> ports;
  auto close_all = [&] {
    for (int fd : fds) ::close(fd);
  };
  for (int i = 0; i < count; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      close_all();
      throw_errno("free_port: socket");
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      int saved = errno;
      close_all();
      errno = saved;
      throw_errno("free_port: bind");
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  close_all();
  return ports;
}

bool tcp_accepts(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

/// One connection + js_GetAccountInfo; empty on success, else why not.
std::string probe_jetstream(const std::string& url) {
  natsOptions* opts = nullptr;
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  jsAccountInfo* info = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  natsStatus s = natsOptions_Create(&opts);
  if (s == NATS_OK) s = natsOptions_SetURL(opts, url.c_str());
  if (s == NATS_OK) s = natsOptions_SetTimeout(opts, 2000);
  if (s == NATS_OK) s = natsOptions_SetMaxReconnect(opts, 0);
  if (s == NATS_OK) s = natsOptions_SetAllowReconnect(opts, false);
  if (s == NATS_OK) s = natsConnection_Connect(&nc, opts);
  if (s == NATS_OK) {
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 1000;
    s = natsConnection_JetStream(&js, nc, &jo);
  }
  if (s == NATS_OK) s = js_GetAccountInfo(&info, js, nullptr, &jerr);
  std::string why;
  if (s != NATS_OK) {
    why = natsStatus_GetText(s);
    if (jerr != 0) why += " (JetStream error " + std::to_string(static_cast<int>(jerr)) + ")";
  }
  jsAccountInfo_Destroy(info);
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  natsOptions_Destroy(opts);
  return why;
}

std::string read_from(const std::string& path, std::uintmax_t offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(static_cast<std::streamoff>(offset));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::uintmax_t file_size_or_zero(const std::string& path) {
  std::error_code ec;
  auto size = fs::file_size(path, ec);
  return ec ? 0 : size;
}

std::string last_lines(const std::string& path, std::size_t lines) {
  constexpr std::uintmax_t window = 64 * 1024;
  auto size = file_size_or_zero(path);
  std::string text = read_from(path, size > window ? size - window : 0);
  std::size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') --pos;
  for (std::size_t n = 0; n < lines && pos > 0; ++n) {
    auto nl = text.rfind('\n', pos - 1);
    if (nl == std::string::npos) {
      pos = 0;
      break;
    }
    pos = nl;
  }
  if (pos < text.size() && text[pos] == '\n') ++pos;
  return text.substr(pos);
}

std::string server_binary() {
  if (const char* env = std::getenv("AMP_NATS_SERVER"); env != nullptr && *env != '\0') return env;
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::string_view rest = path;
    while (!rest.empty()) {
      auto colon = rest.find(':');
      std::string dir(rest.substr(0, colon));
      rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
      if (dir.empty()) continue;
      std::string candidate = dir + "/nats-server";
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  // The Debian package installs to /usr/sbin, which a normal user's PATH lacks.
  for (const char* candidate : {"/usr/sbin/nats-server", "/usr/bin/nats-server"})
    if (::access(candidate, X_OK) == 0) return candidate;
  return "nats-server";
}

bool process_gone(pid_t pid) {
  if (::kill(pid, 0) == -1 && errno == ESRCH) return true;
  // A dead process whose parent does not reap it stays a zombie.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

/// Removes amp-nats-<pid>-* directories of ours whose test process is gone (it was killed
/// before its destructors ran). Once per process.
void sweep_stale_dirs(const fs::path& base) {
  static bool swept = false;
  if (swept) return;
  swept = true;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(base, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(dir_prefix, 0) != 0) continue;
    std::string rest = name.substr(std::strlen(dir_prefix));
    auto dash = rest.find('-');
    if (dash == std::string::npos || dash == 0) continue;
    if (!std::all_of(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(dash),
                     [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    pid_t owner = static_cast<pid_t>(std::stol(rest.substr(0, dash)));
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid())
      continue;
    if (owner == ::getpid() || !process_gone(owner)) continue;
    std::error_code ignored;
    fs::remove_all(entry.path(), ignored);
  }
}

std::string make_temp_dir() {
  fs::path base = fs::temp_directory_path();
  sweep_stale_dirs(base);
  std::string templ =
      (base / (std::string(dir_prefix) + std::to_string(::getpid()) + "-XXXXXX")).string();
  if (::mkdtemp(templ.data()) == nullptr) throw_errno("nats_server: mkdtemp " + templ);
  return templ;
}

bool sleep_until_or(steady::time_point deadline, std::chrono::milliseconds step) {
  auto now = steady::now();
  if (now >= deadline) return false;
  std::this_thread::sleep_for(std::min<steady::duration>(step, deadline - now));
  return true;
}

}  // namespace

int free_port() {
  return free_ports(1).front();
}

// ---------------------------------------------------------------------------------------------
// nats_server

nats_server nats_server::prepare(const std::string& name, int port, const options& opts,
                                 const cluster_config* cluster) {
  nats_server server;
  server.dir_ = make_temp_dir();
  server.store_dir_ = server.dir_ + "/store";
  server.config_path_ = server.dir_ + "/nats.conf";
  server.log_path_ = server.dir_ + "/nats.log";
  server.stderr_path_ = server.dir_ + "/stderr.log";
  server.name_ = name;
  server.port_ = port;
  server.jetstream_ = opts.jetstream;
  server.clustered_ = cluster != nullptr;

  std::ostringstream conf;
  conf << "server_name: \"" << name << "\"\n"
       << "listen: 127.0.0.1:" << port << "\n"
       << "log_file: \"" << server.log_path_ << "\"\n"
       << "logtime: true\n";
  if (opts.jetstream) {
    conf << "jetstream {\n"
         << "  store_dir: \"" << server.store_dir_ << "\"\n"
         << "  max_memory_store: 256MB\n"
         << "  max_file_store: 2GB\n"
         << "}\n";
  }
  if (cluster != nullptr) {
    conf << "cluster {\n"
         << "  name: \"" << cluster->name << "\"\n"
         << "  listen: 127.0.0.1:" << cluster->port << "\n"
         << "  routes: [\n";
    for (int route : cluster->routes) conf << "    nats-route://127.0.0.1:" << route << "\n";
    conf << "  ]\n"
         << "}\n";
  }
  if (!opts.extra_config.empty()) conf << opts.extra_config << "\n";

  std::ofstream out(server.config_path_);
  out << conf.str();
  out.close();
  if (!out) throw std::runtime_error("nats_server: cannot write " + server.config_path_);
  return server;
}

void nats_server::spawn() {
  std::string binary = server_binary();
  std::string flag = "-c";
  std::vector<char*> argv = {binary.data(), flag.data(), config_path_.data(), nullptr};

  log_offset_ = file_size_or_zero(log_path_);
  int err_fd = ::open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (err_fd < 0) throw_errno("nats_server: open " + stderr_path_);
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int exec_pipe[2];
  if (null_fd < 0 || ::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    int saved = errno;
    ::close(err_fd);
    if (null_fd >= 0) ::close(null_fd);
    errno = saved;
    throw_errno("nats_server: pipe");
  }

  pid_t parent = ::getpid();
  pid_t child = ::fork();
  if (child == 0) {
    // Only async-signal-safe calls from here to exec: the test process has other threads.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(err_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    // Whatever else the test has open (sockets of other connections) must not leak.
    ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
    ::execv(argv[0], argv.data());
    int error = errno;
    [[maybe_unused]] auto n = ::write(exec_pipe[1], &error, sizeof error);
    ::_exit(127);
  }
  int fork_errno = errno;
  ::close(exec_pipe[1]);
  ::close(err_fd);
  ::close(null_fd);
  if (child < 0) {
    ::close(exec_pipe[0]);
    errno = fork_errno;
    throw_errno("nats_server: fork");
  }
  int exec_errno = 0;
  ssize_t got;
  do {
    got = ::read(exec_pipe[0], &exec_errno, sizeof exec_errno);
  } while (got < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  pid_ = child;
  if (got > 0) {
    wait_exit(-1);
    throw std::runtime_error("nats_server: cannot execute " + binary + ": " +
                             std::strerror(exec_errno) +
                             " (install nats-server or set AMP_NATS_SERVER)");
  }
}

void nats_server::wait_ready(int timeout_ms) {
  auto deadline = steady::now() + std::chrono::milliseconds(timeout_ms);
  auto fail = [&](const std::string& why) {
    std::string log = log_tail();
    bool port_taken = log.find("address already in use") != std::string::npos;
    if (running()) kill();
    throw start_failure("nats-server " + name_ + " on port " + std::to_string(port_) + " " + why +
                            "; log tail:\n" + log,
                        port_taken);
  };

  // The log line proves that *our* process is listening (not another one on the port).
  for (;;) {
    if (!running()) fail("exited during startup");
    if (read_from(log_path_, log_offset_).find("Server is ready") != std::string::npos &&
        tcp_accepts(port_))
      break;
    if (!sleep_until_or(deadline, 20ms)) fail("did not accept connections in time");
  }
  if (!jetstream_) return;

  for (;;) {
    std::string why = probe_jetstream(url());
    if (why.empty()) break;
    if (!running()) fail("exited during startup");
    if (!sleep_until_or(deadline, 100ms))
      fail("did not answer js_GetAccountInfo in time (last: " + why + ")");
  }
  if (!running()) fail("exited during startup");
}

nats_server nats_server::start(options opts) {
  for (int attempt = 1;; ++attempt) {
    nats_server server = prepare("amp-test", free_port(), opts, nullptr);
    try {
      server.spawn();
      server.wait_ready(single_ready_timeout_ms);
      return server;
    } catch (const start_failure& failure) {
      if (!failure.port_taken || attempt == start_attempts)
        throw std::runtime_error(failure.what());
    }
  }
}

nats_server nats_server::start() {
  return start(options{});
}

nats_server::~nats_server() {
  release();
}

nats_server::nats_server(nats_server&& other) noexcept
    : dir_(std::exchange(other.dir_, {})),
      store_dir_(std::exchange(other.store_dir_, {})),
      config_path_(std::exchange(other.config_path_, {})),
      log_path_(std::exchange(other.log_path_, {})),
      stderr_path_(std::exchange(other.stderr_path_, {})),
      name_(std::exchange(other.name_, {})),
      port_(std::exchange(other.port_, -1)),
      jetstream_(other.jetstream_),
      clustered_(other.clustered_),
      log_offset_(other.log_offset_),
      pid_(std::exchange(other.pid_, -1)) {}

nats_server& nats_server::operator=(nats_server&& other) noexcept {
  if (this != &other) {
    release();
    dir_ = std::exchange(other.dir_, {});
    store_dir_ = std::exchange(other.store_dir_, {});
    config_path_ = std::exchange(other.config_path_, {});
    log_path_ = std::exchange(other.log_path_, {});
    stderr_path_ = std::exchange(other.stderr_path_, {});
    name_ = std::exchange(other.name_, {});
    port_ = std::exchange(other.port_, -1);
    jetstream_ = other.jetstream_;
    clustered_ = other.clustered_;
    log_offset_ = other.log_offset_;
    pid_ = std::exchange(other.pid_, -1);
  }
  return *this;
}

void nats_server::release() noexcept {
  stop();
  if (!dir_.empty()) {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
    dir_.clear();
  }
}

std::string nats_server::url() const {
  return "nats://127.0.0.1:" + std::to_string(port_);
}

void nats_server::signal(int sig) const {
  if (pid_ > 0) ::kill(pid_, sig);
}

bool nats_server::wait_exit(int timeout_ms) {
  auto deadline = steady::now() + std::chrono::milliseconds(timeout_ms);
  while (pid_ > 0) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, timeout_ms < 0 ? 0 : WNOHANG);
    if (r == pid_ || (r < 0 && errno != EINTR)) {
      pid_ = -1;
      break;
    }
    if (r == 0 && !sleep_until_or(deadline, 10ms)) return false;
  }
  return true;
}

bool nats_server::running() const {
  if (pid_ <= 0) return false;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return true;
  pid_ = -1;
  return false;
}

void nats_server::stop() {
  if (pid_ <= 0) return;
  signal(SIGTERM);
  if (!wait_exit(stop_timeout_ms)) kill();
}

void nats_server::kill() {
  if (pid_ <= 0) return;
  signal(SIGKILL);
  wait_exit(-1);
}

void nats_server::restart() {
  stop();
  for (int attempt = 1;; ++attempt) {
    try {
      spawn();
      wait_ready(clustered_ ? cluster_ready_timeout_ms : single_ready_timeout_ms);
      return;
    } catch (const start_failure& failure) {
      // The port is ours to keep; a transient holder (an outgoing connection) may let go.
      if (!failure.port_taken || attempt == start_attempts)
        throw std::runtime_error(failure.what());
      std::this_thread::sleep_for(300ms);
    }
  }
}

std::string nats_server::log_tail(std::size_t lines) const {
  std::string text = last_lines(log_path_, lines);
  std::string err = last_lines(stderr_path_, lines);
  if (!err.empty()) text += "--- stderr ---\n" + err;
  return text;
}

// ---------------------------------------------------------------------------------------------
// nats_cluster

nats_cluster nats_cluster::start(int nodes) {
  if (nodes < 1) throw std::invalid_argument("nats_cluster: need at least one node");
  for (int attempt = 1;; ++attempt) {
    std::vector<int> ports = free_ports(2 * nodes);
    nats_cluster cluster;
    for (int i = 0; i < nodes; ++i) {
      nats_server::cluster_config cc;
      cc.name = "amp-test";
      cc.port = ports[static_cast<std::size_t>(nodes + i)];
      for (int j = 0; j < nodes; ++j)
        if (j != i) cc.routes.push_back(ports[static_cast<std::size_t>(nodes + j)]);
      cluster.nodes_.push_back(nats_server::prepare("n" + std::to_string(i + 1),
                                                    ports[static_cast<std::size_t>(i)], {}, &cc));
    }
    try {
      for (auto& node : cluster.nodes_) node.spawn();
      // wait_ready on every node: each must reach the meta leader through its routes.
      for (auto& node : cluster.nodes_) node.wait_ready(cluster_ready_timeout_ms);
      return cluster;
    } catch (const start_failure& failure) {
      if (!failure.port_taken || attempt == start_attempts)
        throw std::runtime_error(std::string(failure.what()) + "\nall nodes:\n" +
                                 cluster.log_tail());
    }
  }
}

nats_cluster::~nats_cluster() {
  stop_all();
}

nats_cluster& nats_cluster::operator=(nats_cluster&& other) noexcept {
  if (this != &other) {
    stop_all();
    nodes_ = std::move(other.nodes_);
    other.nodes_.clear();
  }
  return *this;
}

void nats_cluster::stop_all() noexcept {
  // SIGTERM to all first, so the nodes shut down in parallel rather than one after another.
  for (auto& node : nodes_) node.signal(SIGTERM);
  for (auto& node : nodes_) node.stop();
  nodes_.clear();
}

std::string nats_cluster::urls() const {
  std::string all;
  for (const auto& u : url_list()) all += (all.empty() ? "" : ",") + u;
  return all;
}

std::vector<std::string> nats_cluster::url_list() const {
  std::vector<std::string> list;
  for (const auto& node : nodes_) list.push_back(node.url());
  return list;
}

nats_server& nats_cluster::node(int i) {
  return nodes_.at(static_cast<std::size_t>(i));
}
const nats_server& nats_cluster::node(int i) const {
  return nodes_.at(static_cast<std::size_t>(i));
}

int nats_cluster::node_index_by_name(const std::string& server_name) const {
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].name() == server_name) return static_cast<int>(i);
  return -1;
}

void nats_cluster::kill(int i) {
  node(i).kill();
}
void nats_cluster::restart(int i) {
  node(i).restart();
}

std::string nats_cluster::log_tail(std::size_t lines) const {
  std::string text;
  for (const auto& node : nodes_) {
    text += "=== " + node.name() + " (" + node.url() + ") ===\n" + node.log_tail(lines);
  }
  return text;
}

}  // namespace amp::testing
