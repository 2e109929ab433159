// Streams: ensure_stream (create, idempotence, conflicts, impossible configurations),
// update_stream, stream_info_of, delete_stream, get_message and get_last_message.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

TEST_CASE("ensure_stream creates a missing stream and reports its config and empty state",
          "[streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "create");
  c.max_msgs = 100;
  c.max_msgs_per_subject = 10;
  c.max_msg_size = 1024;
  c.duplicate_window = 30s;
  auto info = must(t.ensure_stream(c));
  auto s = stream_guard(t, c.name);
  CHECK(info.config == c);
  CHECK(info.state.messages == 0);
  CHECK(info.state.bytes == 0);
  CHECK(info.state.first_seq == 0);
  CHECK(info.state.last_seq == 0);
  CHECK(info.state.consumers == 0);
  auto again = must(t.stream_info_of(c.name));
  CHECK(again.config == c);
}

TEST_CASE("ensure_stream with the same config again succeeds and keeps the stream as it is",
          "[streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "idem", retention_policy::work_queue);
  auto s = create_stream(t, c);
  publish_ok(t, subject_in(c, "a"));
  publish_ok(t, subject_in(c, "b"));
  auto info = must(t.ensure_stream(c));
  CHECK(info.config == c);
  CHECK(info.state.messages == 2);
  CHECK(info.state.last_seq == 2);
  CHECK(publish_ok(t, subject_in(c, "c")) == 3);
}

TEST_CASE("ensure_stream with a changed setting is a conflict naming it and changes nothing",
          "[streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "clash");
  c.max_msgs = 100;
  auto s = create_stream(t, c);
  publish_ok(t, subject_in(c, "a"));

  struct change {
    const char* setting;
    std::function<void(stream_config&)> apply;
  };
  const std::vector<change> changes = {
      {"subjects", [](stream_config& x) { x.subjects.push_back(x.name + "_more.>"); }},
      {"subjects", [](stream_config& x) { x.subjects = {x.name + ".only.>"}; }},
      {"retention", [](stream_config& x) { x.retention = retention_policy::work_queue; }},
      {"retention", [](stream_config& x) { x.retention = retention_policy::interest; }},
      {"storage", [](stream_config& x) { x.storage = storage_type::memory; }},
      {"max_msgs", [](stream_config& x) { x.max_msgs = 200; }},
      {"max_msgs", [](stream_config& x) { x.max_msgs = -1; }},
      {"max_bytes", [](stream_config& x) { x.max_bytes = 1 << 20; }},
      {"max_msgs_per_subject", [](stream_config& x) { x.max_msgs_per_subject = 5; }},
      {"max_msg_size", [](stream_config& x) { x.max_msg_size = 512; }},
      {"max_age", [](stream_config& x) { x.max_age = 1h; }},
      {"discard", [](stream_config& x) { x.discard = discard_policy::new_messages; }},
      {"duplicate_window", [](stream_config& x) { x.duplicate_window = 10s; }},
      {"replicas", [](stream_config& x) { x.replicas = 3; }},
  };
  for (const auto& ch : changes) {
    CAPTURE(ch.setting);
    auto changed = c;
    ch.apply(changed);
    auto r = t.ensure_stream(changed);
    REQUIRE(code_of(r) == errc::conflict);
    CHECK_THAT(r.error().message(), Catch::Contains(ch.setting));
  }
  auto info = must(t.stream_info_of(c.name));
  CHECK(info.config == c);
  CHECK(info.state.messages == 1);
}

TEST_CASE("ensure_stream refuses an impossible configuration with bad_request and creates nothing",
          "[streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "impossible");
  SECTION("no subjects") {
    c.subjects.clear();
  }
  SECTION("no replicas") {
    c.replicas = 0;
  }
  SECTION("negative replicas") {
    c.replicas = -1;
  }
  CHECK(code_of(t.ensure_stream(c)) == errc::bad_request);
  CHECK(code_of(t.stream_info_of(c.name)) == errc::not_found);
}

