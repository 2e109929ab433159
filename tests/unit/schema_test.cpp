#include <catch2/catch.hpp>

#include <pthread.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "amp/schema.hpp"

namespace {

const char* const order_schema = R"({
  "$schema": "http://json-schema.org/draft-07/schema#",
  "type": "object",
  "required": ["id", "items"],
  "properties": {
    "id": {"type": "string", "minLength": 1, "maxLength": 8, "pattern": "^[a-z0-9]{1,8}$"},
    "note": {"type": "string"},
    "priority": {"enum": ["low", "high", {"custom": [1, 2]}]},
    "version": {"const": 2},
    "count": {"type": "integer", "minimum": 0, "maximum": 10},
    "tags": {"type": "array", "uniqueItems": true, "items": {"type": "string"}},
    "items": {
      "type": "array",
      "maxItems": 5,
      "items": {
        "type": "object",
        "required": ["name"],
        "properties": {
          "name": {"type": "string"},
          "size": {"type": "number", "exclusiveMinimum": 0}
        },
        "additionalProperties": false
      }
    },
    "meta": {"type": "object", "additionalProperties": {"$ref": "#/definitions/leaf"}}
  },
  "definitions": {
    "leaf": {"type": "object", "properties": {"x": {"type": "string"}}}
  }
})";

amp::json_schema order() {
  return amp::json_schema::parse(order_schema).value();
}

// The error of a document that must fail validation.
amp::error failure(const amp::json_schema& schema, std::string_view doc) {
  auto r = schema.validate(doc);
  REQUIRE_FALSE(r.has_value());
  return r.error();
}

}  // namespace

TEST_CASE("a schema accepts documents that match it", "[schema]") {
  const auto s = order();
  for (const char* doc : {
           R"({"id":"a1","items":[]})",
           R"({"id":"a1","items":[{"name":"x","size":1.5},{"name":"y"}],"count":3})",
           R"({"id":"a1","items":[],"priority":"high","version":2,"tags":["a","b"]})",
           R"({"id":"a1","items":[],"priority":{"custom":[1,2]}})",
           R"({"id":"a1","items":[],"version":2.0,"count":10.0})",
           R"({"id":"a1","items":[],"meta":{"k":{"x":"s"},"2":{}},"unknown":[null]})",
       }) {
    CAPTURE(doc);
    auto r = s.validate(doc);
    if (!r) {
      FAIL(r.error().to_string());
    }
  }
}

TEST_CASE("a validation failure names the deepest failing JSON Pointer", "[schema]") {
  const auto s = order();
  struct bad_case {
    const char* doc;
    const char* path;
    const char* reason;
  };
  const bad_case cases[] = {
      {R"({"id":"a1","items":[{"name":"a"},{"name":"b"},{"name":7}]})", "/items/2/name",
       "value type not permitted by 'type' constraint (it is a number)"},
      {R"({"id":"a1","items":[{"name":"a"},{"size":1}]})", "/items/1/name",
       "required member \"name\" is missing"},
      {R"({"id":"a1","items":[{"name":"a","size":0}]})", "/items/0/size",
       "expected number greater than"},
      {R"({"id":"a1","items":[{"name":"a","colour":"red"}]})", "/items/0/colour",
       "member \"colour\" is not allowed"},
      {R"({"items":[]})", "/id", "required member \"id\" is missing"},
      {R"({"id":"","items":[]})", "/id", "string should be no fewer than 1 characters"},
      {R"({"id":"ABC","items":[]})", "/id", "failed to match regex"},
      {R"({"id":"abcdefghi","items":[]})", "/id", "string should be no more than 8 characters"},
      {R"({"id":"a1","items":[],"count":11})", "/count", "expected number less than or equal to"},
      {R"({"id":"a1","items":[],"count":1.5})", "/count",
       "value type not permitted by 'type' constraint (it is a number)"},
      {R"({"id":"a1","items":[],"priority":"urgent"})", "/priority",
       "failed to match against any enum values"},
      {R"({"id":"a1","items":[],"priority":{"custom":[2,1]}})", "/priority",
       "failed to match against any enum values"},
      {R"({"id":"a1","items":[],"version":3})", "/version", "'const' constraint"},
      {R"({"id":"a1","items":[],"tags":["a","b","a"]})", "/tags", "uniqueness"},
      {R"({"id":"a1","items":[{},{},{},{},{},{}]})", "/items/0/name", "is missing"},
      {R"({"id":"a1","items":[],"meta":{"k":{"x":1}}})", "/meta/k/x", "'type' constraint"},
      {R"({"id":"a1","items":[],"meta":{"2":{"x":[]}}})", "/meta/2/x", "(it is an array)"},
      {R"({"id":"a1","items":[],"meta":{"a/b":{"x":1},"t~":{}}})", "/meta/a~1b/x",
       "'type' constraint"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.doc);
    const auto e = failure(s, c.doc);
    REQUIRE(e.code() == amp::errc::invalid_envelope);
    REQUIRE(e.path() == c.path);
    REQUIRE_THAT(e.message(), Catch::StartsWith(std::string("at ") + c.path + ": "));
    REQUIRE_THAT(e.message(), Catch::Contains(c.reason));
  }
}

