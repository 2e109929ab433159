#pragma once

// A valijson adapter over simdjson's DOM API, and the simdjson helpers that json.cpp,
// schema.cpp and envelope.cpp share. Private to the library: simdjson and valijson never
// appear in include/amp.
//
// simdjson's DOM is read-only and its element handles are cheap (a document pointer and
// a tape index), so every class below is a small value that refers into a document that
// must outlive it. DOM iterators only go forward; valijson also asks for `operator--` and
// `advance` (uniqueItems, JSON Pointer resolution), which re-walk from the start.

#ifndef VALIJSON_USE_EXCEPTIONS
#define VALIJSON_USE_EXCEPTIONS 1
#endif

#include <simdjson.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <valijson/exceptions.hpp>
#include <valijson/internal/adapter.hpp>
#include <valijson/internal/basic_adapter.hpp>
#include <valijson/internal/frozen_value.hpp>
#include <valijson/validation_results.hpp>

#include "amp/error.hpp"
#include "amp/result.hpp"
#include "amp/schema.hpp"
#include "amp/timestamp.hpp"

namespace amp::detail {

namespace dom = simdjson::dom;

/// A thread's reusable parser keeps buffers sized by the largest document it parsed. This
/// gives them back when the scope ends if they grew past 256 KiB, so that every worker
/// thread does not keep the largest frame it ever saw (elements of the document must not
/// outlive the scope).
class parser_release {
 public:
  explicit parser_release(dom::parser& p) noexcept : parser_(p) {}
  ~parser_release() {
    if (parser_.capacity() > k_keep_bytes) parser_ = dom::parser();
  }
  parser_release(const parser_release&) = delete;
  parser_release& operator=(const parser_release&) = delete;

 private:
  static constexpr std::size_t k_keep_bytes = 256 * 1024;
  dom::parser& parser_;
};

/// Member `key` of `o` when it is a string, else "" (absent, or another type).
inline std::string string_member(dom::object o, std::string_view key) {
  std::string_view s;
  if (o[key].get(s) != simdjson::SUCCESS) return {};
  return std::string(s);
}

/// Member `key` of `o` as an instant: the epoch when absent or null. Error `internal`,
/// naming `key`, when it is not an RFC 3339 string (what a stored record must hold).
inline result<time_point> time_member(dom::object o, std::string_view key) {
  dom::element e;
  if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) return time_point{};
  std::string_view s;
  if (e.get(s) == simdjson::SUCCESS) {
    if (auto t = parse_timestamp(s)) return t;
  }
  return unexpected(errc::internal, std::string(key) + " is not a timestamp");
}

/// The error for text that simdjson refuses.
inline error not_json_error(simdjson::error_code code) {
  return error(errc::bad_request, std::string("not valid JSON: ") + simdjson::error_message(code));
}

/// Appends `/name` to a JSON Pointer, escaping `~` and `/` (RFC 6901).
inline void append_pointer_token(std::string& pointer, std::string_view name) {
  pointer.push_back('/');
  for (char c : name) {
    if (c == '~') {
      pointer.append("~0");
    } else if (c == '/') {
      pointer.append("~1");
    } else {
      pointer.push_back(c);
    }
  }
}

/// A constant document parsed once, for the process-wide empty array and object.
struct constant_document {
  explicit constant_document(std::string_view text) {
    dom::parser parser;
    if (parser.parse_into_document(doc, text.data(), text.size()).get(root)) {
      throw std::logic_error("constant JSON does not parse");
    }
  }
  dom::document doc;
  dom::element root;
};

// "an array", "a number", "null"...: what a JSON value is, for error messages.
inline const char* type_name(dom::element_type t) {
  switch (t) {
    case dom::element_type::ARRAY: return "an array";
    case dom::element_type::OBJECT: return "an object";
    case dom::element_type::INT64:
    case dom::element_type::UINT64:
    case dom::element_type::DOUBLE: return "a number";
    case dom::element_type::STRING: return "a string";
    case dom::element_type::BOOL: return "a boolean";
    case dom::element_type::NULL_VALUE: return "null";
  }
  return "a value";
}

