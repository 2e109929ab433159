#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "amp/envelope.hpp"
#include "amp/json.hpp"
#include "amp/timestamp.hpp"

namespace {

amp::envelope sample() {
  amp::envelope e;
  e.id = "m-1";
  e.from = "alice";
  e.to = "bob";
  e.ns = "demo";
  e.type = "review.request";
  e.ts = amp::parse_timestamp("2026-11-30T12:00:00.123Z").value();
  e.body = R"({"text":"hi"})";
  e.headers = {{"k", "v"}, {"trace", "abc"}};
  e.reply_to = "alice";
  e.correlation = "c-1";
  return e;
}

// `json` with one member's raw text replaced, e.g. with_member("from", "42").
std::string with_member(std::string_view name, std::string_view raw_value) {
  amp::json_writer w;
  const auto e = sample();
  w.begin_object();
  auto put = [&](std::string_view key, auto write) {
    w.key(key);
    if (key == name) {
      w.raw(raw_value);
    } else {
      write();
    }
  };
  put("id", [&] { w.string(e.id); });
  put("from", [&] { w.string(e.from); });
  put("to", [&] { w.string(e.to); });
  put("ns", [&] { w.string(e.ns); });
  put("ts", [&] { w.string(amp::format_timestamp(e.ts)); });
  put("body", [&] { w.raw(e.body); });
  if (name != "id" && name != "from" && name != "to" && name != "ns" && name != "ts" &&
      name != "body") {
    w.key(name).raw(raw_value);
  }
  w.end_object();
  return w.take();
}

amp::error failure(std::string_view json) {
  auto r = amp::parse_envelope(json);
  REQUIRE_FALSE(r.has_value());
  return std::move(r).error();
}

void require_invalid_at(std::string_view json, const std::string& path) {
  CAPTURE(json);
  const auto e = failure(json);
  CAPTURE(e.message());
  REQUIRE(e.code() == amp::errc::invalid_envelope);
  REQUIRE(e.path() == path);
  REQUIRE_THAT(e.message(), Catch::StartsWith("at " + (path.empty() ? "the root" : path) + ": "));
}

}  // namespace

TEST_CASE("to_json writes the members in spec order and leaves out absent ones", "[envelope]") {
  REQUIRE(amp::to_json(sample()) ==
          R"({"id":"m-1","from":"alice","to":"bob","ns":"demo","type":"review.request",)"
          R"("ts":"2026-11-30T12:00:00.123Z","body":{"text":"hi"},)"
          R"("headers":{"k":"v","trace":"abc"},"reply_to":"alice","correlation":"c-1"})");

  auto minimal = sample();
  minimal.type.clear();
  minimal.headers.clear();
  minimal.reply_to.clear();
  minimal.correlation.clear();
  minimal.body = "null";
  REQUIRE(amp::to_json(minimal) == R"({"id":"m-1","from":"alice","to":"bob","ns":"demo",)"
                                   R"("ts":"2026-11-30T12:00:00.123Z","body":null})");

  minimal.body.clear();  // no body at all is still valid JSON
  REQUIRE(amp::json_check(amp::to_json(minimal)).has_value());
}

TEST_CASE("an envelope survives to_json and parse_envelope unchanged", "[envelope]") {
  const auto e = sample();
  auto back = amp::parse_envelope(amp::to_json(e));
  REQUIRE(back.has_value());
  REQUIRE(*back == e);

  auto minimal = e;
  minimal.type.clear();
  minimal.headers.clear();
  minimal.reply_to.clear();
  minimal.correlation.clear();
  REQUIRE(amp::parse_envelope(amp::to_json(minimal)).value() == minimal);

  auto system = e;
  system.from = "$broker";
  system.to = "news.eu.sport";
  system.type = "amp.task.completed";
  REQUIRE(amp::parse_envelope(amp::to_json(system)).value() == system);
}

TEST_CASE("an operation's branch is written last and read back", "[envelope][operation]") {
  auto e = sample();
  e.correlation.clear();
  e.operation = amp::operation_ref{.id = "o_1", .branch = "bob", .attempt = 2};
  const auto json = amp::to_json(e);
  REQUIRE_THAT(json, Catch::EndsWith(R"("reply_to":"alice","operation":{"id":"o_1","branch":"bob",)"
                                     R"("attempt":2,"reply_by":null}})"));
  REQUIRE(amp::parse_envelope(json).value() == e);

  e.operation->reply_by = amp::parse_timestamp("2026-11-30T12:00:30.000Z").value();
  const auto timed = amp::to_json(e);
  REQUIRE_THAT(timed, Catch::Contains(R"("reply_by":"2026-11-30T12:00:30.000Z")"));
  REQUIRE(amp::parse_envelope(timed).value() == e);

  auto sealed = amp::sealed_envelope::seal(
      {.from = "alice", .to = "bob", .body = "1", .operation = e.operation}, "demo", e.ts);
  REQUIRE(sealed.has_value());
  REQUIRE(sealed->get().operation == e.operation);
}

