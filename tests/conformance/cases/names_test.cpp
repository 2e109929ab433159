// Names are checked before anything reaches the backend: a bad stream, consumer, bucket,
// subject or key is invalid_name and changes nothing.

#include <string>
#include <vector>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

TEST_CASE("a stream name outside the grammar is invalid_name and creates nothing",
          "[names][streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  const std::string base = fx->unique("badname");
  const std::vector<std::string> bad = {
      "",   "a.b",  "a*b",  "a>b", "a/b", "a\\b", "a b",
      " a", "a\tb", "a\nb", "*",   ">",   ".",    std::string(256, 's'),
  };
  for (const auto& name : bad) {
    CAPTURE(name);
    stream_config c;
    c.name = name;
    c.subjects = {base + ".>"};
    CHECK(code_of(t.ensure_stream(c)) == errc::invalid_name);
    CHECK(code_of(t.stream_info_of(name)) == errc::invalid_name);
    CHECK(code_of(t.delete_stream(name)) == errc::invalid_name);
    CHECK(code_of(t.get_message(name, 1)) == errc::invalid_name);
    CHECK(code_of(t.get_last_message(name, base + ".>")) == errc::invalid_name);
    CHECK(code_of(t.subscribe_ordered({.stream = name, .start = deliver_policy::all},
                                      [](const message&) {})) == errc::invalid_name);
  }
  // No stream captures the subjects: none was created.
  CHECK(code_of(t.publish({.subject = base + ".x", .data = "x"})) == errc::not_found);
}

TEST_CASE("a stream name at the longest allowed length is accepted", "[names][streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "long");  // captures <short name>.>
  const std::string subject = subject_in(c, "x");
  c.name += std::string(255 - c.name.size(), 'L');
  c.storage = storage_type::memory;
  REQUIRE(c.name.size() == 255);
  auto s = create_stream(t, c);
  CHECK(must(t.publish({.subject = subject, .data = "x"})).stream == c.name);
  auto cc = consumer_cfg(*fx, c);
  cc.durable += std::string(255 - cc.durable.size(), 'C');
  must(t.ensure_consumer(cc));
  CHECK(fetch_now(t, cc).size() == 1);
}

TEST_CASE("a stream subject with spaces, empty tokens or misplaced wildcards is invalid_name",
          "[names][streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto good = stream_cfg(*fx, "subj");
  const std::string n = good.name;
  const std::vector<std::string> bad = {
      "",         n + ".a b", n + " .x", n + "..b", "." + n,   n + ".",
      n + ".>.b", n + ".b*",  n + ".*b", n + ".b>", n + ".>>", n + ".a\tb",
  };
  for (const auto& subject : bad) {
    CAPTURE(subject);
    auto c = good;
    c.subjects = {subject};
    CHECK(code_of(t.ensure_stream(c)) == errc::invalid_name);
    CHECK(code_of(t.stream_info_of(c.name)) == errc::not_found);
    // One bad subject among good ones spoils the whole configuration.
    c.subjects = {n + ".ok.>", subject};
    CHECK(code_of(t.ensure_stream(c)) == errc::invalid_name);
    CHECK(code_of(t.stream_info_of(c.name)) == errc::not_found);
  }
  // Wildcards in their places are fine.
  good.subjects = {n + ".*.x", n + ".y.>"};
  CHECK(code_of(t.ensure_stream(good)) == errc::bad_request);  // they overlap: n.y.x
  good.subjects = {n + ".*.x", n + ".z.>"};
  CHECK(code_of(t.ensure_stream(good)) == errc::bad_request);  // n.z.x again
  good.subjects = {n + ".*.x", n + ".y.>.z"};
  CHECK(code_of(t.ensure_stream(good)) == errc::invalid_name);
  good.subjects = {n + ".*.x", n + ".y.*.>"};
  auto s = create_stream(t, good);
  CHECK(publish_ok(t, n + ".a.x") == 1);
  CHECK(publish_ok(t, n + ".y.b.c") == 2);
}

TEST_CASE("publishing to a subject with wildcards, spaces or empty tokens is invalid_name",
          "[names][publish]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "pubname");
  auto s = create_stream(t, c);
  const std::string n = c.name;
  const std::vector<std::string> bad = {
      "", n + ".*", n + ".>", n + ".a.*", n + ".a b", n + "..a", n + ".a.", n + ".a\tb", n + ". ",
  };
  for (const auto& subject : bad) {
    CAPTURE(subject);
    CHECK(code_of(t.publish({.subject = subject, .data = "x"})) == errc::invalid_name);
    CHECK(code_of(t.publish({.subject = subject, .data = "x", .msg_id = "id"})) ==
          errc::invalid_name);
  }
  auto st = state_of(t, n);
  CHECK(st.messages == 0);
  CHECK(st.last_seq == 0);
  // The id of a refused publish was not recorded for deduplication.
  auto ack = must(t.publish({.subject = n + ".ok", .data = "x", .msg_id = "id"}));
  CHECK_FALSE(ack.duplicate);
  CHECK(ack.seq == 1);
}

TEST_CASE("a bad subject filter for messages or replay is invalid_name", "[names][streams]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = stream_cfg(*fx, "filter");
  auto s = create_stream(t, c);
  publish_ok(t, subject_in(c, "a"));
  for (const std::string& filter : {c.name + ".a b", c.name + "..a", c.name + ".>.a"}) {
    CAPTURE(filter);
    CHECK(code_of(t.get_last_message(c.name, filter)) == errc::invalid_name);
    CHECK(code_of(t.subscribe_ordered({.stream = c.name, .filter_subject = filter},
                                      [](const message&) {})) == errc::invalid_name);
  }
}

