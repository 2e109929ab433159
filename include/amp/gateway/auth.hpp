#pragma once

/// \file
/// The gateway's authenticator (spec §3): verifies the JWT a participant presents in
/// `hello` and turns it into an `identity` (who, which namespace, which grants, until
/// when). Also mints development tokens for the `amp token` command and for tests.
///
/// A token is a compact JWS (`header.payload.signature`, each part base64url without
/// padding) signed with the one algorithm the server is configured with: HS256 (a shared
/// secret) or EdDSA (an Ed25519 key pair). The cryptography is OpenSSL's, kept inside the
/// library: no OpenSSL type appears here.

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "amp/clock.hpp"
#include "amp/names.hpp"
#include "amp/result.hpp"

namespace amp {

/// The signature algorithm of the tokens a server accepts.
enum class jwt_alg {
  hs256,  ///< HMAC-SHA256 with a shared secret (JOSE `alg` "HS256")
  eddsa,  ///< Ed25519 (JOSE `alg` "EdDSA", or "Ed25519" as RFC 9864 names it)
};

/// The JOSE spelling of `alg`: "HS256" or "EdDSA".
std::string_view to_string(jwt_alg alg) noexcept;

/// Parses the configuration spelling of an algorithm: "HS256" or "EdDSA" (exactly, as in
/// the `auth.alg` key of spec §11); `std::nullopt` for anything else.
std::optional<jwt_alg> jwt_alg_from_string(std::string_view name) noexcept;

/// The longest token `authenticator::verify` looks at; a longer one is refused unread.
inline constexpr std::size_t max_token_bytes = 8192;

/// The shortest HS256 secret RFC 7518 §3.2 allows (the size of the hash output):
/// `authenticator::make` refuses a shorter one. (`mint_token` does not: a client may have
/// to sign for another verifier.)
inline constexpr std::size_t min_secret_bytes = 32;

/// How tokens are checked (the `auth` section of spec §11, with keys already read from
/// their files).
struct auth_config {
  jwt_alg alg = jwt_alg::hs256;
  /// HS256: the shared secret, as raw bytes. Ignored for EdDSA.
  std::string secret;
  /// EdDSA: the Ed25519 public key in PEM (`-----BEGIN PUBLIC KEY-----`). Ignored for
  /// HS256.
  std::string public_key_pem;
  /// When not empty, a token's `aud` (a string, or an array of strings) must contain it.
  /// When empty, `aud` is not looked at.
  std::string audience;
  /// Clock skew allowed on `exp` and `nbf` (spec: `auth.leeway_s`, default 30).
  duration leeway = std::chrono::seconds(30);
};

/// What a token grants (its `amp` claim, spec §3). What is not granted is denied; a
/// token without `amp` has empty lists and `admin` false, which leaves only its own
/// inbox. From `authenticator::verify`, every entry is valid: `send` holds participant
/// names or "*", `submit` and `work` hold job names or "*". A `permissions` built by
/// hand with other strings is harmless: such an entry never matches a valid name.
struct permissions {
  std::vector<std::string> send;         ///< participants it may `send` to, or "*"
  std::vector<std::string> submit;       ///< jobs it may `submit` to, or "*"
  std::vector<std::string> work;         ///< jobs it may `register` for, or "*"
  std::vector<topic_pattern> publish;    ///< topics it may `publish` to
  std::vector<topic_pattern> subscribe;  ///< topics it may `subscribe` to
  bool admin = false;                    ///< may read and cancel any task of its ns

