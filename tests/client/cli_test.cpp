// The `amp` command line: parsing (client/cli_args.hpp), `amp token` checked by the
// authenticator, and the binary itself against the scripted server.

#include <catch2/catch.hpp>

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "amp/gateway/auth.hpp"
#include "cli_args.hpp"
#include "client/fake_server.hpp"
#include "client/run_amp.hpp"
#include "process.hpp"
#include "support/checks.hpp"

namespace {

using namespace std::chrono_literals;
using amp::client_frame;
using amp::errc;
using amp::testing::after_hello;
using amp::testing::code_of;
using amp::testing::fake_server;
using amp::testing::lines_of;
using amp::testing::must;
using amp::testing::ok_for;
using amp::testing::run_amp;
using peer = fake_server::peer;
namespace cli = amp::cli;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------
// Helpers

/// An environment with just `vars`.
cli::env_lookup env_of(std::map<std::string, std::string> vars = {}) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

amp::result<cli::command> parse(std::vector<std::string> args,
                                std::map<std::string, std::string> env = {{"AMP_TOKEN", "tok"}}) {
  return cli::parse_command_line(args, env_of(std::move(env)));
}

template <class T>
T parse_as(std::vector<std::string> args,
           std::map<std::string, std::string> env = {{"AMP_TOKEN", "tok"}}) {
  auto command = must(parse(std::move(args), std::move(env)));
  REQUIRE(std::holds_alternative<T>(command));
  return std::get<T>(std::move(command));
}

/// The message of a parse that must fail.
std::string parse_error(std::vector<std::string> args,
                        std::map<std::string, std::string> env = {{"AMP_TOKEN", "tok"}}) {
  auto command = parse(std::move(args), std::move(env));
  REQUIRE(code_of(command) == errc::bad_request);
  return command.error().message();
}

/// A temporary directory that goes away with the object.
class temp_dir {
 public:
  temp_dir() {
    std::random_device random;
    path_ = fs::temp_directory_path() /
            ("amp-cli-test-" + std::to_string(::getpid()) + "-" + std::to_string(random()));
    fs::create_directories(path_);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const std::string& content) const {
    const auto file = path_ / name;
    std::ofstream(file, std::ios::binary) << content;
    return file.string();
  }

 private:
  fs::path path_;
};

struct ed25519_pems {
  std::string private_pem;
  std::string public_pem;
};

ed25519_pems make_ed25519() {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"), EVP_PKEY_free);
  REQUIRE(key);
  auto to_pem = [&](bool is_private) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
    if (is_private) {
      PEM_write_bio_PrivateKey(bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr);
    } else {
      PEM_write_bio_PUBKEY(bio.get(), key.get());
    }
    char* data = nullptr;
    const long size = BIO_get_mem_data(bio.get(), &data);
    return std::string(data, static_cast<std::size_t>(size));
  };
  return {to_pem(true), to_pem(false)};
}

amp::identity verify(const std::string& token, const amp::auth_config& config) {
  auto checker = must(amp::authenticator::make(config));
  return must(checker.verify(token, std::chrono::system_clock::now()));
}

amp::auth_config hs256(std::string secret) {
  amp::auth_config c;
  c.secret = std::move(secret);
  return c;
}

