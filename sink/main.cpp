// amp-sink: commit-then-ack archives of an AMP namespace (amp-sink-v1.md). It reads the
// configuration, connects to NATS, runs the sink library's loop, and serves /healthz,
// /readyz and /metrics. SIGTERM or SIGINT finish the batch in hand and exit 0.

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "amp/sink/sink.hpp"
#include "amp/transport/jetstream.hpp"
#include "http.hpp"
#include "log.hpp"

#ifndef AMP_SINK_VERSION
#define AMP_SINK_VERSION "0.0.0"
#endif

namespace {

constexpr int exit_cannot_run = 1;
constexpr int exit_bad_configuration = 2;

constexpr std::string_view k_help = R"(Usage: amp-sink --config FILE.json [options]

Copies what flows through an AMP namespace into PostgreSQL, SQLite or files, committing
each batch before acknowledging it (amp-sink-v1.md). Needs NATS JetStream.

Options:
  --config FILE      read the configuration (JSON) from FILE; relative paths in it are
                     relative to FILE
  --set KEY=VALUE    set one key; VALUE is JSON, so a string keeps its quotes:
                     --set batch.max_messages=16 --set 'source.ns="demo"'
                     (repeatable; applied in order, after --config)
  --nats URL         the same as --set nats.url="URL"
  --http HOST:PORT   the same as --set http="HOST:PORT"
  --check            check the configuration, open every target (connect, create the
                     table or folder) and look for the source stream; print one line
                     each ("wait source" when the stream is not there yet: the
                     namespace was never used), consume nothing; exit 0 when every
                     target opened, 1 otherwise
  --help             print this text and exit
  --version          print the version and exit

Configuration keys (one JSON object; an unknown key, a wrong type or a value out of
range stops the program with a message naming the key):
  nats.url                 "nats://127.0.0.1:4222"
  nats.creds, nats.domain  null        credentials file; JetStream domain
  nats.tls.ca, .cert, .key null        TLS to NATS
  http                     null        "host:port" for GET /healthz, /readyz, /metrics
  name                     required    ^[a-z][a-z0-9_-]{0,63}$: the durable consumer, and
                                       the dead-letter subject amp.<ns>.dlq.<name>
  source.ns                required    the namespace
  source.kind              "topics"    or "tasks"
  source.topics            null        with "topics": 1 to 64 topic patterns
  source.from              "all"       "new", "all", {"seq":N} or {"time":"RFC 3339"};
                                       used only when the consumer is first created
  batch.max_messages       256         1..10000
  batch.max_wait_ms        50          1..60000: how long a batch waits to fill
  idempotency.strategy     "stream_sequence"  or "message_id", "payload_field"
  idempotency.field        null        with payload_field: a JSON Pointer inside body
                                       ("/order_id"; "" is the whole body)
  on_duplicate             "skip"      or "replace", "fail"
  targets                  required    1 to 16 of ("kind" defaults to "sqlite"):
                             {"kind":"sqlite","path":FILE,"table":T,"required":true}
                             {"kind":"postgres","dsn":DSN,"table":T,"required":true}
                             {"kind":"file","dir":DIR,"required":true}
  dlq.max_failures         5           1..1000 tries before a message is dead-lettered
  ack_wait_s               30          1..3600: the consumer's AckWait

HTTP: GET /healthz (200 while running), /readyz (200 once a batch committed or the
targets opened, 503 while a required target or NATS is away; an idle sink probes its
required targets every 5 s), /metrics (Prometheus).

Log: one JSON object per line on stderr: {"ts","level","event",...}.

Signals: SIGTERM or SIGINT finish the batch in hand (commit, then acknowledge) and exit
0; a second one exits at once with 1.

Exit status: 0 after a clean stop (or a passing --check), 1 when it cannot run (NATS
cannot be reached, a check failed), 2 for a bad command line or configuration.
)";

int fail(const std::string& message, int status) {
  std::fprintf(stderr, "amp-sink: %s\n", message.c_str());
  return status;
}

struct options {
  amp::sink::sink_config config;
  bool check = false;
  bool help = false;
  bool version = false;
};

amp::result<options> parse(const std::vector<std::string>& args) {
  options out;
  std::optional<std::string> file;
  std::vector<std::pair<std::string, std::string>> overrides;
  auto usage = [](std::string m) { return amp::unexpected(amp::errc::bad_request, std::move(m)); };
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::optional<std::string> inline_value;
    if (flag.starts_with("--")) {
      if (auto eq = flag.find('='); eq != std::string::npos) {
        inline_value = flag.substr(eq + 1);
        flag.resize(eq);
      }
    }
    auto value = [&]() -> amp::result<std::string> {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) return usage(flag + " needs a value");
      return args[++i];
    };
    if (flag == "--help" || flag == "-h" || flag == "--version" || flag == "--check") {
      if (inline_value) return usage(flag + " takes no value");
      (flag == "--check" ? out.check : flag == "--version" ? out.version : out.help) = true;
      continue;
    }
    if (flag != "--config" && flag != "--set" && flag != "--nats" && flag != "--http") {
      return usage("unknown option \"" + flag + "\" (see --help)");
    }
    auto v = value();
    if (!v) return v.error();
    if (flag == "--config") {
      if (file) return usage("--config given twice");
      file = std::move(*v);
    } else if (flag == "--set") {
      const auto eq = v->find('=');
      if (eq == std::string::npos) return usage("--set: must be KEY=VALUE, not \"" + *v + "\"");
      overrides.emplace_back(v->substr(0, eq), v->substr(eq + 1));
    } else {
      overrides.emplace_back(flag == "--nats" ? "nats.url" : "http", amp::json_quote(*v));
    }
  }
  if (out.help || out.version) return out;
  if (!file) return usage("--config FILE.json is required (see --help)");
  auto loaded = amp::sink::load_sink_config(*file, false);
  if (!loaded) return loaded.error();
  out.config = std::move(*loaded);
  for (const auto& [key, json] : overrides) {
    if (auto r = amp::sink::set_sink_config_value(out.config, key, json); !r) return r.error();
  }
  if (auto r = amp::sink::check_sink_config(out.config); !r) return r.error();
  return out;
}

