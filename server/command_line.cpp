#include "command_line.hpp"

#include <algorithm>
#include <charconv>
#include <string_view>
#include <thread>
#include <utility>

#include "amp/json.hpp"

namespace amp::server {

namespace {

constexpr std::string_view k_help = R"(Usage: amp-server [--config FILE.json] [options]

The reference AMP server: the amp.v1 protocol over WebSocket at ws://HOST:PORT/amp
(wss:// when tls.cert and tls.key are set), on NATS JetStream when the configuration
has a "nats" section, otherwise on the embedded in-memory transport (nothing durable).

Options:
  --config FILE        read the configuration (JSON) from FILE; without it every key
                       has its default. Relative paths in it are relative to FILE.
  --set KEY=VALUE      set one configuration key; VALUE is JSON, so a string keeps its
                       quotes: --set limits.max_sessions=100 --set 'listen="0.0.0.0:9000"'
                       (repeatable; applied in order, after --config)
  --listen HOST:PORT   the same as --set listen="HOST:PORT"
  --nats URL           the same as --set nats.url="URL": use NATS JetStream at URL
                       (several URLs separated by commas)
  --nats-creds FILE    the same as --set nats.creds="FILE"
  --secret S           the same as --set auth.secret="S" (HS256; visible to other
                       local users in the process list: prefer auth.secret_file)
  --secret-file FILE   the same as --set auth.secret_file="FILE"
  --memory             use the embedded memory transport whatever the configuration
                       says about nats (nothing durable)
  --io-threads N       threads serving the sockets, 1 to 64 (default: half the
                       machine's cores, at least 1)
  --ping-interval S    seconds between WebSocket pings to every connection, 1 to 3600
                       (default 30); a connection that has not answered with a pong
                       within min(S, 10) seconds is closed (1008)
  --workers N          threads running the sessions' work, 1 to 256 (default 16;
                       backend calls wait on them; one session uses at most N/4)
  --help               print this text and exit
  --version            print the version and exit

Configuration keys (the file is one JSON object; a partial object is merged with the
defaults key by key; an unknown key, a wrong type or a value out of range stops the
server with a message naming the key):
  listen                       "127.0.0.1:8080"   host:port; IPv6 as "[::1]:8080"
  tls.cert, tls.key            null               PEM certificate chain and key (both)
  nats                         absent             absent or null: memory transport
  nats.url                     "nats://127.0.0.1:4222"
  nats.creds                   null               NATS credentials file
  nats.replicas                1                  1..5
  nats.storage                 "file"             "file" or "memory"
  nats.domain                  null               the JetStream domain (a leaf node's
                                                  server names the hub's)
  nats.tls.ca                  null               TLS to NATS: CA file (PEM); any nats.tls
                                                  key or a tls:// URL makes it TLS
  nats.tls.cert, nats.tls.key  null               client certificate and key (both)
  auth.alg                     "HS256"            "HS256" or "EdDSA"
  auth.secret                  null               HS256 shared secret, >= 32 bytes
  auth.secret_file             null               HS256: a file holding the secret
  auth.public_key_file         null               EdDSA: Ed25519 public key (PEM)
  auth.audience                null               the "aud" every token must carry
  auth.leeway_s                30                 0..3600 seconds of clock skew
  heartbeat_s                  10                 1..86400, less than registry_ttl_s
  registry_ttl_s               30                 1..86400
  inbox_ack_s                  30                 1..86400
  inbox_window                 64                 1..10000
  inbox_idle_s                 604800             60..31536000; an inbox consumer idle this
                                                  long is removed, its messages kept
  jobs.<job>.lease_s           30                 1..86400 (<job>: a job name or "*")
  jobs.<job>.max_attempts      3                  1..100
  jobs.<job>.decline_delay_ms  1000               0..86400000
  limits.max_frame_bytes       1048576            1024..67108864; larger frames: 1009
  limits.max_body_bytes        262144             1..max_frame_bytes
  limits.max_sessions          10000              1..1000000
  limits.max_subscriptions     64                 per session, 1..10000
  limits.max_pending           1024               connections before hello, 1..1000000
  policy.<p>.rate.per_s        1000               messages per second, > 0
  policy.<p>.rate.burst        2000               >= 1
  policy.<p>.rate.bytes_per_s  10485760           body bytes per second, > 0
  policy.<p>.ops.per_s         10000              tokens per second for every other op, > 0
  policy.<p>.ops.burst         20000              >= 10 (register, who, watch take 10)
  policy.<p>.budget.per_day    null               null (unlimited) or an integer >= 0
                                                  (<p>: "default" or "participants.NAME")
  schemas.<type>               none               JSON Schema file for that message type
  retention.task_s             86400              ended tasks kept; 60..315360000 (under
                                                  86400 breaks amp.v1's 24 hours: a warning)
  retention.inbox.max_age_s    604800             unacked messages dropped after; 0 (none)
                                                  or 60..315360000
  retention.inbox.max_bytes    0                  0 (none) or 1048576..2^50; full: send is
                                                  limit_exceeded
  retention.topics.max_age_s   86400              replay kept; 0 (none) or 60..315360000
  retention.topics.max_bytes   0                  0 (none) or 1048576..2^50; oldest go first
  retention.namespaces.<ns>.inbox, .topics        the same keys for one namespace
An HS256 configuration needs auth.secret or auth.secret_file, of at least 32 bytes
(RFC 7518), or the server refuses to start.

HTTP on the same port: GET /healthz (200 while serving), GET /readyz (200 while the
backend answers, else 503), GET /metrics (Prometheus text format).

Log: one JSON object per line on stderr: {"ts","level","event",...}. Errors that stop
the server before it listens are printed as "amp-server: MESSAGE" instead.

Signals: SIGTERM or SIGINT stop accepting, close every session with 1001 (going away;
leases stay in the store for the next server) and exit 0 within about 5 s; a second
signal exits at once.

Exit status: 0 after a clean shutdown, 1 when the server cannot start or run (the
address is taken, NATS cannot be reached), 2 for a bad command line or configuration.
)";

// Flags that set one configuration key to their value as a JSON string.
struct string_flag {
  std::string_view flag;
  std::string_view key;
};
constexpr string_flag k_string_flags[] = {
    {"--listen", "listen"},
    {"--nats", "nats.url"},
    {"--nats-creds", "nats.creds"},
    {"--secret", "auth.secret"},
    {"--secret-file", "auth.secret_file"},
};

amp::unexpected usage(std::string message) {
  return amp::unexpected(amp::errc::bad_request, std::move(message));
}

result<long> parse_count(std::string_view flag, std::string_view text, long low, long high) {
  long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value < low || value > high) {
    return usage(std::string(flag) + ": must be an integer from " + std::to_string(low) + " to " +
                 std::to_string(high) + ", not \"" + std::string(text) + "\"");
  }
  return value;
}

// One override, applied after the file: a key and its JSON value.
struct override_value {
  std::string key;
  std::string json;
};

}  // namespace

std::string help_text() {
  return std::string(k_help);
}

int default_io_threads() {
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1U, 64U));
}

