// The only translation unit of amp-server that includes websocketpp: the plain and the TLS
// endpoint are one template over the websocketpp config.

#include "websocket.hpp"

#include <websocketpp/config/asio.hpp>
#include <websocketpp/config/asio_no_tls.hpp>
#include <websocketpp/server.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace amp::server {

namespace {

namespace net = websocketpp::lib::asio;
using websocketpp::connection_hdl;
using clock_type = std::chrono::steady_clock;

constexpr std::string_view k_path = "/amp";
constexpr std::string_view k_subprotocol = "amp.v1";
/// How long the close handshakes may take after the gateway shut down.
constexpr auto k_close_wait = std::chrono::seconds(5);
/// A client that does not answer our close frame is dropped after this.
constexpr long k_close_handshake_ms = 3000;
/// Pause before accepting again after accept failed (e.g. out of file descriptors).
constexpr auto k_accept_retry = std::chrono::milliseconds(100);
/// The longest wait for a pong: a connection that does not answer a ping within
/// min(ping_interval, this) (a peer gone without closing its TCP connection) is closed.
constexpr long k_max_pong_timeout_ms = 10000;

/// A websocketpp config with the settings amp-server needs on top of `Base`.
template <class Base>
struct tuned_config : Base {
  using type = tuned_config;
  // Every connection holds one read buffer of this size: 10,000 connections, 80 MB.
  static const std::size_t connection_read_buffer_size = 8192;
  struct transport_config : Base::transport_config {
    // After acknowledging a client's close, websocketpp 0.8.2 starts the TLS shutdown while
    // its own read still consumes the client's close_notify, so the shutdown only ends on
    // this timeout (5 s by default) and holds the connection until then (see
    // tests/websocket/websocket_tls_smoke_test.cpp).
    static const long timeout_socket_shutdown = 250;
  };
  using transport_type = websocketpp::transport::asio::endpoint<transport_config>;
};
using plain_config = tuned_config<websocketpp::config::asio>;
using tls_config = tuned_config<websocketpp::config::asio_tls>;

std::string_view path_of(std::string_view resource) {
  return resource.substr(0, resource.find('?'));
}

const char* signal_name(int signo) {
  switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "signal";
  }
}

/// Carries one session over one WebSocket connection.
///
/// `send`, `buffered_bytes` and `close` are called by the session from any thread. The
/// rest runs on the connection's strand, from websocketpp's handlers.
template <class Config>
class ws_carrier final : public amp::session_carrier {
 public:
  using connection = websocketpp::connection<Config>;
  using message = typename Config::message_type;
  using message_ptr = typename message::ptr;

  ws_carrier(std::weak_ptr<connection> con, net::io_context& io)
      : connection_(std::move(con)), io_(io) {}

  /// Frames the text message here and hands websocketpp a prepared message whose owner
  /// counts its bytes until websocketpp drops it, which it does once the socket write that
  /// carried it completed (or the connection is gone). websocketpp's own
  /// get_buffered_amount() forgets a message as soon as its write starts, and reads its
  /// counter without a lock.
  void send(std::string frame) override {
    auto con = connection_.lock();
    if (!con) return;
    namespace wsframe = websocketpp::frame;
    auto inner = con->get_message(wsframe::opcode::text, 0);
    if (!inner) return;
    const auto size = frame.size();
    inner->set_header(
        wsframe::prepare_header(wsframe::basic_header(wsframe::opcode::text, size, true, false),
                                wsframe::extended_header(size)));
    inner->get_raw_payload() = std::move(frame);
    inner->set_prepared(true);
    const std::size_t bytes = inner->get_header().size() + size;
    buffered_->fetch_add(bytes, std::memory_order_relaxed);
    message_ptr counted(inner.get(), [inner, buffered = buffered_, bytes](message*) {
      buffered->fetch_sub(bytes, std::memory_order_relaxed);
    });
    // A connection that is closing refuses it (invalid_state); the message is then dropped
    // and uncounted at once.
    websocketpp::lib::error_code ec = con->send(counted);
    (void)ec;
  }

  std::size_t buffered_bytes() const override { return buffered_->load(std::memory_order_relaxed); }

  /// websocketpp's close must run on the connection's strand: the request is stored and
  /// the connection interrupted, and the interrupt handler closes (`on_interrupt`).
  void close(int code, std::string reason) override {
    {
      std::lock_guard lock(close_mutex_);
      if (close_code_ != 0) return;
      close_code_ = code;
      close_reason_ = std::move(reason);
    }
    if (auto con = connection_.lock()) con->interrupt();
  }

