// Ordered replay (subscribe_ordered): start positions, filters, ordering without gaps
// under concurrent publishing, and stopping.

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

std::unique_ptr<subscription> replay(transport& t, const replay_request& request, replay_log& log,
                                     std::source_location where = std::source_location::current()) {
  return must(t.subscribe_ordered(request, log.callback()), where);
}

TEST_CASE("replay from all delivers every stored message in order, then live ones", "[replay]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "rall");
  auto s = create_stream(t, sc);
  must(t.publish({.subject = subject_in(sc, "a"), .data = "1", .headers = {{"K", "v"}}}));
  publish_ok(t, subject_in(sc, "b"), "2");
  publish_ok(t, subject_in(sc, "a"), "3");

  replay_log log;
  auto sub = replay(t, {.stream = sc.name, .start = deliver_policy::all}, log);
  REQUIRE(log.wait_for(3));
  publish_ok(t, subject_in(sc, "c"), "4");
  publish_ok(t, subject_in(sc, "a"), "5");
  REQUIRE(log.wait_for(5));
  sub->stop();

  auto ms = log.items();
  CHECK(seqs_of(ms) == seq_range(1, 5));
  for (std::size_t i = 0; i < ms.size(); ++i) CHECK(ms[i].data == std::to_string(i + 1));
  CHECK(ms[0].stream == sc.name);
  CHECK(ms[0].subject == subject_in(sc, "a"));
  CHECK(find_header(ms[0].headers, "K") == "v");
  CHECK(ms[3].subject == subject_in(sc, "c"));
  // A replay does not consume: the stream and its consumers are as they were.
  CHECK(state_of(t, sc.name).messages == 5);
}

TEST_CASE("replay delivers only messages matching its filter", "[replay]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "rfilter");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a.1"));    // 1
  publish_ok(t, subject_in(sc, "b.1"));    // 2
  publish_ok(t, subject_in(sc, "a.2"));    // 3
  publish_ok(t, subject_in(sc, "a.2.x"));  // 4

  replay_log log;
  auto sub = replay(
      t, {.stream = sc.name, .filter_subject = subject_in(sc, "a.*"), .start = deliver_policy::all},
      log);
  REQUIRE(log.wait_for(2));
  publish_ok(t, subject_in(sc, "b.2"));  // 5
  publish_ok(t, subject_in(sc, "a.3"));  // 6
  REQUIRE(log.wait_for(3));
  sub->stop();
  CHECK(log.seqs() == std::vector<std::uint64_t>{1, 3, 6});
}

TEST_CASE("replay from new_messages skips what is stored", "[replay]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "rnew");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  publish_ok(t, subject_in(sc, "a"));

  replay_log log;
  auto sub = replay(t, {.stream = sc.name, .start = deliver_policy::new_messages}, log);
  publish_ok(t, subject_in(sc, "a"), "new 1");
  publish_ok(t, subject_in(sc, "a"), "new 2");
  REQUIRE(log.wait_for(2));
  sub->stop();
  CHECK(log.seqs() == std::vector<std::uint64_t>{3, 4});
}

