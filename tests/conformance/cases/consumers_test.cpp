// Durable pull consumers: ensure_consumer, update_consumer, consumer_info_of,
// delete_consumer, work-queue filter rules, deliver policies, and fetch.

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

TEST_CASE("ensure_consumer creates a consumer and is idempotent for the same config",
          "[consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "cons");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc, subject_in(sc, "*"), 5s);
  c.max_ack_pending = 10;
  c.max_deliver = 4;

  auto info = must(t.ensure_consumer(c));
  CHECK(info.config == c);
  CHECK(info.num_pending == 1);
  CHECK(info.num_ack_pending == 0);
  auto again = must(t.ensure_consumer(c));
  CHECK(again.config == c);
  CHECK(info_of(t, c).config == c);
  CHECK(state_of(t, sc.name).consumers == 1);

  // Idempotent also after it has delivered: the delivery state is kept.
  REQUIRE(fetch_now(t, c).size() == 1);
  auto after = must(t.ensure_consumer(c));
  CHECK(after.num_ack_pending == 1);
  CHECK(after.num_pending == 0);
}

TEST_CASE("ensure_consumer with a differing config is a conflict and changes nothing",
          "[consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "consclash");
  auto s = create_stream(t, sc);
  auto c = consumer_cfg(*fx, sc, subject_in(sc, "a"), 5s);
  must(t.ensure_consumer(c));

  struct change {
    const char* setting;
    std::function<void(consumer_config&)> apply;
  };
  const std::vector<change> changes = {
      {"ack_wait", [](consumer_config& x) { x.ack_wait = 1s; }},
      {"ack_wait", [](consumer_config& x) { x.ack_wait = 7s; }},
      {"filter_subject", [&](consumer_config& x) { x.filter_subject = subject_in(sc, "b"); }},
      {"filter_subject", [](consumer_config& x) { x.filter_subject.clear(); }},
      {"max_ack_pending", [](consumer_config& x) { x.max_ack_pending = 3; }},
      {"max_deliver", [](consumer_config& x) { x.max_deliver = 2; }},
      {"deliver", [](consumer_config& x) { x.deliver = deliver_policy::new_messages; }},
  };
  for (const auto& ch : changes) {
    CAPTURE(ch.setting);
    auto changed = c;
    ch.apply(changed);
    CHECK(code_of(t.ensure_consumer(changed)) == errc::conflict);
  }
  CHECK(info_of(t, c).config == c);

  // The unchanged ack_wait is still the one in force.
  publish_ok(t, subject_in(sc, "a"));
  REQUIRE(fetch_now(t, c).size() == 1);
  fx->advance(2s);
  CHECK(fetch_now(t, c).empty());  // the refused 1 s ack_wait would have redelivered it
}

TEST_CASE("ensure_consumer on a missing stream is not_found", "[consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  consumer_config c{.stream = fx->unique("nostream"), .durable = fx->unique("c")};
  CHECK(code_of(t.ensure_consumer(c)) == errc::not_found);
  CHECK(code_of(t.consumer_info_of(c.stream, c.durable)) == errc::not_found);
  CHECK(code_of(t.fetch(c.stream, c.durable, {.batch = 1, .max_wait = 0s})) == errc::not_found);
}

TEST_CASE("consumer_info_of, delete_consumer and fetch of a missing consumer are not_found",
          "[consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "nocons");
  auto s = create_stream(t, sc);
  const auto name = fx->unique("c");
  CHECK(code_of(t.consumer_info_of(sc.name, name)) == errc::not_found);
  CHECK(code_of(t.delete_consumer(sc.name, name)) == errc::not_found);
  CHECK(code_of(t.fetch(sc.name, name, {.batch = 1, .max_wait = 0s})) == errc::not_found);
  completion_probe<std::vector<message>> probe;
  t.async_fetch(sc.name, name, {.batch = 1, .max_wait = 5s}, probe.handler());
  CHECK(code_of(probe.get()) == errc::not_found);
}

TEST_CASE("delete_consumer removes it, a new one of the same name starts afresh", "[consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "delcons");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc);
  must(t.ensure_consumer(c));
  auto first = fetch_now(t, c, 10);
  REQUIRE(first.size() == 2);
  must(t.ack(first[0]));

  must(t.delete_consumer(sc.name, c.durable));
  CHECK(code_of(t.consumer_info_of(sc.name, c.durable)) == errc::not_found);
  CHECK(code_of(t.fetch(sc.name, c.durable, {.batch = 1, .max_wait = 0s})) == errc::not_found);
  CHECK(state_of(t, sc.name).consumers == 0);
  CHECK(state_of(t, sc.name).messages == 2);  // a limits stream keeps its messages

  auto info = must(t.ensure_consumer(c));
  CHECK(info.num_pending == 2);
  CHECK(info.num_ack_pending == 0);
  auto ms = fetch_now(t, c, 10);
  CHECK(seqs_of(ms) == std::vector<std::uint64_t>{1, 2});
  CHECK(ms[0].delivery_count == 1);
}