inline dom::element empty_object_element() {
  static const constant_document constant("{}");
  return constant.root;
}

inline dom::element empty_array_element() {
  static const constant_document constant("[]");
  return constant.root;
}

/// A number with no fractional part that fits int64 counts as an integer (draft 7).
inline bool integral_double(double d, std::int64_t& out) {
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || std::trunc(d) != d) {
    return false;
  }
  out = static_cast<std::int64_t>(d);
  return true;
}

/// The number of children of an array or object: simdjson saturates its count at 0xFFFFFF.
template <class Container>
std::size_t count_children(const Container& c) {
  std::size_t n = c.size();
  if (n < 0xFFFFFF) {
    return n;
  }
  n = 0;
  for (auto it = c.begin(); it != c.end(); ++it) {
    ++n;
  }
  return n;
}

/// Bounds the second validation pass of a document that failed the first, a pass that
/// only looks for an error to report: while one is active on a thread, visiting a child
/// value throws `exhausted` once `max_errors` errors are known or `max_visits` children
/// were visited, so a large invalid document costs no more than a bounded search.
class error_search {
 public:
  struct exhausted {};
  static constexpr std::size_t max_errors = 8;
  static constexpr std::size_t max_visits = 65536;

  explicit error_search(const valijson::ValidationResults& results)
      : results_(results), previous_(active_) {
    active_ = this;
  }
  ~error_search() { active_ = previous_; }
  error_search(const error_search&) = delete;
  error_search& operator=(const error_search&) = delete;

  /// Called for each child value that valijson visits; cheap when no search is active.
  static void visit() {
    if (active_ != nullptr) {
      active_->count();
    }
  }

 private:
  void count() {
    if (results_.numErrors() >= max_errors || ++visits_ > max_visits) {
      throw exhausted{};
    }
  }

  static inline thread_local error_search* active_ = nullptr;
  const valijson::ValidationResults& results_;
  error_search* previous_;
  std::size_t visits_ = 0;
};

class simdjson_adapter;
using simdjson_member = std::pair<std::string, simdjson_adapter>;

class simdjson_array_iterator {
 public:
  using iterator_category = std::bidirectional_iterator_tag;
  using value_type = simdjson_adapter;
  using difference_type = std::ptrdiff_t;
  using pointer = simdjson_adapter*;
  using reference = simdjson_adapter;

  simdjson_array_iterator(dom::array array, dom::array::iterator it) : array_(array), it_(it) {}

  simdjson_adapter operator*() const;
  valijson::adapters::DerefProxy<simdjson_adapter> operator->() const;

  bool operator==(const simdjson_array_iterator& other) const { return it_ == other.it_; }
  bool operator!=(const simdjson_array_iterator& other) const { return !(it_ == other.it_); }

  simdjson_array_iterator& operator++() {
    ++it_;
    return *this;
  }
  simdjson_array_iterator operator++(int) {
    auto before = *this;
    ++it_;
    return before;
  }
  /// Steps back one element (linear: the tape has no back links). Stays on the first.
  simdjson_array_iterator& operator--() {
    auto previous = array_.begin();
    for (auto cur = array_.begin(); cur != it_; ++cur) {
      previous = cur;
    }
    it_ = previous;
    return *this;
  }
  void advance(std::ptrdiff_t n) {
    for (; n > 0; --n) {
      ++it_;
    }
    for (; n < 0; ++n) {
      --*this;
    }
  }

 private:
  dom::array array_;
  dom::array::iterator it_;
};

class simdjson_member_iterator {
 public:
  using iterator_category = std::bidirectional_iterator_tag;
  using value_type = simdjson_member;
  using difference_type = std::ptrdiff_t;
  using pointer = simdjson_member*;
  using reference = simdjson_member;

  simdjson_member_iterator(dom::object object, dom::object::iterator it)
      : object_(object), it_(it) {}

