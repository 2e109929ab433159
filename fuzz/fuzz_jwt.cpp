// fuzz_jwt: verification of `hello` tokens (amp/gateway/auth.hpp).
//
// The first byte chooses (its low three bits, so that '0'..'7' do it in a text seed):
// bits 0-1 the verifier (HS256, HS256 with audience "amp-fuzz", EdDSA, EdDSA with that
// audience; fixed keys), bit 2 the mode:
// - 0: the rest is a token, verified at 2026-01-01T00:00:00Z (the manual clock's start);
// - 1: the rest is "sub\nns\namp_json" (amp_json may be empty), minted with the verifier's
//   key (valid for one hour, with the audience when there is one) and then verified.
//
// Asserts: `verify` never throws; a refusal is `unauthenticated` with a message (that, for
// a token from the input, does not quote the token or the secret); an accepted token
// is at most `max_token_bytes`, not expired (`now` < exp + leeway), is refused at exp + leeway and
// with one more character, and carries grants that are "*" or valid names; a minted token that
// verifies speaks for the sub and ns it was minted with; one minted from the identity again (HS256)
// verifies.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "amp/clock.hpp"
#include "amp/gateway/auth.hpp"
#include "amp/names.hpp"
#include "check.hpp"

namespace {

using namespace std::chrono_literals;
using amp::quoted;

constexpr std::string_view k_secret = "amp-fuzz-hs256-secret-of-40-bytes-long!!";
constexpr std::string_view k_audience = "amp-fuzz";
// A throwaway Ed25519 key pair, for fuzzing only.
constexpr std::string_view k_private_pem =
    "-----BEGIN PRIVATE KEY-----\n"
    "MC4CAQAwBQYDK2VwBCIEIIfDTGzsOZ0mZo02CtN/SqXuplzZUBG10/wyW4gxPo01\n"
    "-----END PRIVATE KEY-----\n";
constexpr std::string_view k_public_pem =
    "-----BEGIN PUBLIC KEY-----\n"
    "MCowBQYDK2VwAyEAr50nnE9pEp4LmELUPQ0W8qqlfXrPV5YyKbvpTXHhvrA=\n"
    "-----END PUBLIC KEY-----\n";

struct verifier {
  amp::authenticator auth;
  amp::jwt_alg alg;
  std::string_view signing_key;
  std::string_view audience;
};

const std::vector<verifier>& verifiers() {
  static const auto all = [] {
    std::vector<verifier> v;
    for (auto alg : {amp::jwt_alg::hs256, amp::jwt_alg::eddsa}) {
      for (auto audience : {std::string_view{}, k_audience}) {
        auto made = amp::authenticator::make({.alg = alg,
                                              .secret = std::string(k_secret),
                                              .public_key_pem = std::string(k_public_pem),
                                              .audience = std::string(audience)});
        AMP_FUZZ_CHECK(made.has_value(), made.error().to_string());
        v.push_back({*made, alg, alg == amp::jwt_alg::hs256 ? k_secret : k_private_pem, audience});
      }
    }
    return v;
  }();
  return all;
}

// True when `text` holds `needle`. A loop of its own, not instrumented, rather than `find`:
// libFuzzer learns the strings given to the functions it intercepts (and the comparisons it
// instruments), and would copy the secret or the messages into its inputs.
__attribute__((no_sanitize("coverage"))) bool holds(std::string_view text,
                                                    std::string_view needle) {
  for (std::size_t i = 0; i + needle.size() <= text.size(); ++i) {
    std::size_t n = 0;
    while (n < needle.size() && text[i + n] == needle[n]) ++n;
    if (n == needle.size()) return true;
  }
  return false;
}

bool base64url_or_dot(std::string_view s) {
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

// A refusal says what is wrong without quoting the token or the secret. The token check
// is on the first 64 bytes (what `amp::quoted` keeps of a long value) of a token made of
// base64url and dots only: a message may quote a claim, but no claim can hold the start
// of the token that holds it. Neither check is made for a token minted from the input,
// whose claims may hold anything.
void check_refusal(const amp::error& e, std::string_view token, bool minted) {
  AMP_FUZZ_CHECK(e == amp::errc::unauthenticated, e.to_string());
  AMP_FUZZ_CHECK(!e.message().empty(), quoted(token));
  if (minted) return;
  AMP_FUZZ_CHECK(!holds(e.message(), k_secret), e.message());
  auto start = token.substr(0, 64);
  AMP_FUZZ_CHECK(start.size() < 24 || !base64url_or_dot(start) || !holds(e.message(), start),
                 e.message() + " quotes the token");
}

void check_grants(const amp::permissions& g) {
  for (const auto& s : g.send) {
    AMP_FUZZ_CHECK(s == "*" || amp::participant_name::make(s), quoted(s));
  }
  for (const auto* jobs : {&g.submit, &g.work}) {
    for (const auto& j : *jobs) AMP_FUZZ_CHECK(j == "*" || amp::job_name::make(j), quoted(j));
  }
}

void check_accepted(const verifier& v, std::string_view token, const amp::identity& id,
                    amp::time_point now) {
  AMP_FUZZ_CHECK(token.size() <= amp::max_token_bytes, quoted(token));
  const amp::duration leeway = 30s;  // auth_config's default
  AMP_FUZZ_CHECK(id.expires_at > now - leeway, quoted(token));
  if (id.expires_at < amp::time_point::max() - leeway) {
    auto late = v.auth.verify(token, id.expires_at + leeway);
    AMP_FUZZ_CHECK(!late.has_value(), "verified at exp + leeway: " + quoted(token));
    check_refusal(late.error(), token, true);
  }
  auto longer = v.auth.verify(std::string(token) + "A", now);
  AMP_FUZZ_CHECK(!longer.has_value(), "verified with one more character: " + quoted(token));
  check_grants(id.grants);

  // Minted again from what it says (no grants), it verifies as the same participant.
  if (v.alg != amp::jwt_alg::hs256 || id.expires_at - now < 2s) return;
  auto again = amp::mint_token({.sub = id.participant.str(),
                                .ns = id.ns.str(),
                                .exp = id.expires_at,
                                .aud = std::string(v.audience)},
                               v.alg, v.signing_key);
  AMP_FUZZ_CHECK(again.has_value(), again.error().to_string());
  auto back = v.auth.verify(*again, now);
  AMP_FUZZ_CHECK(back && back->participant == id.participant && back->ns == id.ns,
                 back ? quoted(*again) : back.error().to_string());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto& v = verifiers()[data[0] & 3];
  bool mint = (data[0] & 4) != 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto now = amp::manual_clock::default_start();

  if (!mint) {
    auto id = v.auth.verify(rest, now);
    if (id) {
      check_accepted(v, rest, *id, now);
    } else {
      check_refusal(id.error(), rest, false);
    }
    return 0;
  }

  auto sub = rest.substr(0, rest.find('\n'));
  rest.remove_prefix(sub.size() == rest.size() ? rest.size() : sub.size() + 1);
  auto ns = rest.substr(0, rest.find('\n'));
  rest.remove_prefix(ns.size() == rest.size() ? rest.size() : ns.size() + 1);
  auto token = amp::mint_token({.sub = std::string(sub),
                                .ns = std::string(ns),
                                .exp = now + 1h,
                                .aud = std::string(v.audience),
                                .amp_json = std::string(rest)},
                               v.alg, v.signing_key);
  if (!token) {
    AMP_FUZZ_CHECK(token.error() == amp::errc::bad_request && !rest.empty(),
                   token.error().to_string());
    return 0;
  }
  auto id = v.auth.verify(*token, now);
  if (!id) {
    check_refusal(id.error(), *token, true);
    return 0;
  }
  AMP_FUZZ_CHECK(id->participant.str() == sub && id->ns.str() == ns,
                 quoted(id->participant.str()) + " " + quoted(id->ns.str()));
  check_accepted(v, *token, *id, now);
  return 0;
}