/// `--url` and `--token` for the scripted server.
std::vector<std::string> with_server(const fake_server& s, std::vector<std::string> args) {
  args.insert(args.begin() + 1, {"--url", s.url(), "--token", "tok"});
  return args;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Parsing

TEST_CASE("amp send: options, body and connection are parsed", "[cli]") {
  auto s =
      parse_as<cli::send_args>({"send", "--to", "bob", "--type=review.request", "--msg-id", "m-1",
                                "--reply-to", "alice", "--correlation", "c-1", R"({"x":1})"});
  CHECK(s.to == "bob");
  CHECK(s.options.type == "review.request");
  CHECK(s.options.msg_id == "m-1");
  CHECK(s.options.reply_to == "alice");
  CHECK(s.options.correlation == "c-1");
  CHECK(s.body == R"({"x":1})");
  CHECK(s.connection.url == "ws://127.0.0.1:8080/amp");
  CHECK(s.connection.token == "tok");

  // A negative number and "-" are bodies, and so is anything after --.
  CHECK(parse_as<cli::send_args>({"send", "--to", "bob", "-5"}).body == "-5");
  CHECK(parse_as<cli::send_args>({"send", "--to", "bob", "-"}).body == "-");
  CHECK(parse_as<cli::send_args>({"send", "--to", "bob", "--", "-5"}).body == "-5");
}

TEST_CASE("the connection comes from --url and --token, else AMP_URL and AMP_TOKEN", "[cli]") {
  auto from_env =
      parse_as<cli::who_args>({"who"}, {{"AMP_URL", "ws://h:1/amp"}, {"AMP_TOKEN", "e"}});
  CHECK(from_env.connection.url == "ws://h:1/amp");
  CHECK(from_env.connection.token == "e");
  auto from_options = parse_as<cli::who_args>({"who", "--url", "wss://x/amp", "--token", "o"},
                                              {{"AMP_URL", "ws://h:1/amp"}, {"AMP_TOKEN", "e"}});
  CHECK(from_options.connection.url == "wss://x/amp");
  CHECK(from_options.connection.token == "o");
  CHECK(from_env.connection.verify_peer);
  CHECK(from_env.connection.ca_file.empty());
  auto tls = parse_as<cli::who_args>({"who", "--ca-file", "ca.pem"});
  CHECK(tls.connection.ca_file == "ca.pem");
  CHECK_FALSE(parse_as<cli::who_args>({"who", "--insecure"}).connection.verify_peer);
  CHECK(parse_error({"who", "--insecure", "--ca-file", "x"}) ==
        "who: give --ca-file or --insecure, not both");
  CHECK_THAT(parse_error({"who"}, {}), Catch::Contains("no token"));
  CHECK_THAT(parse_error({"who"}, {{"AMP_TOKEN", ""}}), Catch::Contains("no token"));
}

TEST_CASE("usage errors name the command and what is wrong", "[cli]") {
  CHECK_THAT(parse_error({}), Catch::Contains("no command"));
  CHECK_THAT(parse_error({"snd"}), Catch::Contains("unknown command \"snd\""));
  CHECK(parse_error({"send", "1"}) == "send: --to is required");
  CHECK(parse_error({"send", "--to", "bob"}) == "send: expected one BODY_JSON argument, got 0");
  CHECK(parse_error({"send", "--to", "bob", "1", "2"}) ==
        "send: expected one BODY_JSON argument, got 2");
  CHECK_THAT(parse_error({"send", "--to", "bob", "{x"}), Catch::StartsWith("send: BODY_JSON: "));
  CHECK(parse_error({"send", "--to", "bob", "--to", "carol", "1"}) == "send: --to given twice");
  CHECK(parse_error({"send", "--tx", "bob", "1"}) == "send: unknown option --tx");
  CHECK(parse_error({"send", "-x", "1"}) == "send: unknown option -x");
  CHECK(parse_error({"send", "1", "--to"}) == "send: --to needs a value (P)");
  CHECK(parse_error({"listen", "--no-ack=yes"}) == "listen: --no-ack takes no value");
  CHECK_THAT(parse_error({"listen", "--count", "0"}),
             Catch::Contains("--count must be an integer"));
  CHECK_THAT(parse_error({"listen", "--count", "2x"}), Catch::Contains("not \"2x\""));
  CHECK(parse_error({"listen", "extra"}) == "listen: unexpected argument \"extra\"");
  CHECK(parse_error({"submit", "--job", "j", "--timeout", "5", "1"}) ==
        "submit: --timeout needs --wait");
  CHECK_THAT(parse_error({"submit", "--job", "j", "--wait", "--timeout", "-1", "1"}),
             Catch::Contains("--timeout must be"));
  CHECK_THAT(parse_error({"submit", "--job", "j", "--max-attempts", "101", "1"}),
             Catch::Contains("from 1 to 100"));
  CHECK_THAT(parse_error({"sub", "--topic", "a", "--from", "seq:0"}),
             Catch::StartsWith("sub: --from: "));
  CHECK(parse_error({"task"}) == "task: expected one ID argument, got 0");
  CHECK(parse_error({"work", "--job", "j"}) == "work: no COMMAND to run (give it after --)");
  CHECK_THAT(parse_error({"work", "--job", "j", "--slots", "0", "--", "cat"}),
             Catch::Contains("--slots must be an integer from 1 to 1024"));
  CHECK(parse_error({"token", "--sub", "a", "--ns", "d"}) ==
        "token: give exactly one of --secret, --secret-file and --key-file");
  CHECK(parse_error({"token", "--secret", "s", "--key-file", "k", "--sub", "a", "--ns", "d"}) ==
        "token: give exactly one of --secret, --secret-file and --key-file");
  CHECK_THAT(parse_error({"token", "--secret", "s", "--sub", "a", "--ns", "D"}),
             Catch::StartsWith("token: --ns: "));
  CHECK(parse_error({"token", "--secret", "s", "--sub", "a", "--ns", "d", "--all", "--grants",
                     "{}"}) == "token: give --grants or --all, not both");
  CHECK(parse_error({"token", "--secret", "s", "--sub", "a", "--ns", "d", "--grants", "[]"}) ==
        "token: --grants: not a JSON object");
  CHECK_THAT(parse_error({"token", "--secret", "s", "--sub", "a", "--ns", "d", "--grants",
                          R"({"publish":["News"]})"}),
             Catch::StartsWith("token: --grants: "));
}

TEST_CASE("amp work takes the command after -- or at the first argument that is not an option",
          "[cli]") {
  auto w =
      parse_as<cli::work_args>({"work", "--job", "resize", "--job", "thumb", "--slots", "4",
                                "--count", "10", "--", "convert", "-resize", "50%", "--", "x"});
  CHECK(w.jobs == std::vector<std::string>{"resize", "thumb"});
  CHECK(w.slots == 4);
  CHECK(w.count == 10);
  CHECK(w.command == std::vector<std::string>{"convert", "-resize", "50%", "--", "x"});

  auto bare = parse_as<cli::work_args>({"work", "--job", "j", "sh", "-c", "cat", "--help"});
  CHECK(bare.command == std::vector<std::string>{"sh", "-c", "cat", "--help"});
  CHECK(bare.slots == 1);
  CHECK(bare.count == 0);
}

TEST_CASE("the other commands read their options", "[cli]") {
  auto l = parse_as<cli::listen_args>({"listen", "--count", "3", "--no-ack"});
  CHECK(l.count == 3);
  CHECK_FALSE(l.ack);
  CHECK(parse_as<cli::listen_args>({"listen"}).ack);

  auto s = parse_as<cli::submit_args>({"submit", "--job", "resize", "--type", "img",
                                       "--max-attempts", "5", "--key", "order-42", "--wait",
                                       "--timeout", "2.5", R"({"w":640})"});
  CHECK(s.job == "resize");
  CHECK(s.options.type == "img");
  CHECK(s.options.max_attempts == 5);
  CHECK(s.options.idempotency_key == "order-42");
  CHECK(s.wait);
  CHECK(s.timeout_s == 2.5);
  CHECK(parse_as<cli::submit_args>({"submit", "--job", "j", "1"}).options.max_attempts == 0);

  auto p = parse_as<cli::pub_args>({"pub", "--topic", "news.eu", "--msg-id", "e1", "\"x\""});
  CHECK(p.topic == "news.eu");
  CHECK(p.options.msg_id == "e1");
  CHECK(p.body == "\"x\"");

  auto sub =
      parse_as<cli::sub_args>({"sub", "--topic", "news.>", "--from", "seq:7", "--count", "2"});
  CHECK(sub.topic == "news.>");
  CHECK(sub.from.to_json() == R"({"seq":7})");
  CHECK(sub.count == 2);
  CHECK(parse_as<cli::sub_args>({"sub", "--topic", "a"}).from.to_json() == R"("new")");

  CHECK(parse_as<cli::who_args>({"who", "--job", "resize"}).job == "resize");
  auto t = parse_as<cli::task_args>({"task", "t_1", "--history"});
  CHECK(t.task == "t_1");
  CHECK(t.history);
  CHECK(parse_as<cli::cancel_args>({"cancel", "t_2"}).task == "t_2");

  auto token = parse_as<cli::token_args>({"token", "--secret", "s", "--sub", "alice", "--ns",
                                          "demo", "--ttl", "60", "--aud", "amp", "--all"},
                                         {});
  CHECK(token.ttl_s == 60);
  CHECK(token.aud == "amp");
  CHECK(token.grants_json == cli::all_grants_json);
}

TEST_CASE("amp scatter, reply and operation read their options", "[cli]") {
  auto s = parse_as<cli::scatter_args>({"scatter", "--to", "alfa,bravo", "--to", "charlie",
                                        "--quorum", "2", "--timeout-ms", "30000", "--on-timeout",
                                        "partial", "--type", "review.request", "--key", "k",
                                        "--include-self", "--no-wait", R"({"doc":1})"});
  CHECK(s.to == std::vector<std::string>{"alfa", "bravo", "charlie"});
  CHECK(s.audience.empty());
  CHECK(s.options.quorum == 2);
  CHECK(s.options.timeout == std::chrono::milliseconds(30000));
  CHECK(s.options.partial_on_timeout);
  CHECK(s.options.type == "review.request");
  CHECK(s.options.idempotency_key == "k");
  CHECK(s.options.include_self);
  CHECK_FALSE(s.wait);
  CHECK(s.body == R"({"doc":1})");
  auto all = parse_as<cli::scatter_args>({"scatter", "--audience", "all", "1"});
  CHECK(all.audience == "all");
  CHECK(all.wait);
  CHECK(all.options.quorum == 0);
  auto refused = [](std::vector<std::string> args) {
    auto r = parse(std::move(args));
    return r ? std::string("accepted") : r.error().message();
  };
  CHECK(refused({"scatter", "1"}) == "scatter: give either --to or --audience");
  CHECK(refused({"scatter", "--to", "a", "--audience", "all", "1"}) ==
        "scatter: give either --to or --audience");
  CHECK(refused({"scatter", "--to", "a,,b", "1"}) == "scatter: --to: a member name is empty");
  CHECK(refused({"scatter", "--audience", "some", "1"}) ==
        "scatter: --audience must be online or all, not \"some\"");
  CHECK(refused({"scatter", "--to", "a", "--quorum", "1", "1"}) ==
        "scatter: --quorum and --timeout-ms go together");
  CHECK(refused({"scatter", "--to", "a", "--on-timeout", "partial", "1"}) ==
        "scatter: --on-timeout needs --quorum");

  auto r = parse_as<cli::reply_args>(
      {"reply", "--operation", "o_1", "--attempt", "2", "--reject", R"("no")"});
  CHECK(r.operation == "o_1");
  CHECK(r.attempt == 2);
  CHECK_FALSE(r.accept);
  CHECK(r.body == R"("no")");
  auto plain = parse_as<cli::reply_args>({"reply", "--operation", "o_1"});
  CHECK(plain.attempt == 1);
  CHECK(plain.accept);
  CHECK(plain.body == "null");
  CHECK(parse_as<cli::operation_args>({"operation", "o_2"}).operation == "o_2");
  CHECK(parse_as<cli::cancel_args>({"cancel", "o_3"}).task == "o_3");
}

TEST_CASE("help: every command's help lists exactly the options its parser accepts", "[cli]") {
  CHECK(std::get<cli::help_args>(must(parse({"--help"}))).command.empty());
  CHECK(std::get<cli::help_args>(must(parse({"help", "send"}))).command == "send");
  CHECK(std::get<cli::help_args>(must(parse({"send", "--to", "x", "--help"}))).command == "send");
  CHECK(std::get<cli::help_args>(must(parse({"work", "-h"}))).command == "work");
  CHECK(code_of(parse({"help", "nope"})) == errc::bad_request);
  CHECK(cli::help_text("nope").empty());

  const auto overview = cli::help_text("");
  const std::vector<std::string> names = {"token",   "send",  "listen",   "submit", "work",
                                          "pub",     "sub",   "who",      "task",   "cancel",
                                          "scatter", "reply", "operation"};
  const std::regex option_line(R"(^  (--[a-z-]+)( [A-Z_]+)?)");
  for (const auto& name : names) {
    INFO(name);
    CHECK_THAT(overview, Catch::Contains("  " + name + " "));
    const auto help = cli::help_text(name);
    CHECK_THAT(help, Catch::StartsWith("Usage: amp " + name));
    std::size_t listed = 0;
    for (const auto& line : lines_of(help)) {
      std::smatch m;
      if (!std::regex_search(line, m, option_line)) continue;
      const std::string option = m[1];
      if (option == "--help") continue;
      ++listed;
      // The parser knows the option: whatever else is wrong, it is not "unknown".
      std::vector<std::string> args = {name, option};
      if (m[2].matched) args.push_back("x");
      auto r = parse(args);
      if (!r) CHECK_THAT(r.error().message(), !Catch::Contains("unknown option"));
    }
    CHECK(listed > 0u);
    CHECK((name == "token") == (help.find("--url") == std::string::npos));
    // And an option that is not listed is refused.
    CHECK_THAT(parse_error({name, "--not-an-option"}), Catch::Contains("unknown option"));
  }
}

// ---------------------------------------------------------------------------------------
// amp token

TEST_CASE("amp token mints a JWT the authenticator accepts", "[cli][token]") {
  const auto now = std::chrono::system_clock::now();
  SECTION("HS256 from --secret, with every grant") {
    auto args =
        parse_as<cli::token_args>({"token", "--secret", "s3cret-s3cret-s3cret-s3cret-s3cret",
                                   "--sub", "alice", "--ns", "demo", "--all"},
                                  {});
    auto token = must(cli::make_token(args, now));
    auto who = verify(token, hs256("s3cret-s3cret-s3cret-s3cret-s3cret"));
    CHECK(who.participant.str() == "alice");
    CHECK(who.ns.str() == "demo");
    CHECK(who.grants.admin);
    CHECK(who.grants.may_send(*amp::participant_name::make("bob")));
    CHECK(who.grants.may_submit(*amp::job_name::make("resize")));
    CHECK(who.grants.may_work(*amp::job_name::make("resize")));
    CHECK(who.grants.may_publish(*amp::topic::make("news.eu")));
    CHECK(who.grants.may_subscribe(*amp::topic_pattern::make(">")));
    const auto lifetime = who.expires_at - now;
    CHECK(lifetime > 3590s);
    CHECK(lifetime <= 3600s);
    // Another secret does not verify it.
    auto other = must(amp::authenticator::make(hs256("other-other-other-other-other-other")));
    CHECK(code_of(other.verify(token, now)) == errc::unauthenticated);
  }
  SECTION("HS256 from --secret-file without its final newline, grants and audience as given") {
    temp_dir dir;
    const auto file = dir.write("secret", "line one of a secret of 32 bytes or more\n");
    auto args = parse_as<cli::token_args>(
        {"token", "--secret-file", file, "--sub", "bob", "--ns", "ops", "--ttl", "120", "--aud",
         "amp-prod", "--grants", R"({"send":["alice"],"subscribe":["news.>"]})"},
        {});
    auto token = must(cli::make_token(args, now));
    auto config =
        hs256("line one of a secret of 32 bytes or more");  // as amp-server reads auth.secret_file
    config.audience = "amp-prod";
    auto who = verify(token, config);
    CHECK(who.participant.str() == "bob");
    CHECK(who.grants.may_send(*amp::participant_name::make("alice")));
    CHECK_FALSE(who.grants.may_send(*amp::participant_name::make("carol")));
    CHECK(who.grants.may_subscribe(*amp::topic_pattern::make("news.eu")));
    CHECK_FALSE(who.grants.admin);
    CHECK(who.expires_at - now <= 120s);
    config.audience = "amp-test";
    auto wrong_audience = must(amp::authenticator::make(config));
    CHECK(code_of(wrong_audience.verify(token, now)) == errc::unauthenticated);
  }
  SECTION("EdDSA from --key-file; no grants: no amp claim") {
    temp_dir dir;
    const auto keys = make_ed25519();
    const auto file = dir.write("key.pem", keys.private_pem);
    auto args = parse_as<cli::token_args>(
        {"token", "--key-file", file, "--sub", "carol", "--ns", "demo"}, {});
    auto token = must(cli::make_token(args, now));
    amp::auth_config config;
    config.alg = amp::jwt_alg::eddsa;
    config.public_key_pem = keys.public_pem;
    auto who = verify(token, config);
    CHECK(who.participant.str() == "carol");
    CHECK(who.grants.send.empty());
    CHECK_FALSE(who.grants.admin);
  }
  SECTION("a file that cannot be read, or a key that is not Ed25519") {
    temp_dir dir;
    auto missing = parse_as<cli::token_args>(
        {"token", "--secret-file", "/nonexistent/secret", "--sub", "a", "--ns", "d"}, {});
    auto r = cli::make_token(missing, now);
    REQUIRE(code_of(r) == errc::bad_request);
    CHECK_THAT(r.error().message(), Catch::Contains("cannot read /nonexistent/secret"));
    auto not_a_key = parse_as<cli::token_args>(
        {"token", "--key-file", dir.write("k", "hello"), "--sub", "a", "--ns", "d"}, {});
    CHECK(code_of(cli::make_token(not_a_key, now)) == errc::bad_request);
  }
}

// ---------------------------------------------------------------------------------------
// The binary

TEST_CASE("the amp binary: help, usage errors (2) and token", "[cli][binary]") {
  auto help = run_amp({"--help"});
  CHECK(help.status == 0);
  CHECK_THAT(help.out, Catch::Contains("Commands:"));
  auto send_help = run_amp({"send", "--help"});
  CHECK(send_help.status == 0);
  CHECK_THAT(send_help.out, Catch::Contains("--msg-id ID"));

  auto bad = run_amp({"send", "1"});
  CHECK(bad.status == 2);
  CHECK(bad.out.empty());
  CHECK(bad.err == "amp: bad_request: send: --to is required\n");

  auto token = run_amp({"token", "--secret", "s3cret-s3cret-s3cret-s3cret-s3cret", "--sub", "alice",
                        "--ns", "demo", "--grants", R"({"submit":["resize"]})"});
  REQUIRE(token.status == 0);
  REQUIRE(token.out.ends_with("\n"));
  auto who = verify(token.out.substr(0, token.out.size() - 1),
                    hs256("s3cret-s3cret-s3cret-s3cret-s3cret"));
  CHECK(who.participant.str() == "alice");
  CHECK(who.grants.may_submit(*amp::job_name::make("resize")));
}

TEST_CASE("the amp binary: server errors exit 1 as amp: CODE: MESSAGE", "[cli][binary]") {
  SECTION("refused token") {
    fake_server s([](peer& p, const fake_server::frame_in& in) {
      auto f = must(client_frame::parse(in.text));
      p.send(amp::testing::error_for(f, "unauthenticated", "token expired"));
      p.close(4401, "");
    });
    auto r = run_amp(with_server(s, {"who"}));
    CHECK(r.status == 1);
    CHECK(r.err == "amp: unauthenticated: token expired\n");
  }
  SECTION("refused request") {
    fake_server s(after_hello([](peer& p, const client_frame& f) {
      p.send(amp::testing::error_for(f, "forbidden", "alice may not send to bob"));
    }));
    auto r = run_amp(with_server(s, {"send", "--to", "bob", "1"}));
    CHECK(r.status == 1);
    CHECK(r.out.empty());
    CHECK(r.err == "amp: forbidden: alice may not send to bob\n");
  }
  SECTION("nothing listens") {
    auto r = run_amp({"who", "--url", "ws://127.0.0.1:1/amp", "--token", "t"});
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::StartsWith("amp: unavailable: cannot connect"));
  }
}

