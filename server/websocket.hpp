#pragma once

// The WebSocket side of amp-server, kept apart so that websocketpp (slow and heavy to
// compile) stays in one translation unit: the endpoint at /amp, HTTP beside it, signals
// and the graceful shutdown. No AMP rule lives here; every frame goes to the session.

#include <chrono>
#include <memory>
#include <string>

#include "amp/gateway/config.hpp"
#include "amp/gateway/session.hpp"
#include "amp/result.hpp"
#include "log.hpp"

namespace amp::server {

struct serve_options {
  /// The configuration the gateway was opened with (listen, tls, limits.max_frame_bytes).
  const server_config* config = nullptr;
  std::shared_ptr<amp::gateway> gateway;
  logger* log = nullptr;
  int io_threads = 2;
  /// How often every connection is pinged; one that does not answer within
  /// min(ping_interval, 10 s) is closed.
  std::chrono::seconds ping_interval{30};
  /// Extra fields of the `listening` line.
  std::string transport_name;
  std::string version;
};

/// Checks that tls.cert and tls.key (when set) make a usable TLS server context, before
/// anything else starts. Errors: `bad_request` naming the key.
result<void> check_tls(const server_config& config);

/// Listens, serves until SIGTERM or SIGINT, shuts the gateway down and waits (at most
/// about 5 s) for the connections to finish their close handshakes. Returns the exit
/// status: 0 after a shutdown, 1 when it cannot listen, 2 when the TLS files are
/// unusable (a message naming the key is printed on stderr then).
int serve(const serve_options& options);

}  // namespace amp::server
