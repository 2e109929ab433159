#include "amp/gateway/auth.hpp"

#include <fmt/format.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>

#include "amp/json.hpp"
#include "amp/timestamp.hpp"
#include "detail/simdjson_adapter.hpp"

namespace amp {
namespace {

namespace dom = simdjson::dom;

constexpr std::size_t k_hs256_bytes = 32;
constexpr std::size_t k_ed25519_signature_bytes = 64;
// NumericDates are clamped to +-9e9 s (the years 1684 to 2255), well inside time_point.
constexpr double k_numeric_date_limit = 9e9;

unexpected refused(std::string message) {
  return unexpected(errc::unauthenticated, std::move(message));
}

unexpected bad_config(std::string message) {
  return unexpected(errc::bad_request, std::move(message));
}

struct bio_deleter {
  void operator()(BIO* b) const noexcept { BIO_free(b); }
};
struct pkey_deleter {
  void operator()(EVP_PKEY* k) const noexcept { EVP_PKEY_free(k); }
};
struct md_ctx_deleter {
  void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
};
using bio_ptr = std::unique_ptr<BIO, bio_deleter>;
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_deleter>;
using md_ctx_ptr = std::unique_ptr<EVP_MD_CTX, md_ctx_deleter>;

// OpenSSL queues the reasons for a failure per thread; what our calls leave there must
// not surface later in an unrelated user of OpenSSL on the same thread (TLS). Errors
// queued before the scope are kept.
class openssl_error_scope {
 public:
  openssl_error_scope() noexcept { ERR_set_mark(); }
  ~openssl_error_scope() { ERR_pop_to_mark(); }
  openssl_error_scope(const openssl_error_scope&) = delete;
  openssl_error_scope& operator=(const openssl_error_scope&) = delete;
};

// Never prompts for a passphrase on the terminal: an encrypted PEM fails to load.
int no_passphrase(char*, int, int, void*) {
  return 0;
}

enum class pem_kind { public_key, private_key };

// Loads an Ed25519 key from PEM; `what` names the key in messages, which never quote it.
result<pkey_ptr> load_ed25519(std::string_view pem, pem_kind kind, std::string_view what) {
  const char* expected =
      kind == pem_kind::public_key ? "-----BEGIN PUBLIC KEY-----" : "-----BEGIN PRIVATE KEY-----";
  if (pem.empty()) return bad_config(fmt::format("{} is empty (expected {} ...)", what, expected));
  if (pem.size() > static_cast<std::size_t>(INT_MAX)) {
    return bad_config(fmt::format("{} is too large", what));
  }
  openssl_error_scope errors;
  bio_ptr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return bad_config(fmt::format("{}: out of memory", what));
  pkey_ptr key(kind == pem_kind::public_key
                   ? PEM_read_bio_PUBKEY(bio.get(), nullptr, no_passphrase, nullptr)
                   : PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
  if (!key) {
    return bad_config(fmt::format("{} holds no readable {} (expected PEM starting with {})", what,
                                  kind == pem_kind::public_key ? "public key" : "private key",
                                  expected));
  }
  if (EVP_PKEY_get_id(key.get()) != EVP_PKEY_ED25519) {
    const char* type = EVP_PKEY_get0_type_name(key.get());
    return bad_config(fmt::format("{} is {} key, not Ed25519", what,
                                  type != nullptr ? fmt::format("an {}", type) : "another"));
  }
  return key;
}

// base64url (RFC 4648 §5) without padding, as JWS requires.
constexpr std::string_view k_b64url_alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

int b64url_value(char c) noexcept {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-') return 62;
  if (c == '_') return 63;
  return -1;
}

std::string b64url_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() * 4 + 2) / 3);
  std::uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    acc = (acc << 8) | static_cast<unsigned char>(c);
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(k_b64url_alphabet[(acc >> bits) & 0x3f]);
    }
    acc &= (1u << bits) - 1;
  }
  if (bits > 0) out.push_back(k_b64url_alphabet[(acc << (6 - bits)) & 0x3f]);
  return out;
}