TEST_CASE("update_stream changes the limits and removes at once what they no longer admit",
          "[streams][limits]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "update", retention_policy::work_queue);
  auto s = create_stream(t, c);
  for (int i = 0; i < 5; ++i) publish_ok(t, subject_in(c, "a"), "m" + std::to_string(i));

  c.max_msgs = 3;
  auto info = must(t.update_stream(c));
  CHECK(info.config == c);
  CHECK(info.state.messages == 3);
  CHECK(info.state.first_seq == 3);  // the oldest went
  CHECK(state_of(t, c.name).messages == 3);
  // The updated configuration is now the one ensure_stream finds.
  CHECK(must(t.ensure_stream(c)).state.messages == 3);

  // Full and discarding new messages: a publish is refused.
  c.discard = discard_policy::new_messages;
  must(t.update_stream(c));
  CHECK(code_of(t.publish({.subject = subject_in(c, "a"), .data = "x"})) == errc::limit_exceeded);

  // An age limit applies to the messages already stored.
  c.max_msgs = -1;
  c.discard = discard_policy::old_messages;
  c.max_age = 1s;
  must(t.update_stream(c));
  fx->advance(1500ms);
  CHECK(state_of(t, c.name).messages == 0);
  CHECK(publish_ok(t, subject_in(c, "a"), "new") == 6);

  // Subjects, retention, storage and replicas never change; a missing stream is not_found.
  auto other = c;
  other.retention = retention_policy::limits;
  CHECK(code_of(t.update_stream(other)) == errc::conflict);
  other = c;
  other.subjects = {subject_in(c, "a")};
  CHECK(code_of(t.update_stream(other)) == errc::conflict);
  other = c;
  other.replicas = 2;
  CHECK(code_of(t.update_stream(other)) == errc::conflict);
  auto kept = must(t.stream_info_of(c.name)).config;  // unchanged by the refusals
  CHECK(kept.subjects == c.subjects);
  CHECK(kept.retention == c.retention);
  CHECK(kept.replicas == 1);
  CHECK(kept.max_age == c.max_age);
  other = c;
  other.name = fx->unique("missing");
  CHECK(code_of(t.update_stream(other)) == errc::not_found);
  other = c;
  other.max_age = -1s;
  CHECK(code_of(t.update_stream(other)) == errc::bad_request);
}

TEST_CASE("stream_info_of and delete_stream of a missing stream are not_found", "[streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  const auto name = fx->unique("missing");
  CHECK(code_of(t.stream_info_of(name)) == errc::not_found);
  CHECK(code_of(t.delete_stream(name)) == errc::not_found);
  CHECK(code_of(t.get_message(name, 1)) == errc::not_found);
  CHECK(code_of(t.get_last_message(name, name + ".>")) == errc::not_found);
}

TEST_CASE("delete_stream removes the stream, its messages and its consumers", "[streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "del");
  auto s = create_stream(t, c);
  publish_ok(t, subject_in(c, "a"));
  publish_ok(t, subject_in(c, "a"));
  auto cc = consumer_cfg(*fx, c);
  must(t.ensure_consumer(cc));

  must(t.delete_stream(c.name));
  CHECK(code_of(t.stream_info_of(c.name)) == errc::not_found);
  CHECK(code_of(t.get_message(c.name, 1)) == errc::not_found);
  CHECK(code_of(t.consumer_info_of(c.name, cc.durable)) == errc::not_found);
  CHECK(code_of(t.publish({.subject = subject_in(c, "a"), .data = "x"})) == errc::not_found);
  CHECK(code_of(t.delete_stream(c.name)) == errc::not_found);

  // Made again, it starts empty, from sequence 1, without the old consumer.
  auto info = must(t.ensure_stream(c));
  CHECK(info.state.messages == 0);
  CHECK(info.state.consumers == 0);
  CHECK(publish_ok(t, subject_in(c, "a")) == 1);
  CHECK(code_of(t.consumer_info_of(c.name, cc.durable)) == errc::not_found);
}

TEST_CASE("stream state counts messages, bytes, first and last sequence and consumers",
          "[streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "state");
  auto s = create_stream(t, c);
  publish_ok(t, subject_in(c, "a"), "one");
  auto st1 = state_of(t, c.name);
  CHECK(st1.messages == 1);
  CHECK(st1.first_seq == 1);
  CHECK(st1.last_seq == 1);
  CHECK(st1.bytes > 0);
  publish_ok(t, subject_in(c, "b"), std::string(100, 'x'));
  publish_ok(t, subject_in(c, "c"), "three");
  auto st3 = state_of(t, c.name);
  CHECK(st3.messages == 3);
  CHECK(st3.first_seq == 1);
  CHECK(st3.last_seq == 3);
  CHECK(st3.bytes >= st1.bytes + 100);  // the bytes count the data
  must(t.ensure_consumer(consumer_cfg(*fx, c)));
  must(t.ensure_consumer(consumer_cfg(*fx, c)));
  CHECK(state_of(t, c.name).consumers == 2);
}

TEST_CASE("get_message returns the stored message and not_found for a sequence it lacks",
          "[streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "get");
  auto s = create_stream(t, c);
  const auto before = t.clock()->now();
  must(t.publish(
      {.subject = subject_in(c, "a.1"), .data = "first", .headers = {{"H", "1"}}, .msg_id = ""}));
  fx->advance(1s);
  publish_ok(t, subject_in(c, "a.2"), "second");

  auto m1 = must(t.get_message(c.name, 1));
  CHECK(m1.stream == c.name);
  CHECK(m1.subject == subject_in(c, "a.1"));
  CHECK(m1.data == "first");
  CHECK(m1.seq == 1);
  CHECK(find_header(m1.headers, "H") == "1");
  auto m2 = must(t.get_message(c.name, 2));
  CHECK(m2.seq == 2);
  CHECK(m2.data == "second");
  // Stamped by the stream, in order.
  CHECK(m1.time >= before - 1s);
  CHECK(m2.time > m1.time);

  CHECK(code_of(t.get_message(c.name, 3)) == errc::not_found);
  CHECK(code_of(t.get_message(c.name, 1000)) == errc::not_found);
}

