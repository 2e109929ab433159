#include "amp/gateway/config.hpp"

#include <catch2/catch.hpp>

#include <unistd.h>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace {

using namespace std::chrono_literals;
using amp::server_config;

server_config parse(std::string_view json) {
  auto c = amp::parse_server_config(json);
  INFO(json);
  if (!c) FAIL(c.error().message());
  return *std::move(c);
}

// The message of the error `json` must give (and that it is a bad_request).
std::string error_of(std::string_view json) {
  auto c = amp::parse_server_config(json);
  INFO(json);
  REQUIRE_FALSE(c.has_value());
  CHECK(c.error().code() == amp::errc::bad_request);
  return c.error().message();
}

std::string set_error(server_config& c, std::string_view key, std::string_view value) {
  const server_config before = c;
  auto r = amp::set_config_value(c, key, value);
  INFO(key << "=" << value);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == amp::errc::bad_request);
  CHECK(c == before);  // unchanged on error
  return r.error().message();
}

void set(server_config& c, std::string_view key, std::string_view value) {
  auto r = amp::set_config_value(c, key, value);
  INFO(key << "=" << value);
  if (!r) FAIL(r.error().message());
}

amp::namespace_name ns(std::string_view s) {
  return amp::namespace_name::make(s).value();
}

// A scratch directory removed at the end of the test.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    path = std::filesystem::temp_directory_path() /
           ("amp-config-test-" + std::to_string(::getpid()) + "-" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  std::string write(const std::string& name, std::string_view text) const {
    const auto p = path / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
};

}  // namespace

TEST_CASE("an empty object gives the defaults of spec section 11", "[config]") {
  const auto c = parse("{}");
  CHECK(c == server_config{});
  CHECK(c.listen_host == "127.0.0.1");
  CHECK(c.listen_port == 8080);
  CHECK(c.listen() == "127.0.0.1:8080");
  CHECK_FALSE(c.tls.enabled());
  CHECK_FALSE(c.nats.has_value());
  CHECK(c.auth.alg == amp::jwt_alg::hs256);
  CHECK_FALSE(c.auth.secret);
  CHECK_FALSE(c.auth.secret_file);
  CHECK_FALSE(c.auth.public_key_file);
  CHECK_FALSE(c.auth.audience);
  CHECK(c.auth.leeway_s == 30);
  CHECK(c.heartbeat_s == 10);
  CHECK(c.registry_ttl_s == 30);
  CHECK(c.inbox_ack_s == 30);
  CHECK(c.inbox_window == 64);
  CHECK(c.inbox_idle_s == 604800);
  CHECK(c.default_job == amp::job_settings{30, 3, 1000});
  CHECK(c.jobs.empty());
  CHECK(c.limits.max_frame_bytes == 1048576);
  CHECK(c.limits.max_body_bytes == 262144);
  CHECK(c.limits.max_sessions == 10000);
  CHECK(c.limits.max_subscriptions == 64);
  CHECK(c.default_policy.rate.per_s == 1000);
  CHECK(c.default_policy.rate.burst == 2000);
  CHECK(c.default_policy.rate.bytes_per_s == 10485760);
  CHECK_FALSE(c.default_policy.budget.per_day);
  CHECK(c.participant_policies.empty());
  CHECK(c.schemas.empty());
  CHECK(amp::check_server_config(c).has_value());
}

TEST_CASE("the full example of the spec parses to the defaults with NATS", "[config]") {
  const auto c = parse(R"({
    "listen": "127.0.0.1:8080",
    "tls": {"cert": null, "key": null},
    "nats": {"url": "nats://127.0.0.1:4222", "creds": null, "replicas": 1, "storage": "file"},
    "auth": {"alg": "HS256", "secret": null, "secret_file": null,
             "public_key_file": null, "audience": null, "leeway_s": 30},
    "heartbeat_s": 10, "registry_ttl_s": 30, "inbox_ack_s": 30, "inbox_window": 64,
    "jobs": {"*": {"lease_s": 30, "max_attempts": 3, "decline_delay_ms": 1000}},
    "limits": {"max_frame_bytes": 1048576, "max_body_bytes": 262144,
               "max_sessions": 10000, "max_subscriptions": 64},
    "policy": {"default": {"rate": {"per_s": 1000, "burst": 2000, "bytes_per_s": 10485760},
                           "budget": {"per_day": null}},
               "participants": {}},
    "schemas": {}
  })");
  server_config expected;
  expected.nats.emplace();
  CHECK(c == expected);
}

