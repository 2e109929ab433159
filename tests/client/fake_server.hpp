// A scripted amp.v1 server for the client and CLI tests: a websocketpp server on 127.0.0.1
// and a free port, on a thread of its own, that hands every frame it receives to the test's
// script. The script plays the server's side of an exchange (answers hello, replies in any
// order, pushes, closes with a code); everything it does runs on the server thread.

#pragma once

#include <websocketpp/config/asio_no_tls.hpp>
#include <websocketpp/server.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "amp/client.hpp"

namespace amp::testing {

struct fake_server_settings {
  bool refuse_handshake = false;  ///< answer every upgrade with HTTP 400
};

/// One connection as the script sees it. Use it on the server thread only (in the script, or
/// through `with_peer`).
class fake_peer {
 public:
  fake_peer(std::size_t index, std::function<void(const std::string&)> send,
            std::function<void(int, const std::string&)> close)
      : index_(index), send_(std::move(send)), close_(std::move(close)) {}
  void send(const std::string& text) { send_(text); }
  void close(int code, const std::string& reason = {}) { close_(code, reason); }
  /// 0 for the first connection the server accepted, 1 for the next …
  std::size_t index() const { return index_; }

 private:
  std::size_t index_;
  std::function<void(const std::string&)> send_;
  std::function<void(int, const std::string&)> close_;
};

/// A frame the server received.
struct fake_frame_in {
  std::size_t connection = 0;
  bool binary = false;
  std::string text;
};

/// Called for every frame received, on the server thread.
using fake_script = std::function<void(fake_peer&, const fake_frame_in&)>;

/// The server over a websocketpp config: `websocketpp::config::asio` (the `fake_server`
/// below), or a TLS one with its handshake set up by `configure`.
template <class Config>
class basic_fake_server {
 public:
  using endpoint = websocketpp::server<Config>;
  using peer = fake_peer;
  using frame_in = fake_frame_in;
  using script = fake_script;
  using settings = fake_server_settings;

  explicit basic_fake_server(script s, settings options = {},
                             const std::function<void(endpoint&)>& configure = {})
      : script_(std::move(s)), settings_(options) {
    endpoint_.clear_access_channels(websocketpp::log::alevel::all);
    endpoint_.clear_error_channels(websocketpp::log::elevel::all);
    endpoint_.init_asio(&io_);
    endpoint_.set_reuse_addr(true);
    endpoint_.set_validate_handler([this](websocketpp::connection_hdl h) { return validate(h); });
    endpoint_.set_open_handler([this](websocketpp::connection_hdl h) {
      auto send = [this, h](const std::string& text) {
        websocketpp::lib::error_code ec;
        endpoint_.send(h, text, websocketpp::frame::opcode::text, ec);
      };
      auto close = [this, h](int code, const std::string& reason) {
        websocketpp::lib::error_code ec;
        endpoint_.close(h, static_cast<websocketpp::close::status::value>(code), reason, ec);
      };
      std::lock_guard lock(mutex_);
      peers_.emplace(h, peer(next_index_++, send, close));
    });
    endpoint_.set_close_handler([this](websocketpp::connection_hdl h) {
      std::lock_guard lock(mutex_);
      peers_.erase(h);
    });
    endpoint_.set_message_handler(
        [this](websocketpp::connection_hdl h, typename endpoint::message_ptr m) {
          frame_in f;
          f.binary = m->get_opcode() == websocketpp::frame::opcode::binary;
          f.text = m->get_payload();
          peer* p = nullptr;
          {
            std::lock_guard lock(mutex_);
            auto it = peers_.find(h);
            if (it == peers_.end()) return;
            p = &it->second;
            f.connection = p->index();
            received_.push_back(f);
          }
          if (script_) script_(*p, f);
        });
    endpoint_.listen(websocketpp::lib::asio::ip::tcp::endpoint(
        websocketpp::lib::asio::ip::address_v4::loopback(), 0));
    if (configure) configure(endpoint_);
    websocketpp::lib::asio::error_code ec;
    port_ = endpoint_.get_local_endpoint(ec).port();
    if (ec) throw std::runtime_error("fake server: no local endpoint: " + ec.message());
    endpoint_.start_accept();
    thread_ = std::thread([this] {
      io_.run();
      done_.set_value();
    });
  }

  basic_fake_server(const basic_fake_server&) = delete;
  basic_fake_server& operator=(const basic_fake_server&) = delete;

  /// Stops listening, closes what is open with 1001 and stops the thread (at most ~3 s).
  ~basic_fake_server() {
    websocketpp::lib::asio::post(io_, [this] {
      websocketpp::lib::error_code ec;
      endpoint_.stop_listening(ec);
      std::vector<websocketpp::connection_hdl> open;
      {
        std::lock_guard lock(mutex_);
        for (auto& [h, p] : peers_) open.push_back(h);
      }
      for (auto& h : open) endpoint_.close(h, websocketpp::close::status::going_away, "", ec);
    });
    if (done_future_.wait_for(std::chrono::seconds(3)) != std::future_status::ready) io_.stop();
    thread_.join();
  }

