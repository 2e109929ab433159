#include "amp/schema.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "amp/detail/embedded_schemas.hpp"
#include "amp/json.hpp"
#include "detail/simdjson_adapter.hpp"
#include "detail/simple_pattern.hpp"
// valijson after the adapter: its templates need the adapter's traits.
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

namespace amp {

struct json_schema::impl {
  valijson::Schema schema;
};

namespace {

namespace dom = simdjson::dom;
using valijson::ValidationResults;
using valijson::adapters::Adapter;

std::string pointer_token(std::string_view name) {
  std::string out;
  detail::append_pointer_token(out, name);
  return out;
}

// ---- Keywords amp checks itself -----------------------------------------------------
// valijson matches `pattern`, `patternProperties` and `format` with std::regex in its
// default mode, which backtracks recursively (one stack frame per character, exponential
// time on some patterns), and checks `uniqueItems` by comparing every pair of items. Before
// valijson reads a schema, `pattern`, `format` and `uniqueItems` are renamed to the
// keywords below, whose constraints run in time and stack bounded by the string or array:
// patterns in libstdc++'s non-recursive automaton mode (std::regex_constants::__polynomial),
// formats by hand, uniqueness by sorting. `patternProperties` is refused.

constexpr std::string_view pattern_keyword = "x-amp-pattern";
constexpr std::string_view format_keyword = "x-amp-format";
constexpr std::string_view unique_keyword = "x-amp-uniqueItems";

constexpr auto regex_flags = std::regex::ECMAScript | std::regex_constants::__polynomial;

// regex_search in the automaton mode tries every start position (quadratic); a match of
// the pattern between two "anything" runs is the same search in one pass. `^` and `$` keep
// their meaning: without the multiline flag they hold only at the ends of the input.
std::regex compile_search(std::string_view pattern) {
  std::regex alone{std::string(pattern), regex_flags};  // reports errors of the pattern itself
  return std::regex{"[\\s\\S]*(?:" + std::string(pattern) + ")[\\s\\S]*", regex_flags};
}

template <class Derived>
class own_constraint : public valijson::constraints::PolyConstraint {
 private:
  Constraint* cloneInto(void* memory) const override {
    return new (memory) Derived(static_cast<const Derived&>(*this));
  }
  std::size_t sizeOf() const override { return sizeof(Derived); }
};

bool fail_with(ValidationResults* results, const std::vector<std::string>& context,
               std::string description) {
  if (results) {
    results->pushError(context, std::move(description));
  }
  return false;
}

// amp's own schemas (json_schema::embedded) use only anchored patterns with bounded
// repetitions, which the backtracking matcher runs in bounded depth and time two to four
// times faster than the automaton (tests/unit/frame_schemas_test.cpp feeds them 100 KB
// strings); every other schema gets the automaton.
enum class matcher { automaton, backtracking };

class pattern_constraint final : public own_constraint<pattern_constraint> {
 public:
  pattern_constraint(std::string_view pattern, matcher m)
      : simple_(detail::simple_pattern::parse(pattern)), matcher_(m) {
    if (!simple_) {
      regex_ = std::make_shared<const std::regex>(
          m == matcher::automaton ? compile_search(pattern) : std::regex(std::string(pattern)));
    }
  }

  bool validate(const Adapter& target, const std::vector<std::string>& context,
                ValidationResults* results) const override {
    if (!target.isString()) {
      return true;
    }
    const std::string s = target.getString();
    if (simple_                          ? simple_->matches(s)
        : matcher_ == matcher::automaton ? std::regex_match(s, *regex_)
                                         : std::regex_search(s, *regex_)) {
      return true;
    }
    return fail_with(results, context, "Failed to match regex specified by 'pattern' constraint.");
  }

