#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "amp/clock.hpp"
#include "amp/transport/jetstream.hpp"
#include "transport/jetstream/connection.hpp"

TEST_CASE("a NATS URL is logged without its passwords or tokens", "[jetstream]") {
  using amp::redact_nats_url;
  CHECK(redact_nats_url("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222");
  CHECK(redact_nats_url("nats://amp:s3cret@nats.example:4222") ==
        "nats://amp:***@nats.example:4222");
  CHECK(redact_nats_url("nats://s3cret-token@nats.example") == "nats://***@nats.example");
  CHECK(redact_nats_url("tls://a:b@x:1, nats://y:2,nats://t@z/path@x") ==
        "tls://a:***@x:1, nats://y:2,nats://***@z/path@x");
  CHECK(redact_nats_url("user:pw@host:4222") == "user:***@host:4222");
  CHECK(redact_nats_url("nats://p:w:x@h") == "nats://p:***@h");
  CHECK(redact_nats_url("") == "");
}

TEST_CASE("connect errors name the URL without its password", "[jetstream]") {
  // Port 1 on loopback: nothing listens, the connection is refused at once.
  auto r = amp::jetstream_transport::connect(
      {.url = "nats://amp:s3cret@127.0.0.1:1", .connect_timeout = std::chrono::milliseconds(200)});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == amp::errc::unavailable);
  CHECK(r.error().message().find("s3cret") == std::string::npos);
  CHECK(r.error().message().find("nats://amp:***@127.0.0.1:1") != std::string::npos);
}

namespace {

std::vector<natsMsg*> destroyed_msgs;

void count_destroyed(natsMsg* m) {
  destroyed_msgs.push_back(m);
}

natsMsg* fake_msg(std::uintptr_t n) {
  return reinterpret_cast<natsMsg*>(n * 16);
}

}  // namespace

TEST_CASE("handled NATS messages are destroyed in batches, by count or after a delay",
          "[jetstream]") {
  using amp::jetstream_detail::retired_msgs;
  destroyed_msgs.clear();
  auto clock = std::make_shared<amp::manual_clock>();
  auto retired = std::make_shared<retired_msgs>(clock, &count_destroyed);

  SECTION("a full batch goes at once, in the order retired") {
    for (std::uintptr_t i = 1; i < retired_msgs::k_batch; ++i) retired->retire(fake_msg(i));
    CHECK(destroyed_msgs.empty());
    retired->retire(fake_msg(retired_msgs::k_batch));
    REQUIRE(destroyed_msgs.size() == retired_msgs::k_batch);
    CHECK(destroyed_msgs.front() == fake_msg(1));
    CHECK(destroyed_msgs.back() == fake_msg(retired_msgs::k_batch));
  }
  SECTION("a partial batch goes k_delay after its first message") {
    retired->retire(fake_msg(1));
    clock->advance(retired_msgs::k_delay / 2);
    retired->retire(fake_msg(2));
    CHECK(destroyed_msgs.empty());
    clock->advance(retired_msgs::k_delay / 2);
    CHECK(destroyed_msgs == std::vector<natsMsg*>{fake_msg(1), fake_msg(2)});
    CHECK(clock->pending_timers() == 0);
    retired->retire(fake_msg(3));  // a new batch, a new delay
    clock->advance(retired_msgs::k_delay);
    CHECK(destroyed_msgs.size() == 3);
  }
  SECTION("what is held when it goes is destroyed then") {
    retired->retire(fake_msg(1));
    retired->retire(fake_msg(2));
    retired.reset();
    CHECK(destroyed_msgs.size() == 2);
    clock->advance(retired_msgs::k_delay);  // its timer finds it gone
    CHECK(destroyed_msgs.size() == 2);
  }
}
