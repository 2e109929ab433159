#include <catch2/catch.hpp>

#include <algorithm>
#include <compare>
#include <concepts>
#include <cstdint>
#include <random>
#include <regex>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "amp/names.hpp"

namespace {

using amp::job_name;
using amp::namespace_name;
using amp::operation_id;
using amp::participant_name;
using amp::sink_name;
using amp::task_id;
using amp::topic;
using amp::topic_pattern;

bool printable_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f;
  });
}

// The outcome of T::make(value), with the checks every outcome must pass: a valid value
// keeps its spelling; an invalid one is invalid_name with a printable ASCII message.
struct outcome {
  bool ok = false;
  std::string message;
};

template <class T>
outcome try_make(std::string_view value) {
  auto r = T::make(value);
  if (r.has_value()) {
    REQUIRE(r.value().str() == value);
    REQUIRE(r.value().view() == value);
    return {true, {}};
  }
  INFO("value: " << amp::quoted(value) << ", message: " << r.error().message());
  REQUIRE(r.error().code() == amp::errc::invalid_name);
  REQUIRE_FALSE(r.error().message().empty());
  REQUIRE(printable_ascii(r.error().message()));
  return {false, r.error().message()};
}

template <class T>
std::string rejection(std::string_view value) {
  auto o = try_make<T>(value);
  INFO("value: " << amp::quoted(value));
  REQUIRE_FALSE(o.ok);
  return o.message;
}

template <class T>
T must(std::string_view value) {
  auto r = T::make(value);
  INFO("value: " << amp::quoted(value));
  REQUIRE(r.has_value());
  return std::move(r).value();
}

// Independent oracles: the grammars of spec §2 as regular expressions.
const std::regex& name_regex() {
  static const std::regex re("[a-z][a-z0-9_-]{0,63}");
  return re;
}
const std::regex& topic_regex() {
  static const std::regex re("[a-z0-9][a-z0-9_-]{0,63}(\\.[a-z0-9][a-z0-9_-]{0,63}){0,7}");
  return re;
}
const std::regex& pattern_regex() {
  static const std::regex re(
      "(?:[a-z0-9][a-z0-9_-]{0,63}|\\*)(?:\\.(?:[a-z0-9][a-z0-9_-]{0,63}|\\*)){0,7}"
      "|(?:(?:[a-z0-9][a-z0-9_-]{0,63}|\\*)\\.){0,7}>");
  return re;
}
const std::regex& task_regex() {
  static const std::regex re("t_[0-9a-z]{1,62}");
  return re;
}
bool full_match(const std::string& s, const std::regex& re) {
  return std::regex_match(s.begin(), s.end(), re);
}

template <class T>
constexpr std::string_view label_of = "";
template <>
constexpr std::string_view label_of<namespace_name> = "namespace";
template <>
constexpr std::string_view label_of<participant_name> = "participant name";
template <>
constexpr std::string_view label_of<job_name> = "job name";
template <>
constexpr std::string_view label_of<sink_name> = "sink name";

constexpr std::string_view name_body = "abcdefghijklmnopqrstuvwxyz0123456789_-";
constexpr std::string_view token_body = "abcdefghijklmnopqrstuvwxyz0123456789_-";
constexpr std::string_view lower = "abcdefghijklmnopqrstuvwxyz";
constexpr std::string_view lower_digit = "abcdefghijklmnopqrstuvwxyz0123456789";

std::string random_from(std::mt19937& rng, std::string_view first, std::string_view body,
                        std::size_t length) {
  std::string s;
  std::uniform_int_distribution<std::size_t> f(0, first.size() - 1);
  std::uniform_int_distribution<std::size_t> b(0, body.size() - 1);
  s += first[f(rng)];
  while (s.size() < length) s += body[b(rng)];
  return s;
}

// A selection of values that are wrong for every name type, with what makes them so.
struct bad_value {
  std::string value;
  std::string escaped;  // how the message must show the value
  std::string reason;   // a part of the message that says why
};

