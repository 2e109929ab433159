// Acknowledgements: ack, nak (with and without delay), in_progress and term; AckWait
// redelivery and delivery counts; max_deliver; stale and repeated acks; retention.

#include <string>
#include <vector>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

/// The AckWait of the time-dependent cases: short, so that a real-time run stays fast.
constexpr duration ack_wait = 2s;

/// Fetches exactly one message now; fails the case otherwise.
message fetch_one(transport& t, const consumer_config& c,
                  std::source_location where = std::source_location::current()) {
  auto ms = fetch_now(t, c, 1, where);
  if (ms.size() != 1) {
    FAIL("expected one message at " << where.file_name() << ":" << where.line() << ", got "
                                    << ms.size());
  }
  return ms[0];
}

TEST_CASE("ack on a work-queue stream removes the message", "[acks][work_queue]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "wqack", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"), "one");
  publish_ok(t, subject_in(sc, "a"), "two");
  auto c = consumer_cfg(*fx, sc, {}, ack_wait);
  must(t.ensure_consumer(c));

  auto m = fetch_one(t, c);
  CHECK(m.seq == 1);
  CHECK(state_of(t, sc.name).messages == 2);  // delivered is not removed
  must(t.ack(m));
  CHECK(state_of(t, sc.name).messages == 1);
  CHECK(code_of(t.get_message(sc.name, 1)) == errc::not_found);
  CHECK(must(t.get_message(sc.name, 2)).data == "two");
  auto info = info_of(t, c);
  CHECK(info.num_ack_pending == 0);
  CHECK(info.ack_floor_stream_seq == 1);
  // Never delivered again.
  fx->advance(ack_wait + 1s);
  auto next = fetch_now(t, c, 10);
  CHECK(seqs_of(next) == std::vector<std::uint64_t>{2});
}

TEST_CASE("ack on a limits stream keeps the message but ends its deliveries", "[acks]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "limack");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"), "kept");
  auto c = consumer_cfg(*fx, sc, {}, ack_wait);
  must(t.ensure_consumer(c));
  must(t.ack(fetch_one(t, c)));
  CHECK(state_of(t, sc.name).messages == 1);
  CHECK(must(t.get_message(sc.name, 1)).data == "kept");
  fx->advance(ack_wait + 1s);
  CHECK(fetch_now(t, c, 10).empty());
  CHECK(info_of(t, c).num_ack_pending == 0);
}

TEST_CASE("on an interest stream a message goes once every consumer has acked it",
          "[acks][interest]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "interest", retention_policy::interest);
  auto s = create_stream(t, sc);
  auto a = consumer_cfg(*fx, sc);
  auto b = consumer_cfg(*fx, sc);
  must(t.ensure_consumer(a));
  must(t.ensure_consumer(b));
  publish_ok(t, subject_in(sc, "x"));
  auto ma = fetch_one(t, a);
  auto mb = fetch_one(t, b);
  must(t.ack(ma));
  CHECK(state_of(t, sc.name).messages == 1);
  must(t.ack(mb));
  CHECK(state_of(t, sc.name).messages == 0);
  CHECK(code_of(t.get_message(sc.name, 1)) == errc::not_found);
}

TEST_CASE("term on a work-queue stream removes the message, it is never redelivered",
          "[acks][work_queue][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "wqterm", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc, {}, ack_wait);
  must(t.ensure_consumer(c));
  must(t.term(fetch_one(t, c)));
  CHECK(state_of(t, sc.name).messages == 0);
  CHECK(code_of(t.get_message(sc.name, 1)) == errc::not_found);
  CHECK(info_of(t, c).num_ack_pending == 0);
  fx->advance(ack_wait + 1s);
  CHECK(fetch_now(t, c, 10).empty());
}

TEST_CASE("term on a limits stream keeps the message and never redelivers it", "[acks][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "limterm");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc, {}, ack_wait);
  must(t.ensure_consumer(c));
  must(t.term(fetch_one(t, c)));
  CHECK(state_of(t, sc.name).messages == 1);
  fx->advance(ack_wait + 1s);
  CHECK(fetch_now(t, c, 10).empty());
  CHECK(info_of(t, c).num_ack_pending == 0);
}