TEST_CASE("replay from last starts at the last message matching the filter", "[replay]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "rlast");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a.1"));  // 1
  publish_ok(t, subject_in(sc, "b.1"));  // 2
  publish_ok(t, subject_in(sc, "a.2"));  // 3
  publish_ok(t, subject_in(sc, "b.2"));  // 4

  replay_log log;
  SECTION("wildcard filter") {
    auto sub = replay(
        t,
        {.stream = sc.name, .filter_subject = subject_in(sc, "a.*"), .start = deliver_policy::last},
        log);
    REQUIRE(log.wait_for(1));
    publish_ok(t, subject_in(sc, "b.3"));  // 5
    publish_ok(t, subject_in(sc, "a.3"));  // 6
    REQUIRE(log.wait_for(2));
    sub->stop();
    CHECK(log.seqs() == std::vector<std::uint64_t>{3, 6});
  }
  SECTION("no filter") {
    auto sub = replay(t, {.stream = sc.name, .start = deliver_policy::last}, log);
    REQUIRE(log.wait_for(1));
    publish_ok(t, subject_in(sc, "a.3"));  // 5
    REQUIRE(log.wait_for(2));
    sub->stop();
    CHECK(log.seqs() == std::vector<std::uint64_t>{4, 5});
  }
  SECTION("nothing matches yet") {
    auto sub = replay(
        t,
        {.stream = sc.name, .filter_subject = subject_in(sc, "c.*"), .start = deliver_policy::last},
        log);
    publish_ok(t, subject_in(sc, "a.3"));  // 5
    publish_ok(t, subject_in(sc, "c.1"));  // 6
    REQUIRE(log.wait_for(1));
    sub->stop();
    CHECK(log.seqs() == std::vector<std::uint64_t>{6});
  }
}

TEST_CASE("replay from a start sequence includes that sequence", "[replay]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "rseq");
  auto s = create_stream(t, sc);
  for (int i = 0; i < 5; ++i) publish_ok(t, subject_in(sc, "a"));
  replay_log log;
  auto sub = replay(
      t, {.stream = sc.name, .start = deliver_policy::by_start_sequence, .start_seq = 3}, log);
  REQUIRE(log.wait_for(3));
  publish_ok(t, subject_in(sc, "a"));
  REQUIRE(log.wait_for(4));
  sub->stop();
  CHECK(log.seqs() == seq_range(3, 6));
}

TEST_CASE("replay from a start sequence beyond the end waits for that sequence", "[replay]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "rbeyond");
  auto s = create_stream(t, sc);
  for (int i = 0; i < 3; ++i) publish_ok(t, subject_in(sc, "a"));
  replay_log log;
  auto sub = replay(
      t, {.stream = sc.name, .start = deliver_policy::by_start_sequence, .start_seq = 6}, log);
  for (int i = 0; i < 4; ++i) publish_ok(t, subject_in(sc, "a"));  // 4..7
  REQUIRE(log.wait_for(2));
  sub->stop();
  CHECK(log.seqs() == seq_range(6, 7));
}

TEST_CASE("replay from a start time in the future skips what is stored before it",
          "[replay][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "rfuture");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));  // 1
  replay_log log;
  auto sub = replay(t,
                    {.stream = sc.name,
                     .start = deliver_policy::by_start_time,
                     .start_time = t.clock()->now() + 1s},
                    log);
  publish_ok(t, subject_in(sc, "a"));  // 2: before the start time
  fx->advance(1s);
  publish_ok(t, subject_in(sc, "a"));  // 3
  REQUIRE(log.wait_for(1));
  sub->stop();
  CHECK(log.seqs() == seq_range(3, 3));
}

TEST_CASE("replay from a start time begins with the first message stored at or after it",
          "[replay][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "rtime");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  publish_ok(t, subject_in(sc, "a"));
  fx->advance(1s);
  const auto start = t.clock()->now();
  publish_ok(t, subject_in(sc, "a"));  // 3
  publish_ok(t, subject_in(sc, "a"));  // 4
  replay_log log;
  auto sub = replay(
      t, {.stream = sc.name, .start = deliver_policy::by_start_time, .start_time = start}, log);
  REQUIRE(log.wait_for(2));
  publish_ok(t, subject_in(sc, "a"));  // 5
  REQUIRE(log.wait_for(3));
  sub->stop();
  CHECK(log.seqs() == seq_range(3, 5));
}