TEST_CASE("a failure of the document itself has the empty path and says 'at the root'",
          "[schema]") {
  const auto s = order();
  for (const char* doc : {"[]", "\"order\"", "42", "null", "true"}) {
    CAPTURE(doc);
    const auto e = failure(s, doc);
    REQUIRE(e.code() == amp::errc::invalid_envelope);
    REQUIRE(e.path().empty());
    REQUIRE_THAT(e.message(), Catch::StartsWith("at the root: value type not permitted"));
  }
  const auto never = amp::json_schema::parse("false").value();
  const auto e = failure(never, "{}");
  REQUIRE(e.code() == amp::errc::invalid_envelope);
  REQUIRE(e.path().empty());
  REQUIRE_THAT(e.message(), Catch::StartsWith("at the root: "));
  REQUIRE(amp::json_schema::parse("true").value().validate("[1]").has_value());
}

TEST_CASE("a document that is not JSON is bad_request, not invalid_envelope", "[schema]") {
  const auto s = order();
  for (std::string_view doc : {std::string_view(""), std::string_view("{\"id\":"),
                               std::string_view("{'id':1}"), std::string_view("\"\xC3\x28\"")}) {
    const auto e = failure(s, doc);
    REQUIRE(e.code() == amp::errc::bad_request);
    REQUIRE_THAT(e.message(), Catch::StartsWith("not valid JSON: "));
    REQUIRE(e.path().empty());
  }
}

TEST_CASE("integers are numbers without a fraction, as draft 7 says", "[schema]") {
  const auto s = amp::json_schema::parse(R"({"type":"integer"})").value();
  REQUIRE(s.validate("3").has_value());
  REQUIRE(s.validate("-3.0").has_value());
  REQUIRE(s.validate("1e3").has_value());
  REQUIRE_FALSE(s.validate("3.5").has_value());
  REQUIRE_FALSE(s.validate("\"3\"").has_value());
  const auto n = amp::json_schema::parse(R"({"type":"number","maximum":1e20})").value();
  REQUIRE(n.validate("18446744073709551615").has_value());
  REQUIRE_FALSE(n.validate("1e21").has_value());
}

TEST_CASE("references into arrays and definitions resolve", "[schema]") {
  const auto s = amp::json_schema::parse(R"({
    "definitions": {"pair": [{"type": "string"}, {"type": "integer"}]},
    "properties": {"n": {"$ref": "#/definitions/pair/1"}, "s": {"$ref": "#/definitions/pair/0"}}
  })");
  REQUIRE(s.has_value());
  REQUIRE(s->validate(R"({"n":1,"s":"x"})").has_value());
  const auto e = failure(*s, R"({"n":"1"})");
  REQUIRE(e.path() == "/n");
}

