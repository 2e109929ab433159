// Idempotent setup across processes: two JetStream transports (two connections, as two broker
// processes would have) declare the same streams, consumers and buckets on one nats-server.
// Equal declarations agree on one object; a clashing one is refused by name and changes nothing
// on the server, also where nats-server itself would have accepted the change.

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "amp/error.hpp"
#include "amp/result.hpp"
#include "amp/transport/jetstream.hpp"
#include "amp/transport/transport.hpp"
#include "support/checks.hpp"
#include "support/jetstream_connect.hpp"
#include "support/nats_server.hpp"

namespace {

using namespace std::chrono_literals;
using amp::errc;
using amp::testing::nats_server;

using amp::testing::code_of;
using amp::testing::must;
using amp::testing::text_of;

std::shared_ptr<amp::transport> connect(const nats_server& server, const std::string& name) {
  return amp::testing::connect_jetstream(server,
                                         {.name = name, .op_timeout = std::chrono::seconds(5)});
}

/// Two transports on one server, as two processes of the broker would be.
struct two_processes {
  nats_server server = nats_server::start();
  std::shared_ptr<amp::transport> first = connect(server, "amp-first");
  std::shared_ptr<amp::transport> second = connect(server, "amp-second");
};

amp::stream_config jobs_stream() {
  amp::stream_config c;
  c.name = "JOBS";
  c.subjects = {"jobs.>"};
  c.retention = amp::retention_policy::work_queue;
  c.max_msgs = 1000;
  c.max_age = 1h;
  return c;
}

amp::consumer_config worker(std::string durable, std::string filter) {
  amp::consumer_config c;
  c.stream = "JOBS";
  c.durable = std::move(durable);
  c.filter_subject = std::move(filter);
  c.ack_wait = 10s;
  c.max_ack_pending = 50;
  c.max_deliver = 5;
  return c;
}

amp::kv_config state_bucket() {
  amp::kv_config c;
  c.bucket = "state";
  c.history = 4;
  return c;
}

/// Runs `a` and `b` at the same time on two threads and returns both results.
template <class A, class B>
auto at_once(A a, B b) {
  using RA = decltype(a());
  using RB = decltype(b());
  std::optional<RA> ra;
  std::optional<RB> rb;
  std::thread ta([&] { ra.emplace(a()); });
  std::thread tb([&] { rb.emplace(b()); });
  ta.join();
  tb.join();
  return std::pair<RA, RB>(std::move(*ra), std::move(*rb));
}

}  // namespace