TEST_CASE("consumer_info_of counts pending, ack pending, redelivered, delivered and ack floor",
          "[consumers][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "counts");
  auto s = create_stream(t, sc);
  for (int i = 0; i < 5; ++i) publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc, {}, 2s);
  must(t.ensure_consumer(c));

  auto i0 = info_of(t, c);
  CHECK(i0.num_pending == 5);
  CHECK(i0.num_ack_pending == 0);
  CHECK(i0.num_redelivered == 0);
  CHECK(i0.delivered_stream_seq == 0);
  CHECK(i0.ack_floor_stream_seq == 0);

  auto ms = fetch_now(t, c, 2);
  REQUIRE(seqs_of(ms) == std::vector<std::uint64_t>{1, 2});
  auto i1 = info_of(t, c);
  CHECK(i1.num_pending == 3);
  CHECK(i1.num_ack_pending == 2);
  CHECK(i1.num_redelivered == 0);
  CHECK(i1.delivered_stream_seq == 2);
  CHECK(i1.ack_floor_stream_seq == 0);

  must(t.ack(ms[0]));
  auto i2 = info_of(t, c);
  CHECK(i2.num_ack_pending == 1);
  CHECK(i2.ack_floor_stream_seq == 1);

  fx->advance(3s);  // message 2 is due again
  auto re = fetch_now(t, c);
  REQUIRE(re.size() == 1);
  CHECK(re[0].seq == 2);
  CHECK(re[0].delivery_count == 2);
  auto i3 = info_of(t, c);
  CHECK(i3.num_pending == 3);
  CHECK(i3.num_ack_pending == 1);
  CHECK(i3.num_redelivered == 1);
  CHECK(i3.delivered_stream_seq == 2);

  must(t.ack(re[0]));
  auto i4 = info_of(t, c);
  CHECK(i4.num_ack_pending == 0);
  CHECK(i4.num_redelivered == 0);
  CHECK(i4.ack_floor_stream_seq == 2);

  auto rest = fetch_now(t, c, 10);
  CHECK(seqs_of(rest) == std::vector<std::uint64_t>{3, 4, 5});
  auto i5 = info_of(t, c);
  CHECK(i5.num_pending == 0);
  CHECK(i5.num_ack_pending == 3);
  CHECK(i5.delivered_stream_seq == 5);
  CHECK(i5.ack_floor_stream_seq == 2);

  // Acking out of order: the floor waits for the lowest.
  must(t.ack(rest[2]));
  must(t.ack(rest[1]));
  CHECK(info_of(t, c).ack_floor_stream_seq == 2);
  must(t.ack(rest[0]));
  CHECK(info_of(t, c).ack_floor_stream_seq == 5);
  CHECK(info_of(t, c).num_ack_pending == 0);

  // New messages count as pending.
  publish_ok(t, subject_in(sc, "a"));
  CHECK(info_of(t, c).num_pending == 1);
}

TEST_CASE("num_pending counts only the messages matching the filter", "[consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "pendfilter");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a.1"));
  publish_ok(t, subject_in(sc, "b.1"));
  publish_ok(t, subject_in(sc, "a.2"));
  auto c = consumer_cfg(*fx, sc, subject_in(sc, "a.*"));
  CHECK(must(t.ensure_consumer(c)).num_pending == 2);
}

// ----- work-queue streams ---------------------------------------------------------------

TEST_CASE("on a work-queue stream, consumers with overlapping filters conflict",
          "[consumers][work_queue]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "wqover", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  auto first = consumer_cfg(*fx, sc, subject_in(sc, "a.*"));
  must(t.ensure_consumer(first));

  for (const std::string& filter :
       {subject_in(sc, "a.x"), subject_in(sc, "a.*"), subject_in(sc, "*.x"), subject_in(sc, ">"),
        subject_in(sc, "a.>"), std::string()}) {
    CAPTURE(filter);
    auto other = consumer_cfg(*fx, sc, filter);
    CHECK(code_of(t.ensure_consumer(other)) == errc::conflict);
    CHECK(code_of(t.consumer_info_of(sc.name, other.durable)) == errc::not_found);
  }
  // Disjoint filters are fine.
  for (const std::string& filter :
       {subject_in(sc, "b.*"), subject_in(sc, "a"), subject_in(sc, "a.x.y")}) {
    CAPTURE(filter);
    must(t.ensure_consumer(consumer_cfg(*fx, sc, filter)));
  }
  CHECK(state_of(t, sc.name).consumers == 4);
  CHECK(info_of(t, first).config == first);
  // A concrete filter already taken by another consumer.
  CHECK(code_of(t.ensure_consumer(consumer_cfg(*fx, sc, subject_in(sc, "a")))) == errc::conflict);
  CHECK(state_of(t, sc.name).consumers == 4);
}

