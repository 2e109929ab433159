// amp-server's own behaviour, tested on the binary (spec §1, §10, §11): the command line and
// the configuration, the announcement of the memory transport, HTTP beside the WebSocket,
// the handshake, the frame limit, TLS, a client that does not read, and the graceful
// shutdown. The AMP protocol itself is the gateway's and is tested with the library.

#include <catch2/catch.hpp>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <websocketpp/config/asio_client.hpp>
#include <websocketpp/config/asio_no_tls_client.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "amp/gateway/auth.hpp"
#include "server/server_process.hpp"
#include "server/ws_client.hpp"
#include "support/checks.hpp"
#include "support/nats_server.hpp"

namespace {

using namespace std::chrono_literals;
using amp::testing::http_get;
using amp::testing::server_process;
using amp::testing::temp_dir;
using plain_client = amp::testing::ws_client<websocketpp::config::asio_client>;
using tls_client = amp::testing::ws_client<websocketpp::config::asio_tls_client>;

constexpr const char* k_secret = "server-test-secret-of-at-least-32-bytes";

std::vector<std::string> with_secret(std::vector<std::string> args = {}) {
  args.insert(args.begin(), {"--secret", k_secret});
  return args;
}

std::string token(const std::string& participant, const std::string& grants = "") {
  amp::token_claims claims{.sub = participant,
                           .ns = "demo",
                           .exp = std::chrono::system_clock::now() + std::chrono::hours(1),
                           .amp_json = grants};
  return amp::mint_token(claims, amp::jwt_alg::hs256, k_secret).value();
}

std::string hello(const std::string& participant, const std::string& grants = "") {
  return R"({"op":"hello","id":1,"token":")" + token(participant, grants) + R"("})";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// A self-signed certificate for 127.0.0.1 (its CN and subjectAltName) and its P-256 key, as PEM
/// files in `dir`; with `passphrase`, the key is encrypted with it.
void write_self_signed(const temp_dir& dir, const char* passphrase = nullptr) {
  struct pkey_free {
    void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  };
  struct x509_free {
    void operator()(X509* p) const { X509_free(p); }
  };
  struct file_close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<EVP_PKEY, pkey_free> key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  REQUIRE(key);
  std::unique_ptr<X509, x509_free> cert(X509_new());
  REQUIRE(cert);
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 3600);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  // The address as a subjectAltName too: clients that check it (cnats) find it there.
  X509_EXTENSION* san = X509V3_EXT_conf_nid(nullptr, nullptr, NID_subject_alt_name,
                                            const_cast<char*>("IP:127.0.0.1"));
  REQUIRE(san);
  REQUIRE(X509_add_ext(cert.get(), san, -1) == 1);
  X509_EXTENSION_free(san);
  REQUIRE(X509_sign(cert.get(), key.get(), EVP_sha256()) > 0);
  const auto cert_path = (dir.path() / "cert.pem").string();
  const auto key_path = (dir.path() / "key.pem").string();
  std::unique_ptr<std::FILE, file_close> cert_file(std::fopen(cert_path.c_str(), "w"));
  REQUIRE(cert_file);
  REQUIRE(PEM_write_X509(cert_file.get(), cert.get()) == 1);
  std::unique_ptr<std::FILE, file_close> key_file(std::fopen(key_path.c_str(), "w"));
  REQUIRE(key_file);
  const EVP_CIPHER* cipher = passphrase ? EVP_aes_256_cbc() : nullptr;
  auto* pass = reinterpret_cast<unsigned char*>(const_cast<char*>(passphrase));
  const int pass_len = passphrase ? static_cast<int>(std::strlen(passphrase)) : 0;
  REQUIRE(PEM_write_PrivateKey(key_file.get(), key.get(), cipher, pass, pass_len, nullptr,
                               nullptr) == 1);
}

}  // namespace

