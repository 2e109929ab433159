#pragma once

// The command line of amp-server: flags, configuration file and overrides, into one
// checked amp::server_config plus the server's own run settings.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "amp/gateway/config.hpp"
#include "amp/result.hpp"

namespace amp::server {

/// --io-threads when not given: half the machine's cores, at least 1. The rest is left to
/// the threads of the NATS connection and the executor, and to nats-server when it runs on
/// the same machine (on 2 cores, one socket thread does more tasks per second than two).
int default_io_threads();

/// What the command line asks for.
struct run_options {
  server_config config;                    ///< checked by check_server_config
  std::optional<std::string> config_file;  ///< --config, as given
  bool config_file_has_secret = false;     ///< the --config file itself holds auth.secret
  int ping_interval_s = 30;                ///< --ping-interval: seconds between pings
  int io_threads = default_io_threads();   ///< --io-threads: threads running the sockets
  std::size_t workers = 16;                ///< --workers: threads running the sessions' work
  bool help = false;                       ///< --help: print help_text() and exit 0
  bool version = false;                    ///< --version: print the version and exit 0
};

/// Reads `args` (without the program name): `--config` first (wherever it stands), then
/// every override in the order given (`--set`, `--listen`, `--nats`, `--nats-creds`,
/// `--secret`, `--secret-file`), then `--memory`, then check_server_config. Flags take
/// their value as the next argument or after `=` (`--listen=0.0.0.0:9000`).
/// Errors: `bad_request` with a message for the user that names the flag or the
/// configuration key (the messages of load_server_config, set_config_value and
/// check_server_config).
result<run_options> parse_command_line(const std::vector<std::string>& args);

/// The text of --help: every flag, every configuration key with its default, the HTTP
/// endpoints, the log, signals and exit statuses.
std::string help_text();

}  // namespace amp::server
