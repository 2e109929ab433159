// The link over TLS (wss://). The only translation unit of the client with websocketpp's TLS
// config: it is the slow one to compile.

#include <openssl/x509.h>

#include <asio/ssl/context.hpp>
#include <asio/ssl/host_name_verification.hpp>
#include <websocketpp/config/asio_client.hpp>
#include <websocketpp/uri.hpp>

#include "ws_link_impl.hpp"

namespace amp::client_detail {
namespace {

using tls_link = ws_link<websocketpp::config::asio_tls_client>;
using ssl_context = asio::ssl::context;

/// A client context for `host`: TLS 1.2 or later, and, when `verify_peer`, the chain checked
/// against `ca_file` (or the system's store) and the certificate checked for `host`.
result<std::shared_ptr<ssl_context>> make_context(const link_settings& settings,
                                                  const std::string& host,
                                                  const std::shared_ptr<std::string>& refusal) {
  auto ctx = std::make_shared<ssl_context>(ssl_context::tls_client);
  ctx->set_options(ssl_context::default_workarounds | ssl_context::no_sslv2 |
                   ssl_context::no_sslv3 | ssl_context::no_tlsv1 | ssl_context::no_tlsv1_1);
  if (!settings.verify_peer) {
    ctx->set_verify_mode(asio::ssl::verify_none);
    return ctx;
  }
  asio::error_code ec;
  if (settings.ca_file.empty()) {
    ctx->set_default_verify_paths(ec);
    if (ec)
      return unexpected(errc::bad_request, "cannot load the system's CA store: " + ec.message());
  } else {
    ctx->load_verify_file(settings.ca_file, ec);
    if (ec) {
      return unexpected(errc::bad_request,
                        "cannot load CA file " + settings.ca_file + ": " + ec.message());
    }
  }
  ctx->set_verify_mode(asio::ssl::verify_peer);
  // asio's host name check, recording why a certificate is refused (runs on the I/O thread,
  // during the handshake, once per certificate of the chain).
  ctx->set_verify_callback([check = asio::ssl::host_name_verification(host), host, refusal](
                               bool preverified, asio::ssl::verify_context& vc) mutable {
    if (!preverified) {
      const int err = X509_STORE_CTX_get_error(vc.native_handle());
      *refusal = std::string("the server's certificate does not verify: ") +
                 X509_verify_cert_error_string(err);
      return false;
    }
    if (!check(preverified, vc)) {
      *refusal = "the server's certificate is not valid for " + host;
      return false;
    }
    return true;
  });
  return ctx;
}

}  // namespace

result<std::unique_ptr<link>> make_tls_link(asio::io_context& io, link_settings settings,
                                            link_events events) {
  std::string host;
  try {
    websocketpp::uri uri(settings.url);
    if (!uri.get_valid()) return unexpected(errc::bad_request, "cannot use URL " + settings.url);
    host = uri.get_host();
  } catch (const std::exception& e) {
    return unexpected(errc::bad_request, "cannot use URL " + settings.url + ": " + e.what());
  }
  // Loaded once here, so that a bad CA file is an error of connect(), not a failed handshake.
  auto refusal = std::make_shared<std::string>();
  auto ctx = make_context(settings, host, refusal);
  if (!ctx) return std::move(ctx).error();

  auto l = std::make_unique<tls_link>(io, std::move(settings), std::move(events));
  l->endpoint().set_tls_init_handler([ctx = *ctx](websocketpp::connection_hdl) { return ctx; });
  l->set_failure_detail([refusal] { return *refusal; });
  return std::unique_ptr<link>(std::move(l));
}

}  // namespace amp::client_detail