TEST_CASE("--help lists every flag and configuration key and exits 0", "[server][cli]") {
  auto r = server_process::run({"--help"});
  CHECK(r.status == 0);
  for (const char* flag :
       {"--config", "--set", "--listen", "--nats", "--nats-creds", "--secret", "--secret-file",
        "--memory", "--io-threads", "--workers", "--help", "--version"}) {
    INFO(flag);
    CHECK(contains(r.out, flag));
  }
  for (const char* key : {"listen",
                          "tls.cert",
                          "tls.key",
                          "nats.url",
                          "nats.creds",
                          "nats.replicas",
                          "nats.storage",
                          "nats.domain",
                          "nats.tls.ca",
                          "nats.tls.cert",
                          "auth.alg",
                          "auth.secret",
                          "auth.secret_file",
                          "auth.public_key_file",
                          "auth.audience",
                          "auth.leeway_s",
                          "heartbeat_s",
                          "registry_ttl_s",
                          "inbox_ack_s",
                          "inbox_window",
                          "inbox_idle_s",
                          "lease_s",
                          "max_attempts",
                          "decline_delay_ms",
                          "limits.max_frame_bytes",
                          "limits.max_body_bytes",
                          "limits.max_sessions",
                          "limits.max_subscriptions",
                          "rate.per_s",
                          "rate.burst",
                          "rate.bytes_per_s",
                          "budget.per_day",
                          "schemas.",
                          "retention.task_s",
                          "retention.inbox.max_age_s",
                          "retention.inbox.max_bytes",
                          "retention.topics.max_age_s",
                          "retention.topics.max_bytes",
                          "retention.namespaces."}) {
    INFO(key);
    CHECK(contains(r.out, key));
  }
  CHECK(contains(r.out, "\"127.0.0.1:8080\""));
  CHECK(contains(r.out, "stderr"));

  auto v = server_process::run({"--version"});
  CHECK(v.status == 0);
  CHECK(v.out.rfind("amp-server ", 0) == 0);
}

TEST_CASE("a bad configuration stops the server with exit 2 and a message naming the key",
          "[server][cli]") {
  temp_dir dir;

  SECTION("an unknown key") {
    auto file = dir.write("unknown.json", R"({"listn": "127.0.0.1:9000"})");
    auto r = server_process::run({"--config", file.string(), "--secret", k_secret});
    CHECK(r.status == 2);
    CHECK(r.err.rfind("amp-server: ", 0) == 0);
    CHECK(contains(r.err, "unknown key \"listn\""));
    CHECK(contains(r.err, "listen"));
    CHECK(contains(r.err, file.string()));
  }
  SECTION("a value out of range") {
    auto file = dir.write("range.json", R"({"limits": {"max_frame_bytes": -5}})");
    auto r = server_process::run({"--config", file.string(), "--secret", k_secret});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "limits.max_frame_bytes"));
  }
  SECTION("text that is not JSON") {
    auto file = dir.write("broken.json", R"({"listen": )");
    auto r = server_process::run({"--config", file.string(), "--secret", k_secret});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "not valid JSON"));
  }
  SECTION("a file that cannot be read") {
    auto r = server_process::run({"--config", (dir.path() / "missing.json").string()});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "cannot read"));
  }
  SECTION("a bad override") {
    auto r = server_process::run({"--secret", k_secret, "--set", "limits.max_sessions=0"});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "limits.max_sessions"));
    auto q = server_process::run({"--secret", k_secret, "--set", "listen=0.0.0.0:9000"});
    CHECK(q.status == 2);
    CHECK(contains(q.err, "listen"));
    auto l = server_process::run({"--secret", k_secret, "--listen", "127.0.0.1:0"});
    CHECK(l.status == 2);
    CHECK(contains(l.err, "listen"));
  }
  SECTION("a rule between keys, checked after the overrides") {
    auto r = server_process::run({"--secret", k_secret, "--set", "heartbeat_s=60"});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "heartbeat_s"));
  }
  SECTION("an unknown flag") {
    auto r = server_process::run({"--secret", k_secret, "--frobnicate"});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "--frobnicate"));
  }
  SECTION("HS256 without a secret") {
    auto r = server_process::run({});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "secret"));
    CHECK_FALSE(contains(r.err, "\"event\":\"listening\""));
  }
  SECTION("an HS256 secret shorter than 32 bytes") {
    auto r = server_process::run({"--secret", "short-secret"});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "the HS256 secret has 12 bytes; at least 32 are needed"));
    CHECK_FALSE(contains(r.err, "short-secret"));
    CHECK_FALSE(contains(r.err, "\"event\":\"listening\""));
  }
  SECTION("TLS files that cannot be used") {
    auto cert = dir.write("cert.pem", "not a certificate");
    auto key = dir.write("key.pem", "not a key");
    auto r =
        server_process::run({"--secret", k_secret, "--set", "tls.cert=\"" + cert.string() + "\"",
                             "--set", "tls.key=\"" + key.string() + "\""});
    CHECK(r.status == 2);
    CHECK(contains(r.err, "tls.cert"));
  }
}