// Decodes strict base64url: no padding, no other characters, and unused bits of the last
// character zero, so that each byte string has exactly one encoding. On failure,
// `problem` says why.
std::optional<std::string> b64url_decode(std::string_view in, std::string& problem) {
  std::string out;
  out.reserve(in.size() * 3 / 4);
  std::uint32_t acc = 0;
  int bits = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    const int v = b64url_value(c);
    if (v < 0) {
      if (c == '=') {
        problem = fmt::format("invalid base64url: padding '=' at position {} is not allowed", i);
      } else if (c == '+' || c == '/') {
        problem = fmt::format(
            "invalid base64url: '{}' at position {} (base64, not base64url: use '-' and '_')", c,
            i);
      } else {
        problem = fmt::format("invalid base64url: {} at position {}", describe_byte(c), i);
      }
      return std::nullopt;
    }
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
    acc &= (1u << bits) - 1;
  }
  if (in.size() % 4 == 1) {
    problem = fmt::format("invalid base64url: a length of {} characters is impossible", in.size());
    return std::nullopt;
  }
  if (acc != 0) {
    problem =
        "invalid base64url: the last character has unused bits set (not the canonical "
        "encoding)";
    return std::nullopt;
  }
  return out;
}

const unsigned char* bytes(std::string_view s) noexcept {
  return reinterpret_cast<const unsigned char*>(s.data());
}

std::array<unsigned char, EVP_MAX_MD_SIZE> hmac_sha256(std::string_view key, std::string_view data,
                                                       unsigned& length) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), bytes(data), data.size(),
           md.data(), &length) == nullptr) {
    length = 0;
  }
  return md;
}

bool hs256_verifies(std::string_view secret, std::string_view input, std::string_view signature) {
  unsigned length = 0;
  const auto md = hmac_sha256(secret, input, length);
  return length == k_hs256_bytes && signature.size() == k_hs256_bytes &&
         CRYPTO_memcmp(md.data(), signature.data(), k_hs256_bytes) == 0;
}

bool ed25519_verifies(EVP_PKEY* key, std::string_view input, std::string_view signature) {
  if (signature.size() != k_ed25519_signature_bytes) return false;
  md_ctx_ptr ctx(EVP_MD_CTX_new());
  if (!ctx) return false;
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key) != 1) return false;
  return EVP_DigestVerify(ctx.get(), bytes(signature), signature.size(), bytes(input),
                          input.size()) == 1;
}

bool same_ignoring_case(std::string_view a, std::string_view b) noexcept {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    return lower(x) == lower(y);
  });
}

std::string describe(duration d) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d);
  if (ms.count() % 1000 == 0) return fmt::format("{} s", ms.count() / 1000);
  return fmt::format("{} ms", ms.count());
}

time_point saturating_add(time_point t, duration d) noexcept {
  if (d > duration::zero() && t > time_point::max() - d) return time_point::max();
  if (d < duration::zero() && t < time_point::min() - d) return time_point::min();
  return t + d;
}

// The first member name that appears twice in `object`, if any. Claims and header
// parameters must be unique (RFC 7515 §4, RFC 7519 §4): a parser that took the first of
// two `sub`s and another that took the last would disagree about who this is.
std::optional<std::string_view> duplicate_member(dom::object object) {
  std::vector<std::string_view> keys;
  for (dom::key_value_pair member : object) keys.push_back(member.key);
  std::sort(keys.begin(), keys.end());
  const auto it = std::adjacent_find(keys.begin(), keys.end());
  if (it == keys.end()) return std::nullopt;
  return *it;
}

// Parses `text` as one JSON object with unique member names. The object lives in
// `parser` until its next parse.
result<dom::object> parse_object(dom::parser& parser, const std::string& text,
                                 std::string_view what) {
  dom::element root;
  if (auto code = parser.parse(text.data(), text.size()).get(root)) {
    return refused(fmt::format("{} are not JSON: {}", what, simdjson::error_message(code)));
  }
  dom::object object;
  if (root.get_object().get(object)) {
    return refused(
        fmt::format("{} must be a JSON object, got {}", what, detail::type_name(root.type())));
  }
  if (auto dup = duplicate_member(object)) {
    return refused(fmt::format("{} name member {} twice", what, quoted(*dup)));
  }
  return object;
}

bool alg_accepted(std::string_view alg, jwt_alg configured) noexcept {
  switch (configured) {
    case jwt_alg::hs256: return alg == "HS256";
    case jwt_alg::eddsa: return alg == "EdDSA" || alg == "Ed25519";
  }
  return false;
}

