#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "amp/gateway/auth.hpp"

namespace {

using namespace std::chrono_literals;
using namespace std::string_literals;
using amp::auth_config;
using amp::authenticator;
using amp::errc;
using amp::jwt_alg;
using amp::time_point;

// 2026-01-01T00:00:00Z.
const time_point k_now{std::chrono::seconds(1767225600)};
const std::string k_secret = "a-test-secret-of-32-bytes-or-so!";

// ---- an independent JWS encoder, to build tokens mint_token would never write ----

std::string b64url(std::string_view in) {
  static constexpr char k_alphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const auto n = (static_cast<std::uint32_t>(static_cast<unsigned char>(in[i])) << 16) |
                   (static_cast<std::uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8) |
                   static_cast<unsigned char>(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += k_alphabet[(n >> s) & 0x3f];
  }
  if (const auto rest = in.size() - i; rest > 0) {
    std::uint32_t n = static_cast<std::uint32_t>(static_cast<unsigned char>(in[i])) << 16;
    if (rest == 2) n |= static_cast<std::uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8;
    out += k_alphabet[(n >> 18) & 0x3f];
    out += k_alphabet[(n >> 12) & 0x3f];
    if (rest == 2) out += k_alphabet[(n >> 6) & 0x3f];
  }
  return out;
}

std::string hs256(std::string_view key, std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned length = 0;
  REQUIRE(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
               reinterpret_cast<const unsigned char*>(data.data()), data.size(), md.data(),
               &length) != nullptr);
  return std::string(reinterpret_cast<const char*>(md.data()), length);
}

struct pkey_deleter {
  void operator()(EVP_PKEY* k) const noexcept { EVP_PKEY_free(k); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_deleter>;

std::string bio_text(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<std::size_t>(n));
}

// An Ed25519 (or other type's) key pair with both halves in PEM.
struct key_pair {
  pkey_ptr key;
  std::string private_pem;
  std::string public_pem;
};

key_pair generate(int type) {
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> ctx(
      EVP_PKEY_CTX_new_id(type, nullptr), &EVP_PKEY_CTX_free);
  REQUIRE(ctx);
  REQUIRE(EVP_PKEY_keygen_init(ctx.get()) == 1);
  EVP_PKEY* raw = nullptr;
  REQUIRE(EVP_PKEY_keygen(ctx.get(), &raw) == 1);
  key_pair kp{pkey_ptr(raw), {}, {}};
  std::unique_ptr<BIO, decltype(&BIO_free)> priv(BIO_new(BIO_s_mem()), &BIO_free);
  std::unique_ptr<BIO, decltype(&BIO_free)> pub(BIO_new(BIO_s_mem()), &BIO_free);
  REQUIRE(PEM_write_bio_PrivateKey(priv.get(), raw, nullptr, nullptr, 0, nullptr, nullptr) == 1);
  REQUIRE(PEM_write_bio_PUBKEY(pub.get(), raw) == 1);
  kp.private_pem = bio_text(priv.get());
  kp.public_pem = bio_text(pub.get());
  return kp;
}

const key_pair& ed25519_keys() {
  static const key_pair kp = generate(EVP_PKEY_ED25519);
  return kp;
}

const key_pair& other_ed25519_keys() {
  static const key_pair kp = generate(EVP_PKEY_ED25519);
  return kp;
}

std::string ed25519_sign(EVP_PKEY* key, std::string_view data) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  REQUIRE(EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key) == 1);
  std::string sig(64, '\0');
  std::size_t length = sig.size();
  REQUIRE(EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &length,
                         reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1);
  sig.resize(length);
  return sig;
}

// A compact JWS of exactly these header and claims texts, signed with the test secret.
std::string signed_hs256(std::string_view header, std::string_view claims,
                         std::string_view secret = k_secret) {
  std::string input = b64url(header) + "." + b64url(claims);
  return input + "." + b64url(hs256(secret, input));
}

std::string signed_ed25519(std::string_view header, std::string_view claims,
                           EVP_PKEY* key = ed25519_keys().key.get()) {
  std::string input = b64url(header) + "." + b64url(claims);
  return input + "." + b64url(ed25519_sign(key, input));
}

constexpr std::string_view k_hs_header = R"({"alg":"HS256","typ":"JWT"})";
constexpr std::string_view k_ed_header = R"({"alg":"EdDSA","typ":"JWT"})";

// Claims valid at k_now: alice in demo, expiring an hour later, plus `extra` members.
std::string claims_with(std::string_view extra = {}) {
  std::string c = R"({"sub":"alice","ns":"demo","exp":1767229200)";
  if (!extra.empty()) {
    c += ',';
    c += extra;
  }
  c += '}';
  return c;
}

authenticator hs_auth(auth_config config = {}) {
  config.alg = jwt_alg::hs256;
  config.secret = k_secret;
  return authenticator::make(std::move(config)).value();
}

authenticator ed_auth(auth_config config = {}) {
  config.alg = jwt_alg::eddsa;
  config.public_key_pem = ed25519_keys().public_pem;
  return authenticator::make(std::move(config)).value();
}

amp::token_claims alice_claims() {
  amp::token_claims c;
  c.sub = "alice";
  c.ns = "demo";
  c.exp = k_now + 1h;
  return c;
}

bool printable_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f;
  });
}

