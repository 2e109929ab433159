#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "amp/json.hpp"

namespace {

std::string quoted_char(char c) {
  return amp::json_quote(std::string(1, c));
}

}  // namespace

TEST_CASE("json_quote escapes quotes, backslashes and every control character", "[json]") {
  REQUIRE(amp::json_quote("") == R"("")");
  REQUIRE(amp::json_quote("plain") == R"("plain")");
  REQUIRE(amp::json_quote(R"(say "hi")") == R"("say \"hi\"")");
  REQUIRE(amp::json_quote(R"(C:\dir\)") == R"("C:\\dir\\")");
  REQUIRE(amp::json_quote("/") == R"("/")");

  REQUIRE(quoted_char('\b') == R"("\b")");
  REQUIRE(quoted_char('\f') == R"("\f")");
  REQUIRE(quoted_char('\n') == R"("\n")");
  REQUIRE(quoted_char('\r') == R"("\r")");
  REQUIRE(quoted_char('\t') == R"("\t")");
  REQUIRE(amp::json_quote(std::string(1, '\0')) == R"("\u0000")");
  REQUIRE(quoted_char('\x01') == R"("\u0001")");
  REQUIRE(quoted_char('\x1f') == R"("\u001f")");
  REQUIRE(quoted_char('\x7f') == "\"\x7f\"");  // DEL is not a JSON control character

  // Every byte below 0x20 is escaped, and the result is valid JSON.
  for (int c = 0; c < 0x20; ++c) {
    const std::string q = amp::json_quote(std::string(1, static_cast<char>(c)));
    CAPTURE(c, q);
    REQUIRE(q.size() > 3);
    REQUIRE(q[1] == '\\');
    REQUIRE(amp::json_check(q).has_value());
  }
}

TEST_CASE("json_quote passes UTF-8 through untouched", "[json]") {
  const std::string text =
      "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xE2\x80\xA8";  // é € 😀 U+2028
  REQUIRE(amp::json_quote(text) == "\"" + text + "\"");
  REQUIRE(amp::json_check(amp::json_quote(text)).has_value());
}

TEST_CASE("json_writer places commas and colons in nested objects and arrays", "[json]") {
  amp::json_writer w;
  w.begin_object()
      .key("a")
      .integer(1)
      .key("b")
      .begin_array()
      .integer(2)
      .string("x")
      .begin_object()
      .end_object()
      .begin_array()
      .end_array()
      .null()
      .boolean(true)
      .boolean(false)
      .end_array()
      .key("c")
      .begin_object()
      .key("d")
      .begin_object()
      .key("e")
      .raw(R"({"pre":[1,2]})")
      .end_object()
      .end_object()
      .key("f")
      .string("")
      .end_object();
  REQUIRE(w.complete());
  REQUIRE(w.str() ==
          R"({"a":1,"b":[2,"x",{},[],null,true,false],"c":{"d":{"e":{"pre":[1,2]}}},"f":""})");
  REQUIRE(amp::json_check(w.str()).has_value());
}

TEST_CASE("json_writer escapes keys as well as values", "[json]") {
  amp::json_writer w;
  w.begin_object().key("we\"ird\n").string("v\\").end_object();
  REQUIRE(w.str() == R"({"we\"ird\n":"v\\"})");
}

TEST_CASE("json_writer writes scalars at the top level and can be reused after take", "[json]") {
  amp::json_writer w;
  REQUIRE_FALSE(w.complete());
  w.string("x");
  REQUIRE(w.complete());
  REQUIRE(w.take() == R"("x")");
  REQUIRE(w.str().empty());
  w.begin_array().integer(1).end_array();
  REQUIRE(w.take() == "[1]");
  w.begin_array();
  REQUIRE_FALSE(w.complete());
}

TEST_CASE("json_writer writes integers exactly across their whole range", "[json]") {
  amp::json_writer w;
  w.begin_array()
      .integer(0)
      .integer(-1)
      .integer(std::numeric_limits<std::int64_t>::min())
      .integer(std::numeric_limits<std::int64_t>::max())
      .integer(std::numeric_limits<std::uint64_t>::max())
      .integer(static_cast<short>(-7))
      .integer(42u)
      .end_array();
  REQUIRE(w.str() == "[0,-1,-9223372036854775808,9223372036854775807,18446744073709551615,-7,42]");
  REQUIRE(amp::json_check(w.str()).has_value());
}

TEST_CASE("json_writer writes doubles in their shortest round-trip form and NaN/Inf as null",
          "[json]") {
  auto one = [](double d) {
    amp::json_writer w;
    w.number(d);
    return w.take();
  };
  REQUIRE(one(0.1) == "0.1");
  REQUIRE(one(1.5) == "1.5");
  REQUIRE(one(5.0) == "5");
  REQUIRE(one(-0.25) == "-0.25");
  REQUIRE(one(1e21) == "1e+21");
  REQUIRE(one(1e-7) == "1e-07");
  REQUIRE(one(0.1 + 0.2) == "0.30000000000000004");
  REQUIRE(std::stod(one(3.141592653589793)) == 3.141592653589793);
  REQUIRE(one(std::numeric_limits<double>::max()) == "1.7976931348623157e+308");
  REQUIRE(one(std::nan("")) == "null");
  REQUIRE(one(std::numeric_limits<double>::infinity()) == "null");
  REQUIRE(one(-std::numeric_limits<double>::infinity()) == "null");
  for (double d : {0.1, 1e21, 1e-7, 123456.789, -2.2250738585072014e-308}) {
    REQUIRE(amp::json_check(one(d)).has_value());
  }
}

TEST_CASE("json_check accepts one JSON value and names what is wrong otherwise", "[json]") {
  for (const char* ok : {"{}", "[]", "0", "-1.5e3", "\"s\"", "true", "null", "  {\"a\":[1]}  "}) {
    CAPTURE(ok);
    REQUIRE(amp::json_check(ok).has_value());
  }

  auto fails = [](std::string_view text) {
    auto r = amp::json_check(text);
    REQUIRE_FALSE(r.has_value());
    REQUIRE(r.error().code() == amp::errc::bad_request);
    REQUIRE(r.error().message().rfind("not valid JSON: ", 0) == 0);
    return r.error().message();
  };
  REQUIRE_THAT(fails(""), Catch::Contains("Empty"));
  REQUIRE_THAT(fails("   "), Catch::Contains("Empty"));
  REQUIRE_THAT(fails("{\"a\":1"), Catch::Contains("improper structure"));
  REQUIRE_THAT(fails("1 2"), Catch::Contains("improper structure"));
  REQUIRE_THAT(fails("{\"a\":1}x"), Catch::Contains("improper structure"));
  REQUIRE_THAT(fails("\"\xff\""), Catch::Contains("UTF-8"));
  REQUIRE_THAT(fails("[1e400]"), Catch::Contains("number"));
  fails("{a:1}");
  fails("[01]");
  fails("'single'");
  fails(std::string_view("[1,\0]", 5));
}
