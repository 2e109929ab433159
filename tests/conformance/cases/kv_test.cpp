// KV buckets: ensure_bucket, get/create/update/put/delete/purge/erase, revisions, history,
// keys, bucket TTL and per-key TTL.

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

std::vector<kv_op> ops_of(const std::vector<kv_entry>& es) {
  std::vector<kv_op> out;
  for (const auto& e : es) out.push_back(e.op);
  return out;
}

std::vector<std::string> values_of(const std::vector<kv_entry>& es) {
  std::vector<std::string> out;
  for (const auto& e : es) out.push_back(e.value);
  return out;
}

TEST_CASE("ensure_bucket is idempotent and keeps the data", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "idem", 3);
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "k", "v"));
  must(t.ensure_bucket(c));
  CHECK(must(t.kv_get(c.bucket, "k")).value == "v");
}

TEST_CASE("ensure_bucket with a differing config is a conflict and changes nothing", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "clash", 1);
  auto b = create_bucket(t, c);
  struct change {
    const char* setting;
    std::function<void(kv_config&)> apply;
  };
  const std::vector<change> changes = {
      {"history", [](kv_config& x) { x.history = 5; }},
      {"ttl", [](kv_config& x) { x.ttl = 1h; }},
      {"max_value_size", [](kv_config& x) { x.max_value_size = 100; }},
      {"storage", [](kv_config& x) { x.storage = storage_type::memory; }},
      {"replicas", [](kv_config& x) { x.replicas = 3; }},
  };
  for (const auto& ch : changes) {
    CAPTURE(ch.setting);
    auto changed = c;
    ch.apply(changed);
    CHECK(code_of(t.ensure_bucket(changed)) == errc::conflict);
  }
  // Still history 1: a second put replaces the first in the history.
  must(t.kv_put(c.bucket, "k", "1"));
  must(t.kv_put(c.bucket, "k", "2"));
  auto h = must(t.kv_history(c.bucket, "k"));
  CHECK(values_of(h) == std::vector<std::string>{"2"});
}

TEST_CASE("ensure_bucket refuses an impossible configuration with bad_request", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "impossible");
  SECTION("history 0") {
    c.history = 0;
  }
  SECTION("history 65") {
    c.history = 65;
  }
  SECTION("no replicas") {
    c.replicas = 0;
  }
  CHECK(code_of(t.ensure_bucket(c)) == errc::bad_request);
  CHECK(code_of(t.kv_get(c.bucket, "k")) == errc::not_found);
}

TEST_CASE("a bucket keeps up to 64 revisions per key", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "h64", 64);
  auto b = create_bucket(t, c);
  for (int i = 0; i < 66; ++i) must(t.kv_put(c.bucket, "k", std::to_string(i)));
  auto h = must(t.kv_history(c.bucket, "k"));
  REQUIRE(h.size() == 64);
  CHECK(h.front().value == "2");
  CHECK(h.back().value == "65");
}

TEST_CASE("operations on a missing bucket are not_found", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  const auto bucket = fx->unique("nobucket");
  CHECK(code_of(t.kv_get(bucket, "k")) == errc::not_found);
  CHECK(code_of(t.kv_put(bucket, "k", "v")) == errc::not_found);
  CHECK(code_of(t.kv_create(bucket, "k", "v")) == errc::not_found);
  CHECK(code_of(t.kv_update(bucket, "k", "v", 1)) == errc::not_found);
  CHECK(code_of(t.kv_delete(bucket, "k")) == errc::not_found);
  CHECK(code_of(t.kv_purge(bucket, "k")) == errc::not_found);
  CHECK(code_of(t.kv_keys(bucket)) == errc::not_found);
  CHECK(code_of(t.kv_history(bucket, "k")) == errc::not_found);
  CHECK(code_of(t.delete_bucket(bucket)) == errc::not_found);
  watch_log log;
  CHECK(code_of(t.kv_watch(bucket, {}, log.handlers())) == errc::not_found);
}