// The refusal of `token`: unauthenticated, with a printable message that never quotes
// the secret.
std::string refusal(const authenticator& a, std::string_view token, time_point now = k_now) {
  auto r = a.verify(token, now);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::unauthenticated);
  const auto& m = r.error().message();
  CHECK_FALSE(m.empty());
  CHECK(printable_ascii(m));
  CHECK(m.find(k_secret) == std::string::npos);
  return m;
}

amp::identity accepted(const authenticator& a, std::string_view token, time_point now = k_now) {
  auto r = a.verify(token, now);
  if (!r) FAIL_CHECK(r.error().to_string());
  REQUIRE(r.has_value());
  return *std::move(r);
}

amp::participant_name participant(std::string_view s) {
  return amp::participant_name::make(s).value();
}
amp::job_name job(std::string_view s) {
  return amp::job_name::make(s).value();
}
amp::topic topic(std::string_view s) {
  return amp::topic::make(s).value();
}
amp::topic_pattern pattern(std::string_view s) {
  return amp::topic_pattern::make(s).value();
}

}  // namespace

TEST_CASE("an HS256 token minted with the secret verifies to its identity", "[auth]") {
  auto claims = alice_claims();
  claims.iat = k_now - 1min;
  claims.nbf = k_now - 1min;
  claims.amp_json = R"({"send":["*"],"submit":["resize"],"work":["resize"],)"
                    R"("publish":["news.>"],"subscribe":["news.>"],"admin":true})";
  const auto token = amp::mint_token(claims, jwt_alg::hs256, k_secret).value();
  CHECK(std::count(token.begin(), token.end(), '.') == 2);
  CHECK(token.find('=') == std::string::npos);

  const auto id = accepted(hs_auth(), token);
  CHECK(id.participant.str() == "alice");
  CHECK(id.ns.str() == "demo");
  CHECK(id.expires_at == k_now + 1h);
  CHECK(id.grants.send == std::vector<std::string>{"*"});
  CHECK(id.grants.submit == std::vector<std::string>{"resize"});
  CHECK(id.grants.work == std::vector<std::string>{"resize"});
  CHECK(id.grants.publish == std::vector<amp::topic_pattern>{pattern("news.>")});
  CHECK(id.grants.subscribe == std::vector<amp::topic_pattern>{pattern("news.>")});
  CHECK(id.grants.admin);
  CHECK(hs_auth().alg() == jwt_alg::hs256);
}

TEST_CASE("an EdDSA token minted with the private key verifies with the public key", "[auth]") {
  auto claims = alice_claims();
  claims.amp_json = R"({"send":["bob"]})";
  const auto token = amp::mint_token(claims, jwt_alg::eddsa, ed25519_keys().private_pem).value();
  const auto auth = ed_auth();
  CHECK(auth.alg() == jwt_alg::eddsa);
  const auto id = accepted(auth, token);
  CHECK(id.participant.str() == "alice");
  CHECK(id.ns.str() == "demo");
  CHECK(id.grants.send == std::vector<std::string>{"bob"});

  SECTION("the RFC 9864 name Ed25519 is the same algorithm") {
    const auto other = signed_ed25519(R"({"alg":"Ed25519"})", claims_with());
    CHECK(accepted(auth, other).participant.str() == "alice");
  }
  SECTION("a token signed by another Ed25519 key does not verify") {
    const auto forged =
        amp::mint_token(claims, jwt_alg::eddsa, other_ed25519_keys().private_pem).value();
    CHECK(refusal(auth, forged) == "signature does not verify");
    // What OpenSSL queued on the way is not left for the next user of this thread.
    CHECK(ERR_peek_error() == 0);
  }
}

TEST_CASE("the RFC 7515 HS256 example passes the signature check", "[auth]") {
  // RFC 7515 appendix A.1: its key and token; its claims lack sub, ns and carry an exp of
  // 2011, so only the claims are refused.
  const std::string token =
      "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9."
      "eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0"
      "cnVlfQ."
      "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
  const std::string key_b64 =
      "AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow";
  // The key as raw bytes: decode it with OpenSSL's base64 after mapping to the standard
  // alphabet and padding.
  std::string std_b64 = key_b64;
  std::replace(std_b64.begin(), std_b64.end(), '-', '+');
  std::replace(std_b64.begin(), std_b64.end(), '_', '/');
  while (std_b64.size() % 4 != 0) std_b64 += '=';
  std::string key(std_b64.size(), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(key.data()),
                                reinterpret_cast<const unsigned char*>(std_b64.data()),
                                static_cast<int>(std_b64.size()));
  REQUIRE(n > 0);
  key.resize(static_cast<std::size_t>(n) - 2);  // two '=' of padding decode to zero bytes
  REQUIRE(key.size() == 64);

  auth_config config;
  config.secret = key;
  const auto auth = authenticator::make(config).value();
  CHECK(refusal(auth, token) == "claim sub: missing");
  config.secret[0] ^= 1;
  CHECK(refusal(authenticator::make(config).value(), token) == "signature does not verify");
}