std::vector<bad_value> unicode_and_controls() {
  return {
      {"caf\xc3\xa9", "\"caf\\xc3\\xa9\"", "non-ASCII byte '\\xc3' at position 3"},
      {"\xe5\x90\x8d\xe5\x89\x8d", "\"\\xe5\\x90\\x8d\\xe5\\x89\\x8d\"",
       "non-ASCII byte '\\xe5' at position 0"},
      {"ok\xf0\x9f\x98\x80", "\"ok\\xf0\\x9f\\x98\\x80\"", "non-ASCII byte '\\xf0' at position 2"},
      {"zero\xe2\x80\x8bwidth", "\"zero\\xe2\\x80\\x8bwidth\"",
       "non-ASCII byte '\\xe2' at position 4"},
      {"nb\xc2\xa0sp", "\"nb\\xc2\\xa0sp\"", "non-ASCII byte '\\xc2' at position 2"},
      {"a\x01z", "\"a\\x01z\"", "control character '\\x01' at position 1"},
      {std::string("a\0z", 3), "\"a\\x00z\"", "control character '\\x00' at position 1"},
      {"a\x7fz", "\"a\\x7fz\"", "control character '\\x7f' at position 1"},
      {"a\x1bz", "\"a\\x1bz\"", "control character '\\x1b' at position 1"},
      {"a b", "\"a b\"", "whitespace ' ' at position 1"},
      {"a\tb", "\"a\\tb\"", "whitespace '\\t' at position 1"},
      {"a\nb", "\"a\\nb\"", "whitespace '\\n' at position 1"},
      {"a\r", "\"a\\r\"", "whitespace '\\r' at position 1"},
      {" a", "\" a\"", "whitespace ' ' at position 0"},
      {"a\"b", "\"a\\\"b\"", "'\"' at position 1"},
      {"a\\b", "\"a\\\\b\"", "'\\\\' at position 1"},
      {"aB", "\"aB\"", "upper case 'B' at position 1"},
      {"a/b", "\"a/b\"", "'/' at position 1"},
      {"a$b", "\"a$b\"", "'$' at position 1"},
  };
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Single-token names: namespaces, participants, jobs

TEMPLATE_TEST_CASE("a single-token name accepts exactly a-z first and a-z0-9_- after", "[names]",
                   namespace_name, participant_name, job_name, sink_name) {
  int accepted = 0;
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    const std::string candidates[] = {std::string(1, c), std::string("a") + c,
                                      std::string("a") + c + "z", std::string("ab") + c};
    for (const auto& s : candidates) {
      INFO("value: " << amp::quoted(s));
      const auto o = try_make<TestType>(s);
      REQUIRE(o.ok == full_match(s, name_regex()));
      if (o.ok) {
        ++accepted;
      } else {
        REQUIRE_THAT(o.message, Catch::StartsWith(std::string(label_of<TestType>) + " " +
                                                  amp::quoted(s) + ": "));
      }
    }
  }
  // 26 one-letter names, 38 characters after a letter in three shapes.
  REQUIRE(accepted == 26 + 3 * 38);
}

TEMPLATE_TEST_CASE("a single-token name is 1 to 64 characters", "[names]", namespace_name,
                   participant_name, job_name, sink_name) {
  const std::string label(label_of<TestType>);
  REQUIRE(rejection<TestType>("") == label + " is empty");
  for (std::size_t n : {1, 2, 63, 64}) {
    REQUIRE(try_make<TestType>(std::string(n, 'a')).ok);
    REQUIRE(try_make<TestType>("a" + std::string(n - 1, '9')).ok);
  }
  const std::string s65(65, 'a');
  REQUIRE(rejection<TestType>(s65) == label + " \"" + s65 + "\": is 65 characters (at most 64)");
  const std::string huge(1000, 'a');
  const auto message = rejection<TestType>(huge);
  REQUIRE_THAT(message, Catch::Contains("(1000 bytes)") &&
                            Catch::Contains("is 1000 characters (at most 64)"));
  REQUIRE(message.size() < 300);
}

TEMPLATE_TEST_CASE("a single-token name refusal says which value and what is wrong", "[names]",
                   namespace_name, participant_name, job_name, sink_name) {
  const std::string label(label_of<TestType>);
  REQUIRE(rejection<TestType>("Bob") ==
          label +
              " \"Bob\": upper case 'B' at position 0 (allowed: a-z, 0-9, '_', '-'; must start "
              "with a letter)");
  REQUIRE(rejection<TestType>("a.b") ==
          label + " \"a.b\": '.' at position 1 not allowed in a single-token name");
  REQUIRE_THAT(rejection<TestType>("news.eu.x"),
               Catch::Contains("'.' at position 4 not allowed in a single-token name"));
  REQUIRE(rejection<TestType>("*") ==
          label +
              " \"*\": '*' wildcard at position 0 not allowed here (a concrete name is needed)");
  REQUIRE_THAT(rejection<TestType>("ab>"),
               Catch::Contains("'>' wildcard at position 2 not allowed here"));
  REQUIRE(rejection<TestType>("1abc") ==
          label + " \"1abc\": '1' at position 0: must start with a letter (a-z)");
  REQUIRE_THAT(rejection<TestType>("_a"), Catch::Contains("must start with a letter"));
  REQUIRE_THAT(rejection<TestType>("-a"), Catch::Contains("must start with a letter"));
  REQUIRE_THAT(rejection<TestType>("."), Catch::Contains("'.' at position 0"));
  for (const auto& bad : unicode_and_controls()) {
    const auto message = rejection<TestType>(bad.value);
    INFO("message: " << message);
    REQUIRE_THAT(message, Catch::StartsWith(label + " " + bad.escaped + ": ") &&
                              Catch::Contains(bad.reason));
  }
}

