#include "amp/sink/config.hpp"

#include <fmt/format.h>

#include <charconv>
#include <filesystem>
#include <utility>

#include "amp/names.hpp"
#include "amp/timestamp.hpp"
#include "detail/config_reader.hpp"

namespace amp::sink {
namespace {

using namespace detail::config;

constexpr int_range k_max_messages{1, 10000};
constexpr int_range k_max_wait_ms{1, 60000};
constexpr int_range k_max_failures{1, 1000};
constexpr int_range k_ack_wait_s{1, 3600};
constexpr int_range k_seq{1, k_unbounded};
constexpr std::size_t k_max_patterns = 64;
constexpr std::size_t k_max_targets = 16;
constexpr std::size_t k_max_file_bytes = 1024 * 1024;

// One of `names`, by its spelling; `fail`s naming `path` otherwise.
template <class E, std::size_t N>
result<void> set_choice(dom::element e, const std::string& path,
                        const std::pair<std::string_view, E> (&names)[N], E& out) {
  std::string_view s;
  if (!e.get_string().get(s)) {
    for (const auto& [name, value] : names) {
      if (name == s) {
        out = value;
        return {};
      }
    }
  }
  std::string list;
  for (std::size_t i = 0; i < N; ++i) {
    list += i == 0 ? "" : (i + 1 == N ? " or " : ", ");
    list += amp::quoted(names[i].first);
  }
  return fail(fmt::format("{}: must be {}, not {}", path, list, describe(e)));
}

constexpr std::pair<std::string_view, key_strategy> k_strategies[] = {
    {"stream_sequence", key_strategy::stream_sequence},
    {"message_id", key_strategy::message_id},
    {"payload_field", key_strategy::payload_field}};
constexpr std::pair<std::string_view, duplicate_mode> k_modes[] = {
    {"skip", duplicate_mode::skip},
    {"replace", duplicate_mode::replace},
    {"fail", duplicate_mode::fail}};
constexpr std::pair<std::string_view, target_kind> k_kinds[] = {{"sqlite", target_kind::sqlite},
                                                                {"postgres", target_kind::postgres},
                                                                {"file", target_kind::file}};
constexpr std::pair<std::string_view, source_kind> k_sources[] = {{"topics", source_kind::topics},
                                                                  {"tasks", source_kind::tasks}};

result<void> apply_nats(dom::element e, const std::string& path, sink_config::nats_section& n) {
  return for_members(e, path, {"url", "creds", "domain", "tls"},
                     [&](std::string_view k, dom::element x, const std::string& q) -> result<void> {
                       if (k == "url") return set_text(x, q, n.url);
                       if (k == "creds") return set_optional_text(x, q, n.creds);
                       if (k == "domain") return set_optional_text(x, q, n.domain);
                       return set_nats_tls(x, q, n.tls_ca, n.tls_cert, n.tls_key);
                     });
}

// A JSON Pointer, "" (the whole body) included, or null; its syntax is checked with the rest.
result<void> set_pointer(dom::element e, const std::string& path, std::optional<std::string>& out) {
  if (e.is_null()) {
    out.reset();
    return {};
  }
  std::string_view s;
  if (e.get_string().get(s) || s.find('\0') != std::string_view::npos) {
    return fail(fmt::format("{}: must be a JSON Pointer string (\"\" or \"/…\"), or null; not {}",
                            path, describe(e)));
  }
  out.emplace(s);
  return {};
}

// RFC 6901: "" or "/"-separated tokens in which "~" is only "~0" or "~1".
bool is_json_pointer(std::string_view p) {
  if (p.empty()) return true;
  if (p.front() != '/') return false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '~' && (i + 1 == p.size() || (p[i + 1] != '0' && p[i + 1] != '1'))) return false;
  }
  return true;
}