TEST_CASE("the RFC 8037 Ed25519 example passes the signature check", "[auth]") {
  // RFC 8037 appendix A.4: its public key and JWS; the payload is not JSON claims.
  const std::array<unsigned char, 32> public_key = {0xd7, 0x5a, 0x98, 0x01, 0x82, 0xb1, 0x0a, 0xb7,
                                                    0xd5, 0x4b, 0xfe, 0xd3, 0xc9, 0x64, 0x07, 0x3a,
                                                    0x0e, 0xe1, 0x72, 0xf3, 0xda, 0xa6, 0x23, 0x25,
                                                    0xaf, 0x02, 0x1a, 0x68, 0xf7, 0x07, 0x51, 0x1a};
  pkey_ptr key(
      EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, public_key.data(), public_key.size()));
  REQUIRE(key);
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  REQUIRE(PEM_write_bio_PUBKEY(bio.get(), key.get()) == 1);
  auth_config config;
  config.alg = jwt_alg::eddsa;
  config.public_key_pem = bio_text(bio.get());
  const auto auth = authenticator::make(config).value();

  const std::string token =
      "eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc."
      "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg";
  CHECK(refusal(auth, token).starts_with("claims are not JSON"));
  auto tampered = token;
  tampered[tampered.size() - 5] = tampered[tampered.size() - 5] == 'A' ? 'B' : 'A';
  CHECK(refusal(auth, tampered) == "signature does not verify");
}

TEST_CASE("a token signed with another secret is refused", "[auth]") {
  const auto token = amp::mint_token(alice_claims(), jwt_alg::hs256, "another secret").value();
  CHECK(refusal(hs_auth(), token) == "signature does not verify");
}

TEST_CASE("changing any character of a token makes it fail", "[auth]") {
  auto claims = alice_claims();
  claims.amp_json = R"({"send":["*"]})";
  const auto hs_token = amp::mint_token(claims, jwt_alg::hs256, k_secret).value();
  const auto ed_token = amp::mint_token(claims, jwt_alg::eddsa, ed25519_keys().private_pem).value();
  const auto hs = hs_auth();
  const auto ed = ed_auth();
  // Header, payload and signature alike, the dots included; the last character of the
  // signature too, whose unused low bits would otherwise give a second spelling.
  for (const auto& [auth, token] : {std::pair{&hs, hs_token}, std::pair{&ed, ed_token}}) {
    for (std::size_t i = 0; i < token.size(); ++i) {
      for (char c : {'A', 'B', 'g', 'Q', '-', '_', '.', '='}) {
        if (token[i] == c) continue;
        auto tampered = token;
        tampered[i] = c;
        INFO("position " << i << " set to " << c);
        CHECK_FALSE(auth->verify(tampered, k_now).has_value());
      }
    }
    CHECK_FALSE(auth->verify(token.substr(0, token.size() - 1), k_now).has_value());
    CHECK_FALSE(auth->verify(token + "A", k_now).has_value());
  }
}

TEST_CASE("tampered payload, header or signature are refused with what failed", "[auth]") {
  const auto auth = hs_auth();
  const auto good = signed_hs256(k_hs_header, claims_with());
  const auto dot1 = good.find('.');
  const auto dot2 = good.rfind('.');

  // Another identity under the original signature.
  const auto payload = b64url(R"({"sub":"mallory","ns":"demo","exp":1767229200})");
  CHECK(refusal(auth, good.substr(0, dot1 + 1) + payload + good.substr(dot2)) ==
        "signature does not verify");
  // Another header under the original signature.
  CHECK(refusal(auth, b64url(R"({"alg":"HS256"})") + good.substr(dot1)) ==
        "signature does not verify");
  // A signature of the wrong length.
  CHECK(refusal(auth, good.substr(0, dot2 + 1) + b64url("short")) ==
        "signature does not verify (5 bytes; HS256 has 32)");
  // No signature at all.
  CHECK(refusal(auth, good.substr(0, dot2 + 1)) ==
        "signature does not verify (0 bytes; HS256 has 32)");
}

TEST_CASE("alg none, a missing alg and the other algorithm are refused", "[auth]") {
  const auto hs = hs_auth();
  const auto ed = ed_auth();
  const auto claims = b64url(claims_with());

  SECTION("unsigned tokens") {
    for (std::string_view alg : {"none", "None", "NONE"}) {
      const auto token =
          b64url(std::string(R"({"alg":")") + std::string(alg) + "\"}") + "." + claims + ".";
      CHECK(refusal(hs, token) ==
            "alg \"" + std::string(alg) + "\" is refused: unsigned tokens are never accepted");
      CHECK(refusal(ed, token).starts_with("alg \"" + std::string(alg) + "\" is refused"));
    }
    CHECK(refusal(hs, "x.y.").starts_with("header: invalid base64url"));
  }
  SECTION("a missing or mistyped alg") {
    CHECK(refusal(hs, signed_hs256(R"({"typ":"JWT"})", claims_with())) == "header has no alg");
    CHECK(refusal(hs, signed_hs256(R"({"alg":256})", claims_with())) ==
          "header alg must be a string, got a number");
    CHECK(refusal(hs, signed_hs256(R"({"alg":"hs256"})", claims_with())) ==
          "alg \"hs256\" is not the configured HS256");
  }
  SECTION("another algorithm") {
    CHECK(refusal(hs, signed_hs256(R"({"alg":"HS512"})", claims_with())) ==
          "alg \"HS512\" is not the configured HS256");
    const auto hs_token = amp::mint_token(alice_claims(), jwt_alg::hs256, k_secret).value();
    const auto ed_token =
        amp::mint_token(alice_claims(), jwt_alg::eddsa, ed25519_keys().private_pem).value();
    CHECK(refusal(ed, hs_token) == "alg \"HS256\" is not the configured EdDSA");
    CHECK(refusal(hs, ed_token) == "alg \"EdDSA\" is not the configured HS256");
    // The classic confusion: an HS256 token whose "secret" is the EdDSA public key.
    const auto confused =
        amp::mint_token(alice_claims(), jwt_alg::hs256, ed25519_keys().public_pem).value();
    CHECK(refusal(ed, confused) == "alg \"HS256\" is not the configured EdDSA");
  }
  SECTION("typ, crit and the header's shape") {
    CHECK(accepted(hs, signed_hs256(R"({"alg":"HS256","typ":"jwt"})", claims_with()))
              .participant.str() == "alice");
    CHECK(accepted(hs, signed_hs256(R"({"alg":"HS256","typ":"application/JWT"})", claims_with()))
              .participant.str() == "alice");
    CHECK(accepted(hs, signed_hs256(R"({"alg":"HS256","kid":"k1","x":[1]})", claims_with()))
              .participant.str() == "alice");
    CHECK(refusal(hs, signed_hs256(R"({"alg":"HS256","typ":"JWE"})", claims_with())) ==
          "header typ \"JWE\" is not JWT");
    CHECK(refusal(hs, signed_hs256(R"({"alg":"HS256","typ":1})", claims_with())) ==
          "header typ must be a string, got a number");
    CHECK(refusal(hs, signed_hs256(R"({"alg":"HS256","crit":["exp"],"exp":1})", claims_with())) ==
          "header crit: no JWS extension is supported");
    CHECK(refusal(hs, signed_hs256(R"(["HS256"])", claims_with())) ==
          "header parameters must be a JSON object, got an array");
    CHECK(refusal(hs, signed_hs256(R"({"alg":"HS256")", claims_with()))
              .starts_with("header parameters are not JSON"));
    CHECK(refusal(hs, signed_hs256(R"({"alg":"none","alg":"HS256"})", claims_with())) ==
          "header parameters name member \"alg\" twice");
  }
}