TEST_CASE("the amp binary: send, pub, who, task and cancel print the server's reply",
          "[cli][binary]") {
  fake_server s(after_hello([](peer& p, const client_frame& f) {
    const auto& op = f.op();
    if (op == "send")
      p.send(ok_for(f, R"("seq":17,"msg_id":"m-1","duplicate":false)"));
    else if (op == "publish")
      p.send(ok_for(f, R"("seq":3,"duplicate":true)"));
    else if (op == "who")
      p.send(ok_for(f, R"("participants":[{"participant":"w1","jobs":["resize"]}])"));
    else if (op == "task")
      p.send(ok_for(f, R"("task":{"task":"t_1","state":"queued"},"history":[])"));
    else if (op == "cancel")
      p.send(ok_for(f, R"("state":"cancelled")"));
  }));
  auto sent = run_amp(with_server(s, {"send", "--to", "bob", "--type", "greeting", "-"}),
                      R"({"hello": "world"})");
  CHECK(sent.status == 0);
  CHECK(sent.out == "{\"seq\":17,\"msg_id\":\"m-1\",\"duplicate\":false}\n");
  auto send_frame = s.frames("send").at(0);
  CHECK(send_frame.raw_at("/body") == R"({"hello":"world"})");
  CHECK(send_frame.string_at("/type") == "greeting");

  auto published = run_amp(with_server(s, {"pub", "--topic", "news.eu", "--msg-id", "e1", "42"}));
  CHECK(published.out == "{\"seq\":3,\"duplicate\":true}\n");
  CHECK(s.frames("publish").at(0).string_at("/msg_id") == "e1");

  auto who = run_amp(with_server(s, {"who", "--job", "resize"}));
  CHECK(who.out == "{\"participants\":[{\"participant\":\"w1\",\"jobs\":[\"resize\"]}]}\n");
  CHECK(s.frames("who").at(0).string_at("/job") == "resize");

  auto task = run_amp(with_server(s, {"task", "t_1", "--history"}));
  CHECK(task.out == "{\"task\":{\"task\":\"t_1\",\"state\":\"queued\"},\"history\":[]}\n");
  CHECK(s.frames("task").at(0).bool_at("/history") == true);

  auto cancelled = run_amp(with_server(s, {"cancel", "t_1"}));
  CHECK(cancelled.status == 0);
  CHECK(cancelled.out == "{\"state\":\"cancelled\"}\n");

  auto bad_stdin = run_amp(with_server(s, {"send", "--to", "bob", "-"}), "{nope");
  CHECK(bad_stdin.status == 2);
  CHECK_THAT(bad_stdin.err, Catch::StartsWith("amp: bad_request: stdin: "));
}