TEST_CASE("a malformed operation member is invalid_envelope", "[envelope][operation]") {
  for (const char* bad : {R"({"id":"o_1","branch":"bob","attempt":0,"reply_by":null})",
                          R"({"id":"t_1","branch":"bob","attempt":1,"reply_by":null})",
                          R"({"id":"o_1","branch":"Bob","attempt":1,"reply_by":null})",
                          R"({"id":"o_1","branch":"bob","attempt":"1","reply_by":null})",
                          R"({"id":"o_1","branch":"bob","attempt":1,"reply_by":"later"})",
                          R"({"id":"o_1","branch":"bob","attempt":1})", R"("o_1")"}) {
    CAPTURE(bad);
    const auto e = failure(with_member("operation", bad));
    REQUIRE(e.code() == amp::errc::invalid_envelope);
    REQUIRE_THAT(e.path(), Catch::StartsWith("/operation"));
  }
  const auto feb30 = failure(with_member(
      "operation", R"({"id":"o_1","branch":"bob","attempt":1,"reply_by":"2026-02-30T00:00:00Z"})"));
  REQUIRE(feb30.path() == "/operation/reply_by");
}

TEST_CASE("bodies of every JSON type round-trip exactly", "[envelope]") {
  for (const char* body : {
           "null",
           "true",
           "false",
           "0",
           "-17",
           "9223372036854775807",
           "18446744073709551615",
           "1.5",
           "-0.25",
           "1e-07",
           R"("")",
           R"("text")",
           "[]",
           "{}",
           R"([1,"a",null,[{}]])",
           R"({"a":{"b":[true,{"c":"d"}]},"e":1.25})",
           R"("quote \" backslash \\ newline \n tab \t nul \u0000 del )"
           "\x7f\"",
           "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"",
       }) {
    CAPTURE(body);
    auto e = sample();
    e.body = body;
    auto back = amp::parse_envelope(amp::to_json(e));
    REQUIRE(back.has_value());
    REQUIRE(back.value().body == body);
    REQUIRE(back.value() == e);
  }
}

TEST_CASE("the body is kept as its minified JSON value", "[envelope]") {
  const std::string json = R"({"id":"m","from":"a","to":"b","ns":"n","ts":"2026-11-30T12:00:00Z",)"
                           R"("body": { "a" : [ 1 , 2.50, "\u00e9\/" ] ,"b":{ } } })";
  const auto e = amp::parse_envelope(json).value();
  REQUIRE(e.body == "{\"a\":[1,2.5,\"\xC3\xA9/\"],\"b\":{}}");
  REQUIRE(amp::json_check(e.body).has_value());
  // Minifying again changes nothing.
  REQUIRE(amp::parse_envelope(amp::to_json(e)).value().body == e.body);
}

TEST_CASE("strings with escapes and unicode round-trip in every text member", "[envelope]") {
  auto e = sample();
  e.id = "id \"quoted\" \\ caf\xC3\xA9 \xF0\x9F\x98\x80";
  e.correlation = "line1 / \xE2\x80\xA8 end";
  e.headers = {{"x-\xC3\xA9", "tab\there\nnewline \"q\" \\"}, {"empty", ""}};
  const auto json = amp::to_json(e);
  REQUIRE(amp::json_check(json).has_value());
  REQUIRE(amp::parse_envelope(json).value() == e);
}

TEST_CASE("unknown members are ignored", "[envelope]") {
  const auto e = amp::parse_envelope(with_member("future", R"({"x":[1,2]})")).value();
  REQUIRE(e.from == "alice");
  REQUIRE(e.type.empty());
  REQUIRE(e.headers.empty());
}

