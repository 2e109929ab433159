// amp::client over wss:// against the scripted server on TLS: the certificate is checked
// against the CA file and the host name, or not at all when asked. The only translation unit
// of the tests with websocketpp's TLS config: it is the slow one to compile.

#include <catch2/catch.hpp>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <websocketpp/config/asio.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>

#include "amp/client.hpp"
#include "client/fake_server.hpp"
#include "client/run_amp.hpp"
#include "support/checks.hpp"

namespace {

using namespace std::chrono_literals;
using amp::errc;
using amp::testing::after_hello;
using amp::testing::code_of;
using amp::testing::must;
using amp::testing::ok_for;
namespace fs = std::filesystem;
namespace net = websocketpp::lib::asio;

/// asio_tls with a short TLS shutdown (see tests/websocket/websocket_tls_smoke_test.cpp: the
/// server's shutdown otherwise waits for its 5 s timeout after a close).
struct tls_config : websocketpp::config::asio_tls {
  using type = tls_config;
  struct transport_config : websocketpp::config::asio_tls::transport_config {
    static const long timeout_socket_shutdown = 250;
  };
  using transport_type = websocketpp::transport::asio::endpoint<transport_config>;
};
using tls_server = amp::testing::basic_fake_server<tls_config>;

/// A self-signed certificate whose subjectAltName is `san` (e.g. "IP:127.0.0.1"), and its
/// key, as PEM files in a temporary directory that goes away with the object.
class certificate_files {
 public:
  explicit certificate_files(const std::string& san) {
    std::random_device random;
    dir_ = fs::temp_directory_path() /
           ("amp-client-tls-" + std::to_string(::getpid()) + "-" + std::to_string(random()));
    fs::create_directories(dir_);
    cert_ = (dir_ / "cert.pem").string();
    key_ = (dir_ / "key.pem").string();

    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
        EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"), EVP_PKEY_free);
    std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
    if (!key || !cert) throw std::runtime_error("cannot make a key or a certificate");
    X509_set_version(cert.get(), 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60);
    X509_gmtime_adj(X509_getm_notAfter(cert.get()), 3600);
    X509_set_pubkey(cert.get(), key.get());
    X509_NAME* name = X509_get_subject_name(cert.get());
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("amp test"), -1, -1, 0);
    X509_set_issuer_name(cert.get(), name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
    for (auto [nid, value] : {std::pair{NID_subject_alt_name, san.c_str()},
                              std::pair{NID_basic_constraints, "critical,CA:TRUE"}}) {
      X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
      if (ext == nullptr) throw std::runtime_error("cannot make a certificate extension");
      X509_add_ext(cert.get(), ext, -1);
      X509_EXTENSION_free(ext);
    }
    if (X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0) {
      throw std::runtime_error("X509_sign failed");
    }
    write(cert_, [&](std::FILE* f) { return PEM_write_X509(f, cert.get()) == 1; });
    write(key_, [&](std::FILE* f) {
      return PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1;
    });
  }
  certificate_files(const certificate_files&) = delete;
  certificate_files& operator=(const certificate_files&) = delete;
  ~certificate_files() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  const std::string& cert() const { return cert_; }
  const std::string& key() const { return key_; }

 private:
  template <class F>
  static void write(const std::string& path, F&& writer) {
    std::unique_ptr<std::FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "w"),
                                                         std::fclose);
    if (!f || !writer(f.get())) throw std::runtime_error("cannot write " + path);
  }

  fs::path dir_;
  std::string cert_;
  std::string key_;
};

/// A TLS scripted server that presents `files`' certificate and answers every request.
std::unique_ptr<tls_server> serve(const certificate_files& files) {
  return std::make_unique<tls_server>(
      after_hello([](amp::testing::fake_peer& p, const amp::client_frame& f) {
        p.send(ok_for(f, R"("over":"tls")"));
      }),
      amp::testing::fake_server_settings{}, [&files](tls_server::endpoint& e) {
        e.set_tls_init_handler([&files](websocketpp::connection_hdl) {
          auto ctx = std::make_shared<net::ssl::context>(net::ssl::context::tls_server);
          ctx->use_certificate_chain_file(files.cert());
          ctx->use_private_key_file(files.key(), net::ssl::context::pem);
          return ctx;
        });
      });
}