TEST_CASE("a token that is not three unpadded base64url parts is refused", "[auth]") {
  const auto auth = hs_auth();
  const auto good = amp::mint_token(alice_claims(), jwt_alg::hs256, k_secret).value();
  const auto dot1 = good.find('.');
  const auto dot2 = good.rfind('.');
  const auto header = good.substr(0, dot1);
  const auto payload = good.substr(dot1 + 1, dot2 - dot1 - 1);
  const auto signature = good.substr(dot2 + 1);
  REQUIRE(signature.size() == 43);  // 32 bytes: one padding character left off

  CHECK(refusal(auth, "") == "token is empty");
  CHECK(refusal(auth, "abc") ==
        "token is not a compact JWS: 1 part where header.payload.signature has 3");
  CHECK(refusal(auth, header + "." + payload) ==
        "token is not a compact JWS: 2 parts where header.payload.signature has 3");
  CHECK(refusal(auth, good + ".a.b").ends_with("(an encrypted JWE is not accepted)"));
  CHECK(refusal(auth, std::string(amp::max_token_bytes + 1, 'a')) ==
        "token is 8193 bytes (at most 8192)");

  CHECK(refusal(auth, good + "=") ==
        "signature: invalid base64url: padding '=' at position 43 is not allowed");
  CHECK(refusal(auth, header + "==." + payload + "." + signature)
            .starts_with("header: invalid base64url: padding '='"));
  auto with_plus = good;
  with_plus[dot1 + 3] = '+';
  CHECK(refusal(auth, with_plus) ==
        "payload: invalid base64url: '+' at position 2 (base64, not base64url: use '-' and '_')");
  auto with_slash = good;
  with_slash[1] = '/';
  CHECK(refusal(auth, with_slash).starts_with("header: invalid base64url: '/' at position 1"));
  CHECK(refusal(auth, " " + good) == "header: invalid base64url: whitespace ' ' at position 0");
  CHECK(refusal(auth, good + "\n") ==
        "signature: invalid base64url: whitespace '\\n' at position 43");
  CHECK(refusal(auth, header + "." + payload + "." + signature + "AAAAAA") ==
        "signature: invalid base64url: a length of 49 characters is impossible");
  // The signature's last character carries 4 data bits and 2 unused ones; setting one of
  // the unused bits spells the same bytes another way.
  auto alias = good;
  const auto last =
      std::string_view("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_");
  const auto v = last.find(alias.back());
  REQUIRE(v % 4 == 0);
  alias.back() = last[v + 1];
  CHECK(refusal(auth, alias) ==
        "signature: invalid base64url: the last character has unused bits set (not the "
        "canonical encoding)");
  CHECK(refusal(auth, signed_hs256(k_hs_header, "[]")) ==
        "claims must be a JSON object, got an array");
  CHECK(refusal(auth, signed_hs256(k_hs_header, "{\"sub\":\"\xff\"}"))
            .starts_with("claims are not JSON"));
}

