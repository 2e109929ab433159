// KV watch: initial values then on_caught_up, live changes in revision order, key
// filters, updates_only, include_history, per-key TTL expiry, stop.

#include <atomic>
#include <string>
#include <vector>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

std::vector<std::string> keys_of(const std::vector<kv_entry>& es) {
  std::vector<std::string> out;
  for (const auto& e : es) out.push_back(e.key);
  return out;
}

std::vector<kv_op> ops_of(const std::vector<kv_entry>& es) {
  std::vector<kv_op> out;
  for (const auto& e : es) out.push_back(e.op);
  return out;
}

bool revisions_rise(const std::vector<kv_entry>& es) {
  for (std::size_t i = 1; i < es.size(); ++i) {
    if (es[i].revision <= es[i - 1].revision) return false;
  }
  return true;
}

std::unique_ptr<subscription> watch(transport& t, const kv_config& c, const kv_watch_options& o,
                                    watch_log& log,
                                    std::source_location where = std::source_location::current()) {
  return must(t.kv_watch(c.bucket, o, log.handlers()), where);
}

TEST_CASE("a watch reports each live key's latest value, catches up, then follows changes",
          "[kv][watch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "watch", 5);
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "a", "a1"));  // 1
  must(t.kv_put(c.bucket, "b", "b1"));  // 2
  must(t.kv_put(c.bucket, "a", "a2"));  // 3
  must(t.kv_put(c.bucket, "c", "c1"));  // 4
  must(t.kv_delete(c.bucket, "c"));     // 5
  must(t.kv_put(c.bucket, "d", "d1"));  // 6
  must(t.kv_purge(c.bucket, "d"));      // 7

  watch_log log;
  auto w = watch(t, c, {}, log);
  REQUIRE(log.wait_caught_up());
  auto initial = log.items();
  CHECK(log.entries_before_caught_up() == 2);
  REQUIRE(initial.size() == 2);
  // In revision order: b (2), then a (3). Deleted and purged keys are not reported.
  CHECK(keys_of(initial) == std::vector<std::string>{"b", "a"});
  CHECK(initial[0].value == "b1");
  CHECK(initial[1].value == "a2");
  CHECK(initial[1].revision == 3);
  CHECK(initial[1].op == kv_op::put);
  CHECK(initial[1].bucket == c.bucket);

  auto r8 = must(t.kv_put(c.bucket, "b", "b2"));
  // Before the purge removes it: a watcher that is behind may never be sent a revision a
  // purge (or the history limit) has removed.
  REQUIRE(log.wait_for(3));
  must(t.kv_delete(c.bucket, "a"));
  must(t.kv_purge(c.bucket, "b"));
  must(t.kv_create(c.bucket, "e", "e1"));
  REQUIRE(log.wait_for(6));
  w->stop();
  auto all = log.items();
  REQUIRE(all.size() == 6);
  std::vector<kv_entry> live(all.begin() + 2, all.end());
  CHECK(keys_of(live) == std::vector<std::string>{"b", "a", "b", "e"});
  CHECK(ops_of(live) == std::vector<kv_op>{kv_op::put, kv_op::del, kv_op::purge, kv_op::put});
  CHECK(live[0].value == "b2");
  CHECK(live[0].revision == r8);
  CHECK(live[1].value.empty());
  CHECK(live[2].value.empty());
  CHECK(live[3].value == "e1");
  CHECK(revisions_rise(all));
  CHECK(log.caught_up_calls() == 1);
}

TEST_CASE("a watch of an empty bucket catches up at once", "[kv][watch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "wempty");
  auto b = create_bucket(t, c);
  watch_log log;
  auto w = watch(t, c, {}, log);
  REQUIRE(log.wait_caught_up());
  CHECK(log.entries_before_caught_up() == 0);
  must(t.kv_put(c.bucket, "k", "v"));
  REQUIRE(log.wait_for(1));
  w->stop();
  CHECK(log.items()[0].key == "k");
  CHECK(log.items()[0].value == "v");
  CHECK(log.caught_up_calls() == 1);
}