TEST_CASE("the amp binary: listen prints envelopes, acks N and gives the rest back",
          "[cli][binary]") {
  fake_server s([](peer& p, const fake_server::frame_in& in) {
    auto f = must(client_frame::parse(in.text));
    if (f.op() == "hello") {
      p.send(amp::testing::welcome(f.raw_at("/id").value_or("null")));
      for (int seq = 1; seq <= 3; ++seq) {
        p.send(R"({"op":"message","seq":)" + std::to_string(seq) +
               R"(,"delivery":1,"envelope":{"id":"m)" + std::to_string(seq) +
               R"(","from":"bob","body":{"n":)" + std::to_string(seq) + "}}}");
      }
    } else {
      p.send(ok_for(f));
    }
  });
  auto r = run_amp(with_server(s, {"listen", "--count", "2"}));
  CHECK(r.status == 0);
  CHECK(lines_of(r.out) == std::vector<std::string>{R"({"id":"m1","from":"bob","body":{"n":1}})",
                                                    R"({"id":"m2","from":"bob","body":{"n":2}})"});
  auto acks = s.frames("ack");
  REQUIRE(acks.size() == 2);
  CHECK(acks[0].int_at("/seq") == 1);
  CHECK(acks[1].int_at("/seq") == 2);
  auto nacks = s.frames("nack");
  REQUIRE(nacks.size() == 1);
  CHECK(nacks[0].int_at("/seq") == 3);
}

