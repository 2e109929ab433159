// Publish: sequences, headers, deduplication by msg_id, and the stream limits
// (max_msg_size, max_msgs, max_bytes, max_msgs_per_subject, max_age, discard policy).

#include <string>
#include <vector>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

TEST_CASE("publish returns the capturing stream and sequences rising from 1", "[publish]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "seq");
  auto s = create_stream(t, c);
  for (std::uint64_t i = 1; i <= 3; ++i) {
    // The same subject and data twice without an id are two messages.
    auto ack = must(t.publish({.subject = subject_in(c, "a"), .data = "same"}));
    CHECK(ack.stream == c.name);
    CHECK(ack.seq == i);
    CHECK_FALSE(ack.duplicate);
  }
  CHECK(state_of(t, c.name).messages == 3);
}

TEST_CASE("publish to a subject that no stream captures is not_found", "[publish]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "nocapture");
  c.subjects = {c.name + ".in.*"};
  auto s = create_stream(t, c);
  CHECK(code_of(t.publish({.subject = fx->unique("nowhere") + ".x", .data = "x"})) ==
        errc::not_found);
  // Close to the stream's subjects, but not captured by them.
  CHECK(code_of(t.publish({.subject = c.name + ".in.a.b", .data = "x"})) == errc::not_found);
  CHECK(code_of(t.publish({.subject = c.name + ".out", .data = "x"})) == errc::not_found);
  CHECK(state_of(t, c.name).messages == 0);
  CHECK(publish_ok(t, c.name + ".in.a") == 1);
}

TEST_CASE("publish routes each subject to the stream that captures it", "[publish]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto a = stream_cfg(*fx, "routea");
  auto b = stream_cfg(*fx, "routeb");
  auto sa = create_stream(t, a);
  auto sb = create_stream(t, b);
  CHECK(must(t.publish({.subject = subject_in(a, "x"), .data = "1"})).stream == a.name);
  CHECK(must(t.publish({.subject = subject_in(b, "x"), .data = "2"})).stream == b.name);
  CHECK(must(t.publish({.subject = subject_in(b, "y"), .data = "3"})).seq == 2);
  CHECK(state_of(t, a.name).messages == 1);
  CHECK(state_of(t, b.name).messages == 2);
}