result<void> check_header(dom::object header, jwt_alg configured) {
  dom::element alg_value;
  if (header.at_key("alg").get(alg_value)) return refused("header has no alg");
  std::string_view alg;
  if (alg_value.get_string().get(alg)) {
    return refused(
        fmt::format("header alg must be a string, got {}", detail::type_name(alg_value.type())));
  }
  if (same_ignoring_case(alg, "none")) {
    return refused(
        fmt::format("alg {} is refused: unsigned tokens are never accepted", quoted(alg)));
  }
  if (!alg_accepted(alg, configured)) {
    return refused(
        fmt::format("alg {} is not the configured {}", quoted(alg), to_string(configured)));
  }
  dom::element typ_value;
  if (!header.at_key("typ").get(typ_value)) {
    std::string_view typ;
    if (typ_value.get_string().get(typ)) {
      return refused(
          fmt::format("header typ must be a string, got {}", detail::type_name(typ_value.type())));
    }
    // Media types compare without regard to case (RFC 7515 §4.1.9).
    if (!same_ignoring_case(typ, "JWT") && !same_ignoring_case(typ, "application/jwt")) {
      return refused(fmt::format("header typ {} is not JWT", quoted(typ)));
    }
  }
  dom::element crit;
  if (!header.at_key("crit").get(crit)) {
    return refused("header crit: no JWS extension is supported");
  }
  return {};
}

// A NumericDate: seconds since the epoch, an integer or not.
std::optional<time_point> numeric_date(dom::element value) {
  double seconds = 0;
  switch (value.type()) {
    case dom::element_type::INT64:
      seconds = static_cast<double>(value.get_int64().value_unsafe());
      break;
    case dom::element_type::UINT64:
      seconds = static_cast<double>(value.get_uint64().value_unsafe());
      break;
    case dom::element_type::DOUBLE: seconds = value.get_double().value_unsafe(); break;
    default: return std::nullopt;
  }
  seconds = std::clamp(seconds, -k_numeric_date_limit, k_numeric_date_limit);
  return time_point(std::chrono::duration_cast<duration>(std::chrono::duration<double>(seconds)));
}

result<time_point> date_claim(std::string_view name, dom::element value) {
  auto t = numeric_date(value);
  if (!t) {
    return refused(fmt::format("claim {}: must be a number (seconds since the epoch), got {}", name,
                               detail::type_name(value.type())));
  }
  return *t;
}

result<std::string_view> string_claim(std::string_view name, std::optional<dom::element> value) {
  if (!value) return refused(fmt::format("claim {}: missing", name));
  std::string_view s;
  if (value->get_string().get(s)) {
    return refused(
        fmt::format("claim {}: must be a string, got {}", name, detail::type_name(value->type())));
  }
  return s;
}

result<void> check_audience(std::optional<dom::element> aud, std::string_view audience) {
  if (!aud)
    return refused(
        fmt::format("claim aud: missing (the audience {} is required)", quoted(audience)));
  std::string_view one;
  if (!aud->get_string().get(one)) {
    if (one == audience) return {};
    return refused(
        fmt::format("claim aud: {} is not the audience {}", quoted(one), quoted(audience)));
  }
  dom::array list;
  if (aud->get_array().get(list)) {
    return refused(fmt::format("claim aud: must be a string or an array of strings, got {}",
                               detail::type_name(aud->type())));
  }
  bool found = false;
  std::size_t i = 0;
  for (dom::element item : list) {
    std::string_view s;
    if (item.get_string().get(s)) {
      return refused(fmt::format("claim aud[{}]: must be a string, got {}", i,
                                 detail::type_name(item.type())));
    }
    found = found || s == audience;
    ++i;
  }
  if (!found) {
    return refused(fmt::format("claim aud: does not name the audience {}", quoted(audience)));
  }
  return {};
}

// Reads the array `amp.<member>` of strings, handing each to `add`, which validates and
// keeps it.
template <class Add>
result<void> read_grant_list(std::string_view member, dom::element value, Add add) {
  dom::array list;
  if (value.get_array().get(list)) {
    return refused(fmt::format("claim amp.{}: must be an array, got {}", member,
                               detail::type_name(value.type())));
  }
  std::size_t i = 0;
  for (dom::element item : list) {
    std::string_view s;
    if (item.get_string().get(s)) {
      return refused(fmt::format("claim amp.{}[{}]: must be a string, got {}", member, i,
                                 detail::type_name(item.type())));
    }
    if (auto r = add(s); !r) {
      return refused(fmt::format("claim amp.{}[{}]: {}", member, i, r.error().message()));
    }
    ++i;
  }
  return {};
}