TEST_CASE("a schema that is not JSON, or that valijson refuses, is bad_request", "[schema]") {
  auto refused = [](std::string_view schema) {
    auto r = amp::json_schema::parse(schema);
    REQUIRE_FALSE(r.has_value());
    const amp::error e = std::move(r).error();
    REQUIRE(e.code() == amp::errc::bad_request);
    return e.message();
  };
  REQUIRE_THAT(refused("{\"type\":"), Catch::StartsWith("not valid JSON: "));
  REQUIRE_THAT(refused(""), Catch::StartsWith("not valid JSON: "));
  REQUIRE_THAT(refused("42"), Catch::StartsWith("invalid JSON Schema: "));
  REQUIRE_THAT(refused(R"({"$ref":"#/definitions/missing"})"),
               Catch::StartsWith("invalid JSON Schema: "));
  REQUIRE_THAT(refused(R"({"required":"id"})"), Catch::StartsWith("invalid JSON Schema: "));
  REQUIRE_THAT(refused(R"({"type":"text"})"), Catch::StartsWith("invalid JSON Schema: "));
  REQUIRE_THAT(refused(R"({"$ref":"https://example.com/other.json"})"),
               Catch::StartsWith("invalid JSON Schema: "));
  REQUIRE_THAT(refused(R"({"properties":{"a":{"pattern":"(unclosed"}}})"),
               Catch::StartsWith(R"(invalid JSON Schema: the regular expression "(unclosed" )"
                                 "at /properties/a/pattern does not compile: "));
  REQUIRE_THAT(refused(R"({"properties":{"a":{"pattern":"(a)\\1"}}})"),
               Catch::StartsWith(R"(invalid JSON Schema: the regular expression "(a)\\1" )"
                                 "at /properties/a/pattern does not compile: "));
  REQUIRE_THAT(refused(R"({"properties":{"m":{"patternProperties":{"^a":{}}}}})"),
               Catch::StartsWith("invalid JSON Schema: patternProperties at "
                                 "/properties/m/patternProperties is not supported"));

  // "pattern" as a member name, or inside enum and const values, is not a regex.
  REQUIRE(amp::json_schema::parse(R"({"properties":{"pattern":{"type":"string"}},
                                      "enum":[{"pattern":"("}],"const":{"pattern":"["}})")
              .has_value());
}

TEST_CASE("embedded schemas are found by name", "[schema]") {
  auto envelope = amp::json_schema::embedded("envelope");
  REQUIRE(envelope.has_value());
  auto again = amp::json_schema::embedded("envelope");
  REQUIRE(again.has_value());
  auto missing = amp::json_schema::embedded("no-such-schema");
  REQUIRE_FALSE(missing.has_value());
  REQUIRE(missing.error().code() == amp::errc::not_found);
  REQUIRE_THAT(missing.error().message(), Catch::Contains("no-such-schema"));
}

TEST_CASE("one schema validates from 4 threads at once with the same results", "[schema]") {
  const auto s = order();
  const std::vector<std::string> docs = {
      R"({"id":"a1","items":[{"name":"x"}]})",
      R"({"id":"a1","items":[{"name":"a"},{"name":"b"},{"name":7}]})",
      R"({"id":"ABC","items":[]})",
      R"({"id":"a1","items":[],"priority":{"custom":[1,2]}})",
      R"({"id":"a1","items":[],"tags":["a","b","a"]})",
      R"([])",
      R"({"id":)",
  };
  std::vector<std::string> expected;
  for (const auto& d : docs) {
    auto r = s.validate(d);
    expected.push_back(r ? std::string("ok") : r.error().to_string() + "|" + r.error().path());
  }

  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const auto mine = s;  // copies share the parsed schema
      for (int i = 0; i < 300; ++i) {
        const std::size_t k = static_cast<std::size_t>(i + t) % docs.size();
        auto r = (i % 2 ? mine : s).validate(docs[k]);
        const std::string got =
            r ? std::string("ok") : r.error().to_string() + "|" + r.error().path();
        if (got != expected[k]) {
          ++mismatches[static_cast<std::size_t>(t)];
        }
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  REQUIRE(mismatches == std::vector<int>(4, 0));
}

namespace {

// Runs `body` on a thread with a 512 KiB stack, much less than the 8 MiB of a main thread:
// a matcher that recursed once per character would overflow it on the strings below.
void on_small_stack(std::function<void()> body) {
  pthread_attr_t attr;
  REQUIRE(pthread_attr_init(&attr) == 0);
  REQUIRE(pthread_attr_setstacksize(&attr, 512 * 1024) == 0);
  pthread_t thread;
  auto run = [](void* p) -> void* {
    (*static_cast<std::function<void()>*>(p))();
    return nullptr;
  };
  REQUIRE(pthread_create(&thread, &attr, run, &body) == 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
}

std::string quoted(const std::string& s) {
  return "\"" + s + "\"";
}

}  // namespace

TEST_CASE("a pattern is searched for, with its anchors, on strings of a million characters",
          "[schema]") {
  const auto word = amp::json_schema::parse(R"({"pattern":"^[a-z]+$"})").value();
  const auto inner = amp::json_schema::parse(R"({"pattern":"b{2}|zz"})").value();
  const auto nested = amp::json_schema::parse(R"({"pattern":"^(a+)+$"})").value();
  const std::string million(1000000, 'a');
  bool long_match = false;
  bool long_mismatch = false;
  bool middle = false;
  bool catastrophic = true;
  on_small_stack([&] {
    long_match = word.validate(quoted(million)).has_value();
    long_mismatch = word.validate(quoted(million + "1")).has_value();
    middle =
        inner.validate(quoted(std::string(500000, 'x') + "bb" + std::string(9, 'y'))).has_value();
    // Exponential for a backtracking matcher; linear for the automaton.
    catastrophic = nested.validate(quoted(std::string(5000, 'a') + "b")).has_value();
  });
  REQUIRE(long_match);
  REQUIRE_FALSE(long_mismatch);
  REQUIRE(middle);
  REQUIRE_FALSE(catastrophic);

  // Search semantics: unanchored patterns match anywhere, anchors hold only at the ends.
  REQUIRE(inner.validate(R"("azzb")").has_value());
  REQUIRE_FALSE(inner.validate(R"("abzb")").has_value());
  REQUIRE_FALSE(word.validate(R"("ab1")").has_value());
  REQUIRE_FALSE(word.validate(R"("1ab")").has_value());
  REQUIRE(word.validate("42").has_value());  // not a string: pattern does not apply
  const auto e = failure(word, R"("A")");
  REQUIRE(e.path().empty());
  REQUIRE_THAT(e.message(), Catch::Contains("failed to match regex"));

  // propertyNames applies a pattern to member names.
  const auto names = amp::json_schema::parse(R"({"propertyNames":{"pattern":"^[a-z]+$"}})").value();
  REQUIRE(names.validate(R"({"ab":1,"cd":2})").has_value());
  REQUIRE_FALSE(names.validate(R"({"ab":1,"C":2})").has_value());
}

TEST_CASE("format checks RFC 3339 dates and times by hand, other formats are not checked",
          "[schema]") {
  const auto date_time = amp::json_schema::parse(R"({"format":"date-time"})").value();
  const auto date = amp::json_schema::parse(R"({"format":"date"})").value();
  const auto time = amp::json_schema::parse(R"({"format":"time"})").value();
  for (const char* ok : {R"("2026-12-02T05:24:51Z")", R"("2026-12-02t05:24:51.123456789z")",
                         R"("2028-02-29T23:59:60+14:00")", R"("1999-12-31T00:00:00-05:30")"}) {
    CAPTURE(ok);
    REQUIRE(date_time.validate(ok).has_value());
  }
  for (const char* bad :
       {R"("2026-12-02 05:24:51Z")", R"("2026-12-02T05:24:51")", R"("2027-02-29T00:00:00Z")",
        R"("2026-13-01T00:00:00Z")", R"("2026-12-02T24:00:00Z")", R"("2026-12-02T05:24:51.Z")",
        R"("26-12-02T05:24:51Z")", R"("2026-12-02T05:24:51|05:00")", R"("")"}) {
    CAPTURE(bad);
    const auto e = failure(date_time, bad);
    REQUIRE_THAT(e.message(), Catch::Contains("string should be a valid date-time"));
  }
  REQUIRE(date.validate(R"("2000-02-29")").has_value());
  REQUIRE_FALSE(date.validate(R"("1900-02-29")").has_value());
  REQUIRE_FALSE(date.validate(R"("2000-02-29T00:00:00Z")").has_value());
  REQUIRE(time.validate(R"("05:24:51+01:00")").has_value());
  REQUIRE_FALSE(time.validate(R"("05:24+01:00")").has_value());
  // Not a string, or a format amp does not check: nothing to check.
  REQUIRE(date_time.validate("20261202").has_value());
  REQUIRE(amp::json_schema::parse(R"({"format":"email"})").value().validate("7").has_value());
  REQUIRE(amp::json_schema::parse(R"({"type":["string","integer"],"format":"email"})")
              .value()
              .validate("7")
              .has_value());

  bool long_fraction = true;
  on_small_stack([&] {
    long_fraction =
        date_time.validate(quoted("2026-12-02T05:24:51." + std::string(1000000, '1') + "Z"))
            .has_value();
  });
  REQUIRE(long_fraction);
}

TEST_CASE("uniqueItems compares values as JSON does and names the first equal pair", "[schema]") {
  const auto unique = amp::json_schema::parse(R"({"uniqueItems":true})").value();
  REQUIRE(unique.validate(R"([1,"1",[1],{"a":1},null,true,false,1.5])").has_value());
  const struct {
    const char* doc;
    const char* pair;
  } equal[] = {
      {R"([1,2,1.0])", "#0 and #2"},
      {R"([{"a":1,"b":[2]},{"b":[2.0],"a":1}])", "#0 and #1"},
      {R"(["x","y","y","x"])", "#1 and #2"},
      {R"([null,[],{},[],null])", "#1 and #3"},
  };
  for (const auto& c : equal) {
    CAPTURE(c.doc);
    const auto e = failure(unique, c.doc);
    REQUIRE(e.path().empty());
    REQUIRE_THAT(e.message(), Catch::Contains(std::string("indexes ") + c.pair) &&
                                  Catch::Contains("uniqueness"));
  }
  // 40,000 distinct items: a comparison of every pair would be 8e8 comparisons.
  std::string many = "[";
  for (int i = 0; i < 40000; ++i) {
    many += (i ? "," : "") + std::to_string(i);
  }
  REQUIRE(unique.validate(many + "]").has_value());
  REQUIRE_THAT(failure(unique, many + ",39999]").message(), Catch::Contains("#39999 and #40000"));
  REQUIRE(
      amp::json_schema::parse(R"({"uniqueItems":false})").value().validate("[1,1]").has_value());
}

TEST_CASE("a document with a great many errors is answered with the first ones", "[schema]") {
  const auto strings = amp::json_schema::parse(
                           R"({"properties":{"jobs":{"type":"array","items":{"type":"string"}}}})")
                           .value();
  std::string ints = R"({"jobs":[)";
  for (int i = 0; i < 200000; ++i) {
    ints += i ? ",1" : "1";
  }
  ints += "]}";
  const auto e = failure(strings, ints);
  REQUIRE(e.path() == "/jobs/0");
  REQUIRE_THAT(e.message(), Catch::Contains("(it is a number)"));

  // Errors gathered under anyOf are only reported when the branches are exhausted, so the
  // bounded search may end with none located: the root is named, and why.
  const auto either =
      amp::json_schema::parse(
          R"({"anyOf":[{"type":"array","items":{"type":"string"}},{"type":"string"}]})")
          .value();
  std::string array = "[";
  for (int i = 0; i < 100000; ++i) {
    array += i ? ",1" : "1";
  }
  const auto deep = failure(either, array + "]");
  REQUIRE(deep.path().empty());
  REQUIRE_THAT(deep.message(), Catch::Contains("the search for the failing value stopped after"));
  const auto small = failure(either, "[1]");
  REQUIRE(small.path() == "/0");
}
