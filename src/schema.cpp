#include "amp/schema.hpp"

#include <cctype>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "amp/detail/embedded_schemas.hpp"
#include "amp/json.hpp"
#include "detail/simdjson_adapter.hpp"
// valijson after the adapter: its templates need the adapter's traits.
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

namespace amp {

struct json_schema::impl {
  valijson::Schema schema;

  // valijson's Validator caches compiled regexes in itself, so one must never be used by
  // two threads at once; compiling them costs far more than validating an envelope, so
  // each call borrows a warm one from this pool and gives it back.
  std::unique_ptr<valijson::Validator> borrow() const {
    {
      std::lock_guard lock(mutex_);
      if (!idle_.empty()) {
        auto v = std::move(idle_.back());
        idle_.pop_back();
        return v;
      }
    }
    return std::make_unique<valijson::Validator>(valijson::Validator::kStrongTypes);
  }

  void give_back(std::unique_ptr<valijson::Validator> v) const {
    std::lock_guard lock(mutex_);
    if (idle_.size() < max_idle) {
      idle_.push_back(std::move(v));
    }
  }

 private:
  static constexpr std::size_t max_idle = 16;
  mutable std::mutex mutex_;
  mutable std::vector<std::unique_ptr<valijson::Validator>> idle_;
};

namespace {

namespace dom = simdjson::dom;

std::string pointer_token(std::string_view name) {
  std::string out;
  detail::append_pointer_token(out, name);
  return out;
}

// ---- Refusing schemas whose regular expressions std::regex cannot compile ----------
// valijson compiles `pattern` only when it first validates a string, and would throw
// then; find them now. Walks schema positions only, so that `enum` or `const` values
// that happen to hold a "pattern" member are left alone.

std::optional<std::string> check_schema_patterns(dom::element node, const std::string& at);

std::optional<std::string> check_regex(std::string_view pattern, const std::string& at) {
  try {
    std::regex compiled{std::string(pattern)};
  } catch (const std::regex_error& e) {
    return "the regular expression " + json_quote(pattern) + " at " + at +
           " does not compile: " + e.what();
  }
  return std::nullopt;
}

std::optional<std::string> check_schema_map(dom::element node, const std::string& at) {
  dom::object map;
  if (node.get_object().get(map)) {
    return std::nullopt;
  }
  for (auto [name, value] : map) {
    if (auto bad = check_schema_patterns(value, at + pointer_token(name))) {
      return bad;
    }
  }
  return std::nullopt;
}

std::optional<std::string> check_schema_patterns(dom::element node, const std::string& at) {
  if (dom::array array; !node.get_array().get(array)) {  // items, allOf, anyOf, oneOf
    std::size_t index = 0;
    for (dom::element item : array) {
      if (auto bad = check_schema_patterns(item, at + "/" + std::to_string(index++))) {
        return bad;
      }
    }
    return std::nullopt;
  }
  dom::object object;
  if (node.get_object().get(object)) {
    return std::nullopt;
  }
  for (auto [keyword, value] : object) {
    const std::string here = at + pointer_token(keyword);
    std::optional<std::string> bad;
    if (keyword == "enum" || keyword == "const" || keyword == "default" || keyword == "examples") {
      continue;
    } else if (keyword == "pattern") {
      std::string_view pattern;
      if (!value.get_string().get(pattern)) {
        bad = check_regex(pattern, here);
      }
    } else if (keyword == "patternProperties") {
      dom::object map;
      if (!value.get_object().get(map)) {
        for (auto [pattern, schema] : map) {
          if (!bad) {
            bad = check_regex(pattern, here);
          }
        }
      }
      if (!bad) {
        bad = check_schema_map(value, here);
      }
    } else if (keyword == "properties" || keyword == "definitions" || keyword == "dependencies") {
      bad = check_schema_map(value, here);
    } else {
      bad = check_schema_patterns(value, here);
    }
    if (bad) {
      return bad;
    }
  }
  return std::nullopt;
}

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
  std::size_t depth = 0;
  std::string reason;
};

// valijson names a place by a list of "[name]" or "[index]" steps after "<root>", which
// cannot tell a member called "2" from an item; walking the document can.
located_error locate(const valijson::ValidationResults::Error& e, dom::element root) {
  located_error out;
  std::optional<dom::element> node = root;
  auto step = [&](std::string_view token) {
    ++out.depth;
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
  if (auto name = between(description, "Missing required property '", "'.")) {
    out.reason = "required member " + json_quote(*name) + " is missing";
    node = std::nullopt;
    step(*name);
  } else if (auto member = between(description,
                                   "Failed to validate against schema associated with "
                                   "property name '",
                                   "'.")) {
    step(*member);
    out.reason = "the value or one of its member names does not match its schema";
  } else if (auto extra = between(description,
                                  "Object contains a property that could not be validated "
                                  "using 'properties' or 'additionalProperties' constraints: '",
                                  "'.")) {
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

error describe(const valijson::ValidationResults& results, dom::element root) {
  std::optional<located_error> best;
  for (const auto& e : results) {
    located_error here = locate(e, root);
    if (!best || here.depth > best->depth) {  // deepest wins; on a tie, the first reported
      best = std::move(here);
    }
  }
  if (!best) {  // valijson failed without saying why (e.g. a `false` schema at the root)
    best = located_error{"", 0, "the document does not match the schema"};
  }
  std::string message =
      "at " + (best->path.empty() ? std::string("the root") : best->path) + ": " + best->reason;
  return error(errc::invalid_envelope, std::move(message), std::move(best->path));
}

}  // namespace

result<json_schema> json_schema::parse(std::string_view schema_json) {
  dom::parser parser;  // the schema document is not needed once valijson has read it
  dom::element root;
  if (auto code = parser.parse(schema_json.data(), schema_json.size()).get(root)) {
    return detail::not_json_error(code);
  }
  if (auto bad = check_schema_patterns(root, "")) {
    return unexpected(errc::bad_request, "invalid JSON Schema: " + *bad);
  }
  auto p = std::make_shared<impl>();
  try {
    valijson::SchemaParser schema_parser(valijson::SchemaParser::kDraft7);
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
    auto r = parse(schema.text);
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
  const json_schema::impl& s = *schema.impl_;
  valijson::ValidationResults results;
  auto validator = s.borrow();
  bool valid = false;
  std::optional<std::string> failure;
  try {
    valid = validator->validate(s.schema, simdjson_adapter(root), &results);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  s.give_back(std::move(validator));
  if (failure) {
    return unexpected(errc::internal, "schema validation failed: " + *failure);
  }
  if (valid) {
    return {};
  }
  return describe(results, root);
}

}  // namespace amp