TEST_CASE("setup: two processes declaring the same stream, consumer and bucket share one of each",
          "[jetstream][setup]") {
  two_processes p;
  auto& a = *p.first;
  auto& b = *p.second;

  SECTION("one after the other") {
    auto s1 = a.ensure_stream(jobs_stream());
    auto s2 = b.ensure_stream(jobs_stream());
    INFO(text_of(s1) << " / " << text_of(s2));
    REQUIRE(s1.has_value());
    REQUIRE(s2.has_value());
    CHECK(s1->config == jobs_stream());
    CHECK(s2->config == jobs_stream());

    auto c1 = a.ensure_consumer(worker("w", ""));
    auto c2 = b.ensure_consumer(worker("w", ""));
    INFO(text_of(c1) << " / " << text_of(c2));
    REQUIRE(c1.has_value());
    REQUIRE(c2.has_value());

    auto k1 = a.ensure_bucket(state_bucket());
    auto k2 = b.ensure_bucket(state_bucket());
    INFO(text_of(k1) << " / " << text_of(k2));
    REQUIRE(k1.has_value());
    REQUIRE(k2.has_value());
  }

  SECTION("at the same time") {
    auto [s1, s2] = at_once([&] { return a.ensure_stream(jobs_stream()); },
                            [&] { return b.ensure_stream(jobs_stream()); });
    INFO(text_of(s1) << " / " << text_of(s2));
    REQUIRE(s1.has_value());
    REQUIRE(s2.has_value());

    auto [c1, c2] = at_once([&] { return a.ensure_consumer(worker("w", "")); },
                            [&] { return b.ensure_consumer(worker("w", "")); });
    INFO(text_of(c1) << " / " << text_of(c2));
    REQUIRE(c1.has_value());
    REQUIRE(c2.has_value());

    auto [k1, k2] = at_once([&] { return a.ensure_bucket(state_bucket()); },
                            [&] { return b.ensure_bucket(state_bucket()); });
    INFO(text_of(k1) << " / " << text_of(k2));
    REQUIRE(k1.has_value());
    REQUIRE(k2.has_value());
  }

  // One stream: what one process publishes, the other sees; one consumer on it.
  auto sent = a.publish({.subject = "jobs.x", .data = "from the first", .msg_id = "j1"});
  REQUIRE(sent.has_value());
  auto info = b.stream_info_of("JOBS");
  REQUIRE(info.has_value());
  CHECK(info->state.messages == 1);
  CHECK(info->state.consumers == 1);
  CHECK(info->config == jobs_stream());

  // One consumer: the message delivered through one process is not delivered through the other.
  auto got = b.fetch("JOBS", "w", {.batch = 10, .max_wait = 0s});
  REQUIRE(got.has_value());
  REQUIRE(got->size() == 1);
  CHECK((*got)[0].data == "from the first");
  auto none = a.fetch("JOBS", "w", {.batch = 10, .max_wait = 0s});
  REQUIRE(none.has_value());
  CHECK(none->empty());
  REQUIRE(a.ack((*got)[0]).has_value());  // the other process may ack it: the token is the server's
  CHECK(must(b.stream_info_of("JOBS")).state.messages == 0);

  // One bucket: a value written by one process is read by the other, one revision sequence.
  auto r1 = a.kv_put("state", "k", "v1");
  REQUIRE(r1.has_value());
  auto seen = b.kv_get("state", "k");
  REQUIRE(seen.has_value());
  CHECK(seen->value == "v1");
  CHECK(seen->revision == *r1);
  auto r2 = b.kv_update("state", "k", "v2", *r1);
  REQUIRE(r2.has_value());
  CHECK(*r2 > *r1);
  CHECK(code_of(a.kv_update("state", "k", "v3", *r1)) == errc::conflict);
}

