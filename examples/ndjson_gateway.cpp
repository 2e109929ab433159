// A gateway of its own: the amp.v1 protocol carried as newline-delimited JSON over TCP.
//
// The library is the gateway. amp::gateway authenticates `hello`, checks every frame,
// runs the broker and decides when a session must end; this program only carries text.
// Each line a client sends is one frame (`session::receive`), and each frame the session
// hands out is written as one line. `amp-server` does the same over WebSocket.
//
// Raw TCP has no close frame, so where a WebSocket server would close with a code (1000
// after `bye`, 1001 at shutdown, 1009 for a frame too big, 4401 for a failed `hello` ...)
// this carrier writes one last line, {"op":"closed","code":N,"reason":"..."}, and then
// shuts the connection down. A line longer than `limits.max_frame_bytes` closes with 1009.
//
// Run: build/bin/amp-example-ndjson-gateway --secret S [--listen HOST:PORT] [--nats URL]
//      build/bin/amp-example-ndjson-gateway --config FILE.json
//      build/bin/amp-example-ndjson-gateway --secret S --print-token alice
//   --listen     where to accept connections (default 127.0.0.1:7070; with --config and
//                without --listen, the file's `listen`)
//   --secret     the HS256 secret of the tokens (required unless --config gives one)
//   --config     a server configuration file (spec §11)
//   --nats       a nats-server with JetStream; without it (and without `nats` in the
//                configuration) the broker lives in memory and nothing is durable
//   --print-token NAME  prints a development token for participant NAME in namespace
//                "demo" with every grant, and exits
// Then, for instance:
//   (echo '{"op":"hello","id":1,"token":"'"$TOKEN"'"}'; cat) | nc 127.0.0.1 7070
// SIGINT or SIGTERM closes every session with 1001 and exits 0.

#include <asio.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

#include "amp/gateway/auth.hpp"
#include "amp/gateway/config.hpp"
#include "amp/gateway/session.hpp"
#include "amp/json.hpp"
#include "amp/transport/jetstream.hpp"
#include "amp/transport/memory.hpp"

namespace {

using asio::ip::tcp;

// One TCP connection: the carrier of one session.
//
// What a carrier must do:
// - `send` and `close` may be called from any thread (the caller's, the gateway's workers,
//   the transport's) and must not block: they only post onto this connection's strand,
//   where every piece of state below lives. Writes go out one at a time, in order.
// - `buffered_bytes` tells the session how much it has queued and the client has not yet
//   taken, so the session can drop a slow subscriber or close a client that stops reading.
// - `close` writes what is queued, then ends the connection; `session::closed` is called
//   once the connection is gone, from the strand, never from inside `close` (the session
//   may hold its own lock there).
class connection final : public amp::session_carrier,
                         public std::enable_shared_from_this<connection> {
 public:
  connection(tcp::socket socket, std::size_t max_line)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), max_line_(max_line) {}

