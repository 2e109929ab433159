// A live replay (new messages only) and an updates-only watch lose nothing when their
// consumer is lost before it delivered anything: cnats recreates an ordered consumer after
// missed heartbeats from the last sequence it delivered, and with none delivered it would
// start at the end again, skipping what was published in between; the transport asks for
// the sequence after the stream's last one instead of "new".

#include <nats/nats.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "amp/transport/jetstream.hpp"
#include "amp/transport/transport.hpp"
#include "support/checks.hpp"
#include "support/nats_server.hpp"

namespace {

using namespace std::chrono_literals;
using amp::testing::must;
using amp::testing::nats_server;

// Deletes every consumer of `stream` behind the transport's back, as a server that lost
// them would.
void delete_consumers(const nats_server& server, const std::string& stream) {
  natsConnection* nc = nullptr;
  REQUIRE(natsConnection_ConnectTo(&nc, server.url().c_str()) == NATS_OK);
  natsMsg* reply = nullptr;
  REQUIRE(natsConnection_RequestString(&reply, nc, ("$JS.API.CONSUMER.NAMES." + stream).c_str(), "",
                                       5000) == NATS_OK);
  std::string names(natsMsg_GetData(reply), static_cast<std::size_t>(natsMsg_GetDataLength(reply)));
  natsMsg_Destroy(reply);
  const auto list = names.find("\"consumers\":[");
  REQUIRE(list != std::string::npos);
  const auto begin = names.find('[', list) + 1;
  const std::string items = names.substr(begin, names.find(']', begin) - begin);  // "a","b"
  int deleted = 0;
  for (auto at = items.find('"'); at != std::string::npos; at = items.find('"', at + 1)) {
    const auto close = items.find('"', at + 1);
    const auto name = items.substr(at + 1, close - at - 1);
    natsMsg* r = nullptr;
    REQUIRE(natsConnection_RequestString(&r, nc,
                                         ("$JS.API.CONSUMER.DELETE." + stream + "." + name).c_str(),
                                         "", 5000) == NATS_OK);
    natsMsg_Destroy(r);
    ++deleted;
    at = close;
  }
  natsConnection_Destroy(nc);
  REQUIRE(deleted >= 1);
}

}  // namespace

TEST_CASE(
    "a live replay and an updates-only watch keep what was published while their "
    "consumer was gone",
    "[jetstream]") {
  auto server = nats_server::start();
  auto t = must(amp::jetstream_transport::connect({.url = server.url(), .name = "amp-reset-test"}));
  amp::stream_config sc;
  sc.name = "RESET";
  sc.subjects = {"reset.>"};
  must(t->ensure_stream(sc));
  must(t->publish({.subject = "reset.old", .data = "old"}));
  amp::kv_config kc;
  kc.bucket = "reset";
  must(t->ensure_bucket(kc));
  must(t->kv_put("reset", "old", "old"));

  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> replayed;
  std::vector<std::string> watched;
  auto sub = must(t->subscribe_ordered(
      {.stream = "RESET", .start = amp::deliver_policy::new_messages}, [&](const amp::message& m) {
        std::lock_guard lock(mu);
        replayed.push_back(m.data);
        cv.notify_all();
      }));
  auto watch = must(t->kv_watch("reset", {.updates_only = true},
                                {.on_entry =
                                     [&](const amp::kv_entry& e) {
                                       std::lock_guard lock(mu);
                                       watched.push_back(e.value);
                                       cv.notify_all();
                                     },
                                 .on_caught_up = [] {}}));
  delete_consumers(server, "RESET");
  delete_consumers(server, "KV_reset");
  must(t->publish({.subject = "reset.new", .data = "new"}));
  must(t->kv_put("reset", "new", "new"));

  // cnats notices the missing heartbeats within a few idle-heartbeat periods (5 s).
  std::unique_lock lock(mu);
  REQUIRE(cv.wait_for(lock, 60s, [&] { return !replayed.empty() && !watched.empty(); }));
  CHECK(replayed == std::vector<std::string>{"new"});
  CHECK(watched == std::vector<std::string>{"new"});
  lock.unlock();
  sub->stop();
  watch->stop();
}
