#include "sink/rows.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "amp/broker/task_store.hpp"
#include "amp/envelope.hpp"
#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "amp/timestamp.hpp"
#include "detail/simdjson_adapter.hpp"

namespace amp::sink::detail {
namespace {

namespace dom = simdjson::dom;

constexpr std::string_view k_kv_operation = "KV-Operation";

mapped unwritable(std::string reason) {
  return {.what = mapped::kind::unwritable, .r = {}, .reason = std::move(reason)};
}

std::string headers_json(const std::vector<std::pair<std::string, std::string>>& headers) {
  json_writer w;
  w.begin_object();
  for (const auto& [k, v] : headers) w.key(k).string(v);
  w.end_object();
  return w.take();
}

// The key `strategy` gives the row `r` (its body, id, stream and seq set).
result<std::string> key_of(const source_rules& rules, const row& r) {
  switch (rules.strategy) {
    case key_strategy::stream_sequence: return fmt::format("{}:{}", r.stream, r.seq);
    case key_strategy::message_id: return r.msg_id;
    case key_strategy::payload_field: break;
  }
  dom::parser parser;
  dom::element body;
  if (parser.parse(r.body).get(body)) {
    return unexpected(errc::bad_request, "payload_field: body is not JSON");
  }
  dom::element value;
  if (body.at_pointer(rules.field).get(value)) {
    return unexpected(errc::bad_request,
                      fmt::format("payload_field {}: missing from body", amp::quoted(rules.field)));
  }
  switch (value.type()) {
    case dom::element_type::STRING: {
      const std::string_view s = value.get_string().value_unsafe();
      if (s.empty() || s.find('\0') != std::string_view::npos) {
        return unexpected(errc::bad_request,
                          fmt::format("payload_field {}: {}", amp::quoted(rules.field),
                                      s.empty() ? "an empty string" : "a string with U+0000"));
      }
      return std::string(s);
    }
    case dom::element_type::INT64: return std::to_string(value.get_int64().value_unsafe());
    case dom::element_type::UINT64: return std::to_string(value.get_uint64().value_unsafe());
    case dom::element_type::DOUBLE: {
      std::int64_t n = 0;
      if (amp::detail::integral_double(value.get_double().value_unsafe(), n)) {
        return std::to_string(n);
      }
      break;
    }
    default: break;
  }
  return unexpected(errc::bad_request,
                    fmt::format("payload_field {}: must be a string or an integer, not {}",
                                amp::quoted(rules.field), amp::detail::type_name(value.type())));
}

mapped keyed(const source_rules& rules, row r) {
  auto key = key_of(rules, r);
  if (!key) return unwritable(key.error().message());
  r.key = std::move(*key);
  return {.what = mapped::kind::row, .r = std::move(r), .reason = {}};
}

mapped map_event(const source_rules& rules, const message& m) {
  auto t = subjects::topic_from_subject(rules.ns, m.subject);
  if (!t) return unwritable(fmt::format("not a topic subject: {}", t.error().message()));
  if (std::none_of(rules.patterns.begin(), rules.patterns.end(),
                   [&](const topic_pattern& p) { return p.matches(*t); })) {
    return {};
  }
  auto env = parse_envelope(m.data);
  if (!env) return unwritable(fmt::format("not an AMP envelope: {}", env.error().message()));
  return keyed(rules, {.key = {},
                       .stream = m.stream,
                       .seq = m.seq,
                       .subject = m.subject,
                       .topic = t->str(),
                       .msg_id = std::move(env->id),
                       .sender = std::move(env->from),
                       .type = std::move(env->type),
                       .ts = format_timestamp(env->ts),
                       .body = env->body.empty() ? "null" : std::move(env->body),
                       .headers = headers_json(env->headers)});
}

mapped map_task(const source_rules& rules, const message& m) {
  if (auto op = find_header(m.headers, k_kv_operation); op && *op != "PUT") return {};
  // `$KV.AMP_TASK_STATE.<ns>.<key>`: tasks only (operations are `o_…`, bindings `idem.…`).
  const auto prefix = fmt::format("$KV.{}.{}.", subjects::task_state_bucket(), rules.ns.view());
  if (!m.subject.starts_with(prefix)) return {};
  const std::string_view key = std::string_view(m.subject).substr(prefix.size());
  if (!key.starts_with("t_") || key.find('.') != std::string_view::npos) return {};
  auto rec = parse_task_record(m.data);
  if (!rec) return unwritable(fmt::format("not a task record: {}", rec.error().message()));
  // The revision that only marks the submitter as told repeats the end before it.
  if (!is_terminal(rec->state) || rec->notified) return {};
  rec->revision = m.seq;
  return keyed(rules, {.key = {},
                       .stream = m.stream,
                       .seq = m.seq,
                       .subject = m.subject,
                       .topic = std::nullopt,
                       .msg_id = rec->task,
                       .sender = rec->submitted_by,
                       .type = rec->job,
                       .ts = format_timestamp(rec->updated_at),
                       .body = to_json(*rec),
                       .headers = "{}"});
}

}  // namespace

source_rules source_rules::of(const sink_config& c) {
  source_rules rules{.ns = namespace_name::make(c.ns).value(),
                     .kind = c.kind,
                     .patterns = {},
                     .strategy = c.strategy,
                     .field = c.field.value_or("")};
  for (const auto& p : c.topics) rules.patterns.push_back(topic_pattern::make(p).value());
  return rules;
}

mapped map_message(const source_rules& rules, const message& m) {
  return rules.kind == source_kind::topics ? map_event(rules, m) : map_task(rules, m);
}

std::string source_stream(const source_rules& rules) {
  if (rules.kind == source_kind::tasks) return kv_stream_name(subjects::task_state_bucket());
  return subjects::topics_stream(rules.ns);
}

std::string source_filter(const source_rules& rules) {
  if (rules.kind == source_kind::tasks) {
    return fmt::format("$KV.{}.{}.*", subjects::task_state_bucket(), rules.ns.view());
  }
  if (rules.patterns.size() == 1) return subjects::topic_filter(rules.ns, rules.patterns.front());
  // The tokens every pattern starts with; a pattern that ends there needs one fewer.
  auto common = rules.patterns.front().tokens();
  std::size_t shortest = common.size();
  for (const auto& p : rules.patterns) {
    const auto tokens = p.tokens();
    shortest = std::min(shortest, tokens.size());
    std::size_t n = 0;
    while (n < common.size() && n < tokens.size() && common[n] == tokens[n] && tokens[n] != ">") {
      ++n;
    }
    common.resize(n);
  }
  if (common.size() >= shortest) common.resize(shortest - 1);
  if (common.empty()) return subjects::topic_subjects(rules.ns);
  std::string pattern;
  for (auto t : common) pattern.append(t).append(".");
  pattern.append(">");
  return subjects::topic_filter(rules.ns, topic_pattern::make(pattern).value());
}

}  // namespace amp::sink::detail