result<run_options> parse_command_line(const std::vector<std::string>& args) {
  run_options out;
  std::vector<override_value> overrides;
  bool memory = false;

  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    std::string_view flag = arg;
    std::optional<std::string> inline_value;
    if (arg.starts_with("--")) {
      if (auto eq = arg.find('='); eq != std::string_view::npos) {
        flag = arg.substr(0, eq);
        inline_value = std::string(arg.substr(eq + 1));
      }
    }
    // The flag's value: after '=' or the next argument.
    auto value = [&]() -> result<std::string> {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) return usage(std::string(flag) + " needs a value");
      return args[++i];
    };
    auto no_value = [&]() -> result<void> {
      if (inline_value) return usage(std::string(flag) + " takes no value");
      return {};
    };

    if (flag == "--help" || flag == "-h") {
      if (auto r = no_value(); !r) return amp::unexpected(r.error());
      out.help = true;
    } else if (flag == "--version") {
      if (auto r = no_value(); !r) return amp::unexpected(r.error());
      out.version = true;
    } else if (flag == "--memory") {
      if (auto r = no_value(); !r) return amp::unexpected(r.error());
      memory = true;
    } else if (flag == "--config") {
      auto v = value();
      if (!v) return amp::unexpected(v.error());
      if (out.config_file) return usage("--config given twice");
      out.config_file = std::move(*v);
    } else if (flag == "--set") {
      auto v = value();
      if (!v) return amp::unexpected(v.error());
      auto eq = v->find('=');
      if (eq == std::string::npos || eq == 0) {
        return usage("--set " + *v + ": expected KEY=VALUE with VALUE in JSON, e.g. " +
                     "--set limits.max_sessions=100");
      }
      overrides.push_back({v->substr(0, eq), v->substr(eq + 1)});
    } else if (flag == "--io-threads") {
      auto v = value();
      if (!v) return amp::unexpected(v.error());
      auto n = parse_count(flag, *v, 1, 64);
      if (!n) return amp::unexpected(n.error());
      out.io_threads = static_cast<int>(*n);
    } else if (flag == "--ping-interval") {
      auto v = value();
      if (!v) return amp::unexpected(v.error());
      auto n = parse_count(flag, *v, 1, 3600);
      if (!n) return amp::unexpected(n.error());
      out.ping_interval_s = static_cast<int>(*n);
    } else if (flag == "--workers") {
      auto v = value();
      if (!v) return amp::unexpected(v.error());
      auto n = parse_count(flag, *v, 1, 256);
      if (!n) return amp::unexpected(n.error());
      out.workers = static_cast<std::size_t>(*n);
    } else {
      const string_flag* known = nullptr;
      for (const auto& f : k_string_flags) {
        if (f.flag == flag) known = &f;
      }
      if (!known) {
        return usage("unknown option \"" + std::string(arg) + "\" (see --help)");
      }
      auto v = value();
      if (!v) return amp::unexpected(v.error());
      overrides.push_back({std::string(known->key), amp::json_quote(*v)});
    }
  }
  if (out.help || out.version) return out;

  if (out.config_file) {
    auto loaded = amp::load_server_config(*out.config_file);
    if (!loaded) return amp::unexpected(loaded.error());
    out.config = std::move(*loaded);
    out.config_file_has_secret = out.config.auth.secret.has_value();
  }
  for (const auto& o : overrides) {
    if (auto r = amp::set_config_value(out.config, o.key, o.json); !r) {
      return amp::unexpected(r.error());
    }
  }
  if (memory) out.config.nats.reset();
  if (auto r = amp::check_server_config(out.config); !r) return amp::unexpected(r.error());
  return out;
}

}  // namespace amp::server