  /// True when `send` holds "*" or `to`.
  bool may_send(const participant_name& to) const noexcept;
  /// True when `send` holds "*" (an operation's audience needs it, spec §12).
  bool may_send_anyone() const noexcept;
  /// True when `submit` holds "*" or `job`.
  bool may_submit(const job_name& job) const noexcept;
  /// True when `work` holds "*" or `job`.
  bool may_work(const job_name& job) const noexcept;
  /// True when one of the `publish` patterns matches `t`.
  bool may_publish(const topic& t) const noexcept;
  /// True when every topic `pattern` could match is matched by one of the `subscribe`
  /// patterns (`covered_by_any`): `news.*` is allowed by `news.>`, `>` is not.
  bool may_subscribe(const topic_pattern& pattern) const;
};

/// Who a verified token speaks for.
struct identity {
  participant_name participant;  ///< the `sub` claim
  namespace_name ns;             ///< the `ns` claim
  permissions grants;            ///< the `amp` claim
  time_point expires_at;         ///< the `exp` claim, without the leeway
};

/// Verifies tokens against one configuration.
///
/// Threads: an authenticator is immutable after `make`; `verify` is const and
/// reentrant, and may be called from any number of threads at once. Copies share the
/// key and are cheap.
class authenticator {
 public:
  /// Checks the configuration and loads the key.
  /// Errors: `bad_request` for HS256 without a secret or with one shorter than
  /// `min_secret_bytes` ("auth: the HS256 secret has N bytes; at least 32 are needed
  /// (RFC 7518 §3.2)"), for EdDSA without a public key,
  /// with a PEM that holds no public key, or with a key that is not Ed25519, and for a
  /// negative leeway. The message never quotes the secret or the key.
  static result<authenticator> make(auth_config config);

  /// Verifies `token` at time `now` and returns the identity it carries.
  ///
  /// Refused (all `unauthenticated`, with a message that says what is wrong and never
  /// quotes the token or the key): a token over `max_token_bytes`; anything but three
  /// base64url parts (padding `=`, `+`, `/`, whitespace or non-canonical trailing bits
  /// are not base64url); a header that is not a JSON object, has no `alg`, an `alg` of
  /// `none` or other than the configured one, a `typ` other than "JWT", or a `crit`; a
  /// signature that does not verify; claims that are not a JSON object; a missing or
  /// invalid `sub` (participant name, never `$broker`) or `ns`; a missing `exp`, or
  /// `now` at or after `exp` + leeway; `now` before `nbf` - leeway; an `exp`, `nbf` or
  /// `iat` that is not a number; when an audience is configured, an `aud` that does not
  /// contain it; an `amp` claim that is not an object, has a member of the wrong type,
  /// or holds an invalid name or pattern; a member name that appears twice in the
  /// header, the claims or `amp`. Unknown header parameters and claims are ignored.
  /// Never throws on any input (but may throw `std::bad_alloc`).
  result<identity> verify(std::string_view token, time_point now) const;

  /// The algorithm this authenticator accepts.
  jwt_alg alg() const noexcept;

 private:
  struct impl;
  explicit authenticator(std::shared_ptr<const impl> p) noexcept : impl_(std::move(p)) {}
  std::shared_ptr<const impl> impl_;
};

/// The claims of a development token.
struct token_claims {
  std::string sub;  ///< the participant
  std::string ns;   ///< the namespace
  time_point exp;   ///< expiry, written as whole seconds since the epoch (rounded down)
  std::optional<time_point> nbf{};  ///< not before, when set
  std::optional<time_point> iat{};  ///< issued at, when set
  std::string aud{};                ///< the audience, when not empty (a string)
  /// The `amp` claim as JSON text, spliced as it is (e.g.
  /// `{"send":["*"],"subscribe":["news.>"]}`); empty: no `amp` claim.
  std::string amp_json{};
};

/// Signs `claims` as a compact JWS with header `{"alg":…,"typ":"JWT"}`: with HS256,
/// `key` is the shared secret; with EdDSA, `key` is an Ed25519 private key in PEM
/// (`-----BEGIN PRIVATE KEY-----`). For the `amp token` command and tests: the values
/// of `sub`, `ns` and `amp_json` are not checked against the grammar, so a token that
/// `verify` refuses can be minted on purpose.
/// Errors: `bad_request` for an empty secret, a PEM that holds no private key or a key
/// that is not Ed25519, or an `amp_json` that is not one JSON value. Thread-safe.
result<std::string> mint_token(const token_claims& claims, jwt_alg alg, std::string_view key);

}  // namespace amp
