// Core messages (publish_core, subscribe_core): sent to the subscriptions of the moment,
// matched by filter, in each publisher's order, not stored unless a stream captures them.

#include <string>
#include <vector>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

std::vector<std::string> data_of(const std::vector<message>& ms) {
  std::vector<std::string> out;
  for (const auto& m : ms) out.push_back(m.data);
  return out;
}

void send(transport& t, std::string subject, std::string data) {
  must(t.publish_core({.subject = std::move(subject), .data = std::move(data)}));
}

TEST_CASE("a core message reaches every subscription whose filter matches, in order", "[core]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  const auto p = fx->unique("core");
  replay_log a, all, b;
  auto sub_a = must(t.subscribe_core(p + ".a.*", a.callback()));
  auto sub_all = must(t.subscribe_core(p + ".>", all.callback()));
  auto sub_b = must(t.subscribe_core(p + ".b", b.callback()));

  must(t.publish_core({.subject = p + ".a.1", .data = "1", .headers = {{"K", "v"}}}));
  send(t, p + ".b", "2");
  send(t, p + ".a.2", "3");
  for (int i = 4; i <= 100; ++i) send(t, p + ".c", std::to_string(i));
  REQUIRE(all.wait_for(100));
  // Markers last: each subscription has everything before its marker once the marker is in.
  send(t, p + ".a.end", "end");
  send(t, p + ".b", "end");
  REQUIRE(a.wait_for(3));
  REQUIRE(b.wait_for(2));
  REQUIRE(all.wait_for(102));

  CHECK(data_of(a.items()) == std::vector<std::string>{"1", "3", "end"});
  CHECK(data_of(b.items()) == std::vector<std::string>{"2", "end"});
  auto every = all.items();
  REQUIRE(every.size() == 102);
  for (int i = 0; i < 100; ++i) CHECK(every[i].data == std::to_string(i + 1));
  const auto items_a = a.items();
  const auto& first = items_a.front();
  CHECK(first.subject == p + ".a.1");
  CHECK(find_header(first.headers, "K") == "v");
  CHECK(first.stream.empty());
  CHECK(first.seq == 0);
  CHECK(first.ack_token.empty());
}

TEST_CASE("a stopped core subscription gets nothing more, and nothing is kept for it", "[core]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  const auto subject = fx->unique("core") + ".x";
  replay_log stopped, kept;
  auto sub_stopped = must(t.subscribe_core(subject, stopped.callback()));
  auto sub_kept = must(t.subscribe_core(subject, kept.callback()));
  send(t, subject, "1");
  REQUIRE(stopped.wait_for(1));
  REQUIRE(kept.wait_for(1));
  sub_stopped->stop();
  send(t, subject, "2");
  REQUIRE(kept.wait_for(2));
  // Sent before anyone listened: lost, as on NATS.
  replay_log late;
  auto sub_late = must(t.subscribe_core(subject, late.callback()));
  send(t, subject, "3");
  REQUIRE(late.wait_for(1));
  REQUIRE(kept.wait_for(3));

  CHECK(data_of(stopped.items()) == std::vector<std::string>{"1"});
  CHECK(data_of(late.items()) == std::vector<std::string>{"3"});
  CHECK(data_of(kept.items()) == std::vector<std::string>{"1", "2", "3"});
}

TEST_CASE(
    "a core message on a subject a stream captures is stored there too, and a "
    "stream's publish reaches core subscriptions",
    "[core]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "corecap");
  auto s = create_stream(t, sc);
  replay_log heard;
  auto sub = must(t.subscribe_core(subject_in(sc, ">"), heard.callback()));
  must(t.publish_core({.subject = subject_in(sc, "x"), .data = "1", .msg_id = "m1"}));
  must(t.publish_core({.subject = subject_in(sc, "x"), .data = "again", .msg_id = "m1"}));
  // Published after the two on the same connection: answered once they are stored.
  auto ack = must(t.publish({.subject = subject_in(sc, "x"), .data = "3", .msg_id = "m1"}));
  CHECK(ack.duplicate);
  CHECK(ack.seq == 1);
  CHECK(state_of(t, sc.name).messages == 1);
  CHECK(must(t.get_message(sc.name, 1)).data == "1");
  // Subscribers hear every message sent on the subject, stored or not, with its id as
  // Nats-Msg-Id: both core publishes and the stream's publish.
  REQUIRE(heard.wait_for(3));
  const auto items = heard.items();
  CHECK(data_of(items) == std::vector<std::string>{"1", "again", "3"});
  for (const auto& m : items) CHECK(find_header(m.headers, "Nats-Msg-Id") == "m1");
}

TEST_CASE("bad core subjects and filters are invalid_name and send nothing", "[core][names]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  const auto p = fx->unique("core");
  replay_log all;
  auto sub = must(t.subscribe_core(p + ".>", all.callback()));
  for (std::string bad : {p + "..x", p + ".*", p + ".>", p + ". x", std::string()}) {
    INFO(bad);
    CHECK(code_of(t.publish_core({.subject = bad, .data = "bad"})) == errc::invalid_name);
  }
  for (std::string bad : {p + ".>.x", p + "..x", std::string()}) {
    INFO(bad);
    CHECK(code_of(t.subscribe_core(bad, [](const message&) {})) == errc::invalid_name);
  }
  CHECK(code_of(t.subscribe_core(p + ".x", {})) == errc::bad_request);
  send(t, p + ".ok", "ok");
  REQUIRE(all.wait_for(1));
  CHECK(data_of(all.items()) == std::vector<std::string>{"ok"});
}

}  // namespace
}  // namespace amp::conformance::cases