TEST_CASE("a section given in part keeps the defaults of the keys it leaves out", "[config]") {
  SECTION("top-level keys") {
    const auto c = parse(R"({"heartbeat_s": 5, "inbox_window": 8})");
    CHECK(c.heartbeat_s == 5);
    CHECK(c.inbox_window == 8);
    CHECK(c.registry_ttl_s == 30);
    CHECK(c.inbox_ack_s == 30);
    CHECK(c.inbox_idle_s == 604800);
  }
  SECTION("limits") {
    const auto c = parse(R"({"limits": {"max_sessions": 100}})");
    CHECK(c.limits.max_sessions == 100);
    CHECK(c.limits.max_frame_bytes == 1048576);
    CHECK(c.limits.max_body_bytes == 262144);
    CHECK(c.limits.max_subscriptions == 64);
  }
  SECTION("auth") {
    const auto c = parse(R"({"auth": {"secret": "s3cret", "audience": "amp"}})");
    CHECK(c.auth.alg == amp::jwt_alg::hs256);
    CHECK(c.auth.secret == "s3cret");
    CHECK(c.auth.audience == "amp");
    CHECK(c.auth.leeway_s == 30);
  }
  SECTION("EdDSA") {
    const auto c =
        parse(R"({"auth": {"alg": "EdDSA", "public_key_file": "k.pem", "leeway_s": 0}})");
    CHECK(c.auth.alg == amp::jwt_alg::eddsa);
    CHECK(c.auth.public_key_file == "k.pem");
    CHECK(c.auth.leeway_s == 0);
  }
  SECTION("tls") {
    const auto c = parse(R"({"tls": {"cert": "c.pem", "key": "k.pem"}})");
    CHECK(c.tls.enabled());
    CHECK(c.tls.cert == "c.pem");
    CHECK(c.tls.key == "k.pem");
    CHECK(parse(R"({"tls": null})").tls == server_config::tls_section{});
  }
  SECTION("rate and budget of the default policy") {
    const auto c = parse(R"({"policy": {"default": {"rate": {"per_s": 5}}}})");
    CHECK(c.default_policy.rate.per_s == 5);
    CHECK(c.default_policy.rate.burst == 2000);
    CHECK(c.default_policy.rate.bytes_per_s == 10485760);
    CHECK_FALSE(c.default_policy.budget.per_day);
    CHECK(parse(R"({"policy": {"default": {"budget": {"per_day": 0}}}})")
              .default_policy.budget.per_day == 0);
  }
  SECTION("an integer may be written as a number without fraction") {
    CHECK(parse(R"({"heartbeat_s": 5.0})").heartbeat_s == 5);
    CHECK(parse(R"({"limits": {"max_sessions": 1e3}})").limits.max_sessions == 1000);
  }
}

TEST_CASE("listen takes host:port, with IPv6 in brackets", "[config]") {
  auto c = parse(R"({"listen": "0.0.0.0:9000"})");
  CHECK(c.listen_host == "0.0.0.0");
  CHECK(c.listen_port == 9000);

  c = parse(R"({"listen": "[::1]:8443"})");
  CHECK(c.listen_host == "::1");
  CHECK(c.listen_port == 8443);
  CHECK(c.listen() == "[::1]:8443");

  c = parse(R"({"listen": "amp-gw.example.com:65535"})");
  CHECK(c.listen_host == "amp-gw.example.com");
  CHECK(c.listen_port == 65535);

  CHECK(parse(R"({"listen": "localhost:1"})").listen_port == 1);

  c = parse(R"({"listen": "[fe80::1%eth0]:80"})");  // a link-local address with its zone
  CHECK(c.listen_host == "fe80::1%eth0");
  CHECK(c.listen() == "[fe80::1%eth0]:80");
}

TEST_CASE("a bad listen value says what is wrong", "[config]") {
  const std::string hint =
      "; expected \"host:port\" with a port from 1 to 65535, e.g. \"127.0.0.1:8080\" or "
      "\"[::1]:8080\"";
  CHECK(error_of(R"({"listen": "localhost"})") ==
        "listen: the port is missing in \"localhost\"" + hint);
  CHECK(error_of(R"({"listen": "localhost:0"})") ==
        "listen: the port \"0\" is not from 1 to 65535 in \"localhost:0\"" + hint);
  CHECK(error_of(R"({"listen": "localhost:65536"})") ==
        "listen: the port \"65536\" is not from 1 to 65535 in \"localhost:65536\"" + hint);
  CHECK(error_of(R"({"listen": "localhost:http"})") ==
        "listen: the port \"http\" is not from 1 to 65535 in \"localhost:http\"" + hint);
  CHECK(error_of(R"({"listen": ":8080"})") == "listen: the host is missing in \":8080\"" + hint);
  CHECK(error_of(R"({"listen": "::1:8080"})") ==
        "listen: an IPv6 address must be written in brackets in \"::1:8080\"" + hint);
  CHECK(error_of(R"({"listen": "[::1]"})") == "listen: the port is missing in \"[::1]\"" + hint);
  CHECK(error_of(R"({"listen": "[::1:8080"})") ==
        "listen: the IPv6 address has no closing ']' in \"[::1:8080\"" + hint);
  CHECK(error_of(R"({"listen": "[::g]:8080"})") ==
        "listen: \"::g\" is not an IPv6 address in \"[::g]:8080\"" + hint);
  CHECK(error_of(R"({"listen": "300.1.1.1:8080"})") ==
        "listen: \"300.1.1.1\" is not an IPv4 address in \"300.1.1.1:8080\"" + hint);
  CHECK(error_of(R"({"listen": "my host:8080"})") ==
        "listen: \"my host\" is not a host name in \"my host:8080\"" + hint);
  CHECK(error_of(R"({"listen": 8080})") == "listen: must be a string \"host:port\", not 8080");
}

TEST_CASE("nats absent or null means the memory transport, an object means NATS", "[config]") {
  CHECK_FALSE(parse("{}").nats);
  CHECK_FALSE(parse(R"({"nats": null})").nats);

  const auto all_defaults = parse(R"({"nats": {}})");
  REQUIRE(all_defaults.nats);
  CHECK(*all_defaults.nats == server_config::nats_section{});
  CHECK(all_defaults.nats->url == "nats://127.0.0.1:4222");
  CHECK_FALSE(all_defaults.nats->creds);
  CHECK(all_defaults.nats->replicas == 1);
  CHECK(all_defaults.nats->storage == amp::storage_type::file);

  const auto c = parse(
      R"({"nats": {"url": "nats://a:4222,nats://b:4222", "replicas": 3, "storage": "memory",
                   "creds": "/etc/amp/amp.creds"}})");
  REQUIRE(c.nats);
  CHECK(c.nats->url == "nats://a:4222,nats://b:4222");
  CHECK(c.nats->replicas == 3);
  CHECK(c.nats->storage == amp::storage_type::memory);
  CHECK(c.nats->creds == "/etc/amp/amp.creds");
}