TEST_CASE("the amp binary: submit --wait takes the broker's notice of its task", "[cli][binary]") {
  auto script = [](std::string end_type, std::string state) {
    return after_hello([=](peer& p, const client_frame& f) {
      if (f.op() == "submit") {
        p.send(ok_for(f, R"("task":"t_9","created":true)"));
        // Someone else's message first: it must be left alone.
        p.send(
            R"({"op":"message","seq":4,"delivery":1,"envelope":{"from":"bob","type":"chat","body":1}})");
        p.send(
            R"({"op":"message","seq":5,"delivery":1,"envelope":{"from":"$broker","type":"amp.task.completed","body":{"task":"t_8","state":"completed"}}})");
        p.send(R"({"op":"message","seq":6,"delivery":1,"envelope":{"from":"$broker","type":")" +
               end_type + R"(","body":{"task":"t_9","job":"resize","state":")" + state +
               R"(","attempt":1,"result":{"ok":true}}}})");
      } else {
        p.send(ok_for(f));
      }
    });
  };
  SECTION("completed: exit 0") {
    fake_server s(script("amp.task.completed", "completed"));
    auto r = run_amp(with_server(s, {"submit", "--job", "resize", "--key", "k1", "--wait",
                                     "--timeout", "10", R"({"w":640})"}));
    CHECK(r.status == 0);
    CHECK(
        lines_of(r.out) ==
        std::vector<std::string>{
            R"({"task":"t_9","created":true})",
            R"({"task":"t_9","job":"resize","state":"completed","attempt":1,"result":{"ok":true}})"});
    auto submit = s.frames("submit").at(0);
    CHECK(submit.string_at("/idempotency_key") == "k1");
    CHECK(submit.raw_at("/body") == R"({"w":640})");
    auto acks = s.frames("ack");
    REQUIRE(acks.size() == 1);
    CHECK(acks[0].int_at("/seq") == 6);
  }
  SECTION("failed: exit 1") {
    fake_server s(script("amp.task.failed", "failed"));
    auto r = run_amp(with_server(s, {"submit", "--job", "resize", "--wait", "1"}));
    CHECK(r.status == 1);
    CHECK(lines_of(r.out).size() == 2);
  }
  SECTION("no notice within --timeout: exit 1") {
    fake_server s(after_hello([](peer& p, const client_frame& f) {
      p.send(ok_for(f, R"("task":"t_9","created":true)"));
    }));
    auto r =
        run_amp(with_server(s, {"submit", "--job", "resize", "--wait", "--timeout", "0.3", "1"}));
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::StartsWith("amp: timeout: task t_9 did not end"));
  }
  SECTION("an idempotency key naming a task that already ended") {
    fake_server s(after_hello([](peer& p, const client_frame& f) {
      if (f.op() == "submit") p.send(ok_for(f, R"("task":"t_1","created":false)"));
      if (f.op() == "task") {
        p.send(ok_for(
            f,
            R"("task":{"task":"t_1","job":"resize","state":"failed","attempt":3,"result":null,"error":{"code":"attempts_exhausted","message":"3 attempts"}})"));
      }
    }));
    auto r = run_amp(with_server(s, {"submit", "--job", "resize", "--key", "k", "--wait", "1"}));
    INFO(r.err);
    CHECK(r.status == 1);
    CHECK(
        lines_of(r.out).at(1) ==
        R"({"task":"t_1","job":"resize","state":"failed","attempt":3,"error":{"code":"attempts_exhausted","message":"3 attempts"}})");
  }
}

