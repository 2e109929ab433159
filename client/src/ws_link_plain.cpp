// The link over plain TCP (ws://).

#include <websocketpp/config/asio_no_tls_client.hpp>

#include "ws_link_impl.hpp"

namespace amp::client_detail {

std::unique_ptr<link> make_plain_link(asio::io_context& io, link_settings settings,
                                      link_events events) {
  return std::make_unique<ws_link<websocketpp::config::asio_client>>(io, std::move(settings),
                                                                     std::move(events));
}

}  // namespace amp::client_detail
