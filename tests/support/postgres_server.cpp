#include "support/postgres_server.hpp"

#include <libpq-fe.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <stdexcept>
#include <thread>
#include <vector>

#include "support/nats_server.hpp"
#include "support/process.hpp"

namespace amp::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

std::string binaries() {
  if (const char* env = std::getenv("AMP_PG_BIN"); env && *env) return env;
  std::string best;
  int best_version = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    const auto name = entry.path().filename().string();
    int version = -1;
    try {
      version = std::stoi(name);
    } catch (const std::exception&) {
      continue;
    }
    if (version > best_version && fs::exists(entry.path() / "bin" / "postgres")) {
      best_version = version;
      best = (entry.path() / "bin").string();
    }
  }
  if (best.empty()) {
    throw std::runtime_error(
        "postgres_server: no /usr/lib/postgresql/*/bin/postgres (install the postgresql "
        "package, or set AMP_PG_BIN)");
  }
  return best;
}

spawn_options as_server_user() {
  if (::geteuid() != 0) return {};
  const passwd* pw = ::getpwnam("postgres");
  if (!pw)
    throw std::runtime_error("postgres_server: running as root and there is no user postgres");
  return {.user = spawn_options::identity{pw->pw_uid, pw->pw_gid}, .cwd = {}};
}

void give_to(const fs::path& path, const spawn_options& as) {
  if (as.user && ::chown(path.c_str(), as.user->uid, as.user->gid) != 0) {
    throw std::runtime_error("postgres_server: cannot chown " + path.string());
  }
}

}  // namespace

postgres_server postgres_server::start(options opts) {
  postgres_server s;
  s.opts_ = opts;
  s.bin_ = binaries();
  s.dir_ = fs::temp_directory_path() /
           ("amp-pg-" + std::to_string(::getpid()) + "-" + std::to_string(free_port()));
  fs::create_directories(s.dir_ / "data");
  fs::create_directories(s.dir_ / "sock");
  const auto as = as_server_user();
  // The server's user must reach its folders inside.
  fs::permissions(s.dir_, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  give_to(s.dir_ / "data", as);
  give_to(s.dir_ / "sock", as);
  fs::permissions(s.dir_ / "data", fs::perms::owner_all);
  const auto pid = spawn({s.bin_ + "/initdb", "-D", (s.dir_ / "data").string(), "-U", "amp",
                          "--auth=trust", "-E", "UTF8", "--no-sync", "--locale=C"},
                         s.dir_ / "initdb.out", s.dir_ / "initdb.err", as);
  const auto status = reap(pid, 120s);
  if (!status || *status != 0) {
    if (!status) {
      ::kill(pid, SIGKILL);
      reap(pid, 5s);
    }
    const auto why = read_file(s.dir_ / "initdb.err") + read_file(s.dir_ / "initdb.out");
    throw std::runtime_error("postgres_server: initdb failed: " + why);
  }
  for (int attempt = 1;; ++attempt) {
    s.port_ = free_port();
    try {
      s.spawn_and_wait();
      return s;
    } catch (const std::runtime_error&) {
      if (attempt == 3) throw;
    }
  }
}

void postgres_server::spawn_and_wait() {
  ++runs_;
  const auto as = as_server_user();
  pid_ = spawn({bin_ + "/postgres", "-D", (dir_ / "data").string(), "-p", std::to_string(port_),
                "-k", (dir_ / "sock").string(), "-c", "listen_addresses=127.0.0.1", "-c",
                std::string("fsync=") + (opts_.fsync ? "on" : "off"), "-c", "max_connections=50"},
               dir_ / "postgres.out", dir_ / ("postgres.err." + std::to_string(runs_)), as);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  const auto conninfo = dsn() + " connect_timeout=2";
  for (;;) {
    PGconn* c = PQconnectdb(conninfo.c_str());
    const bool ok = PQstatus(c) == CONNECTION_OK;
    PQfinish(c);
    if (ok) return;
    if (reap(pid_, 0ms) || std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      reap(pid_, 5s);
      pid_ = -1;
      throw std::runtime_error("postgres_server: did not come up: " + log());
    }
    std::this_thread::sleep_for(50ms);
  }
}

postgres_server::~postgres_server() {
  if (dir_.empty()) return;
  if (pid_ > 0) {
    ::kill(pid_, SIGQUIT);  // immediate shutdown: the data goes anyway
    if (!reap(pid_, 10s)) {
      ::kill(pid_, SIGKILL);
      reap(pid_, 5s);
    }
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

postgres_server::postgres_server(postgres_server&& other) noexcept
    : dir_(std::move(other.dir_)),
      bin_(std::move(other.bin_)),
      opts_(other.opts_),
      port_(other.port_),
      pid_(other.pid_),
      runs_(other.runs_) {
  other.dir_.clear();
  other.pid_ = -1;
}

std::string postgres_server::dsn() const {
  return "host=127.0.0.1 port=" + std::to_string(port_) + " dbname=postgres user=amp";
}

void postgres_server::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGINT);
  if (!reap(pid_, 30s)) {
    ::kill(pid_, SIGKILL);
    reap(pid_, 5s);
  }
  pid_ = -1;
}

void postgres_server::restart() {
  stop();
  spawn_and_wait();
}

std::string postgres_server::log() const {
  return read_file(dir_ / ("postgres.err." + std::to_string(runs_)));
}

}  // namespace amp::testing
