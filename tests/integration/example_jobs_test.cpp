// amp-example-jobs with its one changed line: the same producer and workers on a real
// nats-server instead of the embedded memory transport.

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "support/nats_server.hpp"

#ifdef AMP_EXAMPLE_JOBS
TEST_CASE("amp-example-jobs completes every task on JetStream", "[example][jetstream]") {
  auto server = amp::testing::nats_server::start();
  std::string command = std::string(AMP_EXAMPLE_JOBS) + " --nats " + server.url() + " >/dev/null";
  CHECK(std::system(command.c_str()) == 0);
}
#endif
