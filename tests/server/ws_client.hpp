#pragma once

// WebSocket clients for the amp-server tests: `ws_client`, a websocketpp client on its own
// thread with blocking calls (connect, send, next frame, wait for the close), and
// `raw_ws_client`, a socket that performs the handshake by hand and then reads only when
// told to (a client that does not read its frames).

#include <websocketpp/client.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace amp::testing {

using namespace std::chrono_literals;

template <class Config>
class ws_client {
 public:
  using endpoint = websocketpp::client<Config>;
  using opcode = websocketpp::frame::opcode::value;

  /// Starts connecting to `uri` offering `offered`; `configure` runs before (TLS).
  ws_client(const std::string& uri, const std::vector<std::string>& offered,
            const std::function<void(endpoint&)>& configure = {}) {
    endpoint_.clear_access_channels(websocketpp::log::alevel::all);
    endpoint_.clear_error_channels(websocketpp::log::elevel::all);
    endpoint_.init_asio(&io_);
    if (configure) configure(endpoint_);
    websocketpp::lib::error_code ec;
    auto con = endpoint_.get_connection(uri, ec);
    if (ec) throw std::runtime_error("ws_client: " + uri + ": " + ec.message());
    con->set_max_message_size(64u << 20);
    for (const auto& name : offered) con->add_subprotocol(name);
    con->set_open_handler([this](websocketpp::connection_hdl h) {
      auto c = endpoint_.get_con_from_hdl(h);
      std::lock_guard lock(mutex_);
      hdl_ = h;
      opened_ = true;
      http_status_ = c->get_response_code();
      subprotocol_ = c->get_response_header("Sec-WebSocket-Protocol");
      cv_.notify_all();
    });
    con->set_fail_handler([this](websocketpp::connection_hdl h) {
      auto c = endpoint_.get_con_from_hdl(h);
      std::lock_guard lock(mutex_);
      failed_ = true;
      http_status_ = c->get_response_code();
      cv_.notify_all();
    });
    con->set_message_handler(
        [this](websocketpp::connection_hdl, typename endpoint::message_ptr msg) {
          std::lock_guard lock(mutex_);
          frames_.push_back({msg->get_opcode(), msg->get_payload()});
          cv_.notify_all();
        });
    con->set_close_handler([this](websocketpp::connection_hdl h) {
      auto c = endpoint_.get_con_from_hdl(h);
      std::lock_guard lock(mutex_);
      closed_ = true;
      close_code_ = c->get_remote_close_code();
      close_reason_ = c->get_remote_close_reason();
      cv_.notify_all();
    });
    endpoint_.connect(con);
    thread_ = std::thread([this] { io_.run(); });
  }

  ~ws_client() {
    io_.stop();
    thread_.join();
  }

  ws_client(const ws_client&) = delete;
  ws_client& operator=(const ws_client&) = delete;

  /// True once open; false when the handshake failed or `limit` passed.
  bool wait_open(std::chrono::milliseconds limit = 10s) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, limit, [this] { return opened_ || failed_; });
    return opened_;
  }
  bool failed() const {
    std::lock_guard lock(mutex_);
    return failed_;
  }
  /// The HTTP status of the handshake's response.
  int http_status() const {
    std::lock_guard lock(mutex_);
    return http_status_;
  }
  std::string subprotocol() const {
    std::lock_guard lock(mutex_);
    return subprotocol_;
  }

  void send(const std::string& payload, opcode op = websocketpp::frame::opcode::text) {
    websocketpp::connection_hdl h;
    {
      std::lock_guard lock(mutex_);
      h = hdl_;
    }
    websocketpp::lib::error_code ec;
    endpoint_.send(h, payload, op, ec);
    if (ec) throw std::runtime_error("ws_client: send: " + ec.message());
  }

  /// The next frame received (text or binary payload), waiting at most `limit`.
  std::optional<std::string> next(std::chrono::milliseconds limit = 10s) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, limit, [this] { return !frames_.empty() || closed_; });
    if (frames_.empty()) return std::nullopt;
    auto f = std::move(frames_.front().second);
    frames_.pop_front();
    return f;
  }

  /// The next frame holding `"op":"<op>"`, skipping others.
  std::optional<std::string> next_op(std::string_view op, std::chrono::milliseconds limit = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    const std::string needle = "\"op\":\"" + std::string(op) + "\"";
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) return std::nullopt;
      auto f = next(left);
      if (!f) return std::nullopt;
      if (f->find(needle) != std::string::npos) return f;
    }
  }

  /// The close code the server sent, once closed; nothing after `limit`.
  std::optional<int> wait_closed(std::chrono::milliseconds limit = 10s) {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, limit, [this] { return closed_ || failed_; })) return std::nullopt;
    if (!closed_) return std::nullopt;
    return static_cast<int>(close_code_);
  }
  std::string close_reason() const {
    std::lock_guard lock(mutex_);
    return close_reason_;
  }

  void close() {
    websocketpp::connection_hdl h;
    {
      std::lock_guard lock(mutex_);
      h = hdl_;
    }
    websocketpp::lib::error_code ec;
    endpoint_.close(h, websocketpp::close::status::normal, "", ec);
  }

 private:
  websocketpp::lib::asio::io_context io_;
  endpoint endpoint_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  websocketpp::connection_hdl hdl_;
  bool opened_ = false;
  bool failed_ = false;
  bool closed_ = false;
  int http_status_ = 0;
  std::string subprotocol_;
  websocketpp::close::status::value close_code_ = 0;
  std::string close_reason_;
  std::deque<std::pair<opcode, std::string>> frames_;
};

