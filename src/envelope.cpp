#include "amp/envelope.hpp"

#include <cstdint>
#include <optional>

#include "amp/json.hpp"
#include "amp/schema.hpp"
#include "amp/timestamp.hpp"
#include "detail/envelope_check.hpp"
#include "detail/minify.hpp"
#include "detail/simdjson_adapter.hpp"

namespace amp {
namespace {

namespace dom = simdjson::dom;

}  // namespace

result<envelope> parse_envelope(std::string_view json) {
  static const std::optional<json_schema> schema = []() -> std::optional<json_schema> {
    auto embedded = json_schema::embedded("envelope");
    return embedded ? std::optional(*std::move(embedded)) : std::nullopt;
  }();
  if (!schema) {
    return unexpected(errc::internal, "the embedded envelope schema does not parse");
  }

  // A dom::parser is not thread-safe: one per thread, reused for its buffers.
  thread_local dom::parser parser;
  detail::parser_release release(parser);
  dom::element root;
  if (auto code = parser.parse(json.data(), json.size()).get(root)) {
    return detail::not_json_error(code);
  }
  if (!detail::surely_valid_envelope(root)) {
    if (auto valid = detail::schema_access::validate(*schema, root); !valid) {
      return std::move(valid).error();
    }
  }

  // From here on the schema guarantees an object with members of the right types.
  const dom::object object = root.get_object().value_unsafe();
  envelope e;
  e.id = detail::string_member(object, "id");
  e.from = detail::string_member(object, "from");
  e.to = detail::string_member(object, "to");
  e.ns = detail::string_member(object, "ns");
  e.type = detail::string_member(object, "type");
  e.reply_to = detail::string_member(object, "reply_to");
  e.correlation = detail::string_member(object, "correlation");

  dom::object operation;
  if (!object.at_key("operation").get_object().get(operation)) {
    operation_ref ref;
    ref.id = detail::string_member(operation, "id");
    ref.branch = detail::string_member(operation, "branch");
    // An integer 1..2^31-1, which the schema lets through written as a double too (2.0).
    auto attempt = operation.at_key("attempt");
    std::int64_t whole = 0;
    double written = 0;
    if (attempt.get_int64().get(whole) && !attempt.get_double().get(written)) {
      whole = static_cast<std::int64_t>(written);
    }
    ref.attempt = static_cast<int>(whole);
    if (auto by = detail::string_member(operation, "reply_by"); !by.empty()) {
      auto t = parse_timestamp(by);
      if (!t) {
        return unexpected(errc::invalid_envelope, "at /operation/reply_by: " + t.error().message(),
                          "/operation/reply_by");
      }
      ref.reply_by = std::chrono::floor<std::chrono::milliseconds>(*t);
    }
    e.operation = std::move(ref);
  }

  auto ts = parse_timestamp(detail::string_member(object, "ts"));
  if (!ts) {
    return unexpected(errc::invalid_envelope, "at /ts: " + ts.error().message(), "/ts");
  }
  e.ts = std::chrono::floor<std::chrono::milliseconds>(*ts);  // the wire's precision

  e.body = detail::minify(object.at_key("body").value_unsafe());

  dom::object headers;
  if (!object.at_key("headers").get_object().get(headers)) {
    for (auto [name, value] : headers) {
      for (const auto& seen : e.headers) {
        if (seen.first == name) {
          std::string path = "/headers";
          detail::append_pointer_token(path, name);
          std::string message =
              "at " + path + ": header " + json_quote(name) + " appears more than once";
          return unexpected(errc::invalid_envelope, std::move(message), std::move(path));
        }
      }
      e.headers.emplace_back(std::string(name), std::string(value.get_string().value_unsafe()));
    }
  }
  return e;
}

std::string to_json(const envelope& e) {
  json_writer w(160 + e.body.size());
  w.begin_object();
  w.key("id").string(e.id);
  w.key("from").string(e.from);
  w.key("to").string(e.to);
  w.key("ns").string(e.ns);
  if (!e.type.empty()) {
    w.key("type").string(e.type);
  }
  w.key("ts").string(format_timestamp_chars(e.ts).view());
  w.key("body");
  if (e.body.empty()) {
    w.null();
  } else {
    w.raw(e.body);
  }
  if (!e.headers.empty()) {
    w.key("headers").begin_object();
    for (const auto& [name, value] : e.headers) {
      w.key(name).string(value);
    }
    w.end_object();
  }
  if (!e.reply_to.empty()) {
    w.key("reply_to").string(e.reply_to);
  }
  if (!e.correlation.empty()) {
    w.key("correlation").string(e.correlation);
  }
  if (e.operation) {
    const auto& o = *e.operation;
    w.key("operation").begin_object().key("id").string(o.id).key("branch").string(o.branch);
    w.key("attempt").integer(o.attempt).key("reply_by");
    if (o.reply_by == time_point{}) {
      w.null();
    } else {
      w.string(format_timestamp_chars(o.reply_by).view());
    }
    w.end_object();
  }
  w.end_object();
  return w.take();
}

}  // namespace amp