  // The strand's side.

  void attach(std::shared_ptr<amp::session> s) { session_ = std::move(s); }

  void on_message(const message_ptr& msg) {
    if (!session_) return;
    // The frames of one socket read are handled in one turn of the I/O thread: what they
    // publish to NATS goes out in one write after it, from a handler queued behind them.
    if (auto write = amp::session::hold_writes_until_called()) net::post(io_, std::move(write));
    if (msg->get_opcode() == websocketpp::frame::opcode::text) {
      session_->receive(msg->get_payload());
    } else {
      session_->receive_binary();
    }
  }

  void on_interrupt() {
    int code = 0;
    std::string reason;
    {
      std::lock_guard lock(close_mutex_);
      code = close_code_;
      reason = close_reason_;
    }
    auto con = connection_.lock();
    if (!con || code == 0) return;
    websocketpp::lib::error_code ec;
    con->close(static_cast<websocketpp::close::status::value>(code), reason, ec);
  }

  /// The connection ended: tells the session, and lets go of it (it holds this carrier).
  void on_closed() {
    auto s = std::exchange(session_, nullptr);
    if (s) s->closed();
  }

 private:
  std::weak_ptr<connection> connection_;
  net::io_context& io_;
  std::shared_ptr<std::atomic<std::size_t>> buffered_ =
      std::make_shared<std::atomic<std::size_t>>(0);
  std::mutex close_mutex_;
  int close_code_ = 0;  // 0: no close asked for
  std::string close_reason_;
  std::shared_ptr<amp::session> session_;  // the strand only
};

template <class Config>
class ws_server {
 public:
  using endpoint = websocketpp::server<Config>;
  using connection_ptr = typename endpoint::connection_ptr;
  using message_ptr = typename endpoint::message_ptr;
  using carrier = ws_carrier<Config>;

  explicit ws_server(const serve_options& options)
      : options_(options),
        log_(*options.log),
        acceptor_strand_(io_),
        accept_retry_(io_),
        keepalive_(io_),
        signals_(io_, SIGINT, SIGTERM) {
    endpoint_.clear_access_channels(websocketpp::log::alevel::all);
    endpoint_.clear_error_channels(websocketpp::log::elevel::all);
    endpoint_.init_asio(&io_);
    endpoint_.set_reuse_addr(true);
    // The kernel caps it at net.core.somaxconn.
    endpoint_.set_listen_backlog(65535);
    endpoint_.set_max_message_size(options.config->limits.max_frame_bytes);
    // Frames are small and answered at once: without TCP_NODELAY, Nagle's algorithm and the
    // client's delayed ACK hold a frame back up to 40 ms (175 tasks/s instead of thousands).
    // (Set once the socket is accepted: the socket init handler runs before it is open.)
    endpoint_.set_tcp_pre_init_handler([this](connection_hdl h) {
      if (auto con = connection_of(std::move(h))) {
        net::error_code ignored;
        con->get_raw_socket().set_option(net::ip::tcp::no_delay(true), ignored);
      }
    });
    endpoint_.set_max_http_body_size(64 * 1024);
    endpoint_.set_close_handshake_timeout(k_close_handshake_ms);
    endpoint_.set_pong_timeout(std::min<long>(
        k_max_pong_timeout_ms,
        std::chrono::duration_cast<std::chrono::milliseconds>(options.ping_interval).count()));
    endpoint_.set_validate_handler([this](connection_hdl h) { return validate(h); });
    endpoint_.set_http_handler([this](connection_hdl h) { serve_http(h); });
    endpoint_.set_fail_handler([this](connection_hdl h) { failed(h); });
  }

  ws_server(const ws_server&) = delete;
  ws_server& operator=(const ws_server&) = delete;

  endpoint& raw() { return endpoint_; }

  int run() {
    const auto& config = *options_.config;
    const std::string address = config.listen();
    net::error_code ec;
    net::ip::tcp::resolver resolver(io_);
    auto found = resolver.resolve(config.listen_host, std::to_string(config.listen_port),
                                  net::ip::tcp::resolver::passive, ec);
    if (ec || found.empty()) {
      std::fprintf(stderr, "amp-server: listen: cannot resolve %s: %s\n", address.c_str(),
                   ec ? ec.message().c_str() : "no address");
      return 1;
    }
    websocketpp::lib::error_code listen_ec;
    endpoint_.listen(found.begin()->endpoint(), listen_ec);
    if (listen_ec) {
      std::fprintf(stderr, "amp-server: listen: cannot listen on %s: %s\n", address.c_str(),
                   listen_ec.message().c_str());
      return 1;
    }

    wait_for_signal();
    schedule_keepalive();
    net::post(acceptor_strand_, [this] { accept(); });
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(options_.io_threads));
    for (int i = 0; i < options_.io_threads; ++i) threads.emplace_back([this] { run_io(); });