TEST_CASE("headers and binary data round trip in order, repeated names kept", "[publish]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "headers");
  auto s = create_stream(t, c);
  const header_list sent = {
      {"Amp-Type", "job"}, {"x-lower", "v"}, {"Amp-Type", "second"}, {"Empty-Ish", "a b c"}};
  const std::string data("a\0b\xff\n", 5);
  must(t.publish({.subject = subject_in(c, "h"), .data = data, .headers = sent}));

  // The values of one name keep their order; the order across names is not promised
  // (NATS clients keep headers in a map).
  auto ours = [&](const header_list& got) {
    header_list out;
    for (const auto& h : got) {
      if (h.first == "Amp-Type" || h.first == "x-lower" || h.first == "Empty-Ish") out.push_back(h);
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    return out;
  };
  auto check = [&](const message& m) {
    CHECK(m.data == data);
    CHECK(ours(m.headers) == ours(sent));
    CHECK(find_header(m.headers, "Amp-Type") == "job");
    CHECK(find_header(m.headers, "x-lower") == "v");
    CHECK_FALSE(find_header(m.headers, "amp-type").has_value());  // names are case-sensitive
  };
  SECTION("through get_message") {
    check(must(t.get_message(c.name, 1)));
  }
  SECTION("through get_last_message") {
    check(must(t.get_last_message(c.name, subject_in(c, "h"))));
  }
  SECTION("through a consumer") {
    auto cc = consumer_cfg(*fx, c);
    must(t.ensure_consumer(cc));
    auto ms = fetch_now(t, cc);
    REQUIRE(ms.size() == 1);
    check(ms[0]);
  }
}

TEST_CASE("a stored message carries its msg_id as the Nats-Msg-Id header", "[publish][dedup]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "idhdr");
  auto s = create_stream(t, c);
  must(t.publish({.subject = subject_in(c, "a"), .data = "1", .msg_id = "id-1"}));
  must(t.publish({.subject = subject_in(c, "a"), .data = "2"}));
  auto check = [](const message& first, const message& second) {
    CHECK(find_header(first.headers, "Nats-Msg-Id") == "id-1");
    CHECK_FALSE(find_header(second.headers, "Nats-Msg-Id"));
  };
  SECTION("through get_message") {
    check(must(t.get_message(c.name, 1)), must(t.get_message(c.name, 2)));
  }
  SECTION("through a consumer") {
    auto cc = consumer_cfg(*fx, c);
    must(t.ensure_consumer(cc));
    auto ms = fetch_now(t, cc, 2);
    REQUIRE(ms.size() == 2);
    check(ms[0], ms[1]);
  }
  SECTION("through an ordered replay") {
    replay_log log;
    auto sub =
        must(t.subscribe_ordered({.stream = c.name, .start = deliver_policy::all}, log.callback()));
    REQUIRE(log.wait_for(2));
    const auto ms = log.items();
    check(ms[0], ms[1]);
  }
}

TEST_CASE("an empty payload is stored as an empty message", "[publish]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "empty");
  auto s = create_stream(t, c);
  must(t.publish({.subject = subject_in(c, "e"), .data = ""}));
  auto m = must(t.get_message(c.name, 1));
  CHECK(m.data.empty());
  CHECK(m.subject == subject_in(c, "e"));
}

TEST_CASE("a msg_id seen within the duplicate window returns the first sequence and stores nothing",
          "[publish][dedup]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "dedup");
  auto s = create_stream(t, c);
  auto first = must(t.publish({.subject = subject_in(c, "a"), .data = "original", .msg_id = "A"}));
  CHECK_FALSE(first.duplicate);
  CHECK(first.seq == 1);
  publish_ok(t, subject_in(c, "a"), "other");  // 2

  SECTION("same subject") {
    auto dup = must(t.publish({.subject = subject_in(c, "a"), .data = "changed", .msg_id = "A"}));
    CHECK(dup.duplicate);
    CHECK(dup.seq == 1);
    CHECK(dup.stream == c.name);
  }
  SECTION("another subject of the same stream") {
    auto dup = must(t.publish({.subject = subject_in(c, "b"), .data = "changed", .msg_id = "A"}));
    CHECK(dup.duplicate);
    CHECK(dup.seq == 1);
  }
  SECTION("again and again") {
    for (int i = 0; i < 3; ++i) {
      auto dup = must(t.publish({.subject = subject_in(c, "a"), .data = "x", .msg_id = "A"}));
      CHECK(dup.duplicate);
      CHECK(dup.seq == 1);
    }
  }
  auto st = state_of(t, c.name);
  CHECK(st.messages == 2);
  CHECK(st.last_seq == 2);
  CHECK(must(t.get_message(c.name, 1)).data == "original");
  // A different id is a new message.
  auto other = must(t.publish({.subject = subject_in(c, "a"), .data = "x", .msg_id = "B"}));
  CHECK_FALSE(other.duplicate);
  CHECK(other.seq == 3);
}

TEST_CASE("after the duplicate window passes, the same msg_id is stored again",
          "[publish][dedup][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "dedupwin");
  c.duplicate_window = 1s;
  auto s = create_stream(t, c);
  CHECK(must(t.publish({.subject = subject_in(c, "a"), .data = "1", .msg_id = "K"})).seq == 1);
  auto dup = must(t.publish({.subject = subject_in(c, "a"), .data = "2", .msg_id = "K"}));
  CHECK(dup.duplicate);
  CHECK(dup.seq == 1);

  fx->advance(2s);
  auto again = must(t.publish({.subject = subject_in(c, "a"), .data = "3", .msg_id = "K"}));
  CHECK_FALSE(again.duplicate);
  CHECK(again.seq == 2);
  CHECK(state_of(t, c.name).messages == 2);
  // And that new publish opens a new window.
  auto dup2 = must(t.publish({.subject = subject_in(c, "a"), .data = "4", .msg_id = "K"}));
  CHECK(dup2.duplicate);
  CHECK(dup2.seq == 2);
}

TEST_CASE("msg_ids are per stream", "[publish][dedup]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto a = stream_cfg(*fx, "ida");
  auto b = stream_cfg(*fx, "idb");
  auto sa = create_stream(t, a);
  auto sb = create_stream(t, b);
  CHECK_FALSE(
      must(t.publish({.subject = subject_in(a, "x"), .data = "1", .msg_id = "same"})).duplicate);
  CHECK_FALSE(
      must(t.publish({.subject = subject_in(b, "x"), .data = "1", .msg_id = "same"})).duplicate);
}

TEST_CASE("a payload over max_msg_size is payload_too_large and not stored", "[publish][limits]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "size");
  c.max_msg_size = 8;
  auto s = create_stream(t, c);
  CHECK(publish_ok(t, subject_in(c, "a"), std::string(8, 'x')) == 1);
  auto r = t.publish({.subject = subject_in(c, "a"), .data = std::string(9, 'x')});
  CHECK(code_of(r) == errc::payload_too_large);
  auto st = state_of(t, c.name);
  CHECK(st.messages == 1);
  CHECK(st.last_seq == 1);
  CHECK(publish_ok(t, subject_in(c, "a"), "small") == 2);
}

TEST_CASE("max_msgs with discard old drops the oldest messages", "[publish][limits]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "maxold");
  c.max_msgs = 3;
  c.discard = discard_policy::old_messages;
  auto s = create_stream(t, c);
  for (int i = 1; i <= 5; ++i)
    CHECK(publish_ok(t, subject_in(c, "a"), std::to_string(i)) == static_cast<std::uint64_t>(i));
  auto st = state_of(t, c.name);
  CHECK(st.messages == 3);
  CHECK(st.first_seq == 3);
  CHECK(st.last_seq == 5);
  CHECK(code_of(t.get_message(c.name, 1)) == errc::not_found);
  CHECK(code_of(t.get_message(c.name, 2)) == errc::not_found);
  CHECK(must(t.get_message(c.name, 3)).data == "3");
  CHECK(must(t.get_message(c.name, 5)).data == "5");
}

TEST_CASE("max_msgs with discard new refuses the publish with limit_exceeded",
          "[publish][limits]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "maxnew");
  c.max_msgs = 2;
  c.discard = discard_policy::new_messages;
  auto s = create_stream(t, c);
  publish_ok(t, subject_in(c, "a"), "1");
  publish_ok(t, subject_in(c, "a"), "2");
  CHECK(code_of(t.publish({.subject = subject_in(c, "a"), .data = "3"})) == errc::limit_exceeded);
  auto st = state_of(t, c.name);
  CHECK(st.messages == 2);
  CHECK(st.first_seq == 1);
  CHECK(st.last_seq == 2);
  CHECK(must(t.get_message(c.name, 1)).data == "1");
}

TEST_CASE("discard new refuses on the stream's limits, not on a subject's", "[publish][limits]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "pernew");
  c.max_msgs = 2;
  c.max_msgs_per_subject = 1;
  c.discard = discard_policy::new_messages;
  auto s = create_stream(t, c);
  publish_ok(t, subject_in(c, "a"), "1");
  // The subject at its limit drops its oldest.
  CHECK(publish_ok(t, subject_in(c, "a"), "2") == 2);
  CHECK(code_of(t.get_message(c.name, 1)) == errc::not_found);
  CHECK(publish_ok(t, subject_in(c, "b"), "3") == 3);
  // The stream at its limit refuses a new subject...
  CHECK(code_of(t.publish({.subject = subject_in(c, "c"), .data = "4"})) == errc::limit_exceeded);
  // ...and takes one whose own limit makes the room.
  CHECK(publish_ok(t, subject_in(c, "a"), "5") == 4);
  auto st = state_of(t, c.name);
  CHECK(st.messages == 2);
  CHECK(st.last_seq == 4);
  CHECK(must(t.get_message(c.name, 3)).data == "3");
}

TEST_CASE("max_msg_size counts the header block with the data, Nats-Msg-Id included",
          "[publish][limits]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "sizehdr");
  c.max_msg_size = 64;
  auto s = create_stream(t, c);
  // "NATS/1.0\r\n" + "X-Pad: " + 30 bytes + "\r\n" + "\r\n": 51 bytes, leaving 13 for data.
  const header_list pad{{"X-Pad", std::string(30, 'p')}};
  CHECK(publish_ok(t, subject_in(c, "a"), std::string(64, 'x')) == 1);
  CHECK(
      must(t.publish({.subject = subject_in(c, "a"), .data = std::string(13, 'x'), .headers = pad}))
          .seq == 2);
  CHECK(code_of(t.publish(
            {.subject = subject_in(c, "a"), .data = std::string(14, 'x'), .headers = pad})) ==
        errc::payload_too_large);
  // "NATS/1.0\r\n" + "Nats-Msg-Id: " + 20 bytes + "\r\n" + "\r\n": 47 bytes, leaving 17.
  const std::string id(20, 'i');
  CHECK(code_of(t.publish(
            {.subject = subject_in(c, "a"), .data = std::string(18, 'x'), .msg_id = id})) ==
        errc::payload_too_large);
  CHECK(must(t.publish({.subject = subject_in(c, "a"), .data = std::string(17, 'x'), .msg_id = id}))
            .seq == 3);
  CHECK(state_of(t, c.name).messages == 3);
}

TEST_CASE("a publish refused as too large does not record its msg_id", "[publish][limits][dedup]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "largeid");
  c.max_msg_size = 256;  // JetStream counts the headers (here Nats-Msg-Id) in the size
  auto s = create_stream(t, c);
  CHECK(code_of(t.publish(
            {.subject = subject_in(c, "a"), .data = std::string(300, 'x'), .msg_id = "L"})) ==
        errc::payload_too_large);
  auto ack = must(t.publish({.subject = subject_in(c, "a"), .data = "small", .msg_id = "L"}));
  CHECK_FALSE(ack.duplicate);
  CHECK(ack.seq == 1);
  auto again = must(t.publish({.subject = subject_in(c, "a"), .data = "small", .msg_id = "L"}));
  CHECK(again.duplicate);
  CHECK(again.seq == 1);
  CHECK(state_of(t, c.name).messages == 1);
}

TEST_CASE("a refused publish does not record its msg_id", "[publish][limits][dedup]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "refusedid", retention_policy::work_queue);
  c.max_msgs = 1;
  c.discard = discard_policy::new_messages;
  auto s = create_stream(t, c);
  publish_ok(t, subject_in(c, "a"));
  CHECK(code_of(t.publish({.subject = subject_in(c, "a"), .data = "x", .msg_id = "R"})) ==
        errc::limit_exceeded);
  // Make room: a work-queue consumer acks the first message.
  auto cc = consumer_cfg(*fx, c);
  must(t.ensure_consumer(cc));
  auto ms = fetch_now(t, cc);
  REQUIRE(ms.size() == 1);
  must(t.ack(ms[0]));
  auto ack = must(t.publish({.subject = subject_in(c, "a"), .data = "x", .msg_id = "R"}));
  CHECK_FALSE(ack.duplicate);
  CHECK(ack.seq == 2);
}

TEST_CASE("max_bytes limits the stream by size", "[publish][limits]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "bytes");
  c.max_bytes = 200;  // one 120-byte message fits, two do not
  const std::string payload(120, 'b');
  SECTION("discard new refuses") {
    c.discard = discard_policy::new_messages;
    auto s = create_stream(t, c);
    publish_ok(t, subject_in(c, "a"), payload);
    CHECK(code_of(t.publish({.subject = subject_in(c, "a"), .data = payload})) ==
          errc::limit_exceeded);
    CHECK(state_of(t, c.name).messages == 1);
    CHECK(state_of(t, c.name).bytes <= 200);
  }
  SECTION("discard old drops the oldest") {
    c.discard = discard_policy::old_messages;
    auto s = create_stream(t, c);
    publish_ok(t, subject_in(c, "a"), payload);
    publish_ok(t, subject_in(c, "a"), payload);
    auto st = state_of(t, c.name);
    CHECK(st.messages == 1);
    CHECK(st.first_seq == 2);
    CHECK(st.bytes <= 200);
    CHECK(code_of(t.get_message(c.name, 1)) == errc::not_found);
  }
}

TEST_CASE("max_msgs_per_subject keeps the newest messages of each subject", "[publish][limits]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "persubj");
  c.max_msgs_per_subject = 2;
  auto s = create_stream(t, c);
  publish_ok(t, subject_in(c, "a"), "a1");  // 1
  publish_ok(t, subject_in(c, "b"), "b1");  // 2
  publish_ok(t, subject_in(c, "a"), "a2");  // 3
  publish_ok(t, subject_in(c, "a"), "a3");  // 4: drops 1
  publish_ok(t, subject_in(c, "b"), "b2");  // 5
  auto st = state_of(t, c.name);
  CHECK(st.messages == 4);
  CHECK(st.last_seq == 5);
  CHECK(code_of(t.get_message(c.name, 1)) == errc::not_found);
  CHECK(must(t.get_message(c.name, 2)).data == "b1");
  CHECK(must(t.get_message(c.name, 3)).data == "a2");
  CHECK(must(t.get_last_message(c.name, subject_in(c, "a"))).seq == 4);
}

TEST_CASE("max_msgs_per_subject 1 keeps only the last message of each subject",
          "[publish][limits]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "persubj1");
  c.max_msgs_per_subject = 1;
  auto s = create_stream(t, c);
  publish_ok(t, subject_in(c, "a"));  // 1
  publish_ok(t, subject_in(c, "b"));  // 2
  publish_ok(t, subject_in(c, "a"));  // 3
  CHECK(state_of(t, c.name).messages == 2);
  CHECK(code_of(t.get_message(c.name, 1)) == errc::not_found);
  CHECK(must(t.get_message(c.name, 2)).subject == subject_in(c, "b"));
  CHECK(must(t.get_message(c.name, 3)).subject == subject_in(c, "a"));
}

TEST_CASE("max_age removes messages once they are older, not before", "[publish][limits][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "age");
  c.max_age = 2s;
  auto s = create_stream(t, c);
  publish_ok(t, subject_in(c, "a"), "old");
  fx->advance(500ms);
  CHECK(state_of(t, c.name).messages == 1);
  CHECK(must(t.get_message(c.name, 1)).data == "old");

  fx->advance(2s);
  auto st = state_of(t, c.name);
  CHECK(st.messages == 0);
  CHECK(st.last_seq == 1);
  CHECK(code_of(t.get_message(c.name, 1)) == errc::not_found);
  CHECK(code_of(t.get_last_message(c.name, subject_in(c, "a"))) == errc::not_found);

  // Sequences go on; a new message lives its own max_age.
  CHECK(publish_ok(t, subject_in(c, "a"), "new") == 2);
  CHECK(state_of(t, c.name).messages == 1);
}

TEST_CASE("async_publish completes exactly once, with a value or an error", "[publish][async]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "asyncpub");
  auto s = create_stream(t, c);

  completion_probe<publish_ack> ok;
  t.async_publish({.subject = subject_in(c, "a"), .data = "x"}, ok.handler());
  auto r = ok.get();
  REQUIRE(r.has_value());
  CHECK(r->seq == 1);

  completion_probe<publish_ack> missing;
  t.async_publish({.subject = fx->unique("nowhere") + ".x", .data = "x"}, missing.handler());
  CHECK(code_of(missing.get()) == errc::not_found);

  completion_probe<publish_ack> bad;
  t.async_publish({.subject = subject_in(c, "*"), .data = "x"}, bad.handler());
  CHECK(code_of(bad.get()) == errc::invalid_name);

  // Later operations do not call the handlers again.
  publish_ok(t, subject_in(c, "a"));
  must(t.ping());
  CHECK(ok.calls() == 1);
  CHECK(missing.calls() == 1);
  CHECK(bad.calls() == 1);
}

}  // namespace
}  // namespace amp::conformance::cases