  simdjson_member operator*() const;
  valijson::adapters::DerefProxy<simdjson_member> operator->() const;

  bool operator==(const simdjson_member_iterator& other) const { return it_ == other.it_; }
  bool operator!=(const simdjson_member_iterator& other) const { return !(it_ == other.it_); }

  simdjson_member_iterator& operator++() {
    ++it_;
    return *this;
  }
  simdjson_member_iterator operator++(int) {
    auto before = *this;
    ++it_;
    return before;
  }
  simdjson_member_iterator& operator--() {
    auto previous = object_.begin();
    for (auto cur = object_.begin(); cur != it_; ++cur) {
      previous = cur;
    }
    it_ = previous;
    return *this;
  }

 private:
  dom::object object_;
  dom::object::iterator it_;
};

class simdjson_array {
 public:
  using const_iterator = simdjson_array_iterator;
  using iterator = simdjson_array_iterator;

  simdjson_array() : array_(empty_array_element().get_array().value_unsafe()) {}
  explicit simdjson_array(dom::array array) : array_(array) {}

  simdjson_array_iterator begin() const { return {array_, array_.begin()}; }
  simdjson_array_iterator end() const { return {array_, array_.end()}; }
  std::size_t size() const { return count_children(array_); }

 private:
  dom::array array_;
};

class simdjson_object {
 public:
  using const_iterator = simdjson_member_iterator;
  using iterator = simdjson_member_iterator;

  simdjson_object() : object_(empty_object_element().get_object().value_unsafe()) {}
  explicit simdjson_object(dom::object object) : object_(object) {}

  simdjson_member_iterator begin() const { return {object_, object_.begin()}; }
  simdjson_member_iterator end() const { return {object_, object_.end()}; }
  /// The first member named `name` (linear), or `end()`.
  simdjson_member_iterator find(const std::string& name) const {
    auto it = object_.begin();
    while (it != object_.end() && it.key() != name) {
      ++it;
    }
    return {object_, it};
  }
  std::size_t size() const { return count_children(object_); }

 private:
  dom::object object_;
};

/// A copy of a value that outlives the document it came from (valijson keeps `enum` and
/// `const` values this way). The copy is an immutable document shared between clones, so
/// concurrent reads are safe.
class simdjson_frozen_value final : public valijson::adapters::FrozenValue {
 public:
  explicit simdjson_frozen_value(std::shared_ptr<const dom::document> doc) : doc_(std::move(doc)) {}

  FrozenValue* clone() const override { return new simdjson_frozen_value(doc_); }
  bool equalTo(const valijson::adapters::Adapter& other, bool strict) const override;

 private:
  std::shared_ptr<const dom::document> doc_;
};

/// What `BasicAdapter` needs to know about one value; the casting rules are valijson's.
class simdjson_value {
 public:
  simdjson_value() : element_(empty_object_element()) {}
  explicit simdjson_value(dom::element element) : element_(element) {}

  valijson::adapters::FrozenValue* freeze() const {
    auto doc = std::make_shared<dom::document>();
    const std::string text = simdjson::minify(element_);
    dom::parser parser;
    if (parser.parse_into_document(*doc, text.data(), text.size()).error()) {
      throw std::runtime_error("cannot copy a JSON value");
    }
    return new simdjson_frozen_value(std::move(doc));
  }

  std::optional<simdjson_array> getArrayOptional() const {
    if (!isArray()) {
      return std::nullopt;
    }
    return simdjson_array(element_.get_array().value_unsafe());
  }
  bool getArraySize(std::size_t& result) const {
    if (!isArray()) {
      return false;
    }
    result = count_children(element_.get_array().value_unsafe());
    return true;
  }
  std::optional<simdjson_object> getObjectOptional() const {
    if (!isObject()) {
      return std::nullopt;
    }
    return simdjson_object(element_.get_object().value_unsafe());
  }
  bool getObjectSize(std::size_t& result) const {
    if (!isObject()) {
      return false;
    }
    result = count_children(element_.get_object().value_unsafe());
    return true;
  }