TEST_CASE("an unacked message is redelivered after ack_wait, not before, counting deliveries",
          "[acks][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "redeliver", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"), "job");
  auto c = consumer_cfg(*fx, sc, {}, ack_wait);
  must(t.ensure_consumer(c));

  auto d1 = fetch_one(t, c);
  CHECK(d1.delivery_count == 1);
  fx->advance(ack_wait / 2);
  CHECK(fetch_now(t, c, 10).empty());

  fx->advance(ack_wait);  // 1.5 × ack_wait since the delivery
  auto d2 = fetch_one(t, c);
  CHECK(d2.seq == d1.seq);
  CHECK(d2.data == "job");
  CHECK(d2.delivery_count == 2);
  CHECK(fetch_now(t, c, 10).empty());  // redelivered once, not twice

  fx->advance(ack_wait / 2);
  CHECK(fetch_now(t, c, 10).empty());  // the redelivery started a new ack_wait
  fx->advance(ack_wait);
  auto d3 = fetch_one(t, c);
  CHECK(d3.seq == d1.seq);
  CHECK(d3.delivery_count == 3);

  must(t.ack(d3));
  CHECK(state_of(t, sc.name).messages == 0);
}

TEST_CASE("in_progress restarts the full ack_wait", "[acks][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "wpi", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc, {}, ack_wait);
  must(t.ensure_consumer(c));
  const auto step = ack_wait * 6 / 10;

  auto d1 = fetch_one(t, c);
  fx->advance(step);
  must(t.in_progress(d1));
  fx->advance(step);  // past the first deadline, within the restarted one
  CHECK(fetch_now(t, c, 10).empty());
  must(t.in_progress(d1));  // working longer still
  fx->advance(step);
  CHECK(fetch_now(t, c, 10).empty());
  CHECK(info_of(t, c).num_redelivered == 0);

  fx->advance(step);  // 1.2 × ack_wait after the last in_progress
  auto d2 = fetch_one(t, c);
  CHECK(d2.seq == d1.seq);
  CHECK(d2.delivery_count == 2);
}

TEST_CASE("in_progress then ack removes the message from a work-queue stream", "[acks]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "wpiack", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc, {}, ack_wait);
  must(t.ensure_consumer(c));
  auto m = fetch_one(t, c);
  must(t.in_progress(m));
  must(t.in_progress(m));
  CHECK(state_of(t, sc.name).messages == 1);
  must(t.ack(m));
  CHECK(state_of(t, sc.name).messages == 0);
}

TEST_CASE("nak redelivers at once and counts as a delivery", "[acks]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "nak", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"), "job");
  auto c = consumer_cfg(*fx, sc, {}, 30s);
  must(t.ensure_consumer(c));

  auto d1 = fetch_one(t, c);
  must(t.nak(d1));
  auto d2 = fetch_one(t, c);
  CHECK(d2.seq == d1.seq);
  CHECK(d2.data == "job");
  CHECK(d2.delivery_count == 2);
  auto info = info_of(t, c);
  CHECK(info.num_ack_pending == 1);
  CHECK(info.num_redelivered == 1);

  must(t.nak(d2));
  auto d3 = fetch_one(t, c);
  CHECK(d3.delivery_count == 3);
  CHECK(state_of(t, sc.name).messages == 1);  // a nak never removes
}

TEST_CASE("nak goes before newer messages in the next fetch", "[acks]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "nakorder");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc);
  must(t.ensure_consumer(c));
  must(t.nak(fetch_one(t, c)));
  auto got = fetch_now(t, c, 10);
  REQUIRE(seqs_of(got) == std::vector<std::uint64_t>{1, 2});
  CHECK(got[0].delivery_count == 2);
  CHECK(got[1].delivery_count == 1);
}

TEST_CASE("nak with a delay redelivers after the delay, not before", "[acks][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "nakdelay", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"), "delayed");
  publish_ok(t, subject_in(sc, "a"), "other");
  auto c = consumer_cfg(*fx, sc, {}, 30s);
  must(t.ensure_consumer(c));

  auto d1 = fetch_one(t, c);
  REQUIRE(d1.data == "delayed");
  must(t.nak(d1, 2s));
  // Other messages flow meanwhile; the delayed one does not.
  auto other = fetch_now(t, c, 10);
  REQUIRE(other.size() == 1);
  CHECK(other[0].data == "other");
  must(t.ack(other[0]));
  fx->advance(1s);
  CHECK(fetch_now(t, c, 10).empty());
  fx->advance(2s);
  auto d2 = fetch_one(t, c);
  CHECK(d2.seq == d1.seq);
  CHECK(d2.delivery_count == 2);
}

