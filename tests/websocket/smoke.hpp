// A websocketpp server and client shaped like what amp-server needs (spec §1 and §10), for the
// smoke tests that prove websocketpp builds and behaves under C++20 here. Templates over the
// websocketpp config, so the TLS translation unit and the plain one share them.

#pragma once

#include <websocketpp/client.hpp>
#include <websocketpp/server.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace amp::testing::websocket {

inline constexpr const char* subprotocol = "amp.v1";
/// The server's largest accepted message; one byte more closes the connection with 1009.
inline constexpr std::size_t max_message_bytes = 64 * 1024;

using opcode = websocketpp::frame::opcode::value;

struct frame {
  opcode op = websocketpp::frame::opcode::text;
  std::string payload;
};

/// A server on 127.0.0.1 and a free port, run on its own thread until destroyed.
/// - handshake: accepts when no subprotocol is offered, selects `amp.v1` when offered, and
///   refuses with HTTP 400 when only other subprotocols are offered;
/// - plain HTTP: GET /healthz → 200 "ok", anything else → 404;
/// - messages: every frame is recorded and echoed with its opcode;
/// - a message over max_message_bytes closes the connection with 1009.
/// `configure` runs before listening (the TLS test sets its tls_init_handler there).
template <typename Config>
class server {
 public:
  using endpoint = websocketpp::server<Config>;

  explicit server(const std::function<void(endpoint&)>& configure = {}) {
    endpoint_.clear_access_channels(websocketpp::log::alevel::all);
    endpoint_.clear_error_channels(websocketpp::log::elevel::all);
    endpoint_.init_asio(&io_);
    endpoint_.set_max_message_size(max_message_bytes);
    endpoint_.set_validate_handler([this](websocketpp::connection_hdl h) { return validate(h); });
    endpoint_.set_http_handler([this](websocketpp::connection_hdl h) { serve_http(h); });
    endpoint_.set_open_handler([this](websocketpp::connection_hdl h) {
      std::lock_guard lock(mutex_);
      open_.insert(h);
    });
    endpoint_.set_close_handler([this](websocketpp::connection_hdl h) {
      std::lock_guard lock(mutex_);
      open_.erase(h);
    });
    endpoint_.set_message_handler(
        [this](websocketpp::connection_hdl h, typename endpoint::message_ptr msg) {
          {
            std::lock_guard lock(mutex_);
            received_.push_back({msg->get_opcode(), msg->get_payload()});
          }
          websocketpp::lib::error_code ec;
          endpoint_.send(h, msg->get_payload(), msg->get_opcode(), ec);
        });
    if (configure) configure(endpoint_);

    endpoint_.listen(websocketpp::lib::asio::ip::tcp::endpoint(
        websocketpp::lib::asio::ip::address_v4::loopback(), 0));
    websocketpp::lib::asio::error_code ec;
    port_ = endpoint_.get_local_endpoint(ec).port();
    if (ec) throw std::runtime_error("websocket smoke server: no local endpoint: " + ec.message());
    endpoint_.start_accept();
    thread_ = std::thread([this] { io_.run(); });
  }

  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Stops accepting, closes what is still open with 1001 and waits for the thread.
  ~server() {
    websocketpp::lib::asio::post(io_, [this] {
      websocketpp::lib::error_code ec;
      endpoint_.stop_listening(ec);
      std::vector<websocketpp::connection_hdl> still_open;
      {
        std::lock_guard lock(mutex_);
        still_open.assign(open_.begin(), open_.end());
      }
      for (const auto& h : still_open)
        endpoint_.close(h, websocketpp::close::status::going_away, "shutdown", ec);
    });
    thread_.join();
  }

  std::uint16_t port() const { return port_; }

  /// Every data frame the message handler saw, in order.
  std::vector<frame> received() const {
    std::lock_guard lock(mutex_);
    return received_;
  }