 private:
  std::optional<detail::simple_pattern> simple_;  // matched by hand when it is that simple
  std::shared_ptr<const std::regex> regex_;       // const matching is safe from any thread
  matcher matcher_;
};

// ---- RFC 3339 dates and times (`format`), by hand --------------------------------------

bool take_digits(std::string_view s, std::size_t& at, std::size_t n, int& value) {
  if (s.size() - at < n) {
    return false;
  }
  value = 0;
  for (std::size_t end = at + n; at < end; ++at) {
    if (s[at] < '0' || s[at] > '9') {
      return false;
    }
    value = value * 10 + (s[at] - '0');
  }
  return true;
}

bool take_char(std::string_view s, std::size_t& at, std::string_view one_of) {
  if (at < s.size() && one_of.find(s[at]) != std::string_view::npos) {
    ++at;
    return true;
  }
  return false;
}

// full-date = date-fullyear "-" date-month "-" date-mday
bool take_date(std::string_view s, std::size_t& at) {
  int year = 0;
  int month = 0;
  int day = 0;
  if (!take_digits(s, at, 4, year) || !take_char(s, at, "-") || !take_digits(s, at, 2, month) ||
      !take_char(s, at, "-") || !take_digits(s, at, 2, day) || month < 1 || month > 12) {
    return false;
  }
  static constexpr int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  const int last = days[month - 1] + (month == 2 && leap ? 1 : 0);
  return day >= 1 && day <= last;
}

// full-time = partial-time time-offset; a leap second (:60) is allowed, as RFC 3339 does.
bool take_time(std::string_view s, std::size_t& at) {
  int hour = 0;
  int minute = 0;
  int second = 0;
  if (!take_digits(s, at, 2, hour) || !take_char(s, at, ":") || !take_digits(s, at, 2, minute) ||
      !take_char(s, at, ":") || !take_digits(s, at, 2, second) || hour > 23 || minute > 59 ||
      second > 60) {
    return false;
  }
  if (take_char(s, at, ".")) {
    const std::size_t first = at;
    while (at < s.size() && s[at] >= '0' && s[at] <= '9') {
      ++at;
    }
    if (at == first) {
      return false;
    }
  }
  if (take_char(s, at, "Zz")) {
    return true;
  }
  int offset_hour = 0;
  int offset_minute = 0;
  return take_char(s, at, "+-") && take_digits(s, at, 2, offset_hour) && take_char(s, at, ":") &&
         take_digits(s, at, 2, offset_minute) && offset_hour <= 23 && offset_minute <= 59;
}

bool valid_format(std::string_view format, std::string_view s) {
  std::size_t at = 0;
  if (format == "date") {
    return take_date(s, at) && at == s.size();
  }
  if (format == "time") {
    return take_time(s, at) && at == s.size();
  }
  return take_date(s, at) && take_char(s, at, "Tt") && take_time(s, at) && at == s.size();
}

class format_constraint final : public own_constraint<format_constraint> {
 public:
  explicit format_constraint(std::string format) : format_(std::move(format)) {}

  // Formats other than these three are not checked, as draft 7 allows.
  static bool checked(std::string_view format) {
    return format == "date" || format == "time" || format == "date-time";
  }

  bool validate(const Adapter& target, const std::vector<std::string>& context,
                ValidationResults* results) const override {
    if (!checked(format_) || !target.isString()) {
      return true;
    }
    if (valid_format(format_, target.getString())) {
      return true;
    }
    return fail_with(results, context, "String should be a valid " + format_ + ".");
  }

 private:
  std::string format_;
};

// ---- uniqueItems: sort the items' canonical forms ---------------------------------------

// Equal JSON values (draft 7: 1 equals 1.0, members in any order) have equal forms.
void canonical_form(const Adapter& v, std::string& out) {
  if (v.isNull()) {
    out += 'n';
  } else if (v.isBool()) {
    out += v.getBool() ? 't' : 'f';
  } else if (v.isInteger()) {
    out += 'i';
    out += std::to_string(v.getInteger());
  } else if (v.isNumber()) {
    char buffer[32];
    auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v.getNumber());
    out += 'd';
    out.append(buffer, ec == std::errc() ? end : buffer);
  } else if (v.isString()) {
    const std::string s = v.getString();
    out += 's';
    out += std::to_string(s.size());
    out += ':';
    out += s;
  } else if (v.isArray()) {
    out += '[';
    v.applyToArray([&](const Adapter& item) {
      canonical_form(item, out);
      out += ',';
      return true;
    });
    out += ']';
  } else if (v.isObject()) {
    std::vector<std::pair<std::string, std::string>> members;
    v.applyToObject([&](const std::string& name, const Adapter& value) {
      members.emplace_back(name, std::string());
      canonical_form(value, members.back().second);
      return true;
    });
    std::sort(members.begin(), members.end());
    out += '{';
    for (const auto& [name, value] : members) {
      out += std::to_string(name.size());
      out += ':';
      out += name;
      out += value;
      out += ',';
    }
    out += '}';
  }
}

class unique_items_constraint final : public own_constraint<unique_items_constraint> {
 public:
  bool validate(const Adapter& target, const std::vector<std::string>& context,
                ValidationResults* results) const override {
    if (!target.isArray()) {
      return true;
    }
    std::vector<std::pair<std::string, std::size_t>> forms;  // (form, index)
    target.applyToArray([&](const Adapter& item) {
      forms.emplace_back(std::string(), forms.size());
      canonical_form(item, forms.back().first);
      return true;
    });
    std::sort(forms.begin(), forms.end());
    // The first duplicate in document order: the lowest second index of an equal pair.
    std::optional<std::pair<std::size_t, std::size_t>> first;
    for (std::size_t i = 1; i < forms.size(); ++i) {
      if (forms[i].first == forms[i - 1].first && (!first || forms[i].second < first->second)) {
        first = std::pair(forms[i - 1].second, forms[i].second);
      }
    }
    if (!first) {
      return true;
    }
    return fail_with(results, context,
                     "Elements at indexes #" + std::to_string(first->first) + " and #" +
                         std::to_string(first->second) + " violate uniqueness constraint.");
  }
};

template <class Make>
class builder final : public valijson::ConstraintBuilder {
 public:
  explicit builder(Make make) : make_(std::move(make)) {}
  valijson::constraints::Constraint* make(const Adapter& value) const override {
    return make_(value);
  }