TEST_CASE(
    "setup: a second process with a clashing configuration gets a conflict naming the "
    "setting and the server keeps the first",
    "[jetstream][setup]") {
  two_processes p;
  auto& a = *p.first;
  auto& b = *p.second;
  REQUIRE(a.ensure_stream(jobs_stream()).has_value());
  REQUIRE(a.ensure_consumer(worker("w", "jobs.a.>")).has_value());
  REQUIRE(a.ensure_bucket(state_bucket()).has_value());

  SECTION("stream: different max_msgs") {
    auto clash = jobs_stream();
    clash.max_msgs = 5;
    auto r = b.ensure_stream(clash);
    INFO(text_of(r));
    REQUIRE(code_of(r) == errc::conflict);
    CHECK_THAT(r.error().message(), Catch::Contains("max_msgs"));
    auto now = a.stream_info_of("JOBS");
    REQUIRE(now.has_value());
    CHECK(now->config.max_msgs == 1000);
    CHECK(now->config == jobs_stream());
  }

  SECTION("stream: different max_age and retention") {
    auto clash = jobs_stream();
    clash.max_age = 2h;
    auto r = b.ensure_stream(clash);
    INFO(text_of(r));
    REQUIRE(code_of(r) == errc::conflict);
    CHECK_THAT(r.error().message(), Catch::Contains("max_age"));

    clash = jobs_stream();
    clash.retention = amp::retention_policy::limits;
    r = b.ensure_stream(clash);
    INFO(text_of(r));
    REQUIRE(code_of(r) == errc::conflict);
    CHECK_THAT(r.error().message(), Catch::Contains("retention"));
    CHECK(must(a.stream_info_of("JOBS")).config == jobs_stream());
  }

  SECTION("consumer: different ack_wait (nats-server itself would silently apply it)") {
    auto clash = worker("w", "jobs.a.>");
    clash.ack_wait = 45s;
    auto r = b.ensure_consumer(clash);
    INFO(text_of(r));
    REQUIRE(code_of(r) == errc::conflict);
    CHECK_THAT(r.error().message(), Catch::Contains("ack_wait"));
    auto now = a.consumer_info_of("JOBS", "w");
    REQUIRE(now.has_value());
    CHECK(now->config.ack_wait == 10s);
    CHECK(now->config == worker("w", "jobs.a.>"));
  }

  SECTION("consumer: different max_deliver, max_ack_pending, filter") {
    auto clash = worker("w", "jobs.a.>");
    clash.max_deliver = 9;
    auto r = b.ensure_consumer(clash);
    INFO(text_of(r));
    REQUIRE(code_of(r) == errc::conflict);
    CHECK_THAT(r.error().message(), Catch::Contains("max_deliver"));

    clash = worker("w", "jobs.a.>");
    clash.max_ack_pending = 7;
    r = b.ensure_consumer(clash);
    INFO(text_of(r));
    REQUIRE(code_of(r) == errc::conflict);
    CHECK_THAT(r.error().message(), Catch::Contains("max_ack_pending"));

    r = b.ensure_consumer(worker("w", "jobs.b.>"));
    INFO(text_of(r));
    REQUIRE(code_of(r) == errc::conflict);
    CHECK_THAT(r.error().message(), Catch::Contains("filter_subject"));
    CHECK(must(a.consumer_info_of("JOBS", "w")).config == worker("w", "jobs.a.>"));
  }

  SECTION("bucket: different history") {
    auto clash = state_bucket();
    clash.history = 8;
    auto r = b.ensure_bucket(clash);
    INFO(text_of(r));
    REQUIRE(code_of(r) == errc::conflict);
    CHECK_THAT(r.error().message(), Catch::Contains("history"));
    // The bucket is the stream KV_state; its per-subject limit is the history.
    auto now = a.stream_info_of("KV_state");
    REQUIRE(now.has_value());
    CHECK(now->config.max_msgs_per_subject == 4);
    // And it behaves so: a fifth write pushes the first revision out.
    for (int i = 0; i < 5; ++i) REQUIRE(b.kv_put("state", "k", std::to_string(i)).has_value());
    auto history = a.kv_history("state", "k");
    REQUIRE(history.has_value());
    CHECK(history->size() == 4);
  }

  SECTION("bucket: different ttl") {
    auto clash = state_bucket();
    clash.ttl = 1h;
    auto r = b.ensure_bucket(clash);
    INFO(text_of(r));
    REQUIRE(code_of(r) == errc::conflict);
    CHECK_THAT(r.error().message(), Catch::Contains("ttl"));
    CHECK(must(a.stream_info_of("KV_state")).config.max_age == amp::duration::zero());
  }

  // Whatever was refused, the first process's objects still work as declared.
  CHECK(a.ensure_stream(jobs_stream()).has_value());
  CHECK(a.ensure_consumer(worker("w", "jobs.a.>")).has_value());
  CHECK(a.ensure_bucket(state_bucket()).has_value());
}