TEST_CASE("the amp binary: sub prints events and resubscribes after sub_dropped without loss",
          "[cli][binary]") {
  int subscriptions = 0;
  fake_server s(after_hello([&subscriptions](peer& p, const client_frame& f) {
    if (f.op() != "subscribe") return;
    auto event = [&](int seq) {
      return R"({"op":"event","sub":"s1","seq":)" + std::to_string(seq) +
             R"(,"topic":"news.eu","envelope":{"body":)" + std::to_string(seq) + "}}";
    };
    if (++subscriptions == 1) {
      p.send(ok_for(f, R"("sub":"s1")"));
      p.send(R"({"op":"event","sub":"other","seq":6,"topic":"x","envelope":{}})");
      p.send(event(5));
      p.send(event(7));
      p.send(R"({"op":"sub_dropped","sub":"s1","reason":"slow_consumer","last_seq":7})");
    } else {
      p.send(ok_for(f, R"("sub":"s1")"));
      p.send(event(7));  // already printed: not again
      p.send(event(9));
    }
  }));
  auto r = run_amp(with_server(s, {"sub", "--topic", "news.>", "--from", "all", "--count", "3"}));
  CHECK(r.status == 0);
  CHECK(lines_of(r.out) ==
        std::vector<std::string>{R"({"seq":5,"topic":"news.eu","envelope":{"body":5}})",
                                 R"({"seq":7,"topic":"news.eu","envelope":{"body":7}})",
                                 R"({"seq":9,"topic":"news.eu","envelope":{"body":9}})"});
  auto subs = s.frames("subscribe");
  REQUIRE(subs.size() == 2);
  CHECK(subs[0].string_at("/from") == "all");
  CHECK(subs[1].int_at("/from/seq") == 8);
  CHECK_FALSE(subs[1].string_at("/sub"));  // named by the server again
}