TEST_CASE("delete_bucket removes the bucket and its keys", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "delb");
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "a", "1"));
  must(t.kv_put(c.bucket, "b", "2"));
  must(t.delete_bucket(c.bucket));
  CHECK(code_of(t.kv_get(c.bucket, "a")) == errc::not_found);
  CHECK(code_of(t.kv_keys(c.bucket)) == errc::not_found);
  // Made again, it is empty and counts revisions from 1.
  must(t.ensure_bucket(c));
  CHECK(must(t.kv_keys(c.bucket)).empty());
  CHECK(code_of(t.kv_get(c.bucket, "a")) == errc::not_found);
  CHECK(must(t.kv_put(c.bucket, "c", "3")) == 1);
}

TEST_CASE("kv_get returns the latest value with its revision", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "get", 5);
  auto b = create_bucket(t, c);
  auto r1 = must(t.kv_put(c.bucket, "k", "one"));
  const auto first = must(t.kv_get(c.bucket, "k"));
  fx->advance(1s);
  auto r2 = must(t.kv_put(c.bucket, "k", "two"));
  auto e = must(t.kv_get(c.bucket, "k"));
  CHECK(e.bucket == c.bucket);
  CHECK(e.key == "k");
  CHECK(e.value == "two");
  CHECK(e.revision == r2);
  CHECK(e.op == kv_op::put);
  CHECK(first.revision == r1);
  CHECK(e.created > first.created);
  CHECK(code_of(t.kv_get(c.bucket, "other")) == errc::not_found);
}

TEST_CASE("revisions are the bucket's sequence, rising across keys", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "revs", 5);
  auto b = create_bucket(t, c);
  auto ra = must(t.kv_put(c.bucket, "a", "1"));
  auto rb = must(t.kv_put(c.bucket, "b", "1"));
  auto rc = must(t.kv_create(c.bucket, "c", "1"));
  auto ra2 = must(t.kv_update(c.bucket, "a", "2", ra));
  must(t.kv_delete(c.bucket, "b"));
  auto rb2 = must(t.kv_put(c.bucket, "b", "2"));
  CHECK(ra == 1);  // a fresh bucket
  CHECK(rb == ra + 1);
  CHECK(rc == rb + 1);
  CHECK(ra2 == rc + 1);
  CHECK(rb2 == ra2 + 2);  // the delete marker took a revision too
}

TEST_CASE("kv_create writes only when the key has no live value", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "create", 5);
  auto b = create_bucket(t, c);
  auto r1 = must(t.kv_create(c.bucket, "k", "first"));
  auto again = t.kv_create(c.bucket, "k", "second");
  CHECK(code_of(again) == errc::conflict);
  CHECK(must(t.kv_get(c.bucket, "k")).value == "first");
  CHECK(must(t.kv_get(c.bucket, "k")).revision == r1);

  SECTION("after a delete") {
    must(t.kv_delete(c.bucket, "k"));
  }
  SECTION("after a purge") {
    must(t.kv_purge(c.bucket, "k"));
  }
  auto r2 = must(t.kv_create(c.bucket, "k", "reborn"));
  CHECK(r2 > r1);
  auto e = must(t.kv_get(c.bucket, "k"));
  CHECK(e.value == "reborn");
  CHECK(e.revision == r2);
  CHECK(code_of(t.kv_create(c.bucket, "k", "third")) == errc::conflict);
}