TEST_CASE("jobs: \"*\" and named jobs merge key by key, whatever their order", "[config]") {
  SECTION("a named job takes what it leaves out from the built-in \"*\"") {
    const auto c = parse(R"({"jobs": {"resize": {"lease_s": 10}}})");
    CHECK(c.default_job == amp::job_settings{});
    CHECK(c.job("resize") == amp::job_settings{10, 3, 1000});
    CHECK(c.job("other") == amp::job_settings{});
  }
  SECTION("\"*\" given in part, and a named job given before it") {
    const auto c = parse(
        R"({"jobs": {"resize": {"lease_s": 10}, "*": {"max_attempts": 5},
                     "thumbs": {"decline_delay_ms": 0, "max_attempts": 1}}})");
    CHECK(c.default_job == amp::job_settings{30, 5, 1000});
    CHECK(c.job("resize") == amp::job_settings{10, 5, 1000});
    CHECK(c.job("thumbs") == amp::job_settings{30, 1, 0});
    CHECK(c.job("anything") == amp::job_settings{30, 5, 1000});
  }
  SECTION("null removes an entry") {
    const auto c = parse(R"({"jobs": {"resize": null, "*": null}})");
    CHECK(c.jobs.empty());
    CHECK(c.default_job == amp::job_settings{});
  }
}

TEST_CASE("policy: a participant's entry merges over policy.default", "[config]") {
  const auto c = parse(R"({"policy": {
      "default": {"rate": {"per_s": 10, "burst": 20}, "budget": {"per_day": 1000}},
      "participants": {
        "bob": {"rate": {"burst": 1}},
        "carol": {"budget": {"per_day": null}},
        "dave": {},
        "erin": {"ops": {"per_s": 50}}
      }}})");
  CHECK(c.policy_for("erin").ops == amp::ops_policy{.per_s = 50, .burst = 20000});
  CHECK(c.policy_for("alice") == c.default_policy);
  CHECK(c.default_policy.rate.per_s == 10);
  CHECK(c.default_policy.rate.burst == 20);
  CHECK(c.default_policy.budget.per_day == 1000);

  const auto bob = c.policy_for("bob");
  CHECK(bob.rate.per_s == 10);
  CHECK(bob.rate.burst == 1);
  CHECK(bob.rate.bytes_per_s == 10485760);
  CHECK(bob.budget.per_day == 1000);
  CHECK(bob.ops == amp::ops_policy{});

  const auto carol = c.policy_for("carol");  // explicitly unlimited
  CHECK(carol.rate == c.default_policy.rate);
  CHECK_FALSE(carol.budget.per_day);

  CHECK(c.policy_for("dave") == c.default_policy);

  const auto pc = c.to_policy_config();
  CHECK(pc.default_policy == c.default_policy);
  REQUIRE(pc.participants.size() == 4);
  CHECK(pc.participants.at("bob") == bob);
  CHECK(pc.participants.at("carol") == carol);
  CHECK(pc.storage == amp::storage_type::memory);  // no nats section
}

TEST_CASE("schemas map message types to files", "[config]") {
  const auto c = parse(R"({"schemas": {"review.request": "schemas/review.json", "A-1_b": "x"}})");
  REQUIRE(c.schemas.size() == 2);
  CHECK(c.schemas.at("review.request") == "schemas/review.json");
  CHECK(c.schemas.at("A-1_b") == "x");
}

TEST_CASE("an unknown key is refused with its path", "[config]") {
  CHECK(error_of(R"({"listn": "x"})") == R"(unknown key "listn" (did you mean "listen"?))");
  CHECK(error_of(R"({"whatever": 1})") == R"(unknown key "whatever")");
  CHECK(error_of(R"({"limits": {"max_frames": 1}})") == R"(unknown key "limits.max_frames")");
  CHECK(error_of(R"({"limits": {"max_session": 1}})") ==
        R"(unknown key "limits.max_session" (did you mean "limits.max_sessions"?))");
  CHECK(error_of(R"({"nats": {"urls": "x"}})") ==
        R"(unknown key "nats.urls" (did you mean "nats.url"?))");
  CHECK(error_of(R"({"jobs": {"*": {"lease": 1}}})") ==
        R"(unknown key "jobs.*.lease" (did you mean "jobs.*.lease_s"?))");
  CHECK(error_of(R"({"jobs": {"resize": {"attempts": 1}}})") ==
        R"(unknown key "jobs.resize.attempts")");
  CHECK(error_of(R"({"policy": {"participants": {"bob": {"rate": {"per_sec": 1}}}}})") ==
        "unknown key \"policy.participants.bob.rate.per_sec\" "
        "(did you mean \"policy.participants.bob.rate.per_s\"?)");
  CHECK(error_of(R"({"policy": {"defaults": {}}})") ==
        R"(unknown key "policy.defaults" (did you mean "policy.default"?))");
  CHECK(error_of(R"({"tls": {"crt": "c"}})") ==
        R"(unknown key "tls.crt" (did you mean "tls.cert"?))");
  CHECK(error_of(R"({"auth": {"Secret": "c"}})") ==
        R"(unknown key "auth.Secret" (did you mean "auth.secret"?))");
  CHECK(error_of("{\"a\\u0001\": 1}") == R"(unknown key "a\x01")");
}

TEST_CASE("a key given twice is refused", "[config]") {
  CHECK(error_of(R"({"heartbeat_s": 5, "heartbeat_s": 6})") == R"(duplicate key "heartbeat_s")");
  CHECK(error_of(R"({"limits": {"max_sessions": 5, "max_sessions": 5}})") ==
        R"(duplicate key "limits.max_sessions")");
  CHECK(error_of(R"({"jobs": {"resize": {}, "resize": {}}})") == R"(duplicate key "jobs.resize")");
  CHECK(error_of(R"({"limits": {}, "limits": {}})") == R"(duplicate key "limits")");
}