TEST_CASE("each missing required member is invalid_envelope naming it", "[envelope]") {
  for (const char* name : {"id", "from", "to", "ns", "ts", "body"}) {
    CAPTURE(name);
    // The sample without `name`.
    amp::json_writer w;
    const auto e = sample();
    w.begin_object();
    auto put = [&](std::string_view key, auto write) {
      if (key != name) {
        w.key(key);
        write();
      }
    };
    put("id", [&] { w.string(e.id); });
    put("from", [&] { w.string(e.from); });
    put("to", [&] { w.string(e.to); });
    put("ns", [&] { w.string(e.ns); });
    put("ts", [&] { w.string(amp::format_timestamp(e.ts)); });
    put("body", [&] { w.raw(e.body); });
    w.end_object();
    const auto err = failure(w.str());
    REQUIRE(err.code() == amp::errc::invalid_envelope);
    REQUIRE(err.path() == std::string("/") + name);
    REQUIRE(err.message() ==
            std::string("at /") + name + ": required member \"" + name + "\" is missing");
  }
}

TEST_CASE("members of the wrong type are invalid_envelope at their path", "[envelope]") {
  for (const char* name : {"id", "from", "to", "ns", "ts", "type", "reply_to", "correlation"}) {
    CAPTURE(name);
    for (const char* value : {"42", "null", "true", "[]", "{}"}) {
      const auto json = with_member(name, value);
      require_invalid_at(json, std::string("/") + name);
      REQUIRE_THAT(failure(json).message(), Catch::Contains("'type' constraint"));
    }
  }
  require_invalid_at(with_member("headers", "[]"), "/headers");
  require_invalid_at(with_member("headers", R"("k=v")"), "/headers");
  require_invalid_at(with_member("headers", R"({"k":1})"), "/headers/k");
  require_invalid_at(with_member("headers", R"({"a":"1","b":{"c":"d"}})"), "/headers/b");
}

TEST_CASE("names outside the grammar are refused in from, to, ns and reply_to", "[envelope]") {
  for (const char* bad :
       {R"("")", R"("Bob")", R"("bob smith")", R"("-bob")", R"("bob\n")", R"("b.o.b")", R"("*")",
        R"(">")", R"("$admin")", R"("bob!")",
        R"("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")"}) {
    CAPTURE(bad);
    require_invalid_at(with_member("from", bad), "/from");
    require_invalid_at(with_member("ns", bad), "/ns");
    require_invalid_at(with_member("reply_to", bad), "/reply_to");
    REQUIRE_THAT(failure(with_member("ns", bad)).message(), Catch::Contains("regex"));
  }
  for (const char* bad :
       {R"("")", R"("Bob")", R"("news..eu")", R"(".news")", R"("news.")", R"("news.*")",
        R"("news.>")", R"("$broker")", R"("a.b.c.d.e.f.g.h.i")", R"("news eu")"}) {
    CAPTURE(bad);
    require_invalid_at(with_member("to", bad), "/to");
  }
  // 64 characters is the most a name may have; 8 tokens the most a topic may have.
  const std::string longest(64, 'a');
  REQUIRE(amp::parse_envelope(with_member("from", amp::json_quote(longest))).has_value());
  REQUIRE(amp::parse_envelope(with_member("to", R"("a.b.c.d.e.f.g.h")")).has_value());
  REQUIRE(amp::parse_envelope(with_member("to", R"("9lives")")).has_value());
  require_invalid_at(with_member("ns", R"("$broker")"), "/ns");
  require_invalid_at(with_member("reply_to", R"("$broker")"), "/reply_to");
}

TEST_CASE("$broker may send", "[envelope]") {
  auto e = amp::parse_envelope(with_member("from", R"("$broker")"));
  REQUIRE(e.has_value());
  REQUIRE(e->from == "$broker");
}

