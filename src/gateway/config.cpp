#include "amp/gateway/config.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <system_error>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "amp/json.hpp"
#include "amp/transport/jetstream.hpp"
#include "detail/config_reader.hpp"
#include "detail/simdjson_adapter.hpp"

namespace amp {
namespace {

using namespace detail::config;

constexpr int_range k_replicas{1, 5};
constexpr int_range k_leeway_s{0, 3600};
constexpr int_range k_period_s{1, 86400};  // heartbeat_s, registry_ttl_s, inbox_ack_s
constexpr int_range k_inbox_window{1, 10000};
constexpr int_range k_task_retention_s{60, 315360000};  // under 86400: the server warns
constexpr int_range k_max_age_s{0, 315360000};          // 0: none; else at least 60
constexpr std::int64_t k_min_max_age_s = 60;
constexpr int_range k_max_bytes{0, std::int64_t{1} << 50};  // 0: none; else at least 1 MiB
constexpr std::int64_t k_min_max_bytes = 1048576;
constexpr int_range k_inbox_idle_s{60, 31536000};  // a minute .. 365 days
constexpr int_range k_lease_s{1, 86400};
constexpr int_range k_max_attempts{1, 100};
constexpr int_range k_decline_delay_ms{0, 86400000};
constexpr int_range k_max_frame_bytes{1024, 64 * 1024 * 1024};
constexpr int_range k_max_body_bytes{1, 64 * 1024 * 1024};
constexpr int_range k_max_sessions{1, 1000000};
constexpr int_range k_max_subscriptions{1, 10000};
constexpr int_range k_max_pending{1, 1000000};
constexpr int_range k_per_day{0, k_unbounded};

constexpr number_floor k_rate{0, false};  // per_s, bytes_per_s
constexpr number_floor k_burst{1, true};  // a bucket under one message never lets one pass
constexpr number_floor k_ops_burst{registry_op_cost, true};  // else register never passes

constexpr std::size_t k_max_file_bytes = 16 * 1024 * 1024;
constexpr std::size_t k_max_message_type = 128;

// `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`; the reason it is not, or nothing.
std::optional<std::string> message_type_problem(std::string_view type) {
  if (type.empty()) return "message type is empty";
  if (type.size() > k_max_message_type) {
    return fmt::format("message type {}: is {} characters (at most {})", amp::quoted(type),
                       type.size(), k_max_message_type);
  }
  for (std::size_t i = 0; i < type.size(); ++i) {
    const char c = type[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (alnum || (i > 0 && (c == '.' || c == '_' || c == '-'))) continue;
    return fmt::format(
        "message type {}: {} at position {} (allowed: A-Z, a-z, 0-9, '.', '_', '-'; must start "
        "with a letter or digit)",
        amp::quoted(type), describe_byte(c), i);
  }
  return std::nullopt;
}

// --- listen -----------------------------------------------------------------------------

bool is_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// A host name (RFC 1123 labels) or an IPv4 address; an IPv6 address without brackets.
std::optional<std::string> host_problem(std::string_view host) {
  if (host.empty()) return std::string("the host is missing");
  const std::string h(host);
  if (host.find(':') != std::string_view::npos) {
    // An IPv6 address, perhaps with a zone (`fe80::1%eth0`).
    const auto percent = h.find('%');
    const std::string address = h.substr(0, percent);
    const std::string_view zone =
        percent == std::string::npos ? std::string_view("x") : host.substr(percent + 1);
    in6_addr a6{};
    const bool zone_ok = !zone.empty() && std::all_of(zone.begin(), zone.end(), [](char c) {
      return is_alnum(c) || c == '_' || c == '-' || c == '.';
    });
    if (!zone_ok || inet_pton(AF_INET6, address.c_str(), &a6) != 1) {
      return amp::quoted(host) + " is not an IPv6 address";
    }
    return std::nullopt;
  }
  if (std::all_of(host.begin(), host.end(),
                  [](char c) { return (c >= '0' && c <= '9') || c == '.'; })) {
    in_addr a4{};
    if (inet_pton(AF_INET, h.c_str(), &a4) != 1) {
      return amp::quoted(host) + " is not an IPv4 address";
    }
    return std::nullopt;
  }
  if (host.size() > 253) return amp::quoted(host) + " is not a host name (over 253 characters)";
  std::size_t start = 0;
  for (;;) {
    auto end = host.find('.', start);
    if (end == std::string_view::npos) end = host.size();
    const auto label = host.substr(start, end - start);
    const bool ok =
        !label.empty() && label.size() <= 63 && label.front() != '-' && label.back() != '-' &&
        std::all_of(label.begin(), label.end(), [](char c) { return is_alnum(c) || c == '-'; });
    if (!ok) return amp::quoted(host) + " is not a host name";
    if (end == host.size()) return std::nullopt;
    start = end + 1;
  }
}

struct host_port {
  std::string host;
  std::uint16_t port = 0;
};

result<host_port> parse_listen(std::string_view s) {
  auto problem = [&](const std::string& why) {
    return fail(
        fmt::format("listen: {} in {}; expected \"host:port\" with a port from 1 to 65535, e.g. "
                    "\"127.0.0.1:8080\" or \"[::1]:8080\"",
                    why, amp::quoted(s)));
  };
  std::string_view host;
  std::string_view port;
  if (!s.empty() && s.front() == '[') {
    const auto close = s.find(']');
    if (close == std::string_view::npos) return problem("the IPv6 address has no closing ']'");
    host = s.substr(1, close - 1);
    const auto rest = s.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return problem("the port is missing");
    if (host.find(':') == std::string_view::npos) {
      return problem(amp::quoted(host) + " in brackets is not an IPv6 address");
    }
    port = rest.substr(1);
  } else {
    const auto colon = s.rfind(':');
    if (colon == std::string_view::npos) return problem("the port is missing");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return problem("an IPv6 address must be written in brackets");
    }
  }
  if (auto why = host_problem(host)) return problem(*why);
  const bool digits =
      !port.empty() && port.size() <= 5 &&
      std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int number = digits ? std::stoi(std::string(port)) : 0;
  if (number < 1 || number > 65535) {
    return problem(port.empty() ? std::string("the port is missing")
                                : "the port " + amp::quoted(port) + " is not from 1 to 65535");
  }
  return host_port{std::string(host), static_cast<std::uint16_t>(number)};
}

// --- the sections -----------------------------------------------------------------------

result<void> apply_job(dom::element e, const std::string& path, job_override& out) {
  return for_members(
      e, path, {"lease_s", "max_attempts", "decline_delay_ms"},
      [&](std::string_view key, dom::element v, const std::string& p) -> result<void> {
        if (key == "lease_s") return set_int(v, p, k_lease_s, out.lease_s);
        if (key == "max_attempts") return set_int(v, p, k_max_attempts, out.max_attempts);
        return set_int(v, p, k_decline_delay_ms, out.decline_delay_ms);
      },
      nullable::yes);
}

result<void> apply_jobs(dom::element e, const std::string& path, server_config& c) {
  return for_members(
      e, path, {}, [&](std::string_view key, dom::element v, const std::string& p) -> result<void> {
        if (key == "*") {
          if (v.is_null()) {
            c.default_job = {};
            return {};
          }
          job_override o;
          if (auto r = apply_job(v, p, o); !r) return r;
          c.default_job = o.over(c.default_job);
          return {};
        }
        if (auto name = job_name::make(key); !name) {
          return fail(fmt::format("{}: {}", path, name.error().message()));
        }
        if (v.is_null()) {
          c.jobs.erase(std::string(key));
          return {};
        }
        return apply_job(v, p, c.jobs[std::string(key)]);
      });
}

result<void> apply_policy(dom::element e, const std::string& path, participant_policy_override& out,
                          nullable null_allowed) {
  return for_members(
      e, path, {"rate", "budget", "ops"},
      [&](std::string_view key, dom::element v, const std::string& p) -> result<void> {
        if (key == "ops") {
          return for_members(
              v, p, {"per_s", "burst"},
              [&](std::string_view k, dom::element x, const std::string& q) -> result<void> {
                if (k == "per_s") return set_number(x, q, k_rate, out.ops_per_s);
                return set_number(x, q, k_ops_burst, out.ops_burst);
              });
        }
        if (key == "rate") {
          return for_members(
              v, p, {"per_s", "burst", "bytes_per_s"},
              [&](std::string_view k, dom::element x, const std::string& q) -> result<void> {
                if (k == "per_s") return set_number(x, q, k_rate, out.per_s);
                if (k == "burst") return set_number(x, q, k_burst, out.burst);
                return set_number(x, q, k_rate, out.bytes_per_s);
              });
        }
        return for_members(
            v, p, {"per_day"},
            [&](std::string_view, dom::element x, const std::string& q) -> result<void> {
              if (x.is_null()) {
                out.per_day.emplace(std::nullopt);
                return {};
              }
              const auto n = integer_of(x);
              if (!n || *n < 0) {
                return fail(fmt::format("{}: must be null or {}, not {}", q,
                                        int_expectation(k_per_day), describe(x)));
              }
              out.per_day.emplace(*n);
              return {};
            });
      },
      null_allowed);
}

result<void> apply_policies(dom::element e, const std::string& path, server_config& c) {
  return for_members(
      e, path, {"default", "participants"},
      [&](std::string_view key, dom::element v, const std::string& p) -> result<void> {
        if (key == "default") {
          participant_policy_override o;
          if (auto r = apply_policy(v, p, o, nullable::no); !r) return r;
          c.default_policy = o.over(c.default_policy);
          return {};
        }
        return for_members(
            v, p, {},
            [&](std::string_view name, dom::element x, const std::string& q) -> result<void> {
              if (auto valid = participant_name::make(name); !valid) {
                return fail(fmt::format("{}: {}", p, valid.error().message()));
              }
              if (x.is_null()) {
                c.participant_policies.erase(std::string(name));
                return {};
              }
              return apply_policy(x, q, c.participant_policies[std::string(name)], nullable::yes);
            });
      });
}

result<void> apply_listen(dom::element e, server_config& c) {
  std::string_view s;
  if (e.get_string().get(s)) {
    return fail(fmt::format("listen: must be a string \"host:port\", not {}", describe(e)));
  }
  auto hp = parse_listen(s);
  if (!hp) return std::move(hp).error();
  c.listen_host = std::move(hp->host);
  c.listen_port = hp->port;
  return {};
}

result<void> apply_tls(dom::element e, const std::string& path, server_config::tls_section& t) {
  if (e.is_null()) {
    t = {};
    return {};
  }
  return for_members(
      e, path, {"cert", "key"},
      [&](std::string_view k, dom::element x, const std::string& q) {
        return set_optional_text(x, q, k == "cert" ? t.cert : t.key);
      },
      nullable::yes);
}

result<void> apply_nats(dom::element e, const std::string& path,
                        std::optional<server_config::nats_section>& nats) {
  if (e.is_null()) {
    nats.reset();
    return {};
  }
  if (!e.is_object()) {
    return fail(fmt::format("{}: must be an object or null, not {}", path, describe(e)));
  }
  auto& n = nats ? *nats : nats.emplace(server_config::nats_section{});
  return for_members(
      e, path, {"url", "creds", "replicas", "storage", "domain", "tls"},
      [&](std::string_view k, dom::element x, const std::string& q) -> result<void> {
        if (k == "url") return set_text(x, q, n.url);
        if (k == "creds") return set_optional_text(x, q, n.creds);
        if (k == "domain") return set_optional_text(x, q, n.domain);
        if (k == "tls") return set_nats_tls(x, q, n.tls_ca, n.tls_cert, n.tls_key);
        if (k == "replicas") return set_int(x, q, k_replicas, n.replicas);
        std::string_view s;
        if (!x.get_string().get(s) && (s == "file" || s == "memory")) {
          n.storage = s == "file" ? storage_type::file : storage_type::memory;
          return {};
        }
        return fail(fmt::format("{}: must be \"file\" or \"memory\", not {}", q, describe(x)));
      });
}

result<void> apply_auth(dom::element e, const std::string& path, server_config::auth_section& a) {
  return for_members(
      e, path, {"alg", "secret", "secret_file", "public_key_file", "audience", "leeway_s"},
      [&](std::string_view k, dom::element x, const std::string& q) -> result<void> {
        if (k == "alg") {
          std::string_view s;
          if (!x.get_string().get(s) && (s == "HS256" || s == "EdDSA")) {
            a.alg = s == "HS256" ? jwt_alg::hs256 : jwt_alg::eddsa;
            return {};
          }
          return fail(fmt::format("{}: must be \"HS256\" or \"EdDSA\", not {}", q, describe(x)));
        }
        if (k == "secret") return set_optional_text(x, q, a.secret, true);
        if (k == "secret_file") return set_optional_text(x, q, a.secret_file);
        if (k == "public_key_file") return set_optional_text(x, q, a.public_key_file);
        if (k == "audience") return set_optional_text(x, q, a.audience);
        return set_int(x, q, k_leeway_s, a.leeway_s);
      });
}

result<void> apply_limits(dom::element e, const std::string& path,
                          server_config::limits_section& l) {
  auto set = [&](std::string_view k, dom::element x, const std::string& q) -> result<void> {
    if (k == "max_frame_bytes") return set_int(x, q, k_max_frame_bytes, l.max_frame_bytes);
    if (k == "max_body_bytes") return set_int(x, q, k_max_body_bytes, l.max_body_bytes);
    if (k == "max_sessions") return set_int(x, q, k_max_sessions, l.max_sessions);
    if (k == "max_pending") return set_int(x, q, k_max_pending, l.max_pending);
    return set_int(x, q, k_max_subscriptions, l.max_subscriptions);
  };
  return for_members(
      e, path,
      {"max_frame_bytes", "max_body_bytes", "max_sessions", "max_subscriptions", "max_pending"},
      set);
}

result<void> apply_schemas(dom::element e, const std::string& path, server_config& c) {
  return for_members(
      e, path, {},
      [&](std::string_view type, dom::element x, const std::string& q) -> result<void> {
        if (auto why = message_type_problem(type)) {
          return fail(fmt::format("{}: {}", path, *why));
        }
        if (x.is_null()) {
          c.schemas.erase(std::string(type));
          return {};
        }
        return set_text(x, q, c.schemas[std::string(type)]);
      });
}

result<void> apply_stream_limits(dom::element e, const std::string& path,
                                 stream_limits_override& o) {
  return for_members(e, path, {"max_age_s", "max_bytes"},
                     [&](std::string_view k, dom::element x, const std::string& q) -> result<void> {
                       if (k == "max_age_s") return set_int(x, q, k_max_age_s, o.max_age_s);
                       return set_int(x, q, k_max_bytes, o.max_bytes);
                     });
}

result<void> apply_retention(dom::element e, const std::string& path,
                             server_config::retention_section& r) {
  return for_members(
      e, path, {"task_s", "inbox", "topics", "namespaces"},
      [&](std::string_view key, dom::element v, const std::string& p) -> result<void> {
        if (key == "task_s") return set_int(v, p, k_task_retention_s, r.task_s);
        if (key == "inbox" || key == "topics") {
          stream_limits_override o;
          if (auto ok = apply_stream_limits(v, p, o); !ok) return ok;
          auto& limits = key == "inbox" ? r.inbox : r.topics;
          limits = o.over(limits);
          return {};
        }
        return for_members(
            v, p, {},
            [&](std::string_view ns, dom::element x, const std::string& q) -> result<void> {
              if (auto name = namespace_name::make(ns); !name) {
                return fail(fmt::format("{}: {}", p, name.error().message()));
              }
              if (x.is_null()) {
                r.namespaces.erase(std::string(ns));
                return {};
              }
              auto& entry = r.namespaces[std::string(ns)];
              return for_members(
                  x, q, {"inbox", "topics"},
                  [&](std::string_view k, dom::element y, const std::string& w) -> result<void> {
                    return apply_stream_limits(y, w, k == "inbox" ? entry.inbox : entry.topics);
                  },
                  nullable::yes);
            });
      });
}

// Merges the configuration object `root` into `c`, checking each value on the way.
result<void> apply_root(dom::element root, server_config& c) {
  return for_members(
      root, "",
      {"listen", "tls", "nats", "auth", "heartbeat_s", "registry_ttl_s", "inbox_ack_s",
       "inbox_window", "inbox_idle_s", "jobs", "limits", "policy", "schemas", "retention"},
      [&](std::string_view key, dom::element v, const std::string& p) -> result<void> {
        if (key == "listen") return apply_listen(v, c);
        if (key == "tls") return apply_tls(v, p, c.tls);
        if (key == "nats") return apply_nats(v, p, c.nats);
        if (key == "auth") return apply_auth(v, p, c.auth);
        if (key == "heartbeat_s") return set_int(v, p, k_period_s, c.heartbeat_s);
        if (key == "registry_ttl_s") return set_int(v, p, k_period_s, c.registry_ttl_s);
        if (key == "inbox_ack_s") return set_int(v, p, k_period_s, c.inbox_ack_s);
        if (key == "inbox_window") return set_int(v, p, k_inbox_window, c.inbox_window);
        if (key == "inbox_idle_s") return set_int(v, p, k_inbox_idle_s, c.inbox_idle_s);
        if (key == "jobs") return apply_jobs(v, p, c);
        if (key == "limits") return apply_limits(v, p, c.limits);
        if (key == "policy") return apply_policies(v, p, c);
        if (key == "retention") return apply_retention(v, p, c.retention);
        return apply_schemas(v, p, c);
      });
}

// --- checks of a built value ------------------------------------------------------------

result<void> check_int(const std::string& path, std::int64_t v, int_range r) {
  if (v < r.min || v > r.max) {
    return fail(fmt::format("{}: must be {}, not {}", path, int_expectation(r), v));
  }
  return {};
}

result<void> check_size(const std::string& path, std::size_t v, int_range r) {
  if (v > static_cast<std::uint64_t>(r.max)) {
    return fail(fmt::format("{}: must be {}, not {}", path, int_expectation(r), v));
  }
  return check_int(path, static_cast<std::int64_t>(v), r);
}

result<void> check_number(const std::string& path, double v, number_floor f) {
  if (!std::isfinite(v) || (f.inclusive ? v < f.min : !(v > f.min))) {
    return fail(fmt::format("{}: must be {}, not {}", path, number_expectation(f), v));
  }
  return {};
}

result<void> check_text(const std::string& path, const std::optional<std::string>& s,
                        bool secret = false) {
  if (!s || usable_text(*s)) return {};
  return fail(fmt::format("{}: must be a non-empty string without NUL, or null; not {}", path,
                          s->empty() ? "an empty string"
                          : secret   ? "a string with NUL"
                                     : amp::quoted(*s)));
}

result<void> check_limits(const std::string& path, const stream_limits_override& o) {
  if (o.max_age_s) {
    if (auto r = check_int(path + ".max_age_s", *o.max_age_s, k_max_age_s); !r) return r;
    if (*o.max_age_s != 0 && *o.max_age_s < k_min_max_age_s) {
      return fail(fmt::format("{}.max_age_s: must be 0 (no limit) or at least {}, not {}", path,
                              k_min_max_age_s, *o.max_age_s));
    }
  }
  if (o.max_bytes) {
    if (auto r = check_int(path + ".max_bytes", *o.max_bytes, k_max_bytes); !r) return r;
    if (*o.max_bytes != 0 && *o.max_bytes < k_min_max_bytes) {
      return fail(fmt::format("{}.max_bytes: must be 0 (no limit) or at least {}, not {}", path,
                              k_min_max_bytes, *o.max_bytes));
    }
  }
  return {};
}

stream_limits_override as_override(const stream_limits& l) {
  return {.max_age_s = l.max_age_s, .max_bytes = l.max_bytes};
}

result<void> check_retention(const server_config::retention_section& r) {
  if (auto ok = check_int("retention.task_s", r.task_s, k_task_retention_s); !ok) return ok;
  if (auto ok = check_limits("retention.inbox", as_override(r.inbox)); !ok) return ok;
  if (auto ok = check_limits("retention.topics", as_override(r.topics)); !ok) return ok;
  for (const auto& [ns, o] : r.namespaces) {
    if (auto valid = namespace_name::make(ns); !valid) {
      return fail("retention.namespaces: " + valid.error().message());
    }
    const auto path = join("retention.namespaces", ns);
    if (auto ok = check_limits(path + ".inbox", o.inbox); !ok) return ok;
    if (auto ok = check_limits(path + ".topics", o.topics); !ok) return ok;
  }
  return {};
}

result<void> check_job(const std::string& path, const job_override& o) {
  if (o.lease_s) {
    if (auto r = check_int(path + ".lease_s", *o.lease_s, k_lease_s); !r) return r;
  }
  if (o.max_attempts) {
    if (auto r = check_int(path + ".max_attempts", *o.max_attempts, k_max_attempts); !r) return r;
  }
  if (o.decline_delay_ms) {
    return check_int(path + ".decline_delay_ms", *o.decline_delay_ms, k_decline_delay_ms);
  }
  return {};
}

result<void> check_policy(const std::string& path, const participant_policy_override& o) {
  if (o.per_s) {
    if (auto r = check_number(path + ".rate.per_s", *o.per_s, k_rate); !r) return r;
  }
  if (o.burst) {
    if (auto r = check_number(path + ".rate.burst", *o.burst, k_burst); !r) return r;
  }
  if (o.bytes_per_s) {
    if (auto r = check_number(path + ".rate.bytes_per_s", *o.bytes_per_s, k_rate); !r) return r;
  }
  if (o.ops_per_s) {
    if (auto r = check_number(path + ".ops.per_s", *o.ops_per_s, k_rate); !r) return r;
  }
  if (o.ops_burst) {
    if (auto r = check_number(path + ".ops.burst", *o.ops_burst, k_ops_burst); !r) return r;
  }
  if (o.per_day && *o.per_day && **o.per_day < 0) {
    return fail(fmt::format("{}.budget.per_day: must be null or {}, not {}", path,
                            int_expectation(k_per_day), **o.per_day));
  }
  return {};
}

participant_policy_override as_override(const participant_policy& p) {
  return {p.rate.per_s, p.rate.burst, p.rate.bytes_per_s,
          p.ops.per_s,  p.ops.burst,  p.budget.per_day};
}

job_override as_override(const job_settings& j) {
  return {j.lease_s, j.max_attempts, j.decline_delay_ms};
}

}  // namespace

participant_policy participant_policy_override::over(const participant_policy& base) const {
  participant_policy out = base;
  if (per_s) out.rate.per_s = *per_s;
  if (burst) out.rate.burst = *burst;
  if (bytes_per_s) out.rate.bytes_per_s = *bytes_per_s;
  if (ops_per_s) out.ops.per_s = *ops_per_s;
  if (ops_burst) out.ops.burst = *ops_burst;
  if (per_day) out.budget.per_day = *per_day;
  return out;
}

job_config job_settings::to_job_config() const {
  return job_config{.lease = std::chrono::seconds(lease_s),
                    .max_attempts = max_attempts,
                    .decline_delay = std::chrono::milliseconds(decline_delay_ms)};
}

stream_limits stream_limits_override::over(const stream_limits& base) const {
  stream_limits out = base;
  if (max_age_s) out.max_age_s = *max_age_s;
  if (max_bytes) out.max_bytes = *max_bytes;
  return out;
}

stream_limits server_config::retention_section::inbox_of(std::string_view ns) const {
  auto it = namespaces.find(ns);
  return it == namespaces.end() ? inbox : it->second.inbox.over(inbox);
}

stream_limits server_config::retention_section::topics_of(std::string_view ns) const {
  auto it = namespaces.find(ns);
  return it == namespaces.end() ? topics : it->second.topics.over(topics);
}

job_settings job_override::over(const job_settings& base) const {
  job_settings out = base;
  if (lease_s) out.lease_s = *lease_s;
  if (max_attempts) out.max_attempts = *max_attempts;
  if (decline_delay_ms) out.decline_delay_ms = *decline_delay_ms;
  return out;
}

std::string server_config::listen() const {
  if (listen_host.find(':') != std::string::npos) {
    return fmt::format("[{}]:{}", listen_host, listen_port);
  }
  return fmt::format("{}:{}", listen_host, listen_port);
}

job_settings server_config::job(std::string_view name) const {
  auto it = jobs.find(name);
  return it == jobs.end() ? default_job : it->second.over(default_job);
}

participant_policy server_config::policy_for(std::string_view participant) const {
  auto it = participant_policies.find(participant);
  return it == participant_policies.end() ? default_policy : it->second.over(default_policy);
}

policy_config server_config::to_policy_config() const {
  policy_config out;
  out.default_policy = default_policy;
  for (const auto& [name, o] : participant_policies) {
    out.participants.emplace(name, o.over(default_policy));
  }
  if (nats) {
    out.storage = nats->storage;
    out.replicas = nats->replicas;
  } else {
    out.storage = storage_type::memory;
    out.replicas = 1;
  }
  return out;
}

broker_config server_config::broker_for(const namespace_name& ns) const {
  broker_config out{.ns = ns};
  if (nats) {
    out.storage = nats->storage;
    out.replicas = nats->replicas;
  } else {
    out.storage = storage_type::memory;
    out.replicas = 1;
  }
  out.inbox_ack_wait = std::chrono::seconds(inbox_ack_s);
  out.inbox_window = inbox_window;
  out.inbox_idle_consumer = std::chrono::seconds(inbox_idle_s);
  out.registry_ttl = std::chrono::seconds(registry_ttl_s);
  out.default_job = default_job.to_job_config();
  for (const auto& [name, o] : jobs) out.jobs.emplace(name, o.over(default_job).to_job_config());
  out.task_retention = std::chrono::seconds(retention.task_s);
  const auto inbox = retention.inbox_of(ns.view());
  out.inbox_max_age = std::chrono::seconds(inbox.max_age_s);
  out.inbox_max_bytes = inbox.max_bytes > 0 ? inbox.max_bytes : -1;
  const auto topics = retention.topics_of(ns.view());
  out.topic_max_age = std::chrono::seconds(topics.max_age_s);
  out.topic_max_bytes = topics.max_bytes > 0 ? topics.max_bytes : -1;
  return out;
}

result<void> check_server_config(const server_config& c) {
  // listen
  if (auto why = host_problem(c.listen_host)) {
    return fail(fmt::format("listen: {} (the host of {})", *why, amp::quoted(c.listen())));
  }
  if (c.listen_port == 0) return fail("listen: the port must be from 1 to 65535, not 0");

  // tls
  if (auto r = check_text("tls.cert", c.tls.cert); !r) return r;
  if (auto r = check_text("tls.key", c.tls.key); !r) return r;
  if (c.tls.cert && !c.tls.key) return fail("tls.key: required when tls.cert is given");
  if (c.tls.key && !c.tls.cert) return fail("tls.cert: required when tls.key is given");

  // nats
  if (c.nats) {
    const auto& url = c.nats->url;
    const bool url_ok =
        usable_text(url) &&
        std::none_of(
            url.begin(), url.end(),
            [](char ch) { return static_cast<unsigned char>(ch) <= 0x20 || ch == 0x7f; }) &&
        url.front() != ',' && url.back() != ',' && url.find(",,") == std::string::npos;
    if (!url_ok) {
      return fail(fmt::format(
          "nats.url: must be a URL such as \"nats://127.0.0.1:4222\", or several separated by "
          "commas, without spaces; not {}",
          amp::quoted(url)));
    }
    if (auto r = check_text("nats.creds", c.nats->creds); !r) return r;
    if (auto r = check_int("nats.replicas", c.nats->replicas, k_replicas); !r) return r;
    if (auto r = check_text("nats.tls.ca", c.nats->tls_ca); !r) return r;
    if (auto r = check_text("nats.tls.cert", c.nats->tls_cert); !r) return r;
    if (auto r = check_text("nats.tls.key", c.nats->tls_key); !r) return r;
    if (c.nats->tls_cert && !c.nats->tls_key)
      return fail("nats.tls.key: required when nats.tls.cert is given");
    if (c.nats->tls_key && !c.nats->tls_cert)
      return fail("nats.tls.cert: required when nats.tls.key is given");
    if (const auto& d = c.nats->domain) {
      if (!valid_jetstream_domain(*d)) {
        return fail(
            fmt::format("nats.domain: must be 1 to 64 letters, digits, - or _, or null; not {}",
                        amp::quoted(*d)));
      }
    }
  }

  // auth
  const auto& a = c.auth;
  if (auto r = check_text("auth.secret", a.secret, true); !r) return r;
  if (auto r = check_text("auth.secret_file", a.secret_file); !r) return r;
  if (auto r = check_text("auth.public_key_file", a.public_key_file); !r) return r;
  if (auto r = check_text("auth.audience", a.audience); !r) return r;
  if (auto r = check_int("auth.leeway_s", a.leeway_s, k_leeway_s); !r) return r;
  if (a.alg == jwt_alg::hs256) {
    if (a.secret && a.secret_file) {
      return fail("auth.secret_file: give auth.secret or auth.secret_file, not both");
    }
    if (a.public_key_file) {
      return fail(
          "auth.public_key_file: only used with auth.alg \"EdDSA\", and auth.alg is "
          "\"HS256\"");
    }
  } else if (a.alg == jwt_alg::eddsa) {
    for (const auto& [key, value] :
         {std::pair{"auth.secret", &a.secret}, std::pair{"auth.secret_file", &a.secret_file}}) {
      if (*value) {
        return fail(
            fmt::format("{}: only used with auth.alg \"HS256\", and auth.alg is \"EdDSA\"", key));
      }
    }
    if (!a.public_key_file) {
      return fail("auth.public_key_file: required when auth.alg is \"EdDSA\"");
    }
  } else {
    return fail("auth.alg: must be \"HS256\" or \"EdDSA\"");
  }

  // periods
  if (auto r = check_int("heartbeat_s", c.heartbeat_s, k_period_s); !r) return r;
  if (auto r = check_int("registry_ttl_s", c.registry_ttl_s, k_period_s); !r) return r;
  if (auto r = check_int("inbox_ack_s", c.inbox_ack_s, k_period_s); !r) return r;
  if (auto r = check_int("inbox_window", c.inbox_window, k_inbox_window); !r) return r;
  if (auto r = check_int("inbox_idle_s", c.inbox_idle_s, k_inbox_idle_s); !r) return r;
  if (c.registry_ttl_s <= c.heartbeat_s) {
    return fail(fmt::format("registry_ttl_s: must be greater than heartbeat_s ({}), not {}",
                            c.heartbeat_s, c.registry_ttl_s));
  }

  // jobs
  if (auto r = check_job("jobs.*", as_override(c.default_job)); !r) return r;
  for (const auto& [name, o] : c.jobs) {
    if (auto valid = job_name::make(name); !valid) {
      return fail("jobs: " + valid.error().message());
    }
    if (auto r = check_job(join("jobs", name), o); !r) return r;
  }

  // limits
  const auto& l = c.limits;
  if (auto r = check_size("limits.max_frame_bytes", l.max_frame_bytes, k_max_frame_bytes); !r) {
    return r;
  }
  if (auto r = check_size("limits.max_body_bytes", l.max_body_bytes, k_max_body_bytes); !r) {
    return r;
  }
  if (auto r = check_size("limits.max_sessions", l.max_sessions, k_max_sessions); !r) return r;
  if (auto r = check_size("limits.max_subscriptions", l.max_subscriptions, k_max_subscriptions);
      !r) {
    return r;
  }
  if (auto r = check_size("limits.max_pending", l.max_pending, k_max_pending); !r) return r;
  if (l.max_body_bytes > l.max_frame_bytes) {
    return fail(
        fmt::format("limits.max_body_bytes: must be at most limits.max_frame_bytes ({}), not {}",
                    l.max_frame_bytes, l.max_body_bytes));
  }

  // policy
  if (auto r = check_policy("policy.default", as_override(c.default_policy)); !r) return r;
  for (const auto& [name, o] : c.participant_policies) {
    if (auto valid = participant_name::make(name); !valid) {
      return fail("policy.participants: " + valid.error().message());
    }
    if (auto r = check_policy(join("policy.participants", name), o); !r) return r;
  }

  // schemas
  for (const auto& [type, file] : c.schemas) {
    if (auto why = message_type_problem(type)) return fail("schemas: " + *why);
    if (!usable_text(file)) {
      return fail(fmt::format("{}: must be a non-empty string without NUL, not {}",
                              join("schemas", type), amp::quoted(file)));
    }
  }
  return check_retention(c.retention);
}

result<server_config> parse_server_config(std::string_view json) {
  // A UTF-8 byte order mark, as some editors write, is ignored (RFC 8259 allows it).
  if (json.starts_with("\xEF\xBB\xBF")) json.remove_prefix(3);
  dom::parser parser;
  dom::element root;
  if (auto code = parser.parse(json.data(), json.size()).get(root)) {
    return detail::not_json_error(code);
  }
  server_config c;
  if (auto r = apply_root(root, c); !r) return std::move(r).error();
  if (auto r = check_server_config(c); !r) return std::move(r).error();
  return c;
}

result<server_config> load_server_config(const std::string& path) {
  auto text = read_config_file(path, k_max_file_bytes);
  if (!text) return text.error();
  auto parsed = parse_server_config(*text);
  if (!parsed) return fail(fmt::format("{}: {}", path, parsed.error().message()));
  auto& c = *parsed;
  const auto base = std::filesystem::path(path).parent_path();
  for (auto* p : {&c.tls.cert, &c.tls.key, &c.auth.secret_file, &c.auth.public_key_file}) {
    if (*p) *p = resolve_path(base, **p);
  }
  if (c.nats) {
    for (auto* p : {&c.nats->creds, &c.nats->tls_ca, &c.nats->tls_cert, &c.nats->tls_key}) {
      if (*p) *p = resolve_path(base, **p);
    }
  }
  for (auto& [type, file] : c.schemas) file = resolve_path(base, file);
  return parsed;
}

result<void> set_config_value(server_config& config, std::string_view dotted_key,
                              std::string_view value_json) {
  // "schemas.review.request": after "schemas." the rest is one message type.
  auto text = override_document(dotted_key, value_json, [](const auto& segments) {
    return segments.size() == 1 && segments.front() == "schemas";
  });
  if (!text) return text.error();
  const auto shown = shown_key(dotted_key);

  dom::parser parser;
  dom::element root;
  if (auto code = parser.parse(text->data(), text->size()).get(root)) {
    return fail(fmt::format("{}: {}", shown, detail::not_json_error(code).message()));
  }
  server_config changed = config;
  if (auto r = apply_root(root, changed); !r) return r;
  config = std::move(changed);
  return {};
}

}  // namespace amp