TEST_CASE("max_deliver stops redelivery after that many deliveries", "[acks][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "maxdeliver");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"), "poison");
  publish_ok(t, subject_in(sc, "a"), "fine");
  auto c = consumer_cfg(*fx, sc, {}, ack_wait);
  c.max_deliver = 2;
  must(t.ensure_consumer(c));

  auto d1 = fetch_one(t, c);
  REQUIRE(d1.data == "poison");
  must(t.nak(d1));
  auto d2 = fetch_one(t, c);
  CHECK(d2.seq == d1.seq);
  CHECK(d2.delivery_count == 2);
  must(t.nak(d2));  // a third delivery would exceed max_deliver
  auto next = fetch_now(t, c, 10);
  REQUIRE(next.size() == 1);
  CHECK(next[0].data == "fine");
  must(t.ack(next[0]));
  fx->advance(ack_wait + 1s);
  CHECK(fetch_now(t, c, 10).empty());
}

TEST_CASE("acking a message twice succeeds and changes nothing more", "[acks]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "twice", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc, {}, 1s);  // short: each section waits for it
  must(t.ensure_consumer(c));
  auto m = fetch_one(t, c);
  must(t.ack(m));
  must(t.ack(m));
  SECTION("ack only") {}
  SECTION("then a term or a nak or in_progress of the acked message") {
    must(t.term(m));
    must(t.nak(m));
    must(t.in_progress(m));
  }
  auto st = state_of(t, sc.name);
  CHECK(st.messages == 1);
  auto info = info_of(t, c);
  CHECK(info.num_ack_pending == 0);
  CHECK(info.ack_floor_stream_seq == 1);
  // Nothing was brought back.
  auto next = fetch_now(t, c, 10);
  CHECK(seqs_of(next) == std::vector<std::uint64_t>{2});
  fx->advance(1500ms);
  auto after = fetch_now(t, c, 10);
  CHECK(seqs_of(after) == std::vector<std::uint64_t>{2});  // only the unacked one, redelivered
}

TEST_CASE("a stale ack from an earlier delivery applies to the message still pending",
          "[acks][work_queue][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "stale", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc, {}, 1s);  // short: each section waits for it
  must(t.ensure_consumer(c));
  auto d1 = fetch_one(t, c);
  fx->advance(1500ms);
  auto d2 = fetch_one(t, c);
  REQUIRE(d2.seq == d1.seq);
  REQUIRE(d2.delivery_count == 2);

  SECTION("stale ack") {
    must(t.ack(d1));
    CHECK(state_of(t, sc.name).messages == 0);
    CHECK(code_of(t.get_message(sc.name, d1.seq)) == errc::not_found);
    CHECK(info_of(t, c).num_ack_pending == 0);
    fx->advance(1500ms);
    CHECK(fetch_now(t, c, 10).empty());
    must(t.ack(d2));  // no longer pending: succeeds, changes nothing
  }
  SECTION("stale term") {
    must(t.term(d1));
    CHECK(state_of(t, sc.name).messages == 0);
    fx->advance(1500ms);
    CHECK(fetch_now(t, c, 10).empty());
  }
  SECTION("current ack, then the stale one") {
    must(t.ack(d2));
    CHECK(state_of(t, sc.name).messages == 0);
    must(t.ack(d1));  // no longer pending: succeeds, changes nothing
    CHECK(info_of(t, c).num_ack_pending == 0);
  }
}

TEST_CASE("an ack_token this transport did not issue is bad_request, or dropped unconfirmed",
          "[acks]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "garbage", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc);
  must(t.ensure_consumer(c));
  auto real = fetch_one(t, c);

  auto forged = real;
  SECTION("garbage") {
    forged.ack_token = "garbage";
  }
  SECTION("empty") {
    forged.ack_token.clear();
  }
  SECTION("a subject with a wildcard") {
    forged.ack_token = "$JS.ACK.*.>";
  }
  SECTION("a message read with get_message") {
    forged = must(t.get_message(sc.name, 1));
  }
  CHECK(code_of(t.ack(forged)) == errc::bad_request);
  CHECK(code_of(t.nak(forged)) == errc::bad_request);
  CHECK(code_of(t.in_progress(forged)) == errc::bad_request);
  CHECK(code_of(t.term(forged)) == errc::bad_request);
  // Nor without a confirmation: it reports nothing and changes nothing.
  for (auto kind : {ack_kind::ack, ack_kind::nak, ack_kind::in_progress, ack_kind::term}) {
    t.acknowledge(forged, kind);
  }
  // Nothing happened to the real delivery.
  CHECK(state_of(t, sc.name).messages == 1);
  CHECK(info_of(t, c).num_ack_pending == 1);
  must(t.ack(real));
  CHECK(state_of(t, sc.name).messages == 0);
}