TEST_CASE("id, type, correlation and headers keep their limits", "[envelope]") {
  require_invalid_at(with_member("id", R"("")"), "/id");
  require_invalid_at(with_member("id", amp::json_quote(std::string(129, 'x'))), "/id");
  REQUIRE(
      amp::parse_envelope(with_member("id", amp::json_quote(std::string(128, 'x')))).has_value());
  // 128 characters of two bytes each is still 128 characters.
  std::string accents;
  for (int i = 0; i < 128; ++i) {
    accents += "\xC3\xA9";
  }
  REQUIRE(amp::parse_envelope(with_member("id", amp::json_quote(accents))).has_value());
  require_invalid_at(with_member("id", R"("a\u0001b")"), "/id");
  require_invalid_at(with_member("id", R"("tab\t")"), "/id");
  require_invalid_at(with_member("id", "\"del\x7f\""), "/id");

  require_invalid_at(with_member("type", R"("")"), "/type");
  require_invalid_at(with_member("type", R"(".hidden")"), "/type");
  require_invalid_at(with_member("type", R"("a b")"), "/type");
  require_invalid_at(with_member("type", amp::json_quote(std::string(129, 'x'))), "/type");
  REQUIRE(amp::parse_envelope(with_member("type", R"("Review.Request_v2-beta")")).has_value());

  require_invalid_at(with_member("correlation", R"("")"), "/correlation");
  require_invalid_at(with_member("correlation", amp::json_quote(std::string(257, 'c'))),
                     "/correlation");
  REQUIRE(amp::parse_envelope(with_member("correlation", amp::json_quote(std::string(256, 'c'))))
              .has_value());

  std::string many = "{";
  for (int i = 0; i < 65; ++i) {
    many += (i ? ",\"h" : "\"h") + std::to_string(i) + "\":\"v\"";
  }
  many += "}";
  require_invalid_at(with_member("headers", many), "/headers");
  REQUIRE_THAT(failure(with_member("headers", many)).message(), Catch::Contains("64"));

  require_invalid_at(with_member("headers", R"({"":"v"})"), "/headers");
  require_invalid_at(with_member("headers", R"({"a\nb":"v"})"), "/headers");
  require_invalid_at(
      with_member("headers", "{" + amp::json_quote(std::string(129, 'k')) + ":\"v\"}"), "/headers");

  const auto twice = failure(with_member("headers", R"({"a/b":"1","a/b":"2"})"));
  REQUIRE(twice.code() == amp::errc::invalid_envelope);
  REQUIRE(twice.path() == "/headers/a~1b");
  REQUIRE(twice.message() == "at /headers/a~1b: header \"a/b\" appears more than once");
}

TEST_CASE("ts must be an RFC 3339 instant", "[envelope]") {
  for (const char* bad : {R"("2026-11-30")", R"("2026-11-30 12:00:00Z")", R"("yesterday")",
                          R"("2026-11-30T12:00:00")", R"("1764504000")", R"("")"}) {
    CAPTURE(bad);
    require_invalid_at(with_member("ts", bad), "/ts");
  }
  // Right shape, impossible date: refused by parse_timestamp, still at /ts.
  const auto feb30 = failure(with_member("ts", R"("2026-02-30T00:00:00Z")"));
  REQUIRE(feb30.code() == amp::errc::invalid_envelope);
  REQUIRE(feb30.path() == "/ts");
  REQUIRE(feb30.message() ==
          "at /ts: invalid timestamp: day 30 is out of range for 2026-02 (01..28)");
  require_invalid_at(with_member("ts", R"("2026-11-30T25:00:00Z")"), "/ts");

  // Offsets are accepted and normalised to UTC.
  const auto e = amp::parse_envelope(with_member("ts", R"("2026-11-30T13:00:00.5+01:00")"));
  REQUIRE(e.has_value());
  REQUIRE(amp::format_timestamp(e->ts) == "2026-11-30T12:00:00.500Z");
}

TEST_CASE("text that is not an envelope object gets a precise error and never crashes",
          "[envelope]") {
  // Valid JSON of the wrong shape: invalid_envelope at the root.
  for (const char* doc : {"[]", "[1,2]", R"("envelope")", "42", "null", "true"}) {
    CAPTURE(doc);
    require_invalid_at(doc, "");
    REQUIRE_THAT(failure(doc).message(), Catch::Contains("'type' constraint"));
  }
  // Not JSON at all: bad_request with the parser's reason.
  struct bad_case {
    std::string text;
    const char* reason;
  };
  const std::string whole = amp::to_json(sample());
  const bad_case cases[] = {
      {"", "Empty"},
      {"garbage", ""},
      {"{\"id\":\"m\"", "improper structure"},
      {whole.substr(0, whole.size() / 2), ""},
      {whole.substr(0, whole.size() - 1), "improper structure"},
      {whole + "}", "improper structure"},
      {std::string("{\"id\":\"\xff\xfe\"}"), "UTF-8"},
      {std::string("{\"id\":\"\xC3\"}"), "UTF-8"},
      {std::string("\xEF\xBB\xBF") + whole, ""},
      {std::string("{\"id\":\"a\0b\"}", 12), ""},
      {std::string(2000, '['), ""},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text.substr(0, 60));
    const auto e = failure(c.text);
    REQUIRE(e.code() == amp::errc::bad_request);
    REQUIRE_THAT(e.message(), Catch::StartsWith("not valid JSON: "));
    REQUIRE_THAT(e.message(), Catch::Contains(c.reason));
    REQUIRE(e.path().empty());
  }
}