TEST_CASE("exp and nbf are checked with the leeway", "[auth]") {
  const auto auth = hs_auth();  // 30 s leeway
  auto claims = alice_claims();

  SECTION("expired beyond the leeway") {
    claims.exp = k_now - 31s;
    const auto token = amp::mint_token(claims, jwt_alg::hs256, k_secret).value();
    CHECK(refusal(auth, token) ==
          "token expired at 2025-12-31T23:59:29.000Z (now 2026-01-01T00:00:00.000Z, leeway 30 s)");
  }
  SECTION("expired, but within the leeway") {
    claims.exp = k_now - 29s;
    const auto token = amp::mint_token(claims, jwt_alg::hs256, k_secret).value();
    CHECK(accepted(auth, token).expires_at == k_now - 29s);
    CHECK(refusal(auth, token, k_now + 1s).starts_with("token expired at"));
  }
  SECTION("exp + leeway is the first instant refused") {
    claims.exp = k_now - 30s;
    const auto token = amp::mint_token(claims, jwt_alg::hs256, k_secret).value();
    CHECK(refusal(auth, token).starts_with("token expired at"));
    CHECK(accepted(auth, token, k_now - 1ms).participant.str() == "alice");
  }
  SECTION("no leeway") {
    auth_config config;
    config.leeway = amp::duration::zero();
    const auto strict = hs_auth(config);
    claims.exp = k_now + 1s;
    const auto token = amp::mint_token(claims, jwt_alg::hs256, k_secret).value();
    CHECK(accepted(strict, token).participant.str() == "alice");
    CHECK(refusal(strict, token, k_now + 1s) ==
          "token expired at 2026-01-01T00:00:01.000Z (now 2026-01-01T00:00:01.000Z, leeway 0 s)");
  }
  SECTION("nbf in the future") {
    claims.nbf = k_now + 31s;
    const auto token = amp::mint_token(claims, jwt_alg::hs256, k_secret).value();
    CHECK(refusal(auth, token) ==
          "token not valid before 2026-01-01T00:00:31.000Z (now 2026-01-01T00:00:00.000Z, "
          "leeway 30 s)");
    CHECK(accepted(auth, token, k_now + 1s).participant.str() == "alice");
  }
  SECTION("nbf within the leeway, iat in the future") {
    claims.nbf = k_now + 30s;
    claims.iat = k_now + 1h;
    const auto token = amp::mint_token(claims, jwt_alg::hs256, k_secret).value();
    CHECK(accepted(auth, token).participant.str() == "alice");
  }
  SECTION("fractional and extreme NumericDates") {
    CHECK(accepted(auth,
                   signed_hs256(k_hs_header, R"({"sub":"alice","ns":"demo","exp":1767225600.5})"))
              .expires_at == k_now + 500ms);
    CHECK(accepted(auth, signed_hs256(k_hs_header, R"({"sub":"alice","ns":"demo","exp":1e300})"))
              .participant.str() == "alice");
    CHECK(accepted(auth, signed_hs256(k_hs_header,
                                      R"({"sub":"alice","ns":"demo","exp":18446744073709551615})"))
              .participant.str() == "alice");
    CHECK(refusal(auth, signed_hs256(k_hs_header, R"({"sub":"alice","ns":"demo","exp":-1e300})"))
              .starts_with("token expired at"));
    CHECK(refusal(auth, signed_hs256(k_hs_header, claims_with(R"("nbf":1e300)")))
              .starts_with("token not valid before"));
  }
  SECTION("dates that are not numbers") {
    CHECK(refusal(auth,
                  signed_hs256(k_hs_header, R"({"sub":"alice","ns":"demo","exp":"1767229200"})")) ==
          "claim exp: must be a number (seconds since the epoch), got a string");
    CHECK(refusal(auth, signed_hs256(k_hs_header, claims_with(R"("nbf":null)"))) ==
          "claim nbf: must be a number (seconds since the epoch), got null");
    CHECK(refusal(auth, signed_hs256(k_hs_header, claims_with(R"("iat":true)"))) ==
          "claim iat: must be a number (seconds since the epoch), got a boolean");
  }
}

TEST_CASE("sub, ns and exp are required and checked", "[auth]") {
  const auto auth = hs_auth();
  CHECK(refusal(auth, signed_hs256(k_hs_header, R"({"ns":"demo","exp":1767229200})")) ==
        "claim sub: missing");
  CHECK(refusal(auth, signed_hs256(k_hs_header, R"({"sub":"alice","exp":1767229200})")) ==
        "claim ns: missing");
  CHECK(refusal(auth, signed_hs256(k_hs_header, R"({"sub":"alice","ns":"demo"})")) ==
        "claim exp: missing");
  CHECK(refusal(auth, signed_hs256(k_hs_header, R"({"sub":7,"ns":"demo","exp":1767229200})")) ==
        "claim sub: must be a string, got a number");
  CHECK(refusal(auth,
                signed_hs256(k_hs_header, R"({"sub":"$broker","ns":"demo","exp":1767229200})")) ==
        "claim sub: participant name \"$broker\": reserved for system messages");
  CHECK(refusal(auth, signed_hs256(k_hs_header, R"({"sub":"Alice","ns":"demo","exp":1767229200})"))
            .starts_with("claim sub: participant name \"Alice\": upper case 'A'"));
  CHECK(refusal(auth, signed_hs256(k_hs_header, R"({"sub":"","ns":"demo","exp":1767229200})")) ==
        "claim sub: participant name is empty");
  CHECK(refusal(auth, signed_hs256(k_hs_header, R"({"sub":"alice","ns":"a.b","exp":1767229200})"))
            .starts_with("claim ns: namespace \"a.b\": '.' at position 1"));
  CHECK(refusal(auth, signed_hs256(k_hs_header, R"({"sub":"alice","ns":["demo"],"exp":1})")) ==
        "claim ns: must be a string, got an array");
  CHECK(refusal(auth, signed_hs256(k_hs_header, claims_with(R"("sub":"mallory")"))) ==
        "claims name member \"sub\" twice");
  // Unknown claims are ignored.
  CHECK(accepted(auth, signed_hs256(k_hs_header, claims_with(R"("iss":"me","jti":[1,{}])")))
            .participant.str() == "alice");
}

