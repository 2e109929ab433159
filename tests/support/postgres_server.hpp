#pragma once

/// Test support: a real PostgreSQL server (Debian's `postgresql` package) for integration
/// tests, as nats_server is for NATS: `initdb` in a fresh temporary directory, `postgres` on
/// a free loopback port, trust authentication for the user `amp`, everything removed with the
/// object. When the test runs as root the server runs as the user `postgres` (which the
/// package creates): PostgreSQL refuses to run as root.
///
/// The binaries are taken from $AMP_PG_BIN if set, else the newest
/// /usr/lib/postgresql/<version>/bin. Not thread-safe: use an object from one thread, one
/// that outlives the server (the child dies with the thread that started it).

#include <sys/types.h>

#include <filesystem>
#include <string>

namespace amp::testing {

class postgres_server {
 public:
  struct options {
    /// `fsync` of the server: off makes commits cheaper where durability across a crash of
    /// the machine is not what the test is about.
    bool fsync = true;
  };

  /// Runs initdb and starts the server; waits until it accepts a connection (at most 30 s).
  /// @throws std::runtime_error with the log when it does not come up.
  static postgres_server start(options opts);
  static postgres_server start() { return start(options{}); }

  ~postgres_server();
  postgres_server(postgres_server&& other) noexcept;
  postgres_server& operator=(postgres_server&&) = delete;
  postgres_server(const postgres_server&) = delete;

  /// `host=127.0.0.1 port=P dbname=postgres user=amp`.
  std::string dsn() const;
  int port() const { return port_; }

  /// A fast shutdown (SIGINT: connections are cut, the data kept); waits for the exit.
  void stop();
  /// Starts it again on the same port and data; waits until it accepts a connection.
  void restart();
  bool running() const { return pid_ > 0; }
  /// The server's log so far.
  std::string log() const;

 private:
  postgres_server() = default;
  void spawn_and_wait();

  std::filesystem::path dir_;
  std::string bin_;
  options opts_{};
  int port_ = 0;
  pid_t pid_ = -1;
  int runs_ = 0;
};

}  // namespace amp::testing
