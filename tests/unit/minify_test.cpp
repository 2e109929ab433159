// detail::minify: simdjson's minified text through a builder each thread keeps.

#include <simdjson.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "detail/minify.hpp"

namespace {

simdjson::dom::element parse(simdjson::dom::parser& parser, const std::string& text) {
  simdjson::dom::element e;
  REQUIRE(parser.parse(text).get(e) == simdjson::SUCCESS);
  return e;
}

}  // namespace

TEST_CASE("detail::minify writes what simdjson::minify writes, value after value", "[minify]") {
  simdjson::dom::parser parser;
  // Long values first: the builder's buffer must be cleared, not only overwritten.
  const std::vector<std::string> texts = {
      R"({ "a" : [ 1 , 2.50 , 1e2 , true , null ] , "b" : { "c" : "\u00e9\n\"" } })",
      R"([1, 2])",
      R"("short")",
      R"(12345678901234567890)",
      R"({})",
      R"(  null  )",
  };
  for (const auto& text : texts) {
    CAPTURE(text);
    auto e = parse(parser, text);
    CHECK(amp::detail::minify(e) == simdjson::minify(e));
  }
  auto object = parse(parser, texts[0]).get_object().value();
  CHECK(amp::detail::minify(object) == simdjson::minify(object));
  CHECK(amp::detail::minify(object) == R"({"a":[1,2.5,100.0,true,null],"b":{"c":"é\n\""}})");
}

TEST_CASE("detail::minify writes values past the size a thread keeps its buffer for", "[minify]") {
  simdjson::dom::parser parser;
  std::string big = "[";
  for (int i = 0; i < 40000; ++i) big += (i ? ",\"0123456789\"" : "\"0123456789\"");
  big += "]";
  auto e = parse(parser, big);
  const std::string expected = simdjson::minify(e);
  REQUIRE(expected.size() > 256 * 1024);
  CHECK(amp::detail::minify(e) == expected);
  // The next value, after the builder was dropped, is written whole.
  auto small = parse(parser, R"({"k": [true]})");
  CHECK(amp::detail::minify(small) == R"({"k":[true]})");
}

TEST_CASE("detail::minify keeps one builder per thread", "[minify]") {
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &mismatches] {
      simdjson::dom::parser parser;
      for (int i = 0; i < 500; ++i) {
        std::string text = "{\"thread\": " + std::to_string(t) + ", \"i\": " + std::to_string(i) +
                           ", \"pad\": \"" + std::string(static_cast<std::size_t>(i % 50), 'x') +
                           "\"}";
        simdjson::dom::element e;
        if (parser.parse(text).get(e) != simdjson::SUCCESS ||
            amp::detail::minify(e) != simdjson::minify(e)) {
          ++mismatches[static_cast<std::size_t>(t)];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}
