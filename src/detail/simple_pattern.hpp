#pragma once

// A JSON Schema `pattern` of the simplest shape, matched by hand in one pass: the names and
// sizes amp's own schemas check on every frame (`^[a-z][a-z0-9_-]{0,63}$`,
// `^t_[0-9a-z]{1,62}$`, `^[^\x00-\x1f\x7f]{1,512}$`). std::regex allocates a state per
// repetition of such a pattern on every match, which made pattern checks a tenth of
// amp-server's CPU on the task path.
//
// Accepted: `^`, then atoms, then `$`. An atom is a character (ASCII, or one of the escapes
// below), or a class `[...]` / `[^...]` of ASCII characters, ranges and the escapes; only
// the last atom may carry a quantifier (`?`, `*`, `+`, `{n}`, `{n,}`, `{n,m}`). Escapes:
// `\d \D \s \S \w \W` (in the C locale, like std::regex here), `\t \n \v \f \r`, `\xHH`
// below 0x80, and `\` before a syntax character. Anything else is not simple (`parse`
// answers nothing) and stays with std::regex. Matching works on bytes, like
// std::regex over `char`: a character class or repetition counts bytes, not code points.
// A simple pattern matches exactly the strings std::regex (ECMAScript) matches with it
// (tests/unit/simple_pattern_test.cpp compares the two).

#include <bitset>
#include <cstddef>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

namespace amp::detail {

class simple_pattern {
 public:
  // The pattern as a simple one; nothing when it is not of that shape.
  static std::optional<simple_pattern> parse(std::string_view pattern) {
    if (pattern.size() < 2 || pattern.front() != '^' || pattern.back() != '$') return {};
    simple_pattern out;
    std::string_view body = pattern.substr(1, pattern.size() - 2);
    // An escaped `$` at the end is a literal, not the anchor.
    std::size_t slashes = 0;
    while (slashes < body.size() && body[body.size() - 1 - slashes] == '\\') ++slashes;
    if (slashes % 2 != 0) return {};
    std::size_t at = 0;
    bool quantified = false;
    while (at < body.size()) {
      if (quantified) return {};  // a quantifier on an atom that is not the last
      byte_set set;
      if (!take_atom(body, at, set)) return {};
      std::size_t min = 1;
      std::size_t max = 1;
      if (!take_quantifier(body, at, min, max)) return {};
      quantified = !(min == 1 && max == 1);
      out.atoms_.push_back(set);
      out.tail_min_ = min;
      out.tail_max_ = max;
    }
    return out;
  }

  // Whether the whole of `s` matches. Thread-safe.
  bool matches(std::string_view s) const {
    if (atoms_.empty()) return s.empty();
    const std::size_t fixed = atoms_.size() - 1;
    if (s.size() < fixed) return false;
    for (std::size_t i = 0; i < fixed; ++i) {
      if (!atoms_[i].test(static_cast<unsigned char>(s[i]))) return false;
    }
    const std::size_t rest = s.size() - fixed;
    if (rest < tail_min_ || rest > tail_max_) return false;
    const auto& tail = atoms_.back();
    for (std::size_t i = fixed; i < s.size(); ++i) {
      if (!tail.test(static_cast<unsigned char>(s[i]))) return false;
    }
    return true;
  }

 private:
  using byte_set = std::bitset<256>;
  static constexpr std::size_t k_unbounded = std::numeric_limits<std::size_t>::max();

  static bool is_syntax(char c) {
    return std::string_view("^$\\.*+?()[]{}|/-").find(c) != std::string_view::npos;
  }

  static void add_range(byte_set& set, unsigned lo, unsigned hi) {
    for (unsigned c = lo; c <= hi; ++c) set.set(c);
  }

  // \d \D \s \S \w \W as std::regex sees them in the C locale.
  static bool class_escape(char c, byte_set& set) {
    byte_set cls;
    switch (c) {
      case 'd':
      case 'D': add_range(cls, '0', '9'); break;
      case 's':
      case 'S':
        add_range(cls, '\t', '\r');
        cls.set(' ');
        break;
      case 'w':
      case 'W':
        add_range(cls, '0', '9');
        add_range(cls, 'A', 'Z');
        add_range(cls, 'a', 'z');
        cls.set('_');
        break;
      default: return false;
    }
    if (c == 'D' || c == 'S' || c == 'W') cls.flip();
    set |= cls;
    return true;
  }

  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // One character after `\` (at points past the backslash): its byte, or nothing.
  static std::optional<unsigned> char_escape(std::string_view p, std::size_t& at) {
    if (at >= p.size()) return {};
    const char c = p[at++];
    switch (c) {
      case 't': return '\t';
      case 'n': return '\n';
      case 'v': return '\v';
      case 'f': return '\f';
      case 'r': return '\r';
      case 'x': {
        if (p.size() - at < 2) return {};
        const int hi = hex_digit(p[at]);
        const int lo = hex_digit(p[at + 1]);
        if (hi < 0 || lo < 0 || hi >= 8) return {};
        at += 2;
        return static_cast<unsigned>(hi * 16 + lo);
      }
      default:
        if (is_syntax(c)) return static_cast<unsigned char>(c);
        return {};
    }
  }

