#pragma once

/// \file
/// The in-memory transport: the embedded default and the backend of deterministic
/// tests. It emulates the JetStream semantics of `amp::transport` in-process, driven by
/// an `amp::clock`: give it a `manual_clock` and AckWait redelivery, Nak delays, fetch
/// timeouts and TTLs happen exactly when the test moves time past them. Nothing is
/// persisted: the data lives as long as the transport object.

#include <memory>

#include "amp/clock.hpp"
#include "amp/transport/transport.hpp"

namespace amp {

struct memory_transport_options {
  /// The clock to stamp and expire by; the system clock when null.
  std::shared_ptr<amp::clock> clock{};
  /// Receives one line ("a handler of … threw: …") for each exception that a completion
  /// handler, subscription handler or watch callback throws; see `transport`. Standard
  /// error when empty. Called on the thread that ran the handler; must not throw.
  std::function<void(std::string_view)> on_handler_error{};
};

/// Factory of in-memory transports. Thread-safe; see `transport` for the threading of
/// handlers. Handlers and watch callbacks run on the calling thread, or on the thread
/// that publishes or moves the clock (a `manual_clock`'s `advance`, or the system clock's
/// timer thread).
class memory_transport {
 public:
  memory_transport() = delete;
  static std::shared_ptr<transport> create(memory_transport_options options = {});
};

}  // namespace amp