TEST_CASE("on a work-queue stream, an unfiltered consumer overlaps every other",
          "[consumers][work_queue]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "wqall", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  must(t.ensure_consumer(consumer_cfg(*fx, sc)));
  CHECK(code_of(t.ensure_consumer(consumer_cfg(*fx, sc, subject_in(sc, "b")))) == errc::conflict);
  CHECK(code_of(t.ensure_consumer(consumer_cfg(*fx, sc))) == errc::conflict);
  CHECK(state_of(t, sc.name).consumers == 1);
}

TEST_CASE("on a work-queue stream, the same consumer may be ensured again",
          "[consumers][work_queue]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "wqself", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  auto c = consumer_cfg(*fx, sc, subject_in(sc, "a"));
  must(t.ensure_consumer(c));
  must(t.ensure_consumer(c));  // it does not overlap itself
  CHECK(state_of(t, sc.name).consumers == 1);
}

TEST_CASE("on a work-queue stream, a deleted consumer's filter is free again",
          "[consumers][work_queue]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "wqfree", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  auto c = consumer_cfg(*fx, sc, subject_in(sc, "a"));
  must(t.ensure_consumer(c));
  must(t.delete_consumer(sc.name, c.durable));
  must(t.ensure_consumer(consumer_cfg(*fx, sc, subject_in(sc, "a"))));
}

TEST_CASE(
    "update_consumer moving a work-queue filter onto another's is a conflict and changes "
    "nothing",
    "[consumers][work_queue]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "wqupd", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  auto a = consumer_cfg(*fx, sc, subject_in(sc, "a.*"));
  auto b = consumer_cfg(*fx, sc, subject_in(sc, "b.*"));
  must(t.ensure_consumer(a));
  must(t.ensure_consumer(b));

  for (const std::string& filter :
       {subject_in(sc, "a.1"), subject_in(sc, "a.*"), subject_in(sc, ">"), std::string()}) {
    CAPTURE(filter);
    auto moved = b;
    moved.filter_subject = filter;
    CHECK(code_of(t.update_consumer(moved)) == errc::conflict);
    CHECK(info_of(t, b).config == b);
  }

  // Each consumer still gets exactly its own subjects.
  publish_ok(t, subject_in(sc, "a.1"), "for a");
  publish_ok(t, subject_in(sc, "b.1"), "for b");
  auto got_b = fetch_now(t, b, 10);
  REQUIRE(got_b.size() == 1);
  CHECK(got_b[0].data == "for b");
  auto got_a = fetch_now(t, a, 10);
  REQUIRE(got_a.size() == 1);
  CHECK(got_a[0].data == "for a");
}

TEST_CASE("update_consumer to a non-overlapping work-queue filter takes effect",
          "[consumers][work_queue]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "wqmove", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  auto a = consumer_cfg(*fx, sc, subject_in(sc, "a.*"));
  auto b = consumer_cfg(*fx, sc, subject_in(sc, "b.*"));
  must(t.ensure_consumer(a));
  must(t.ensure_consumer(b));
  publish_ok(t, subject_in(sc, "b.1"), "b");
  publish_ok(t, subject_in(sc, "c.1"), "c");

  auto moved = b;
  moved.filter_subject = subject_in(sc, "c.*");
  auto info = must(t.update_consumer(moved));
  CHECK(info.config.filter_subject == subject_in(sc, "c.*"));
  CHECK(info_of(t, b).config == moved);
  auto got = fetch_now(t, moved, 10);
  REQUIRE(got.size() == 1);
  CHECK(got[0].data == "c");
  // The old filter is free for another consumer now.
  must(t.ensure_consumer(consumer_cfg(*fx, sc, subject_in(sc, "b.*"))));
}

TEST_CASE("a consumer whose start sequence is beyond the end starts at the next message stored",
          "[consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "cbeyond");
  auto s = create_stream(t, sc);
  for (int i = 0; i < 3; ++i) publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc);
  c.deliver = deliver_policy::by_start_sequence;
  c.start_seq = 100;
  must(t.ensure_consumer(c));
  CHECK(info_of(t, c).num_pending == 0);
  publish_ok(t, subject_in(sc, "a"));  // 4: JetStream moved the start down to it
  CHECK(info_of(t, c).num_pending == 1);
  CHECK(seqs_of(fetch_now(t, c, 10)) == std::vector<std::uint64_t>{4});
  CHECK(info_of(t, c).config.start_seq == 100);
}