 private:
  Make make_;
};

template <class Make>
const valijson::ConstraintBuilder* new_builder(Make make) {
  return new builder<Make>(std::move(make));
}

void add_own_keywords(valijson::SchemaParser& parser, matcher m) {
  parser.addConstraintBuilder(std::string(pattern_keyword), new_builder([m](const Adapter& v) {
                                return new pattern_constraint(v.getString(), m);
                              }));
  parser.addConstraintBuilder(std::string(format_keyword), new_builder([](const Adapter& v) {
                                return new format_constraint(v.getString());
                              }));
  parser.addConstraintBuilder(std::string(unique_keyword), new_builder([](const Adapter&) {
                                return new unique_items_constraint();
                              }));
}

// ---- Rewriting a schema for valijson -------------------------------------------------
// Walks schema positions only, so that `enum` or `const` values that happen to hold a
// "pattern" member are copied unchanged; a keyword valijson does not know is walked as a
// schema, since a `$ref` may point into it.

struct rewriter {
  std::string out;
  std::optional<std::string> refused;

  void copy(dom::element node) { out += simdjson::minify(node); }

  void key(std::string_view name) {
    out += json_quote(name);
    out += ':';
  }

  void refuse(std::string why) {
    if (!refused) {
      refused = std::move(why);
    }
  }

  void check_regex(std::string_view pattern, const std::string& at) {
    try {
      compile_search(pattern);
    } catch (const std::regex_error& e) {
      refuse("the regular expression " + json_quote(pattern) + " at " + at +
             " does not compile: " + e.what());
    }
  }

  // Writes `object`, each member through `member(name, value)`, which writes it and returns
  // true, or returns false to leave it out.
  template <class Member>
  void object_of(dom::object object, Member member) {
    out += '{';
    bool first = true;
    for (auto [name, value] : object) {
      const std::size_t mark = out.size();
      if (!first) {
        out += ',';
      }
      if (member(name, value)) {
        first = false;
      } else {
        out.resize(mark);
      }
    }
    out += '}';
  }

  void schema_map(dom::element node, const std::string& at) {
    dom::object map;
    if (node.get_object().get(map)) {
      copy(node);
      return;
    }
    object_of(map, [&](std::string_view name, dom::element value) {
      key(name);
      schema(value, at + pointer_token(name));
      return true;
    });
  }

  // One member of a schema object; false when it is left out.
  bool keyword(std::string_view name, dom::element value, const std::string& at) {
    const std::string here = at + pointer_token(name);
    std::string_view text;
    bool flag = false;
    if (name == "enum" || name == "const" || name == "default" || name == "examples") {
      key(name);
      copy(value);
    } else if (name == "pattern" && !value.get_string().get(text)) {
      check_regex(text, here);
      key(pattern_keyword);
      copy(value);
    } else if (name == "format" && !value.get_string().get(text)) {
      key(format_keyword);
      copy(value);
    } else if (name == "uniqueItems" && !value.get_bool().get(flag)) {
      if (!flag) {
        return false;
      }
      key(unique_keyword);
      copy(value);
    } else if (name == "patternProperties") {
      refuse("patternProperties at " + here +
             " is not supported: its regular expressions would be matched by a recursive "
             "engine; use propertyNames with a pattern, or properties");
      return false;
    } else if (name == "properties" || name == "definitions" || name == "dependencies") {
      key(name);
      schema_map(value, here);
    } else {  // items, allOf, not, if, ..., and keywords valijson reads as plain values
      key(name);
      schema(value, here);
    }
    return true;
  }