namespace {

/// A scripted server that offers `offers` one after the other to a worker (each offer when
/// the previous task is completed or failed, or declined), and answers every request.
fake_server::script work_script(std::vector<std::string> offers) {
  auto next = std::make_shared<std::size_t>(0);
  return after_hello([offers = std::move(offers), next](peer& p, const client_frame& f) {
    const auto& op = f.op();
    auto offer_next = [&] {
      if (*next < offers.size()) p.send(offers[(*next)++]);
    };
    if (op == "register") {
      p.send(ok_for(f, R"("expires_in_s":30)"));
      offer_next();
    } else if (op == "claim") {
      p.send(ok_for(f, R"("task":)" + f.raw_at("/task").value_or("null") +
                           R"(,"attempt":2,"lease_expires_at":"2026-01-01T00:00:30.000Z")"));
    } else if (op == "complete") {
      p.send(
          ok_for(f, R"("task":)" + f.raw_at("/task").value_or("null") + R"(,"state":"completed")"));
      offer_next();
    } else if (op == "fail") {
      p.send(ok_for(f, R"("task":)" + f.raw_at("/task").value_or("null") +
                           R"(,"state":"queued","attempt":2)"));
      offer_next();
    } else if (op == "bye") {
      p.send(ok_for(f));
      p.close(1000, "bye");
    } else if (op == "heartbeat") {
      p.send(ok_for(f, R"("leases":[])"));
    } else {
      p.send(ok_for(f));
    }
  });
}

std::string offer(const std::string& task, const std::string& body, int lease_s = 30) {
  return R"({"op":"offer","task":")" + task +
         R"(","job":"resize","attempt":2,"max_attempts":3,"lease_s":)" + std::to_string(lease_s) +
         R"(,"envelope":{"from":"alice","to":"resize","body":)" + body + "}}";
}

}  // namespace