TEST_CASE("a deliver policy other than all on a work-queue stream is bad_request",
          "[consumers][work_queue]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "wqdeliver", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc);
  SECTION("new_messages") {
    c.deliver = deliver_policy::new_messages;
  }
  SECTION("last") {
    c.deliver = deliver_policy::last;
  }
  SECTION("by_start_sequence") {
    c.deliver = deliver_policy::by_start_sequence;
    c.start_seq = 1;
  }
  SECTION("by_start_time") {
    c.deliver = deliver_policy::by_start_time;
    c.start_time = t.clock()->now() - 1h;
  }
  CHECK(code_of(t.ensure_consumer(c)) == errc::bad_request);
  CHECK(code_of(t.consumer_info_of(sc.name, c.durable)) == errc::not_found);
  CHECK(state_of(t, sc.name).consumers == 0);
}

TEST_CASE("on a limits stream, consumers with overlapping filters each get every message",
          "[consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "fanout");
  auto s = create_stream(t, sc);
  auto a = consumer_cfg(*fx, sc);
  auto b = consumer_cfg(*fx, sc, subject_in(sc, "x"));
  must(t.ensure_consumer(a));
  must(t.ensure_consumer(b));
  publish_ok(t, subject_in(sc, "x"));
  auto ga = fetch_now(t, a);
  auto gb = fetch_now(t, b);
  REQUIRE(ga.size() == 1);
  REQUIRE(gb.size() == 1);
  CHECK(ga[0].seq == gb[0].seq);
  CHECK(ga[0].consumer == a.durable);
  CHECK(gb[0].consumer == b.durable);
}

// ----- update_consumer ------------------------------------------------------------------

TEST_CASE("update_consumer of a missing consumer is not_found and never creates it",
          "[consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "updmissing");
  auto s = create_stream(t, sc);
  auto c = consumer_cfg(*fx, sc);
  CHECK(code_of(t.update_consumer(c)) == errc::not_found);
  CHECK(code_of(t.consumer_info_of(sc.name, c.durable)) == errc::not_found);
  CHECK(state_of(t, sc.name).consumers == 0);
  auto other = c;
  other.stream = fx->unique("nostream");
  CHECK(code_of(t.update_consumer(other)) == errc::not_found);
}

TEST_CASE("update_consumer changing ack_wait takes effect", "[consumers][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "updwait");
  auto s = create_stream(t, sc);
  auto c = consumer_cfg(*fx, sc, {}, 30s);
  must(t.ensure_consumer(c));
  auto shorter = c;
  shorter.ack_wait = 1s;
  auto info = must(t.update_consumer(shorter));
  CHECK(info.config.ack_wait == 1s);
  CHECK(info_of(t, c).config == shorter);

  publish_ok(t, subject_in(sc, "a"));
  REQUIRE(fetch_now(t, c).size() == 1);
  fx->advance(2s);
  auto re = fetch_now(t, c);
  REQUIRE(re.size() == 1);
  CHECK(re[0].delivery_count == 2);
  // And ensure_consumer with the old config is now the conflict.
  CHECK(code_of(t.ensure_consumer(c)) == errc::conflict);
  must(t.ensure_consumer(shorter));
}

TEST_CASE("update_consumer changing max_ack_pending takes effect", "[consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "updmap");
  auto s = create_stream(t, sc);
  for (int i = 0; i < 5; ++i) publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc);
  c.max_ack_pending = 1;
  must(t.ensure_consumer(c));
  CHECK(fetch_now(t, c, 10).size() == 1);
  CHECK(fetch_now(t, c, 10).empty());
  auto more = c;
  more.max_ack_pending = 3;
  must(t.update_consumer(more));
  CHECK(seqs_of(fetch_now(t, c, 10)) == std::vector<std::uint64_t>{2, 3});
}

TEST_CASE("update_consumer changing the start position is a conflict", "[consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "updstart");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc);
  must(t.ensure_consumer(c));
  auto changed = c;
  SECTION("deliver policy") {
    changed.deliver = deliver_policy::new_messages;
  }
  SECTION("start sequence") {
    changed.deliver = deliver_policy::by_start_sequence;
    changed.start_seq = 1;
  }
  CHECK(code_of(t.update_consumer(changed)) == errc::conflict);
  CHECK(info_of(t, c).config == c);
}

// ----- fetch ----------------------------------------------------------------------------