TEST_CASE("a value of the wrong type is refused with its path", "[config]") {
  CHECK(error_of(R"({"heartbeat_s": "10"})") ==
        R"(heartbeat_s: must be an integer from 1 to 86400, not "10")");
  CHECK(error_of(R"({"heartbeat_s": 1.5})") ==
        "heartbeat_s: must be an integer from 1 to 86400, not 1.5");
  CHECK(error_of(R"({"inbox_idle_s": "3600"})") ==
        R"(inbox_idle_s: must be an integer from 60 to 31536000, not "3600")");
  CHECK(error_of(R"({"inbox_idle_s": null})") ==
        "inbox_idle_s: must be an integer from 60 to 31536000, not null");
  CHECK(error_of(R"({"limits": {"max_sessions": null}})") ==
        "limits.max_sessions: must be an integer from 1 to 1000000, not null");
  CHECK(error_of(R"({"limits": []})") == "limits: must be an object, not an array");
  CHECK(error_of(R"({"nats": true})") == "nats: must be an object or null, not true");
  CHECK(error_of(R"({"nats": {"url": 4222}})") ==
        "nats.url: must be a non-empty string without NUL, not 4222");
  CHECK(error_of(R"({"nats": {"storage": "ssd"}})") ==
        R"(nats.storage: must be "file" or "memory", not "ssd")");
  CHECK(error_of(R"({"nats": {"domain": "a.b"}})") ==
        R"(nats.domain: must be 1 to 64 letters, digits, - or _, or null; not "a.b")");
  CHECK(error_of(R"({"nats": {"domain": ""}})") ==
        R"(nats.domain: must be a non-empty string without NUL, or null; not "")");
  CHECK(error_of(R"({"nats": {"domain": "hub>"}})") ==
        R"(nats.domain: must be 1 to 64 letters, digits, - or _, or null; not "hub>")");
  CHECK(error_of(R"({"tls": "yes"})") == R"(tls: must be an object or null, not "yes")");
  CHECK(error_of(R"({"tls": {"cert": ""}})") ==
        R"(tls.cert: must be a non-empty string without NUL, or null; not "")");
  CHECK(error_of(R"({"jobs": {"resize": 5}})") == "jobs.resize: must be an object or null, not 5");
  CHECK(error_of(R"({"policy": {"default": {"rate": {"per_s": "5"}}}})") ==
        R"(policy.default.rate.per_s: must be a number greater than 0, not "5")");
  CHECK(error_of(R"({"policy": {"default": {"budget": {"per_day": "x"}}}})") ==
        R"(policy.default.budget.per_day: must be null or an integer of at least 0, not "x")");
  CHECK(error_of(R"({"schemas": {"t": 1}})") ==
        "schemas.t: must be a non-empty string without NUL, not 1");
  CHECK(error_of("[]") == "the configuration must be a JSON object, not an array");
  CHECK(error_of("null") == "the configuration must be a JSON object, not null");
}

TEST_CASE("a secret is never shown in a message", "[config]") {
  CHECK(error_of(R"({"auth": {"secret": 123456}})") ==
        "auth.secret: must be a non-empty string without NUL, or null; not a number");
  CHECK(error_of(R"({"auth": {"secret": ""}})") ==
        "auth.secret: must be a non-empty string without NUL, or null; not an empty string");
  CHECK(error_of("{\"auth\": {\"secret\": \"ab\\u0000cd\"}}") ==
        "auth.secret: must be a non-empty string without NUL, or null; not a string");
}

