// detail::simple_pattern: patterns of the simplest shape matched by hand, exactly as
// std::regex (ECMAScript, over bytes) matches them.

#include <catch2/catch.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "detail/simple_pattern.hpp"

namespace {

using amp::detail::simple_pattern;

// Bytes that the patterns below tell apart: letters, digits, the name punctuation, spaces,
// controls, DEL and bytes of UTF-8 sequences.
const std::string k_alphabet = std::string("azAZmt_09-.$^\\ \t\n\r\x0b\x0c") + '\0' +
                               std::string("\x01\x1f\x7f\x80\xc3\xa9\xff", 7);

std::string random_string(std::mt19937& rng, std::size_t max_len) {
  std::uniform_int_distribution<std::size_t> len(0, max_len);
  std::uniform_int_distribution<std::size_t> pick(0, k_alphabet.size() - 1);
  std::string s(len(rng), ' ');
  for (auto& c : s) c = k_alphabet[pick(rng)];
  return s;
}

// Strings that suit `pattern` more often than random ones: made of what its first class
// admits, around the lengths its bounds name.
std::string near_miss(std::mt19937& rng, const std::string& base, std::size_t len) {
  std::uniform_int_distribution<std::size_t> pick(0, base.size() - 1);
  std::string s(len, ' ');
  for (auto& c : s) c = base[pick(rng)];
  return s;
}

}  // namespace

TEST_CASE("a simple pattern matches exactly what std::regex matches", "[schema]") {
  const std::vector<std::string> patterns = {
      "^[a-z][a-z0-9_-]{0,63}$",
      "^[a-z0-9][a-z0-9_-]{0,63}$",
      "^t_[0-9a-z]{1,62}$",
      "^[^\\x00-\\x1f\\x7f]{1,512}$",
      "^[\\s\\S]{1,256}$",
      "^$",
      "^a$",
      "^ab?$",
      "^a\\.b*$",
      "^[-a]+$",
      "^[a-]{2}$",
      "^[^a-z]{2,}$",
      "^\\d\\D\\w\\W\\s\\S$",
      "^[\\d_]{3,5}$",
      "^x\\-y\\/z\\$$",
      "^[\\t\\n\\x41-\\x43]*$",
      "^[^\\s]{0,3}$",
      "^\\w{1}$",
  };
  std::mt19937 rng(20261204);
  for (const auto& pattern : patterns) {
    INFO("pattern " << pattern);
    auto simple = simple_pattern::parse(pattern);
    REQUIRE(simple);
    const std::regex re(pattern, std::regex::ECMAScript);
    auto check = [&](const std::string& s) {
      INFO("input of " << s.size() << " bytes: " << s);
      CHECK(simple->matches(s) == std::regex_search(s, re));
    };
    for (int i = 0; i < 3000; ++i) check(random_string(rng, 8));
    for (std::size_t len : {0, 1, 2, 61, 62, 63, 64, 65, 255, 256, 257, 511, 512, 513}) {
      for (int i = 0; i < 20; ++i) check(near_miss(rng, "abz09_-t.", len));
      check(std::string(len, 'a'));
    }
  }
}

TEST_CASE("patterns of other shapes are not simple and stay with std::regex", "[schema]") {
  for (const char* pattern : {
           "",
           "^",
           "a",
           "^a",
           "a$",
           "^a*b$",          // a quantifier before the last atom
           "^a+?$",          // lazy
           "^(a)$",          // groups
           "^a|b$",          // alternation
           "^.$",            // any character
           "^[]$",           // empty class
           "^[^]$",          // any character
           "^[[:alpha:]]$",  // a POSIX class
           "^[\\d-z]$",      // a range from a class
           "^[z-a]$",        // a backwards range
           "^\\x80$",        // beyond ASCII
           "^\u00e9$",       // beyond ASCII
           "^\\b$",          // an assertion
           "^\\1$",          // a back-reference
           "^a{2,1}$",       // a backwards count
           "^a{,3}$",        // no lower count
           "^a{1234567}$",   // a count beyond what this is for
           "^a\\$",          // the $ is escaped: no end anchor
           "^a{1}{2}$",      // a quantifier on a quantifier
       }) {
    INFO("pattern " << pattern);
    CHECK_FALSE(simple_pattern::parse(pattern));
  }
}