  bool getBool(bool& result) const { return !element_.get_bool().get(result); }
  bool getString(std::string& result) const {
    std::string_view s;
    if (element_.get_string().get(s)) {
      return false;
    }
    result.assign(s);
    return true;
  }
  bool getDouble(double& result) const {
    if (!isDouble()) {
      return false;
    }
    if (type() == dom::element_type::UINT64) {
      result = static_cast<double>(element_.get_uint64().value_unsafe());
    } else {
      result = element_.get_double().value_unsafe();
    }
    return true;
  }
  bool getInteger(std::int64_t& result) const {
    if (type() == dom::element_type::INT64) {
      result = element_.get_int64().value_unsafe();
      return true;
    }
    return type() == dom::element_type::DOUBLE &&
           integral_double(element_.get_double().value_unsafe(), result);
  }

  static bool hasStrictTypes() { return true; }

  bool isArray() const { return type() == dom::element_type::ARRAY; }
  bool isBool() const { return type() == dom::element_type::BOOL; }
  bool isNull() const { return type() == dom::element_type::NULL_VALUE; }
  bool isObject() const { return type() == dom::element_type::OBJECT; }
  bool isString() const { return type() == dom::element_type::STRING; }
  bool isInteger() const {
    std::int64_t ignored = 0;
    return getInteger(ignored);
  }
  // An integer beyond int64 (simdjson's UINT64) can only be compared as a double.
  bool isDouble() const {
    return type() == dom::element_type::UINT64 ||
           (type() == dom::element_type::DOUBLE && !isInteger());
  }
  bool isNumber() const {
    auto t = type();
    return t == dom::element_type::INT64 || t == dom::element_type::UINT64 ||
           t == dom::element_type::DOUBLE;
  }

 private:
  dom::element_type type() const { return element_.type(); }

  dom::element element_;
};

class simdjson_adapter
    : public valijson::adapters::BasicAdapter<simdjson_adapter, simdjson_array, simdjson_member,
                                              simdjson_object, simdjson_value> {
 public:
  simdjson_adapter() = default;
  explicit simdjson_adapter(dom::element element) : BasicAdapter(simdjson_value(element)) {}
};

inline simdjson_adapter simdjson_array_iterator::operator*() const {
  error_search::visit();
  return simdjson_adapter(*it_);
}
inline valijson::adapters::DerefProxy<simdjson_adapter> simdjson_array_iterator::operator->()
    const {
  return valijson::adapters::DerefProxy<simdjson_adapter>(**this);
}
inline simdjson_member simdjson_member_iterator::operator*() const {
  error_search::visit();
  return simdjson_member(std::string(it_.key()), simdjson_adapter(it_.value()));
}
inline valijson::adapters::DerefProxy<simdjson_member> simdjson_member_iterator::operator->()
    const {
  return valijson::adapters::DerefProxy<simdjson_member>(**this);
}
inline bool simdjson_frozen_value::equalTo(const valijson::adapters::Adapter& other,
                                           bool strict) const {
  return simdjson_adapter(doc_->root()).equalTo(other, strict);
}

/// Validation of an already parsed document, for callers inside the library that hold
/// the DOM anyway (parse_envelope). Defined in schema.cpp.
struct schema_access {
  /// As `json_schema::validate`, on the root of a parsed document.
  static result<void> validate(const json_schema& schema, dom::element root);
  /// As `json_schema::parse`, for a schema derived from amp's own (anchored, bounded
  /// patterns): matched with the backtracking matcher, as `json_schema::embedded` does.
  static result<json_schema> parse_own(std::string_view schema_json);
  /// Both: `own` chooses the backtracking matcher.
  static result<json_schema> parse(std::string_view schema_json, bool own);
};

}  // namespace amp::detail

template <>
struct valijson::adapters::AdapterTraits<amp::detail::simdjson_adapter> {
  using DocumentType = simdjson::dom::element;
  static std::string adapterName() { return "simdjson_adapter"; }
};
