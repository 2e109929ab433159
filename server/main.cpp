// amp-server: the reference AMP server. It reads the configuration, opens the backend
// (NATS JetStream, or the embedded memory transport) and the gateway, and carries the
// gateway's sessions over WebSocket (websocket.cpp). Every AMP rule lives in the library.

#include <malloc.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "amp/gateway/session.hpp"
#include "amp/transport/jetstream.hpp"
#include "amp/transport/memory.hpp"
#include "command_line.hpp"
#include "log.hpp"
#include "websocket.hpp"

#ifndef AMP_SERVER_VERSION
#define AMP_SERVER_VERSION "0.0.0"
#endif

namespace {

constexpr int exit_cannot_run = 1;
constexpr int exit_bad_configuration = 2;

int fail(const std::string& message, int status) {
  std::fprintf(stderr, "amp-server: %s\n", message.c_str());
  return status;
}

/// Raises the soft limit of open files to the hard limit (every connection is one) and
/// returns the limit in force.
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

// Files that hold secrets should be readable by the server's user only: say so at start.
void warn_about_readable_secrets(const amp::server::run_options& options,
                                 amp::server::logger& log) {
  const auto& c = options.config;
  std::vector<std::pair<const char*, std::string>> files;
  if (c.tls.key) files.emplace_back("tls.key", *c.tls.key);
  if (c.auth.secret_file) files.emplace_back("auth.secret_file", *c.auth.secret_file);
  if (c.nats && c.nats->creds) files.emplace_back("nats.creds", *c.nats->creds);
  if (c.nats && c.nats->tls_key) files.emplace_back("nats.tls.key", *c.nats->tls_key);
  if (options.config_file_has_secret) files.emplace_back("config", *options.config_file);
  for (const auto& [key, path] : files) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || (st.st_mode & (S_IRWXG | S_IRWXO)) == 0) continue;
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    log.write(amp::server::log_event("warn", "file_permissions")
                  .field("key", key)
                  .field("path", path)
                  .field("mode", mode)
                  .field("message",
                         "holds a secret and is accessible to group or others: "
                         "chmod 600 it"));
  }
}

int run(const std::vector<std::string>& args) {
  namespace srv = amp::server;
  auto parsed = srv::parse_command_line(args);
  if (!parsed) return fail(parsed.error().message(), exit_bad_configuration);
  auto options = std::move(*parsed);
  if (options.help) {
    std::fputs(srv::help_text().c_str(), stdout);
    return 0;
  }
  if (options.version) {
    std::printf("amp-server %s\n", AMP_SERVER_VERSION);
    return 0;
  }

  if (auto tls = srv::check_tls(options.config); !tls) {
    return fail(tls.error().message(), exit_bad_configuration);
  }

  // Sockets report a vanished peer as an error, not a signal.
  std::signal(SIGPIPE, SIG_IGN);
  // Declared before the gateway: its log callback writes here until it is gone.
  static srv::logger log(stderr);

  const auto max_fds = raise_fd_limit();
  {
    srv::log_event start("info", "starting");
    start.field("version", AMP_SERVER_VERSION)
        .field("pid", static_cast<std::int64_t>(::getpid()))
        .field("max_fds", max_fds);
    if (options.config_file) start.field("config", *options.config_file);
    log.write(std::move(start));
  }
  warn_about_readable_secrets(options, log);

  const auto& config = options.config;
  if (config.retention.task_s < 86400) {
    log.write(srv::log_event("warn", "short_task_retention")
                  .field("task_s", config.retention.task_s)
                  .field("message",
                         "retention.task_s is under 86400: ended tasks and their idempotency keys "
                         "are kept less than the 24 hours amp.v1 promises"));
  }
  auto handler_error = [](std::string_view line) {
    log.write(srv::log_event("error", "handler_exception").field("message", line));
  };
  std::shared_ptr<amp::transport> backend;
  std::string transport_name;
  if (config.nats) {
    auto connected = amp::jetstream_transport::connect(
        {.url = config.nats->url,
         .creds_file = config.nats->creds.value_or(""),
         .domain = config.nats->domain.value_or(""),
         .tls_ca = config.nats->tls_ca.value_or(""),
         .tls_cert = config.nats->tls_cert.value_or(""),
         .tls_key = config.nats->tls_key.value_or(""),
         .name = "amp-server",
         .on_handler_error = handler_error,
         .on_notice = [](std::string_view line) {
           log.write(srv::log_event("warn", "nats_version").field("message", line));
         }});
    if (!connected) {
      const bool bad = connected.error().code() == amp::errc::bad_request;
      return fail("nats: " + connected.error().message(),
                  bad ? exit_bad_configuration : exit_cannot_run);
    }
    backend = std::move(*connected);
    transport_name = "nats";
    log.write(srv::log_event("info", "backend_connected")
                  .field("transport", "nats")
                  .field("url", amp::redact_nats_url(config.nats->url)));
  } else {
    backend = amp::memory_transport::create({.on_handler_error = handler_error});
    transport_name = "memory";
    log.write(srv::log_event("warn", "memory_transport")
                  .field("transport", "memory")
                  .field("message",
                         "no nats section: the embedded memory transport holds everything in "
                         "this process; nothing is durable, a restart loses every message, "
                         "task and lease"));
  }

  auto gateway = amp::gateway::open({
      .config = config,
      .backend = backend,
      .server_name = std::string("amp-server/") + AMP_SERVER_VERSION,
      .workers = options.workers,
      .log = [](const amp::log_line& line) { log.write(line.json); },
  });
  if (!gateway) {
    const bool bad = gateway.error().code() == amp::errc::bad_request;
    return fail(gateway.error().message(), bad ? exit_bad_configuration : exit_cannot_run);
  }

  return srv::serve({.config = &config,
                     .gateway = *gateway,
                     .log = &log,
                     .io_threads = options.io_threads,
                     .ping_interval = std::chrono::seconds(options.ping_interval_s),
                     .transport_name = transport_name,
                     .version = AMP_SERVER_VERSION});
}

}  // namespace

int main(int argc, char** argv) {
  // Frames over 128 KiB are allocated with mmap and given back when freed. glibc otherwise
  // raises that threshold after the first such free, and every worker thread's arena then
  // keeps the largest frames it has seen.
  ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    return fail(std::string("unexpected error: ") + e.what(), exit_cannot_run);
  }
}