amp::client_options tls_options(const tls_server& s) {
  amp::client_options o;
  o.url = s.url();
  o.token = "tok";
  o.connect_timeout = 5s;
  return o;
}

}  // namespace

TEST_CASE("over wss://, a certificate signed by the CA file and naming the host is accepted",
          "[client][tls]") {
  certificate_files files("IP:127.0.0.1");
  auto s = serve(files);
  REQUIRE(s->url().starts_with("wss://"));
  auto o = tls_options(*s);
  o.ca_file = files.cert();
  auto c = must(amp::client::connect(o));
  CHECK(c->participant() == "alice");
  CHECK(must(c->who()).string_at("/over") == "tls");
  CHECK(s->offered_subprotocols().at(0) == std::vector<std::string>{"amp.v1"});
}

TEST_CASE(
    "over wss://, a certificate that does not verify is refused unless verification is "
    "off",
    "[client][tls]") {
  SECTION("not signed by a trusted CA (the system's store)") {
    certificate_files files("IP:127.0.0.1");
    auto s = serve(files);
    auto c = amp::client::connect(tls_options(*s));
    REQUIRE(code_of(c) == errc::unavailable);
    CHECK_THAT(c.error().message(), Catch::Contains("does not verify: self-signed certificate"));
    CHECK(s->received().empty());
  }
  SECTION("trusted, but for another host") {
    certificate_files files("DNS:elsewhere.example");
    auto s = serve(files);
    auto o = tls_options(*s);
    o.ca_file = files.cert();
    auto c = amp::client::connect(o);
    REQUIRE(code_of(c) == errc::unavailable);
    CHECK_THAT(c.error().message(), Catch::Contains("not valid for 127.0.0.1"));
    CHECK(s->received().empty());
  }
  SECTION("verification off") {
    certificate_files files("DNS:elsewhere.example");
    auto s = serve(files);
    auto o = tls_options(*s);
    o.verify_peer = false;
    auto c = must(amp::client::connect(o));
    CHECK(must(c->who()).string_at("/over") == "tls");
  }
}

TEST_CASE("a CA file that cannot be loaded is bad_request", "[client][tls]") {
  amp::client_options o;
  o.url = "wss://127.0.0.1:1/amp";
  o.ca_file = "/nonexistent/ca.pem";
  auto c = amp::client::connect(o);
  REQUIRE(code_of(c) == errc::bad_request);
  CHECK_THAT(c.error().message(), Catch::Contains("/nonexistent/ca.pem"));
}

TEST_CASE("amp over wss://: --ca-file trusts a certificate, --insecure skips the check",
          "[client][tls][binary]") {
  certificate_files right("IP:127.0.0.1");
  auto s = serve(right);
  auto trusted =
      amp::testing::run_amp({"who", "--url", s->url(), "--token", "t", "--ca-file", right.cert()});
  CHECK(trusted.status == 0);
  CHECK(trusted.out == "{\"over\":\"tls\"}\n");

  certificate_files wrong("DNS:elsewhere.example");
  auto other = serve(wrong);
  auto refused = amp::testing::run_amp(
      {"who", "--url", other->url(), "--token", "t", "--ca-file", wrong.cert()});
  CHECK(refused.status == 1);
  CHECK_THAT(refused.err,
             Catch::StartsWith("amp: unavailable: ") && Catch::Contains("not valid for 127.0.0.1"));
  auto insecure =
      amp::testing::run_amp({"who", "--url", other->url(), "--token", "t", "--insecure"});
  CHECK(insecure.status == 0);
}