TEST_CASE("setup: work-queue filters of two processes may not overlap, on create and on update",
          "[jetstream][setup]") {
  two_processes p;
  auto& a = *p.first;
  auto& b = *p.second;
  REQUIRE(a.ensure_stream(jobs_stream()).has_value());
  REQUIRE(b.ensure_stream(jobs_stream()).has_value());
  REQUIRE(a.ensure_consumer(worker("wa", "jobs.a.>")).has_value());

  // Create: the second process's filter covers the first's.
  auto wide = b.ensure_consumer(worker("wb", "jobs.>"));
  INFO(text_of(wide));
  CHECK(code_of(wide) == errc::conflict);
  auto same = b.ensure_consumer(worker("wb", "jobs.a.x"));
  INFO(text_of(same));
  CHECK(code_of(same) == errc::conflict);
  auto all = b.ensure_consumer(worker("wb", ""));
  INFO(text_of(all));
  CHECK(code_of(all) == errc::conflict);
  CHECK(code_of(b.consumer_info_of("JOBS", "wb")) == errc::not_found);

  // A disjoint filter is fine.
  REQUIRE(b.ensure_consumer(worker("wb", "jobs.b.>")).has_value());
  CHECK(must(a.stream_info_of("JOBS")).state.consumers == 2);

  // Update: moving the second consumer onto the first's subjects is refused (nats-server 2.9
  // would accept it), and the consumer keeps its filter.
  auto moved = b.update_consumer(worker("wb", "jobs.a.one"));
  INFO(text_of(moved));
  CHECK(code_of(moved) == errc::conflict);
  auto kept = a.consumer_info_of("JOBS", "wb");
  REQUIRE(kept.has_value());
  CHECK(kept->config.filter_subject == "jobs.b.>");

  // Widening either one onto the other is refused as well, from either process.
  CHECK(code_of(a.update_consumer(worker("wa", "jobs.>"))) == errc::conflict);
  CHECK(code_of(b.update_consumer(worker("wa", "jobs.>"))) == errc::conflict);
  CHECK(must(a.consumer_info_of("JOBS", "wa")).config.filter_subject == "jobs.a.>");

  // An update that stays disjoint goes through, seen by both.
  auto narrowed = b.update_consumer(worker("wb", "jobs.b.only"));
  INFO(text_of(narrowed));
  REQUIRE(narrowed.has_value());
  CHECK(must(a.consumer_info_of("JOBS", "wb")).config.filter_subject == "jobs.b.only");

  // Messages go where the filters say.
  REQUIRE(a.publish({.subject = "jobs.a.1", .data = "for a"}).has_value());
  REQUIRE(a.publish({.subject = "jobs.b.only", .data = "for b"}).has_value());
  auto fa = b.fetch("JOBS", "wa", {.batch = 10, .max_wait = 0s});
  auto fb = a.fetch("JOBS", "wb", {.batch = 10, .max_wait = 0s});
  REQUIRE(fa.has_value());
  REQUIRE(fb.has_value());
  REQUIRE(fa->size() == 1);
  REQUIRE(fb->size() == 1);
  CHECK((*fa)[0].data == "for a");
  CHECK((*fb)[0].data == "for b");
}

TEST_CASE("setup: per-key ttl is not offered by nats-server 2.9 and a write with ttl is refused",
          "[jetstream][setup]") {
  two_processes p;
  auto& a = *p.first;
  auto caps = a.caps();
  CHECK(caps.backend == "jetstream");
  CHECK(caps.persistent);
  // Debian's nats-server is 2.9.10; per-key TTL needs 2.11.
  REQUIRE_FALSE(caps.per_key_ttl);
  REQUIRE(a.ensure_bucket(state_bucket()).has_value());

  auto put = a.kv_put("state", "k", "v", 10s);
  INFO(text_of(put));
  CHECK(code_of(put) == errc::bad_request);
  auto created = a.kv_create("state", "k", "v", 10s);
  INFO(text_of(created));
  CHECK(code_of(created) == errc::bad_request);
  // Nothing was written.
  CHECK(code_of(a.kv_get("state", "k")) == errc::not_found);
  auto rev = a.kv_put("state", "k", "v");
  REQUIRE(rev.has_value());
  CHECK(code_of(a.kv_update("state", "k", "w", *rev, 10s)) == errc::bad_request);
  CHECK(must(a.kv_get("state", "k")).value == "v");
}

TEST_CASE("setup: two processes creating overlapping work-queue consumers at once: one wins",
          "[jetstream][setup]") {
  two_processes p;
  auto& a = *p.first;
  auto& b = *p.second;
  REQUIRE(a.ensure_stream(jobs_stream()).has_value());
  for (int i = 0; i < 5; ++i) {
    auto n = std::to_string(i);
    auto [ra, rb] = at_once([&] { return a.ensure_consumer(worker("a" + n, "jobs." + n + ".>")); },
                            [&] { return b.ensure_consumer(worker("b" + n, "jobs." + n + ".x")); });
    INFO("round " << i << ": " << text_of(ra) << " / " << text_of(rb));
    CHECK(ra.has_value() != rb.has_value());
    CHECK((ra.has_value() || code_of(ra) == errc::conflict));
    CHECK((rb.has_value() || code_of(rb) == errc::conflict));
  }
}

