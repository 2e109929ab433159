#pragma once

// The command line of the `amp` tool: what each command takes, parsed into one struct per
// command, and the help texts (written from the same table, so that `--help` lists exactly
// the options the parser accepts). Also the token minting of `amp token`. Kept apart from
// amp_cli.cpp so that the tests can call it.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "amp/client.hpp"
#include "amp/clock.hpp"
#include "amp/result.hpp"

namespace amp::cli {

inline constexpr std::string_view default_url = "ws://127.0.0.1:8080/amp";

/// The grants `amp token --all` writes: every participant, job and topic, and admin.
inline constexpr std::string_view all_grants_json =
    R"({"send":["*"],"submit":["*"],"work":["*"],"publish":[">"],"subscribe":[">"],"admin":true})";

/// Where and as whom a command connects: `--url` (else `$AMP_URL`, else `default_url`),
/// `--token` (else `$AMP_TOKEN`; required), and for `wss://` `--ca-file` or `--insecure`.
struct connection_args {
  std::string url{default_url};
  std::string token;
  std::string ca_file;  ///< empty: the system's store
  bool verify_peer = true;
};

/// `amp --help`, `amp help [COMMAND]`, `amp COMMAND --help`.
struct help_args {
  std::string command;  ///< empty: the list of commands
};

struct token_args {
  std::string secret;       ///< --secret (HS256)
  std::string secret_file;  ///< --secret-file (HS256)
  std::string key_file;     ///< --key-file (EdDSA private key, PEM)
  std::string sub;
  std::string ns;
  std::int64_t ttl_s = 3600;
  std::string aud;
  std::string grants_json;  ///< --grants, or `all_grants_json` for --all; empty: none
};

struct send_args {
  connection_args connection;
  std::string to;
  message_options options;
  std::string body;  ///< JSON text, or "-": read it from stdin
};

struct listen_args {
  connection_args connection;
  std::int64_t count = 0;  ///< 0: until interrupted
  bool ack = true;
};

struct submit_args {
  connection_args connection;
  std::string job;
  submit_options options;
  bool wait = false;
  std::optional<double> timeout_s;  ///< with wait; none: wait for ever
  std::string body;                 ///< JSON text, or "-"
};

struct work_args {
  connection_args connection;
  std::vector<std::string> jobs;
  int slots = 1;
  std::int64_t count = 0;            ///< 0: until interrupted
  std::vector<std::string> command;  ///< the program and its arguments
};

struct pub_args {
  connection_args connection;
  std::string topic;
  publish_options options;
  std::string body;  ///< JSON text, or "-"
};

struct sub_args {
  connection_args connection;
  std::string topic;
  subscribe_from from;
  std::int64_t count = 0;  ///< 0: until interrupted
};

struct who_args {
  connection_args connection;
  std::string job;
};

struct task_args {
  connection_args connection;
  std::string task;
  bool history = false;
};

struct cancel_args {
  connection_args connection;
  std::string task;  ///< a task id, or an operation id (`o_…`)
};

/// `amp scatter` (spec §12).
struct scatter_args {
  connection_args connection;
  std::vector<std::string> to;  ///< --to, comma-separated or repeated; empty: --audience
  std::string audience;         ///< `online` or `all`
  scatter_options options;
  bool wait = true;  ///< wait for the notice of the end and print it
  std::string body;  ///< JSON text, or "-"
};

/// `amp reply` (spec §12).
struct reply_args {
  connection_args connection;
  std::string operation;
  int attempt = 1;
  bool accept = true;
  std::string body = "null";  ///< JSON text, or "-"
};

/// `amp operation` (spec §12).
struct operation_args {
  connection_args connection;
  std::string operation;
};

using command = std::variant<help_args, token_args, send_args, listen_args, submit_args, work_args,
                             pub_args, sub_args, who_args, task_args, cancel_args, scatter_args,
                             reply_args, operation_args>;

/// Reads an environment variable; `std::nullopt` when it is not set.
using env_lookup = std::function<std::optional<std::string>(std::string_view name)>;

/// Parses a command line without the program name (`{"send", "--to", "bob", "1"}`).
/// Options are `--name value` or `--name=value`; `--` ends them; `-` alone and negative
/// numbers are positional. Errors: `bad_request` with a message for the user that starts
/// with the command, e.g. `send: --to is required`, `unknown command "snd"`.
result<command> parse_command_line(const std::vector<std::string>& args, const env_lookup& env);

/// The help of `command`, or the overview for `""`; empty for an unknown command.
std::string help_text(std::string_view command);

/// The JWT that `amp token` prints, issued at `now`: reads `--secret-file` or `--key-file`
/// (a secret file without one final newline, as amp-server reads `auth.secret_file`; a key
/// file as it is). Errors: `bad_request` for a file that cannot be read or a key
/// `mint_token` refuses.
result<std::string> make_token(const token_args& args, time_point now);

}  // namespace amp::cli