result<void> apply_from(dom::element e, const std::string& path, start_position& from) {
  std::string_view s;
  if (!e.get_string().get(s) && (s == "new" || s == "all")) {
    from = {.from = s == "new" ? start_position::kind::new_messages : start_position::kind::all};
    return {};
  }
  dom::object o;
  if (!e.get_object().get(o) && o.size() == 1) {
    auto member = *o.begin();
    const auto q = path + "." + std::string(member.key);
    if (member.key == "seq") {
      start_position p{.from = start_position::kind::sequence};
      if (auto r = set_int(member.value, q, k_seq, p.seq); !r) return r;
      from = p;
      return {};
    }
    if (member.key == "time") {
      std::string_view text;
      if (member.value.get_string().get(text)) {
        return fail(
            fmt::format("{}: must be an RFC 3339 timestamp, not {}", q, describe(member.value)));
      }
      auto t = parse_timestamp(text);
      if (!t) return fail(fmt::format("{}: {}", q, t.error().message()));
      from = {.from = start_position::kind::time, .time = *t};
      return {};
    }
  }
  return fail(fmt::format(R"({}: must be "new", "all", {{"seq":N}} or {{"time":T}}, not {})", path,
                          describe(e)));
}

result<void> apply_source(dom::element e, const std::string& path, sink_config& c) {
  return for_members(
      e, path, {"ns", "kind", "topics", "from"},
      [&](std::string_view k, dom::element x, const std::string& q) -> result<void> {
        if (k == "ns") return set_text(x, q, c.ns);
        if (k == "kind") return set_choice(x, q, k_sources, c.kind);
        if (k == "from") return apply_from(x, q, c.from);
        if (x.is_null()) {
          c.topics.clear();
          return {};
        }
        dom::array a;
        if (x.get_array().get(a) || a.size() == 0 || a.size() > k_max_patterns) {
          return fail(fmt::format("{}: must be an array of 1 to {} topic patterns, or null; not {}",
                                  q, k_max_patterns, describe(x)));
        }
        std::vector<std::string> patterns;
        for (auto item : a) {
          const auto iq = fmt::format("{}/{}", q, patterns.size());
          std::string p;
          if (auto r = set_text(item, iq, p); !r) return r;
          patterns.push_back(std::move(p));
        }
        c.topics = std::move(patterns);
        return {};
      });
}

result<void> apply_target(dom::element e, const std::string& path, target_config& t) {
  return for_members(
      e, path, {"kind", "required", "path", "dsn", "table", "dir"},
      [&](std::string_view k, dom::element x, const std::string& q) -> result<void> {
        if (k == "kind") return set_choice(x, q, k_kinds, t.kind);
        if (k == "required") {
          if (x.get_bool().get(t.required)) {
            return fail(fmt::format("{}: must be true or false, not {}", q, describe(x)));
          }
          return {};
        }
        if (k == "path") return set_text(x, q, t.path);
        if (k == "dsn") return set_text(x, q, t.dsn);
        if (k == "table") return set_text(x, q, t.table);
        return set_text(x, q, t.dir);
      });
}

result<void> apply_targets(dom::element e, const std::string& path, sink_config& c) {
  dom::array a;
  if (e.get_array().get(a) || a.size() == 0 || a.size() > k_max_targets) {
    return fail(fmt::format("{}: must be an array of 1 to {} targets, not {}", path, k_max_targets,
                            describe(e)));
  }
  std::vector<target_config> targets;
  for (auto item : a) {
    target_config t;
    if (auto r = apply_target(item, fmt::format("{}/{}", path, targets.size()), t); !r) return r;
    targets.push_back(std::move(t));
  }
  c.targets = std::move(targets);
  return {};
}