TEST_CASE("fetch delivers in stream order, at most batch at a time", "[consumers][fetch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "order");
  auto s = create_stream(t, sc);
  for (int i = 1; i <= 5; ++i)
    publish_ok(t, subject_in(sc, "s" + std::to_string(i)), "d" + std::to_string(i));
  auto c = consumer_cfg(*fx, sc);
  must(t.ensure_consumer(c));

  auto a = fetch_now(t, c, 2);
  CHECK(seqs_of(a) == std::vector<std::uint64_t>{1, 2});
  auto b = fetch_now(t, c, 10);
  CHECK(seqs_of(b) == std::vector<std::uint64_t>{3, 4, 5});
  CHECK(fetch_now(t, c, 10).empty());

  std::vector<message> all = a;
  all.insert(all.end(), b.begin(), b.end());
  std::uint64_t last_consumer_seq = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto& m = all[i];
    CAPTURE(i);
    CHECK(m.stream == sc.name);
    CHECK(m.consumer == c.durable);
    CHECK(m.subject == subject_in(sc, "s" + std::to_string(i + 1)));
    CHECK(m.data == "d" + std::to_string(i + 1));
    CHECK(m.delivery_count == 1);
    CHECK(m.consumer_seq > last_consumer_seq);
    last_consumer_seq = m.consumer_seq;
    CHECK_FALSE(m.ack_token.empty());
  }
}

TEST_CASE("fetch respects the consumer's filter", "[consumers][fetch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "filt");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a.1"));    // 1
  publish_ok(t, subject_in(sc, "b.1"));    // 2
  publish_ok(t, subject_in(sc, "a.2"));    // 3
  publish_ok(t, subject_in(sc, "a.2.x"));  // 4
  auto star = consumer_cfg(*fx, sc, subject_in(sc, "a.*"));
  auto gt = consumer_cfg(*fx, sc, subject_in(sc, "a.>"));
  auto exact = consumer_cfg(*fx, sc, subject_in(sc, "b.1"));
  must(t.ensure_consumer(star));
  must(t.ensure_consumer(gt));
  must(t.ensure_consumer(exact));
  CHECK(seqs_of(fetch_now(t, star, 10)) == std::vector<std::uint64_t>{1, 3});
  CHECK(seqs_of(fetch_now(t, gt, 10)) == std::vector<std::uint64_t>{1, 3, 4});
  CHECK(seqs_of(fetch_now(t, exact, 10)) == std::vector<std::uint64_t>{2});
  publish_ok(t, subject_in(sc, "b.2"));  // 5
  publish_ok(t, subject_in(sc, "a.3"));  // 6
  CHECK(seqs_of(fetch_now(t, star, 10)) == std::vector<std::uint64_t>{6});
  CHECK(fetch_now(t, exact, 10).empty());
}

TEST_CASE("fetch returns due redeliveries before new messages", "[consumers][fetch][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "redelfirst");
  auto s = create_stream(t, sc);
  for (int i = 0; i < 3; ++i) publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc, {}, 1s);
  must(t.ensure_consumer(c));
  auto first = fetch_now(t, c);
  REQUIRE(seqs_of(first) == std::vector<std::uint64_t>{1});
  fx->advance(2s);
  auto next = fetch_now(t, c, 2);
  REQUIRE(seqs_of(next) == std::vector<std::uint64_t>{1, 2});
  CHECK(next[0].delivery_count == 2);
  CHECK(next[1].delivery_count == 1);
}

TEST_CASE("due redeliveries beyond one fetch's batch come in the next fetches, in stream order",
          "[consumers][fetch][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "redelbatch");
  auto s = create_stream(t, sc);
  for (int i = 0; i < 3; ++i) publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc, {}, 1s);
  must(t.ensure_consumer(c));
  REQUIRE(seqs_of(fetch_now(t, c, 3)) == std::vector<std::uint64_t>{1, 2, 3});
  fx->advance(2s);
  auto one = fetch_now(t, c, 1);
  REQUIRE(seqs_of(one) == std::vector<std::uint64_t>{1});
  CHECK(one[0].delivery_count == 2);
  auto rest = fetch_now(t, c, 2);
  REQUIRE(seqs_of(rest) == std::vector<std::uint64_t>{2, 3});
  CHECK(rest[0].delivery_count == 2);
  CHECK(rest[1].delivery_count == 2);
}

TEST_CASE("max_ack_pending caps outstanding deliveries until something is acked",
          "[consumers][fetch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "map");
  auto s = create_stream(t, sc);
  for (int i = 0; i < 4; ++i) publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc);
  c.max_ack_pending = 2;
  must(t.ensure_consumer(c));
  auto got = fetch_now(t, c, 10);
  REQUIRE(seqs_of(got) == std::vector<std::uint64_t>{1, 2});
  CHECK(fetch_now(t, c, 10).empty());
  CHECK(info_of(t, c).num_ack_pending == 2);
  must(t.in_progress(got[0]));  // in-progress is not an ack
  CHECK(fetch_now(t, c, 10).empty());
  must(t.ack(got[1]));
  CHECK(seqs_of(fetch_now(t, c, 10)) == std::vector<std::uint64_t>{3});
  CHECK(fetch_now(t, c, 10).empty());
  must(t.term(got[0]));  // a term frees a slot too
  CHECK(seqs_of(fetch_now(t, c, 10)) == std::vector<std::uint64_t>{4});
}