// "*" or a name valid for `Name`, kept as a string.
template <class Name>
auto name_or_star(std::vector<std::string>& out) {
  return [&out](std::string_view s) -> result<void> {
    if (s != "*") {
      auto name = Name::make(s);
      if (!name) return std::move(name).error();
    }
    out.emplace_back(s);
    return {};
  };
}

auto topic_patterns(std::vector<topic_pattern>& out) {
  return [&out](std::string_view s) -> result<void> {
    auto p = topic_pattern::make(s);
    if (!p) return std::move(p).error();
    out.push_back(*std::move(p));
    return {};
  };
}

result<permissions> read_grants(dom::element value) {
  dom::object amp;
  if (value.get_object().get(amp)) {
    return refused(
        fmt::format("claim amp: must be an object, got {}", detail::type_name(value.type())));
  }
  if (auto dup = duplicate_member(amp)) {
    return refused(fmt::format("claim amp: names member {} twice", quoted(*dup)));
  }
  permissions p;
  for (dom::key_value_pair member : amp) {
    const std::string_view key = member.key;
    result<void> r;
    if (key == "send") {
      r = read_grant_list(key, member.value, name_or_star<participant_name>(p.send));
    } else if (key == "submit") {
      r = read_grant_list(key, member.value, name_or_star<job_name>(p.submit));
    } else if (key == "work") {
      r = read_grant_list(key, member.value, name_or_star<job_name>(p.work));
    } else if (key == "publish") {
      r = read_grant_list(key, member.value, topic_patterns(p.publish));
    } else if (key == "subscribe") {
      r = read_grant_list(key, member.value, topic_patterns(p.subscribe));
    } else if (key == "admin") {
      if (member.value.get_bool().get(p.admin)) {
        r = refused(fmt::format("claim amp.admin: must be a boolean, got {}",
                                detail::type_name(member.value.type())));
      }
    }
    if (!r) return std::move(r).error();
  }
  return p;
}

struct claim_set {
  std::optional<dom::element> sub, ns, exp, nbf, iat, aud, amp;
};

claim_set collect_claims(dom::object claims) {
  claim_set c;
  for (dom::key_value_pair member : claims) {
    const std::string_view key = member.key;
    if (key == "sub") {
      c.sub = member.value;
    } else if (key == "ns") {
      c.ns = member.value;
    } else if (key == "exp") {
      c.exp = member.value;
    } else if (key == "nbf") {
      c.nbf = member.value;
    } else if (key == "iat") {
      c.iat = member.value;
    } else if (key == "aud") {
      c.aud = member.value;
    } else if (key == "amp") {
      c.amp = member.value;
    }
  }
  return c;
}

std::int64_t epoch_seconds(time_point t) {
  return std::chrono::floor<std::chrono::seconds>(t.time_since_epoch()).count();
}

}  // namespace

std::string_view to_string(jwt_alg alg) noexcept {
  switch (alg) {
    case jwt_alg::hs256: return "HS256";
    case jwt_alg::eddsa: return "EdDSA";
  }
  return "unknown";
}

std::optional<jwt_alg> jwt_alg_from_string(std::string_view name) noexcept {
  if (name == "HS256") return jwt_alg::hs256;
  if (name == "EdDSA") return jwt_alg::eddsa;
  return std::nullopt;
}

bool permissions::may_send(const participant_name& to) const noexcept {
  return std::any_of(send.begin(), send.end(),
                     [&](const std::string& g) { return g == "*" || g == to.view(); });
}

bool permissions::may_send_anyone() const noexcept {
  return std::any_of(send.begin(), send.end(), [](const std::string& g) { return g == "*"; });
}

bool permissions::may_submit(const job_name& job) const noexcept {
  return std::any_of(submit.begin(), submit.end(),
                     [&](const std::string& g) { return g == "*" || g == job.view(); });
}

bool permissions::may_work(const job_name& job) const noexcept {
  return std::any_of(work.begin(), work.end(),
                     [&](const std::string& g) { return g == "*" || g == job.view(); });
}

bool permissions::may_publish(const topic& t) const noexcept {
  return std::any_of(publish.begin(), publish.end(),
                     [&](const topic_pattern& g) { return g.matches(t); });
}

bool permissions::may_subscribe(const topic_pattern& pattern) const {
  return covered_by_any(pattern, subscribe);
}

