// detail::surely_valid_envelope, the hand-written fast path of the envelope schema: it
// never accepts what the schema refuses, and it accepts the envelopes amp writes.

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "amp/json.hpp"
#include "amp/schema.hpp"
#include "detail/envelope_check.hpp"
#include "detail/simdjson_adapter.hpp"
#include "support/json_variants.hpp"

namespace {

namespace dom = simdjson::dom;

using amp::testing::json_members;
using amp::testing::object_of;
using amp::testing::q;
using amp::testing::repeat;

// Raw JSON values to put in a member: valid and broken ones of every kind the schema checks.
std::vector<std::string> candidate_values() {
  std::vector<std::string> v = {
      "1",
      "null",
      "true",
      "{}",
      "[]",
      R"({"a":"b"})",
      R"("")",
      q("alice"),
      q("$broker"),
      q("Alice"),
      q("1abc"),
      q("a-b_c9"),
      q("a" + repeat("b", 63)),
      q("a" + repeat("b", 64)),
      q("news.eu"),
      q("news..eu"),
      q("news."),
      q(".news"),
      q(repeat("a.", 7) + "a"),
      q(repeat("a.", 8) + "a"),
      q("0day.x-y"),
      q("m-1"),
      q("id with spaces"),
      q("tab\there"),
      q("del\x7f"),
      q(std::string("nul\0x", 5)),
      q("\xc3\xa9t\xc3\xa9"),
      q(repeat("x", 128)),
      q(repeat("x", 129)),
      q(repeat("\xc3\xa9", 128)),
      q(repeat("\xc3\xa9", 129)),
      q(repeat("\xe2\x82\xac", 128)),
      q(repeat("x", 256)),
      q(repeat("x", 257)),
      q(repeat("\xf0\x9f\x98\x80", 128)),
      q(repeat("\xf0\x9f\x98\x80", 129)),
      q("review.request"),
      q("Review.Request_2"),
      q(".review"),
      q("a/b"),
      q("2026-11-30T12:00:00.123Z"),
      q("2026-11-30t12:00:00z"),
      q("2026-11-30T12:00:00+01:00"),
      q("2026-11-30T12:00:00.123456789-23:59"),
      q("2026-11-30T12:00:00.1234567890Z"),
      q("2026-11-30T12:00:00.Z"),
      q("2026-11-30 12:00:00Z"),
      q("2026-11-30T12:00:00"),
      q("2026-13-45T99:99:99Z"),
      q("2026-11-30T12:00:00+0100"),
      q("26-11-30T12:00:00Z"),
      R"({"k":"v","trace":"abc"})",
      R"({"":"v"})",
      R"({"k":1})",
      R"({"k":"v","k":"w"})",
      "{" + q(repeat("h", 129)) + ":\"v\"}",
      "{" + q("ctl\x01") + ":\"v\"}",
      R"({"k":)" + q(repeat("v", 4096)) + "}",
      R"({"k":)" + q(repeat("v", 4097)) + "}",
      R"({"k":)" + q(repeat("\xc3\xa9", 4096)) + "}",
      R"({"k":)" + q(std::string("a\0b", 3) + repeat("v", 5000)) + "}",
      // the `operation` member of an operation's branch
      R"({"id":"o_1","branch":"bravo","attempt":1,"reply_by":null})",
      R"({"id":"o_1","branch":"bravo","attempt":2,"reply_by":"2026-11-30T12:00:30.000Z"})",
      R"({"id":"o_1","branch":"bravo","attempt":1,"reply_by":null,"more":1})",
      R"({"id":"o_1","branch":"bravo","attempt":0,"reply_by":null})",
      R"({"id":"o_1","branch":"bravo","attempt":-1,"reply_by":null})",
      R"({"id":"o_1","branch":"bravo","attempt":1.0,"reply_by":null})",
      R"({"id":"o_1","branch":"bravo","attempt":1.5,"reply_by":null})",
      R"({"id":"o_1","branch":"bravo","attempt":"1","reply_by":null})",
      R"({"id":"o_1","branch":"bravo","attempt":2147483647,"reply_by":null})",
      R"({"id":"o_1","branch":"bravo","attempt":2147483648,"reply_by":null})",
      R"({"id":"o_1","branch":"bravo","attempt":18446744073709551615,"reply_by":null})",
      R"({"id":"t_1","branch":"bravo","attempt":1,"reply_by":null})",
      R"({"id":"o_","branch":"bravo","attempt":1,"reply_by":null})",
      R"({"id":"o_A","branch":"bravo","attempt":1,"reply_by":null})",
      R"({"id":"o_)" + repeat("z", 63) + R"(","branch":"bravo","attempt":1,"reply_by":null})",
      R"({"id":"o_1","branch":"Bravo","attempt":1,"reply_by":null})",
      R"({"id":"o_1","branch":"$broker","attempt":1,"reply_by":null})",
      R"({"id":"o_1","branch":"bravo","attempt":1,"reply_by":"soon"})",
      R"({"id":"o_1","branch":"bravo","attempt":1,"reply_by":1})",
      R"({"id":"o_1","branch":"bravo","attempt":1})",
      R"({"id":"o_1","branch":"bravo","reply_by":null})",
      R"({"branch":"bravo","attempt":1,"reply_by":null})",
  };
  auto many = [](int n) {
    std::string o = "{";
    for (int i = 0; i < n; ++i) o += (i ? "," : "") + q("h" + std::to_string(i)) + ":\"v\"";
    return o + "}";
  };
  v.push_back(many(64));
  v.push_back(many(65));
  return v;
}

const json_members k_valid = {
    {"id", q("m-1")},
    {"from", q("alice")},
    {"to", q("bob")},
    {"ns", q("demo")},
    {"ts", q("2026-11-30T12:00:00.123Z")},
    {"body", R"({"text":"hi"})"},
    {"type", q("review.request")},
    {"headers", R"({"k":"v"})"},
    {"reply_to", q("alice")},
    {"correlation", q("c-1")},
    {"operation", R"({"id":"o_1","branch":"bob","attempt":1,"reply_by":null})"},
};

}  // namespace