TEST_CASE("deliver policies choose where a consumer starts on a limits stream",
          "[consumers][fetch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "policies");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));  // 1
  publish_ok(t, subject_in(sc, "b"));  // 2
  publish_ok(t, subject_in(sc, "a"));  // 3
  publish_ok(t, subject_in(sc, "b"));  // 4
  auto c = consumer_cfg(*fx, sc);

  SECTION("all") {
    must(t.ensure_consumer(c));
    CHECK(seqs_of(fetch_now(t, c, 10)) == std::vector<std::uint64_t>{1, 2, 3, 4});
  }
  SECTION("new_messages") {
    c.deliver = deliver_policy::new_messages;
    auto info = must(t.ensure_consumer(c));
    CHECK(info.num_pending == 0);
    CHECK(fetch_now(t, c, 10).empty());
    publish_ok(t, subject_in(sc, "a"));  // 5
    CHECK(seqs_of(fetch_now(t, c, 10)) == std::vector<std::uint64_t>{5});
  }
  SECTION("last, unfiltered") {
    c.deliver = deliver_policy::last;
    must(t.ensure_consumer(c));
    CHECK(seqs_of(fetch_now(t, c, 10)) == std::vector<std::uint64_t>{4});
    publish_ok(t, subject_in(sc, "a"));  // 5
    CHECK(seqs_of(fetch_now(t, c, 10)) == std::vector<std::uint64_t>{5});
  }
  SECTION("last, filtered: the last message matching the filter") {
    c.deliver = deliver_policy::last;
    c.filter_subject = subject_in(sc, "a");
    must(t.ensure_consumer(c));
    CHECK(seqs_of(fetch_now(t, c, 10)) == std::vector<std::uint64_t>{3});
    publish_ok(t, subject_in(sc, "b"));  // 5
    publish_ok(t, subject_in(sc, "a"));  // 6
    CHECK(seqs_of(fetch_now(t, c, 10)) == std::vector<std::uint64_t>{6});
  }
  SECTION("by_start_sequence") {
    c.deliver = deliver_policy::by_start_sequence;
    c.start_seq = 3;
    auto info = must(t.ensure_consumer(c));
    CHECK(info.num_pending == 2);
    CHECK(seqs_of(fetch_now(t, c, 10)) == std::vector<std::uint64_t>{3, 4});
  }
  SECTION("by_start_time") {
    fx->advance(1s);
    c.start_time = t.clock()->now();
    publish_ok(t, subject_in(sc, "a"));  // 5
    publish_ok(t, subject_in(sc, "b"));  // 6
    c.deliver = deliver_policy::by_start_time;
    must(t.ensure_consumer(c));
    CHECK(seqs_of(fetch_now(t, c, 10)) == std::vector<std::uint64_t>{5, 6});
  }
}

TEST_CASE("a waiting fetch with a message already available answers at once",
          "[consumers][fetch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "waitready");
  auto s = create_stream(t, sc);
  for (int i = 0; i < 3; ++i) publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc);
  must(t.ensure_consumer(c));
  auto got = must(t.fetch(sc.name, c.durable, {.batch = 2, .max_wait = 30s}));
  CHECK(seqs_of(got) == std::vector<std::uint64_t>{1, 2});
  got = must(t.fetch(sc.name, c.durable, {.batch = 5, .max_wait = 30s}));
  CHECK(seqs_of(got) == std::vector<std::uint64_t>{3});
}

TEST_CASE("a waiting fetch completes when a message is published", "[consumers][fetch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "waitpub");
  auto s = create_stream(t, sc);
  auto c = consumer_cfg(*fx, sc);
  must(t.ensure_consumer(c));

  SECTION("async_fetch, published on this thread") {
    completion_probe<std::vector<message>> probe;
    t.async_fetch(sc.name, c.durable, {.batch = 5, .max_wait = 60s}, probe.handler());
    CHECK_FALSE(probe.done(50ms));
    publish_ok(t, subject_in(sc, "a"), "wake");
    auto r = probe.get();
    REQUIRE(r.has_value());
    REQUIRE(r->size() == 1);
    CHECK((*r)[0].data == "wake");
    CHECK(probe.calls() == 1);
  }
  SECTION("blocking fetch, published by another thread") {
    // The publisher then keeps time moving, so that a fetch that missed the message
    // fails by answering empty after max_wait instead of blocking for ever.
    std::atomic<bool> answered{false};
    std::thread publisher([&] {
      static_cast<void>(t.publish({.subject = subject_in(sc, "a"), .data = "wake"}));
      while (!answered.load()) {
        fx->advance(250ms);
        std::this_thread::yield();
      }
    });
    auto r = t.fetch(sc.name, c.durable, {.batch = 5, .max_wait = 60s});
    answered = true;
    publisher.join();
    REQUIRE(r.has_value());
    REQUIRE(r->size() == 1);
    CHECK((*r)[0].data == "wake");
  }
  // What the waiting fetch took is no longer available.
  CHECK(fetch_now(t, c, 10).empty());
}