TEST_CASE("a consumer name or filter outside the grammar is invalid_name and creates nothing",
          "[names][consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "consname");
  auto s = create_stream(t, sc);
  publish_ok(t, subject_in(sc, "a"));

  SECTION("durable names") {
    const std::vector<std::string> bad = {
        "", "a.b", "a*", "a>", "a/b", "a\\b", "a b", "a\tb", std::string(256, 'c'),
    };
    for (const auto& name : bad) {
      CAPTURE(name);
      consumer_config c{.stream = sc.name, .durable = name};
      CHECK(code_of(t.ensure_consumer(c)) == errc::invalid_name);
      CHECK(code_of(t.update_consumer(c)) == errc::invalid_name);
      CHECK(code_of(t.consumer_info_of(sc.name, name)) == errc::invalid_name);
      CHECK(code_of(t.delete_consumer(sc.name, name)) == errc::invalid_name);
      CHECK(code_of(t.fetch(sc.name, name, {.batch = 1, .max_wait = 0s})) == errc::invalid_name);
    }
  }
  SECTION("filter subjects") {
    const std::vector<std::string> bad = {
        sc.name + ".a b", sc.name + "..a", sc.name + ".a.", sc.name + ".>.a", sc.name + ".a*",
    };
    for (const auto& filter : bad) {
      CAPTURE(filter);
      auto c = consumer_cfg(*fx, sc, filter);
      CHECK(code_of(t.ensure_consumer(c)) == errc::invalid_name);
      CHECK(code_of(t.consumer_info_of(sc.name, c.durable)) == errc::not_found);
    }
  }
  SECTION("a stream name given to a consumer") {
    auto c = consumer_cfg(*fx, sc);
    c.stream = "bad.stream";
    CHECK(code_of(t.ensure_consumer(c)) == errc::invalid_name);
  }
  CHECK(state_of(t, sc.name).consumers == 0);
}

TEST_CASE("a bucket name outside [A-Za-z0-9_-] is invalid_name", "[names][kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  const std::vector<std::string> bad = {
      "", "a.b", "a b", "a*", "a>", "a/b", "a\\b", "a$b", "a:b", "a=b", std::string(253, 'b'),
  };
  for (const auto& bucket : bad) {
    CAPTURE(bucket);
    CHECK(code_of(t.ensure_bucket({.bucket = bucket})) == errc::invalid_name);
    CHECK(code_of(t.delete_bucket(bucket)) == errc::invalid_name);
    CHECK(code_of(t.kv_put(bucket, "k", "v")) == errc::invalid_name);
    CHECK(code_of(t.kv_get(bucket, "k")) == errc::invalid_name);
    CHECK(code_of(t.kv_keys(bucket)) == errc::invalid_name);
    CHECK(code_of(t.kv_history(bucket, "k")) == errc::invalid_name);
    CHECK(code_of(t.kv_watch(bucket, {}, {})) == errc::invalid_name);
  }
  // Letters, digits, '_' and '-' are fine.
  auto c = bucket_cfg(*fx, "Ok-bucket_9");
  auto b = create_bucket(t, c);
  CHECK(must(t.kv_put(c.bucket, "k", "v")) == 1);
}

TEST_CASE("a bad KV key is invalid_name and writes nothing", "[names][kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "keys", 5);
  auto b = create_bucket(t, c);
  const std::vector<std::string> bad = {
      "", " ", "a b", "a..b", ".a", "a.", "a*", "a.*", "a.>", ">", "a\tb", "a:b", "a\nb",
  };
  for (const auto& key : bad) {
    CAPTURE(key);
    CHECK(code_of(t.kv_put(c.bucket, key, "v")) == errc::invalid_name);
    CHECK(code_of(t.kv_create(c.bucket, key, "v")) == errc::invalid_name);
    CHECK(code_of(t.kv_update(c.bucket, key, "v", 1)) == errc::invalid_name);
    CHECK(code_of(t.kv_get(c.bucket, key)) == errc::invalid_name);
    CHECK(code_of(t.kv_delete(c.bucket, key)) == errc::invalid_name);
    CHECK(code_of(t.kv_purge(c.bucket, key)) == errc::invalid_name);
    CHECK(code_of(t.kv_history(c.bucket, key)) == errc::invalid_name);
  }
  CHECK(must(t.kv_keys(c.bucket)).empty());
  // The first valid write is the bucket's first revision: nothing was written before.
  CHECK(must(t.kv_put(c.bucket, "first", "v")) == 1);
}

TEST_CASE("KV keys with dots, dashes, underscores, slashes and equals signs are valid",
          "[names][kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "goodkeys");
  auto b = create_bucket(t, c);
  const std::vector<std::string> good = {"a", "a.b.c", "A-b_c", "x/y=z", "0", "task.7f3e-01"};
  for (const auto& key : good) {
    CAPTURE(key);
    auto rev = must(t.kv_put(c.bucket, key, "v-" + key));
    auto e = must(t.kv_get(c.bucket, key));
    CHECK(e.key == key);
    CHECK(e.value == "v-" + key);
    CHECK(e.revision == rev);
  }
}

TEST_CASE("a bad watch key filter is invalid_name", "[names][kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "watchname");
  auto b = create_bucket(t, c);
  for (const std::string filter : {"a b", "a..b", ".a", "a.>.b"}) {
    CAPTURE(filter);
    watch_log log;
    CHECK(code_of(t.kv_watch(c.bucket, {.key_filter = filter}, log.handlers())) ==
          errc::invalid_name);
  }
}

}  // namespace
}  // namespace amp::conformance::cases
