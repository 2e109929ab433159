// detail::surely_valid_frame, the hand-written fast path of the frame schemas: it never
// accepts what `frames/<op>` or `frames/names` refuses, and it accepts the frames clients
// send on the task and inbox path.

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "amp/json.hpp"
#include "amp/schema.hpp"
#include "detail/frame_check.hpp"
#include "detail/simdjson_adapter.hpp"
#include "support/json_variants.hpp"

namespace {

namespace dom = simdjson::dom;

using members = amp::testing::json_members;
using amp::testing::object_of;
using amp::testing::q;
using amp::testing::repeat;

// Raw JSON values to put in a member: valid and broken ones of every kind the schemas check.
std::vector<std::string> candidate_values() {
  return {
      "0",
      "1",
      "-1",
      "2",
      "100",
      "101",
      "86400000",
      "86400001",
      "9007199254740991",
      "9007199254740992",
      "-9007199254740991",
      "-9007199254740992",
      "18446744073709551615",
      "1.0",
      "1.5",
      "1e3",
      "null",
      "true",
      "{}",
      "[]",
      R"({"k":"v"})",
      R"({"k":1})",
      R"({"k":"v","k":2})",
      R"([1,"a"])",
      R"("")",
      q("t_1"),
      q("t_0mxa9rpyu000kejkpe4d"),
      q("t_"),
      q("t_A1"),
      q("t-1"),
      q("t_" + repeat("a", 62)),
      q("t_" + repeat("a", 63)),
      q("bench"),
      q("Bench"),
      q("1job"),
      q("a" + repeat("b", 63)),
      q("a" + repeat("b", 64)),
      q("ack"),
      q("nack"),
      q("claim"),
      q("complete"),
      q("submit"),
      q("heartbeat"),
      q("req-1"),
      q(repeat("x", 64)),
      q(repeat("x", 65)),
      q(repeat("\xc3\xa9", 64)),
      q(repeat("\xc3\xa9", 65)),
      q(repeat("x", 256)),
      q(repeat("x", 257)),
      q(repeat("\xc3\xa9", 128)),
      q(repeat("\xc3\xa9", 129)),
      q(std::string("nul\0x", 5)),
      q("tab\there"),
  };
}

// A valid frame of each op with a fast path, with every member it knows.
const std::vector<std::pair<std::string, members>> k_valid = {
    {"ack", {{"op", q("ack")}, {"id", "7"}, {"seq", "12"}}},
    {"nack", {{"op", q("nack")}, {"id", q("n-1")}, {"seq", "12"}, {"delay_ms", "500"}}},
    {"claim", {{"op", q("claim")}, {"id", "8"}, {"task", q("t_0mxa9rpyu000kejkpe4d")}}},
    {"complete",
     {{"op", q("complete")},
      {"id", "9"},
      {"task", q("t_0mxa9rpyu000kejkpe4d")},
      {"attempt", "1"},
      {"result", R"({"ok":true})"}}},
    {"submit",
     {{"op", q("submit")},
      {"id", "10"},
      {"job", q("bench")},
      {"body", R"({"n":1})"},
      {"type", q("review.request")},
      {"headers", R"({"k":"v"})"},
      {"max_attempts", "3"},
      {"idempotency_key", q("order-17")}}},
    {"heartbeat",
     {{"op", q("heartbeat")},
      {"id", "11"},
      {"task", q("t_0mxa9rpyu000kejkpe4d")},
      {"attempt", "2"}}},
};

}  // namespace

TEST_CASE("the frame fast path accepts only what the frame schemas accept", "[frames]") {
  auto names = amp::json_schema::embedded("frames/names").value();
  const auto values = candidate_values();
  std::mt19937 rng(5122026);
  dom::parser parser;
  for (const auto& [op, valid] : k_valid) {
    DYNAMIC_SECTION(op) {
      auto shape = amp::json_schema::embedded("frames/" + op).value();
      int fast = 0;
      int accepted = 0;
      int checked = 0;
      // A frame with a doubled member is not counted: the fast path leaves it to the schemas.
      auto check = [&](const std::string& json, bool doubled = false) {
        dom::element root;
        REQUIRE_FALSE(parser.parse(json).get(root));
        const bool surely = amp::detail::surely_valid_frame(op, root);
        const bool ok = amp::detail::schema_access::validate(shape, root).has_value() &&
                        amp::detail::schema_access::validate(names, root).has_value();
        INFO(json.substr(0, 300));
        if (surely) CHECK(ok);
        if (!doubled) {
          fast += surely;
          accepted += ok;
        }
        ++checked;
      };
      check(object_of(valid));
      CHECK(fast == 1);
      // Each member replaced by each candidate, doubled either way round, and removed.
      amp::testing::for_each_variant(valid, values, check);
      // Random frames: each member present or not, with a random candidate or its valid value;
      // members of the other ops and unknown ones added.
      std::uniform_int_distribution<std::size_t> pick(0, values.size() - 1);
      std::uniform_int_distribution<int> coin(0, 3);
      for (int i = 0; i < 1500; ++i) {
        members m;
        for (const auto& [k, v] : valid) {
          const int c = coin(rng);
          if (c == 0 && k != "op") continue;
          m.emplace_back(k, c == 1 ? values[pick(rng)] : v);
        }
        bool doubled = false;
        for (const auto* other : {"seq", "task", "job", "body", "attempt", "delay_ms", "extra"}) {
          if (coin(rng) != 0) continue;
          for (const auto& [k, v] : m) doubled = doubled || k == other;
          m.emplace_back(other, values[pick(rng)]);
        }
        check(object_of(m), doubled);
      }
      for (const auto* doc : {"1", "[]", "null", "\"x\"", "{}"}) check(doc);
      CHECK(checked > 1500);
      // The fast path must also do its work: most frames the schemas accept take it (not
      // those with a number such as 1.0 or 1e3 where an integer goes, or a NUL in a string).
      CHECK(fast > accepted * 9 / 10);
    }
  }
}

TEST_CASE("the frame fast path leaves other ops and a frame of another op to the schemas",
          "[frames]") {
  dom::parser parser;
  dom::element root;
  REQUIRE_FALSE(parser.parse(std::string(R"({"op":"send","to":"bob","body":1})")).get(root));
  CHECK_FALSE(amp::detail::surely_valid_frame("send", root));
  REQUIRE_FALSE(parser.parse(std::string(R"({"op":"claim","seq":3})")).get(root));
  CHECK_FALSE(amp::detail::surely_valid_frame("ack", root));
  REQUIRE_FALSE(parser.parse(std::string(R"({"op":"ack","seq":3})")).get(root));
  CHECK(amp::detail::surely_valid_frame("ack", root));
}
