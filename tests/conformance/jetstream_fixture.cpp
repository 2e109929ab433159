// The conformance suite on a real nats-server: each test process starts its own server
// (JetStream, free loopback port, temporary store) and stops it when the case ends.

#include <atomic>
#include <stdexcept>
#include <thread>

#include "amp/transport/jetstream.hpp"
#include "conformance/fixture.hpp"
#include "support/nats_server.hpp"

namespace amp::conformance {
namespace {

class jetstream_fixture final : public fixture {
 public:
  jetstream_fixture() : server_(testing::nats_server::start()) {
    auto t = jetstream_transport::connect({.url = server_.url(),
                                           .op_timeout = std::chrono::seconds(5),
                                           .on_handler_error = error_sink()});
    if (!t) throw std::runtime_error("connect: " + t.error().to_string());
    transport_ = *t;
  }

  amp::transport& transport() override { return *transport_; }
  std::shared_ptr<amp::transport> shared_transport() override { return transport_; }

  // JetStream's timers (AckWait, Nak delay, max age, duplicate window) run on the server's
  // clock; give them a little slack to fire.
  void advance(amp::duration d) override {
    std::this_thread::sleep_for(d + std::chrono::milliseconds(150));
  }

  std::string unique(std::string_view base) override {
    static std::atomic<int> counter{0};
    return std::string(base) + "_" + std::to_string(++counter);
  }

  bool real_time() const override { return true; }

 private:
  testing::nats_server server_;
  std::shared_ptr<amp::transport> transport_;
};

}  // namespace

std::unique_ptr<fixture> make_fixture() {
  return std::make_unique<jetstream_fixture>();
}

}  // namespace amp::conformance