TEST_CASE("kv_update writes only on the key's latest revision", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "update", 5);
  auto b = create_bucket(t, c);
  auto r1 = must(t.kv_put(c.bucket, "k", "v1"));
  auto r2 = must(t.kv_update(c.bucket, "k", "v2", r1));
  CHECK(r2 > r1);
  CHECK(must(t.kv_get(c.bucket, "k")).value == "v2");

  // Stale: r1 is no longer the latest.
  CHECK(code_of(t.kv_update(c.bucket, "k", "stale", r1)) == errc::conflict);
  // Another key's revision is not this key's.
  auto other = must(t.kv_put(c.bucket, "other", "x"));
  CHECK(code_of(t.kv_update(c.bucket, "k", "wrong key", other)) == errc::conflict);
  // A revision from the future.
  CHECK(code_of(t.kv_update(c.bucket, "k", "future", other + 10)) == errc::conflict);
  auto e = must(t.kv_get(c.bucket, "k"));
  CHECK(e.value == "v2");
  CHECK(e.revision == r2);

  auto r3 = must(t.kv_update(c.bucket, "k", "v3", r2));
  CHECK(r3 > other);
}

TEST_CASE("kv_update of a key that never existed is a conflict", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "updmissing");
  auto b = create_bucket(t, c);
  auto r = must(t.kv_put(c.bucket, "exists", "x"));
  CHECK(code_of(t.kv_update(c.bucket, "missing", "v", r)) == errc::conflict);
  CHECK(code_of(t.kv_get(c.bucket, "missing")) == errc::not_found);
}

TEST_CASE("kv_update counts a delete marker as the latest revision", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "upddel", 5);
  auto b = create_bucket(t, c);
  auto r1 = must(t.kv_put(c.bucket, "k", "v1"));
  must(t.kv_delete(c.bucket, "k"));
  auto h = must(t.kv_history(c.bucket, "k"));
  REQUIRE(h.size() == 2);
  REQUIRE(h.back().op == kv_op::del);
  const auto del_rev = h.back().revision;
  CHECK(del_rev > r1);
  CHECK(code_of(t.kv_update(c.bucket, "k", "on the put", r1)) == errc::conflict);
  auto r3 = must(t.kv_update(c.bucket, "k", "on the marker", del_rev));
  CHECK(r3 > del_rev);
  CHECK(must(t.kv_get(c.bucket, "k")).value == "on the marker");
}

TEST_CASE("kv_put writes unconditionally and returns the new revision", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "put");
  auto b = create_bucket(t, c);
  auto r1 = must(t.kv_put(c.bucket, "k", "1"));
  auto r2 = must(t.kv_put(c.bucket, "k", "2"));
  CHECK(r2 > r1);
  must(t.kv_delete(c.bucket, "k"));
  auto r3 = must(t.kv_put(c.bucket, "k", "3"));
  CHECK(r3 > r2);
  auto e = must(t.kv_get(c.bucket, "k"));
  CHECK(e.value == "3");
  CHECK(e.revision == r3);
  // An empty value is a value.
  must(t.kv_put(c.bucket, "empty", ""));
  auto empty = must(t.kv_get(c.bucket, "empty"));
  CHECK(empty.value.empty());
  CHECK(empty.op == kv_op::put);
}

TEST_CASE("a deleted key is gone from get and keys but keeps its history", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "delete", 5);
  auto b = create_bucket(t, c);
  auto r1 = must(t.kv_put(c.bucket, "k", "v1"));
  auto r2 = must(t.kv_put(c.bucket, "k", "v2"));
  must(t.kv_delete(c.bucket, "k"));
  CHECK(code_of(t.kv_get(c.bucket, "k")) == errc::not_found);
  CHECK(must(t.kv_keys(c.bucket)).empty());
  auto h = must(t.kv_history(c.bucket, "k"));
  REQUIRE(ops_of(h) == std::vector<kv_op>{kv_op::put, kv_op::put, kv_op::del});
  CHECK(values_of(h) == std::vector<std::string>{"v1", "v2", ""});
  CHECK(h[0].revision == r1);
  CHECK(h[1].revision == r2);
  CHECK(h[2].revision > r2);
  for (const auto& e : h) {
    CHECK(e.key == "k");
    CHECK(e.bucket == c.bucket);
  }
}

TEST_CASE("deleting a missing key succeeds", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "delmissing");
  auto b = create_bucket(t, c);
  must(t.kv_delete(c.bucket, "never"));
  CHECK(code_of(t.kv_get(c.bucket, "never")) == errc::not_found);
  CHECK(must(t.kv_keys(c.bucket)).empty());
}

