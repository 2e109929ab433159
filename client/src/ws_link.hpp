#pragma once

// The WebSocket connection under amp::client, behind a small interface so that client.cpp
// holds no websocketpp type: one implementation over plain TCP (ws_link_plain.cpp), one over
// TLS (ws_link_tls.cpp, the slow translation unit to compile). Both run on the client's
// io_context; every member function and every event runs on its thread.

#include <asio/io_context.hpp>

#include <functional>
#include <memory>
#include <string>

#include "amp/clock.hpp"
#include "amp/result.hpp"

namespace amp::client_detail {

/// What a link reports, on the I/O thread.
struct link_events {
  std::function<void()> opened;                       ///< the handshake succeeded
  std::function<void(std::string payload)> received;  ///< a text or binary message
  /// The connection closed after it had opened: the code the server sent (1006 when it
  /// sent none) and its reason.
  std::function<void(int code, std::string reason)> closed;
  /// The connection failed before it opened: what went wrong.
  std::function<void(std::string what)> failed;
};

struct link_settings {
  std::string url;
  duration open_timeout;    ///< TCP, TLS and the WebSocket handshake
  bool verify_peer = true;  ///< TLS only
  std::string ca_file;      ///< TLS only
};

class link {
 public:
  virtual ~link() = default;
  link(const link&) = delete;
  link& operator=(const link&) = delete;

  /// Starts connecting. Errors: `bad_request` for a URL the link cannot use.
  virtual result<void> start() = 0;
  /// Sends one message. Errors: `unavailable` when the connection is not open.
  virtual result<void> send(const std::string& payload, bool binary) = 0;
  /// Starts the closing handshake; `closed` follows.
  virtual void close(int code, const std::string& reason) = 0;

 protected:
  link() = default;
};

/// A link for `ws://` URLs.
std::unique_ptr<link> make_plain_link(asio::io_context& io, link_settings settings,
                                      link_events events);
/// A link for `wss://` URLs. Errors: `bad_request` for a `ca_file` that cannot be loaded.
result<std::unique_ptr<link>> make_tls_link(asio::io_context& io, link_settings settings,
                                            link_events events);

}  // namespace amp::client_detail
