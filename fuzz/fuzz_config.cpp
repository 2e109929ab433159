// fuzz_config: the server configuration (amp/gateway/config.hpp).
//
// Feeds the input, as it is, to `parse_server_config`; and when it has a '\n', its first line
// as a key path and the rest as the value to `set_config_value` over the defaults (the
// command line's `--set key=value`).
//
// Asserts:
// - a refusal is `bad_request` with a message, and never shows the value of `auth.secret`
//   (checked for a secret of 16 or more letters and digits, in a file that begins
//   `{"auth":{"secret":"…"` and has it once, and for the key `auth.secret`);
// - an accepted configuration passes `check_server_config`, names its jobs, participants and
//   message types in their grammars, survives `listen()` given back to `set_config_value`,
//   and gives a policy and broker configuration without fault;
// - `set_config_value` leaves the configuration unchanged when it refuses.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "amp/gateway/config.hpp"
#include "amp/json.hpp"
#include "amp/names.hpp"
#include "check.hpp"

namespace {

using amp::quoted;

bool alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// `text` when it is 16 or more letters and digits, a secret that a message showing it
// would be caught with; empty otherwise.
std::string_view findable(std::string_view text) {
  if (text.size() < 16) return {};
  for (char c : text) {
    if (!alnum(c)) return {};
  }
  return text;
}

// The secret of a file that begins `{"auth":{"secret":"S"` when S is findable and appears
// nowhere else in the file.
std::string_view file_secret(std::string_view input) {
  constexpr std::string_view start = R"({"auth":{"secret":")";
  if (!input.starts_with(start)) return {};
  auto value = input.substr(start.size());
  value = findable(value.substr(0, value.find('"')));
  if (value.empty() || input.find(value) != input.rfind(value)) return {};
  return value;
}

void check_refusal(const amp::error& e, std::string_view input, std::string_view secret) {
  AMP_FUZZ_CHECK(e == amp::errc::bad_request, e.to_string());
  AMP_FUZZ_CHECK(!e.message().empty(), quoted(input));
  AMP_FUZZ_CHECK(secret.empty() || e.message().find(secret) == std::string::npos,
                 "the message shows the secret: " + e.message());
}

// ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$
bool message_type(std::string_view s) {
  if (s.empty() || s.size() > 128 || !alnum(s[0])) return false;
  for (char c : s) {
    if (!(alnum(c) || c == '.' || c == '_' || c == '-')) return false;
  }
  return true;
}

void check_accepted(const amp::server_config& c, std::string_view input) {
  auto checked = amp::check_server_config(c);
  AMP_FUZZ_CHECK(checked.has_value(), checked.error().to_string() + " for " + quoted(input));
  for (const auto& [name, job] : c.jobs) {
    AMP_FUZZ_CHECK(amp::job_name::make(name), quoted(name));
    (void)c.job(name);
  }
  for (const auto& [name, policy] : c.participant_policies) {
    AMP_FUZZ_CHECK(amp::participant_name::make(name), quoted(name));
    (void)c.policy_for(name);
  }
  for (const auto& [type, path] : c.schemas) AMP_FUZZ_CHECK(message_type(type), quoted(type));

  auto copy = c;
  auto listen = amp::set_config_value(copy, "listen", amp::json_quote(c.listen()));
  AMP_FUZZ_CHECK(listen.has_value(), c.listen() + ": " + listen.error().to_string());
  AMP_FUZZ_CHECK(copy == c, "listen " + c.listen() + " reads back as " + copy.listen());

  (void)c.to_policy_config();
  (void)c.broker_for(*amp::namespace_name::make("demo"));
  (void)c.job("unnamed");
  (void)c.policy_for("unnamed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);

  auto parsed = amp::parse_server_config(input);
  if (parsed) {
    check_accepted(*parsed, input);
  } else {
    check_refusal(parsed.error(), input, file_secret(input));
  }

  auto newline = input.find('\n');
  if (newline == std::string_view::npos) return 0;
  auto key = input.substr(0, newline);
  auto value = input.substr(newline + 1);
  std::string_view secret;
  if (key == "auth.secret" && value.size() >= 2 && value.front() == '"' && value.back() == '"') {
    secret = findable(value.substr(1, value.size() - 2));
  }
  amp::server_config c;
  auto set = amp::set_config_value(c, key, value);
  if (!set) {
    check_refusal(set.error(), input, secret);
    AMP_FUZZ_CHECK(c == amp::server_config{}, "changed on error: " + quoted(input));
  }
  return 0;
}
