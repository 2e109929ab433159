// A bucket's stream: its revisions are the messages of `KV_<bucket>` on `$KV.<bucket>.<key>`,
// readable by consumers like any stream's; a publish there is a KV write; deleting the stream
// deletes the bucket.

#include <string>
#include <vector>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

std::optional<std::string> operation_of(const message& m) {
  auto op = find_header(m.headers, "KV-Operation");
  return op ? std::optional<std::string>(*op) : std::nullopt;
}

std::uint64_t count_on(transport& t, const std::string& stream, const std::string& subject) {
  auto counts = must(t.stream_subjects(stream, subject));
  auto it = counts.find(subject);
  return it == counts.end() ? 0 : it->second;
}

TEST_CASE("a bucket's revisions are the messages of its stream KV_<bucket>", "[kv][kv-stream]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "kvs", 3);
  auto b = create_bucket(t, c);
  const auto stream = kv_stream_name(c.bucket);
  const auto info = must(t.stream_info_of(stream));
  CHECK(info.config.subjects == std::vector<std::string>{"$KV." + c.bucket + ".>"});
  CHECK(info.config.max_msgs_per_subject == 3);

  const auto r1 = must(t.kv_put(c.bucket, "a", "1"));
  const auto r2 = must(t.kv_put(c.bucket, "b.x", "2"));
  must(t.kv_delete(c.bucket, "a"));
  const auto st = state_of(t, stream);
  CHECK(st.messages == 3);
  CHECK(st.first_seq == r1);
  CHECK(st.last_seq == r2 + 1);
  const auto put = must(t.get_message(stream, r2));
  CHECK(put.subject == kv_subject_of(c.bucket, "b.x"));
  CHECK(put.data == "2");
  CHECK_FALSE(operation_of(put));
  const auto del = must(t.get_message(stream, r2 + 1));
  CHECK(del.subject == kv_subject_of(c.bucket, "a"));
  CHECK(operation_of(del) == "DEL");
  CHECK(del.data.empty());

  SECTION("a consumer reads them in order, and what is written later") {
    consumer_config cc{.stream = stream,
                       .durable = fx->unique("c"),
                       .filter_subject = "$KV." + c.bucket + ".*",
                       .ack_wait = 30s};
    must(t.ensure_consumer(cc));
    auto got = fetch_now(t, cc, 10);
    CHECK(seqs_of(got) == std::vector<std::uint64_t>{r1, r2 + 1});  // not b.x: two tokens
    const auto r4 = must(t.kv_put(c.bucket, "a", "again"));
    got = fetch_now(t, cc, 10);
    REQUIRE(got.size() == 1);
    CHECK(got[0].seq == r4);
    CHECK(got[0].data == "again");
    CHECK(got[0].stream == stream);
    must(t.ack(got[0]));
  }
  SECTION("history, purge and erase trim the stream alike") {
    const auto h = kv_subject_of(c.bucket, "h");
    for (int i = 0; i < 5; ++i) must(t.kv_put(c.bucket, "h", std::to_string(i)));
    CHECK(count_on(t, stream, h) == 3);
    must(t.kv_purge(c.bucket, "h"));
    CHECK(count_on(t, stream, h) == 1);
    const auto marker = must(t.get_last_message(stream, h));
    CHECK(operation_of(marker) == "PURGE");
    must(t.kv_erase(c.bucket, "b.x"));
    CHECK(count_on(t, stream, kv_subject_of(c.bucket, "b.x")) == 0);
    CHECK(code_of(t.get_message(stream, r2)) == errc::not_found);
  }
}

TEST_CASE("a publish on a bucket's subject is a write of its key", "[kv][kv-stream]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "kvpub", 5);
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "k", "first"));
  const auto ack = must(t.publish({.subject = kv_subject_of(c.bucket, "k"), .data = "second"}));
  CHECK(ack.stream == kv_stream_name(c.bucket));
  const auto got = must(t.kv_get(c.bucket, "k"));
  CHECK(got.value == "second");
  CHECK(got.revision == ack.seq);
  must(t.publish({.subject = kv_subject_of(c.bucket, "k"), .headers = {{"KV-Operation", "DEL"}}}));
  CHECK(code_of(t.kv_get(c.bucket, "k")) == errc::not_found);
  CHECK(must(t.kv_keys(c.bucket)).empty());
  auto history = must(t.kv_history(c.bucket, "k"));
  REQUIRE(history.size() == 3);
  CHECK(history[2].op == kv_op::del);
}

