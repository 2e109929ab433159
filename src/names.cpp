#include "amp/names.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "detail/name_rules.hpp"

namespace amp {
namespace {

constexpr std::size_t k_quote_limit = 96;   // values up to this size are shown whole
constexpr std::size_t k_quote_prefix = 64;  // longer ones are cut to this many bytes
constexpr std::size_t k_max_task_id_length = 64;

constexpr std::string_view k_name_allowed =
    "(allowed: a-z, 0-9, '_', '-'; must start with a letter)";
constexpr std::string_view k_token_allowed =
    "(allowed in a token: a-z, 0-9, '_', '-'; must start with a-z or 0-9)";

using detail::is_dash_or_underscore;
using detail::is_digit;
using detail::is_lower;

// Appends `c` escaped so that the output stays printable ASCII; `quote` is the quote
// character the value is written inside, which gets a backslash too.
void append_escaped(std::string& out, char c, char quote) {
  static constexpr char k_hex[] = "0123456789abcdef";
  const auto u = static_cast<unsigned char>(c);
  if (c == quote || c == '\\') {
    out += '\\';
    out += c;
  } else if (c == '\t') {
    out += "\\t";
  } else if (c == '\n') {
    out += "\\n";
  } else if (c == '\r') {
    out += "\\r";
  } else if (u >= 0x20 && u < 0x7f) {
    out += c;
  } else {
    out += "\\x";
    out += k_hex[u >> 4];
    out += k_hex[u & 0xf];
  }
}

unexpected invalid(std::string message) {
  return unexpected(errc::invalid_name, std::move(message));
}

// Splits a dotted value into tokens without allocating. "" has no tokens; "a." has
// the tokens "a" and "".
class token_reader {
 public:
  explicit token_reader(std::string_view s) noexcept : rest_(s), done_(s.empty()) {}
  bool done() const noexcept { return done_; }
  std::string_view next() noexcept {
    const auto dot = rest_.find('.');
    if (dot == std::string_view::npos) {
      done_ = true;
      return std::exchange(rest_, std::string_view{});
    }
    auto token = rest_.substr(0, dot);
    rest_.remove_prefix(dot + 1);
    return token;
  }

 private:
  std::string_view rest_;
  bool done_;
};

std::vector<std::string_view> split_tokens(std::string_view s) {
  std::vector<std::string_view> out;
  token_reader reader(s);
  while (!reader.done()) out.push_back(reader.next());
  return out;
}

// ns, participant and job names: ^[a-z][a-z0-9_-]{0,63}$.
result<void> check_single_token_name(std::string_view kind, std::string_view value) {
  if (value.empty()) return invalid(fmt::format("{} is empty", kind));
  for (std::size_t i = 0; i < value.size(); ++i) {
    const char c = value[i];
    if (is_lower(c) || (i > 0 && (is_digit(c) || is_dash_or_underscore(c)))) continue;
    std::string why;
    if (c == '.') {
      why = fmt::format("'.' at position {} not allowed in a single-token name", i);
    } else if (c == '*' || c == '>') {
      why = fmt::format("'{}' wildcard at position {} not allowed here (a concrete name is needed)",
                        c, i);
    } else if (i == 0 && (is_digit(c) || is_dash_or_underscore(c))) {
      why = fmt::format("'{}' at position 0: must start with a letter (a-z)", c);
    } else {
      why = fmt::format("{} at position {} {}", describe_byte(c), i, k_name_allowed);
    }
    return invalid(fmt::format("{} {}: {}", kind, quoted(value), why));
  }
  if (value.size() > max_name_length) {
    return invalid(fmt::format("{} {}: is {} characters (at most {})", kind, quoted(value),
                               value.size(), max_name_length));
  }
  return {};
}

// Topics and topic patterns: 1 to 8 tokens joined by '.', each
// ^[a-z0-9][a-z0-9_-]{0,63}$; a pattern may also have '*' tokens and a last '>' token.
result<void> check_dotted_name(std::string_view kind, std::string_view value, bool pattern) {
  if (value.empty()) return invalid(fmt::format("{} is empty", kind));
  std::size_t count = 0;
  std::size_t start = 0;
  for (;;) {
    auto end = value.find('.', start);
    if (end == std::string_view::npos) end = value.size();
    const auto token = value.substr(start, end - start);
    ++count;
    if (token.empty()) {
      const char* where = start == 0              ? " (a leading '.')"
                          : start == value.size() ? " (a trailing '.')"
                                                  : "";
      return invalid(
          fmt::format("{} {}: empty token at position {}{}", kind, quoted(value), start, where));
    }
    if (pattern && token == ">") {
      if (end != value.size()) {
        return invalid(fmt::format("{} {}: '>' at position {} must be the last token", kind,
                                   quoted(value), start));
      }
    } else if (!(pattern && token == "*")) {
      for (std::size_t j = 0; j < token.size(); ++j) {
        const char c = token[j];
        if (is_lower(c) || is_digit(c) || (j > 0 && is_dash_or_underscore(c))) continue;
        const auto pos = start + j;
        std::string why;
        if ((c == '*' || c == '>') && pattern) {
          why = fmt::format("'{}' at position {} must be a whole token", c, pos);
        } else if (c == '*' || c == '>') {
          why = fmt::format(
              "'{}' wildcard at position {} not allowed here (a concrete topic is needed)", c, pos);
        } else if (j == 0 && is_dash_or_underscore(c)) {
          why = fmt::format("'{}' at position {}: a token must start with a-z or 0-9", c, pos);
        } else {
          why = fmt::format("{} at position {} {}", describe_byte(c), pos, k_token_allowed);
        }
        return invalid(fmt::format("{} {}: {}", kind, quoted(value), why));
      }
      if (token.size() > max_name_length) {
        return invalid(fmt::format("{} {}: token {} at position {} is {} characters (at most {})",
                                   kind, quoted(value), quoted(token), start, token.size(),
                                   max_name_length));
      }
    }
    if (end == value.size()) break;
    start = end + 1;
  }
  if (count > max_topic_tokens) {
    return invalid(fmt::format("{} {}: has {} tokens (at most {})", kind, quoted(value), count,
                               max_topic_tokens));
  }
  return {};
}

// A pattern as a set of token sequences: `fixed` tokens (concrete or "*"), then, when
// `tail`, one or more tokens of any value, up to the 8-token limit.
struct pattern_shape {
  std::vector<std::string_view> fixed;
  bool tail = false;