  // Opens the session and starts reading, on the strand: `open_session` may already ask
  // to close (a gateway that shuts down), and that must find `session_` set.
  void start(amp::gateway& gateway) {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this(), &gateway] {
      self->session_ = gateway.open_session(self);
      self->read();
    });
  }

  void send(std::string frame) override {
    frame += '\n';
    buffered_ += frame.size();
    asio::post(socket_.get_executor(),
               [self = shared_from_this(), line = std::move(frame)]() mutable {
                 self->enqueue(std::move(line), false);
               });
  }

  std::size_t buffered_bytes() const override { return buffered_; }

  void close(int code, std::string reason) override {
    amp::json_writer w;
    w.begin_object().key("op").string("closed").key("code").integer(code);
    w.key("reason").string(reason).end_object();
    auto line = w.take() + '\n';
    buffered_ += line.size();
    asio::post(socket_.get_executor(),
               [self = shared_from_this(), line = std::move(line)]() mutable {
                 self->enqueue(std::move(line), true);
               });
  }

 private:
  // On the strand. The `closed` line goes after the frames already queued; nothing goes
  // after it. A client that does not read gets 5 s for it, then the connection ends.
  void enqueue(std::string line, bool last) {
    if (closing_ || done_) {
      buffered_ -= line.size();
      return;
    }
    queue_.push_back(std::move(line));
    if (last) {
      closing_ = true;
      timer_.expires_after(std::chrono::seconds(5));
      timer_.async_wait([self = shared_from_this()](std::error_code ec) {
        if (!ec) self->finish();
      });
    }
    write_next();
  }

  // One outstanding write at a time; when the queue is empty after `close`, the end.
  void write_next() {
    if (writing_ || done_) return;
    if (queue_.empty()) {
      if (closing_) finish();
      return;
    }
    writing_ = true;
    asio::async_write(socket_, asio::buffer(queue_.front()),
                      [self = shared_from_this()](std::error_code ec, std::size_t) {
                        self->writing_ = false;
                        self->buffered_ -= self->queue_.front().size();
                        self->queue_.pop_front();
                        if (ec) return self->finish();
                        self->write_next();
                      });
  }

  // Reads one line, at most `max_line_` bytes before its '\n', and hands it to the session.
  // Frames that arrive after a close was asked for are not handed on.
  void read() {
    asio::async_read_until(
        socket_, asio::dynamic_buffer(in_, max_line_ + 1), '\n',
        [self = shared_from_this()](std::error_code ec, std::size_t n) {
          if (self->done_) return;
          if (ec == asio::error::not_found) {  // no '\n' within the limit: stop reading
            return self->close(amp::close_code::too_big, "line longer than max_frame_bytes");
          }
          if (ec) return self->finish();  // the client went away (EOF, reset)
          if (!self->closing_) self->session_->receive(std::string_view(self->in_.data(), n - 1));
          self->in_.erase(0, n);
          self->read();
        });
  }

  // The connection is over: shut the socket down, tell the session, and let go of it
  // (the session holds this carrier, and this carrier the session, until now).
  void finish() {
    if (done_) return;
    done_ = true;
    std::error_code ignored;
    timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    if (session_) session_->closed();
    session_.reset();
  }

  tcp::socket socket_;  // its executor is this connection's strand
  asio::steady_timer timer_;
  std::size_t max_line_;
  std::shared_ptr<amp::session> session_;
  std::string in_;
  std::deque<std::string> queue_;  // queue_.front() is being written while writing_
  std::atomic<std::size_t> buffered_{0};
  bool writing_ = false;
  bool closing_ = false;  // the `closed` line is queued
  bool done_ = false;     // finish() ran
};

void accept(tcp::acceptor& acceptor, amp::gateway& gateway) {
  // Each connection gets a strand of its own: its handlers never run concurrently.
  acceptor.async_accept(
      asio::make_strand(acceptor.get_executor()),
      [&acceptor, &gateway](std::error_code ec, tcp::socket socket) {
        if (ec == asio::error::operation_aborted) return;  // shutting down
        if (!ec) {
          auto max_line = gateway.config().limits.max_frame_bytes;
          std::make_shared<connection>(std::move(socket), max_line)->start(gateway);
        }
        accept(acceptor, gateway);
      });
}

int usage(const char* message, int status = 2) {
  std::fprintf(stderr,
               "amp-example-ndjson-gateway: %s\n"
               "usage: amp-example-ndjson-gateway (--secret S | --config FILE.json)\n"
               "         [--listen HOST:PORT] [--nats URL] [--print-token NAME]\n",
               message);
  return status;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "amp-example-ndjson-gateway: %s\n", message.c_str());
  return 1;
}