TEST_CASE("$broker is never a participant, and says why", "[names]") {
  REQUIRE(amp::broker_sender == "$broker");
  REQUIRE(rejection<participant_name>(amp::broker_sender) ==
          "participant name \"$broker\": reserved for system messages");
  REQUIRE_THAT(rejection<namespace_name>("$broker"), Catch::Contains("'$' at position 0"));
  REQUIRE_THAT(rejection<job_name>("$broker"), Catch::Contains("'$' at position 0"));
  REQUIRE_THAT(rejection<participant_name>("$Broker"), Catch::Contains("'$' at position 0"));
  REQUIRE(try_make<participant_name>("broker").ok);
}

TEMPLATE_TEST_CASE("random single-token names pass, and one corruption makes them fail", "[names]",
                   namespace_name, participant_name, job_name, sink_name) {
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<std::size_t> length(1, 64);
  std::uniform_int_distribution<int> any_byte(0, 255);
  for (int i = 0; i < 400; ++i) {
    const auto good = random_from(rng, lower, name_body, length(rng));
    REQUIRE(try_make<TestType>(good).ok);

    // Replace one byte by one that is not allowed there.
    auto bad = good;
    const auto pos = std::uniform_int_distribution<std::size_t>(0, bad.size() - 1)(rng);
    const std::string_view allowed = pos == 0 ? lower : name_body;
    char c;
    do {
      c = static_cast<char>(any_byte(rng));
    } while (allowed.find(c) != std::string_view::npos);
    bad[pos] = c;
    const auto o = try_make<TestType>(bad);
    INFO("value: " << amp::quoted(bad));
    REQUIRE_FALSE(o.ok);
    if (c != '$' || bad != "$broker") {
      REQUIRE_THAT(o.message, Catch::Contains("position " + std::to_string(pos)));
    }

    // Any random byte string agrees with the grammar.
    std::string noise(length(rng) % 6 + 1, ' ');
    for (auto& ch : noise) ch = static_cast<char>(any_byte(rng));
    REQUIRE(try_make<TestType>(noise).ok == full_match(noise, name_regex()));
  }
}

// ---------------------------------------------------------------------------------------
// Topics and patterns

TEST_CASE("a topic token accepts exactly a-z0-9 first and a-z0-9_- after, in any token",
          "[names][topic]") {
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    const std::string candidates[] = {std::string(1, c),          std::string("x") + c,
                                      std::string("news.") + c,   std::string("news.e") + c,
                                      std::string(1, c) + ".eu",  std::string("a.b.") + c + "z.c",
                                      std::string("a.") + c + "b"};
    for (const auto& s : candidates) {
      INFO("value: " << amp::quoted(s));
      const bool expect = full_match(s, topic_regex());
      REQUIRE(try_make<topic>(s).ok == expect);
      // Every topic is also a pattern; a pattern allows * and > besides.
      if (c != '*' && c != '>') REQUIRE(try_make<topic_pattern>(s).ok == expect);
      REQUIRE(try_make<topic_pattern>(s).ok == full_match(s, pattern_regex()));
    }
  }
}

TEST_CASE("a topic has 1 to 8 tokens of 1 to 64 characters", "[names][topic]") {
  REQUIRE(rejection<topic>("") == "topic is empty");
  std::string t = "a";
  for (int n = 1; n <= 8; ++n) {
    INFO(n << " tokens");
    auto made = must<topic>(t);
    REQUIRE(made.token_count() == static_cast<std::size_t>(n));
    REQUIRE(made.tokens().size() == static_cast<std::size_t>(n));
    REQUIRE(try_make<topic_pattern>(t).ok);
    REQUIRE(try_make<topic_pattern>(t + ".>").ok == (n < 8));
    t += ".a";
  }
  REQUIRE(rejection<topic>(t) == "topic \"" + t + "\": has 9 tokens (at most 8)");
  REQUIRE(rejection<topic_pattern>(t) == "topic pattern \"" + t + "\": has 9 tokens (at most 8)");
  REQUIRE_THAT(rejection<topic_pattern>("*.*.*.*.*.*.*.*.>"),
               Catch::Contains("has 9 tokens (at most 8)"));
  REQUIRE(try_make<topic_pattern>("*.*.*.*.*.*.*.>").ok);

  const std::string t64(64, 'x');
  const std::string t65(65, 'x');
  REQUIRE(try_make<topic>("news." + t64 + ".eu").ok);
  REQUIRE(rejection<topic>("news." + t65 + ".eu") ==
          "topic \"news." + t65 + ".eu\": token \"" + t65 +
              "\" at position 5 is 65 characters (at most 64)");
  // The longest topic: 8 tokens of 64.
  std::string longest = t64;
  for (int i = 1; i < 8; ++i) longest += "." + t64;
  REQUIRE(try_make<topic>(longest).ok);
  REQUIRE(must<topic>(longest).tokens() == std::vector<std::string_view>(8, t64));
}