TEST_CASE("deleting a bucket deletes its stream, and deleting the stream the bucket",
          "[kv][kv-stream]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "kvdel");
  const auto stream = kv_stream_name(c.bucket);
  SECTION("the bucket") {
    auto b = create_bucket(t, c);
    must(t.kv_put(c.bucket, "k", "v"));
    must(t.delete_bucket(c.bucket));
    CHECK(code_of(t.stream_info_of(stream)) == errc::not_found);
  }
  SECTION("the stream") {
    auto b = create_bucket(t, c);
    must(t.kv_put(c.bucket, "k", "v"));
    must(t.delete_stream(stream));
    CHECK(code_of(t.kv_get(c.bucket, "k")) == errc::not_found);
    CHECK(code_of(t.delete_bucket(c.bucket)) == errc::not_found);
    // Made again, it is empty.
    must(t.ensure_bucket(c));
    CHECK(must(t.kv_keys(c.bucket)).empty());
    CHECK(state_of(t, stream).messages == 0);
  }
}

TEST_CASE("a publish on a bucket's subject keeps its headers and is deduplicated by its id",
          "[kv][kv-stream]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "kvraw", 5);
  auto b = create_bucket(t, c);
  watch_log log;
  auto watch = must(t.kv_watch(c.bucket, {.updates_only = true}, log.handlers()));
  REQUIRE(log.wait_caught_up());
  const outgoing_message raw{.subject = kv_subject_of(c.bucket, "k"),
                             .data = "v",
                             .headers = {{"X-Mine", "kept"}},
                             .msg_id = "id-1"};
  const auto first = must(t.publish(raw));
  const auto again = must(t.publish(raw));
  CHECK_FALSE(first.duplicate);
  CHECK(again.duplicate);
  CHECK(again.seq == first.seq);
  const auto stored = must(t.get_message(kv_stream_name(c.bucket), first.seq));
  CHECK(find_header(stored.headers, "X-Mine") == "kept");
  CHECK(find_header(stored.headers, "Nats-Msg-Id") == "id-1");
  CHECK(must(t.kv_get(c.bucket, "k")).revision == first.seq);
  REQUIRE(log.wait_for(1));
  CHECK(log.items()[0].value == "v");
  CHECK(log.items()[0].revision == first.seq);
  // A purge as clients send it (a marker with a rollup) leaves the marker alone.
  must(t.kv_put(c.bucket, "k", "w"));
  must(t.publish({.subject = kv_subject_of(c.bucket, "k"),
                  .headers = {{"KV-Operation", "PURGE"}, {"Nats-Rollup", "sub"}}}));
  auto history = must(t.kv_history(c.bucket, "k"));
  REQUIRE(history.size() == 1);
  CHECK(history[0].op == kv_op::purge);
}

TEST_CASE("a bucket is its stream: one made as a bucket's is taken, and limits set on it hold",
          "[kv][kv-stream]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "kvadopt", 3);
  const auto stream = kv_stream_name(c.bucket);
  SECTION("a stream made first with a bucket's settings") {
    stream_config sc{.name = stream,
                     .subjects = {"$KV." + c.bucket + ".>"},
                     .max_msgs_per_subject = 3,
                     .discard = discard_policy::new_messages};
    auto s = create_stream(t, sc);
    must(t.ensure_bucket(c));
    auto b = bucket_guard(t, c.bucket);
    const auto r = must(t.kv_put(c.bucket, "k", "v"));
    CHECK(must(t.kv_get(c.bucket, "k")).revision == r);
    CHECK(state_of(t, stream).messages == 1);
  }
  SECTION("the stream updated as it is, the bucket is still the same") {
    auto b = create_bucket(t, c);
    must(t.update_stream(must(t.stream_info_of(stream)).config));
    must(t.ensure_bucket(c));
  }
  SECTION("a message limit set on the stream refuses a write beyond it") {
    auto b = create_bucket(t, c);
    auto sc = must(t.stream_info_of(stream)).config;
    sc.max_msgs = 2;
    must(t.update_stream(sc));
    must(t.kv_put(c.bucket, "a", "1"));
    must(t.kv_put(c.bucket, "b", "2"));
    CHECK(code_of(t.kv_put(c.bucket, "c", "3")) == errc::limit_exceeded);
    // A key below its history makes no room either.
    CHECK(code_of(t.kv_put(c.bucket, "a", "again")) == errc::limit_exceeded);
    CHECK(must(t.kv_keys(c.bucket)) == std::vector<std::string>{"a", "b"});
    CHECK(must(t.kv_get(c.bucket, "a")).value == "1");
  }
}

TEST_CASE("a per-key TTL that ran out is gone from the stream as from the bucket",
          "[kv][kv-stream][ttl][time]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  if (!t.caps().per_key_ttl) return;  // refused there: see the per-key ttl case
  auto c = bucket_cfg(*fx, "kvttl", 5);
  auto b = create_bucket(t, c);
  const auto stream = kv_stream_name(c.bucket);
  const auto first = must(t.kv_put(c.bucket, "k", "short", 1s));
  const auto second = must(t.kv_put(c.bucket, "k", "long", 1h));
  fx->advance(2s);
  // Read through the stream only.
  CHECK(code_of(t.get_message(stream, first)) == errc::not_found);
  CHECK(must(t.get_message(stream, second)).data == "long");
  CHECK(state_of(t, stream).messages == 1);
}

}  // namespace
}  // namespace amp::conformance::cases
