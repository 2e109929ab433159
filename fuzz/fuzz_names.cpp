// fuzz_names: the name grammar of spec §2 (amp/names.hpp).
//
// Feeds the whole input to the `make()` of every name type (namespace, participant, job,
// topic, topic pattern, task id); then splits it at its first two '\n' into A, B and C
// and takes A and B as topic patterns P and Q, and C as a topic T and a pattern R.
//
// Asserts:
// - `make()` accepts exactly the grammar its header states (a reference written here),
//   and refuses with `invalid_name` and a message;
// - an accepted name reads back as the input, is accepted again, equal, with the same
//   hash; tokens join back to the input; a topic is also a pattern matching itself;
// - `quoted` and `describe_byte` give printable ASCII whatever the bytes;
// - `matches` agrees with the reference; `covers` and `covered_by_any` are sound: when they
//   say yes, every topic Q matches is matched by P (or by P or R). Checked over one topic
//   of each class that tells the patterns apart, when there are at most 4096 of them.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "amp/names.hpp"
#include "check.hpp"

namespace {

using amp::quoted;

bool lower(char c) {
  return c >= 'a' && c <= 'z';
}
bool digit(char c) {
  return c >= '0' && c <= '9';
}
bool name_char(char c) {
  return lower(c) || digit(c) || c == '_' || c == '-';
}

// ^[a-z][a-z0-9_-]{0,63}$: namespaces, participants and jobs.
bool reference_name(std::string_view s) {
  if (s.empty() || s.size() > 64 || !lower(s[0])) return false;
  for (char c : s.substr(1)) {
    if (!name_char(c)) return false;
  }
  return true;
}

// ^[a-z0-9][a-z0-9_-]{0,63}$: one token of a topic.
bool reference_token(std::string_view s) {
  if (s.empty() || s.size() > 64 || !(lower(s[0]) || digit(s[0]))) return false;
  for (char c : s.substr(1)) {
    if (!name_char(c)) return false;
  }
  return true;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  for (;;) {
    auto at = s.find(sep);
    parts.push_back(s.substr(0, at));
    if (at == std::string_view::npos) return parts;
    s.remove_prefix(at + 1);
  }
}

bool reference_topic(std::string_view s, bool pattern) {
  auto tokens = split(s, '.');
  if (tokens.size() > amp::max_topic_tokens) return false;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (pattern && (tokens[i] == "*" || (tokens[i] == ">" && i + 1 == tokens.size()))) continue;
    if (!reference_token(tokens[i])) return false;
  }
  return true;
}

// ^t_[0-9a-z]{1,62}$
bool reference_task_id(std::string_view s) {
  if (s.size() < 3 || s.size() > 64 || s.substr(0, 2) != "t_") return false;
  for (char c : s.substr(2)) {
    if (!(lower(c) || digit(c))) return false;
  }
  return true;
}

// `*` is any one token, a last `>` one or more further tokens.
bool reference_matches(const std::vector<std::string_view>& pattern,
                       const std::vector<std::string_view>& topic) {
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == ">") return topic.size() > i;
    if (i >= topic.size() || (pattern[i] != "*" && pattern[i] != topic[i])) return false;
  }
  return topic.size() == pattern.size();
}

bool printable_ascii(std::string_view s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

template <class Name>
void check_name(std::string_view input, bool expected) {
  auto made = Name::make(input);
  AMP_FUZZ_CHECK(made.has_value() == expected,
                 "make(" + quoted(input) + ") disagrees with the grammar: " +
                     (made ? std::string("accepted") : made.error().to_string()));
  if (!made) {
    AMP_FUZZ_CHECK(made.error() == amp::errc::invalid_name, made.error().to_string());
    AMP_FUZZ_CHECK(!made.error().message().empty(), quoted(input));
    return;
  }
  AMP_FUZZ_CHECK(made->str() == input, quoted(made->str()) + " for " + quoted(input));
  AMP_FUZZ_CHECK(made->view() == input, quoted(input));
  auto again = Name::make(made->str());
  AMP_FUZZ_CHECK(again && *again == *made && !(*again < *made), quoted(input));
  AMP_FUZZ_CHECK(std::hash<Name>{}(*again) == std::hash<Name>{}(*made), quoted(input));
}

template <class Name>
void check_tokens(const Name& n) {
  auto tokens = n.tokens();
  AMP_FUZZ_CHECK(tokens.size() == n.token_count() && tokens.size() >= 1 &&
                     tokens.size() <= amp::max_topic_tokens,
                 quoted(n.str()));
  std::string joined;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) joined += '.';
    joined += tokens[i];
  }
  AMP_FUZZ_CHECK(joined == n.str(), quoted(joined) + " from " + quoted(n.str()));
}