TEST_CASE("a purge removes the key's history and leaves one purge marker", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "purge", 5);
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "k", "v1"));
  must(t.kv_put(c.bucket, "k", "v2"));
  must(t.kv_delete(c.bucket, "k"));
  must(t.kv_put(c.bucket, "other", "stays"));
  must(t.kv_purge(c.bucket, "k"));
  CHECK(code_of(t.kv_get(c.bucket, "k")) == errc::not_found);
  auto h = must(t.kv_history(c.bucket, "k"));
  REQUIRE(h.size() == 1);
  CHECK(h[0].op == kv_op::purge);
  CHECK(h[0].value.empty());
  CHECK(must(t.kv_keys(c.bucket)) == std::vector<std::string>{"other"});
  // Other keys keep their history.
  CHECK(must(t.kv_history(c.bucket, "other")).size() == 1);
  // Written again, the history is the marker and the new value.
  must(t.kv_put(c.bucket, "k", "v3"));
  auto h2 = must(t.kv_history(c.bucket, "k"));
  CHECK(ops_of(h2) == std::vector<kv_op>{kv_op::purge, kv_op::put});
  CHECK(must(t.kv_get(c.bucket, "k")).value == "v3");
}

TEST_CASE("an erase removes every revision of the key and leaves no marker", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "erase", 5);
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "k", "v1"));
  must(t.kv_delete(c.bucket, "k"));
  auto last = must(t.kv_put(c.bucket, "k", "v2"));
  must(t.kv_put(c.bucket, "other", "stays"));
  must(t.kv_erase(c.bucket, "k"));
  CHECK(code_of(t.kv_get(c.bucket, "k")) == errc::not_found);
  CHECK(code_of(t.kv_history(c.bucket, "k")) == errc::not_found);
  CHECK(must(t.kv_keys(c.bucket)) == std::vector<std::string>{"other"});
  CHECK(must(t.kv_history(c.bucket, "other")).size() == 1);
  // The key can be created again, as if never written; revisions still rise.
  auto again = must(t.kv_create(c.bucket, "k", "v3"));
  CHECK(again > last);
  auto h = must(t.kv_history(c.bucket, "k"));
  CHECK(ops_of(h) == std::vector<kv_op>{kv_op::put});
  CHECK(values_of(h) == std::vector<std::string>{"v3"});
  // A missing key is erased already; a missing bucket and a bad key are errors.
  must(t.kv_erase(c.bucket, "never"));
  CHECK(code_of(t.kv_erase(fx->unique("nobucket"), "k")) == errc::not_found);
  CHECK(code_of(t.kv_erase(c.bucket, "bad key")) == errc::invalid_name);
}

TEST_CASE("kv_history keeps at most `history` revisions per key, oldest first", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  SECTION("history 3") {
    auto c = bucket_cfg(*fx, "hist", 3);
    auto b = create_bucket(t, c);
    std::vector<std::uint64_t> revs;
    for (int i = 1; i <= 5; ++i)
      revs.push_back(must(t.kv_put(c.bucket, "k", "v" + std::to_string(i))));
    must(t.kv_put(c.bucket, "other", "x"));
    auto h = must(t.kv_history(c.bucket, "k"));
    CHECK(values_of(h) == std::vector<std::string>{"v3", "v4", "v5"});
    REQUIRE(h.size() == 3);
    CHECK(h[0].revision == revs[2]);
    CHECK(h[2].revision == revs[4]);
  }
  SECTION("history 1") {
    auto c = bucket_cfg(*fx, "hist1", 1);
    auto b = create_bucket(t, c);
    must(t.kv_put(c.bucket, "k", "a"));
    must(t.kv_put(c.bucket, "k", "b"));
    CHECK(values_of(must(t.kv_history(c.bucket, "k"))) == std::vector<std::string>{"b"});
    must(t.kv_delete(c.bucket, "k"));
    CHECK(ops_of(must(t.kv_history(c.bucket, "k"))) == std::vector<kv_op>{kv_op::del});
  }
}