TEST_CASE("on the memory transport the server says at start that nothing is durable", "[server]") {
  auto server = server_process::start(with_secret());
  const auto log = server.log();
  INFO(log);
  const auto announced = log.find("\"event\":\"memory_transport\"");
  REQUIRE(announced != std::string::npos);
  CHECK(announced < log.find("\"event\":\"listening\""));
  CHECK(contains(log, "\"level\":\"warn\""));
  CHECK(contains(log, "durable"));
  CHECK(contains(log, "\"transport\":\"memory\""));
}

TEST_CASE("the server serves its sockets on half the machine's cores by default, else as told",
          "[server]") {
  const auto half = std::clamp(std::thread::hardware_concurrency() / 2, 1U, 64U);
  auto plain = server_process::start(with_secret());
  INFO(plain.log());
  CHECK(contains(plain.log(), "\"io_threads\":" + std::to_string(half)));
  auto three = server_process::start(with_secret({"--io-threads", "3"}));
  INFO(three.log());
  CHECK(contains(three.log(), "\"io_threads\":3"));
}

TEST_CASE("a task retention under a day starts with a warning, a day or more without one",
          "[server]") {
  auto args = with_secret();
  args.insert(args.end(), {"--set", "retention.task_s=60"});
  auto shortened = server_process::start(args);
  const auto log = shortened.log();
  INFO(log);
  CHECK(contains(log, R"("level":"warn","event":"short_task_retention","task_s":60)"));
  auto standard = server_process::start(with_secret());
  CHECK_FALSE(contains(standard.log(), "short_task_retention"));
  auto r = server_process::run({"--secret", k_secret, "--set", "retention.task_s=59"});
  CHECK(r.status == 2);
  CHECK(contains(r.err, "retention.task_s: must be an integer from 60 to 315360000, not 59"));
}