TEST_CASE("a value out of range is refused with its path and the range", "[config]") {
  CHECK(error_of(R"({"limits": {"max_frame_bytes": -5}})") ==
        "limits.max_frame_bytes: must be an integer from 1024 to 67108864, not -5");
  CHECK(error_of(R"({"limits": {"max_frame_bytes": 67108865}})") ==
        "limits.max_frame_bytes: must be an integer from 1024 to 67108864, not 67108865");
  CHECK(error_of(R"({"limits": {"max_body_bytes": 0}})") ==
        "limits.max_body_bytes: must be an integer from 1 to 67108864, not 0");
  CHECK(error_of(R"({"limits": {"max_sessions": 1000001}})") ==
        "limits.max_sessions: must be an integer from 1 to 1000000, not 1000001");
  CHECK(error_of(R"({"limits": {"max_subscriptions": 0}})") ==
        "limits.max_subscriptions: must be an integer from 1 to 10000, not 0");
  CHECK(error_of(R"({"limits": {"max_sessions": 18446744073709551615}})") ==
        "limits.max_sessions: must be an integer from 1 to 1000000, not 18446744073709551615");
  CHECK(error_of(R"({"heartbeat_s": 0})") ==
        "heartbeat_s: must be an integer from 1 to 86400, not 0");
  CHECK(error_of(R"({"registry_ttl_s": 86401})") ==
        "registry_ttl_s: must be an integer from 1 to 86400, not 86401");
  CHECK(error_of(R"({"inbox_ack_s": -1})") ==
        "inbox_ack_s: must be an integer from 1 to 86400, not -1");
  CHECK(error_of(R"({"inbox_window": 10001})") ==
        "inbox_window: must be an integer from 1 to 10000, not 10001");
  CHECK(error_of(R"({"inbox_idle_s": 59})") ==
        "inbox_idle_s: must be an integer from 60 to 31536000, not 59");
  CHECK(error_of(R"({"inbox_idle_s": 31536001})") ==
        "inbox_idle_s: must be an integer from 60 to 31536000, not 31536001");
  CHECK(error_of(R"({"inbox_idle_s": 0})") ==
        "inbox_idle_s: must be an integer from 60 to 31536000, not 0");
  CHECK(error_of(R"({"auth": {"leeway_s": 3601}})") ==
        "auth.leeway_s: must be an integer from 0 to 3600, not 3601");
  CHECK(error_of(R"({"nats": {"replicas": 6}})") ==
        "nats.replicas: must be an integer from 1 to 5, not 6");
  CHECK(error_of(R"({"jobs": {"*": {"lease_s": 0}}})") ==
        "jobs.*.lease_s: must be an integer from 1 to 86400, not 0");
  CHECK(error_of(R"({"jobs": {"resize": {"max_attempts": 101}}})") ==
        "jobs.resize.max_attempts: must be an integer from 1 to 100, not 101");
  CHECK(error_of(R"({"jobs": {"resize": {"decline_delay_ms": 86400001}}})") ==
        "jobs.resize.decline_delay_ms: must be an integer from 0 to 86400000, not 86400001");
  CHECK(error_of(R"({"policy": {"default": {"rate": {"per_s": 0}}}})") ==
        "policy.default.rate.per_s: must be a number greater than 0, not 0");
  CHECK(error_of(R"({"policy": {"participants": {"bob": {"rate": {"bytes_per_s": -1}}}}})") ==
        "policy.participants.bob.rate.bytes_per_s: must be a number greater than 0, not -1");
  CHECK(error_of(R"({"policy": {"default": {"rate": {"burst": 0.5}}}})") ==
        "policy.default.rate.burst: must be a number of at least 1, not 0.5");
  CHECK(error_of(R"({"policy": {"default": {"ops": {"per_s": 0}}}})") ==
        "policy.default.ops.per_s: must be a number greater than 0, not 0");
  CHECK(error_of(R"({"policy": {"participants": {"bob": {"ops": {"burst": 9}}}}})") ==
        "policy.participants.bob.ops.burst: must be a number of at least 10, not 9");
  CHECK_THAT(error_of(R"({"policy": {"default": {"ops": {"rate": 1}}}})"),
             Catch::Contains("policy.default.ops.rate"));
  CHECK(error_of(R"({"policy": {"default": {"budget": {"per_day": -1}}}})") ==
        "policy.default.budget.per_day: must be null or an integer of at least 0, not -1");
  CHECK(error_of(R"({"policy": {"default": {"budget": {"per_day": 2.5}}}})") ==
        "policy.default.budget.per_day: must be null or an integer of at least 0, not 2.5");
  // The edges are inside.
  const auto edges = parse(R"({"limits": {"max_frame_bytes": 1024, "max_body_bytes": 1024,
      "max_sessions": 1000000, "max_subscriptions": 10000}, "auth": {"leeway_s": 3600},
      "nats": {"replicas": 5}, "heartbeat_s": 86399, "registry_ttl_s": 86400,
      "jobs": {"*": {"lease_s": 86400, "max_attempts": 100, "decline_delay_ms": 86400000}},
      "policy": {"default": {"rate": {"burst": 1, "per_s": 0.001}, "budget": {"per_day": 0}}}})");
  CHECK(edges.limits.max_frame_bytes == 1024);
  CHECK(edges.default_job == amp::job_settings{86400, 100, 86400000});
}

TEST_CASE("the rules between keys are checked", "[config]") {
  CHECK(error_of(R"({"tls": {"cert": "c.pem"}})") == "tls.key: required when tls.cert is given");
  CHECK(error_of(R"({"tls": {"key": "k.pem"}})") == "tls.cert: required when tls.key is given");
  CHECK(error_of(R"({"nats": {"tls": {"cert": "c.pem"}}})") ==
        "nats.tls.key: required when nats.tls.cert is given");
  CHECK(error_of(R"({"nats": {"tls": {"key": "k.pem", "ca": "ca.pem"}}})") ==
        "nats.tls.cert: required when nats.tls.key is given");
  CHECK(error_of(R"({"nats": {"tls": {"ca": ""}}})") ==
        R"(nats.tls.ca: must be a non-empty string without NUL, or null; not "")");
  CHECK(error_of(R"({"nats": {"tls": {"crt": "c.pem"}}})").find("nats.tls.crt") !=
        std::string::npos);
  CHECK(error_of(R"({"auth": {"secret": "s", "secret_file": "f"}})") ==
        "auth.secret_file: give auth.secret or auth.secret_file, not both");
  CHECK(error_of(R"({"auth": {"secret": "s", "public_key_file": "k.pem"}})") ==
        R"(auth.public_key_file: only used with auth.alg "EdDSA", and auth.alg is "HS256")");
  CHECK(error_of(R"({"auth": {"alg": "EdDSA"}})") ==
        R"(auth.public_key_file: required when auth.alg is "EdDSA")");
  CHECK(error_of(R"({"auth": {"alg": "EdDSA", "public_key_file": "k", "secret": "s"}})") ==
        R"(auth.secret: only used with auth.alg "HS256", and auth.alg is "EdDSA")");
  CHECK(error_of(R"({"auth": {"alg": "EdDSA", "public_key_file": "k", "secret_file": "s"}})") ==
        R"(auth.secret_file: only used with auth.alg "HS256", and auth.alg is "EdDSA")");
  CHECK(error_of(R"({"heartbeat_s": 30})") ==
        "registry_ttl_s: must be greater than heartbeat_s (30), not 30");
  CHECK(error_of(R"({"limits": {"max_body_bytes": 2000000}})") ==
        "limits.max_body_bytes: must be at most limits.max_frame_bytes (1048576), not 2000000");
  // HS256 without any secret parses: the server refuses to start with it.
  CHECK_FALSE(parse(R"({"auth": {"alg": "HS256"}})").auth.secret);
}

TEST_CASE("auth.alg is HS256 or EdDSA exactly", "[config]") {
  CHECK(error_of(R"({"auth": {"alg": "RS256"}})") ==
        R"(auth.alg: must be "HS256" or "EdDSA", not "RS256")");
  CHECK(error_of(R"({"auth": {"alg": "hs256"}})") ==
        R"(auth.alg: must be "HS256" or "EdDSA", not "hs256")");
  CHECK(error_of(R"({"auth": {"alg": "none"}})") ==
        R"(auth.alg: must be "HS256" or "EdDSA", not "none")");
  CHECK(error_of(R"({"auth": {"alg": null}})") ==
        R"(auth.alg: must be "HS256" or "EdDSA", not null)");
}

