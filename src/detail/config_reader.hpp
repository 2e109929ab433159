#pragma once

// Reading a configuration from JSON with messages a user can act on: every failure names
// the key (`nats.url: must be …, not 42`), unknown keys get a "did you mean", a key given
// twice is refused. Shared by the server's configuration (gateway/config.cpp) and the
// sink's (sink/config.cpp). Private to the library.

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <vector>

#include "amp/error.hpp"
#include "amp/json.hpp"
#include "amp/result.hpp"
#include "detail/simdjson_adapter.hpp"

namespace amp::detail::config {

namespace dom = simdjson::dom;
using element_type = dom::element_type;

/// An inclusive range of integers.
struct int_range {
  std::int64_t min;
  std::int64_t max;
};
inline constexpr std::int64_t k_unbounded = std::numeric_limits<std::int64_t>::max();

// A lower bound of a number: `min` itself allowed or not.
struct number_floor {
  double min;
  bool inclusive;
};

inline unexpected fail(std::string message) {
  return unexpected(errc::bad_request, std::move(message));
}

inline std::string join(std::string_view path, std::string_view key) {
  if (path.empty()) return std::string(key);
  std::string out;
  out.reserve(path.size() + 1 + key.size());
  out.append(path).append(".").append(key);
  return out;
}

// A value for "…, not X": numbers and literals as written, strings quoted, containers by
// kind. A secret is described by its kind only, never shown.
inline std::string describe(dom::element e, bool secret = false) {
  switch (e.type()) {
    case element_type::INT64:
    case element_type::UINT64:
    case element_type::DOUBLE: return secret ? "a number" : simdjson::minify(e);
    case element_type::STRING: {
      const std::string_view s = e.get_string().value_unsafe();
      if (secret) return s.empty() ? "an empty string" : "a string";
      return amp::quoted(s);
    }
    case element_type::BOOL: return e.get_bool().value_unsafe() ? "true" : "false";
    case element_type::NULL_VALUE: return "null";
    case element_type::ARRAY:
    case element_type::OBJECT: break;
  }
  return detail::type_name(e.type());
}

inline std::string int_expectation(int_range r) {
  if (r.max == k_unbounded) return fmt::format("an integer of at least {}", r.min);
  return fmt::format("an integer from {} to {}", r.min, r.max);
}

inline std::string number_expectation(number_floor f) {
  return f.inclusive ? fmt::format("a number of at least {}", f.min)
                     : fmt::format("a number greater than {}", f.min);
}

// An integer as JSON Schema sees it: an int64, or a number with no fractional part.
inline std::optional<std::int64_t> integer_of(dom::element e) {
  if (e.type() == element_type::INT64) return e.get_int64().value_unsafe();
  std::int64_t n = 0;
  if (e.type() == element_type::DOUBLE &&
      detail::integral_double(e.get_double().value_unsafe(), n)) {
    return n;
  }
  return std::nullopt;
}

inline std::optional<double> number_of(dom::element e) {
  switch (e.type()) {
    case element_type::INT64: return static_cast<double>(e.get_int64().value_unsafe());
    case element_type::UINT64: return static_cast<double>(e.get_uint64().value_unsafe());
    case element_type::DOUBLE: return e.get_double().value_unsafe();
    default: return std::nullopt;
  }
}

template <class T>
struct value_of {
  using type = T;
};
template <class T>
struct value_of<std::optional<T>> {
  using type = T;
};

// Reads an integer within `r` into `out` (an integer, or an optional one).
template <class T>
result<void> set_int(dom::element e, const std::string& path, int_range r, T& out) {
  const auto n = integer_of(e);
  if (!n || *n < r.min || *n > r.max) {
    return fail(fmt::format("{}: must be {}, not {}", path, int_expectation(r), describe(e)));
  }
  out = static_cast<typename value_of<T>::type>(*n);
  return {};
}

template <class T>
result<void> set_number(dom::element e, const std::string& path, number_floor f, T& out) {
  const auto n = number_of(e);
  if (!n || !std::isfinite(*n) || (f.inclusive ? *n < f.min : !(*n > f.min))) {
    return fail(fmt::format("{}: must be {}, not {}", path, number_expectation(f), describe(e)));
  }
  out = *n;
  return {};
}

// A string that is not empty and holds no NUL (it may become a file name or a C string).
inline bool usable_text(std::string_view s) {
  return !s.empty() && s.find('\0') == std::string_view::npos;
}

inline result<void> set_text(dom::element e, const std::string& path, std::string& out) {
  std::string_view s;
  if (e.get_string().get(s) || !usable_text(s)) {
    return fail(
        fmt::format("{}: must be a non-empty string without NUL, not {}", path, describe(e)));
  }
  out.assign(s);
  return {};
}

inline result<void> set_optional_text(dom::element e, const std::string& path,
                                      std::optional<std::string>& out, bool secret = false) {
  if (e.is_null()) {
    out.reset();
    return {};
  }
  std::string_view s;
  if (e.get_string().get(s) || !usable_text(s)) {
    return fail(fmt::format("{}: must be a non-empty string without NUL, or null; not {}", path,
                            describe(e, secret)));
  }
  out.emplace(s);
  return {};
}

// Levenshtein distance, for "did you mean".
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

inline std::string unknown_key(std::string_view path, std::string_view key,
                               std::initializer_list<std::string_view> known) {
  std::string message = "unknown key " + amp::quoted(join(path, key));
  std::string_view best;
  std::size_t best_distance = 3;  // suggest only within two edits
  for (auto candidate : known) {
    const auto d = edit_distance(key, candidate);
    if (d < best_distance && d < candidate.size()) {
      best = candidate;
      best_distance = d;
    }
  }
  if (!best.empty()) message += " (did you mean " + amp::quoted(join(path, best)) + "?)";
  return message;
}

enum class nullable { no, yes };

// Calls `fn(key, value, key_path)` for each member of the object `e` at `path`, in order,
// after refusing a value that is not an object, a key given twice, and, when `known` is
// not empty, a key outside `known`. The first error stops the walk.
template <class Fn>
result<void> for_members(dom::element e, const std::string& path,
                         std::initializer_list<std::string_view> known, Fn&& fn,
                         nullable null_allowed = nullable::no) {
  dom::object object;
  if (e.get_object().get(object)) {
    if (path.empty()) {
      return fail(fmt::format("the configuration must be a JSON object, not {}", describe(e)));
    }
    return fail(fmt::format("{}: must be an object{}, not {}", path,
                            null_allowed == nullable::yes ? " or null" : "", describe(e)));
  }
  std::unordered_set<std::string_view> seen;
  for (auto member : object) {
    const std::string_view key = member.key;
    if (!seen.insert(key).second) return fail("duplicate key " + amp::quoted(join(path, key)));
    if (known.size() != 0 && std::find(known.begin(), known.end(), key) == known.end()) {
      return fail(unknown_key(path, key, known));
    }
    if (auto r = fn(key, member.value, join(path, key)); !r) return r;
  }
  return {};
}

/// `nats.tls` (server and sink alike): `null` clears the three files; otherwise an object
/// of `ca`, `cert` and `key`, each a file name or `null`.
inline result<void> set_nats_tls(dom::element e, const std::string& path,
                                 std::optional<std::string>& ca, std::optional<std::string>& cert,
                                 std::optional<std::string>& key) {
  if (e.is_null()) {
    ca = cert = key = std::nullopt;
    return {};
  }
  return for_members(
      e, path, {"ca", "cert", "key"},
      [&](std::string_view k, dom::element y, const std::string& q) {
        return set_optional_text(y, q, k == "ca" ? ca : k == "cert" ? cert : key);
      },
      nullable::yes);
}

/// The text of the configuration file `path`, at most `max_bytes`. Errors: `bad_request`
/// "cannot read PATH: why" (missing, unreadable, a directory, too large).
inline result<std::string> read_config_file(const std::string& path, std::size_t max_bytes) {
  auto cannot_read = [&](const std::string& why) {
    return fail(fmt::format("cannot read {}: {}", path, why));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return cannot_read(std::generic_category().message(errno));
  struct closer {
    int handle;
    ~closer() { ::close(handle); }
  } close_on_return{fd};

  struct stat st {};
  if (::fstat(fd, &st) != 0) return cannot_read(std::generic_category().message(errno));
  if (S_ISDIR(st.st_mode)) return cannot_read(std::generic_category().message(EISDIR));

  std::string text;
  char buffer[65536];
  for (;;) {
    const auto n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      return cannot_read(std::generic_category().message(errno));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > max_bytes) {
      return cannot_read(fmt::format("larger than {} bytes", max_bytes));
    }
  }
  return text;
}

/// `p` relative to `base` (the configuration file's folder) unless it is absolute.
inline std::string resolve_path(const std::filesystem::path& base, const std::string& p) {
  const std::filesystem::path path(p);
  if (base.empty() || path.is_absolute()) return p;
  return (base / path).string();
}

/// A dotted key as a message shows it: as it is when it is plain, quoted otherwise.
inline std::string shown_key(std::string_view dotted_key) {
  const bool plain =
      !dotted_key.empty() && std::all_of(dotted_key.begin(), dotted_key.end(), [](char c) {
        return c > 0x20 && c < 0x7f && c != '"' && c != '\\';
      });
  return plain ? std::string(dotted_key) : amp::quoted(dotted_key);
}

/// The partial configuration that sets one key (`--set a.b=VALUE`): `{"a":{"b":VALUE}}`.
/// `rest_is_one(segments so far)` says when the rest of the key, dots and all, is one last
/// segment (a message type after `schemas.`). Errors: `bad_request` naming the key for an
/// empty segment or a value that is not JSON (with a hint to quote strings).
template <class RestIsOne>
result<std::string> override_document(std::string_view dotted_key, std::string_view value_json,
                                      RestIsOne&& rest_is_one) {
  const auto shown = shown_key(dotted_key);
  std::vector<std::string_view> segments;
  std::string_view rest = dotted_key;
  for (;;) {
    if (rest_is_one(segments)) {
      segments.push_back(rest);
      break;
    }
    const auto dot = rest.find('.');
    segments.push_back(rest.substr(0, dot));
    if (dot == std::string_view::npos) break;
    rest.remove_prefix(dot + 1);
  }
  if (std::any_of(segments.begin(), segments.end(), [](auto s) { return s.empty(); })) {
    return fail(fmt::format("{}: not a key (an empty part between dots)", shown));
  }
  if (auto valid = json_check(value_json); !valid) {
    std::string hint;
    const auto first = value_json.find_first_not_of(" \t\r\n");
    if (first == std::string_view::npos ||
        std::string_view("{[\"").find(value_json[first]) == std::string_view::npos) {
      hint = " (the value is JSON: write a string in double quotes)";
    }
    return fail(fmt::format("{}: {}{}", shown, valid.error().message(), hint));
  }
  std::string text;
  for (auto s : segments) text.append("{").append(json_quote(s)).append(":");
  text.append(value_json);
  text.append(segments.size(), '}');
  return text;
}

}  // namespace amp::detail::config