TEST_CASE("a configuration file holding the secret is named at start when others can read it",
          "[server]") {
  temp_dir dir;
  auto config =
      dir.write("secret.json", std::string(R"({"auth": {"secret": ")") + k_secret + R"("}})");
  REQUIRE(::chmod(config.c_str(), 0644) == 0);
  auto readable = server_process::start({"--config", config.string()});
  INFO(readable.log());
  CHECK(contains(readable.log(), R"("event":"file_permissions","key":"config")"));
  CHECK(contains(readable.log(), R"("mode":"0644")"));
  REQUIRE(::chmod(config.c_str(), 0600) == 0);
  auto own = server_process::start({"--config", config.string()});
  INFO(own.log());
  CHECK(contains(own.log(), "\"event\":\"listening\""));
  CHECK_FALSE(contains(own.log(), "file_permissions"));
}

TEST_CASE("HTTP beside the WebSocket: /healthz, /readyz, /metrics and 404", "[server][http]") {
  auto server = server_process::start(with_secret());

  auto health = http_get(server.port(), "/healthz");
  CHECK(health.status == 200);
  CHECK(health.body == "ok");

  auto ready = http_get(server.port(), "/readyz");
  CHECK(ready.status == 200);

  auto metrics = http_get(server.port(), "/metrics");
  CHECK(metrics.status == 200);
  CHECK(contains(metrics.headers, "text/plain; version=0.0.4"));
  CHECK(contains(metrics.body, "amp_sessions"));

  CHECK(http_get(server.port(), "/nope").status == 404);
  CHECK(http_get(server.port(), "/healthz/more").status == 404);
  CHECK(http_get(server.port(), "/amp").status == 426);
}

TEST_CASE("the WebSocket handshake: path /amp and subprotocol amp.v1", "[server][websocket]") {
  auto server = server_process::start(with_secret());

  SECTION("no subprotocol offered: accepted without one, and frames reach the session") {
    plain_client c(server.url(), {});
    REQUIRE(c.wait_open());
    CHECK(c.http_status() == 101);
    CHECK(c.subprotocol().empty());
    c.send(hello("alice"));
    auto ok = c.next_op("ok");
    REQUIRE(ok);
    CHECK(contains(*ok, "\"participant\":\"alice\""));
    CHECK(contains(*ok, "amp-server/"));
    // The session counts it.
    CHECK(amp::testing::eventually(
        5s, [&] { return contains(http_get(server.port(), "/metrics").body, "amp_sessions 1"); }));
  }
  SECTION("amp.v1 among others: selected") {
    plain_client c(server.url(), {"chat", "amp.v1"});
    REQUIRE(c.wait_open());
    CHECK(c.subprotocol() == "amp.v1");
  }
  SECTION("only other subprotocols: refused with HTTP 400") {
    plain_client c(server.url(), {"chat"});
    CHECK_FALSE(c.wait_open());
    CHECK(c.failed());
    CHECK(c.http_status() == 400);
    CHECK(server.wait_for_log("\"event\":\"upgrade_refused\""));
  }
  SECTION("another path: refused with HTTP 404") {
    plain_client c("ws://127.0.0.1:" + std::to_string(server.port()) + "/other", {"amp.v1"});
    CHECK_FALSE(c.wait_open());
    CHECK(c.http_status() == 404);
  }
}

TEST_CASE("a binary frame is answered with bad_request and the connection stays up",
          "[server][websocket]") {
  auto server = server_process::start(with_secret());
  plain_client c(server.url(), {"amp.v1"});
  REQUIRE(c.wait_open());
  c.send(hello("alice"));
  REQUIRE(c.next_op("ok"));
  c.send(std::string("\x01\x02", 2), websocketpp::frame::opcode::binary);
  auto error = c.next_op("error");
  REQUIRE(error);
  CHECK(contains(*error, "bad_request"));
  c.send(R"({"op":"who","id":"after"})");
  auto reply = c.next_op("ok");
  REQUIRE(reply);
  CHECK(contains(*reply, "\"after\""));
}

TEST_CASE("a connection that does not answer pings is closed, one that answers stays",
          "[server][websocket]") {
  auto server = server_process::start(with_secret({"--ping-interval", "1"}));
  plain_client alive(server.url(), {"amp.v1"});  // websocketpp answers pings itself
  REQUIRE(alive.wait_open());
  amp::testing::raw_ws_client silent(server.port());  // reads nothing, answers nothing
  auto drained = silent.drain(10s);
  CHECK(drained.close_code == 1008);
  alive.send(R"({"op":"who","id":"still"})");
  auto reply = alive.next_op("error");  // no hello yet: unauthenticated, but answered
  REQUIRE(reply);
  CHECK(contains(*reply, "\"still\""));
}

TEST_CASE("a frame over limits.max_frame_bytes closes the connection with 1009",
          "[server][websocket]") {
  auto server = server_process::start(
      with_secret({"--set", "limits.max_frame_bytes=2048", "--set", "limits.max_body_bytes=1024"}));
  plain_client c(server.url(), {"amp.v1"});
  REQUIRE(c.wait_open());
  c.send(R"({"op":"hello","id":1,"token":")" + std::string(3000, 'x') + R"("})");
  CHECK(c.wait_closed() == 1009);
}

TEST_CASE("SIGTERM closes every connection with 1001 and the server exits 0",
          "[server][shutdown]") {
  auto server = server_process::start(with_secret());
  plain_client a(server.url(), {"amp.v1"});
  plain_client b(server.url(), {});
  plain_client quiet(server.url(), {"amp.v1"});  // never says hello
  REQUIRE(a.wait_open());
  REQUIRE(b.wait_open());
  REQUIRE(quiet.wait_open());
  a.send(hello("alice"));
  b.send(hello("bob"));
  REQUIRE(a.next_op("ok"));
  REQUIRE(b.next_op("ok"));

  server.signal(SIGTERM);
  CHECK(a.wait_closed() == 1001);
  CHECK(b.wait_closed() == 1001);
  CHECK(quiet.wait_closed() == 1001);
  CHECK(server.wait_exit(10s) == 0);
  const auto log = server.log();
  INFO(log);
  CHECK(contains(log, "\"event\":\"shutting_down\""));
  CHECK(contains(log, "\"signal\":\"SIGTERM\""));
  CHECK(contains(log, "\"event\":\"stopped\""));
}

TEST_CASE("SIGINT shuts down the same way, and a second signal exits at once",
          "[server][shutdown]") {
  auto server = server_process::start(with_secret());
  // It never reads, so it never answers the close: the server would wait for it.
  amp::testing::raw_ws_client stubborn(server.port());
  stubborn.send(hello("carol"));
  REQUIRE(server.wait_for_log("\"event\":\"session_open\""));

  server.signal(SIGINT);
  REQUIRE(server.wait_for_log("\"event\":\"shutting_down\""));
  std::this_thread::sleep_for(200ms);
  server.signal(SIGINT);
  CHECK(server.wait_exit(2s) == 128 + SIGINT);
  CHECK(contains(server.log(), "\"event\":\"forced_exit\""));
}

TEST_CASE("wss when tls.cert and tls.key are set", "[server][tls]") {
  temp_dir dir;
  write_self_signed(dir);
  auto config = dir.write("tls.json", R"({"tls": {"cert": "cert.pem", "key": "key.pem"}})");
  ::chmod((dir.path() / "key.pem").c_str(), 0640);
  REQUIRE(::chmod(config.c_str(), 0644) == 0);
  auto server = server_process::start(with_secret({"--config", config.string()}));
  CHECK(contains(server.log(), "\"tls\":true"));
  // The key is readable by the group: the server says so, and how to fix it.
  CHECK(contains(server.log(), R"("event":"file_permissions","key":"tls.key")"));
  CHECK(contains(server.log(), R"("mode":"0640")"));
  // The configuration file is readable by others too, but the secret came from --secret.
  CHECK_FALSE(contains(server.log(), R"("key":"config")"));
  CHECK(contains(server.log(), "wss://"));

  tls_client c(server.url(true), {"amp.v1"}, [](tls_client::endpoint& e) {
    e.set_tls_init_handler([](websocketpp::connection_hdl) {
      auto ctx = std::make_shared<websocketpp::lib::asio::ssl::context>(
          websocketpp::lib::asio::ssl::context::tls_client);
      ctx->set_verify_mode(websocketpp::lib::asio::ssl::verify_none);
      return ctx;
    });
  });
  REQUIRE(c.wait_open());
  CHECK(c.subprotocol() == "amp.v1");
  c.send(hello("alice"));
  REQUIRE(c.next_op("ok"));

  server.signal(SIGTERM);
  CHECK(c.wait_closed() == 1001);
  CHECK(server.wait_exit(10s) == 0);
}

TEST_CASE("an encrypted TLS key is refused at start, without asking for a passphrase",
          "[server][tls]") {
  temp_dir dir;
  write_self_signed(dir, "a passphrase");
  auto config = dir.write("tls.json", R"({"tls": {"cert": "cert.pem", "key": "key.pem"}})");
  auto r = server_process::run(with_secret({"--config", config.string()}));
  CHECK(r.status == 2);
  CHECK(contains(r.err, "tls.key: "));
  CHECK(contains(r.err, "is encrypted; amp-server does not ask for passphrases"));
}

TEST_CASE("/readyz answers 503 while the NATS server is down", "[server][nats]") {
  auto nats = amp::testing::nats_server::start();
  auto server = server_process::start(with_secret({"--nats", nats.url()}));
  CHECK(contains(server.log(), "\"event\":\"backend_connected\""));
  CHECK_FALSE(contains(server.log(), "\"event\":\"memory_transport\""));
  CHECK_FALSE(contains(server.log(), "\"event\":\"nats_version\""));  // not a cluster
  CHECK(amp::testing::eventually(10s,
                                 [&] { return http_get(server.port(), "/readyz").status == 200; }));

  nats.stop();
  CHECK(amp::testing::eventually(20s,
                                 [&] { return http_get(server.port(), "/readyz").status == 503; }));
  CHECK(http_get(server.port(), "/healthz").status == 200);

  nats.restart();
  CHECK(amp::testing::eventually(20s,
                                 [&] { return http_get(server.port(), "/readyz").status == 200; }));

  server.signal(SIGTERM);
  CHECK(server.wait_exit(10s) == 0);
}

TEST_CASE("a subscriber that does not read cannot grow the server's memory", "[server][nats]") {
  // On NATS, so that the stream's data lives in nats-server, not in amp-server.
  auto nats = amp::testing::nats_server::start();
  auto server = server_process::start(
      with_secret({"--nats", nats.url(), "--set", "policy.default.rate.bytes_per_s=1e10"}));

  amp::testing::raw_ws_client reader(server.port());
  reader.send(hello("reader", R"({"subscribe":["news.>"]})"));
  reader.send(R"({"op":"subscribe","id":2,"topic":"news.>","sub":"s1"})");

  plain_client writer(server.url(), {"amp.v1"});
  REQUIRE(writer.wait_open());
  writer.send(hello("writer", R"({"publish":["news.>"]})"));
  REQUIRE(writer.next_op("ok"));
  std::this_thread::sleep_for(500ms);  // the reader's subscribe has been served by now

  const auto before = server.resident_bytes();
  const std::string rest =
      R"(,"topic":"news.eu","body":")" + std::string(200 * 1024, 'x') + R"("})";
  constexpr int count = 500;  // 100 MB of events for the reader
  for (int i = 0; i < count; ++i) {
    // One at a time: the session bounds what a client may have waiting, too.
    writer.send(R"({"op":"publish","id":)" + std::to_string(i) + rest);
    auto reply = writer.next(30s);
    INFO("publish " << i << ": " << reply.value_or("nothing").substr(0, 200));
    REQUIRE(reply);
    REQUIRE(contains(*reply, "\"op\":\"ok\""));
  }
  std::this_thread::sleep_for(1s);
  const auto after = server.resident_bytes();
  INFO("resident before " << before << " after " << after);
  CHECK(after < before + (64u << 20));

  auto seen = reader.drain();
  bool dropped = false;
  for (const auto& t : seen.texts) dropped = dropped || contains(t, "\"op\":\"sub_dropped\"");
  INFO("frames read " << seen.texts.size() << ", close " << seen.close_code);
  CHECK((dropped || seen.close_code == 1008));
}

TEST_CASE("TLS to NATS: nats.tls.ca verifies the server's certificate", "[server][nats][tls]") {
  temp_dir dir;
  write_self_signed(dir);  // the NATS server's certificate, and the CA the client trusts
  const auto cert = (dir.path() / "cert.pem").string();
  const auto key = (dir.path() / "key.pem").string();
  amp::testing::nats_server::options o;
  o.jetstream = false;  // the harness's readiness check speaks plain NATS: JetStream set here
  o.extra_config = "jetstream { store_dir: \"" + (dir.path() / "store").string() + "\" }\n" +
                   "tls { cert_file: \"" + cert + "\", key_file: \"" + key + "\" }\n";
  auto nats = amp::testing::nats_server::start(o);

  // TLS (a tls:// URL) without the CA: the certificate cannot be verified, the server does
  // not start. Without TLS at all, neither.
  const auto tls_url = "tls://127.0.0.1:" + std::to_string(nats.port());
  for (const auto& url : {tls_url, nats.url()}) {
    INFO(url);
    auto refused = server_process::run(with_secret({"--nats", url}));
    CHECK(refused.status != 0);
    CHECK(contains(refused.err, "nats: cannot connect"));
  }

  auto server = server_process::start(
      with_secret({"--nats", nats.url(), "--set", "nats.tls.ca=\"" + cert + "\""}));
  CHECK(contains(server.log(), "\"event\":\"backend_connected\""));
  plain_client c(server.url(), {"amp.v1"});
  REQUIRE(c.wait_open());
  c.send(hello("alice", R"({"send":["*"]})"));
  REQUIRE(c.next_op("ok"));
  // A message through JetStream, over TLS.
  c.send(R"({"op":"send","id":2,"to":"alice","body":"over tls"})");
  REQUIRE(c.next_op("ok"));
  auto m = c.next_op("message");
  REQUIRE(m);
  CHECK(contains(*m, "over tls"));
  server.signal(SIGTERM);
  CHECK(server.wait_exit(10s) == 0);
}

TEST_CASE("TLS to NATS: nats.tls.cert and nats.tls.key for a server that verifies clients",
          "[server][nats][tls]") {
  temp_dir dir;
  write_self_signed(dir);  // the server's certificate, the client's, and the CA of both
  const auto cert = (dir.path() / "cert.pem").string();
  const auto key = (dir.path() / "key.pem").string();
  amp::testing::nats_server::options o;
  o.jetstream = false;
  o.extra_config = "jetstream { store_dir: \"" + (dir.path() / "store").string() + "\" }\n" +
                   "tls { cert_file: \"" + cert + "\", key_file: \"" + key + "\", ca_file: \"" +
                   cert + "\", verify: true }\n";
  auto nats = amp::testing::nats_server::start(o);
  const auto ca = "nats.tls.ca=\"" + cert + "\"";
  auto refused = server_process::run(with_secret({"--nats", nats.url(), "--set", ca}));
  CHECK(refused.status != 0);
  CHECK(contains(refused.err, "nats: cannot connect"));
  // Only one of the pair: refused at start, naming the key.
  auto half = server_process::run(
      with_secret({"--nats", nats.url(), "--set", ca, "--set", "nats.tls.cert=\"" + cert + "\""}));
  CHECK(half.status == 2);
  CHECK(contains(half.err, "nats.tls.key: required when nats.tls.cert is given"));

  ::chmod(key.c_str(), 0600);
  auto server = server_process::start(
      with_secret({"--nats", nats.url(), "--set", ca, "--set", "nats.tls.cert=\"" + cert + "\"",
                   "--set", "nats.tls.key=\"" + key + "\""}));
  CHECK(contains(server.log(), "\"event\":\"backend_connected\""));
  CHECK(amp::testing::eventually(10s,
                                 [&] { return http_get(server.port(), "/readyz").status == 200; }));
  server.signal(SIGTERM);
  CHECK(server.wait_exit(10s) == 0);
}

TEST_CASE("a cluster of nats-server older than 2.9.21 is warned about at start",
          "[server][nats][cluster]") {
  auto cluster = amp::testing::nats_cluster::start(3);
  auto server = server_process::start(with_secret({"--nats", cluster.urls()}));
  CHECK(contains(server.log(), "\"event\":\"backend_connected\""));
  // The Debian package is 2.9.10: the server says what a production cluster needs.
  REQUIRE(contains(server.log(), "\"event\":\"nats_version\""));
  CHECK(contains(server.log(), "\"level\":\"warn\""));
  CHECK(contains(server.log(), "nats-server 2.9.10 is in a cluster"));
  CHECK(contains(server.log(), "2.9.21 or later"));
  server.signal(SIGTERM);
  CHECK(server.wait_exit(10s) == 0);
}