  std::uint16_t port() const { return port_; }
  std::string url() const {
    return std::string(endpoint_.is_secure() ? "wss" : "ws") +
           "://127.0.0.1:" + std::to_string(port_) + "/amp";
  }

  /// Every frame received so far, in order.
  std::vector<frame_in> received() const {
    std::lock_guard lock(mutex_);
    return received_;
  }
  /// The text frames received so far, parsed (those that parse).
  std::vector<client_frame> frames() const {
    std::vector<client_frame> out;
    for (auto& f : received()) {
      if (f.binary) continue;
      if (auto parsed = client_frame::parse(f.text)) out.push_back(*parsed);
    }
    return out;
  }
  /// The received frames whose op is `op`.
  std::vector<client_frame> frames(std::string_view op) const {
    std::vector<client_frame> out;
    for (auto& f : frames()) {
      if (f.op() == op) out.push_back(f);
    }
    return out;
  }
  /// The subprotocols each handshake offered, in order of arrival.
  std::vector<std::vector<std::string>> offered_subprotocols() const {
    std::lock_guard lock(mutex_);
    return offered_;
  }

  /// Runs `fn` on the server thread with the peer of the latest open connection, and waits.
  void with_peer(const std::function<void(peer&)>& fn) {
    std::promise<void> ran;
    websocketpp::lib::asio::post(io_, [&] {
      peer* latest = nullptr;
      {
        std::lock_guard lock(mutex_);
        for (auto& [h, p] : peers_) {
          if (latest == nullptr || p.index() > latest->index()) latest = &p;
        }
      }
      if (latest != nullptr) fn(*latest);
      ran.set_value();
    });
    ran.get_future().wait();
  }

 private:
  bool validate(websocketpp::connection_hdl h) {
    auto con = endpoint_.get_con_from_hdl(h);
    {
      std::lock_guard lock(mutex_);
      offered_.push_back(con->get_requested_subprotocols());
    }
    if (settings_.refuse_handshake) {
      con->set_status(websocketpp::http::status_code::bad_request);
      return false;
    }
    const auto& offered = con->get_requested_subprotocols();
    if (std::find(offered.begin(), offered.end(), "amp.v1") != offered.end()) {
      con->select_subprotocol("amp.v1");
    }
    return true;
  }

  script script_;
  settings settings_;
  websocketpp::lib::asio::io_context io_;  // before the endpoint: its sockets live on it
  endpoint endpoint_;
  std::uint16_t port_ = 0;
  std::promise<void> done_;
  std::future<void> done_future_ = done_.get_future();
  std::thread thread_;
  mutable std::mutex mutex_;
  std::map<websocketpp::connection_hdl, peer, std::owner_less<websocketpp::connection_hdl>> peers_;
  std::size_t next_index_ = 0;
  std::vector<frame_in> received_;
  std::vector<std::vector<std::string>> offered_;
};

using fake_server = basic_fake_server<websocketpp::config::asio>;

/// The `ok` of a hello with request id `id_json`: participant alice of ns demo.
inline std::string welcome(const std::string& id_json, std::size_t max_frame_bytes = 1048576) {
  return R"({"op":"ok","id":)" + id_json +
         R"(,"session":"sess-1","participant":"alice","ns":"demo","heartbeat_s":10,)"
         R"("registry_ttl_s":30,"max_frame_bytes":)" +
         std::to_string(max_frame_bytes) + R"(,"server":"fake-server/1.0"})";
}

/// `{"op":"ok","id":<id>,<fields>}` for the request `f`.
inline std::string ok_for(const client_frame& f, const std::string& fields = {}) {
  return R"({"op":"ok","id":)" + f.raw_at("/id").value_or("null") +
         (fields.empty() ? "" : "," + fields) + "}";
}

/// `{"op":"error","id":<id>,"code":…,"message":…}` for the request `f`.
inline std::string error_for(const client_frame& f, const std::string& code,
                             const std::string& message, const std::string& extra = {}) {
  return R"({"op":"error","id":)" + f.raw_at("/id").value_or("null") + R"(,"code":")" + code +
         R"(","message":")" + message + "\"" + (extra.empty() ? "" : "," + extra) + "}";
}

/// A script that answers hello with `welcome` and hands every other parsed text frame to
/// `then` (binary and unparsable frames too, with an empty frame).
inline fake_script after_hello(std::function<void(fake_peer&, const client_frame&)> then,
                               std::size_t max_frame_bytes = 1048576) {
  return [then = std::move(then), max_frame_bytes](fake_peer& p, const fake_frame_in& in) {
    auto f = in.binary ? result<client_frame>(client_frame()) : client_frame::parse(in.text);
    if (!f) f = client_frame();
    if (f->op() == "hello") {
      p.send(welcome(f->raw_at("/id").value_or("null"), max_frame_bytes));
      return;
    }
    if (then) then(p, *f);
  };
}

}  // namespace amp::testing