TEST_CASE("the envelope fast path accepts only what the envelope schema accepts", "[envelope]") {
  auto schema = amp::json_schema::embedded("envelope").value();
  const auto values = candidate_values();
  std::mt19937 rng(4122026);
  dom::parser parser;
  int fast = 0;
  int accepted = 0;
  int checked = 0;
  auto check = [&](const std::string& json, bool /*doubled*/ = false) {
    dom::element root;
    REQUIRE_FALSE(parser.parse(json).get(root));
    const bool surely = amp::detail::surely_valid_envelope(root);
    const bool valid = amp::detail::schema_access::validate(schema, root).has_value();
    INFO(json.substr(0, 300));
    if (surely) CHECK(valid);
    fast += surely;
    accepted += valid;
    ++checked;
  };
  check(object_of(k_valid));
  CHECK(fast == 1);
  // Each member replaced by each candidate, doubled either way round, and removed.
  amp::testing::for_each_variant(k_valid, values, check);
  // Random envelopes: each member present or not, with a random candidate or its valid value.
  std::uniform_int_distribution<std::size_t> pick(0, values.size() - 1);
  std::uniform_int_distribution<int> coin(0, 3);
  for (int i = 0; i < 4000; ++i) {
    json_members members;
    for (const auto& [k, v] : k_valid) {
      const int c = coin(rng);
      if (c == 0) continue;
      members.emplace_back(k, c == 1 ? values[pick(rng)] : v);
    }
    if (coin(rng) == 0) members.emplace_back("extra", values[pick(rng)]);
    check(object_of(members));
  }
  for (const auto* doc : {"1", "[]", "null", "\"x\""}) check(doc);
  // The fast path must also do its work: most envelopes the schema accepts take it.
  CHECK(checked > 5000);
  CHECK(fast > accepted * 9 / 10);
}