TEST_CASE("async_acknowledge completes exactly once for every kind", "[acks][async]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "asyncack", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));
  auto c = consumer_cfg(*fx, sc);
  must(t.ensure_consumer(c));

  auto m = fetch_one(t, c);
  completion_probe<void> wpi, nak, ack, bad;
  t.async_acknowledge(m, ack_kind::in_progress, duration::zero(), wpi.handler());
  must(wpi.get());
  t.async_acknowledge(m, ack_kind::nak, duration::zero(), nak.handler());
  must(nak.get());
  auto m2 = fetch_one(t, c);
  t.async_acknowledge(m2, ack_kind::ack, duration::zero(), ack.handler());
  must(ack.get());
  auto forged = m2;
  forged.ack_token = "not a token";
  t.async_acknowledge(forged, ack_kind::term, duration::zero(), bad.handler());
  CHECK(code_of(bad.get()) == errc::bad_request);

  must(t.ping());
  CHECK(state_of(t, sc.name).messages == 0);
  CHECK(wpi.calls() == 1);
  CHECK(nak.calls() == 1);
  CHECK(ack.calls() == 1);
  CHECK(bad.calls() == 1);
}

/// Lets the fixture's clock run in small steps (at most 5 s) until `settled` holds: an
/// unconfirmed acknowledgement takes effect after the call returns.
template <class Predicate>
bool settles(fixture& fx, Predicate settled) {
  for (int i = 0; i < 500 && !settled(); ++i) fx.advance(10ms);
  return settled();
}

TEST_CASE("acknowledge without a confirmation acks, naks and terms", "[acks][unconfirmed]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "plainack", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"), "acked");
  publish_ok(t, subject_in(sc, "a"), "naked");
  publish_ok(t, subject_in(sc, "a"), "termed");
  auto c = consumer_cfg(*fx, sc, {}, 30s);
  must(t.ensure_consumer(c));
  auto got = fetch_now(t, c, 3);
  REQUIRE(got.size() == 3);

  t.acknowledge(got[0], ack_kind::ack);
  t.acknowledge(got[2], ack_kind::term);
  CHECK(settles(*fx, [&] { return state_of(t, sc.name).messages == 1; }));
  CHECK(code_of(t.get_message(sc.name, 1)) == errc::not_found);
  CHECK(code_of(t.get_message(sc.name, 3)) == errc::not_found);

  t.acknowledge(got[1], ack_kind::nak);
  std::vector<message> again;
  CHECK(settles(*fx, [&] {
    if (again.empty()) again = fetch_now(t, c, 3);
    return !again.empty();
  }));
  REQUIRE(again.size() == 1);
  CHECK(again[0].data == "naked");
  CHECK(again[0].delivery_count == 2);
  t.acknowledge(again[0], ack_kind::ack);
  CHECK(settles(*fx, [&] { return state_of(t, sc.name).messages == 0; }));
  CHECK(info_of(t, c).num_ack_pending == 0);
}

TEST_CASE("a deleted message is not delivered again, and an ack of it changes nothing",
          "[acks][work_queue][delete][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "wqdel", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"), "withdrawn");
  publish_ok(t, subject_in(sc, "a"), "kept");
  publish_ok(t, subject_in(sc, "a"), "never fetched");
  auto c = consumer_cfg(*fx, sc, {}, ack_wait);
  must(t.ensure_consumer(c));
  auto got = fetch_now(t, c, 2);
  REQUIRE(got.size() == 2);

  must(t.delete_message(sc.name, 1));  // pending
  must(t.delete_message(sc.name, 3));  // not yet delivered
  CHECK(code_of(t.get_message(sc.name, 1)) == errc::not_found);
  CHECK(state_of(t, sc.name).messages == 1);
  CHECK(code_of(t.delete_message(sc.name, 1)) == errc::not_found);
  CHECK(code_of(t.delete_message(sc.name, 99)) == errc::not_found);
  CHECK(code_of(t.delete_message(sc.name, 0)) == errc::not_found);
  CHECK(code_of(t.delete_message(fx->unique("nostream"), 1)) == errc::not_found);

  // Past AckWait only the message that is still stored comes again.
  fx->advance(ack_wait + 1s);
  auto again = fetch_now(t, c, 10);
  REQUIRE(seqs_of(again) == std::vector<std::uint64_t>{2});
  CHECK(again[0].data == "kept");
  must(t.ack(got[0]));  // the withdrawn one's ack: accepted, nothing changes
  must(t.ack(again[0]));
  CHECK(state_of(t, sc.name).messages == 0);
  fx->advance(ack_wait + 1s);
  CHECK(fetch_now(t, c, 10).empty());
  CHECK(info_of(t, c).num_ack_pending == 0);
}

}  // namespace
}  // namespace amp::conformance::cases
