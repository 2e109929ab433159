// The session's op table (src/gateway/session_impl.hpp): every client op of amp.v1 once, each
// with its shape schema and a handler, and the lane rules the spec's ordering needs.

#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <string_view>

#include "amp/detail/embedded_schemas.hpp"
#include "gateway/session_impl.hpp"

namespace {

using impl = amp::session::impl;

TEST_CASE("the op table names each client op with a shape schema once, with a handler",
          "[session][ops]") {
  std::set<std::string> schemas;
  for (const auto& e : amp::detail::embedded_schemas()) {
    std::string_view name = e.name;
    if (name.rfind("frames/", 0) != 0) continue;
    name.remove_prefix(7);
    if (name == "names" || name.find('/') != std::string_view::npos) continue;
    schemas.emplace(name);
  }
  std::set<std::string> table;
  for (const auto& op : impl::ops()) {
    CHECK(table.emplace(op.name).second);
    CHECK(op.handle != nullptr);
    CHECK(op.cost >= 0);
    CHECK(impl::find_op(op.name) == &op);
  }
  CHECK(table == schemas);
  CHECK(impl::find_op("nope") == nullptr);
  CHECK(impl::find_op("") == nullptr);
}

TEST_CASE("ops on one task share its lane, sends keep order per recipient, publishes per topic",
          "[session][ops]") {
  using L = impl::lane_rule;
  for (auto name : {"claim", "decline", "complete", "fail", "cancel", "task", "heartbeat"}) {
    CHECK(impl::find_op(name)->lane == L::task);
  }
  CHECK(impl::find_op("send")->lane == L::to);
  CHECK(impl::find_op("publish")->lane == L::topic);
  for (auto name : {"submit", "ack", "nack"}) CHECK(impl::find_op(name)->lane == L::none);
  for (auto name : {"hello", "register", "who", "watch", "bye", "subscribe", "unsubscribe"}) {
    CHECK(impl::find_op(name)->lane == L::barrier);
  }
}

TEST_CASE("frames are classified into lanes by their op's rule", "[session][ops]") {
  auto lane = [](std::string text) {
    impl::inbound_frame f{
        .item = {.text = std::move(text)}, .barrier = true, .lane = {}, .bytes = 0};
    impl::classify(f);
    return f.barrier ? std::string("barrier") : f.lane.empty() ? std::string("none") : f.lane;
  };
  CHECK(lane(R"({"op":"claim","task":"t1"})") == "task:t1");
  CHECK(lane(R"({"op":"heartbeat","task":"t1"})") == "task:t1");
  CHECK(lane(R"({"op":"heartbeat"})") == "barrier");
  CHECK(lane(R"({"op":"complete","task":7})") == "barrier");
  CHECK(lane(R"({"op":"send","to":"bob"})") == "to:bob");
  CHECK(lane(R"({"op":"publish","topic":"a.b"})") == "topic:a.b");
  CHECK(lane(R"({"op":"submit","job":"j"})") == "none");
  CHECK(lane(R"({"op":"ack","seq":1})") == "none");
  CHECK(lane(R"({"op":"hello"})") == "barrier");
  CHECK(lane(R"({"op":"unknown"})") == "barrier");
  CHECK(lane(R"([1,2])") == "barrier");
  CHECK(lane("not json") == "barrier");
}

TEST_CASE("only ops that never wait for the backend run on the thread that received them",
          "[session][ops]") {
  std::set<std::string_view> on_caller;
  for (const auto& op : impl::ops()) {
    if (op.on_caller) on_caller.insert(op.name);
  }
  CHECK(on_caller == std::set<std::string_view>{"ack", "nack", "submit", "claim", "complete",
                                                "send", "publish", "heartbeat"});
  auto classified = [](std::string text) {
    impl::inbound_frame f{
        .item = {.text = std::move(text)}, .barrier = true, .lane = {}, .bytes = 0};
    impl::classify(f);
    return f.item.on_caller;
  };
  CHECK(classified(R"({"op":"claim","task":"t1"})"));
  CHECK(classified(R"({"op":"ack","seq":1})"));
  CHECK_FALSE(classified(R"({"op":"heartbeat","task":"t1"})"));
  CHECK(classified(R"({"op":"heartbeat"})"));
  CHECK(classified(R"({"op":"submit","job":"j"})"));
  CHECK_FALSE(classified(R"({"op":"submit","job":"j","idempotency_key":"k"})"));
  CHECK(classified(R"({"op":"send","to":"bob"})"));
  CHECK(classified(R"({"op":"publish","topic":"news"})"));
  CHECK_FALSE(classified(R"({"op":"subscribe","topic":"news"})"));
  CHECK_FALSE(classified("not json"));
}

}  // namespace
