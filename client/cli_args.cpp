#include "cli_args.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <span>
#include <sstream>

#include "amp/gateway/auth.hpp"
#include "amp/json.hpp"
#include "amp/names.hpp"

namespace amp::cli {
namespace {

struct option_spec {
  std::string_view name;   ///< "--to"
  std::string_view value;  ///< what the value is called ("P"); empty: a flag
  std::string_view help;
  bool repeatable = false;
};

struct command_spec {
  std::string_view name;
  std::string_view usage;        ///< after "amp "
  std::string_view summary;      ///< one line, for the overview
  std::string_view description;  ///< paragraphs separated by "\n\n"
  std::vector<option_spec> options;
  bool connects = true;  ///< takes --url and --token
};

/// The options of every command that connects.
const std::vector<option_spec>& connection_options() {
  static const std::vector<option_spec> options = {
      {"--url", "URL",
       "the server's WebSocket endpoint, ws:// or wss:// (default: $AMP_URL, else "
       "ws://127.0.0.1:8080/amp)"},
      {"--token", "JWT", "the token presented in hello (default: $AMP_TOKEN; required)"},
      {"--ca-file", "PEM",
       "wss://: trust the certificates in file PEM (default: the system's store)"},
      {"--insecure", "", "wss://: do not verify the server's certificate"},
  };
  return options;
}
const option_spec help_option{"--help", "", "show this help (also -h)"};
constexpr std::string_view exit_status_text =
    "Exit status: 0 on success, 1 on an error from the server or the connection, 2 on a usage "
    "error.";

const std::vector<command_spec>& commands() {
  static const std::vector<command_spec> specs = {
      {"token",
       "token (--secret S | --secret-file F | --key-file PEM) --sub NAME --ns NS [options]",
       "mint a development JWT",
       "Prints a JWT for participant NAME of namespace NS, issued now and valid for --ttl "
       "seconds, signed with HS256 (--secret or --secret-file) or EdDSA (--key-file, an "
       "Ed25519 private key in PEM). The server must be configured with the same secret or "
       "the matching public key.\n\n"
       "Without --grants or --all the token has no amp claim: its holder may use only its own "
       "inbox (and who, watch, heartbeat).",
       {{"--secret", "S", "the HS256 shared secret"},
        {"--secret-file", "F",
         "the HS256 secret is the content of file F, without one final newline (as amp-server "
         "reads auth.secret_file)"},
        {"--key-file", "PEM", "sign with EdDSA, with the Ed25519 private key in file PEM"},
        {"--sub", "NAME", "the participant (required)"},
        {"--ns", "NS", "the namespace (required)"},
        {"--ttl", "SECONDS", "the lifetime, 1 to 315360000 (default 3600)"},
        {"--aud", "A", "the audience claim (default: none)"},
        {"--grants", "JSON",
         "the amp claim, a JSON object, e.g. "
         R"({"send":["*"],"submit":["resize"],"subscribe":["news.>"]})"},
        {"--all", "",
         "grant everything: "
         R"({"send":["*"],"submit":["*"],"work":["*"],"publish":[">"],"subscribe":[">"],"admin":true})"}},
       false},
      {"send",
       "send --to P [options] BODY_JSON",
       "send a message to a participant's inbox",
       "Sends BODY_JSON (one JSON value; - reads it from stdin) to the inbox of participant P "
       "and prints the server's reply as one line: "
       R"({"seq":N,"msg_id":"...","duplicate":false}.)",
       {{"--to", "P", "the recipient (required)"},
        {"--type", "T", "the message type"},
        {"--msg-id", "ID", "a deduplication id: a repeat within 2 minutes is stored once"},
        {"--reply-to", "P", "the participant replies should go to"},
        {"--correlation", "C", "a correlation id"}}},
      {"listen",
       "listen [--count N] [--no-ack]",
       "print the messages arriving in the inbox",
       "Prints each message that arrives in the inbox as one line, its envelope (JSON), and "
       "acknowledges it once printed. Messages that arrived while nobody listened come "
       "first.\n\n"
       "Ends after N messages (those received beyond N are given back with nack), when "
       "interrupted (exit 0), or when the server closes the connection (exit 1).",
       {{"--count", "N", "stop after N messages (default: never)"},
        {"--no-ack", "", "do not acknowledge: the server delivers the messages again later"}}},
      {"submit",
       "submit --job J [options] BODY_JSON",
       "submit a task to a job, and optionally wait for its result",
       "Submits a task with body BODY_JSON (one JSON value; - reads it from stdin) to job J "
       "and prints "
       R"({"task":"...","created":true}.)"
       "\n\n"
       "With --wait it then waits for the task to end: it takes the notice the broker sends "
       "to the submitter's inbox (from $broker, type amp.task.completed, amp.task.failed or "
       "amp.task.cancelled), acknowledges it, prints its body "
       R"(({"task","job","state","attempt","result"|"error"}))"
       " and exits 0 if the task completed, 1 otherwise. A task that had already ended (an "
       "idempotency key naming an old task) is reported from its record. Other messages in "
       "the inbox are left alone.",
       {{"--job", "J", "the job (required)"},
        {"--type", "T", "the message type of the task's envelope"},
        {"--max-attempts", "N", "attempts allowed, 1 to 100 (default: the job's)"},
        {"--key", "KEY", "an idempotency key: submitting it again returns the same task"},
        {"--wait", "", "wait for the task to end and print its outcome"},
        {"--timeout", "SECONDS",
         "with --wait: give up after SECONDS (exit 1; default: wait for ever)"}}},
      {"work",
       "work --job J [options] [--] COMMAND [ARGS...]",
       "run a command for each task offered",
       "Registers for job J (--job may be repeated) and runs COMMAND for each task offered: "
       "claims the task, runs COMMAND with the task's body (JSON and a newline) on stdin and "
       "AMP_TASK, AMP_JOB and AMP_ATTEMPT in its environment, then reports the outcome:\n\n"
       "- exit status 0 completes the task with stdout as the result: stdout itself if it is "
       "one JSON value, else stdout as a JSON string (one final newline removed), or null if "
       "stdout is empty;\n"
       "- any other exit fails it with "
       R"({"code":"exit_N","message":<the end of stderr>})"
       " (signal_N when a signal ended COMMAND) and asks for a retry.\n\n"
       "Up to --slots commands run at once. A heartbeat every heartbeat_s seconds (sooner for "
       "short leases) keeps the registration and the leases alive. When a task is cancelled "
       "or its lease lost while COMMAND runs, COMMAND gets SIGTERM and nothing is reported. "
       "Prints one line per task: "
       R"({"task","job","attempt","exit","state"}.)"
       "\n\n"
       "Ends after N tasks (--count), or when interrupted: running commands get SIGTERM and "
       "their tasks go back to the queue.",
       {{"--job", "J", "a job to work for (required; repeat for several)", true},
        {"--slots", "N", "tasks run at once, 1 to 1024 (default 1)"},
        {"--count", "N", "stop after N tasks (default: never)"}}},
      {"pub",
       "pub --topic T [options] BODY_JSON",
       "publish an event to a topic",
       "Publishes BODY_JSON (one JSON value; - reads it from stdin) to topic T and prints "
       R"({"seq":N,"duplicate":false}.)",
       {{"--topic", "T", "the topic (required)"},
        {"--type", "T", "the message type"},
        {"--msg-id", "ID", "a deduplication id per topic: a repeat is stored once"}}},
      {"sub",
       "sub --topic PATTERN [--from WHERE] [--count N]",
       "print the events of a topic pattern",
       "Subscribes to PATTERN (a topic, * for one token, > for the rest) and prints each event "
       "as one line: "
       R"({"seq":N,"topic":"...","envelope":{...}}.)"
       "\n\n"
       "WHERE is new (the default: events published from now on), all, last (the latest "
       "matching event, then the rest), seq:N (sequence N and after) or time:RFC3339 "
       "(published at or after). When the server drops the subscription because it fell "
       "behind, it subscribes again after the last event printed: nothing is lost or printed "
       "twice.\n\n"
       "Ends after N events, when interrupted (exit 0), or when the server closes the "
       "connection (exit 1).",
       {{"--topic", "PATTERN", "the topic pattern (required)"},
        {"--from", "WHERE", "new, all, last, seq:N or time:RFC3339 (default new)"},
        {"--count", "N", "stop after N events (default: never)"}}},
      {"who",
       "who [--job J]",
       "list the workers registered",
       "Prints the server's reply listing the live registry entries: "
       R"({"participants":[{"participant","jobs","slots","load","meta","updated_at","expires_at"},...]}.)",
       {{"--job", "J", "only those registered for job J"}}},
      {"task",
       "task ID [--history]",
       "show a task's record",
       "Prints the record of task ID as the server's reply, "
       R"({"task":{"task","ns","job","state","attempt",...}},)"
       " with --history also "
       R"("history":[...])"
       " (every revision, oldest first). Visible to its submitter, those who held it, and "
       "admins.",
       {{"--history", "", "include every revision"}}},
      {"cancel",
       "cancel ID",
       "cancel a task or an operation",
       "Cancels task ID (as its submitter, or an admin) or, for an ID o_..., operation ID (as "
       "its initiator, or an admin) and prints the server's reply, "
       R"({"state":"cancelled"})"
       R"( (for an operation with "branches": member -> already_completed, stopped or unknown).)",
       {}},
      {"scatter",
       "scatter (--to P[,P...] | --audience online|all) [options] BODY_JSON",
       "send one branch to each member of an audience, optionally gathering replies",
       "Starts an operation: each member gets BODY_JSON (one JSON value; - reads it from "
       "stdin) as an inbox message whose envelope carries "
       R"("operation":{"id","branch","attempt","reply_by"}.)"
       " Prints "
       R"({"operation":"o_...","created":true,"members":[...]},)"
       " then waits for the operation to end: it takes the notice the broker sends to the "
       "initiator's inbox (from $broker, type amp.operation.completed, .partial, .failed or "
       ".cancelled), acknowledges it, prints its body "
       R"(({"operation","state","quorum","members","replies","missing"}))"
       " and exits 0 if it completed, 1 otherwise. Other messages in the inbox are left "
       "alone.\n\n"
       "Without --quorum it is a multicast, completed once every branch is stored. With "
       "--quorum N it completes once N members replied with accept, fails once that cannot "
       "happen any more, and at --timeout-ms is partial (--on-timeout partial, one accept or "
       "more) or failed.",
       {{"--to", "P[,P...]", "the members (comma-separated, or --to repeated)", true},
        {"--audience", "A",
         "instead of --to: online (live registry entries) or all (every inbox of the ns)"},
        {"--include-self", "", "the initiator may be a member of its own audience"},
        {"--quorum", "N", "gather: accepting replies that complete it (1 to the members)"},
        {"--timeout-ms", "T", "with --quorum (required): the deadline, 100 to 86400000"},
        {"--on-timeout", "R", "with --quorum: partial or failed (default failed)"},
        {"--type", "T", "the message type of every branch"},
        {"--key", "KEY", "an idempotency key: scattering it again returns the same operation"},
        {"--no-wait", "", "print the operation and exit without waiting for its end"}}},
      {"reply",
       "reply --operation O [--attempt N] [--reject] [BODY_JSON]",
       "answer your branch of an operation",
       "Replies to this participant's branch of operation O (the envelope's operation.id) at "
       "attempt N (its operation.attempt; default 1) with BODY_JSON (default null; - reads it "
       "from stdin), accepting unless --reject, and prints the server's reply "
       R"({"operation","state"})"
       R"( ("duplicate":true when the branch had replied already).)",
       {{"--operation", "O", "the operation (required)"},
        {"--attempt", "N", "the branch's attempt (default 1)"},
        {"--reject", "", "reply with accept false"}}},
      {"operation",
       "operation ID",
       "show an operation's record",
       "Prints the record of operation ID as the server's reply, "
       R"({"operation":{"operation","ns","initiator","members","quorum","state",...,"branches"}}.)"
       " The initiator and admins see every branch; a member sees its own.",
       {}},
  };
  return specs;
}

const command_spec* find_command(std::string_view name) {
  for (const auto& spec : commands()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

/// Appends `text` wrapped at `width` columns, each line after the first indented by
/// `indent` spaces (the first line continues at column `start`). Newlines in `text` start
/// new lines.
void append_wrapped(std::string& out, std::string_view text, std::size_t start, std::size_t indent,
                    std::size_t width = 80) {
  std::size_t column = start;
  bool line_start = true;
  while (!text.empty()) {
    if (text.front() == '\n') {
      out.push_back('\n');
      text.remove_prefix(1);
      if (!text.empty() && text.front() != '\n') out.append(indent, ' ');
      column = indent;
      line_start = true;
      continue;
    }
    if (text.front() == ' ') {
      text.remove_prefix(1);
      continue;
    }
    auto end = text.find_first_of(" \n");
    auto word = text.substr(0, end);
    text.remove_prefix(word.size());
    if (!line_start && column + 1 + word.size() > width) {
      out.push_back('\n');
      out.append(indent, ' ');
      column = indent;
      line_start = true;
    }
    if (!line_start) {
      out.push_back(' ');
      ++column;
    }
    out.append(word);
    column += word.size();
    line_start = false;
  }
}

void append_option(std::string& out, const option_spec& o) {
  std::string left = "  " + std::string(o.name);
  if (!o.value.empty()) left += " " + std::string(o.value);
  constexpr std::size_t column = 24;
  out += left;
  if (left.size() + 2 > column) {
    out += "\n";
    out.append(column, ' ');
  } else {
    out.append(column - left.size(), ' ');
  }
  append_wrapped(out, o.help, column, column);
  out += "\n";
}

std::string command_help(const command_spec& spec) {
  std::string out = "Usage: amp " + std::string(spec.usage) + "\n\n";
  std::string_view description = spec.description;
  append_wrapped(out, description, 0, 0);
  out += "\n\nOptions:\n";
  for (const auto& o : spec.options) append_option(out, o);
  if (spec.connects) {
    for (const auto& o : connection_options()) append_option(out, o);
  }
  append_option(out, help_option);
  out += "\n";
  append_wrapped(out, exit_status_text, 0, 0);
  out += "\n";
  return out;
}

std::string overview_help() {
  std::string out =
      "amp: the command-line client of AMP over WebSocket (amp.v1)\n\n"
      "Usage: amp COMMAND [OPTIONS] [ARGS]\n"
      "       amp COMMAND --help    (or amp help COMMAND)\n\n"
      "Commands:\n";
  for (const auto& spec : commands()) {
    std::string left = "  " + std::string(spec.name);
    out += left;
    out.append(left.size() < 12 ? 12 - left.size() : 1, ' ');
    out += std::string(spec.summary) + "\n";
  }
  out += "\nEvery command but token connects to a server and takes:\n";
  for (const auto& o : connection_options()) append_option(out, o);
  out += "\n";
  append_wrapped(out,
                 "Results are printed on stdout as JSON, one value per line. Errors are printed "
                 "on stderr as \"amp: CODE: MESSAGE\", CODE as in the protocol (bad_request, "
                 "forbidden, unavailable, ...).",
                 0, 0);
  out += "\n";
  append_wrapped(out, exit_status_text, 0, 0);
  out += "\n";
  return out;
}

/// What the command line says, before it is read into a command's struct.
struct split_line {
  std::map<std::string, std::vector<std::string>, std::less<>> values;
  std::vector<std::string> positionals;
  bool help = false;

  const std::string* get(std::string_view name) const {
    auto it = values.find(name);
    return it == values.end() ? nullptr : &it->second.front();
  }
  bool flag(std::string_view name) const { return values.contains(name); }
};

unexpected usage(const command_spec& spec, std::string message) {
  return unexpected(errc::bad_request, std::string(spec.name) + ": " + message);
}

bool looks_like_number(std::string_view arg) {
  return arg.size() > 1 && arg[0] == '-' &&
         (std::isdigit(static_cast<unsigned char>(arg[1])) || arg[1] == '.');
}

/// Splits `args` into options and positionals, by `spec`. For `work`, the first positional
/// starts the command: it and everything after it are positionals.
result<split_line> split(const command_spec& spec, std::span<const std::string> args) {
  split_line line;
  const bool command_tail = spec.name == "work";
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      line.positionals.insert(line.positionals.end(), args.begin() + static_cast<long>(i) + 1,
                              args.end());
      break;
    }
    if (arg == "-h" || arg == "--help") {
      line.help = true;
      return line;
    }
    const bool is_option = arg.size() > 1 && arg[0] == '-' && !looks_like_number(arg);
    if (!is_option) {
      if (command_tail) {
        line.positionals.insert(line.positionals.end(), args.begin() + static_cast<long>(i),
                                args.end());
        break;
      }
      line.positionals.push_back(arg);
      continue;
    }
    if (!arg.starts_with("--")) return usage(spec, "unknown option " + arg);
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const option_spec* option = nullptr;
    for (const auto& o : spec.options) {
      if (o.name == name) option = &o;
    }
    if (spec.connects) {
      for (const auto& o : connection_options()) {
        if (o.name == name) option = &o;
      }
    }
    if (option == nullptr) return usage(spec, "unknown option " + name);
    std::string value;
    if (option->value.empty()) {
      if (eq != std::string::npos) return usage(spec, name + " takes no value");
    } else if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return usage(spec, name + " needs a value (" + std::string(option->value) + ")");
    }
    auto& values = line.values[name];
    if (!values.empty() && !option->repeatable) return usage(spec, name + " given twice");
    values.push_back(std::move(value));
  }
  return line;
}

result<std::int64_t> integer_option(const command_spec& spec, const split_line& line,
                                    std::string_view name, std::int64_t fallback, std::int64_t min,
                                    std::int64_t max) {
  const std::string* text = line.get(name);
  if (text == nullptr) return fallback;
  std::int64_t n = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), n);
  if (text->empty() || ec != std::errc{} || end != text->data() + text->size() || n < min ||
      n > max) {
    return usage(spec, std::string(name) + " must be an integer from " + std::to_string(min) +
                           " to " + std::to_string(max) + ", not \"" + *text + "\"");
  }
  return n;
}