TEST_CASE("kv_history of a key never written is not_found", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "histmissing");
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "a", "x"));
  CHECK(code_of(t.kv_history(c.bucket, "b")) == errc::not_found);
}

TEST_CASE("kv_keys lists live keys sorted, without deleted or purged ones", "[kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "keys", 3);
  auto b = create_bucket(t, c);
  CHECK(must(t.kv_keys(c.bucket)).empty());  // an empty bucket has no keys, no error
  for (const auto* k : {"d", "b.x", "a", "c", "a.b", "e", "B"}) must(t.kv_put(c.bucket, k, "v"));
  must(t.kv_put(c.bucket, "a", "again"));
  must(t.kv_delete(c.bucket, "d"));
  must(t.kv_purge(c.bucket, "e"));
  auto keys = must(t.kv_keys(c.bucket));
  CHECK(keys == std::vector<std::string>{"B", "a", "a.b", "b.x", "c"});
  CHECK(std::is_sorted(keys.begin(), keys.end()));
}

TEST_CASE("a value over max_value_size is payload_too_large and not written", "[kv][limits]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "valsize");
  c.max_value_size = 4;
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "k", "1234"));
  CHECK(code_of(t.kv_put(c.bucket, "k", "12345")) == errc::payload_too_large);
  CHECK(code_of(t.kv_create(c.bucket, "n", "12345")) == errc::payload_too_large);
  CHECK(must(t.kv_get(c.bucket, "k")).value == "1234");
  CHECK(code_of(t.kv_get(c.bucket, "n")) == errc::not_found);
}

TEST_CASE("the bucket ttl removes values once they are older, not before", "[kv][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "ttl");
  c.ttl = 2s;
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "k", "v"));
  fx->advance(500ms);
  CHECK(must(t.kv_get(c.bucket, "k")).value == "v");
  fx->advance(2s);
  CHECK(code_of(t.kv_get(c.bucket, "k")) == errc::not_found);
  CHECK(must(t.kv_keys(c.bucket)).empty());
  CHECK(code_of(t.kv_history(c.bucket, "k")) == errc::not_found);
  // The key can be written again, and create sees no live value.
  must(t.kv_create(c.bucket, "k", "again"));
  CHECK(must(t.kv_get(c.bucket, "k")).value == "again");
}

// ----- per-key TTL ----------------------------------------------------------------------