TEST_CASE("aud is checked only when an audience is configured", "[auth]") {
  auth_config config;
  config.audience = "amp-demo";
  const auto auth = hs_auth(config);
  const auto open = hs_auth();

  CHECK(accepted(auth, signed_hs256(k_hs_header, claims_with(R"("aud":"amp-demo")")))
            .participant.str() == "alice");
  CHECK(accepted(auth, signed_hs256(k_hs_header, claims_with(R"("aud":["x","amp-demo"])")))
            .participant.str() == "alice");
  CHECK(refusal(auth, signed_hs256(k_hs_header, claims_with(R"("aud":"other")"))) ==
        "claim aud: \"other\" is not the audience \"amp-demo\"");
  CHECK(refusal(auth, signed_hs256(k_hs_header, claims_with(R"("aud":["x","y"])"))) ==
        "claim aud: does not name the audience \"amp-demo\"");
  CHECK(refusal(auth, signed_hs256(k_hs_header, claims_with(R"("aud":[])"))) ==
        "claim aud: does not name the audience \"amp-demo\"");
  CHECK(refusal(auth, signed_hs256(k_hs_header, claims_with(R"("aud":["amp-demo",1])"))) ==
        "claim aud[1]: must be a string, got a number");
  CHECK(refusal(auth, signed_hs256(k_hs_header, claims_with(R"("aud":{"amp-demo":1})"))) ==
        "claim aud: must be a string or an array of strings, got an object");
  CHECK(refusal(auth, signed_hs256(k_hs_header, claims_with())) ==
        "claim aud: missing (the audience \"amp-demo\" is required)");

  auto claims = alice_claims();
  claims.aud = "amp-demo";
  CHECK(
      accepted(auth, amp::mint_token(claims, jwt_alg::hs256, k_secret).value()).participant.str() ==
      "alice");

  // Without a configured audience, aud is not looked at.
  CHECK(accepted(open, signed_hs256(k_hs_header, claims_with(R"("aud":"other")")))
            .participant.str() == "alice");
  CHECK(accepted(open, signed_hs256(k_hs_header, claims_with(R"("aud":42)"))).participant.str() ==
        "alice");
}

TEST_CASE("an amp claim with an invalid name, pattern or type makes the token invalid", "[auth]") {
  const auto auth = hs_auth();
  const auto with_amp = [&](std::string_view amp) {
    return signed_hs256(k_hs_header, claims_with(std::string(R"("amp":)") + std::string(amp)));
  };
  CHECK(refusal(auth, with_amp(R"({"send":["bob","Bob"]})"))
            .starts_with("claim amp.send[1]: participant name \"Bob\": upper case 'B'"));
  CHECK(refusal(auth, with_amp(R"({"send":["$broker"]})")) ==
        "claim amp.send[0]: participant name \"$broker\": reserved for system messages");
  CHECK(refusal(auth, with_amp(R"({"submit":["re.size"]})"))
            .starts_with("claim amp.submit[0]: job name \"re.size\""));
  CHECK(refusal(auth, with_amp(R"({"work":["*x"]})")).starts_with("claim amp.work[0]: job name"));
  CHECK(refusal(auth, with_amp(R"({"publish":["news*"]})"))
            .starts_with("claim amp.publish[0]: topic pattern \"news*\""));
  CHECK(refusal(auth, with_amp(R"({"subscribe":["news.>.eu"]})")) ==
        "claim amp.subscribe[0]: topic pattern \"news.>.eu\": '>' at position 5 must be the last "
        "token");
  CHECK(refusal(auth, with_amp(R"({"subscribe":[""]})")) ==
        "claim amp.subscribe[0]: topic pattern is empty");
  CHECK(refusal(auth, with_amp(R"({"send":"*"})")) ==
        "claim amp.send: must be an array, got a string");
  CHECK(refusal(auth, with_amp(R"({"send":null})")) ==
        "claim amp.send: must be an array, got null");
  CHECK(refusal(auth, with_amp(R"({"work":[["resize"]]})")) ==
        "claim amp.work[0]: must be a string, got an array");
  CHECK(refusal(auth, with_amp(R"({"admin":"true"})")) ==
        "claim amp.admin: must be a boolean, got a string");
  CHECK(refusal(auth, with_amp(R"(["send"])")) == "claim amp: must be an object, got an array");
  CHECK(refusal(auth, with_amp("null")) == "claim amp: must be an object, got null");
  CHECK(refusal(auth, with_amp(R"({"send":[],"send":["*"]})")) ==
        "claim amp: names member \"send\" twice");

  // Unknown members of amp are ignored; every list may be empty.
  const auto id = accepted(auth, with_amp(R"({"future":1,"send":[],"work":["*"],"admin":false})"));
  CHECK(id.grants.send.empty());
  CHECK(id.grants.work == std::vector<std::string>{"*"});
  CHECK_FALSE(id.grants.admin);
}

TEST_CASE("a token without amp grants nothing", "[auth]") {
  const auto id =
      accepted(hs_auth(), amp::mint_token(alice_claims(), jwt_alg::hs256, k_secret).value());
  const auto& g = id.grants;
  CHECK(g.send.empty());
  CHECK(g.submit.empty());
  CHECK(g.work.empty());
  CHECK(g.publish.empty());
  CHECK(g.subscribe.empty());
  CHECK_FALSE(g.admin);
  CHECK_FALSE(g.may_send(participant("alice")));
  CHECK_FALSE(g.may_send(participant("bob")));
  CHECK_FALSE(g.may_submit(job("resize")));
  CHECK_FALSE(g.may_work(job("resize")));
  CHECK_FALSE(g.may_publish(topic("news")));
  CHECK_FALSE(g.may_subscribe(pattern("news")));
}

