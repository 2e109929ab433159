// The transport as a whole: ping, capabilities, clock.

#include <string>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

TEST_CASE("ping answers ok while the backend is reachable", "[basics]") {
  auto fx = make_fixture();
  must(fx->transport().ping());
}

TEST_CASE("caps names the backend", "[basics]") {
  auto fx = make_fixture();
  auto caps = fx->transport().caps();
  CHECK((caps.backend == "memory" || caps.backend == "jetstream"));
  if (caps.backend == "memory") CHECK_FALSE(caps.persistent);
}

TEST_CASE("the transport's clock moves as the fixture lets time pass", "[basics][time]") {
  auto fx = make_fixture();
  auto clock = fx->transport().clock();
  REQUIRE(clock != nullptr);
  const auto before = clock->now();
  fx->advance(1s);
  CHECK(clock->now() - before >= 1s);
}

TEST_CASE("messages are stamped by the transport's clock", "[basics][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "stamp");
  auto s = create_stream(t, c);
  const auto before = t.clock()->now();
  publish_ok(t, subject_in(c, "a"));
  fx->advance(2s);
  const auto middle = t.clock()->now();
  publish_ok(t, subject_in(c, "a"));
  auto m1 = must(t.get_message(c.name, 1));
  auto m2 = must(t.get_message(c.name, 2));
  // Allow a little skew between a server's clock and ours.
  CHECK(m1.time >= before - 1s);
  CHECK(m1.time < middle);
  CHECK(m2.time >= middle - 1s);
  CHECK(m2.time - m1.time >= 1s);
}

}  // namespace
}  // namespace amp::conformance::cases