  explicit pattern_shape(const topic_pattern& p) : fixed(p.tokens()) {
    if (!fixed.empty() && fixed.back() == ">") {
      fixed.pop_back();
      tail = true;
    }
  }
  std::size_t min_length() const noexcept { return fixed.size() + (tail ? 1 : 0); }
  std::size_t max_length() const noexcept { return tail ? max_topic_tokens : fixed.size(); }
  bool has_length(std::size_t n) const noexcept { return n >= min_length() && n <= max_length(); }
  // The token at position i of the sequences of some valid length > i.
  std::string_view at(std::size_t i) const noexcept {
    return i < fixed.size() ? fixed[i] : std::string_view("*");
  }
};

// True when every sequence of length n in `sub` is in `grant`. With a grant restricted
// to one length, both are products of per-position sets, so it is position by position;
// a concrete grant token never contains "*" (there is always another value).
bool covers_at_length(const pattern_shape& grant, const pattern_shape& sub, std::size_t n) {
  if (!grant.has_length(n)) return false;
  for (std::size_t i = 0; i < n; ++i) {
    const auto g = grant.at(i);
    if (g != "*" && g != sub.at(i)) return false;
  }
  return true;
}

}  // namespace

std::string quoted(std::string_view value) {
  const bool cut = value.size() > k_quote_limit;
  const auto shown = cut ? value.substr(0, k_quote_prefix) : value;
  std::string out;
  out.reserve(shown.size() + 24);
  out += '"';
  for (char c : shown) append_escaped(out, c, '"');
  out += '"';
  if (cut) out += fmt::format("... ({} bytes)", value.size());
  return out;
}

std::string describe_byte(char c) {
  const auto u = static_cast<unsigned char>(c);
  std::string out;
  if (c >= 'A' && c <= 'Z') {
    out = "upper case ";
  } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
    out = "whitespace ";
  } else if (u < 0x20 || u == 0x7f) {
    out = "control character ";
  } else if (u >= 0x80) {
    out = "non-ASCII byte ";
  }
  out += '\'';
  append_escaped(out, c, '\'');
  out += '\'';
  return out;
}

result<namespace_name> namespace_name::make(std::string_view value) {
  if (auto r = check_single_token_name("namespace", value); !r) return std::move(r).error();
  return namespace_name(std::string(value));
}