    const bool tls = config.tls.enabled();
    log_.write(
        log_event("info", "listening")
            .field("address", address)
            .field("url", std::string(tls ? "wss://" : "ws://") + address + std::string(k_path))
            .field("tls", tls)
            .field("transport", options_.transport_name)
            .field("io_threads", options_.io_threads)
            .field("version", options_.version));

    {
      std::unique_lock lock(stop_mutex_);
      stop_cv_.wait(lock, [this] { return stop_requested_; });
    }
    // Every session is closed with 1001 through its carrier; leases stay in the store.
    options_.gateway->shutdown();
    const auto deadline = clock_type::now() + k_close_wait;
    while (open_.load() > 0 && clock_type::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const auto left = open_.load();
    log_.write(log_event(left == 0 ? "info" : "warn", "stopped")
                   .field("connections_left", static_cast<std::int64_t>(left)));

    io_.stop();
    for (auto& t : threads) t.join();
    return 0;
  }

 private:
  void run_io() {
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        log_.write(log_event("error", "io_error").field("error", e.what()));
      }
    }
  }

  void schedule_keepalive() {
    keepalive_.expires_after(options_.ping_interval);
    keepalive_.async_wait([this](const net::error_code& ec) {
      if (ec || stopping_.load()) return;
      std::vector<std::weak_ptr<typename endpoint::connection_type>> all;
      {
        std::lock_guard lock(live_mutex_);
        all.reserve(live_.size());
        for (auto& [key, con] : live_) all.push_back(con);
      }
      for (auto& weak : all) {
        if (auto con = weak.lock()) {
          websocketpp::lib::error_code ping_ec;
          con->ping("", ping_ec);  // refused once the connection is closing: nothing to do
        }
      }
      schedule_keepalive();
    });
  }

  void wait_for_signal() {
    signals_.async_wait([this](const net::error_code& ec, int signo) {
      if (ec) return;
      on_signal(signo);
    });
  }

  // On an I/O thread.
  void on_signal(int signo) {
    if (stopping_.exchange(true)) {
      log_.write(log_event("warn", "forced_exit").field("signal", signal_name(signo)));
      std::_Exit(128 + signo);
    }
    log_.write(log_event("info", "shutting_down")
                   .field("signal", signal_name(signo))
                   .field("connections", static_cast<std::int64_t>(open_.load()))
                   .field("sessions", static_cast<std::uint64_t>(options_.gateway->sessions())));
    net::post(acceptor_strand_, [this] {
      websocketpp::lib::error_code ec;
      accept_retry_.cancel();
      endpoint_.stop_listening(ec);
    });
    {
      std::lock_guard lock(stop_mutex_);
      stop_requested_ = true;
    }
    keepalive_.cancel();
    stop_cv_.notify_all();
    wait_for_signal();
  }

  // The accept loop (websocketpp's own retries at once, forever, when accept fails, e.g.
  // out of file descriptors). Starts and stops on acceptor_strand_.
  void accept() {
    if (stopping_.load()) return;
    connection_ptr con = endpoint_.get_connection();
    if (!con) {
      accept_failed("cannot create a connection");
      return;
    }
    websocketpp::lib::error_code ec;
    endpoint_.async_accept(
        con,
        [this, con](const websocketpp::lib::error_code& accept_ec) { accepted(con, accept_ec); },
        ec);
    if (ec && !stopping_.load()) accept_failed(ec.message());
  }

  // On the new connection's strand.
  void accepted(const connection_ptr& con, const websocketpp::lib::error_code& ec) {
    if (!ec) {
      con->start();
      net::post(acceptor_strand_, [this] { accept(); });
      return;
    }
    if (stopping_.load()) return;
    net::post(acceptor_strand_, [this, message = ec.message()] { accept_failed(message); });
  }

  // On acceptor_strand_: logs at most once a second, and accepts again shortly.
  void accept_failed(const std::string& message) {
    const auto now = clock_type::now();
    if (now - last_accept_log_ >= std::chrono::seconds(1)) {
      last_accept_log_ = now;
      log_.write(log_event("error", "accept_failed").field("error", message));
    }
    accept_retry_.expires_after(k_accept_retry);
    accept_retry_.async_wait(
        net::bind_executor(acceptor_strand_, [this](const net::error_code& ec) {
          if (!ec) accept();
        }));
  }

  connection_ptr connection_of(connection_hdl h) {
    websocketpp::lib::error_code ec;
    auto con = endpoint_.get_con_from_hdl(std::move(h), ec);
    return ec ? nullptr : con;
  }

  // Refuses an upgrade with an HTTP status (no log line from the fail handler then).
  void refuse(const connection_ptr& con, websocketpp::http::status_code::value status,
              std::string_view reason, std::string_view path) {
    con->set_status(status);
    con->replace_header("Content-Type", "text/plain; charset=utf-8");
    con->set_body(std::string(reason) + "\n");
    con->set_fail_handler([](connection_hdl) {});
    log_.write(log_event("info", "upgrade_refused")
                   .field("status", static_cast<int>(status))
                   .field("reason", reason)
                   .field("path", path.substr(0, 256))
                   .field("remote", con->get_remote_endpoint()));
  }

  // The handshake: the path, the subprotocol, and the carrier's handlers.
  bool validate(connection_hdl h) {
    auto con = connection_of(h);
    if (!con) return false;
    const std::string_view path = path_of(con->get_resource());
    if (path != k_path) {
      refuse(con, websocketpp::http::status_code::not_found, "no WebSocket endpoint here", path);
      return false;
    }
    if (stopping_.load()) {
      refuse(con, websocketpp::http::status_code::service_unavailable, "shutting down", path);
      return false;
    }
    const auto& offered = con->get_requested_subprotocols();
    if (!offered.empty()) {
      if (std::find(offered.begin(), offered.end(), k_subprotocol) == offered.end()) {
        refuse(con, websocketpp::http::status_code::bad_request, "subprotocol amp.v1 not offered",
               path);
        return false;
      }
      websocketpp::lib::error_code ec;
      con->select_subprotocol(std::string(k_subprotocol), ec);
    }

    auto c = std::make_shared<carrier>(con, io_);
    std::weak_ptr<typename endpoint::connection_type> opened_con = con;
    con->set_open_handler([this, c, opened_con](connection_hdl) {
      if (auto live = opened_con.lock()) opened(c, live);
    });
    con->set_message_handler([c](connection_hdl, message_ptr msg) { c->on_message(msg); });
    con->set_interrupt_handler([c](connection_hdl) { c->on_interrupt(); });
    con->set_close_handler([this, c](connection_hdl) { closed(c); });
    std::weak_ptr<typename endpoint::connection_type> weak = con;
    con->set_pong_timeout_handler([this, weak](connection_hdl, std::string) {
      auto dead = weak.lock();
      if (!dead) return;
      log_.write(log_event("info", "pong_timeout").field("remote", dead->get_remote_endpoint()));
      websocketpp::lib::error_code ec;
      dead->close(websocketpp::close::status::policy_violation, "no pong", ec);
    });
    return true;
  }

  void opened(const std::shared_ptr<carrier>& c, const connection_ptr& con) {
    open_.fetch_add(1);
    {
      std::lock_guard lock(live_mutex_);
      live_.emplace(c.get(), con);
    }
    if (stopping_.load()) {
      c->close(amp::close_code::going_away, "server shutting down");
      return;
    }
    c->attach(options_.gateway->open_session(c));
  }

  void closed(const std::shared_ptr<carrier>& c) {
    {
      std::lock_guard lock(live_mutex_);
      live_.erase(c.get());
    }
    c->on_closed();
    open_.fetch_sub(1);
  }

  // A connection that failed before it opened; refused upgrades are logged by refuse().
  // Only failed WebSocket upgrades are logged: probes that connect and leave are not news.
  void failed(connection_hdl h) {
    auto con = connection_of(h);
    if (!con || con->get_request_header("Upgrade").empty()) return;
    log_.write(log_event("info", "handshake_failed")
                   .field("error", con->get_ec().message())
                   .field("remote", con->get_remote_endpoint()));
  }

  void serve_http(connection_hdl h) {
    auto con = connection_of(h);
    if (!con) return;
    using status = websocketpp::http::status_code::value;
    namespace code = websocketpp::http::status_code;
    auto reply = [&](status s, std::string_view content_type, std::string body) {
      con->set_status(s);
      con->replace_header("Content-Type", std::string(content_type));
      con->replace_header("Cache-Control", "no-store");
      con->set_body(std::move(body));
    };
    constexpr std::string_view text = "text/plain; charset=utf-8";
    const std::string_view path = path_of(con->get_resource());
    const bool known = path == "/healthz" || path == "/readyz" || path == "/metrics";
    if (!known && path != k_path) return reply(code::not_found, text, "not found\n");
    if (con->get_request().get_method() != "GET") {
      con->replace_header("Allow", "GET");
      return reply(code::method_not_allowed, text, "method not allowed\n");
    }
    if (path == k_path) {
      con->replace_header("Upgrade", "websocket");
      return reply(code::upgrade_required, text, "a WebSocket endpoint (subprotocol amp.v1)\n");
    }
    const bool stopping = stopping_.load();
    if (path == "/healthz") {
      if (stopping) return reply(code::service_unavailable, text, "shutting down");
      return reply(code::ok, text, "ok");
    }
    if (path == "/readyz") {
      if (stopping) return reply(code::service_unavailable, text, "shutting down");
      if (!options_.gateway->ready()) {
        return reply(code::service_unavailable, text, "backend unavailable");
      }
      return reply(code::ok, text, "ready");
    }
    reply(code::ok, "text/plain; version=0.0.4; charset=utf-8", options_.gateway->metrics_text());
  }

  const serve_options& options_;
  logger& log_;
  // Declared before everything that lives on it.
  net::io_context io_;
  endpoint endpoint_;
  net::io_context::strand acceptor_strand_;
  net::steady_timer accept_retry_;
  net::steady_timer keepalive_;
  net::signal_set signals_;
  std::mutex live_mutex_;
  std::map<const void*, std::weak_ptr<typename endpoint::connection_type>> live_;  // open ones
  clock_type::time_point last_accept_log_{};

  std::atomic<bool> stopping_{false};
  std::atomic<std::int64_t> open_{0};  // opened WebSocket connections not yet closed
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;
};