 private:
  bool validate(websocketpp::connection_hdl h) {
    auto con = endpoint_.get_con_from_hdl(h);
    const auto& offered = con->get_requested_subprotocols();
    if (offered.empty()) return true;
    if (std::find(offered.begin(), offered.end(), subprotocol) == offered.end()) {
      con->set_status(websocketpp::http::status_code::bad_request);
      return false;
    }
    con->select_subprotocol(subprotocol);
    return true;
  }

  void serve_http(websocketpp::connection_hdl h) {
    auto con = endpoint_.get_con_from_hdl(h);
    if (con->get_request().get_method() == "GET" && con->get_resource() == "/healthz") {
      con->set_status(websocketpp::http::status_code::ok);
      con->replace_header("Content-Type", "text/plain");
      con->set_body("ok");
    } else {
      con->set_status(websocketpp::http::status_code::not_found);
    }
  }

  // Declared before the endpoint: the endpoint's sockets and timers live on it.
  websocketpp::lib::asio::io_context io_;
  endpoint endpoint_;
  std::uint16_t port_ = 0;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::vector<frame> received_;
  std::set<websocketpp::connection_hdl, std::owner_less<websocketpp::connection_hdl>> open_;
};

/// What one client connection saw.
struct outcome {
  bool opened = false;
  bool failed = false;      ///< the handshake or the connection failed before opening
  bool timed_out = false;   ///< the connection had not finished within the time limit
  int http_status = 0;      ///< the status of the server's handshake response
  std::string subprotocol;  ///< Sec-WebSocket-Protocol in the server's response
  std::vector<frame> received;
  websocketpp::close::status::value remote_close_code = websocketpp::close::status::blank;
};

/// Connects to `uri` offering `offered`, sends `to_send` once open, and closes normally once
/// `replies` frames came back (or waits for the server to close when `replies` is 0).
/// Runs on the calling thread, for at most `limit`.
template <typename Config>
outcome run_client(const std::string& uri, const std::vector<std::string>& offered,
                   const std::vector<frame>& to_send, std::size_t replies,
                   const std::function<void(websocketpp::client<Config>&)>& configure = {},
                   std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  using endpoint = websocketpp::client<Config>;
  outcome result;
  bool finished = false;

  websocketpp::lib::asio::io_context io;
  endpoint client;
  client.clear_access_channels(websocketpp::log::alevel::all);
  client.clear_error_channels(websocketpp::log::elevel::all);
  client.init_asio(&io);
  if (configure) configure(client);

  websocketpp::lib::error_code ec;
  auto con = client.get_connection(uri, ec);
  if (ec) throw std::runtime_error("websocket smoke client: " + uri + ": " + ec.message());
  for (const auto& name : offered) con->add_subprotocol(name);

  con->set_open_handler([&](websocketpp::connection_hdl h) {
    result.opened = true;
    auto c = client.get_con_from_hdl(h);
    result.http_status = c->get_response_code();
    result.subprotocol = c->get_response_header("Sec-WebSocket-Protocol");
    for (const auto& f : to_send) {
      websocketpp::lib::error_code send_ec;
      client.send(h, f.payload, f.op, send_ec);
    }
    if (replies == 0 && to_send.empty()) client.close(h, websocketpp::close::status::normal, "");
  });
  con->set_message_handler([&](websocketpp::connection_hdl h, typename endpoint::message_ptr msg) {
    result.received.push_back({msg->get_opcode(), msg->get_payload()});
    if (result.received.size() == replies) {
      websocketpp::lib::error_code close_ec;
      client.close(h, websocketpp::close::status::normal, "done", close_ec);
    }
  });
  con->set_fail_handler([&](websocketpp::connection_hdl h) {
    auto c = client.get_con_from_hdl(h);
    result.failed = true;
    result.http_status = c->get_response_code();
    finished = true;
  });
  con->set_close_handler([&](websocketpp::connection_hdl h) {
    result.remote_close_code = client.get_con_from_hdl(h)->get_remote_close_code();
    finished = true;
  });

  client.connect(con);
  io.run_for(limit);
  result.timed_out = !finished;
  return result;
}

}  // namespace amp::testing::websocket
