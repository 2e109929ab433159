// websocketpp over TLS (wss), compiled as C++20 through amp::websocketpp. The only translation
// unit with the TLS configs: they are slow and heavy to compile.

#include <catch2/catch.hpp>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <websocketpp/config/asio.hpp>
#include <websocketpp/config/asio_client.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>

#include "websocket/smoke.hpp"

namespace {

namespace fs = std::filesystem;
namespace ws = amp::testing::websocket;
namespace net = websocketpp::lib::asio;

/// asio_tls with a short wait for the TLS shutdown. After acknowledging a client's close, the
/// websocketpp 0.8.2 server starts the TLS shutdown while its frame read is still pending; that
/// read consumes the client's close_notify, so the shutdown only ends when
/// timeout_socket_shutdown (5 s by default) expires and the connection is held until then.
struct tls_server_config : websocketpp::config::asio_tls {
  using type = tls_server_config;
  struct transport_config : websocketpp::config::asio_tls::transport_config {
    static const long timeout_socket_shutdown = 250;
  };
  using transport_type = websocketpp::transport::asio::endpoint<transport_config>;
};
using tls_server = ws::server<tls_server_config>;
using tls_client_config = websocketpp::config::asio_tls_client;
using ssl_context = net::ssl::context;

struct pkey_free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct x509_free {
  void operator()(X509* p) const { X509_free(p); }
};
struct file_close {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

/// A self-signed certificate for 127.0.0.1 and its P-256 key, as PEM files in a temporary
/// directory that goes away with the object.
class self_signed_files {
 public:
  self_signed_files() {
    std::random_device random;
    dir_ = fs::temp_directory_path() /
           ("amp-ws-tls-" + std::to_string(::getpid()) + "-" + std::to_string(random()));
    fs::create_directories(dir_);
    cert_ = dir_ / "cert.pem";
    key_ = dir_ / "key.pem";

    std::unique_ptr<EVP_PKEY, pkey_free> key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
    if (!key) throw std::runtime_error("EVP_PKEY_Q_keygen failed");
    std::unique_ptr<X509, x509_free> cert(X509_new());
    if (!cert) throw std::runtime_error("X509_new failed");

    X509_set_version(cert.get(), 2);  // v3
    ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60);
    X509_gmtime_adj(X509_getm_notAfter(cert.get()), 3600);
    X509_set_pubkey(cert.get(), key.get());
    X509_NAME* name = X509_get_subject_name(cert.get());
    const std::string common_name = "127.0.0.1";
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                               0);
    X509_set_issuer_name(cert.get(), name);
    if (X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0)
      throw std::runtime_error("X509_sign failed");

    std::unique_ptr<std::FILE, file_close> cert_file(std::fopen(cert_.c_str(), "w"));
    if (!cert_file || PEM_write_X509(cert_file.get(), cert.get()) != 1)
      throw std::runtime_error("cannot write " + cert_.string());
    std::unique_ptr<std::FILE, file_close> key_file(std::fopen(key_.c_str(), "w"));
    if (!key_file ||
        PEM_write_PrivateKey(key_file.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1)
      throw std::runtime_error("cannot write " + key_.string());
  }

  self_signed_files(const self_signed_files&) = delete;
  self_signed_files& operator=(const self_signed_files&) = delete;

  ~self_signed_files() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  const fs::path& cert() const { return cert_; }
  const fs::path& key() const { return key_; }

 private:
  fs::path dir_;
  fs::path cert_;
  fs::path key_;
};

}  // namespace

TEST_CASE("a text frame is echoed over TLS with amp.v1 selected", "[websocket][tls]") {
  const self_signed_files files;

  tls_server s([&](tls_server::endpoint& e) {
    e.set_tls_init_handler([&](websocketpp::connection_hdl) {
      auto ctx = std::make_shared<ssl_context>(ssl_context::tls_server);
      ctx->set_options(ssl_context::default_workarounds | ssl_context::no_sslv2 |
                       ssl_context::no_sslv3 | ssl_context::no_tlsv1 | ssl_context::no_tlsv1_1);
      ctx->use_certificate_chain_file(files.cert().string());
      ctx->use_private_key_file(files.key().string(), ssl_context::pem);
      return ctx;
    });
  });

  auto verification_off = [](websocketpp::client<tls_client_config>& c) {
    c.set_tls_init_handler([](websocketpp::connection_hdl) {
      auto ctx = std::make_shared<ssl_context>(ssl_context::tls_client);
      ctx->set_verify_mode(net::ssl::verify_none);
      return ctx;
    });
  };

  const std::string uri = "wss://127.0.0.1:" + std::to_string(s.port()) + "/amp";
  auto out = ws::run_client<tls_client_config>(
      uri, {"amp.v1"}, {{websocketpp::frame::opcode::text, R"({"op":"hello"})"}}, 1,
      verification_off);
  REQUIRE_FALSE(out.timed_out);
  REQUIRE(out.opened);
  CHECK(out.subprotocol == "amp.v1");
  REQUIRE(out.received.size() == 1);
  CHECK(out.received[0].op == websocketpp::frame::opcode::text);
  CHECK(out.received[0].payload == R"({"op":"hello"})");
  CHECK(out.remote_close_code == websocketpp::close::status::normal);
}