amp::result<std::shared_ptr<amp::transport>> connect(const amp::sink::sink_config& c,
                                                     amp::server::logger& log) {
  return amp::jetstream_transport::connect(
      {.url = c.nats.url,
       .creds_file = c.nats.creds.value_or(""),
       .domain = c.nats.domain.value_or(""),
       .tls_ca = c.nats.tls_ca.value_or(""),
       .tls_cert = c.nats.tls_cert.value_or(""),
       .tls_key = c.nats.tls_key.value_or(""),
       .name = "amp-sink",
       .on_handler_error =
           [&log](std::string_view line) {
             log.write(amp::server::log_event("error", "handler_exception").field("message", line));
           },
       .on_notice = {}});
}

int check(const options& o) {
  static amp::server::logger log(stderr);
  auto backend = connect(o.config, log);
  if (!backend) return fail("nats: " + backend.error().message(), exit_cannot_run);
  auto lines = amp::sink::check_sink(o.config, *backend);
  if (!lines) return fail(lines.error().message(), exit_cannot_run);
  for (const auto& line : *lines) std::printf("%s\n", line.c_str());
  return 0;
}

int run(const std::vector<std::string>& args) {
  // Signals are taken by one thread of their own (sigwait); every thread made from here on
  // inherits the mask. Blocked first, so that a SIGTERM while the sink starts (reading the
  // configuration, connecting) is kept and heard once it runs: it then stops at once, exit 0.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto parsed = parse(args);
  if (!parsed) return fail(parsed.error().message(), exit_bad_configuration);
  auto o = std::move(*parsed);
  if (o.help) {
    std::fputs(k_help.data(), stdout);
    return 0;
  }
  if (o.version) {
    std::printf("amp-sink %s\n", AMP_SINK_VERSION);
    return 0;
  }
  std::signal(SIGPIPE, SIG_IGN);
  if (o.check) {
    pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);  // --check is interrupted as usual
    return check(o);
  }

  static amp::server::logger log(stderr);
  log.write(amp::server::log_event("info", "starting")
                .field("version", AMP_SINK_VERSION)
                .field("pid", static_cast<std::int64_t>(::getpid()))
                .field("name", o.config.name));

  // HTTP first: an address that cannot serve stops the program before it touches NATS,
  // and /healthz answers while it connects (/readyz 503 until the sink is made).
  std::atomic<amp::sink::sink*> current{nullptr};
  std::unique_ptr<amp::sink_program::http_server> http;
  if (o.config.http) {
    auto started = amp::sink_program::http_server::start(
        *o.config.http, [&current, &o](const std::string& path) -> amp::sink_program::http_answer {
          auto* sink = current.load();
          if (path == "/healthz") return {.status = 200, .body = "ok\n"};
          if (path == "/readyz") {
            return sink && sink->ready()
                       ? amp::sink_program::http_answer{.status = 200, .body = "ready\n"}
                       : amp::sink_program::http_answer{.status = 503, .body = "not ready\n"};
          }
          if (path == "/metrics") {
            return {
                .status = 200,
                .body = sink ? amp::sink::metrics_text(sink->stats(), o.config.name, sink->ready())
                             : amp::sink::metrics_text({}, o.config.name, false),
                .content_type = "text/plain; version=0.0.4; charset=utf-8"};
          }
          return {.status = 404, .body = "not found\n"};
        });
    if (!started) {
      const bool bad = started.error().code() == amp::errc::bad_request;
      return fail(started.error().message(), bad ? exit_bad_configuration : exit_cannot_run);
    }
    http = std::move(*started);
  }

  auto backend = connect(o.config, log);
  if (!backend) {
    const bool bad = backend.error().code() == amp::errc::bad_request;
    return fail("nats: " + backend.error().message(),
                bad ? exit_bad_configuration : exit_cannot_run);
  }
  auto made = amp::sink::sink::create(
      *backend, o.config, {},
      {.log = [](std::string_view level, std::string_view event, std::string_view detail) {
        std::string line = amp::server::log_event(level, event).take();
        if (!detail.empty()) {
          line.pop_back();
          line.append(",").append(detail).append("}");
        }
        log.write(line);
      }});
  if (!made) {
    const bool bad =
        made.error().code() == amp::errc::bad_request || made.error().code() == amp::errc::conflict;
    return fail(made.error().message(), bad ? exit_bad_configuration : exit_cannot_run);
  }
  auto& sink = **made;
  current = &sink;

  std::thread signal_thread([&sink, signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    log.write(amp::server::log_event("info", "stopping").field("signal", sig));
    sink.stop();
    sigwait(&signals, &sig);
    log.write(amp::server::log_event("warn", "stopped_at_once").field("signal", sig));
    std::_Exit(exit_cannot_run);
  });
  signal_thread.detach();

  log.write(amp::server::log_event("info", "running")
                .field("consumer", o.config.name)
                .field("http", o.config.http.value_or("")));
  sink.run();
  current = nullptr;
  http.reset();
  const auto stats = sink.stats();
  log.write(amp::server::log_event("info", "stopped")
                .field("committed", stats.committed)
                .field("acked", stats.acked)
                .field("dead_lettered", stats.dead_lettered));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    return fail(std::string("unexpected error: ") + e.what(), exit_cannot_run);
  }
}