TEST_CASE("a waiting fetch that finds nothing answers empty once max_wait has passed",
          "[consumers][fetch][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "waitempty");
  auto s = create_stream(t, sc);
  auto c = consumer_cfg(*fx, sc);
  must(t.ensure_consumer(c));

  SECTION("async_fetch") {
    completion_probe<std::vector<message>> probe;
    t.async_fetch(sc.name, c.durable, {.batch = 5, .max_wait = 1s}, probe.handler());
    CHECK_FALSE(probe.done(50ms));
    fx->advance(2s);
    auto r = probe.get();
    REQUIRE(r.has_value());
    CHECK(r->empty());
    CHECK(probe.calls() == 1);
  }
  SECTION("blocking fetch, time moved by another thread") {
    // The fetch may start waiting after any given advance, so keep time moving until it
    // has answered.
    std::atomic<bool> answered{false};
    std::thread mover([&] {
      while (!answered.load()) {
        fx->advance(250ms);
        std::this_thread::yield();
      }
    });
    auto r = t.fetch(sc.name, c.durable, {.batch = 5, .max_wait = 1s});
    answered = true;
    mover.join();
    REQUIRE(r.has_value());
    CHECK(r->empty());
  }
  // A message published afterwards is still there for the next fetch.
  publish_ok(t, subject_in(sc, "a"));
  CHECK(fetch_now(t, c, 10).size() == 1);
}

TEST_CASE("a waiting fetch is woken by a redelivery falling due", "[consumers][fetch][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "waitredel");
  auto s = create_stream(t, sc);
  auto c = consumer_cfg(*fx, sc, {}, 1s);
  must(t.ensure_consumer(c));
  publish_ok(t, subject_in(sc, "a"));
  REQUIRE(fetch_now(t, c).size() == 1);

  completion_probe<std::vector<message>> probe;
  t.async_fetch(sc.name, c.durable, {.batch = 5, .max_wait = 30s}, probe.handler());
  CHECK_FALSE(probe.done(50ms));
  fx->advance(2s);
  auto r = probe.get();
  REQUIRE(r.has_value());
  REQUIRE(r->size() == 1);
  CHECK((*r)[0].seq == 1);
  CHECK((*r)[0].delivery_count == 2);
}

TEST_CASE("max_ack_pending -1 leaves outstanding deliveries unlimited", "[consumers][fetch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "unlimited");
  sc.storage = storage_type::memory;
  auto s = create_stream(t, sc);
  constexpr std::size_t total = 1005;  // more than the default max_ack_pending of 1000
  for (std::size_t i = 0; i < total; ++i) publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc);
  c.max_ack_pending = -1;
  must(t.ensure_consumer(c));
  std::size_t got = 0;
  for (int round = 0; round < 10 && got < total; ++round) got += fetch_now(t, c, 250).size();
  CHECK(got == total);
  CHECK(info_of(t, c).num_ack_pending == total);
}

// ----- inactive_threshold ---------------------------------------------------------------

namespace idle {

// Whether the consumer is gone. On a manual clock the case has advanced past the
// threshold, so it must be gone now; JetStream looks for idle consumers now and then
// (seen: up to about one more threshold later), so wait for it in real time. Asking for
// the consumer's info is no use of it on either backend.
bool removed(fixture& fx, transport& t, const consumer_config& c) {
  auto gone = [&] { return code_of(t.consumer_info_of(c.stream, c.durable)) == errc::not_found; };
  if (!fx.real_time()) return gone();
  return amp::testing::eventually(10s, gone, 100ms);
}

}  // namespace idle