struct authenticator::impl {
  jwt_alg alg = jwt_alg::hs256;
  std::string secret;
  pkey_ptr public_key;
  std::string audience;
  duration leeway{};

  impl() = default;
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  ~impl() {
    if (!secret.empty()) OPENSSL_cleanse(secret.data(), secret.size());
  }
};

result<authenticator> authenticator::make(auth_config config) {
  if (config.leeway < duration::zero()) return bad_config("auth: leeway must not be negative");
  auto p = std::make_shared<impl>();
  p->alg = config.alg;
  p->audience = std::move(config.audience);
  p->leeway = config.leeway;
  switch (config.alg) {
    case jwt_alg::hs256:
      if (config.secret.empty()) return bad_config("auth: HS256 needs a secret");
      if (config.secret.size() < min_secret_bytes) {
        const auto size = config.secret.size();
        OPENSSL_cleanse(config.secret.data(), config.secret.size());
        return bad_config(fmt::format(
            "auth: the HS256 secret has {} byte{}; at least {} are needed (RFC 7518 §3.2)", size,
            size == 1 ? "" : "s", min_secret_bytes));
      }
      if (config.secret.size() > static_cast<std::size_t>(INT_MAX)) {
        return bad_config("auth: the HS256 secret is too large");
      }
      p->secret = config.secret;
      OPENSSL_cleanse(config.secret.data(), config.secret.size());
      break;
    case jwt_alg::eddsa: {
      if (config.public_key_pem.empty()) {
        return bad_config("auth: EdDSA needs a public key (Ed25519, PEM)");
      }
      auto key = load_ed25519(config.public_key_pem, pem_kind::public_key, "auth: public key");
      if (!key) return std::move(key).error();
      p->public_key = *std::move(key);
      break;
    }
  }
  return authenticator(std::move(p));
}

jwt_alg authenticator::alg() const noexcept {
  return impl_->alg;
}

result<identity> authenticator::verify(std::string_view token, time_point now) const {
  const impl& k = *impl_;
  if (token.size() > max_token_bytes) {
    return refused(fmt::format("token is {} bytes (at most {})", token.size(), max_token_bytes));
  }
  if (token.empty()) return refused("token is empty");
  const auto parts = static_cast<std::size_t>(std::count(token.begin(), token.end(), '.')) + 1;
  if (parts != 3) {
    return refused(fmt::format(
        "token is not a compact JWS: {} part{} where header.payload.signature has 3{}", parts,
        parts == 1 ? "" : "s", parts == 5 ? " (an encrypted JWE is not accepted)" : ""));
  }
  const auto dot1 = token.find('.');
  const auto dot2 = token.find('.', dot1 + 1);
  const auto header_b64 = token.substr(0, dot1);
  const auto payload_b64 = token.substr(dot1 + 1, dot2 - dot1 - 1);
  const auto signature_b64 = token.substr(dot2 + 1);

  std::string problem;
  const auto header = b64url_decode(header_b64, problem);
  if (!header) return refused("header: " + problem);

  // One parser per thread: a dom::parser is not thread-safe. The header's DOM is gone
  // once the claims are parsed, so everything needed from it is checked first.
  thread_local dom::parser parser;
  {
    auto object = parse_object(parser, *header, "header parameters");
    if (!object) return std::move(object).error();
    if (auto r = check_header(*object, k.alg); !r) return std::move(r).error();
  }

  const auto payload = b64url_decode(payload_b64, problem);
  if (!payload) return refused("payload: " + problem);
  const auto signature = b64url_decode(signature_b64, problem);
  if (!signature) return refused("signature: " + problem);
  const auto signing_input = token.substr(0, dot2);
  {
    openssl_error_scope errors;
    switch (k.alg) {
      case jwt_alg::hs256:
        if (signature->size() != k_hs256_bytes) {
          return refused(fmt::format("signature does not verify ({} bytes; HS256 has {})",
                                     signature->size(), k_hs256_bytes));
        }
        if (!hs256_verifies(k.secret, signing_input, *signature)) {
          return refused("signature does not verify");
        }
        break;
      case jwt_alg::eddsa:
        if (signature->size() != k_ed25519_signature_bytes) {
          return refused(fmt::format("signature does not verify ({} bytes; Ed25519 has {})",
                                     signature->size(), k_ed25519_signature_bytes));
        }
        if (!ed25519_verifies(k.public_key.get(), signing_input, *signature)) {
          return refused("signature does not verify");
        }
        break;
    }
  }

  auto object = parse_object(parser, *payload, "claims");
  if (!object) return std::move(object).error();
  const claim_set c = collect_claims(*object);

  auto sub = string_claim("sub", c.sub);
  if (!sub) return std::move(sub).error();
  auto participant = participant_name::make(*sub);
  if (!participant) return refused("claim sub: " + participant.error().message());

  auto ns_text = string_claim("ns", c.ns);
  if (!ns_text) return std::move(ns_text).error();
  auto ns = namespace_name::make(*ns_text);
  if (!ns) return refused("claim ns: " + ns.error().message());

  if (!c.exp) return refused("claim exp: missing");
  auto exp = date_claim("exp", *c.exp);
  if (!exp) return std::move(exp).error();
  if (now >= saturating_add(*exp, k.leeway)) {
    return refused(fmt::format("token expired at {} (now {}, leeway {})", format_timestamp(*exp),
                               format_timestamp(now), describe(k.leeway)));
  }
  if (c.nbf) {
    auto nbf = date_claim("nbf", *c.nbf);
    if (!nbf) return std::move(nbf).error();
    if (saturating_add(now, k.leeway) < *nbf) {
      return refused(fmt::format("token not valid before {} (now {}, leeway {})",
                                 format_timestamp(*nbf), format_timestamp(now),
                                 describe(k.leeway)));
    }
  }
  if (c.iat) {
    auto iat = date_claim("iat", *c.iat);
    if (!iat) return std::move(iat).error();
  }
  if (!k.audience.empty()) {
    if (auto r = check_audience(c.aud, k.audience); !r) return std::move(r).error();
  }
  permissions grants;
  if (c.amp) {
    auto g = read_grants(*c.amp);
    if (!g) return std::move(g).error();
    grants = *std::move(g);
  }
  return identity{*std::move(participant), *std::move(ns), std::move(grants), *exp};
}

