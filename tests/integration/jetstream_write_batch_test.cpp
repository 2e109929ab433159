// Write batches on the JetStream transport: what a thread publishes while a batch is open goes
// out when the batch ends (src/detail/write_batch.hpp, src/transport/jetstream/socket_loop.hpp).
// Checked here against a real nats-server: held writes reach it, a blocking call inside a batch
// is answered, and publishers on many threads, in batches and out of them, are all answered
// without the connection ever being dropped (a write of nothing once counted as a closed
// connection and made cnats reconnect).

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "amp/transport/jetstream.hpp"
#include "amp/transport/transport.hpp"
#include "detail/write_batch.hpp"
#include "support/checks.hpp"
#include "support/jetstream_connect.hpp"
#include "support/nats_server.hpp"

namespace {

using namespace std::chrono_literals;
using amp::testing::must;
using amp::testing::nats_server;
using amp::testing::text_of;

std::shared_ptr<amp::transport> connect(const nats_server& server) {
  return amp::testing::connect_jetstream(server,
                                         {.name = "amp-write-batch-test", .op_timeout = 5s});
}

amp::stream_config stream(std::string name, std::string subjects) {
  amp::stream_config c;
  c.name = std::move(name);
  c.subjects = {std::move(subjects)};
  return c;
}

// Counts the answers of asynchronous publishes.
struct answers {
  std::mutex mu;
  std::condition_variable cv;
  int ok = 0;
  std::vector<std::string> errors;

  amp::completion<amp::publish_ack> handler() {
    return [this](amp::result<amp::publish_ack> r) {
      std::lock_guard lock(mu);
      if (r) {
        ++ok;
      } else {
        errors.push_back(r.error().message());
      }
      cv.notify_all();
    };
  }
  bool wait_for(int n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, 20s, [&] { return ok + static_cast<int>(errors.size()) >= n; });
  }
};

}  // namespace

TEST_CASE(
    "publishes held in a write batch are stored when it ends, and a blocking call in "
    "one is answered",
    "[jetstream][write_batch]") {
  auto server = nats_server::start();
  auto tp = connect(server);
  auto& t = *tp;
  must(t.ensure_stream(stream("HELD", "held.>")));
  answers got;
  {
    amp::detail::write_batch batch;
    for (int i = 0; i < 10; ++i) {
      t.async_publish({.subject = "held.a", .data = std::to_string(i)}, got.handler());
    }
    // Blocking: it must send what the batch holds (its own request among it) before it waits.
    auto r = t.publish({.subject = "held.b", .data = "blocking"});
    INFO(text_of(r));
    REQUIRE(r.has_value());
    CHECK(r->seq == 11);
  }
  REQUIRE(got.wait_for(10));
  CHECK(got.errors.empty());
  CHECK(got.ok == 10);
  auto info = must(t.stream_info_of("HELD"));
  CHECK(info.state.messages == 11);
}

TEST_CASE("publishers on many threads, in write batches and out of them, are all answered",
          "[jetstream][write_batch]") {
  auto server = nats_server::start();
  auto tp = connect(server);
  auto& t = *tp;
  must(t.ensure_stream(stream("MANY", "many.>")));
  constexpr int threads = 4;
  constexpr int rounds = 200;
  constexpr int per_round = 3;
  answers got;
  std::vector<std::thread> publishers;
  for (int p = 0; p < threads; ++p) {
    publishers.emplace_back([&, p] {
      for (int i = 0; i < rounds; ++i) {
        auto publish_round = [&] {
          for (int k = 0; k < per_round; ++k) {
            t.async_publish({.subject = "many." + std::to_string(p), .data = "x"}, got.handler());
          }
        };
        if ((i + p) % 2 == 0) {
          amp::detail::write_batch batch;
          publish_round();
        } else {
          publish_round();
        }
      }
    });
  }
  for (auto& th : publishers) th.join();
  constexpr int total = threads * rounds * per_round;
  REQUIRE(got.wait_for(total));
  INFO("first error: " << (got.errors.empty() ? std::string("none") : got.errors.front()));
  CHECK(got.errors.empty());
  CHECK(got.ok == total);
  CHECK(must(t.stream_info_of("MANY")).state.messages == static_cast<std::uint64_t>(total));
}
