// fuzz_envelope: reading envelopes (amp/envelope.hpp) and validating documents against the
// JSON Schemas compiled into the library (amp/schema.hpp).
//
// Feeds the input, as it is, to `parse_envelope`, then to `json_schema::validate` of every
// embedded schema (`envelope`, every `frames/<op>`, `frames/names`, `frames/server/<op>`).
//
// Asserts:
// - `parse_envelope` refuses with `bad_request` exactly when `json_check` says the text is
//   not JSON, and with `invalid_envelope` (and a path that is "" or a JSON Pointer)
//   otherwise; an envelope it reads passes the `envelope` schema, its body is JSON, and
//   `to_json` gives a text that reads back as the same envelope (with `ts` to the
//   millisecond);
// - `validate` is `bad_request` exactly when the text is not JSON; otherwise it passes or is
//   `invalid_envelope` with a JSON Pointer and a message that starts "at ".

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "amp/detail/embedded_schemas.hpp"
#include "amp/envelope.hpp"
#include "amp/json.hpp"
#include "amp/names.hpp"
#include "amp/schema.hpp"
#include "check.hpp"

namespace {

using amp::quoted;

struct named_schema {
  std::string_view name;
  amp::json_schema schema;
};

const std::vector<named_schema>& schemas() {
  static const auto all = [] {
    std::vector<named_schema> v;
    for (const auto& e : amp::detail::embedded_schemas()) {
      auto s = amp::json_schema::embedded(e.name);
      AMP_FUZZ_CHECK(s.has_value(), s.error().to_string());
      v.push_back({e.name, *s});
    }
    AMP_FUZZ_CHECK(!v.empty(), "no embedded schema");
    return v;
  }();
  return all;
}

const amp::json_schema& envelope_schema() {
  static const auto s = amp::json_schema::embedded("envelope");
  AMP_FUZZ_CHECK(s.has_value(), s.error().to_string());
  return *s;
}

bool pointer_or_root(std::string_view path) {
  return path.empty() || path.front() == '/';
}

void check_envelope(std::string_view input, bool is_json) {
  auto e = amp::parse_envelope(input);
  if (!e) {
    const auto& err = e.error();
    AMP_FUZZ_CHECK(is_json ? err == amp::errc::invalid_envelope : err == amp::errc::bad_request,
                   "json_check " + std::string(is_json ? "passes" : "fails") +
                       ", parse_envelope: " + err.to_string());
    AMP_FUZZ_CHECK(pointer_or_root(err.path()), err.path());
    return;
  }
  AMP_FUZZ_CHECK(is_json, quoted(input));
  AMP_FUZZ_CHECK(envelope_schema().validate(input).has_value(), quoted(input));
  AMP_FUZZ_CHECK(amp::json_check(e->body).has_value(), quoted(e->body));

  // The header's promise: what parse_envelope accepts reads back exactly.
  auto text = amp::to_json(*e);
  auto back = amp::parse_envelope(text);
  AMP_FUZZ_CHECK(back.has_value(), text + ": " + back.error().to_string());
  AMP_FUZZ_CHECK(*back == *e, "to_json does not read back: " + text + "\n  from " + quoted(input));
  AMP_FUZZ_CHECK(amp::to_json(*back) == text, text);
}

void check_schema(const named_schema& s, std::string_view input, bool is_json) {
  auto r = s.schema.validate(input);
  if (r) {
    AMP_FUZZ_CHECK(is_json, std::string(s.name) + " accepts " + quoted(input));
    return;
  }
  const auto& err = r.error();
  AMP_FUZZ_CHECK(is_json ? err == amp::errc::invalid_envelope : err == amp::errc::bad_request,
                 std::string(s.name) + ": " + err.to_string());
  if (!is_json) return;
  AMP_FUZZ_CHECK(pointer_or_root(err.path()), std::string(s.name) + ": " + err.path());
  AMP_FUZZ_CHECK(err.message().starts_with("at "), std::string(s.name) + ": " + err.message());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  bool is_json = amp::json_check(input).has_value();
  check_envelope(input, is_json);
  for (const auto& s : schemas()) check_schema(s, input, is_json);
  return 0;
}
