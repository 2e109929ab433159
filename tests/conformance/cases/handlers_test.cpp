// Handlers that throw: the transport reports the exception through `on_handler_error`,
// counts the handler as run, and goes on delivering; stop() still returns.

#include <atomic>
#include <stdexcept>
#include <string>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

bool any_contains(const std::vector<std::string>& lines, std::string_view what) {
  for (const auto& l : lines) {
    if (l.find(what) != std::string::npos) return true;
  }
  return false;
}

TEST_CASE("a completion handler that throws is reported and the transport carries on",
          "[handlers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "throwing");
  auto g = create_stream(t, sc);

  std::atomic<int> thrown{0};
  std::atomic<bool> published{false};
  t.async_publish({.subject = subject_in(sc, "a"), .data = "1"}, [&](result<publish_ack> r) {
    published = r.has_value();
    ++thrown;
    throw std::runtime_error("publish handler boom");
  });
  auto c = bucket_cfg(*fx, "throwing");
  auto b = create_bucket(t, c);
  t.async_kv_put(c.bucket, "k", "v", std::nullopt, [&](result<std::uint64_t>) {
    ++thrown;
    throw 42;  // not a std::exception
  });
  // The transport still answers, and stored what the throwing handlers were told of.
  must(t.publish({.subject = subject_in(sc, "b"), .data = "2"}));
  CHECK(must(t.kv_get(c.bucket, "k")).value == "v");
  CHECK(must(t.stream_info_of(sc.name)).state.messages == 2);
  CHECK(thrown == 2);
  CHECK(published);
  const auto lines = fx->handler_errors();
  REQUIRE(lines.size() == 2);
  CHECK(any_contains(lines, "publish handler boom"));
  CHECK(any_contains(lines, "not a std::exception"));
}

TEST_CASE("a handler told of refused arguments that throws is reported through the same sink",
          "[handlers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  std::atomic<int> refused{0};
  auto boom = [&](auto r) {
    if (!r && r.error().code() == errc::invalid_name) ++refused;
    throw std::runtime_error("refusal handler boom");
  };
  t.async_publish({.subject = "bad..subject", .data = "1"}, boom);
  t.async_kv_get("bad bucket", "k", boom);
  t.async_fetch("bad.stream", "durable", {}, boom);
  CHECK(refused == 3);
  const auto lines = fx->handler_errors();
  REQUIRE(lines.size() == 3);
  CHECK(any_contains(lines, "a handler of publish threw: refusal handler boom"));
  CHECK(any_contains(lines, "a handler of kv_get threw"));
  CHECK(any_contains(lines, "a handler of fetch threw"));
}

TEST_CASE("a replay or watch callback that throws is reported, and later ones still arrive",
          "[handlers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "throwing_replay");
  auto g = create_stream(t, sc);
  replay_log log;
  std::atomic<int> calls{0};
  auto sub = must(
      t.subscribe_ordered({.stream = sc.name, .start = deliver_policy::all}, [&](const message& m) {
        if (calls++ == 0) throw std::runtime_error("replay boom");
        log.add(m);
      }));
  for (int i = 0; i < 3; ++i) must(t.publish({.subject = subject_in(sc, "x"), .data = "d"}));
  REQUIRE(log.wait_for(2));
  CHECK(log.seqs() == std::vector<std::uint64_t>{2, 3});

  auto c = bucket_cfg(*fx, "throwing_watch");
  auto b = create_bucket(t, c);
  watch_log entries;
  auto handlers = entries.handlers();
  auto add = handlers.on_entry;
  handlers.on_entry = [&, add](const kv_entry& e) {
    if (e.value == "bad") throw std::runtime_error("watch boom");
    add(e);
  };
  auto w = must(t.kv_watch(c.bucket, {}, std::move(handlers)));
  REQUIRE(entries.wait_caught_up());
  must(t.kv_put(c.bucket, "k", "bad"));
  must(t.kv_put(c.bucket, "k", "good"));
  REQUIRE(entries.wait_for(1));
  CHECK(entries.items().front().value == "good");

  sub->stop();  // returns: no drain was left marked as running
  w->stop();
  const auto lines = fx->handler_errors();
  CHECK(any_contains(lines, "replay boom"));
  CHECK(any_contains(lines, "watch boom"));
}

}  // namespace
}  // namespace amp::conformance::cases