TEST_CASE("the amp binary: work runs the command per task and reports its outcome",
          "[cli][binary][work]") {
  SECTION("exit 0 completes with stdout: JSON as it is, other text as a string") {
    fake_server s(
        work_script({offer("t_1", R"({"n":21})"), offer("t_2", "[1,2]"), offer("t_3", "null")}));
    // The first prints JSON built from its input and environment, the second plain text, the
    // third nothing.
    const std::string script =
        R"(read body; case "$AMP_TASK" in )"
        R"(t_1) printf '{"body":%s,"task":"%s","job":"%s","attempt":%s}' "$body" "$AMP_TASK" "$AMP_JOB" "$AMP_ATTEMPT";; )"
        R"(t_2) echo "plain text";; )"
        R"(esac)";
    auto r = run_amp(
        with_server(s, {"work", "--job", "resize", "--count", "3", "--", "sh", "-c", script}));
    CHECK(r.status == 0);
    INFO(r.err);
    auto registered = s.frames("register").at(0);
    CHECK(registered.raw_at("/jobs") == R"(["resize"])");
    CHECK(registered.int_at("/slots") == 1);
    auto completes = s.frames("complete");
    REQUIRE(completes.size() == 3);
    CHECK(completes[0].string_at("/task") == "t_1");
    CHECK(completes[0].raw_at("/result") ==
          R"({"body":{"n":21},"task":"t_1","job":"resize","attempt":2})");
    CHECK(completes[1].raw_at("/result") == R"("plain text")");
    CHECK(completes[2].raw_at("/result") == "null");
    CHECK(s.frames("claim").size() == 3);
    CHECK(s.frames("bye").size() == 1);
    CHECK(lines_of(r.out) ==
          std::vector<std::string>{
              R"({"task":"t_1","job":"resize","attempt":2,"exit":0,"state":"completed"})",
              R"({"task":"t_2","job":"resize","attempt":2,"exit":0,"state":"completed"})",
              R"({"task":"t_3","job":"resize","attempt":2,"exit":0,"state":"completed"})"});
  }
  SECTION("a non-zero exit fails the task with exit_N and the end of stderr, asking a retry") {
    fake_server s(work_script({offer("t_1", "1")}));
    auto r = run_amp(with_server(s, {"work", "--job", "resize", "--count", "1", "--", "sh", "-c",
                                     "echo warming up >&2; echo 'disk full' >&2; exit 3"}));
    CHECK(r.status == 0);
    auto fails = s.frames("fail");
    REQUIRE(fails.size() == 1);
    CHECK(fails[0].string_at("/error/code") == "exit_3");
    CHECK(fails[0].string_at("/error/message") == "warming up\ndisk full");
    CHECK(fails[0].bool_at("/retry") == true);
    CHECK(s.frames("complete").empty());
    CHECK(r.out ==
          "{\"task\":\"t_1\",\"job\":\"resize\",\"attempt\":2,\"exit\":3,\"state\":\"queued\"}\n");
  }
  SECTION("heartbeats keep a short lease alive while the command runs") {
    fake_server s(work_script({offer("t_1", "1", 1)}));
    auto r = run_amp(with_server(
        s, {"work", "--job", "resize", "--count", "1", "--", "sh", "-c", "sleep 1.2; echo 1"}));
    CHECK(r.status == 0);
    CHECK(s.frames("heartbeat").size() >= 1);
    CHECK(s.frames("complete").size() == 1);
  }
  SECTION("a task cancelled while its command runs: the command is stopped, nothing reported") {
    fake_server s(work_script({offer("t_1", "1")}));
    std::thread canceller([&] {
      if (amp::testing::eventually(5000ms, [&] { return !s.frames("claim").empty(); })) {
        std::this_thread::sleep_for(200ms);
        s.with_peer([](peer& p) { p.send(R"({"op":"cancelled","task":"t_1"})"); });
      }
    });
    const auto start = std::chrono::steady_clock::now();
    auto r =
        run_amp(with_server(s, {"work", "--job", "resize", "--count", "1", "--", "sleep", "30"}));
    canceller.join();
    CHECK(r.status == 0);
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    CHECK(s.frames("complete").empty());
    CHECK(s.frames("fail").empty());
    CHECK(s.frames("bye").size() == 1);
  }
  SECTION("a command that cannot be found is a usage error") {
    auto r = run_amp({"work", "--job", "j", "--url", "ws://127.0.0.1:1/amp", "--token", "t", "--",
                      "/nonexistent/program"});
    CHECK(r.status == 2);
    CHECK_THAT(r.err, Catch::Contains("cannot find COMMAND"));
  }
}

TEST_CASE("run_process feeds stdin, collects stdout and the end of stderr, and reports the exit",
          "[cli][process]") {
  cli::process_spec spec;
  spec.argv = {"sh", "-c", "cat; echo \"$GREETING\"; printf 'abcdefghij' >&2; exit 7"};
  spec.env = {{"GREETING", "hi"}};
  spec.input = std::string(200000, 'x');  // more than a pipe holds
  spec.error_tail = 4;
  auto out = cli::run_process(spec);
  REQUIRE(out.started);
  CHECK(out.exit_code == 7);
  CHECK(out.output == std::string(200000, 'x') + "hi\n");
  CHECK(out.error_output == "ghij");

  cli::process_spec missing;
  missing.argv = {"/nonexistent/program"};
  auto not_started = cli::run_process(missing);
  CHECK_FALSE(not_started.started);
  CHECK_FALSE(not_started.start_error.empty());

  cli::process_spec signalled;
  signalled.argv = {"sh", "-c", "kill -9 $$"};
  CHECK(cli::run_process(signalled).signal == 9);

  CHECK(cli::find_program("sh").has_value());
  CHECK_FALSE(cli::find_program("no-such-program-here").has_value());
}