// A token for `name` in namespace "demo" that grants everything, valid for a day.
int print_token(const amp::server_config& cfg, const std::string& name) {
  if (auto n = amp::participant_name::make(name); !n) return fail(n.error().to_string());
  if (cfg.auth.alg != amp::jwt_alg::hs256 || !cfg.auth.secret)
    return usage("--print-token needs an HS256 secret (--secret)");
  auto token = amp::mint_token({.sub = name,
                                .ns = "demo",
                                .exp = std::chrono::system_clock::now() + std::chrono::hours(24),
                                .aud = cfg.auth.audience.value_or(""),
                                .amp_json = R"({"send":["*"],"submit":["*"],"work":["*"],)"
                                            R"("publish":[">"],"subscribe":[">"],"admin":true})"},
                               amp::jwt_alg::hs256, *cfg.auth.secret);
  if (!token) return fail(token.error().to_string());
  std::printf("%s\n", token->c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen, secret, config_file, nats_url, token_for;
  const std::map<std::string_view, std::string*> options = {{"--listen", &listen},
                                                            {"--secret", &secret},
                                                            {"--config", &config_file},
                                                            {"--nats", &nats_url},
                                                            {"--print-token", &token_for}};
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help") return usage("amp.v1 as newline-delimited JSON on TCP", 0);
    auto option = options.find(arg);
    if (option == options.end()) return usage("unknown option");
    if (i + 1 == argc) return usage("every option takes a value");
    *option->second = argv[++i];
  }

  // The configuration: the file's, or every default; then the command line over it.
  amp::server_config cfg;
  if (!config_file.empty()) {
    auto loaded = amp::load_server_config(config_file);
    if (!loaded) return fail(loaded.error().message());
    cfg = std::move(*loaded);
  } else {
    if (secret.empty()) return usage("--secret is required (or --config)");
    if (listen.empty()) listen = "127.0.0.1:7070";
  }
  if (!listen.empty()) {
    if (auto r = amp::set_config_value(cfg, "listen", amp::json_quote(listen)); !r)
      return fail(r.error().message());
  }
  if (!secret.empty()) {
    cfg.auth.secret = secret;
    cfg.auth.secret_file.reset();
  }
  if (!nats_url.empty()) {
    if (!cfg.nats) cfg.nats.emplace();
    cfg.nats->url = nats_url;
  }
  if (!token_for.empty()) return print_token(cfg, token_for);

  // Declared before the gateway, so that it outlives the sessions and their sockets.
  asio::io_context io;

  std::shared_ptr<amp::transport> backend;
  if (cfg.nats) {
    auto connected = amp::jetstream_transport::connect(
        {.url = cfg.nats->url, .creds_file = cfg.nats->creds.value_or("")});
    if (!connected) return fail(connected.error().to_string());
    backend = std::move(*connected);
    std::printf("backend: JetStream at %s\n", cfg.nats->url.c_str());
  } else {
    backend = amp::memory_transport::create();
    std::printf("backend: in memory, nothing is durable (--nats URL for JetStream)\n");
  }

  auto opened = amp::gateway::open({
      .config = cfg,
      .backend = backend,
      .server_name = "amp-example-ndjson-gateway/0.1.0",
      .log =
          [](const amp::log_line& line) {
            std::fprintf(stderr, "%.*s\n", static_cast<int>(line.json.size()), line.json.data());
          },
  });
  if (!opened) return fail(opened.error().to_string());
  auto gateway = std::move(*opened);

  tcp::acceptor acceptor(io);
  // Shutdown: stop accepting, then every session is closed with 1001. Once the last
  // connection has ended, nothing is left for the io_context and run() returns.
  // Set up before listening: a client that can connect can rely on a clean shutdown.
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](std::error_code ec, int) {
    if (ec) return;
    acceptor.close();
    gateway->shutdown();
  });

  try {
    auto endpoints = tcp::resolver(io).resolve(cfg.listen_host, std::to_string(cfg.listen_port));
    acceptor = tcp::acceptor(io, *endpoints.begin());
  } catch (const std::system_error& e) {
    return fail("cannot listen on " + cfg.listen() + ": " + e.what());
  }
  accept(acceptor, *gateway);
  std::printf("listening on %s (newline-delimited JSON)\n", cfg.listen().c_str());
  std::fflush(stdout);

  std::thread second([&io] { io.run(); });
  io.run();
  second.join();
  std::printf("stopped\n");
  return 0;
}