TEST_CASE("a watch key filter selects keys with * and > wildcards", "[kv][watch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "wfilter");
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "job.a.x", "1"));
  must(t.kv_put(c.bucket, "job.b.x", "2"));
  must(t.kv_put(c.bucket, "job.b.y", "3"));
  must(t.kv_put(c.bucket, "other.x", "4"));
  must(t.kv_put(c.bucket, "job.c.x.deep", "5"));

  watch_log log;
  SECTION("*") {
    auto w = watch(t, c, {.key_filter = "job.*.x"}, log);
    REQUIRE(log.wait_caught_up());
    CHECK(keys_of(log.items()) == std::vector<std::string>{"job.a.x", "job.b.x"});
    must(t.kv_put(c.bucket, "other.y", "no"));
    must(t.kv_put(c.bucket, "job.z.y", "no"));
    must(t.kv_put(c.bucket, "job.z.x", "yes"));
    REQUIRE(log.wait_for(3));
    w->stop();
    CHECK(keys_of(log.items()) == std::vector<std::string>{"job.a.x", "job.b.x", "job.z.x"});
  }
  SECTION(">") {
    auto w = watch(t, c, {.key_filter = "job.>"}, log);
    REQUIRE(log.wait_caught_up());
    CHECK(keys_of(log.items()) ==
          std::vector<std::string>{"job.a.x", "job.b.x", "job.b.y", "job.c.x.deep"});
    must(t.kv_put(c.bucket, "other.z", "no"));
    must(t.kv_put(c.bucket, "job.q", "yes"));
    REQUIRE(log.wait_for(5));
    w->stop();
    CHECK(log.items().back().key == "job.q");
    CHECK(log.size() == 5);
  }
  SECTION("an exact key") {
    auto w = watch(t, c, {.key_filter = "other.x"}, log);
    REQUIRE(log.wait_caught_up());
    must(t.kv_put(c.bucket, "job.a.x", "no"));
    must(t.kv_put(c.bucket, "other.x", "yes"));
    REQUIRE(log.wait_for(2));
    w->stop();
    CHECK(keys_of(log.items()) == std::vector<std::string>{"other.x", "other.x"});
    CHECK(log.items()[1].value == "yes");
  }
}

TEST_CASE("an updates_only watch skips the initial values", "[kv][watch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "wupdates");
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "a", "old"));
  must(t.kv_put(c.bucket, "b", "old"));
  watch_log log;
  auto w = watch(t, c, {.updates_only = true}, log);
  REQUIRE(log.wait_caught_up());
  CHECK(log.entries_before_caught_up() == 0);
  must(t.kv_put(c.bucket, "a", "new"));
  must(t.kv_delete(c.bucket, "b"));
  REQUIRE(log.wait_for(2));
  w->stop();
  auto es = log.items();
  CHECK(keys_of(es) == std::vector<std::string>{"a", "b"});
  CHECK(es[0].value == "new");
  CHECK(es[1].op == kv_op::del);
}

TEST_CASE("an include_history watch reports every retained revision first", "[kv][watch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "whist", 3);
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "a", "a1"));  // 1, dropped by the history limit
  must(t.kv_put(c.bucket, "a", "a2"));  // 2
  must(t.kv_put(c.bucket, "b", "b1"));  // 3
  must(t.kv_put(c.bucket, "a", "a3"));  // 4
  must(t.kv_put(c.bucket, "a", "a4"));  // 5

  watch_log log;
  auto w = watch(t, c, {.include_history = true}, log);
  REQUIRE(log.wait_caught_up());
  auto es = log.items();
  CHECK(log.entries_before_caught_up() == 4);
  std::vector<std::string> values;
  for (const auto& e : es) values.push_back(e.value);
  CHECK(values == std::vector<std::string>{"a2", "b1", "a3", "a4"});
  CHECK(revisions_rise(es));
  must(t.kv_put(c.bucket, "b", "b2"));
  REQUIRE(log.wait_for(5));
  w->stop();
  CHECK(log.items().back().value == "b2");
}

TEST_CASE("an include_history watch with a filter reports that key's history", "[kv][watch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "whistf", 5);
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "a", "a1"));
  must(t.kv_put(c.bucket, "b", "b1"));
  must(t.kv_put(c.bucket, "a", "a2"));
  watch_log log;
  auto w = watch(t, c, {.key_filter = "a", .include_history = true}, log);
  REQUIRE(log.wait_caught_up());
  w->stop();
  auto es = log.items();
  REQUIRE(es.size() == 2);
  CHECK(es[0].value == "a1");
  CHECK(es[1].value == "a2");
}

TEST_CASE("after stop returns, no watch callback runs", "[kv][watch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "wstop");
  auto b = create_bucket(t, c);
  watch_log stopped;
  auto w = watch(t, c, {}, stopped);
  REQUIRE(stopped.wait_caught_up());
  must(t.kv_put(c.bucket, "k", "1"));
  REQUIRE(stopped.wait_for(1));
  SECTION("stop") {
    w->stop();
    w->stop();  // idempotent
  }
  SECTION("destroying the watch") {
    w.reset();
  }

  watch_log witness;
  auto other = watch(t, c, {.updates_only = true}, witness);
  REQUIRE(witness.wait_caught_up());
  must(t.kv_put(c.bucket, "k", "2"));
  must(t.kv_delete(c.bucket, "k"));
  must(t.kv_put(c.bucket, "j", "3"));
  REQUIRE(witness.wait_for(3));
  other->stop();
  CHECK(stopped.size() == 1);
}