  // One character of a class or outside one (not a class escape): its byte, or nothing.
  static std::optional<unsigned> take_char(std::string_view p, std::size_t& at) {
    const char c = p[at];
    if (c == '\\') {
      ++at;
      return char_escape(p, at);
    }
    if (static_cast<unsigned char>(c) >= 0x80) return {};
    ++at;
    return static_cast<unsigned char>(c);
  }

  static bool take_class(std::string_view p, std::size_t& at, byte_set& set) {
    ++at;  // '['
    bool negate = false;
    if (at < p.size() && p[at] == '^') {
      negate = true;
      ++at;
    }
    if (at < p.size() && p[at] == ']') return false;  // [] and [^] are not simple
    byte_set cls;
    while (true) {
      if (at >= p.size()) return false;
      const char c = p[at];
      if (c == ']') {
        ++at;
        break;
      }
      if (c == '[') return false;  // libstdc++ reads [: [. [= inside a class
      if (c == '\\' && at + 1 < p.size() && class_escape(p[at + 1], cls)) {
        at += 2;
        if (at < p.size() && p[at] == '-' && at + 1 < p.size() && p[at + 1] != ']') return false;
        continue;
      }
      auto lo = take_char(p, at);
      if (!lo) return false;
      if (at + 1 < p.size() && p[at] == '-' && p[at + 1] != ']') {
        ++at;
        if (p[at] == '\\' && at + 1 < p.size() && class_escape(p[at + 1], cls)) return false;
        auto hi = take_char(p, at);
        if (!hi || *hi < *lo) return false;
        add_range(cls, *lo, *hi);
      } else {
        cls.set(*lo);
      }
    }
    if (negate) cls.flip();
    set = cls;
    return true;
  }

  static bool take_atom(std::string_view p, std::size_t& at, byte_set& set) {
    const char c = p[at];
    if (c == '[') return take_class(p, at, set);
    if (c == '\\') {
      if (at + 1 < p.size() && class_escape(p[at + 1], set)) {
        at += 2;
        return true;
      }
    } else if (is_syntax(c) && c != '/' && c != '-') {
      return false;
    }
    auto one = take_char(p, at);
    if (!one) return false;
    set.set(*one);
    return true;
  }

  static bool take_number(std::string_view p, std::size_t& at, std::size_t& n) {
    const std::size_t start = at;
    n = 0;
    while (at < p.size() && p[at] >= '0' && p[at] <= '9') {
      if (at - start >= 6) return false;  // more than the patterns this is for
      n = n * 10 + static_cast<std::size_t>(p[at] - '0');
      ++at;
    }
    return at > start;
  }

  static bool take_quantifier(std::string_view p, std::size_t& at, std::size_t& min,
                              std::size_t& max) {
    if (at >= p.size()) return true;
    switch (p[at]) {
      case '?': min = 0, max = 1; break;
      case '*': min = 0, max = k_unbounded; break;
      case '+': min = 1, max = k_unbounded; break;
      case '{': {
        ++at;
        if (!take_number(p, at, min)) return false;
        max = min;
        if (at < p.size() && p[at] == ',') {
          ++at;
          max = k_unbounded;
          if (at < p.size() && p[at] != '}' && (!take_number(p, at, max) || max < min)) {
            return false;
          }
        }
        if (at >= p.size() || p[at] != '}') return false;
        break;
      }
      default: return true;
    }
    ++at;
    // A lazy or possessive mark, or a quantifier on a quantifier: not simple.
    return !(at < p.size() && (p[at] == '?' || p[at] == '*' || p[at] == '+' || p[at] == '{'));
  }

  std::vector<byte_set> atoms_;
  std::size_t tail_min_ = 1;
  std::size_t tail_max_ = 1;
};

}  // namespace amp::detail