// One topic of each class that `patterns` can tell apart: at each position, one of the
// concrete tokens the patterns have there, or a token none of them has. Empty when there
// would be more than `limit`.
std::vector<amp::topic> distinguishing_topics(
    const std::vector<const amp::topic_pattern*>& patterns, std::size_t limit) {
  std::vector<std::vector<std::string>> choices(amp::max_topic_tokens);
  for (std::size_t i = 0; i < choices.size(); ++i) {
    for (const auto* p : patterns) {
      auto tokens = p->tokens();
      if (i < tokens.size() && tokens[i] != "*" && tokens[i] != ">") {
        choices[i].emplace_back(tokens[i]);
      }
    }
    for (int fresh = 0;; ++fresh) {
      auto token = "fresh" + std::to_string(fresh);
      bool taken = false;
      for (const auto& c : choices[i]) taken = taken || c == token;
      if (!taken) {
        choices[i].push_back(token);
        break;
      }
    }
  }
  std::size_t total = 0, product = 1;
  for (const auto& c : choices) {
    product *= c.size();
    total += product;
    if (total > limit) return {};
  }
  std::vector<amp::topic> topics;
  std::vector<std::string> prefix;
  std::function<void()> grow = [&] {
    if (!prefix.empty()) {
      std::string text;
      for (const auto& t : prefix) text += (text.empty() ? "" : ".") + t;
      auto t = amp::topic::make(text);
      AMP_FUZZ_CHECK(t.has_value(), quoted(text));
      topics.push_back(std::move(*t));
    }
    if (prefix.size() == amp::max_topic_tokens) return;
    for (const auto& c : choices[prefix.size()]) {
      prefix.push_back(c);
      grow();
      prefix.pop_back();
    }
  };
  grow();
  return topics;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);

  auto quoted_input = quoted(input);
  AMP_FUZZ_CHECK(printable_ascii(quoted_input), quoted_input);
  for (std::size_t i = 0; i < input.size() && i < 16; ++i) {
    auto d = amp::describe_byte(input[i]);
    AMP_FUZZ_CHECK(!d.empty() && printable_ascii(d), d);
  }

  check_name<amp::namespace_name>(input, reference_name(input));
  check_name<amp::participant_name>(input, reference_name(input));
  check_name<amp::job_name>(input, reference_name(input));
  check_name<amp::task_id>(input, reference_task_id(input));
  check_name<amp::topic>(input, reference_topic(input, false));
  check_name<amp::topic_pattern>(input, reference_topic(input, true));
  if (auto t = amp::topic::make(input)) {
    check_tokens(*t);
    auto p = amp::topic_pattern::make(input);
    AMP_FUZZ_CHECK(p && p->matches(*t) && p->covers(*p), quoted(input));
  }
  if (auto p = amp::topic_pattern::make(input)) {
    check_tokens(*p);
    AMP_FUZZ_CHECK(p->covers(*p), quoted(input));
    AMP_FUZZ_CHECK(amp::covered_by_any(*p, std::span(&*p, 1)), quoted(input));
    AMP_FUZZ_CHECK(!amp::covered_by_any(*p, {}), quoted(input));
  }

  auto parts = split(input, '\n');
  if (parts.size() < 3) return 0;
  auto rest = input.substr(parts[0].size() + parts[1].size() + 2);
  auto p = amp::topic_pattern::make(parts[0]);
  auto q = amp::topic_pattern::make(parts[1]);
  auto r = amp::topic_pattern::make(rest);
  auto t = amp::topic::make(rest);
  if (p && t) {
    AMP_FUZZ_CHECK(p->matches(*t) == reference_matches(p->tokens(), t->tokens()),
                   quoted(p->str()) + " on " + quoted(t->str()));
  }
  if (!p || !q) return 0;

  bool covers = p->covers(*q);
  std::vector<amp::topic_pattern> one{*p};
  bool by_one = amp::covered_by_any(*q, one);
  AMP_FUZZ_CHECK(covers == by_one, quoted(p->str()) + " covers " + quoted(q->str()) + ": " +
                                       (covers ? "yes" : "no") +
                                       ", covered_by_any: " + (by_one ? "yes" : "no"));
  std::vector<amp::topic_pattern> two{*p};
  if (r) two.push_back(*r);
  bool by_two = amp::covered_by_any(*q, two);
  if (!covers && !by_two) return 0;

  std::vector<const amp::topic_pattern*> all{&*p, &*q};
  if (r) all.push_back(&*r);
  for (const auto& topic : distinguishing_topics(all, 4096)) {
    if (!q->matches(topic)) continue;
    bool by_p = p->matches(topic);
    AMP_FUZZ_CHECK(!covers || by_p, quoted(p->str()) + " covers " + quoted(q->str()) +
                                        " but does not match " + quoted(topic.str()));
    bool by_r = r && r->matches(topic);
    AMP_FUZZ_CHECK(!by_two || by_p || by_r, "covered_by_any(" + quoted(q->str()) + ", {" +
                                                quoted(p->str()) + ", " +
                                                (r ? quoted(r->str()) : "") +
                                                "}) but neither matches " + quoted(topic.str()));
  }
  return 0;
}