TEST_CASE("per-key ttl: the value expires after its ttl, writes without ttl do not",
          "[kv][ttl][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "pkttl", 5);
  auto b = create_bucket(t, c);

  if (!t.caps().per_key_ttl) {
    // Not honoured: refused, and nothing written.
    CHECK(code_of(t.kv_put(c.bucket, "k", "v", 1s)) == errc::bad_request);
    CHECK(code_of(t.kv_create(c.bucket, "k", "v", 1s)) == errc::bad_request);
    auto r = must(t.kv_put(c.bucket, "plain", "v"));
    CHECK(code_of(t.kv_update(c.bucket, "plain", "v2", r, 1s)) == errc::bad_request);
    CHECK(code_of(t.kv_get(c.bucket, "k")) == errc::not_found);
    CHECK(must(t.kv_get(c.bucket, "plain")).revision == r);
    CHECK(must(t.kv_keys(c.bucket)) == std::vector<std::string>{"plain"});
    CHECK(r == 1);
    return;
  }

  SECTION("put with ttl expires") {
    must(t.kv_put(c.bucket, "k", "v", 1s));
    fx->advance(300ms);
    CHECK(must(t.kv_get(c.bucket, "k")).value == "v");
    fx->advance(1s);
    CHECK(code_of(t.kv_get(c.bucket, "k")) == errc::not_found);
    CHECK(must(t.kv_keys(c.bucket)).empty());
    // Earlier revisions are gone; at most the expiry marker remains.
    auto h = t.kv_history(c.bucket, "k");
    if (h.has_value()) {
      for (const auto& e : *h) CHECK(e.op != kv_op::put);
    } else {
      CHECK(code_of(h) == errc::not_found);
    }
    // Create sees no live value; a later put without ttl does not expire.
    must(t.kv_create(c.bucket, "k", "forever"));
    fx->advance(2s);
    CHECK(must(t.kv_get(c.bucket, "k")).value == "forever");
  }
  SECTION("create and update with ttl expire") {
    auto r = must(t.kv_create(c.bucket, "k", "v", 1s));
    must(t.kv_update(c.bucket, "k", "v2", r, 1s));
    fx->advance(300ms);
    CHECK(must(t.kv_get(c.bucket, "k")).value == "v2");
    fx->advance(1s);
    CHECK(code_of(t.kv_get(c.bucket, "k")) == errc::not_found);
  }
  SECTION("a ttl write refreshed before it expires lives on") {
    must(t.kv_put(c.bucket, "k", "1", 1500ms));
    fx->advance(1s);
    must(t.kv_put(c.bucket, "k", "2", 1500ms));
    fx->advance(1s);  // past the first write's ttl, within the second's
    CHECK(must(t.kv_get(c.bucket, "k")).value == "2");
    fx->advance(1s);
    CHECK(code_of(t.kv_get(c.bucket, "k")) == errc::not_found);
  }
  SECTION("a put without ttl replaces a value with ttl and does not expire") {
    must(t.kv_put(c.bucket, "k", "1", 1s));
    must(t.kv_put(c.bucket, "k", "2"));
    fx->advance(2s);
    CHECK(must(t.kv_get(c.bucket, "k")).value == "2");
  }
  SECTION("other keys are untouched") {
    must(t.kv_put(c.bucket, "short", "v", 1s));
    must(t.kv_put(c.bucket, "long", "v"));
    fx->advance(2s);
    CHECK(code_of(t.kv_get(c.bucket, "short")) == errc::not_found);
    CHECK(must(t.kv_keys(c.bucket)) == std::vector<std::string>{"long"});
  }
}

TEST_CASE("async KV operations complete exactly once", "[kv][async]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "asynckv", 5);
  auto b = create_bucket(t, c);

  completion_probe<std::uint64_t> put, create, update, stale;
  completion_probe<kv_entry> get, missing;
  completion_probe<void> del, purge;
  t.async_kv_put(c.bucket, "k", "1", std::nullopt, put.handler());
  auto r1 = must(put.get());
  t.async_kv_create(c.bucket, "n", "1", std::nullopt, create.handler());
  must(create.get());
  t.async_kv_update(c.bucket, "k", "2", r1, std::nullopt, update.handler());
  must(update.get());
  t.async_kv_update(c.bucket, "k", "3", r1, std::nullopt, stale.handler());
  CHECK(code_of(stale.get()) == errc::conflict);
  t.async_kv_get(c.bucket, "k", get.handler());
  CHECK(must(get.get()).value == "2");
  t.async_kv_get(c.bucket, "nope", missing.handler());
  CHECK(code_of(missing.get()) == errc::not_found);
  t.async_kv_delete(c.bucket, "k", del.handler());
  must(del.get());
  t.async_kv_purge(c.bucket, "n", purge.handler());
  must(purge.get());

  must(t.kv_put(c.bucket, "later", "x"));
  must(t.ping());
  CHECK(put.calls() == 1);
  CHECK(create.calls() == 1);
  CHECK(update.calls() == 1);
  CHECK(stale.calls() == 1);
  CHECK(get.calls() == 1);
  CHECK(missing.calls() == 1);
  CHECK(del.calls() == 1);
  CHECK(purge.calls() == 1);
}

}  // namespace
}  // namespace amp::conformance::cases