result<std::string> mint_token(const token_claims& claims, jwt_alg alg, std::string_view key) {
  if (!claims.amp_json.empty()) {
    if (auto r = json_check(claims.amp_json); !r) {
      return bad_config("amp_json: " + r.error().message());
    }
  }
  pkey_ptr private_key;
  switch (alg) {
    case jwt_alg::hs256:
      if (key.empty()) return bad_config("HS256 needs a secret");
      if (key.size() > static_cast<std::size_t>(INT_MAX)) {
        return bad_config("the HS256 secret is too large");
      }
      break;
    case jwt_alg::eddsa: {
      auto loaded = load_ed25519(key, pem_kind::private_key, "private key");
      if (!loaded) return std::move(loaded).error();
      private_key = *std::move(loaded);
      break;
    }
  }

  json_writer header;
  header.begin_object().key("alg").string(to_string(alg)).key("typ").string("JWT").end_object();
  json_writer payload;
  payload.begin_object();
  payload.key("sub").string(claims.sub).key("ns").string(claims.ns);
  payload.key("exp").integer(epoch_seconds(claims.exp));
  if (claims.nbf) payload.key("nbf").integer(epoch_seconds(*claims.nbf));
  if (claims.iat) payload.key("iat").integer(epoch_seconds(*claims.iat));
  if (!claims.aud.empty()) payload.key("aud").string(claims.aud);
  if (!claims.amp_json.empty()) payload.key("amp").raw(claims.amp_json);
  payload.end_object();

  std::string token = b64url_encode(header.str());
  token += '.';
  token += b64url_encode(payload.str());

  std::string signature;
  openssl_error_scope errors;
  switch (alg) {
    case jwt_alg::hs256: {
      unsigned length = 0;
      const auto md = hmac_sha256(key, token, length);
      if (length != k_hs256_bytes) return unexpected(errc::internal, "HMAC-SHA256 failed");
      signature.assign(reinterpret_cast<const char*>(md.data()), length);
      break;
    }
    case jwt_alg::eddsa: {
      md_ctx_ptr ctx(EVP_MD_CTX_new());
      std::size_t length = k_ed25519_signature_bytes;
      signature.resize(length);
      if (!ctx ||
          EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, private_key.get()) != 1 ||
          EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &length,
                         bytes(token), token.size()) != 1 ||
          length != k_ed25519_signature_bytes) {
        return unexpected(errc::internal, "Ed25519 signing failed");
      }
      break;
    }
  }
  token += '.';
  token += b64url_encode(signature);
  return token;
}

}  // namespace amp
