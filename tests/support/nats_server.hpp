#pragma once

/// Test support: real nats-server processes for integration tests.
///
/// Every server is a child process of the test, listens on a free loopback port and keeps its
/// configuration, log and JetStream store in a fresh temporary directory (under $TMPDIR, or
/// /tmp). The objects own the processes: the destructor stops the server (SIGTERM, then SIGKILL
/// after 5 s) and removes the directory, also when a test fails and unwinds. As a safety net the
/// child is started with PR_SET_PDEATHSIG=SIGKILL, so it dies with the test process even if the
/// test is killed. Note that Linux delivers that signal when the *thread* that started the
/// server exits: start servers from a thread that outlives them (the test's own thread).
/// Directories left behind by test processes that were killed are removed by the next start().
///
/// The binary is $AMP_NATS_SERVER if set, else `nats-server` from $PATH, else
/// /usr/sbin/nats-server (where Debian installs it) or /usr/bin/nats-server. The classes are not
/// thread-safe; use each object from one thread.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace amp::testing {

/// A nats-server child process with JetStream, on a free loopback port, data in a fresh temp dir.
class nats_server {
 public:
  struct options {
    /// Writes a `jetstream {}` block; start() then also waits until JetStream answers.
    bool jetstream = true;
    /// Appended verbatim to the generated configuration file. It must not override `listen` or
    /// `log_file`: readiness is read from that log.
    std::string extra_config;
  };

  /// Starts a server and waits until its port accepts TCP connections and, with JetStream,
  /// until `js_GetAccountInfo` succeeds (at most ~10 s). If the port was taken in the meantime
  /// it retries with another port (3 attempts in all).
  /// @throws std::runtime_error with the server's log tail if the server does not come up; no
  ///         process or directory is left behind then.
  static nats_server start(options opts);
  static nats_server start();  // start(options{}): JetStream on, no extra configuration

  /// Stops the server if it runs (SIGTERM, wait up to 5 s, then SIGKILL) and removes the
  /// temporary directory with the store and the log.
  ~nats_server();

  nats_server(nats_server&& other) noexcept;
  nats_server& operator=(nats_server&& other) noexcept;
  nats_server(const nats_server&) = delete;
  nats_server& operator=(const nats_server&) = delete;

  /// `nats://127.0.0.1:PORT`.
  std::string url() const;
  int port() const { return port_; }
  /// The process id while running(), else -1.
  pid_t pid() const { return pid_; }
  /// The JetStream store directory (inside the temporary directory).
  const std::string& store_dir() const { return store_dir_; }
  /// The server's name (`server_name` in its configuration): "n1", "n2"… in a cluster.
  const std::string& name() const { return name_; }

  /// Graceful stop: SIGTERM, wait up to 5 s, then SIGKILL. Keeps the port, the configuration
  /// and the store, so restart() brings the same server back. No-op if not running.
  void stop();
  /// SIGKILL and wait: the server gets no chance to flush or hand over leadership. Keeps the
  /// store. No-op if not running.
  void kill();
  /// Starts the server again on the same port with the same store (stopping it first if it
  /// runs) and waits until it is ready as start() does. A cluster node is ready when JetStream
  /// answers through it, which needs a quorum of running nodes: restart the others first.
  /// @throws std::runtime_error with the log tail if it does not come up (e.g. the port was
  ///         taken by another process in the meantime).
  void restart();
  /// True while the child process exists (reaps it if it exited on its own).
  bool running() const;

  /// The last `lines` lines of the server's log file and of its stderr.
  std::string log_tail(std::size_t lines = 40) const;

 private:
  friend class nats_cluster;
  struct cluster_config;

  nats_server() = default;
  static nats_server prepare(const std::string& name, int port, const options& opts,
                             const cluster_config* cluster);
  void spawn();
  void wait_ready(int timeout_ms);
  void signal(int sig) const;
  bool wait_exit(int timeout_ms);  // < 0: without limit; false on timeout
  void release() noexcept;

  std::string dir_;
  std::string store_dir_;
  std::string config_path_;
  std::string log_path_;
  std::string stderr_path_;
  std::string name_;
  int port_ = -1;
  bool jetstream_ = true;
  bool clustered_ = false;
  std::uintmax_t log_offset_ = 0;  // log size when the current process was spawned
  mutable pid_t pid_ = -1;
};

/// A JetStream cluster on loopback (each node: client port, cluster port, own store), with the
/// same lifetime rules as nats_server. Nodes are named "n1", "n2"… (index 0 is "n1").
class nats_cluster {
 public:
  /// Starts `nodes` servers routed to each other and waits until JetStream answers
  /// `js_GetAccountInfo` through every node, i.e. a meta leader is elected (at most ~20 s).
  /// All ports are chosen before the first node starts; if one was taken meanwhile the whole
  /// cluster is started again on new ports (3 attempts in all).
  /// @throws std::runtime_error with the nodes' log tails on failure.
  static nats_cluster start(int nodes = 3);

  /// Stops all nodes at once (SIGTERM to all, then waits) and removes their directories.
  ~nats_cluster();
  nats_cluster(nats_cluster&&) noexcept = default;
  nats_cluster& operator=(nats_cluster&&) noexcept;
  nats_cluster(const nats_cluster&) = delete;
  nats_cluster& operator=(const nats_cluster&) = delete;

  /// "nats://127.0.0.1:p1,nats://127.0.0.1:p2,..." for natsOptions_SetURL.
  std::string urls() const;
  /// One URL per node, in node order, for natsOptions_SetServers.
  std::vector<std::string> url_list() const;
  int size() const { return static_cast<int>(nodes_.size()); }
  /// The i-th node (0-based). @throws std::out_of_range.
  nats_server& node(int i);
  const nats_server& node(int i) const;
  /// The index of the node whose server_name is `server_name` (as reported in
  /// jsClusterInfo::Leader, e.g. "n2" → 1), or -1.
  int node_index_by_name(const std::string& server_name) const;
  /// node(i).kill() / node(i).restart().
  void kill(int i);
  void restart(int i);
  /// All nodes' log tails, each under a header line.
  std::string log_tail(std::size_t lines = 20) const;

 private:
  nats_cluster() = default;
  void stop_all() noexcept;

  std::vector<nats_server> nodes_;
};

/// A free loopback TCP port (bind to 127.0.0.1:0, read, close). Another process may take it
/// before it is used; the callers above retry.
int free_port();

}  // namespace amp::testing