TEST_CASE("a topic refusal names empty tokens, wildcards and bad characters", "[names][topic]") {
  REQUIRE(rejection<topic>("news..eu") == "topic \"news..eu\": empty token at position 5");
  REQUIRE(rejection<topic>(".news") ==
          "topic \".news\": empty token at position 0 (a leading '.')");
  REQUIRE(rejection<topic>("news.") ==
          "topic \"news.\": empty token at position 5 (a trailing '.')");
  REQUIRE_THAT(rejection<topic>("."), Catch::Contains("empty token at position 0"));
  REQUIRE_THAT(rejection<topic>(".."), Catch::Contains("empty token at position 0"));
  REQUIRE(rejection<topic>("news.*") ==
          "topic \"news.*\": '*' wildcard at position 5 not allowed here (a concrete topic is "
          "needed)");
  REQUIRE_THAT(rejection<topic>(">"), Catch::Contains("'>' wildcard at position 0 not allowed"));
  REQUIRE_THAT(rejection<topic>("News.eu"), Catch::Contains("upper case 'N' at position 0"));
  REQUIRE(rejection<topic>("news._eu") ==
          "topic \"news._eu\": '_' at position 5: a token must start with a-z or 0-9");
  REQUIRE_THAT(rejection<topic>("news.-eu"), Catch::Contains("'-' at position 5"));
  REQUIRE(try_make<topic>("0.9lives.a-b_c").ok);
  for (const auto& bad : unicode_and_controls()) {
    const auto message = rejection<topic>(bad.value);
    INFO("message: " << message);
    REQUIRE_THAT(message,
                 Catch::StartsWith("topic " + bad.escaped + ": ") && Catch::Contains(bad.reason));
    // The same inside a later token, with the position shifted.
    const auto shifted = rejection<topic>("news." + bad.value);
    REQUIRE_THAT(shifted, Catch::Contains(" at position "));
  }
  REQUIRE(must<topic>("news.eu.fr").tokens() == std::vector<std::string_view>{"news", "eu", "fr"});
}

TEST_CASE("a topic pattern allows * as a whole token and > as the last one", "[names][topic]") {
  for (const char* ok : {">", "*", "news.>", "news.*", "*.eu", "*.*", "*.>", "news.*.fr",
                         "a.b.c.d.e.f.g.>", "a.b.c.d.e.f.g.h", "*.*.*.*.*.*.*.*"}) {
    INFO(ok);
    REQUIRE(try_make<topic_pattern>(ok).ok);
  }
  REQUIRE(rejection<topic_pattern>(">.news") ==
          "topic pattern \">.news\": '>' at position 0 must be the last token");
  REQUIRE(rejection<topic_pattern>("a.>.b") ==
          "topic pattern \"a.>.b\": '>' at position 2 must be the last token");
  REQUIRE_THAT(rejection<topic_pattern>("a.>.>"), Catch::Contains("must be the last token"));
  REQUIRE(rejection<topic_pattern>("news.eu*") ==
          "topic pattern \"news.eu*\": '*' at position 7 must be a whole token");
  REQUIRE_THAT(rejection<topic_pattern>("a*"),
               Catch::Contains("'*' at position 1 must be a whole token"));
  REQUIRE_THAT(rejection<topic_pattern>("*a"),
               Catch::Contains("'*' at position 0 must be a whole token"));
  REQUIRE_THAT(rejection<topic_pattern>("**"), Catch::Contains("must be a whole token"));
  REQUIRE_THAT(rejection<topic_pattern>("a.>x"),
               Catch::Contains("'>' at position 2 must be a whole token"));
  REQUIRE_THAT(rejection<topic_pattern>(">>"), Catch::Contains("must be a whole token"));
  REQUIRE(rejection<topic_pattern>("") == "topic pattern is empty");
  REQUIRE_THAT(rejection<topic_pattern>("news..>"), Catch::Contains("empty token at position 5"));
  REQUIRE_THAT(rejection<topic_pattern>("news.>."), Catch::Contains("must be the last token"));
  REQUIRE_THAT(rejection<topic_pattern>("*."), Catch::Contains("empty token at position 2"));
  REQUIRE_THAT(rejection<topic_pattern>("News.>"), Catch::Contains("upper case 'N'"));
  REQUIRE(must<topic_pattern>("news.*.>").tokens() ==
          std::vector<std::string_view>{"news", "*", ">"});
  REQUIRE(must<topic_pattern>("news.*.>").token_count() == 3);
}