result<void> apply_root(dom::element root, sink_config& c) {
  return for_members(
      root, "",
      {"nats", "http", "name", "source", "batch", "idempotency", "on_duplicate", "targets", "dlq",
       "ack_wait_s"},
      [&](std::string_view key, dom::element v, const std::string& p) -> result<void> {
        if (key == "nats") return apply_nats(v, p, c.nats);
        if (key == "http") return set_optional_text(v, p, c.http);
        if (key == "name") return set_text(v, p, c.name);
        if (key == "source") return apply_source(v, p, c);
        if (key == "batch") {
          return for_members(
              v, p, {"max_messages", "max_wait_ms"},
              [&](std::string_view k, dom::element x, const std::string& q) -> result<void> {
                if (k == "max_messages") return set_int(x, q, k_max_messages, c.max_messages);
                std::int64_t ms = 0;
                if (auto r = set_int(x, q, k_max_wait_ms, ms); !r) return r;
                c.max_wait = std::chrono::milliseconds(ms);
                return {};
              });
        }
        if (key == "idempotency") {
          return for_members(
              v, p, {"strategy", "field"},
              [&](std::string_view k, dom::element x, const std::string& q) -> result<void> {
                if (k == "strategy") return set_choice(x, q, k_strategies, c.strategy);
                return set_pointer(x, q, c.field);
              });
        }
        if (key == "on_duplicate") return set_choice(v, p, k_modes, c.on_duplicate);
        if (key == "targets") return apply_targets(v, p, c);
        if (key == "dlq") {
          return for_members(v, p, {"max_failures"},
                             [&](std::string_view, dom::element x, const std::string& q) {
                               return set_int(x, q, k_max_failures, c.max_failures);
                             });
        }
        std::int64_t s = 0;
        if (auto r = set_int(v, p, k_ack_wait_s, s); !r) return r;
        c.ack_wait = std::chrono::seconds(s);
        return {};
      });
}

result<void> apply_text(std::string_view json, sink_config& c) {
  dom::parser parser;
  dom::element root;
  // A byte order mark, as some editors write one, is not part of the JSON.
  if (constexpr std::string_view k_bom = "\xEF\xBB\xBF"; json.starts_with(k_bom)) {
    json.remove_prefix(k_bom.size());
  }
  if (auto code = parser.parse(json.data(), json.size()).get(root)) {
    return fail(detail::not_json_error(code).message());
  }
  return apply_root(root, c);
}

bool table_name_ok(std::string_view t) {
  if (t.empty() || t.size() > 63) return false;
  auto letter = [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
  };
  if (!letter(t.front())) return false;
  for (char ch : t) {
    if (!letter(ch) && !(ch >= '0' && ch <= '9')) return false;
  }
  return true;
}

result<void> check_target(const target_config& t, const std::string& path) {
  auto missing = [&](std::string_view key) {
    return fail(fmt::format("{}.{}: is required for a {} target", path, key, to_string(t.kind)));
  };
  auto extra = [&](std::string_view key) {
    return fail(fmt::format("{}.{}: is not a key of a {} target", path, key, to_string(t.kind)));
  };
  const bool sql = t.kind != target_kind::file;
  if (sql) {
    if (t.table.empty()) return missing("table");
    if (!table_name_ok(t.table)) {
      return fail(fmt::format(
          "{}.table: must match ^[A-Za-z_][A-Za-z0-9_]{{0,62}}$ (an SQL name used as it is), "
          "not {}",
          path, amp::quoted(t.table)));
    }
    if (!t.dir.empty()) return extra("dir");
  } else {
    if (t.dir.empty()) return missing("dir");
    if (!t.table.empty()) return extra("table");
  }
  if (t.kind == target_kind::sqlite) {
    if (t.path.empty()) return missing("path");
    if (!t.dsn.empty()) return extra("dsn");
  } else if (!t.path.empty()) {
    return extra("path");
  }
  if (t.kind == target_kind::postgres) {
    if (t.dsn.empty()) return missing("dsn");
  } else if (!t.dsn.empty()) {
    return extra("dsn");
  }
  return {};
}

}  // namespace

std::string_view to_string(duplicate_mode m) noexcept {
  for (const auto& [name, value] : k_modes) {
    if (value == m) return name;
  }
  return "?";
}
std::string_view to_string(key_strategy s) noexcept {
  for (const auto& [name, value] : k_strategies) {
    if (value == s) return name;
  }
  return "?";
}
std::string_view to_string(target_kind k) noexcept {
  for (const auto& [name, value] : k_kinds) {
    if (value == k) return name;
  }
  return "?";
}