TEST_CASE("permissions grant what they list and nothing else", "[auth]") {
  amp::permissions p;
  p.send = {"bob", "carol"};
  p.submit = {"*"};
  p.work = {"resize"};
  p.publish = {pattern("news.>"), pattern("alerts.*.high")};
  p.subscribe = {pattern("news.>"), pattern("status")};

  CHECK(p.may_send(participant("bob")));
  CHECK(p.may_send(participant("carol")));
  CHECK_FALSE(p.may_send(participant("dave")));
  p.send = {"*"};
  CHECK(p.may_send(participant("dave")));

  CHECK(p.may_submit(job("resize")));
  CHECK(p.may_submit(job("anything")));
  CHECK(p.may_work(job("resize")));
  CHECK_FALSE(p.may_work(job("thumbnail")));

  CHECK(p.may_publish(topic("news.eu")));
  CHECK(p.may_publish(topic("news.eu.de")));
  CHECK_FALSE(p.may_publish(topic("news")));
  CHECK(p.may_publish(topic("alerts.db.high")));
  CHECK_FALSE(p.may_publish(topic("alerts.db.low")));
  CHECK_FALSE(p.may_publish(topic("sports.eu")));

  CHECK(p.may_subscribe(pattern("news.*")));
  CHECK(p.may_subscribe(pattern("news.>")));
  CHECK(p.may_subscribe(pattern("news.eu")));
  CHECK(p.may_subscribe(pattern("news.*.x")));
  CHECK(p.may_subscribe(pattern("status")));
  CHECK_FALSE(p.may_subscribe(pattern(">")));
  CHECK_FALSE(p.may_subscribe(pattern("*")));
  CHECK_FALSE(p.may_subscribe(pattern("news")));
  CHECK_FALSE(p.may_subscribe(pattern("status.>")));

  p.subscribe = {pattern(">")};
  CHECK(p.may_subscribe(pattern(">")));
  CHECK(p.may_subscribe(pattern("*.x")));

  // Entries that are no valid name (only possible by hand) never match.
  p.send = {"Bob", ""};
  CHECK_FALSE(p.may_send(participant("bob")));
}

TEST_CASE("make refuses a configuration it cannot verify with", "[auth]") {
  const auto failure = [](auth_config config) {
    auto r = authenticator::make(std::move(config));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == errc::bad_request);
    return r.error().message();
  };
  auth_config hs;
  CHECK(failure(hs) == "auth: HS256 needs a secret");
  hs.secret = "s";
  hs.leeway = -1s;
  CHECK(failure(hs) == "auth: leeway must not be negative");

  auth_config ed;
  ed.alg = jwt_alg::eddsa;
  ed.secret = k_secret;  // ignored for EdDSA
  CHECK(failure(ed) == "auth: EdDSA needs a public key (Ed25519, PEM)");
  ed.public_key_pem = "-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n";
  CHECK(failure(ed).starts_with("auth: public key holds no readable public key"));
  ed.public_key_pem = ed25519_keys().private_pem;
  const auto private_message = failure(ed);
  CHECK(private_message.starts_with("auth: public key holds no readable public key"));
  CHECK(private_message.find("PRIVATE KEY-----\n") == std::string::npos);
  ed.public_key_pem = generate(EVP_PKEY_X25519).public_pem;
  CHECK(failure(ed) == "auth: public key is an X25519 key, not Ed25519");
  CHECK(ERR_peek_error() == 0);

  // RFC 7518 §3.2: at least as many bytes as the hash output.
  hs.leeway = 0s;
  hs.secret = std::string(amp::min_secret_bytes - 1, 's');
  CHECK(failure(hs) ==
        "auth: the HS256 secret has 31 bytes; at least 32 are needed (RFC 7518 §3.2)");
  hs.secret = "x";
  CHECK(failure(hs) == "auth: the HS256 secret has 1 byte; at least 32 are needed (RFC 7518 §3.2)");
  hs.secret = std::string(amp::min_secret_bytes, 's');
  CHECK(authenticator::make(hs).has_value());
}

TEST_CASE("mint_token refuses keys and claims it cannot sign", "[auth]") {
  const auto failure = [](const amp::token_claims& c, jwt_alg alg, std::string_view key) {
    auto r = amp::mint_token(c, alg, key);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == errc::bad_request);
    return r.error().message();
  };
  auto claims = alice_claims();
  CHECK(failure(claims, jwt_alg::hs256, "") == "HS256 needs a secret");
  CHECK(failure(claims, jwt_alg::eddsa, "").starts_with("private key is empty"));
  CHECK(failure(claims, jwt_alg::eddsa, ed25519_keys().public_pem)
            .starts_with("private key holds no readable private key"));
  CHECK(failure(claims, jwt_alg::eddsa, generate(EVP_PKEY_X25519).private_pem) ==
        "private key is an X25519 key, not Ed25519");
  claims.amp_json = R"({"send":)";
  CHECK(failure(claims, jwt_alg::hs256, k_secret).starts_with("amp_json: not valid JSON"));
  // Values are not checked: a token verify refuses can be minted on purpose.
  claims.sub = "$broker";
  claims.amp_json = "42";
  const auto token = amp::mint_token(claims, jwt_alg::hs256, k_secret).value();
  CHECK(refusal(hs_auth(), token) ==
        "claim sub: participant name \"$broker\": reserved for system messages");
  CHECK(amp::to_string(jwt_alg::hs256) == "HS256");
  CHECK(amp::to_string(jwt_alg::eddsa) == "EdDSA");
  CHECK(amp::jwt_alg_from_string("EdDSA") == jwt_alg::eddsa);
  CHECK(amp::jwt_alg_from_string("HS256") == jwt_alg::hs256);
  CHECK_FALSE(amp::jwt_alg_from_string("none").has_value());
  CHECK_FALSE(amp::jwt_alg_from_string("hs256").has_value());
}