std::string string_option(const split_line& line, std::string_view name) {
  const std::string* v = line.get(name);
  return v ? *v : std::string();
}

result<std::string> required_option(const command_spec& spec, const split_line& line,
                                    std::string_view name) {
  const std::string* v = line.get(name);
  if (v == nullptr) return usage(spec, std::string(name) + " is required");
  if (v->empty()) return usage(spec, std::string(name) + " must not be empty");
  return *v;
}

result<connection_args> connection(const command_spec& spec, const split_line& line,
                                   const env_lookup& env) {
  auto from_env = [&](std::string_view name) -> std::optional<std::string> {
    if (!env) return std::nullopt;
    auto v = env(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  };
  connection_args c;
  if (const auto* url = line.get("--url")) {
    c.url = *url;
  } else if (auto url_env = from_env("AMP_URL")) {
    c.url = *url_env;
  }
  if (const auto* token = line.get("--token")) {
    c.token = *token;
  } else if (auto token_env = from_env("AMP_TOKEN")) {
    c.token = *token_env;
  }
  if (c.token.empty()) return usage(spec, "no token: give --token or set AMP_TOKEN");
  c.ca_file = string_option(line, "--ca-file");
  c.verify_peer = !line.flag("--insecure");
  if (!c.verify_peer && !c.ca_file.empty()) {
    return usage(spec, "give --ca-file or --insecure, not both");
  }
  return c;
}

/// The single positional argument, named `what` in messages.
result<std::string> one_positional(const command_spec& spec, const split_line& line,
                                   std::string_view what) {
  if (line.positionals.size() != 1) {
    return usage(spec, "expected one " + std::string(what) + " argument, got " +
                           std::to_string(line.positionals.size()));
  }
  return line.positionals.front();
}

result<std::string> body_positional(const command_spec& spec, const split_line& line) {
  auto body = one_positional(spec, line, "BODY_JSON");
  if (!body) return body;
  if (*body != "-") {
    if (auto ok = json_check(*body); !ok) return usage(spec, "BODY_JSON: " + ok.error().message());
  }
  return body;
}

result<void> no_positionals(const command_spec& spec, const split_line& line) {
  if (!line.positionals.empty()) {
    return usage(spec, "unexpected argument \"" + line.positionals.front() + "\"");
  }
  return {};
}

// One reader per command: from the split line to the command's struct.

// `args` with the connection options of `line` (`connection`): what a reader returns.
template <class Args>
result<command> connected(Args args, const command_spec& spec, const split_line& line,
                          const env_lookup& env) {
  auto c = connection(spec, line, env);
  if (!c) return std::move(c).error();
  args.connection = std::move(*c);
  return command(std::move(args));
}

result<command> read_token(const command_spec& spec, const split_line& line, const env_lookup&) {
  if (auto r = no_positionals(spec, line); !r) return std::move(r).error();
  token_args t;
  t.secret = string_option(line, "--secret");
  t.secret_file = string_option(line, "--secret-file");
  t.key_file = string_option(line, "--key-file");
  const int keys =
      int{line.flag("--secret")} + int{line.flag("--secret-file")} + int{line.flag("--key-file")};
  if (keys != 1) return usage(spec, "give exactly one of --secret, --secret-file and --key-file");
  if (line.flag("--secret") && t.secret.empty()) return usage(spec, "--secret must not be empty");
  auto sub = required_option(spec, line, "--sub");
  if (!sub) return std::move(sub).error();
  auto ns = required_option(spec, line, "--ns");
  if (!ns) return std::move(ns).error();
  if (auto name = participant_name::make(*sub); !name) {
    return usage(spec, "--sub: " + name.error().message());
  }
  if (auto name = namespace_name::make(*ns); !name) {
    return usage(spec, "--ns: " + name.error().message());
  }
  t.sub = std::move(*sub);
  t.ns = std::move(*ns);
  auto ttl = integer_option(spec, line, "--ttl", 3600, 1, 315360000);
  if (!ttl) return std::move(ttl).error();
  t.ttl_s = *ttl;
  t.aud = string_option(line, "--aud");
  if (line.flag("--grants") && line.flag("--all")) {
    return usage(spec, "give --grants or --all, not both");
  }
  if (line.flag("--all")) t.grants_json = std::string(all_grants_json);
  if (const auto* grants = line.get("--grants")) {
    if (auto ok = json_check(*grants); !ok) return usage(spec, "--grants: " + ok.error().message());
    auto first = grants->find_first_not_of(" \t\r\n");
    if (first == std::string::npos || (*grants)[first] != '{') {
      return usage(spec, "--grants: not a JSON object");
    }
    // The grammar of the grants is the authenticator's: check a token carrying them.
    const auto now = std::chrono::system_clock::now();
    token_claims claims;
    claims.sub = t.sub;
    claims.ns = t.ns;
    claims.exp = now + std::chrono::hours(1);
    claims.amp_json = *grants;
    const std::string probe_secret(min_secret_bytes, 'p');
    auto probe = mint_token(claims, jwt_alg::hs256, probe_secret);
    auth_config config;
    config.secret = probe_secret;
    auto checker = authenticator::make(config);
    if (!probe || !checker) return usage(spec, "--grants: cannot be checked");
    if (auto verified = checker->verify(*probe, now); !verified) {
      return usage(spec, "--grants: " + verified.error().message());
    }
    t.grants_json = *grants;
  }
  return command(std::move(t));
}

result<command> read_send(const command_spec& spec, const split_line& line, const env_lookup& env) {
  send_args s;
  auto to = required_option(spec, line, "--to");
  if (!to) return std::move(to).error();
  s.to = std::move(*to);
  s.options.type = string_option(line, "--type");
  s.options.msg_id = string_option(line, "--msg-id");
  s.options.reply_to = string_option(line, "--reply-to");
  s.options.correlation = string_option(line, "--correlation");
  auto body = body_positional(spec, line);
  if (!body) return std::move(body).error();
  s.body = std::move(*body);
  return connected(std::move(s), spec, line, env);
}

result<command> read_listen(const command_spec& spec, const split_line& line,
                            const env_lookup& env) {
  if (auto r = no_positionals(spec, line); !r) return std::move(r).error();
  listen_args l;
  auto count = integer_option(spec, line, "--count", 0, 1, INT64_MAX);
  if (!count) return std::move(count).error();
  l.count = *count;
  l.ack = !line.flag("--no-ack");
  return connected(std::move(l), spec, line, env);
}

result<command> read_submit(const command_spec& spec, const split_line& line,
                            const env_lookup& env) {
  submit_args s;
  auto job = required_option(spec, line, "--job");
  if (!job) return std::move(job).error();
  s.job = std::move(*job);
  s.options.type = string_option(line, "--type");
  auto attempts = integer_option(spec, line, "--max-attempts", 0, 1, 100);
  if (!attempts) return std::move(attempts).error();
  s.options.max_attempts = static_cast<int>(*attempts);
  s.options.idempotency_key = string_option(line, "--key");
  s.wait = line.flag("--wait");
  if (const auto* timeout = line.get("--timeout")) {
    if (!s.wait) return usage(spec, "--timeout needs --wait");
    double seconds = 0;
    auto [end, ec] = std::from_chars(timeout->data(), timeout->data() + timeout->size(), seconds);
    if (timeout->empty() || ec != std::errc{} || end != timeout->data() + timeout->size() ||
        !(seconds > 0) || seconds > 1e9) {
      return usage(spec, "--timeout must be a number of seconds above 0, not \"" + *timeout + "\"");
    }
    s.timeout_s = seconds;
  }
  auto body = body_positional(spec, line);
  if (!body) return std::move(body).error();
  s.body = std::move(*body);
  return connected(std::move(s), spec, line, env);
}

result<command> read_work(const command_spec& spec, const split_line& line, const env_lookup& env) {
  work_args w;
  auto jobs = line.values.find("--job");
  if (jobs == line.values.end()) return usage(spec, "--job is required");
  for (const auto& job : jobs->second) {
    if (job.empty()) return usage(spec, "--job must not be empty");
    if (std::find(w.jobs.begin(), w.jobs.end(), job) == w.jobs.end()) w.jobs.push_back(job);
  }
  auto slots = integer_option(spec, line, "--slots", 1, 1, 1024);
  if (!slots) return std::move(slots).error();
  w.slots = static_cast<int>(*slots);
  auto count = integer_option(spec, line, "--count", 0, 1, INT64_MAX);
  if (!count) return std::move(count).error();
  w.count = *count;
  if (line.positionals.empty()) return usage(spec, "no COMMAND to run (give it after --)");
  if (line.positionals.front().empty()) return usage(spec, "COMMAND must not be empty");
  w.command = line.positionals;
  return connected(std::move(w), spec, line, env);
}

result<command> read_pub(const command_spec& spec, const split_line& line, const env_lookup& env) {
  pub_args p;
  auto topic = required_option(spec, line, "--topic");
  if (!topic) return std::move(topic).error();
  p.topic = std::move(*topic);
  p.options.type = string_option(line, "--type");
  p.options.msg_id = string_option(line, "--msg-id");
  auto body = body_positional(spec, line);
  if (!body) return std::move(body).error();
  p.body = std::move(*body);
  return connected(std::move(p), spec, line, env);
}

result<command> read_sub(const command_spec& spec, const split_line& line, const env_lookup& env) {
  if (auto r = no_positionals(spec, line); !r) return std::move(r).error();
  sub_args s;
  auto topic = required_option(spec, line, "--topic");
  if (!topic) return std::move(topic).error();
  s.topic = std::move(*topic);
  if (const auto* from = line.get("--from")) {
    auto parsed = subscribe_from::parse(*from);
    if (!parsed) return usage(spec, "--from: " + parsed.error().message());
    s.from = std::move(*parsed);
  }
  auto count = integer_option(spec, line, "--count", 0, 1, INT64_MAX);
  if (!count) return std::move(count).error();
  s.count = *count;
  return connected(std::move(s), spec, line, env);
}

result<command> read_who(const command_spec& spec, const split_line& line, const env_lookup& env) {
  if (auto r = no_positionals(spec, line); !r) return std::move(r).error();
  who_args w;
  w.job = string_option(line, "--job");
  if (line.flag("--job") && w.job.empty()) return usage(spec, "--job must not be empty");
  return connected(std::move(w), spec, line, env);
}

result<command> read_task(const command_spec& spec, const split_line& line, const env_lookup& env) {
  task_args t;
  auto id = one_positional(spec, line, "ID");
  if (!id) return std::move(id).error();
  t.task = std::move(*id);
  t.history = line.flag("--history");
  return connected(std::move(t), spec, line, env);
}

result<command> read_cancel(const command_spec& spec, const split_line& line,
                            const env_lookup& env) {
  cancel_args x;
  auto id = one_positional(spec, line, "ID");
  if (!id) return std::move(id).error();
  x.task = std::move(*id);
  return connected(std::move(x), spec, line, env);
}

result<command> read_scatter(const command_spec& spec, const split_line& line,
                             const env_lookup& env) {
  scatter_args a;
  if (auto to = line.values.find("--to"); to != line.values.end()) {
    for (const auto& value : to->second) {
      std::string_view rest = value;
      while (true) {
        auto comma = rest.find(',');
        auto name = rest.substr(0, comma);
        if (name.empty()) return usage(spec, "--to: a member name is empty");
        a.to.emplace_back(name);
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
    }
  }
  a.audience = string_option(line, "--audience");
  if (a.to.empty() == a.audience.empty()) return usage(spec, "give either --to or --audience");
  if (!a.audience.empty() && a.audience != "online" && a.audience != "all") {
    return usage(spec, "--audience must be online or all, not \"" + a.audience + "\"");
  }
  a.options.include_self = line.flag("--include-self");
  auto quorum = integer_option(spec, line, "--quorum", 0, 1, 1000);
  if (!quorum) return std::move(quorum).error();
  a.options.quorum = static_cast<int>(*quorum);
  auto timeout = integer_option(spec, line, "--timeout-ms", 0, 100, 86400000);
  if (!timeout) return std::move(timeout).error();
  if ((a.options.quorum != 0) != (*timeout != 0)) {
    return usage(spec, "--quorum and --timeout-ms go together");
  }
  a.options.timeout = std::chrono::milliseconds(*timeout);
  const auto rule = string_option(line, "--on-timeout");
  if (!rule.empty()) {
    if (a.options.quorum == 0) return usage(spec, "--on-timeout needs --quorum");
    if (rule != "partial" && rule != "failed") {
      return usage(spec, "--on-timeout must be partial or failed, not \"" + rule + "\"");
    }
  }
  a.options.partial_on_timeout = rule == "partial";
  a.options.type = string_option(line, "--type");
  a.options.idempotency_key = string_option(line, "--key");
  a.wait = !line.flag("--no-wait");
  auto body = body_positional(spec, line);
  if (!body) return std::move(body).error();
  a.body = std::move(*body);
  return connected(std::move(a), spec, line, env);
}

result<command> read_reply(const command_spec& spec, const split_line& line,
                           const env_lookup& env) {
  reply_args a;
  auto op = required_option(spec, line, "--operation");
  if (!op) return std::move(op).error();
  a.operation = std::move(*op);
  auto attempt = integer_option(spec, line, "--attempt", 1, 1, INT32_MAX);
  if (!attempt) return std::move(attempt).error();
  a.attempt = static_cast<int>(*attempt);
  a.accept = !line.flag("--reject");
  if (line.positionals.size() > 1) return usage(spec, "give at most one BODY_JSON");
  if (!line.positionals.empty()) {
    auto body = body_positional(spec, line);
    if (!body) return std::move(body).error();
    a.body = std::move(*body);
  }
  return connected(std::move(a), spec, line, env);
}

result<command> read_operation(const command_spec& spec, const split_line& line,
                               const env_lookup& env) {
  operation_args a;
  auto id = one_positional(spec, line, "ID");
  if (!id) return std::move(id).error();
  a.operation = std::move(*id);
  return connected(std::move(a), spec, line, env);
}

using reader = result<command> (*)(const command_spec&, const split_line&, const env_lookup&);

reader reader_of(std::string_view name) {
  static const std::map<std::string_view, reader> readers = {{"token", read_token},
                                                             {"send", read_send},
                                                             {"listen", read_listen},
                                                             {"submit", read_submit},
                                                             {"work", read_work},
                                                             {"pub", read_pub},
                                                             {"sub", read_sub},
                                                             {"who", read_who},
                                                             {"task", read_task},
                                                             {"cancel", read_cancel},
                                                             {"scatter", read_scatter},
                                                             {"reply", read_reply},
                                                             {"operation", read_operation}};
  return readers.at(name);
}

result<std::string> read_file(const std::string& path, std::string_view option) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return unexpected(errc::bad_request, "token: " + std::string(option) + ": cannot read " + path +
                                             ": " + std::strerror(errno));
  }
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) {
    return unexpected(errc::bad_request, "token: " + std::string(option) + ": cannot read " + path);
  }
  return content.str();
}

}  // namespace