using ssl_context = net::ssl::context;

/// The TLS context of every connection, from tls.cert and tls.key; an error names the key.
/// TLS 1.2 and 1.3 only; for 1.2, forward-secret AEAD suites only, the server's order; no
/// renegotiation, no compression. The key must not be encrypted: the server never prompts.
result<std::shared_ptr<ssl_context>> make_tls_context(const server_config::tls_section& tls) {
  auto ctx = std::make_shared<ssl_context>(ssl_context::tls_server);
  ctx->set_options(ssl_context::default_workarounds | ssl_context::no_sslv2 |
                   ssl_context::no_sslv3 | ssl_context::no_tlsv1 | ssl_context::no_tlsv1_1 |
                   ssl_context::single_dh_use | ssl_context::no_compression);
  SSL_CTX_set_options(ctx->native_handle(),
                      SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  if (SSL_CTX_set_cipher_list(ctx->native_handle(),
                              "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                              "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
                              "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305") != 1) {
    return amp::unexpected(amp::errc::internal, "tls: OpenSSL refused the cipher list");
  }
  // OpenSSL would read a passphrase from the terminal; asking for one is an error here.
  auto asked = std::make_shared<bool>(false);
  ctx->set_password_callback([asked](std::size_t, ssl_context::password_purpose) {
    *asked = true;
    return std::string();
  });
  net::error_code ec;
  ctx->use_certificate_chain_file(*tls.cert, ec);
  if (ec) {
    return amp::unexpected(amp::errc::bad_request,
                           "tls.cert: cannot use " + *tls.cert + ": " + ec.message());
  }
  ctx->use_private_key_file(*tls.key, ssl_context::pem, ec);
  if (ec && *asked) {
    return amp::unexpected(amp::errc::bad_request,
                           "tls.key: " + *tls.key +
                               " is encrypted; amp-server does not ask for passphrases: give it "
                               "the key unencrypted, readable by its user only");
  }
  if (ec) {
    return amp::unexpected(amp::errc::bad_request,
                           "tls.key: cannot use " + *tls.key + ": " + ec.message());
  }
  return ctx;
}

}  // namespace

result<void> check_tls(const server_config& config) {
  if (!config.tls.enabled()) return {};
  auto ctx = make_tls_context(config.tls);
  if (!ctx) return amp::unexpected(ctx.error());
  return {};
}

int serve(const serve_options& options) {
  if (options.config->tls.enabled()) {
    auto ctx = make_tls_context(options.config->tls);
    if (!ctx) {
      std::fprintf(stderr, "amp-server: %s\n", ctx.error().message().c_str());
      return 2;
    }
    ws_server<tls_config> server(options);
    server.raw().set_tls_init_handler([ctx = *ctx](connection_hdl) { return ctx; });
    return server.run();
  }
  ws_server<plain_config> server(options);
  return server.run();
}

}  // namespace amp::server