TEST_CASE("random topics and patterns pass, and one corruption makes them fail", "[names][topic]") {
  std::mt19937 rng(424242);
  std::uniform_int_distribution<std::size_t> token_length(1, 64);
  std::uniform_int_distribution<std::size_t> token_count(1, 8);
  std::uniform_int_distribution<int> any_byte(0, 255);
  std::uniform_int_distribution<int> percent(0, 99);
  for (int i = 0; i < 300; ++i) {
    const auto n = token_count(rng);
    std::string t;
    std::string p;
    for (std::size_t k = 0; k < n; ++k) {
      const auto token = random_from(rng, lower_digit, token_body, token_length(rng));
      t += (k ? "." : "") + token;
      const bool last = k + 1 == n;
      const int roll = percent(rng);
      p += (k ? "." : "") + (roll < 20           ? std::string("*")
                             : last && roll < 40 ? std::string(">")
                                                 : token);
    }
    REQUIRE(try_make<topic>(t).ok);
    REQUIRE(try_make<topic_pattern>(t).ok);
    REQUIRE(try_make<topic_pattern>(p).ok);

    // Corrupt one byte of the topic; allowed replacements are checked by the oracle.
    auto bad = t;
    const auto pos = std::uniform_int_distribution<std::size_t>(0, bad.size() - 1)(rng);
    bad[pos] = static_cast<char>(any_byte(rng));
    INFO("value: " << amp::quoted(bad));
    REQUIRE(try_make<topic>(bad).ok == full_match(bad, topic_regex()));
    REQUIRE(try_make<topic_pattern>(bad).ok == full_match(bad, pattern_regex()));
    // A byte outside a-z0-9_-. never passes.
    char c;
    do {
      c = static_cast<char>(any_byte(rng));
    } while (token_body.find(c) != std::string_view::npos || c == '.');
    bad[pos] = c;
    REQUIRE_FALSE(try_make<topic>(bad).ok);
    // Nine tokens never pass.
    auto nine = t;
    for (std::size_t k = n; k < 9; ++k) nine += ".z";
    REQUIRE_THAT(rejection<topic>(nine), Catch::Contains("has 9 tokens (at most 8)"));
  }
}

// ---------------------------------------------------------------------------------------
// Matching and coverage, exhaustively against brute force

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == '.') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// The reference: NATS-style matching on token lists, written independently.
bool ref_match(const std::vector<std::string>& p, std::size_t i, const std::vector<std::string>& t,
               std::size_t j) {
  if (i == p.size()) return j == t.size();
  if (p[i] == ">") return j < t.size();
  if (j == t.size()) return false;
  return (p[i] == "*" || p[i] == t[j]) && ref_match(p, i + 1, t, j + 1);
}

std::string join(const std::vector<std::string>& tokens) {
  std::string s;
  for (std::size_t i = 0; i < tokens.size(); ++i) s += (i ? "." : "") + tokens[i];
  return s;
}

// Every sequence of length min_len..max_len over `alphabet`.
std::vector<std::string> sequences(const std::vector<std::string>& alphabet, std::size_t min_len,
                                   std::size_t max_len, const std::vector<std::string>& last) {
  std::vector<std::string> out;
  std::vector<std::vector<std::string>> level{{}};
  for (std::size_t len = 1; len <= max_len; ++len) {
    std::vector<std::vector<std::string>> next;
    for (const auto& prefix : level) {
      for (const auto& tok : alphabet) {
        auto s = prefix;
        s.push_back(tok);
        next.push_back(s);
      }
    }
    if (len >= min_len) {
      for (const auto& prefix : level) {
        for (const auto& tok : last) {
          auto s = prefix;
          s.push_back(tok);
          out.push_back(join(s));
        }
      }
    }
    level = std::move(next);
  }
  return out;
}

// A universe for brute force: patterns built from the concrete tokens and * and >, and
// every topic of 1 to 8 tokens over the concrete tokens plus one fresh token "c" that
// stands for every other value. Replacing each token outside the concrete ones by "c"
// changes no pattern's verdict, so a set inclusion over this universe is the set
// inclusion over all topics: the brute force is exact.
struct universe {
  std::vector<topic_pattern> patterns;
  std::vector<topic> topics;
  std::vector<std::vector<std::string>> topic_tokens;
  std::vector<std::vector<std::uint64_t>> match;  // match[p] is a bitset over topics

  universe(const std::vector<std::string>& concrete, std::size_t max_pattern_tokens) {
    auto with_star = concrete;
    with_star.push_back("*");
    auto last = with_star;
    last.push_back(">");
    for (const auto& p : sequences(with_star, 1, max_pattern_tokens, last)) {
      patterns.push_back(must<topic_pattern>(p));
    }
    auto topic_alphabet = concrete;
    topic_alphabet.push_back("c");
    for (const auto& t : sequences(topic_alphabet, 1, 8, topic_alphabet)) {
      topics.push_back(must<topic>(t));
      topic_tokens.push_back(split(t));
    }
    const std::size_t words = (topics.size() + 63) / 64;
    for (const auto& p : patterns) {
      const auto pt = split(p.str());
      std::vector<std::uint64_t> bits(words, 0);
      for (std::size_t j = 0; j < topics.size(); ++j) {
        if (ref_match(pt, 0, topic_tokens[j], 0)) bits[j / 64] |= std::uint64_t{1} << (j % 64);
      }
      match.push_back(std::move(bits));
    }
  }

  static bool subset(const std::vector<std::uint64_t>& a, const std::vector<std::uint64_t>& b) {
    for (std::size_t w = 0; w < a.size(); ++w) {
      if (a[w] & ~b[w]) return false;
    }
    return true;
  }
};

}  // namespace