result<void> check_sink_config(const sink_config& c) {
  if (c.name.empty()) return fail("name: is required (the sink's name, e.g. \"archive\")");
  if (auto n = sink_name::make(c.name); !n) return fail("name: " + n.error().message());
  if (c.ns.empty()) return fail("source.ns: is required (the namespace to archive)");
  if (auto n = namespace_name::make(c.ns); !n) return fail("source.ns: " + n.error().message());
  if (c.kind == source_kind::topics) {
    if (c.topics.empty()) {
      return fail("source.topics: is required with \"kind\": \"topics\" (e.g. [\">\"])");
    }
    for (std::size_t i = 0; i < c.topics.size(); ++i) {
      if (auto p = topic_pattern::make(c.topics[i]); !p) {
        return fail(fmt::format("source.topics/{}: {}", i, p.error().message()));
      }
    }
  } else if (!c.topics.empty()) {
    return fail("source.topics: must be null or absent with \"kind\": \"tasks\"");
  }
  if (c.strategy == key_strategy::payload_field) {
    if (!c.field) {
      return fail(
          "idempotency.field: is required with \"strategy\": \"payload_field\" (a JSON "
          "Pointer inside body, e.g. \"/order_id\")");
    }
    if (!is_json_pointer(*c.field)) {
      return fail(
          fmt::format("idempotency.field: must be a JSON Pointer (\"\" for the whole body, or "
                      "\"/\"-separated tokens with \"~\" only as \"~0\" or \"~1\"), not {}",
                      amp::quoted(*c.field)));
    }
  } else if (c.field) {
    return fail("idempotency.field: is used only with \"strategy\": \"payload_field\"; null here");
  }
  if (c.http) {
    const auto colon = c.http->rfind(':');
    const auto host = colon == std::string::npos ? std::string_view()
                                                 : std::string_view(*c.http).substr(0, colon);
    const auto port = colon == std::string::npos ? std::string_view()
                                                 : std::string_view(*c.http).substr(colon + 1);
    int number = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), number);
    if (host.empty() || ec != std::errc{} || end != port.data() + port.size() || number < 0 ||
        number > 65535) {
      return fail(
          fmt::format("http: must be \"host:port\" with an IP address (\"127.0.0.1:9090\", "
                      "\"[::1]:9090\") and a port from 0 to 65535, not {}",
                      amp::quoted(*c.http)));
    }
  }
  if (c.targets.empty()) return fail("targets: is required (at least one target)");
  bool any_required = false;
  for (std::size_t i = 0; i < c.targets.size(); ++i) {
    if (auto r = check_target(c.targets[i], fmt::format("targets/{}", i)); !r) return r;
    any_required = any_required || c.targets[i].required;
  }
  if (!any_required) {
    return fail(
        "targets: at least one target must be required (an optional target is a side "
        "copy: nothing would be committed before the acknowledgement)");
  }
  return {};
}

result<sink_config> parse_sink_config(std::string_view json) {
  sink_config c;
  if (auto r = apply_text(json, c); !r) return std::move(r).error();
  if (auto r = check_sink_config(c); !r) return std::move(r).error();
  return c;
}

result<sink_config> load_sink_config(const std::string& path, bool check) {
  auto text = read_config_file(path, k_max_file_bytes);
  if (!text) return text.error();
  sink_config c;
  auto parsed = apply_text(*text, c).and_then(
      [&]() -> result<void> { return check ? check_sink_config(c) : result<void>(); });
  if (!parsed) return fail(fmt::format("{}: {}", path, parsed.error().message()));
  const auto base = std::filesystem::path(path).parent_path();
  for (auto& t : c.targets) {
    if (!t.path.empty()) t.path = resolve_path(base, t.path);
    if (!t.dir.empty()) t.dir = resolve_path(base, t.dir);
  }
  for (auto* p : {&c.nats.creds, &c.nats.tls_ca, &c.nats.tls_cert, &c.nats.tls_key}) {
    if (*p) *p = resolve_path(base, **p);
  }
  return c;
}

result<void> set_sink_config_value(sink_config& config, std::string_view dotted_key,
                                   std::string_view value_json) {
  auto text = override_document(dotted_key, value_json, [](const auto&) { return false; });
  if (!text) return text.error();
  sink_config changed = config;
  if (auto r = apply_text(*text, changed); !r) return r;
  config = std::move(changed);
  return {};
}

}  // namespace amp::sink