TEST_CASE("replay skips messages that limits removed", "[replay]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "rgaps");
  sc.max_msgs_per_subject = 1;
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));  // 1, replaced by 3
  publish_ok(t, subject_in(sc, "b"));  // 2
  publish_ok(t, subject_in(sc, "a"));  // 3
  replay_log log;
  auto sub = replay(t, {.stream = sc.name, .start = deliver_policy::all}, log);
  REQUIRE(log.wait_for(2));
  publish_ok(t, subject_in(sc, "c"));  // 4
  REQUIRE(log.wait_for(3));
  sub->stop();
  CHECK(log.seqs() == std::vector<std::uint64_t>{2, 3, 4});
}

TEST_CASE("replay stays ordered and gap-free while others publish concurrently",
          "[replay][concurrency]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "rconc");
  sc.storage = storage_type::memory;
  auto s = create_stream(t, sc);
  constexpr int publishers = 4;
  constexpr int each = 100;
  constexpr std::size_t total = publishers * each;

  std::atomic<int> failures{0};
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < publishers; ++p) {
    threads.emplace_back([&, p] {
      ++started;
      for (int i = 0; i < each; ++i) {
        auto r = t.publish(
            {.subject = subject_in(sc, "p" + std::to_string(p)), .data = std::to_string(i)});
        if (!r) ++failures;
      }
    });
  }
  // Start the replay while the publishers are at work: the stored part and the live
  // part must join without a gap or a repeat.
  while (started.load() < publishers) std::this_thread::yield();
  replay_log log;
  auto sub = replay(t, {.stream = sc.name, .start = deliver_policy::all}, log);
  for (auto& th : threads) th.join();
  REQUIRE(failures.load() == 0);
  REQUIRE(log.wait_for(total));
  sub->stop();
  auto ms = log.items();
  CHECK(seqs_of(ms) == seq_range(1, total));
  // Each publisher's messages arrive in the order it published them.
  std::vector<int> next(publishers, 0);
  bool in_order = true;
  for (const auto& m : ms) {
    const int p = m.subject.back() - '0';
    if (m.data != std::to_string(next[p]++)) in_order = false;
  }
  CHECK(in_order);
}

TEST_CASE("after stop returns, no replay callback runs", "[replay]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "rstop");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));

  replay_log stopped;
  auto sub = replay(t, {.stream = sc.name, .start = deliver_policy::all}, stopped);
  REQUIRE(stopped.wait_for(1));
  SECTION("stop") {
    sub->stop();
    sub->stop();  // idempotent
  }
  SECTION("destroying the subscription") {
    sub.reset();
  }

  for (int i = 0; i < 5; ++i) publish_ok(t, subject_in(sc, "a"));
  // A second replay sees everything; the stopped one saw nothing more.
  replay_log witness;
  auto other = replay(t, {.stream = sc.name, .start = deliver_policy::all}, witness);
  REQUIRE(witness.wait_for(6));
  other->stop();
  CHECK(stopped.size() == 1);
}

TEST_CASE("stop from inside a replay callback ends the replay after that callback", "[replay]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "rstopin");
  auto s = create_stream(t, sc);

  std::atomic<subscription*> self{nullptr};
  replay_log log;
  auto sub = must(t.subscribe_ordered({.stream = sc.name, .start = deliver_policy::new_messages},
                                      [&](const message& m) {
                                        log.add(m);
                                        if (log.size() == 2) self.load()->stop();
                                      }));
  self = sub.get();
  for (int i = 0; i < 5; ++i) publish_ok(t, subject_in(sc, "a"));
  replay_log witness;
  auto other = replay(t, {.stream = sc.name, .start = deliver_policy::all}, witness);
  REQUIRE(witness.wait_for(5));
  other->stop();
  REQUIRE(log.wait_for(2));
  CHECK(log.size() == 2);
}

TEST_CASE("replay of a missing stream is not_found", "[replay]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  replay_log log;
  CHECK(code_of(t.subscribe_ordered(
            {.stream = fx->unique("nostream"), .start = deliver_policy::all}, log.callback())) ==
        errc::not_found);
}

}  // namespace
}  // namespace amp::conformance::cases