TEST_CASE("pattern matching agrees with brute force over every topic of up to 8 tokens",
          "[names][topic][match]") {
  const universe u({"a", "b"}, 3);
  REQUIRE(u.patterns.size() == 4 + 12 + 36);
  REQUIRE(u.topics.size() == 3 + 9 + 27 + 81 + 243 + 729 + 2187 + 6561);
  std::size_t mismatches = 0;
  std::string first;
  for (std::size_t i = 0; i < u.patterns.size(); ++i) {
    for (std::size_t j = 0; j < u.topics.size(); ++j) {
      const bool expect = (u.match[i][j / 64] >> (j % 64)) & 1;
      if (u.patterns[i].matches(u.topics[j]) != expect) {
        if (mismatches++ == 0) first = u.patterns[i].str() + " vs " + u.topics[j].str();
      }
    }
  }
  INFO("first mismatch: " << first);
  REQUIRE(mismatches == 0);

  REQUIRE(must<topic_pattern>(">").matches(must<topic>("a.b.c.d.e.f.g.h")));
  REQUIRE(must<topic_pattern>("a.>").matches(must<topic>("a.b.c.d.e.f.g.h")));
  REQUIRE_FALSE(must<topic_pattern>("a.>").matches(must<topic>("a")));
  REQUIRE(must<topic_pattern>("news.*").matches(must<topic>("news.eu")));
  REQUIRE_FALSE(must<topic_pattern>("news.*").matches(must<topic>("news.eu.fr")));
  REQUIRE_FALSE(must<topic_pattern>("news.eu").matches(must<topic>("news.e")));
  REQUIRE_FALSE(must<topic_pattern>("news.e").matches(must<topic>("news.eu")));
}

TEST_CASE("covers agrees with brute force: every topic the other matches is matched",
          "[names][topic][cover]") {
  SECTION("patterns of up to 3 tokens over {a, b}") {
    const universe u({"a", "b"}, 3);
    std::size_t mismatches = 0, covering = 0;
    std::string first;
    for (std::size_t i = 0; i < u.patterns.size(); ++i) {
      for (std::size_t k = 0; k < u.patterns.size(); ++k) {
        const bool expect = universe::subset(u.match[k], u.match[i]);
        covering += expect;
        if (u.patterns[i].covers(u.patterns[k]) != expect && mismatches++ == 0) {
          first = u.patterns[i].str() + " covers " + u.patterns[k].str() + " should be " +
                  (expect ? "true" : "false");
        }
      }
    }
    INFO("first mismatch: " << first);
    REQUIRE(mismatches == 0);
    REQUIRE(covering > u.patterns.size());  // not only the trivial self-coverage
  }
  SECTION("patterns of up to 8 tokens over {a}, where the 8-token limit matters") {
    const universe u({"a"}, 8);
    REQUIRE(u.patterns.size() == 3 * 255);
    std::size_t mismatches = 0;
    std::string first;
    for (std::size_t i = 0; i < u.patterns.size(); ++i) {
      for (std::size_t k = 0; k < u.patterns.size(); ++k) {
        const bool expect = universe::subset(u.match[k], u.match[i]);
        if (u.patterns[i].covers(u.patterns[k]) != expect && mismatches++ == 0) {
          first = u.patterns[i].str() + " covers " + u.patterns[k].str() + " should be " +
                  (expect ? "true" : "false");
        }
      }
    }
    INFO("first mismatch: " << first);
    REQUIRE(mismatches == 0);
  }
}

TEST_CASE("covered_by_any agrees with brute force over sets of grants", "[names][topic][cover]") {
  const universe u({"a", "b"}, 3);
  const auto n = u.patterns.size();
  std::size_t mismatches = 0, only_together = 0;
  std::string first;
  auto check = [&](std::size_t sub, const std::vector<std::size_t>& grant_ids) {
    std::vector<topic_pattern> grants;
    std::vector<std::uint64_t> uni(u.match[0].size(), 0);
    for (auto g : grant_ids) {
      grants.push_back(u.patterns[g]);
      for (std::size_t w = 0; w < uni.size(); ++w) uni[w] |= u.match[g][w];
    }
    const bool expect = universe::subset(u.match[sub], uni);
    const bool got = amp::covered_by_any(u.patterns[sub], grants);
    if (expect && std::none_of(grants.begin(), grants.end(),
                               [&](const topic_pattern& g) { return g.covers(u.patterns[sub]); })) {
      ++only_together;
    }
    if (got != expect && mismatches++ == 0) {
      first = "sub " + u.patterns[sub].str() + " grants";
      for (const auto& g : grants) first += " " + g.str();
      first += expect ? ": should be covered" : ": should not be covered";
    }
  };
  for (std::size_t s = 0; s < n; ++s) {
    check(s, {});
    for (std::size_t g1 = 0; g1 < n; ++g1) {
      for (std::size_t g2 = g1; g2 < n; ++g2) check(s, {g1, g2});
    }
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::size_t> pick(0, n - 1);
  std::uniform_int_distribution<std::size_t> count(3, 6);
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::size_t> ids(count(rng));
    for (auto& id : ids) id = pick(rng);
    check(pick(rng), ids);
  }
  INFO("first mismatch: " << first);
  REQUIRE(mismatches == 0);
  REQUIRE(only_together > 0);  // the universe exercises unions of grants
}

