#pragma once

// The link over a websocketpp client endpoint, shared by the plain and the TLS translation
// units (each instantiates it with its own websocketpp config).

#include <websocketpp/client.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "amp/client.hpp"
#include "ws_link.hpp"

namespace amp::client_detail {

/// The largest message accepted from the server: the largest `max_frame_bytes` a server
/// may be configured with (64 MiB, spec §11).
inline constexpr std::size_t k_max_message_bytes = std::size_t{64} << 20;
/// How long the closing handshake may take before the connection is dropped.
inline constexpr long k_close_handshake_ms = 1000;

template <class Config>
class ws_link final : public link {
 public:
  using endpoint_type = websocketpp::client<Config>;

  ws_link(asio::io_context& io, link_settings settings, link_events events)
      : settings_(std::move(settings)), events_(std::move(events)) {
    endpoint_.clear_access_channels(websocketpp::log::alevel::all);
    endpoint_.clear_error_channels(websocketpp::log::elevel::all);
    endpoint_.init_asio(&io);
    endpoint_.set_max_message_size(k_max_message_bytes);
    // Frames are small and answered at once: without TCP_NODELAY, Nagle's algorithm and the
    // peer's delayed ACK hold a frame back up to 40 ms.
    // (Set once the socket is connected: the socket init handler runs before it is open.)
    endpoint_.set_tcp_pre_init_handler([this](websocketpp::connection_hdl h) {
      websocketpp::lib::error_code ec;
      auto con = endpoint_.get_con_from_hdl(std::move(h), ec);
      if (ec || !con) return;
      websocketpp::lib::asio::error_code ignored;
      con->get_raw_socket().set_option(websocketpp::lib::asio::ip::tcp::no_delay(true), ignored);
    });
    const auto open_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(settings_.open_timeout).count();
    endpoint_.set_open_handshake_timeout(static_cast<long>(open_ms > 0 ? open_ms : 1));
    endpoint_.set_close_handshake_timeout(k_close_handshake_ms);
  }

  endpoint_type& endpoint() noexcept { return endpoint_; }
  /// A better account of a failed opening than websocketpp's, when there is one (the TLS
  /// link knows why a certificate was refused; websocketpp only says the handshake failed).
  void set_failure_detail(std::function<std::string()> detail) {
    failure_detail_ = std::move(detail);
  }
  const link_settings& settings() const noexcept { return settings_; }

  result<void> start() override {
    websocketpp::lib::error_code ec;
    con_ = endpoint_.get_connection(settings_.url, ec);
    if (ec) {
      return unexpected(errc::bad_request, "cannot use URL " + settings_.url + ": " + ec.message());
    }
    con_->add_subprotocol(std::string(client_subprotocol), ec);
    if (ec) return unexpected(errc::internal, "cannot offer amp.v1: " + ec.message());
    con_->set_open_handler([this](websocketpp::connection_hdl) { events_.opened(); });
    con_->set_message_handler(
        [this](websocketpp::connection_hdl, typename endpoint_type::message_ptr message) {
          events_.received(std::move(message->get_raw_payload()));
        });
    con_->set_fail_handler(
        [this](websocketpp::connection_hdl) { events_.failed(describe_failure()); });
    con_->set_close_handler([this](websocketpp::connection_hdl) {
      events_.closed(static_cast<int>(con_->get_remote_close_code()),
                     con_->get_remote_close_reason());
    });
    endpoint_.connect(con_);
    return {};
  }

  result<void> send(const std::string& payload, bool binary) override {
    if (!con_ || con_->get_state() != websocketpp::session::state::open) {
      return unexpected(errc::unavailable, "the connection is not open");
    }
    const auto ec = con_->send(
        payload, binary ? websocketpp::frame::opcode::binary : websocketpp::frame::opcode::text);
    if (ec) return unexpected(errc::unavailable, "cannot send: " + ec.message());
    return {};
  }

  void close(int code, const std::string& reason) override {
    if (!con_) return;
    websocketpp::lib::error_code ec;
    if (con_->get_state() == websocketpp::session::state::connecting) {
      // No closing handshake before the opening one ended: drop the connection.
      con_->terminate(ec);
      return;
    }
    con_->close(static_cast<websocketpp::close::status::value>(code), reason, ec);
  }

 private:
  std::string describe_failure() const {
    if (failure_detail_) {
      if (auto detail = failure_detail_(); !detail.empty()) return detail;
    }
    const int status = static_cast<int>(con_->get_response_code());
    if (status != 0 && status != 101) {
      return "the server refused the WebSocket handshake with HTTP " + std::to_string(status) +
             (con_->get_response_msg().empty() ? "" : " " + con_->get_response_msg());
    }
    if (auto tec = con_->get_transport_ec()) return tec.message();
    return con_->get_ec().message();
  }

  link_settings settings_;
  link_events events_;
  std::function<std::string()> failure_detail_;
  endpoint_type endpoint_;
  typename endpoint_type::connection_ptr con_;
};

}  // namespace amp::client_detail