TEST_CASE("a huge member value is refused without harm", "[envelope]") {
  const std::string big(500000, 'a');
  require_invalid_at(with_member("from", amp::json_quote(big)), "/from");
  require_invalid_at(with_member("id", amp::json_quote(big)), "/id");
  require_invalid_at(with_member("to", amp::json_quote(big)), "/to");
  // A big body is fine: it is any JSON.
  auto e = amp::parse_envelope(with_member("body", amp::json_quote(big)));
  REQUIRE(e.has_value());
  REQUIRE(e->body.size() == big.size() + 2);
}

TEST_CASE("a ts finer than the millisecond is kept to the millisecond, so it round-trips",
          "[envelope]") {
  // Found by fuzz_envelope: the nanoseconds were kept, and to_json wrote only milliseconds.
  const auto e =
      amp::parse_envelope(with_member("ts", R"("2026-06-30t23:59:59.123456789z")")).value();
  CHECK(amp::format_timestamp(e.ts) == "2026-06-30T23:59:59.123Z");
  CHECK(e.ts.time_since_epoch() % std::chrono::milliseconds(1) == amp::duration::zero());
  CHECK(amp::parse_envelope(amp::to_json(e)).value() == e);
  const auto offset =
      amp::parse_envelope(with_member("ts", R"("2026-07-01T01:59:59.9999+02:00")")).value();
  CHECK(amp::format_timestamp(offset.ts) == "2026-06-30T23:59:59.999Z");
  CHECK(amp::parse_envelope(amp::to_json(offset)).value() == offset);
}

TEST_CASE("seal stamps id, ns and ts, minifies the body and writes the JSON once", "[envelope]") {
  const auto now = amp::parse_timestamp("2026-12-03T10:00:00.123456Z").value();
  auto sealed = amp::sealed_envelope::seal(
                    {.from = "alice", .to = "bob", .body = R"({ "a" : [ 1, 2 ] })"}, "ns1", now)
                    .value();
  const auto& e = sealed.get();
  CHECK(e.id.rfind("m_", 0) == 0);
  CHECK(e.ns == "ns1");
  CHECK(amp::format_timestamp(e.ts) == "2026-12-03T10:00:00.123Z");
  CHECK(e.body == R"({"a":[1,2]})");
  CHECK(sealed.json() == amp::to_json(e));
  CHECK(amp::parse_envelope(sealed.json()).value() == e);
  auto other =
      amp::sealed_envelope::seal({.from = "alice", .to = "bob", .body = "1"}, "ns1", now).value();
  CHECK(other.get().id != e.id);
  auto kept = amp::sealed_envelope::seal(
                  {.from = "$broker", .to = "bob", .body = "1", .msg_id = "mine"}, "ns1", now)
                  .value();
  CHECK(kept.get().id == "mine");
  CHECK(
      std::move(kept).json() ==
      amp::to_json(
          amp::parse_envelope(
              R"({"id":"mine","from":"$broker","to":"bob","ns":"ns1","ts":"2026-12-03T10:00:00.123Z","body":1})")
              .value()));
}

TEST_CASE("seal refuses in the spec's order: body, then names, then the envelope schema",
          "[envelope]") {
  const auto now = amp::parse_timestamp("2026-12-03T10:00:00Z").value();
  auto code = [&](amp::envelope_parts p) {
    auto r = amp::sealed_envelope::seal(std::move(p), "ns1", now);
    REQUIRE_FALSE(r);
    return r.error().code();
  };
  // Every part is wrong at once: the body is reported first.
  CHECK(code({.from = "Bad", .to = "BAD", .body = "{", .reply_to = "Bad"}) ==
        amp::errc::bad_request);
  CHECK(code({.from = "alice", .to = "bob", .body = ""}) == amp::errc::bad_request);
  CHECK(code({.from = "alice", .to = "bob", .body = "1 2"}) == amp::errc::bad_request);
  CHECK(code({.from = "Bad", .to = "BAD", .body = "1", .reply_to = "Bad"}) ==
        amp::errc::invalid_name);
  CHECK(code({.from = "alice", .to = "bob", .body = "1", .reply_to = "Bad"}) ==
        amp::errc::invalid_name);
  auto r = amp::sealed_envelope::seal({.from = "alice", .to = "BAD", .body = "1"}, "ns1", now);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == amp::errc::invalid_envelope);
  CHECK(r.error().path() == "/to");
  r = amp::sealed_envelope::seal({.from = "alice", .to = "bob", .body = "1", .type = "\x01"}, "ns1",
                                 now);
  REQUIRE_FALSE(r);
  CHECK(r.error().path() == "/type");
}
