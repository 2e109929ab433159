#pragma once

/// \file
/// The names of AMP (spec §2) as validated value types: namespaces, participants, jobs,
/// topics, topic patterns and task ids. An object of these types always holds a value
/// inside the grammar: the only way to get one is `make()`, which refuses anything else
/// with `errc::invalid_name` and a message that says which value is wrong, where, and why.
/// Nothing a participant supplies reaches a NATS subject without passing through here.
///
/// Every function in this header is pure and thread-safe; the types are regular values
/// (copyable, comparable, hashable) with no implicit conversion from or to strings.
/// A moved-from object may only be assigned to or destroyed.

#include <compare>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "amp/result.hpp"

namespace amp {

/// The sender of system messages. It is outside the participant grammar, so no
/// participant can ever have this name.
inline constexpr std::string_view broker_sender = "$broker";

/// The longest namespace, participant or job name, and the longest topic token.
inline constexpr std::size_t max_name_length = 64;
/// The most tokens a topic or topic pattern has.
inline constexpr std::size_t max_topic_tokens = 8;

/// Quotes a raw value for an error message or a log line: `"` + value + `"`, with
/// printable ASCII kept as is, `"` and `\` escaped with a backslash, tab, newline and
/// carriage return written `\t`, `\n`, `\r`, and every other byte (controls, DEL,
/// non-ASCII) written `\xHH`. A value over 96 bytes is cut to its first 64 bytes,
/// followed by `...` and its length: `"aaaa…"... (1000 bytes)`. The result is always
/// printable ASCII, whatever the input.
std::string quoted(std::string_view value);

/// Describes one byte for an error message: `upper case 'B'`, `whitespace '\t'`,
/// `control character '\x01'`, `non-ASCII byte '\xc3'`, or the quoted character
/// itself (`'$'`). Always printable ASCII.
std::string describe_byte(char c);

namespace detail {

/// The common part of the validated names: the string, read access and comparisons
/// between values of the same type only. Not a type to use by itself.
template <class Derived>
class validated_name {
 public:
  /// The name as a string.
  const std::string& str() const noexcept { return value_; }
  /// The name as a view; valid while this object lives and is not assigned to.
  std::string_view view() const noexcept { return value_; }

  friend bool operator==(const Derived& a, const Derived& b) noexcept { return a.str() == b.str(); }
  friend std::strong_ordering operator<=>(const Derived& a, const Derived& b) noexcept {
    return a.str().compare(b.str()) <=> 0;
  }

 protected:
  explicit validated_name(std::string value) : value_(std::move(value)) {}

 private:
  std::string value_;
};

}  // namespace detail

/// A namespace (`ns`): `^[a-z][a-z0-9_-]{0,63}$`.
class namespace_name final : public detail::validated_name<namespace_name> {
 public:
  /// Validates `value`. Errors: `invalid_name` when it is outside the grammar; the
  /// message names the value and the first thing wrong with it.
  static result<namespace_name> make(std::string_view value);

 private:
  explicit namespace_name(std::string value) : validated_name(std::move(value)) {}
};

/// A participant name: `^[a-z][a-z0-9_-]{0,63}$`. `$broker` (`broker_sender`) is never
/// one.
class participant_name final : public detail::validated_name<participant_name> {
 public:
  /// Validates `value`. Errors: `invalid_name` when it is outside the grammar, with a
  /// message of its own for `$broker` ("reserved for system messages").
  static result<participant_name> make(std::string_view value);

 private:
  explicit participant_name(std::string value) : validated_name(std::move(value)) {}
};

/// A job name: `^[a-z][a-z0-9_-]{0,63}$`.
class job_name final : public detail::validated_name<job_name> {
 public:
  /// Validates `value`. Errors: `invalid_name` when it is outside the grammar.
  static result<job_name> make(std::string_view value);

 private:
  explicit job_name(std::string value) : validated_name(std::move(value)) {}
};

/// A sink's name (`amp-sink-v1.md`): `^[a-z][a-z0-9_-]{0,63}$`. It names the sink's
/// durable consumer and its dead-letter subject.
class sink_name final : public detail::validated_name<sink_name> {
 public:
  /// Validates `value`. Errors: `invalid_name` when it is outside the grammar.
  static result<sink_name> make(std::string_view value);

 private:
  explicit sink_name(std::string value) : validated_name(std::move(value)) {}
};

/// A concrete topic: 1 to 8 tokens joined by `.`, each `^[a-z0-9][a-z0-9_-]{0,63}$`.
class topic final : public detail::validated_name<topic> {
 public:
  /// Validates `value`. Errors: `invalid_name` for an empty value, an empty token
  /// (including a leading or trailing `.`), a token outside the grammar, a wildcard,
  /// or more than 8 tokens.
  static result<topic> make(std::string_view value);