// Known to fail: each process checks the other consumers' filters, then updates; two updates
// at once both pass the check and nats-server 2.9 accepts both (it checks overlap on create
// only), leaving two work-queue consumers with overlapping filters.
TEST_CASE("setup: two processes moving work-queue consumers onto one subject at once: one wins",
          "[.][known-issue][jetstream][setup]") {
  two_processes p;
  auto& a = *p.first;
  auto& b = *p.second;
  REQUIRE(a.ensure_stream(jobs_stream()).has_value());
  for (int i = 0; i < 5; ++i) {
    auto n = std::to_string(i);
    REQUIRE(a.ensure_consumer(worker("a" + n, "jobs.from" + n + ".a")).has_value());
    REQUIRE(b.ensure_consumer(worker("b" + n, "jobs.from" + n + ".b")).has_value());
    auto [ra, rb] =
        at_once([&] { return a.update_consumer(worker("a" + n, "jobs.to" + n + ".>")); },
                [&] { return b.update_consumer(worker("b" + n, "jobs.to" + n + ".x")); });
    INFO("round " << i << ": " << text_of(ra) << " / " << text_of(rb));
    CHECK(ra.has_value() != rb.has_value());
    auto fa = must(a.consumer_info_of("JOBS", "a" + n)).config.filter_subject;
    auto fb = must(b.consumer_info_of("JOBS", "b" + n)).config.filter_subject;
    INFO("filters now: " << fa << " / " << fb);
    CHECK_FALSE((fa == "jobs.to" + n + ".>" && fb == "jobs.to" + n + ".x"));
  }
}

// Servers started together on a new NATS connect and declare their streams and buckets in the
// same millisecond. nats-server 2.9.10 then sometimes refuses a create with "error creating store
// for stream" (10049; its log: "could not create storage directory"); each process must still
// end up with every object it declares (this failed 2 runs in 5 before such creates were tried
// again).
TEST_CASE("setup: four processes declaring their objects at once on a new server all get them",
          "[jetstream][setup]") {
  for (int round = 0; round < 12; ++round) {
    nats_server server = nats_server::start();
    std::vector<std::shared_ptr<amp::transport>> processes(4);
    std::vector<std::string> failures(processes.size());
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < processes.size(); ++i) {
      threads.emplace_back([&, i] {
        // Each connects (its first JetStream request) while the others create.
        auto connected = amp::jetstream_transport::connect(
            {.url = server.url(), .name = "amp-" + std::to_string(i), .op_timeout = 5s});
        if (!connected) {
          failures[i] = "connect: " + text_of(connected);
          return;
        }
        processes[i] = *connected;
        auto& t = *processes[i];
        auto own = state_bucket();
        own.bucket = "own" + std::to_string(i);
        if (auto r = t.ensure_bucket(own); !r) failures[i] += "own bucket: " + text_of(r) + "; ";
        if (auto r = t.ensure_bucket(state_bucket()); !r) {
          failures[i] += "bucket: " + text_of(r) + "; ";
        }
        if (auto r = t.ensure_stream(jobs_stream()); !r) failures[i] += "stream: " + text_of(r);
      });
    }
    for (auto& t : threads) t.join();
    for (std::size_t i = 0; i < failures.size(); ++i) {
      INFO("round " << round << ", process " << i);
      CHECK(failures[i].empty());
    }
    for (const auto& p : processes) REQUIRE(p != nullptr);
    // One bucket and one stream, which work for every process.
    auto rev = processes[0]->kv_put("state", "k", "v");
    REQUIRE(rev.has_value());
    for (std::size_t i = 0; i < processes.size(); ++i) {
      auto& t = *processes[i];
      CHECK(must(t.kv_get("state", "k")).revision == *rev);
      CHECK(must(t.stream_info_of("JOBS")).config == jobs_stream());
      CHECK(t.kv_put("own" + std::to_string(i), "k", "v").has_value());
    }
  }
}