result<participant_name> participant_name::make(std::string_view value) {
  if (value == broker_sender) {
    return invalid(fmt::format("participant name {}: reserved for system messages", quoted(value)));
  }
  if (auto r = check_single_token_name("participant name", value); !r) {
    return std::move(r).error();
  }
  return participant_name(std::string(value));
}

result<job_name> job_name::make(std::string_view value) {
  if (auto r = check_single_token_name("job name", value); !r) return std::move(r).error();
  return job_name(std::string(value));
}

result<sink_name> sink_name::make(std::string_view value) {
  if (auto r = check_single_token_name("sink name", value); !r) return std::move(r).error();
  return sink_name(std::string(value));
}

result<topic> topic::make(std::string_view value) {
  if (auto r = check_dotted_name("topic", value, false); !r) return std::move(r).error();
  return topic(std::string(value));
}

std::vector<std::string_view> topic::tokens() const {
  return split_tokens(view());
}

std::size_t topic::token_count() const noexcept {
  return static_cast<std::size_t>(std::count(str().begin(), str().end(), '.')) + 1;
}

result<topic_pattern> topic_pattern::make(std::string_view value) {
  if (auto r = check_dotted_name("topic pattern", value, true); !r) return std::move(r).error();
  return topic_pattern(std::string(value));
}

std::vector<std::string_view> topic_pattern::tokens() const {
  return split_tokens(view());
}

std::size_t topic_pattern::token_count() const noexcept {
  return static_cast<std::size_t>(std::count(str().begin(), str().end(), '.')) + 1;
}

bool topic_pattern::matches(const topic& t) const noexcept {
  token_reader p(view());
  token_reader s(t.view());
  while (!p.done()) {
    const auto want = p.next();
    if (want == ">") return !s.done();  // topics have at most 8 tokens, like the range of '>'
    if (s.done()) return false;
    const auto got = s.next();
    if (want != "*" && want != got) return false;
  }
  return s.done();
}

bool topic_pattern::covers(const topic_pattern& other) const {
  return covered_by_any(other, std::span<const topic_pattern>(this, 1));
}

bool covered_by_any(const topic_pattern& sub, std::span<const topic_pattern> grants) {
  const pattern_shape s(sub);
  std::vector<pattern_shape> g;
  g.reserve(grants.size());
  for (const auto& grant : grants) g.emplace_back(grant);
  // Different lengths may be covered by different grants, but one length must be
  // covered by one grant: with values outside every grant's concrete tokens in each
  // '*' position, a sequence escapes any grant that is narrower somewhere.
  for (std::size_t n = s.min_length(); n <= s.max_length(); ++n) {
    const bool covered = std::any_of(g.begin(), g.end(), [&](const pattern_shape& grant) {
      return covers_at_length(grant, s, n);
    });
    if (!covered) return false;
  }
  return true;
}

namespace {

// An id the broker makes: `prefix` (`t_`, `o_`) and 1 to 62 of a-z0-9.
result<void> check_broker_id(std::string_view value, std::string_view prefix,
                             std::string_view kind) {
  if (value.empty()) return invalid(fmt::format("{} is empty", kind));
  if (!value.starts_with(prefix)) {
    return invalid(fmt::format("{} {}: must start with {}", kind, quoted(value), quoted(prefix)));
  }
  if (value.size() == prefix.size()) {
    return invalid(fmt::format("{} {}: nothing after {}", kind, quoted(value), quoted(prefix)));
  }
  for (std::size_t i = prefix.size(); i < value.size(); ++i) {
    const char c = value[i];
    if (is_lower(c) || is_digit(c)) continue;
    return invalid(fmt::format("{} {}: {} at position {} (allowed after {}: a-z, 0-9)", kind,
                               quoted(value), describe_byte(c), i, quoted(prefix)));
  }
  if (value.size() > k_max_task_id_length) {
    return invalid(fmt::format("{} {}: is {} characters (at most {})", kind, quoted(value),
                               value.size(), k_max_task_id_length));
  }
  return {};
}

}  // namespace

result<task_id> task_id::make(std::string_view value) {
  if (auto r = check_broker_id(value, "t_", "task id"); !r) return r.error();
  return task_id(std::string(value));
}

result<operation_id> operation_id::make(std::string_view value) {
  if (auto r = check_broker_id(value, "o_", "operation id"); !r) return r.error();
  return operation_id(std::string(value));
}

}  // namespace amp