  void schema(dom::element node, const std::string& at) {
    if (dom::array array; !node.get_array().get(array)) {  // items, allOf, anyOf, oneOf
      out += '[';
      std::size_t index = 0;
      for (dom::element item : array) {
        if (index) {
          out += ',';
        }
        schema(item, at + "/" + std::to_string(index++));
      }
      out += ']';
      return;
    }
    dom::object object;
    if (node.get_object().get(object)) {
      copy(node);
      return;
    }
    object_of(object,
              [&](std::string_view name, dom::element value) { return keyword(name, value, at); });
  }
};

// ---- Turning valijson's results into one error --------------------------------------

bool all_digits(std::string_view s) {
  if (s.empty()) {
    return false;
  }
  for (char c : s) {
    if (c < '0' || c > '9') {
      return false;
    }
  }
  return true;
}

// The text between `prefix` and `suffix` when `text` is exactly prefix + X + suffix.
std::optional<std::string_view> between(std::string_view text, std::string_view prefix,
                                        std::string_view suffix) {
  if (text.size() < prefix.size() + suffix.size() || !text.starts_with(prefix) ||
      !text.ends_with(suffix)) {
    return std::nullopt;
  }
  return text.substr(prefix.size(), text.size() - prefix.size() - suffix.size());
}

struct located_error {
  std::string path;
  std::string reason;
};

constexpr std::string_view missing_prefix = "Missing required property '";
constexpr std::string_view member_prefix =
    "Failed to validate against schema associated with property name '";
constexpr std::string_view extra_prefix =
    "Object contains a property that could not be validated using 'properties' or "
    "'additionalProperties' constraints: '";

// How deep in the document an error points, without walking it.
std::size_t depth_of(const ValidationResults::Error& e) {
  const std::string_view d = e.description;
  const bool names_member = between(d, missing_prefix, "'.") || between(d, member_prefix, "'.") ||
                            between(d, extra_prefix, "'.");
  return e.context.size() - 1 + (names_member ? 1 : 0);
}

// valijson names a place by a list of "[name]" or "[index]" steps after "<root>", which
// cannot tell a member called "2" from an item; walking the document can.
located_error locate(const ValidationResults::Error& e, dom::element root) {
  located_error out;
  std::optional<dom::element> node = root;
  auto step = [&](std::string_view token) {
    dom::array array;
    dom::object object;
    dom::element child;
    if (node && !node->get_array().get(array) && all_digits(token)) {
      out.path += "/";
      out.path += token;
      const auto index = std::stoull(std::string(token));
      node = array.at(index).get(child) ? std::nullopt : std::optional(child);
    } else {
      out.path += pointer_token(token);
      if (node && !node->get_object().get(object) && !object.at_key(token).get(child)) {
        node = child;
      } else {
        node = std::nullopt;
      }
    }
  };
  for (std::size_t i = 1; i < e.context.size(); ++i) {
    std::string_view token = e.context[i];
    if (token.size() >= 2 && token.front() == '[' && token.back() == ']') {
      token = token.substr(1, token.size() - 2);
    }
    step(token);
  }

  std::string_view description = e.description;
  if (auto name = between(description, missing_prefix, "'.")) {
    out.reason = "required member " + json_quote(*name) + " is missing";
    node = std::nullopt;
    step(*name);
  } else if (auto member = between(description, member_prefix, "'.")) {
    step(*member);
    out.reason = "the value or one of its member names does not match its schema";
  } else if (auto extra = between(description, extra_prefix, "'.")) {
    step(*extra);
    out.reason = "member " + json_quote(*extra) + " is not allowed";
  } else {
    out.reason.assign(description);
    if (!out.reason.empty() && out.reason.back() == '.') {
      out.reason.pop_back();
    }
    if (!out.reason.empty()) {
      out.reason.front() =
          static_cast<char>(std::tolower(static_cast<unsigned char>(out.reason.front())));
    }
    if (node && description == "Value type not permitted by 'type' constraint.") {
      out.reason += std::string(" (it is ") + detail::type_name(node->type()) + ")";
    }
  }
  return out;
}

// Of the errors found, the deepest wins; on a tie, the first reported.
error describe(const ValidationResults& results, bool search_stopped, dom::element root) {
  const ValidationResults::Error* best = nullptr;
  std::size_t best_depth = 0;
  for (const auto& e : results) {
    const std::size_t depth = depth_of(e);
    if (!best || depth > best_depth) {
      best = &e;
      best_depth = depth;
    }
  }
  located_error found;
  if (best) {
    found = locate(*best, root);
  } else if (search_stopped) {
    found.reason =
        "the document does not match the schema (the search for the failing value "
        "stopped after " +
        std::to_string(detail::error_search::max_visits) + " values)";
  } else {  // valijson may fail without saying why (a `false` schema at the root)
    found.reason = "the document does not match the schema";
  }
  std::string message =
      "at " + (found.path.empty() ? std::string("the root") : found.path) + ": " + found.reason;
  return error(errc::invalid_envelope, std::move(message), std::move(found.path));
}

}  // namespace

