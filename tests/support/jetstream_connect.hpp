#pragma once

// Connects a JetStream transport to a test's nats-server: the integration tests' one way to.

#include <catch2/catch.hpp>

#include <memory>

#include "amp/transport/jetstream.hpp"
#include "amp/transport/transport.hpp"
#include "support/checks.hpp"
#include "support/nats_server.hpp"

namespace amp::testing {

/// A transport connected to `server` with `options` (its url set to the server's);
/// REQUIREs the connection, naming the error when there is none.
inline std::shared_ptr<amp::transport> connect_jetstream(const nats_server& server,
                                                         amp::jetstream_options options) {
  options.url = server.url();
  auto t = amp::jetstream_transport::connect(std::move(options));
  INFO("connect: " << text_of(t));
  REQUIRE(t.has_value());
  return *t;
}

}  // namespace amp::testing