TEST_CASE("get_last_message finds the last message matching a subject or wildcard filter",
          "[streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "last");
  auto s = create_stream(t, c);
  publish_ok(t, subject_in(c, "a.1"), "a1");   // 1
  publish_ok(t, subject_in(c, "b.1"), "b1");   // 2
  publish_ok(t, subject_in(c, "a.2"), "a2");   // 3
  publish_ok(t, subject_in(c, "b.2"), "b2");   // 4
  publish_ok(t, subject_in(c, "a.1"), "a1'");  // 5
  publish_ok(t, subject_in(c, "c.x.y"), "c");  // 6

  auto m = must(t.get_last_message(c.name, subject_in(c, "b.1")));
  CHECK(m.seq == 2);
  CHECK(m.data == "b1");
  CHECK(must(t.get_last_message(c.name, subject_in(c, "a.1"))).seq == 5);
  CHECK(must(t.get_last_message(c.name, subject_in(c, "b.*"))).seq == 4);
  CHECK(must(t.get_last_message(c.name, subject_in(c, "*.2"))).seq == 4);
  CHECK(must(t.get_last_message(c.name, subject_in(c, "a.*"))).seq == 5);
  CHECK(must(t.get_last_message(c.name, subject_in(c, "c.>"))).seq == 6);
  CHECK(must(t.get_last_message(c.name, c.name + ".>")).seq == 6);
  CHECK(code_of(t.get_last_message(c.name, subject_in(c, "d.*"))) == errc::not_found);
  CHECK(code_of(t.get_last_message(c.name, subject_in(c, "c.*"))) == errc::not_found);
}

TEST_CASE("get_last_message on an empty stream is not_found", "[streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "lastempty");
  auto s = create_stream(t, c);
  CHECK(code_of(t.get_last_message(c.name, c.name + ".>")) == errc::not_found);
  CHECK(code_of(t.get_message(c.name, 1)) == errc::not_found);
}

TEST_CASE("a stream whose subjects overlap another stream's is a conflict", "[streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto a = stream_cfg(*fx, "owner");
  a.subjects = {a.name + ".x.>"};
  auto sa = create_stream(t, a);
  stream_config b;
  b.name = fx->unique("intruder");
  SECTION("the same subjects") {
    b.subjects = a.subjects;
  }
  SECTION("a narrower filter") {
    b.subjects = {a.name + ".x.y"};
  }
  SECTION("a wider filter") {
    b.subjects = {a.name + ".>"};
  }
  SECTION("a crossing filter") {
    b.subjects = {a.name + ".*.y"};
  }
  CHECK(code_of(t.ensure_stream(b)) == errc::conflict);
  CHECK(code_of(t.stream_info_of(b.name)) == errc::not_found);
  // Publishes still go to the first stream.
  CHECK(must(t.publish({.subject = a.name + ".x.y", .data = "x"})).stream == a.name);
}

TEST_CASE("stream_subjects counts the messages of each subject the filter matches",
          "[streams][subjects]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "subjects", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  CHECK(must(t.stream_subjects(sc.name, sc.name + ".>")).empty());
  publish_ok(t, subject_in(sc, "inbox.alfa"));
  publish_ok(t, subject_in(sc, "inbox.alfa"));
  publish_ok(t, subject_in(sc, "inbox.bravo"));
  auto gone = publish_ok(t, subject_in(sc, "inbox.charlie"));
  publish_ok(t, subject_in(sc, "other.x"));
  must(t.delete_message(sc.name, gone));
  auto inboxes = must(t.stream_subjects(sc.name, subject_in(sc, "inbox.*")));
  CHECK(inboxes == std::map<std::string, std::uint64_t>{{subject_in(sc, "inbox.alfa"), 2},
                                                        {subject_in(sc, "inbox.bravo"), 1}});
  CHECK(must(t.stream_subjects(sc.name, sc.name + ".>")).size() == 3);
  CHECK(code_of(t.stream_subjects(fx->unique("nostream"), "a.>")) == errc::not_found);
  CHECK(code_of(t.stream_subjects(sc.name, "a..b")) == errc::invalid_name);
}

TEST_CASE("consumer_names lists the durable consumers of a stream, sorted",
          "[streams][consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "names");
  auto s = create_stream(t, sc);
  CHECK(must(t.consumer_names(sc.name)).empty());
  auto b = consumer_cfg(*fx, sc);
  b.durable = "inbox_bravo";
  auto a = consumer_cfg(*fx, sc);
  a.durable = "inbox_alfa";
  must(t.ensure_consumer(b));
  must(t.ensure_consumer(a));
  CHECK(must(t.consumer_names(sc.name)) == std::vector<std::string>{"inbox_alfa", "inbox_bravo"});
  must(t.delete_consumer(sc.name, "inbox_alfa"));
  CHECK(must(t.consumer_names(sc.name)) == std::vector<std::string>{"inbox_bravo"});
  CHECK(code_of(t.consumer_names(fx->unique("nostream"))) == errc::not_found);
}

}  // namespace
}  // namespace amp::conformance::cases