result<json_schema> json_schema::parse(std::string_view schema_json) {
  return detail::schema_access::parse(schema_json, false);
}

result<json_schema> detail::schema_access::parse_own(std::string_view schema_json) {
  return parse(schema_json, true);
}

result<json_schema> detail::schema_access::parse(std::string_view schema_json, bool own) {
  const matcher m = own ? matcher::backtracking : matcher::automaton;
  dom::parser parser;  // the schema document is not needed once valijson has read it
  dom::element root;
  if (auto code = parser.parse(schema_json.data(), schema_json.size()).get(root)) {
    return detail::not_json_error(code);
  }
  rewriter rewritten;
  rewritten.schema(root, "");
  if (rewritten.refused) {
    return unexpected(errc::bad_request, "invalid JSON Schema: " + *rewritten.refused);
  }
  if (auto code = parser.parse(rewritten.out).get(root)) {
    return unexpected(errc::internal, std::string("a rewritten JSON Schema does not parse: ") +
                                          simdjson::error_message(code));
  }
  auto p = std::make_shared<json_schema::impl>();
  try {
    valijson::SchemaParser schema_parser(valijson::SchemaParser::kDraft7);
    add_own_keywords(schema_parser, m);
    schema_parser.populateSchema(detail::simdjson_adapter(root), p->schema);
  } catch (const std::exception& e) {
    return unexpected(errc::bad_request, std::string("invalid JSON Schema: ") + e.what());
  }
  return json_schema(std::move(p));
}

result<json_schema> json_schema::embedded(std::string_view name) {
  static std::mutex mutex;
  static std::map<std::string, json_schema, std::less<>> parsed;
  std::lock_guard lock(mutex);
  if (auto it = parsed.find(name); it != parsed.end()) {
    return it->second;
  }
  for (const auto& schema : detail::embedded_schemas()) {
    if (schema.name != name) {
      continue;
    }
    auto r = detail::schema_access::parse_own(schema.text);
    if (!r) {
      return unexpected(errc::internal, "the embedded schema \"" + std::string(name) +
                                            "\" does not parse: " + r.error().message());
    }
    parsed.emplace(std::string(name), *r);
    return r;
  }
  return unexpected(errc::not_found, "no embedded schema named " + json_quote(name));
}

result<void> json_schema::validate(std::string_view document_json) const {
  // A dom::parser is not thread-safe: one per thread, reused for its buffers.
  thread_local dom::parser parser;
  detail::parser_release release(parser);
  dom::element root;
  if (auto code = parser.parse(document_json.data(), document_json.size()).get(root)) {
    return detail::not_json_error(code);
  }
  return detail::schema_access::validate(*this, root);
}

result<void> detail::schema_access::validate(const json_schema& schema, dom::element root) {
  if (!schema.impl_) {
    return unexpected(errc::internal, "validation with a moved-from json_schema");
  }
  const valijson::Schema& s = schema.impl_->schema;
  // The first pass stops at the first failure; only a document that fails is walked again,
  // collecting errors until the search's budget (detail::error_search) runs out.
  ValidationResults results;
  bool search_stopped = false;
  try {
    valijson::Validator validator(valijson::Validator::kStrongTypes);
    if (validator.validate(s, simdjson_adapter(root), nullptr)) {
      return {};
    }
    error_search search(results);
    validator.validate(s, simdjson_adapter(root), &results);
  } catch (const error_search::exhausted&) {
    search_stopped = true;  // what was found so far is reported
  } catch (const std::exception& e) {
    return unexpected(errc::internal, std::string("schema validation failed: ") + e.what());
  }
  return describe(results, search_stopped, root);
}

}  // namespace amp