TEST_CASE("stop from inside a watch callback ends the watch after that callback", "[kv][watch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "wstopin");
  auto b = create_bucket(t, c);
  std::atomic<subscription*> self{nullptr};
  collector<kv_entry> log;
  auto w = must(t.kv_watch(c.bucket, {.updates_only = true},
                           {.on_entry =
                                [&](const kv_entry& e) {
                                  log.add(e);
                                  if (log.size() == 2) self.load()->stop();
                                },
                            .on_caught_up = [] {}}));
  self = w.get();
  for (int i = 0; i < 5; ++i) must(t.kv_put(c.bucket, "k" + std::to_string(i), "v"));
  watch_log witness;
  auto other = watch(t, c, {}, witness);
  REQUIRE(witness.wait_caught_up());
  other->stop();
  REQUIRE(log.wait_for(2));
  CHECK(log.size() == 2);
}

TEST_CASE("a watcher sees a per-key ttl run out as an expired entry", "[kv][watch][ttl][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  if (!t.caps().per_key_ttl) {
    SUCCEED("this backend has no per-key ttl; kv_test checks that it refuses one");
    return;
  }
  auto c = bucket_cfg(*fx, "wttl", 5);
  auto b = create_bucket(t, c);
  watch_log log;
  auto w = watch(t, c, {}, log);
  REQUIRE(log.wait_caught_up());
  auto rev = must(t.kv_put(c.bucket, "lease", "held", 1s));
  must(t.kv_put(c.bucket, "stays", "v"));
  REQUIRE(log.wait_for(2));
  fx->advance(2s);
  REQUIRE(log.wait_for(3));
  w->stop();
  auto es = log.items();
  CHECK(es[2].key == "lease");
  CHECK(es[2].op == kv_op::expired);
  CHECK(es[2].value.empty());
  CHECK(es[2].revision > rev);
  CHECK(revisions_rise(es));
  CHECK(es.size() == 3);
  // A new watch does not report the expired key.
  watch_log fresh;
  auto w2 = watch(t, c, {}, fresh);
  REQUIRE(fresh.wait_caught_up());
  w2->stop();
  CHECK(keys_of(fresh.items()) == std::vector<std::string>{"stays"});
}

TEST_CASE("keys with per-key ttls expire each at its own time, a refreshed one later",
          "[kv][watch][ttl][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  if (!t.caps().per_key_ttl) {
    SUCCEED("this backend has no per-key ttl; kv_test checks that it refuses one");
    return;
  }
  auto c = bucket_cfg(*fx, "wttl2", 5);
  auto b = create_bucket(t, c);
  watch_log log;
  auto w = watch(t, c, {}, log);
  REQUIRE(log.wait_caught_up());
  must(t.kv_put(c.bucket, "a", "1", 1s));
  must(t.kv_put(c.bucket, "b", "1", 2s));
  must(t.kv_put(c.bucket, "c", "1", 1s));
  REQUIRE(log.wait_for(3));
  fx->advance(500ms);
  must(t.kv_put(c.bucket, "c", "2", 2s));  // refreshed: now ends at 2.5 s
  REQUIRE(log.wait_for(4));
  fx->advance(700ms);  // 1.2 s: a is over
  REQUIRE(log.wait_for(5));
  CHECK(code_of(t.kv_get(c.bucket, "a")) == errc::not_found);
  CHECK(must(t.kv_get(c.bucket, "b")).value == "1");
  CHECK(must(t.kv_get(c.bucket, "c")).value == "2");
  fx->advance(1s);  // 2.2 s: b is over, c not
  REQUIRE(log.wait_for(6));
  CHECK(must(t.kv_get(c.bucket, "c")).value == "2");
  fx->advance(500ms);  // 2.7 s: c is over
  REQUIRE(log.wait_for(7));
  w->stop();
  auto es = log.items();
  REQUIRE(es.size() == 7);
  CHECK(es[4].key == "a");
  CHECK(es[4].op == kv_op::expired);
  CHECK(es[5].key == "b");
  CHECK(es[5].op == kv_op::expired);
  CHECK(es[6].key == "c");
  CHECK(es[6].op == kv_op::expired);
  CHECK(must(t.kv_keys(c.bucket)).empty());
}

}  // namespace
}  // namespace amp::conformance::cases