TEST_CASE("a consumer idle for its inactive_threshold is removed, its unacked messages stay",
          "[consumers][idle][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "idle", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  auto c = consumer_cfg(*fx, sc, subject_in(sc, "a"));
  c.inactive_threshold = 1s;
  auto forever = consumer_cfg(*fx, sc, subject_in(sc, "b"));  // zero: never removed
  CHECK(must(t.ensure_consumer(c)).config == c);
  must(t.ensure_consumer(forever));
  // The backend reports the threshold as it was set, so ensuring it again is no conflict;
  // another threshold is.
  CHECK(info_of(t, c).config == c);
  CHECK(must(t.ensure_consumer(c)).config == c);
  auto other = c;
  other.inactive_threshold = 2s;
  CHECK(code_of(t.ensure_consumer(other)) == errc::conflict);

  for (int i = 0; i < 3; ++i) publish_ok(t, subject_in(sc, "a"));
  publish_ok(t, subject_in(sc, "b"));
  auto got = fetch_now(t, c, 2);
  REQUIRE(seqs_of(got) == std::vector<std::uint64_t>{1, 2});
  must(t.ack(got[0]));  // the last use
  auto last_use = std::chrono::steady_clock::now();

  if (!fx->real_time()) {
    fx->advance(999ms);
    CHECK(info_of(t, c).num_ack_pending == 1);  // not before the threshold
    fx->advance(1ms);
  }
  REQUIRE(idle::removed(*fx, t, c));
  CHECK(std::chrono::steady_clock::now() - last_use >= (fx->real_time() ? 1s : 0s));
  CHECK(code_of(t.fetch(sc.name, c.durable, {.batch = 1, .max_wait = 0s})) == errc::not_found);
  CHECK(code_of(t.ack(got[1])) == errc::not_found);  // its deliverer is gone

  // Message 2 (delivered, unacked) and 3 (never delivered) are still in the stream, and a
  // consumer made again gets them; the consumer without a threshold is still there.
  CHECK(state_of(t, sc.name).messages == 3);
  CHECK(state_of(t, sc.name).consumers == 1);
  CHECK(info_of(t, forever).config == forever);
  CHECK(must(t.ensure_consumer(c)).num_pending == 2);
  auto again = fetch_now(t, c, 10);
  REQUIRE(seqs_of(again) == std::vector<std::uint64_t>{2, 3});
  CHECK(again[0].delivery_count == 1);
  for (const auto& m : again) must(t.ack(m));
  CHECK(seqs_of(fetch_now(t, forever, 10)) == std::vector<std::uint64_t>{4});
  CHECK(info_of(t, forever).config == forever);
}

TEST_CASE("a consumer in use is not removed by its inactive_threshold", "[consumers][idle][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "busy", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  auto c = consumer_cfg(*fx, sc);
  c.inactive_threshold = 1s;
  must(t.ensure_consumer(c));
  publish_ok(t, subject_in(sc, "a"));
  publish_ok(t, subject_in(sc, "a"));

  // A fetch, an acknowledgement of each kind and a fetch again, every half threshold:
  // together longer than two thresholds.
  fx->advance(500ms);
  auto first = fetch_now(t, c);
  REQUIRE(first.size() == 1);
  fx->advance(500ms);
  must(t.in_progress(first[0]));
  fx->advance(500ms);
  must(t.nak(first[0]));
  fx->advance(500ms);
  auto redelivered = fetch_now(t, c);
  REQUIRE(redelivered.size() == 1);
  CHECK(redelivered[0].delivery_count == 2);
  fx->advance(500ms);
  must(t.ack(redelivered[0]));
  fx->advance(500ms);
  CHECK(info_of(t, c).config == c);

  // A fetch waiting for twice the threshold is use all along.
  auto rest = fetch_now(t, c);
  REQUIRE(rest.size() == 1);
  must(t.ack(rest[0]));
  completion_probe<std::vector<message>> probe;
  t.async_fetch(sc.name, c.durable, {.batch = 1, .max_wait = 30s}, probe.handler());
  fx->advance(2s);
  CHECK_FALSE(probe.done());
  CHECK(info_of(t, c).config == c);
  publish_ok(t, subject_in(sc, "a"), "wake");
  auto woken = probe.get();
  REQUIRE(woken.has_value());
  REQUIRE(woken->size() == 1);
  must(t.ack((*woken)[0]));

  // Then, idle, it goes.
  fx->advance(1s);
  CHECK(idle::removed(*fx, t, c));
  CHECK(state_of(t, sc.name).messages == 0);
}

TEST_CASE("update_consumer sets and clears inactive_threshold", "[consumers][idle][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "updidle", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  auto set = consumer_cfg(*fx, sc, subject_in(sc, "a"));
  auto cleared = consumer_cfg(*fx, sc, subject_in(sc, "b"));
  cleared.inactive_threshold = 1s;
  must(t.ensure_consumer(set));
  must(t.ensure_consumer(cleared));
  publish_ok(t, subject_in(sc, "a"));

  auto set2 = set;
  set2.inactive_threshold = 1s;
  CHECK(must(t.update_consumer(set2)).config == set2);
  auto cleared2 = cleared;
  cleared2.inactive_threshold = duration::zero();
  CHECK(must(t.update_consumer(cleared2)).config == cleared2);
  CHECK(info_of(t, set).config == set2);
  CHECK(info_of(t, cleared).config == cleared2);
  CHECK(code_of(t.ensure_consumer(set)) == errc::conflict);

  fx->advance(1s);
  REQUIRE(idle::removed(*fx, t, set));
  CHECK(state_of(t, sc.name).messages == 1);  // a consumer's removal leaves the stream be
  fx->advance(1s);                            // more than twice the old threshold in all
  CHECK(info_of(t, cleared).config == cleared2);
}

}  // namespace
}  // namespace amp::conformance::cases