result<command> parse_command_line(const std::vector<std::string>& args, const env_lookup& env) {
  if (args.empty()) {
    return unexpected(errc::bad_request, "no command given (amp --help lists them)");
  }
  const std::string& name = args.front();
  if (name == "-h" || name == "--help") return command(help_args{});
  if (name == "help") {
    if (args.size() > 2) return unexpected(errc::bad_request, "help: too many arguments");
    if (args.size() == 2) {
      if (find_command(args[1]) == nullptr) {
        return unexpected(errc::bad_request, "help: unknown command \"" + args[1] + "\"");
      }
      return command(help_args{args[1]});
    }
    return command(help_args{});
  }
  const command_spec* spec = find_command(name);
  if (spec == nullptr) {
    return unexpected(errc::bad_request,
                      "unknown command \"" + name + "\" (amp --help lists them)");
  }
  auto line = split(*spec, std::span<const std::string>(args).subspan(1));
  if (!line) return std::move(line).error();
  if (line->help) return command(help_args{std::string(spec->name)});
  return reader_of(spec->name)(*spec, *line, env);
}

std::string help_text(std::string_view name) {
  if (name.empty()) return overview_help();
  const command_spec* spec = find_command(name);
  return spec ? command_help(*spec) : std::string();
}

result<std::string> make_token(const token_args& args, time_point now) {
  std::string key = args.secret;
  jwt_alg alg = jwt_alg::hs256;
  if (!args.secret_file.empty()) {
    auto content = read_file(args.secret_file, "--secret-file");
    if (!content) return content;
    key = std::move(*content);
    // As amp-server reads auth.secret_file: one final newline is not part of the secret.
    if (!key.empty() && key.back() == '\n') key.pop_back();
    if (!key.empty() && key.back() == '\r') key.pop_back();
  } else if (!args.key_file.empty()) {
    auto content = read_file(args.key_file, "--key-file");
    if (!content) return content;
    key = std::move(*content);
    alg = jwt_alg::eddsa;
  }
  token_claims claims{.sub = args.sub,
                      .ns = args.ns,
                      .exp = now + std::chrono::seconds(args.ttl_s),
                      .nbf = std::nullopt,
                      .iat = now,
                      .aud = args.aud,
                      .amp_json = args.grants_json};
  auto token = mint_token(claims, alg, key);
  if (!token) return unexpected(errc::bad_request, "token: " + token.error().message());
  return token;
}

}  // namespace amp::cli