TEST_CASE("job, participant and message type names must be valid", "[config]") {
  CHECK(error_of(R"({"jobs": {"Resize": {}}})") ==
        "jobs: job name \"Resize\": upper case 'R' at position 0 (allowed: a-z, 0-9, '_', '-'; "
        "must start with a letter)");
  CHECK(error_of(R"({"jobs": {"img.resize": {}}})").starts_with("jobs: job name \"img.resize\": "));
  CHECK(error_of(R"({"jobs": {"": {}}})") == "jobs: job name is empty");
  CHECK(error_of(R"({"jobs": {"**": {}}})").starts_with("jobs: job name \"**\": "));
  CHECK(error_of(R"({"policy": {"participants": {"$broker": {}}}})")
            .starts_with("policy.participants: participant name \"$broker\": "));
  CHECK(error_of(R"({"policy": {"participants": {"Bob": {}}}})")
            .starts_with("policy.participants: participant name \"Bob\": upper case 'B'"));
  CHECK(error_of(R"({"schemas": {"review request": "x"}})") ==
        "schemas: message type \"review request\": whitespace ' ' at position 6 (allowed: A-Z, "
        "a-z, 0-9, '.', '_', '-'; must start with a letter or digit)");
  CHECK(error_of(R"({"schemas": {".review": "x"}})")
            .starts_with("schemas: message type \".review\": "));
  CHECK(error_of(R"({"schemas": {"": "x"}})") == "schemas: message type is empty");
  CHECK(error_of(R"({"schemas": {")" + std::string(129, 'a') + R"(": "x"}})")
            .ends_with(": is 129 characters (at most 128)"));
  CHECK(parse(R"({"schemas": {")" + std::string(128, 'a') + R"(": "x"}})").schemas.size() == 1);
}

TEST_CASE("text that is not JSON is refused with the parser's description", "[config]") {
  CHECK(error_of("").starts_with("not valid JSON: "));
  CHECK(error_of("{").starts_with("not valid JSON: "));
  CHECK(error_of(R"({"listen": "a:1",})").starts_with("not valid JSON: "));
  CHECK(error_of("{} {}").starts_with("not valid JSON: "));
  CHECK(error_of("// comment\n{}").starts_with("not valid JSON: "));
  CHECK(error_of(R"({"heartbeat_s": 1e400})").starts_with("not valid JSON: "));
}

TEST_CASE("a UTF-8 byte order mark before the object is ignored", "[config]") {
  CHECK(parse("\xEF\xBB\xBF{\"heartbeat_s\": 5}").heartbeat_s == 5);
}