  /// The tokens, in order; the views point into this object.
  std::vector<std::string_view> tokens() const;
  /// The number of tokens, 1 to 8.
  std::size_t token_count() const noexcept;

 private:
  explicit topic(std::string value) : validated_name(std::move(value)) {}
};

/// A topic pattern, as used by `subscribe` and by the `publish`/`subscribe` grants:
/// like a topic, but a token may be `*` (any one token) and the last token may be `>`
/// (one or more further tokens, up to the 8-token limit of topics). A bare `>` matches
/// every topic. A concrete topic is a pattern that matches only itself.
class topic_pattern final : public detail::validated_name<topic_pattern> {
 public:
  /// Validates `value`. Errors: `invalid_name` as for `topic`, and for a `*` or `>`
  /// that is not a whole token, or a `>` that is not the last token.
  static result<topic_pattern> make(std::string_view value);

  /// The tokens, in order (`*` and `>` included); the views point into this object.
  std::vector<std::string_view> tokens() const;
  /// The number of tokens, 1 to 8, `>` included.
  std::size_t token_count() const noexcept;

  /// True when `t` is one of the topics this pattern matches.
  bool matches(const topic& t) const noexcept;

  /// True when every topic `other` could match is matched by this pattern:
  /// `news.>` covers `news.*`, `news.*.x` and `news.eu`; `news.*` does not cover
  /// `news.>`, and `news.>` does not cover `>`.
  bool covers(const topic_pattern& other) const;

 private:
  explicit topic_pattern(std::string value) : validated_name(std::move(value)) {}
};

/// The spec's rule for subscriptions: true when every topic `sub` could match is
/// matched by at least one of `grants`. The grants act together: `a.>` is covered by
/// {`a.*`, `a.*.>`} though by neither alone. A `*` is covered only by a `*` or `>` at
/// that position, never by any number of concrete tokens ({`a.x`, `a.y`} does not cover
/// `a.*`). False when `grants` is empty.
bool covered_by_any(const topic_pattern& sub, std::span<const topic_pattern> grants);

/// A task id, made by the broker and sent back by clients: `^t_[0-9a-z]{1,62}$`.
class task_id final : public detail::validated_name<task_id> {
 public:
  /// Validates `value`. Errors: `invalid_name` when it is outside the grammar.
  static result<task_id> make(std::string_view value);

 private:
  explicit task_id(std::string value) : validated_name(std::move(value)) {}
};

/// An operation id (spec §12), made by the broker and sent back by clients:
/// `^o_[0-9a-z]{1,62}$`.
class operation_id final : public detail::validated_name<operation_id> {
 public:
  /// Validates `value`. Errors: `invalid_name` when it is outside the grammar.
  static result<operation_id> make(std::string_view value);

 private:
  explicit operation_id(std::string value) : validated_name(std::move(value)) {}
};

}  // namespace amp

/// Hashing of the names, by their string value.
template <>
struct std::hash<amp::namespace_name> {
  std::size_t operator()(const amp::namespace_name& n) const noexcept {
    return std::hash<std::string_view>{}(n.view());
  }
};
template <>
struct std::hash<amp::participant_name> {
  std::size_t operator()(const amp::participant_name& n) const noexcept {
    return std::hash<std::string_view>{}(n.view());
  }
};
template <>
struct std::hash<amp::job_name> {
  std::size_t operator()(const amp::job_name& n) const noexcept {
    return std::hash<std::string_view>{}(n.view());
  }
};
template <>
struct std::hash<amp::sink_name> {
  std::size_t operator()(const amp::sink_name& n) const noexcept {
    return std::hash<std::string_view>{}(n.view());
  }
};

template <>
struct std::hash<amp::topic> {
  std::size_t operator()(const amp::topic& n) const noexcept {
    return std::hash<std::string_view>{}(n.view());
  }
};
template <>
struct std::hash<amp::topic_pattern> {
  std::size_t operator()(const amp::topic_pattern& n) const noexcept {
    return std::hash<std::string_view>{}(n.view());
  }
};
template <>
struct std::hash<amp::task_id> {
  std::size_t operator()(const amp::task_id& n) const noexcept {
    return std::hash<std::string_view>{}(n.view());
  }
};
template <>
struct std::hash<amp::operation_id> {
  std::size_t operator()(const amp::operation_id& n) const noexcept {
    return std::hash<std::string_view>{}(n.view());
  }
};
