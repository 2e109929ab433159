#pragma once

// The grammar of amp's names (docs/protocol.md, names.hpp) as plain predicates: the
// characters names.cpp checks with its messages, and whole-name tests for callers that
// only need a yes (the envelope's fast path, detail/envelope_check.hpp).

#include <cstddef>
#include <string_view>

#include "amp/names.hpp"

namespace amp::detail {

inline bool is_lower(char c) noexcept {
  return c >= 'a' && c <= 'z';
}
inline bool is_digit(char c) noexcept {
  return c >= '0' && c <= '9';
}
inline bool is_dash_or_underscore(char c) noexcept {
  return c == '_' || c == '-';
}

// One name or topic token: ^[a-z][a-z0-9_-]{0,63}$, or with `digit_first`
// ^[a-z0-9][a-z0-9_-]{0,63}$.
inline bool is_name_token(std::string_view s, bool digit_first) noexcept {
  if (s.empty() || s.size() > max_name_length) return false;
  if (!(is_lower(s[0]) || (digit_first && is_digit(s[0])))) return false;
  for (std::size_t i = 1; i < s.size(); ++i) {
    if (!(is_lower(s[i]) || is_digit(s[i]) || is_dash_or_underscore(s[i]))) return false;
  }
  return true;
}

// A namespace, participant or job name.
inline bool is_single_token_name(std::string_view s) noexcept {
  return is_name_token(s, false);
}

// A topic: 1 to 8 tokens joined by '.', each a token that may start with a digit.
inline bool is_topic_name(std::string_view s) noexcept {
  for (std::size_t tokens = 1; tokens <= max_topic_tokens; ++tokens) {
    const auto dot = s.find('.');
    if (!is_name_token(s.substr(0, dot), true)) return false;
    if (dot == std::string_view::npos) return true;
    s.remove_prefix(dot + 1);
  }
  return false;
}

}  // namespace amp::detail