TEST_CASE("set_config_value overrides one key, with the file's checks", "[config]") {
  server_config c;
  set(c, "limits.max_sessions", "100");
  CHECK(c.limits.max_sessions == 100);
  set(c, "listen", R"("0.0.0.0:9000")");
  CHECK(c.listen() == "0.0.0.0:9000");
  set(c, "auth.secret", R"("s3cret")");
  CHECK(c.auth.secret == "s3cret");
  set(c, "auth.secret", "null");
  CHECK_FALSE(c.auth.secret);

  SECTION("a key inside nats selects NATS, null goes back to memory") {
    set(c, "nats.url", R"("nats://n1:4222")");
    REQUIRE(c.nats);
    CHECK(c.nats->url == "nats://n1:4222");
    CHECK(c.nats->replicas == 1);
    set(c, "nats", "null");
    CHECK_FALSE(c.nats);
    set(c, "nats", "{}");
    CHECK(c.nats == server_config::nats_section{});
  }
  SECTION("an object merges as in the file; null removes an entry") {
    set(c, "jobs.resize", R"({"lease_s": 10})");
    set(c, "jobs.resize.max_attempts", "7");
    CHECK(c.job("resize") == amp::job_settings{10, 7, 1000});
    set(c, "jobs.*.decline_delay_ms", "0");  // reaches the named job, which left it out
    CHECK(c.job("resize") == amp::job_settings{10, 7, 0});
    set(c, "jobs.resize", "null");
    CHECK(c.jobs.empty());

    set(c, "policy.participants.bob.rate.per_s", "3");
    set(c, "policy.default.rate.burst", "4");
    CHECK(c.policy_for("bob").rate.per_s == 3);
    CHECK(c.policy_for("bob").rate.burst == 4);
    set(c, "policy.participants.bob", "null");
    CHECK(c.participant_policies.empty());
  }
  SECTION("after schemas. the rest is one message type, dots included") {
    set(c, "schemas.review.request", R"("review.json")");
    REQUIRE(c.schemas.size() == 1);
    CHECK(c.schemas.at("review.request") == "review.json");
    set(c, "schemas.review.request", "null");
    CHECK(c.schemas.empty());
  }
  SECTION("errors name the key, and leave the configuration as it was") {
    CHECK(set_error(c, "limits.max_sessions", "0") ==
          "limits.max_sessions: must be an integer from 1 to 1000000, not 0");
    CHECK(set_error(c, "limits.max_session", "5") ==
          R"(unknown key "limits.max_session" (did you mean "limits.max_sessions"?))");
    CHECK(set_error(c, "limits", R"({"max_sessions": 5, "bogus": 1})") ==
          R"(unknown key "limits.bogus")");
    CHECK(set_error(c, "listen", "0.0.0.0:9000").starts_with("listen: not valid JSON: "));
    CHECK(set_error(c, "listen", "0.0.0.0:9000")
              .ends_with("(the value is JSON: write a string in double quotes)"));
    CHECK(set_error(c, "auth.alg", "EdDSA").ends_with("write a string in double quotes)"));
    CHECK(set_error(c, "auth.alg", R"("RS256")") ==
          R"(auth.alg: must be "HS256" or "EdDSA", not "RS256")");
    CHECK(set_error(c, "jobs.Resize.lease_s", "5").starts_with("jobs: job name \"Resize\""));
    CHECK(set_error(c, "heartbeat_s", R"("5")") ==
          R"(heartbeat_s: must be an integer from 1 to 86400, not "5")");
    CHECK(set_error(c, "limits..max_sessions", "5") ==
          "limits..max_sessions: not a key (an empty part between dots)");
    CHECK(set_error(c, "", "5") == "\"\": not a key (an empty part between dots)");
    CHECK(set_error(c, "heartbeat_s", "5, \"x\": 1").starts_with("heartbeat_s: not valid JSON"));
    CHECK(set_error(c, "heartbeat_s", "").starts_with("heartbeat_s: not valid JSON"));
  }
}

TEST_CASE("rules between keys wait for check_server_config after overrides", "[config]") {
  server_config c;
  set(c, "tls.cert", R"("c.pem")");  // the key comes with the next override
  CHECK(amp::check_server_config(c).error().message() ==
        "tls.key: required when tls.cert is given");
  set(c, "tls.key", R"("k.pem")");
  CHECK(amp::check_server_config(c).has_value());

  set(c, "auth.alg", R"("EdDSA")");
  CHECK(amp::check_server_config(c).error().message() ==
        R"(auth.public_key_file: required when auth.alg is "EdDSA")");
  set(c, "auth.public_key_file", R"("pub.pem")");
  CHECK(amp::check_server_config(c).has_value());
}

TEST_CASE("check_server_config refuses a configuration built badly by hand", "[config]") {
  auto message = [](const server_config& c) {
    auto r = amp::check_server_config(c);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == amp::errc::bad_request);
    return r.error().message();
  };
  server_config c;
  c.limits.max_frame_bytes = 10;
  CHECK(message(c) == "limits.max_frame_bytes: must be an integer from 1024 to 67108864, not 10");

  c = {};
  c.jobs["Bad"] = {};
  CHECK(message(c).starts_with("jobs: job name \"Bad\""));

  c = {};
  c.inbox_idle_s = 30;
  CHECK(message(c) == "inbox_idle_s: must be an integer from 60 to 31536000, not 30");

  c = {};
  c.jobs["resize"].lease_s = 0;
  CHECK(message(c) == "jobs.resize.lease_s: must be an integer from 1 to 86400, not 0");

  c = {};
  c.participant_policies["bob"].burst = 0;
  CHECK(message(c) == "policy.participants.bob.rate.burst: must be a number of at least 1, not 0");

  c = {};
  c.listen_port = 0;
  CHECK(message(c) == "listen: the port must be from 1 to 65535, not 0");

  c = {};
  c.listen_host = "";
  CHECK(message(c).starts_with("listen: the host is missing"));

  c = {};
  c.nats.emplace().url = "nats://a:1, nats://b:2";
  CHECK(message(c).starts_with("nats.url: must be a URL"));

  c = {};
  c.schemas["a b"] = "x";
  CHECK(message(c).starts_with("schemas: message type \"a b\""));
}

TEST_CASE("retention: defaults, keys, per-namespace entries and their errors", "[config]") {
  const amp::server_config d;
  CHECK(d.retention.task_s == 86400);
  CHECK(d.retention.inbox == amp::stream_limits{.max_age_s = 604800, .max_bytes = 0});
  CHECK(d.retention.topics == amp::stream_limits{.max_age_s = 86400, .max_bytes = 0});
  const auto b = d.broker_for(ns("demo"));
  CHECK(b.task_retention == 24h);
  CHECK(b.inbox_max_age == 168h);
  CHECK(b.inbox_max_bytes == -1);
  CHECK(b.topic_max_age == 24h);
  CHECK(b.topic_max_bytes == -1);

  const auto c = parse(R"({"retention": {"task_s": 172800,
      "inbox": {"max_bytes": 1073741824},
      "topics": {"max_age_s": 0},
      "namespaces": {"busy": {"inbox": {"max_age_s": 3600}, "topics": {"max_bytes": 2097152}}}}})");
  const auto other = c.broker_for(ns("demo"));
  CHECK(other.task_retention == 48h);
  CHECK(other.inbox_max_age == 168h);  // left out: the default
  CHECK(other.inbox_max_bytes == 1073741824);
  CHECK(other.topic_max_age == 0s);  // no age limit
  CHECK(other.topic_max_bytes == -1);
  const auto busy = c.broker_for(ns("busy"));
  CHECK(busy.task_retention == 48h);
  CHECK(busy.inbox_max_age == 1h);
  CHECK(busy.inbox_max_bytes == 1073741824);  // from retention.inbox
  CHECK(busy.topic_max_age == 0s);
  CHECK(busy.topic_max_bytes == 2097152);
  // null removes a namespace's entry.
  auto removed = c;
  REQUIRE(amp::set_config_value(removed, "retention.namespaces.busy", "null"));
  CHECK(removed.retention.namespaces.empty());

  CHECK(error_of(R"({"retention": {"task_s": 59}})") ==
        "retention.task_s: must be an integer from 60 to 315360000, not 59");
  CHECK(parse(R"({"retention": {"task_s": 60}})").broker_for(ns("demo")).task_retention == 60s);
  CHECK(error_of(R"({"retention": {"inbox": {"max_age_s": 30}}})") ==
        "retention.inbox.max_age_s: must be 0 (no limit) or at least 60, not 30");
  CHECK(error_of(R"({"retention": {"topics": {"max_bytes": 1000}}})") ==
        "retention.topics.max_bytes: must be 0 (no limit) or at least 1048576, not 1000");
  CHECK(error_of(R"({"retention": {"inbox": {"max_bytes": -1}}})") ==
        "retention.inbox.max_bytes: must be an integer from 0 to 1125899906842624, not -1");
  CHECK(error_of(R"({"retention": {"namespaces": {"Busy": {}}}})")
            .starts_with("retention.namespaces: namespace \"Busy\": upper case"));
  CHECK(error_of(R"({"retention": {"namespaces": {"busy": {"inbox": {"max_age_s": 1}}}}})") ==
        "retention.namespaces.busy.inbox.max_age_s: must be 0 (no limit) or at least 60, not 1");
  CHECK(error_of(R"({"retention": {"namespaces": {"busy": {"queue": {}}}}})")
            .starts_with("unknown key \"retention.namespaces.busy.queue\""));
  CHECK(error_of(R"({"retention": {"task_s": "1d"}})") ==
        "retention.task_s: must be an integer from 60 to 315360000, not \"1d\"");

  auto built = amp::server_config{};
  built.retention.namespaces["busy"].topics.max_age_s = 5;
  auto refused = amp::check_server_config(built);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().message() ==
        "retention.namespaces.busy.topics.max_age_s: must be 0 (no limit) or at least 60, not 5");
}