TEST_CASE("verify may be called from many threads at once", "[auth]") {
  const auto hs = hs_auth();
  const auto ed = ed_auth();
  const auto hs_token = amp::mint_token(alice_claims(), jwt_alg::hs256, k_secret).value();
  const auto ed_token =
      amp::mint_token(alice_claims(), jwt_alg::eddsa, ed25519_keys().private_pem).value();
  const auto forged =
      amp::mint_token(alice_claims(), jwt_alg::eddsa, other_ed25519_keys().private_pem).value();
  std::vector<int> wrong(4, 0);
  {
    std::vector<std::jthread> threads;
    for (std::size_t t = 0; t < wrong.size(); ++t) {
      threads.emplace_back([&, t] {
        const auto copy = ed;  // copies share the key
        for (int i = 0; i < 200; ++i) {
          if (!hs.verify(hs_token, k_now)) ++wrong[t];
          if (!copy.verify(ed_token, k_now)) ++wrong[t];
          if (copy.verify(forged, k_now)) ++wrong[t];
        }
      });
    }
  }
  CHECK(wrong == std::vector<int>(4, 0));
}

TEST_CASE("random and mutated tokens are refused without a crash", "[auth]") {
  std::mt19937 rng(20260101);
  const auto hs = hs_auth();
  const auto ed = ed_auth();
  auto claims = alice_claims();
  claims.amp_json = R"({"send":["*"],"publish":["news.>"],"subscribe":["a.*"],"admin":false})";
  const auto hs_token = amp::mint_token(claims, jwt_alg::hs256, k_secret).value();
  const auto ed_token = amp::mint_token(claims, jwt_alg::eddsa, ed25519_keys().private_pem).value();
  const std::string alphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ \n\0\xff"s;
  const auto pick = [&](std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };

  const auto check_refused = [&](const std::string& token) {
    for (const auto* auth : {&hs, &ed}) {
      auto r = auth->verify(token, k_now);
      if (r) {
        FAIL_CHECK("accepted: " << token);
        continue;
      }
      CHECK(r.error().code() == errc::unauthenticated);
      CHECK(printable_ascii(r.error().message()));
    }
  };

  SECTION("random strings") {
    for (int i = 0; i < 3000; ++i) {
      std::string token(pick(300), '\0');
      for (auto& c : token) c = alphabet[pick(alphabet.size())];
      check_refused(token);
    }
  }
  SECTION("mutations of valid tokens") {
    for (int i = 0; i < 4000; ++i) {
      std::string token = (i % 2 == 0) ? hs_token : ed_token;
      const auto edits = 1 + pick(4);
      for (std::size_t e = 0; e < edits && !token.empty(); ++e) {
        const auto at = pick(token.size());
        switch (pick(5)) {
          case 0: token[at] = alphabet[pick(alphabet.size())]; break;
          case 1: token.erase(at, 1 + pick(8)); break;
          case 2: token.insert(at, 1, alphabet[pick(alphabet.size())]); break;
          case 3: token.resize(at); break;
          default: token[at] = static_cast<char>(token[at] ^ (1 << pick(8))); break;
        }
      }
      if (token == hs_token || token == ed_token) continue;
      check_refused(token);
    }
  }
  SECTION("validly signed claims with mutated JSON") {
    // Past the signature, the claims parser sees arbitrary text: it must answer, never
    // crash, and accept only what is a well-formed identity.
    const std::string base =
        claims_with(R"("aud":["x"],"nbf":1767225000,"amp":{"send":["bob","*"],"submit":["resize"],)"
                    R"("work":[],"publish":["news.>"],"subscribe":["news.*","a.>"],"admin":true})");
    const std::string json_bytes = "{}[]\",:0123456789.eE+-truefalsnl\\u \xc3\xa9$>*ABz";
    int accepted_count = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string text = base;
      const auto edits = 1 + pick(3);
      for (std::size_t e = 0; e < edits && !text.empty(); ++e) {
        const auto at = pick(text.size());
        switch (pick(3)) {
          case 0: text[at] = json_bytes[pick(json_bytes.size())]; break;
          case 1: text.erase(at, 1 + pick(4)); break;
          default: text.insert(at, 1, json_bytes[pick(json_bytes.size())]); break;
        }
      }
      const auto token =
          i % 2 == 0 ? signed_hs256(k_hs_header, text) : signed_ed25519(k_ed_header, text);
      const auto& auth = i % 2 == 0 ? hs : ed;
      auto r = auth.verify(token, k_now);
      if (r) {
        ++accepted_count;
        CHECK(amp::participant_name::make(r->participant.str()).has_value());
        CHECK(amp::namespace_name::make(r->ns.str()).has_value());
      } else {
        CHECK(r.error().code() == errc::unauthenticated);
        CHECK(printable_ascii(r.error().message()));
      }
    }
    CHECK(accepted_count > 0);  // some mutations leave a valid token (a digit of nbf …)
    CHECK(accepted_count < 3000);
  }
}