TEST_CASE("coverage follows the spec's examples", "[names][topic][cover]") {
  auto p = [](std::string_view s) { return must<topic_pattern>(s); };
  auto covered = [&](std::string_view sub, std::vector<std::string_view> grants) {
    std::vector<topic_pattern> g;
    for (auto s : grants) g.push_back(p(s));
    return amp::covered_by_any(p(sub), g);
  };
  REQUIRE(p("news.>").covers(p("news.*")));
  REQUIRE(p("news.>").covers(p("news.*.x")));
  REQUIRE(p("news.>").covers(p("news.eu")));
  REQUIRE(p("news.>").covers(p("news.>")));
  REQUIRE_FALSE(p("news.*").covers(p("news.>")));
  REQUIRE_FALSE(p("news.>").covers(p(">")));
  REQUIRE_FALSE(p("news.>").covers(p("news")));
  REQUIRE(p(">").covers(p("news")));
  REQUIRE(p(">").covers(p("*.*.*.*.*.*.*.*")));
  REQUIRE(p("*").covers(p("news")));
  REQUIRE_FALSE(p("news").covers(p("*")));
  // With 8 tokens at most, these two are the same set.
  REQUIRE(p("a.*.*.*.*.*.*.>").covers(p("a.*.*.*.*.*.*.*")));
  REQUIRE(p("a.*.*.*.*.*.*.*").covers(p("a.*.*.*.*.*.*.>")));
  REQUIRE_FALSE(p("a.*.*.*.*.*.*").covers(p("a.*.*.*.*.*.>")));

  REQUIRE(covered("a.>", {"a.*", "a.*.>"}));
  REQUIRE_FALSE(covered("a.>", {"a.*"}));
  REQUIRE_FALSE(covered("a.>", {"a.*.>"}));
  REQUIRE(covered(">", {"*", "*.>"}));
  REQUIRE(covered("a.>", {"a.*", "a.*.*", "a.*.*.*", "a.*.*.*.*", "a.*.*.*.*.*", "a.*.*.*.*.*.*",
                          "a.*.*.*.*.*.*.*"}));
  REQUIRE_FALSE(
      covered("a.>", {"a.*", "a.*.*", "a.*.*.*", "a.*.*.*.*", "a.*.*.*.*.*", "a.*.*.*.*.*.*"}));
  REQUIRE_FALSE(covered("a.*", {"a.x", "a.y"}));
  REQUIRE_FALSE(covered("*.x", {"a.*", "b.*"}));
  REQUIRE(covered("a.x", {"a.y", "*.x"}));
  REQUIRE_FALSE(covered("news", {}));
}

// ---------------------------------------------------------------------------------------
// Task ids

TEST_CASE("a task id is t_ and 1 to 62 of a-z0-9", "[names][task]") {
  for (const char* ok : {"t_0", "t_a", "t_01hx9k2m3n4p5q6r7s8t9v0wxyz", "t_zzzz"}) {
    REQUIRE(try_make<task_id>(ok).ok);
  }
  REQUIRE(try_make<task_id>("t_" + std::string(62, 'z')).ok);
  const auto long_id = "t_" + std::string(63, 'z');
  REQUIRE(rejection<task_id>(long_id) ==
          "task id \"" + long_id + "\": is 65 characters (at most 64)");
  REQUIRE(rejection<task_id>("") == "task id is empty");
  REQUIRE(rejection<task_id>("t_") == "task id \"t_\": nothing after \"t_\"");
  REQUIRE(rejection<task_id>("x_1") == "task id \"x_1\": must start with \"t_\"");
  REQUIRE_THAT(rejection<task_id>("T_1"), Catch::Contains("must start with \"t_\""));
  REQUIRE_THAT(rejection<task_id>("t"), Catch::Contains("must start with \"t_\""));
  REQUIRE(rejection<task_id>("t_aB") ==
          "task id \"t_aB\": upper case 'B' at position 3 (allowed after \"t_\": a-z, 0-9)");
  REQUIRE_THAT(rejection<task_id>("t__"), Catch::Contains("'_' at position 2"));
  REQUIRE_THAT(rejection<task_id>("t_a-b"), Catch::Contains("'-' at position 3"));
  REQUIRE_THAT(rejection<task_id>("t_a.b"), Catch::Contains("'.' at position 3"));
  REQUIRE_THAT(rejection<task_id>("t_\xc3\xa9"),
               Catch::Contains("\"t_\\xc3\\xa9\"") &&
                   Catch::Contains("non-ASCII byte '\\xc3' at position 2"));
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    for (const auto& s : {std::string("t_") + c, std::string("t_a") + c + "0",
                          std::string(1, c) + "_a", std::string("t") + c + "a"}) {
      INFO("value: " << amp::quoted(s));
      REQUIRE(try_make<task_id>(s).ok == full_match(s, task_regex()));
    }
  }
}