/// A WebSocket client on a bare socket that reads nothing unless asked: the handshake by
/// hand, masked text frames out, and the server's frames left in the socket.
class raw_ws_client {
 public:
  /// Connects and upgrades at /amp on 127.0.0.1:`port`, with a small receive buffer.
  /// @throws std::runtime_error when the upgrade does not succeed.
  explicit raw_ws_client(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) throw std::runtime_error("raw_ws_client: socket");
    int small = 16 * 1024;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    timeval timeout{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
      ::close(fd_);
      throw std::runtime_error("raw_ws_client: connect");
    }
    write_all(
        "GET /amp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: amp.v1\r\n\r\n");
    std::string response;
    char c = 0;
    while (response.find("\r\n\r\n") == std::string::npos) {
      if (::recv(fd_, &c, 1, 0) != 1) break;
      response.push_back(c);
    }
    if (response.rfind("HTTP/1.1 101", 0) != 0) {
      ::close(fd_);
      throw std::runtime_error("raw_ws_client: no upgrade: " + response);
    }
  }
  ~raw_ws_client() { ::close(fd_); }
  raw_ws_client(const raw_ws_client&) = delete;
  raw_ws_client& operator=(const raw_ws_client&) = delete;

  /// Sends one masked text frame.
  void send(std::string_view text) {
    std::string frame;
    frame.push_back(static_cast<char>(0x81));  // FIN, text
    const std::uint64_t n = text.size();
    if (n < 126) {
      frame.push_back(static_cast<char>(0x80 | n));
    } else if (n <= 0xffff) {
      frame.push_back(static_cast<char>(0x80 | 126));
      frame.push_back(static_cast<char>(n >> 8));
      frame.push_back(static_cast<char>(n & 0xff));
    } else {
      frame.push_back(static_cast<char>(0x80 | 127));
      for (int shift = 56; shift >= 0; shift -= 8) frame.push_back(static_cast<char>(n >> shift));
    }
    const unsigned char mask[4] = {0x12, 0x34, 0x56, 0x78};
    for (unsigned char m : mask) frame.push_back(static_cast<char>(m));
    for (std::size_t i = 0; i < text.size(); ++i) {
      frame.push_back(static_cast<char>(static_cast<unsigned char>(text[i]) ^ mask[i % 4]));
    }
    write_all(frame);
  }

  /// Reads the server's frames until it closes or `limit` passes: the text payloads, and
  /// the close code (0 when none came).
  struct drained {
    std::vector<std::string> texts;
    int close_code = 0;
  };
  drained drain(std::chrono::milliseconds limit = 20s) {
    drained out;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    timeval poll{0, 200000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &poll, sizeof poll);
    std::string buffer;
    char chunk[65536];
    while (std::chrono::steady_clock::now() < deadline) {
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n == 0) break;
      if (n > 0) buffer.append(chunk, static_cast<std::size_t>(n));
      // Whole frames off the front (the server's frames are not masked).
      for (;;) {
        if (buffer.size() < 2) break;
        const auto b0 = static_cast<unsigned char>(buffer[0]);
        std::uint64_t len = static_cast<unsigned char>(buffer[1]) & 0x7f;
        std::size_t header = 2;
        if (len == 126) {
          if (buffer.size() < 4) break;
          len = (std::uint64_t{static_cast<unsigned char>(buffer[2])} << 8) |
                static_cast<unsigned char>(buffer[3]);
          header = 4;
        } else if (len == 127) {
          if (buffer.size() < 10) break;
          len = 0;
          for (int i = 2; i < 10; ++i) len = (len << 8) | static_cast<unsigned char>(buffer[i]);
          header = 10;
        }
        if (buffer.size() < header + len) break;
        std::string payload = buffer.substr(header, len);
        buffer.erase(0, header + len);
        const int op = b0 & 0x0f;
        if (op == 0x1) out.texts.push_back(std::move(payload));
        if (op == 0x8) {
          if (payload.size() >= 2) {
            out.close_code = (static_cast<unsigned char>(payload[0]) << 8) |
                             static_cast<unsigned char>(payload[1]);
          }
          return out;
        }
      }
    }
    return out;
  }

 private:
  void write_all(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("raw_ws_client: send failed");
      data.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  int fd_ = -1;
};

}  // namespace amp::testing