TEST_CASE("broker_for maps the settings to the broker configuration of a namespace", "[config]") {
  SECTION("memory transport") {
    const auto c = parse(R"({"inbox_ack_s": 45, "inbox_window": 16, "registry_ttl_s": 20,
        "heartbeat_s": 5, "inbox_idle_s": 3600,
        "jobs": {"*": {"lease_s": 60, "decline_delay_ms": 250}, "resize": {"max_attempts": 9}}})");
    const auto b = c.broker_for(ns("demo"));
    CHECK(b.ns == ns("demo"));
    CHECK(b.storage == amp::storage_type::memory);
    CHECK(b.replicas == 1);
    CHECK(b.inbox_ack_wait == 45s);
    CHECK(b.inbox_window == 16);
    CHECK(b.inbox_idle_consumer == 3600s);
    CHECK(b.registry_ttl == 20s);
    CHECK(b.default_job == amp::job_config{60s, 3, 250ms});
    REQUIRE(b.jobs.size() == 1);
    CHECK(b.jobs.at("resize") == amp::job_config{60s, 9, 250ms});
    CHECK(b.job(amp::job_name::make("resize").value()).max_attempts == 9);
    CHECK(b.job(amp::job_name::make("other").value()) == b.default_job);
    // What the file does not set keeps the broker's defaults.
    const amp::broker_config d{.ns = ns("demo")};
    CHECK(b.duplicate_window == d.duplicate_window);
    CHECK(b.topic_max_age == d.topic_max_age);
    CHECK(b.workers == d.workers);
  }
  SECTION("NATS") {
    const auto c = parse(R"({"nats": {"replicas": 3, "storage": "memory"}})");
    const auto b = c.broker_for(ns("other"));
    CHECK(b.storage == amp::storage_type::memory);
    CHECK(b.replicas == 3);
    CHECK(parse(R"({"nats": {}})").broker_for(ns("x")).storage == amp::storage_type::file);
    CHECK(parse(R"({"nats": {}})").to_policy_config().storage == amp::storage_type::file);
    const auto defaults = parse("{}").broker_for(ns("x"));
    CHECK(defaults.inbox_ack_wait == 30s);
    CHECK(defaults.inbox_window == 64);
    CHECK(defaults.inbox_idle_consumer == std::chrono::hours(24 * 7));
    CHECK(defaults.registry_ttl == 30s);
    CHECK(defaults.default_job == amp::job_config{});
    CHECK(defaults.jobs.empty());
  }
}

TEST_CASE("load_server_config reads a file and resolves its relative paths", "[config]") {
  temp_dir dir;
  const auto file = dir.write("conf/amp.json", R"({
    "tls": {"cert": "tls/cert.pem", "key": "/abs/key.pem"},
    "nats": {"creds": "amp.creds", "tls": {"ca": "ca.pem", "cert": "c.pem", "key": "/k.pem"}},
    "auth": {"secret_file": "secret.txt"},
    "schemas": {"review.request": "schemas/review.json"},
    "limits": {"max_sessions": 7}})");
  auto c = amp::load_server_config(file);
  REQUIRE(c.has_value());
  const auto base = dir.path / "conf";
  CHECK(c->limits.max_sessions == 7);
  CHECK(c->tls.cert == (base / "tls/cert.pem").string());
  CHECK(c->tls.key == "/abs/key.pem");
  CHECK(c->nats->creds == (base / "amp.creds").string());
  CHECK(c->nats->tls_ca == (base / "ca.pem").string());
  CHECK(c->nats->tls_cert == (base / "c.pem").string());
  CHECK(c->nats->tls_key == "/k.pem");
  CHECK(c->auth.secret_file == (base / "secret.txt").string());
  CHECK(c->schemas.at("review.request") == (base / "schemas/review.json").string());
}

TEST_CASE("load_server_config says which file it cannot read or parse", "[config]") {
  temp_dir dir;
  const auto missing = (dir.path / "missing.json").string();
  auto r = amp::load_server_config(missing);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == amp::errc::bad_request);
  CHECK(r.error().message() == "cannot read " + missing + ": No such file or directory");

  r = amp::load_server_config(dir.path.string());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message() == "cannot read " + dir.path.string() + ": Is a directory");

  const auto bad = dir.write("bad.json", R"({"limits": {"max_frame_bytes": -5}})");
  r = amp::load_server_config(bad);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message() ==
        bad + ": limits.max_frame_bytes: must be an integer from 1024 to 67108864, not -5");
}