TEST_CASE("an operation id is o_ and 1 to 62 of a-z0-9, as a task id is t_ and the same",
          "[names][operation]") {
  for (const char* ok : {"o_0", "o_01hx9k2m3n4p5q6r7s8t9v0wxyz"}) {
    REQUIRE(try_make<operation_id>(ok).ok);
  }
  REQUIRE(try_make<operation_id>("o_" + std::string(62, 'z')).ok);
  REQUIRE(rejection<operation_id>("o_" + std::string(63, 'z')) ==
          "operation id \"o_" + std::string(63, 'z') + "\": is 65 characters (at most 64)");
  REQUIRE(rejection<operation_id>("") == "operation id is empty");
  REQUIRE(rejection<operation_id>("o_") == "operation id \"o_\": nothing after \"o_\"");
  REQUIRE(rejection<operation_id>("t_1") == "operation id \"t_1\": must start with \"o_\"");
  REQUIRE(rejection<operation_id>("o_aB") ==
          "operation id \"o_aB\": upper case 'B' at position 3 (allowed after \"o_\": a-z, 0-9)");
  REQUIRE_FALSE(try_make<task_id>("o_1").ok);
}

// ---------------------------------------------------------------------------------------
// Value semantics

TEST_CASE("names are values: compared, ordered and hashed by spelling, never converted",
          "[names]") {
  static_assert(!std::is_default_constructible_v<participant_name>);
  static_assert(!std::is_constructible_v<participant_name, std::string>);
  static_assert(!std::is_constructible_v<participant_name, std::string_view>);
  static_assert(!std::is_constructible_v<participant_name, const char*>);
  static_assert(!std::is_convertible_v<participant_name, std::string>);
  static_assert(!std::is_convertible_v<participant_name, std::string_view>);
  static_assert(!std::is_constructible_v<job_name, participant_name>);
  static_assert(!std::is_constructible_v<topic, topic_pattern>);
  static_assert(!std::is_constructible_v<topic_pattern, topic>);
  static_assert(!std::equality_comparable_with<participant_name, job_name>);
  static_assert(!std::equality_comparable_with<participant_name, std::string>);
  static_assert(!std::equality_comparable_with<topic, topic_pattern>);
  static_assert(std::is_nothrow_move_constructible_v<topic>);
  static_assert(std::totally_ordered<namespace_name>);
  static_assert(std::totally_ordered<task_id>);

  const auto alice = must<participant_name>("alice");
  const auto bob = must<participant_name>("bob");
  auto copy = alice;
  REQUIRE(copy == alice);
  REQUIRE(alice != bob);
  REQUIRE(alice < bob);
  REQUIRE((bob <=> alice) == std::strong_ordering::greater);
  REQUIRE(std::hash<participant_name>{}(alice) == std::hash<participant_name>{}(copy));

  std::unordered_set<participant_name> ps{alice, bob, copy};
  REQUIRE(ps.size() == 2);
  std::unordered_set<topic> ts{must<topic>("a.b"), must<topic>("a.b"), must<topic>("a")};
  REQUIRE(ts.size() == 2);
  std::unordered_set<topic_pattern> pats{must<topic_pattern>("a.*"), must<topic_pattern>("a.>")};
  REQUIRE(pats.size() == 2);
  std::unordered_set<namespace_name> nss{must<namespace_name>("demo")};
  std::unordered_set<job_name> js{must<job_name>("resize")};
  std::unordered_set<task_id> tids{must<task_id>("t_1")};
  REQUIRE(nss.size() + js.size() + tids.size() == 3);
}

TEST_CASE("quoted output is printable ASCII for every byte and cut when long", "[names]") {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    REQUIRE(printable_ascii(amp::quoted(one)));
    REQUIRE(printable_ascii(amp::describe_byte(static_cast<char>(b))));
  }
  const auto q = amp::quoted(all);
  REQUIRE(printable_ascii(q));
  REQUIRE_THAT(q, Catch::EndsWith("... (256 bytes)"));
  REQUIRE(amp::quoted("a\"b\\c\td\x01") == "\"a\\\"b\\\\c\\td\\x01\"");
  REQUIRE(amp::quoted(std::string(96, 'a')) == "\"" + std::string(96, 'a') + "\"");
  REQUIRE(amp::quoted(std::string(97, 'a')) == "\"" + std::string(64, 'a') + "\"... (97 bytes)");
  REQUIRE(amp::describe_byte('\'') == "'\\''");
  REQUIRE(amp::describe_byte('"') == "'\"'");
}
