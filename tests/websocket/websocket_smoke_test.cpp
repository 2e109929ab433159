// websocketpp over plain TCP, compiled as C++20 through amp::websocketpp: the handshake,
// frames, limits and plain HTTP that amp-server relies on (spec §1 and §10).

#include <catch2/catch.hpp>

#include <websocketpp/config/asio_no_tls.hpp>
#include <websocketpp/config/asio_no_tls_client.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "websocket/smoke.hpp"

namespace {

namespace ws = amp::testing::websocket;
namespace net = websocketpp::lib::asio;
using server = ws::server<websocketpp::config::asio>;
using client_config = websocketpp::config::asio_client;
using websocketpp::frame::opcode::binary;
using websocketpp::frame::opcode::text;

std::string uri(const server& s) {
  return "ws://127.0.0.1:" + std::to_string(s.port()) + "/amp";
}

ws::outcome exchange(const server& s, const std::vector<std::string>& offered,
                     const std::vector<ws::frame>& to_send, std::size_t replies) {
  return ws::run_client<client_config>(uri(s), offered, to_send, replies);
}

struct http_response {
  bool complete = false;  ///< the server answered and closed the connection
  std::string raw;
  int status = 0;
  std::string body;
};

/// One HTTP/1.1 GET over a plain TCP socket, read until the server closes.
http_response http_get(std::uint16_t port, const std::string& target) {
  http_response response;
  net::io_context io;
  net::ip::tcp::socket socket(io);
  const std::string request = "GET " + target +
                              " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                              "\r\nConnection: close\r\n\r\n";
  socket.async_connect(net::ip::tcp::endpoint(net::ip::address_v4::loopback(), port),
                       [&](const net::error_code& ec) {
                         if (ec) return;
                         net::async_write(socket, net::buffer(request),
                                          [&](const net::error_code& wec, std::size_t) {
                                            if (wec) return;
                                            net::async_read(
                                                socket, net::dynamic_buffer(response.raw),
                                                [&](const net::error_code& rec, std::size_t) {
                                                  response.complete = rec == net::error::eof;
                                                });
                                          });
                       });
  io.run_for(std::chrono::seconds(5));

  // "HTTP/1.1 200 OK\r\n...\r\n\r\nbody"
  if (response.raw.rfind("HTTP/1.1 ", 0) == 0 && response.raw.size() >= 12)
    response.status = std::stoi(response.raw.substr(9, 3));
  if (auto end = response.raw.find("\r\n\r\n"); end != std::string::npos)
    response.body = response.raw.substr(end + 4);
  return response;
}

}  // namespace

TEST_CASE("a client offering amp.v1 gets it selected and its text frames echoed", "[websocket]") {
  server s;

  SECTION("amp.v1 alone") {
    auto out = exchange(s, {"amp.v1"}, {{text, R"({"op":"hello"})"}}, 1);
    REQUIRE_FALSE(out.timed_out);
    REQUIRE(out.opened);
    CHECK(out.http_status == 101);
    CHECK(out.subprotocol == "amp.v1");
    REQUIRE(out.received.size() == 1);
    CHECK(out.received[0].op == text);
    CHECK(out.received[0].payload == R"({"op":"hello"})");
    CHECK(out.remote_close_code == websocketpp::close::status::normal);
  }
  SECTION("amp.v1 among others") {
    auto out = exchange(s, {"foo", "amp.v1"}, {{text, "one"}, {text, "two"}}, 2);
    REQUIRE(out.opened);
    CHECK(out.subprotocol == "amp.v1");
    REQUIRE(out.received.size() == 2);
    CHECK(out.received[0].payload == "one");
    CHECK(out.received[1].payload == "two");
  }
}

TEST_CASE("a handshake offering only other subprotocols is refused with HTTP 400", "[websocket]") {
  server s;
  auto out = exchange(s, {"foo"}, {{text, "never sent"}}, 1);
  REQUIRE_FALSE(out.timed_out);
  CHECK_FALSE(out.opened);
  CHECK(out.failed);
  CHECK(out.http_status == 400);
  CHECK(s.received().empty());
}

TEST_CASE("a client offering no subprotocol is accepted without one", "[websocket]") {
  server s;
  auto out = exchange(s, {}, {{text, "plain"}}, 1);
  REQUIRE_FALSE(out.timed_out);
  REQUIRE(out.opened);
  CHECK(out.subprotocol.empty());
  REQUIRE(out.received.size() == 1);
  CHECK(out.received[0].payload == "plain");
}

TEST_CASE("a frame over the maximum message size closes the connection with 1009", "[websocket]") {
  server s;

  SECTION("one byte over: closed with 1009, nothing delivered") {
    auto out = exchange(s, {"amp.v1"}, {{text, std::string(ws::max_message_bytes + 1, 'x')}}, 0);
    REQUIRE_FALSE(out.timed_out);
    REQUIRE(out.opened);
    CHECK(out.received.empty());
    CHECK(out.remote_close_code == websocketpp::close::status::message_too_big);
    CHECK(out.remote_close_code == 1009);
    CHECK(s.received().empty());
  }
  SECTION("exactly the maximum: echoed") {
    const std::string payload(ws::max_message_bytes, 'y');
    auto out = exchange(s, {"amp.v1"}, {{text, payload}}, 1);
    REQUIRE(out.opened);
    REQUIRE(out.received.size() == 1);
    CHECK(out.received[0].payload == payload);
    CHECK(out.remote_close_code == websocketpp::close::status::normal);
  }
}

TEST_CASE("a binary frame reaches the server's message handler as binary", "[websocket]") {
  server s;
  const std::string payload{'\x00', '\xff', '{', '\x7f', '\x80'};
  auto out = exchange(s, {"amp.v1"}, {{binary, payload}, {text, "after"}}, 2);
  REQUIRE_FALSE(out.timed_out);
  REQUIRE(out.opened);

  auto seen = s.received();
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].op == binary);
  CHECK(seen[0].payload == payload);
  CHECK(seen[1].op == text);

  REQUIRE(out.received.size() == 2);
  CHECK(out.received[0].op == binary);
  CHECK(out.received[0].payload == payload);
}

TEST_CASE("plain HTTP GET /healthz is answered on the WebSocket port", "[websocket]") {
  server s;

  auto health = http_get(s.port(), "/healthz");
  INFO(health.raw);
  CHECK(health.complete);
  CHECK(health.status == 200);
  CHECK(health.body == "ok");

  auto other = http_get(s.port(), "/nope");
  INFO(other.raw);
  CHECK(other.status == 404);

  // The port still upgrades WebSocket handshakes after serving HTTP.
  auto out = exchange(s, {"amp.v1"}, {{text, "still here"}}, 1);
  REQUIRE(out.received.size() == 1);
}
