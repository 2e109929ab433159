// The client and the `amp` binary against the library's own session gateway (amp::gateway on
// the memory transport), carried over websocketpp inside the test: the two sides of amp.v1
// agree. Needs no amp-server and no NATS.

#include <catch2/catch.hpp>

#include <websocketpp/config/asio_no_tls.hpp>
#include <websocketpp/server.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "amp/client.hpp"
#include "amp/gateway/auth.hpp"
#include "amp/gateway/session.hpp"
#include "amp/transport/memory.hpp"
#include "cli_args.hpp"
#include "client/run_amp.hpp"
#include "support/checks.hpp"

namespace {

using namespace std::chrono_literals;
using amp::client;
using amp::client_frame;
using amp::errc;
using amp::testing::code_of;
using amp::testing::eventually;
using amp::testing::must;
using amp::testing::run_amp;
namespace net = websocketpp::lib::asio;

constexpr const char* k_secret = "a test secret of thirty-two bytes!";

/// amp::gateway on the memory transport behind a websocketpp server on 127.0.0.1 and a free
/// port: what amp-server does, reduced to what a test needs.
class gateway_server {
 public:
  using endpoint = websocketpp::server<websocketpp::config::asio>;

  gateway_server() {
    amp::server_config config;
    config.auth.secret = k_secret;
    config.heartbeat_s = 1;
    config.registry_ttl_s = 5;
    amp::gateway_options options;
    options.config = config;
    options.backend = amp::memory_transport::create();
    options.server_name = "amp-e2e/0";
    gateway_ = must(amp::gateway::open(std::move(options)));

    endpoint_.clear_access_channels(websocketpp::log::alevel::all);
    endpoint_.clear_error_channels(websocketpp::log::elevel::all);
    endpoint_.init_asio(&io_);
    endpoint_.set_max_message_size(config.limits.max_frame_bytes);
    endpoint_.set_validate_handler([this](websocketpp::connection_hdl h) {
      auto con = endpoint_.get_con_from_hdl(h);
      for (const auto& p : con->get_requested_subprotocols()) {
        if (p == "amp.v1") con->select_subprotocol(p);
      }
      return true;
    });
    endpoint_.set_open_handler([this](websocketpp::connection_hdl h) {
      auto session = gateway_->open_session(std::make_shared<carrier>(*this, h));
      std::lock_guard lock(mutex_);
      sessions_[h] = session;
    });
    endpoint_.set_close_handler([this](websocketpp::connection_hdl h) {
      std::shared_ptr<amp::session> session;
      {
        std::lock_guard lock(mutex_);
        auto it = sessions_.find(h);
        if (it == sessions_.end()) return;
        session = it->second;
        sessions_.erase(it);
      }
      session->closed();
    });
    endpoint_.set_message_handler([this](websocketpp::connection_hdl h, endpoint::message_ptr m) {
      std::shared_ptr<amp::session> session;
      {
        std::lock_guard lock(mutex_);
        auto it = sessions_.find(h);
        if (it == sessions_.end()) return;
        session = it->second;
      }
      if (m->get_opcode() == websocketpp::frame::opcode::text) {
        session->receive(m->get_payload());
      } else {
        session->receive_binary();
      }
    });
    endpoint_.listen(net::ip::tcp::endpoint(net::ip::address_v4::loopback(), 0));
    net::error_code ec;
    port_ = endpoint_.get_local_endpoint(ec).port();
    endpoint_.start_accept();
    thread_ = std::thread([this] { io_.run(); });
  }

  gateway_server(const gateway_server&) = delete;
  gateway_server& operator=(const gateway_server&) = delete;

  ~gateway_server() {
    gateway_->shutdown();  // closes every session with 1001, through the carriers
    net::post(io_, [this] {
      websocketpp::lib::error_code ec;
      endpoint_.stop_listening(ec);
      std::lock_guard lock(mutex_);
      for (auto& [h, s] : sessions_) endpoint_.close(h, 1001, "", ec);
    });
    thread_.join();
  }

  std::string url() const { return "ws://127.0.0.1:" + std::to_string(port_) + "/amp"; }

  /// A token for `participant` of ns demo, with every grant.
  static std::string token(const std::string& participant) {
    amp::token_claims claims;
    claims.sub = participant;
    claims.ns = "demo";
    claims.exp = std::chrono::system_clock::now() + 1h;
    claims.amp_json = std::string(amp::cli::all_grants_json);
    return must(amp::mint_token(claims, amp::jwt_alg::hs256, k_secret));
  }

  std::unique_ptr<client> connect(const std::string& participant) const {
    amp::client_options o;
    o.url = url();
    o.token = token(participant);
    return must(client::connect(o));
  }

 private:
  /// Carries one session: frames are handed to the I/O thread, which owns the connection.
  class carrier final : public amp::session_carrier, public std::enable_shared_from_this<carrier> {
   public:
    carrier(gateway_server& server, websocketpp::connection_hdl h)
        : server_(server), hdl_(std::move(h)) {}
    void send(std::string frame) override {
      queued_ += frame.size();
      net::post(server_.io_, [self = shared_from_this(), frame = std::move(frame)] {
        websocketpp::lib::error_code ec;
        self->server_.endpoint_.send(self->hdl_, frame, websocketpp::frame::opcode::text, ec);
        self->queued_ -= frame.size();
      });
    }
    std::size_t buffered_bytes() const override { return queued_; }
    void close(int code, std::string reason) override {
      net::post(server_.io_, [self = shared_from_this(), code, reason = std::move(reason)] {
        websocketpp::lib::error_code ec;
        self->server_.endpoint_.close(
            self->hdl_, static_cast<websocketpp::close::status::value>(code), reason, ec);
      });
    }

   private:
    gateway_server& server_;
    websocketpp::connection_hdl hdl_;
    std::atomic<std::size_t> queued_{0};
  };

  net::io_context io_;
  endpoint endpoint_;
  std::uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::map<websocketpp::connection_hdl, std::shared_ptr<amp::session>,
           std::owner_less<websocketpp::connection_hdl>>
      sessions_;
  std::shared_ptr<amp::gateway> gateway_;  // last: destroyed first
};

/// The pushes of a client, for a test to wait on. The handler shares the queue, so that it
/// may outlive this object.
class push_queue {
 public:
  explicit push_queue(client& c) {
    c.on_push([q = queue_](const client_frame& f) {
      std::lock_guard lock(q->mutex);
      q->frames.push_back(f);
    });
  }
  /// The first push with op `op` within 5 s (removed from the queue), or an empty frame.
  client_frame next(const std::string& op) {
    client_frame found;
    eventually(
        5000ms,
        [&] {
          std::lock_guard lock(queue_->mutex);
          auto& frames = queue_->frames;
          for (auto it = frames.begin(); it != frames.end(); ++it) {
            if (it->op() == op) {
              found = *it;
              frames.erase(it);
              return true;
            }
          }
          return false;
        },
        10ms);
    return found;
  }

 private:
  struct queue {
    std::mutex mutex;
    std::vector<client_frame> frames;
  };
  std::shared_ptr<queue> queue_ = std::make_shared<queue>();
};

}  // namespace

TEST_CASE("against the gateway: hello opens the session, a bad token is refused with 4401",
          "[client][e2e]") {
  gateway_server server;
  auto alice = server.connect("alice");
  CHECK(alice->participant() == "alice");
  CHECK(alice->ns() == "demo");
  CHECK_FALSE(alice->session().empty());
  CHECK(alice->heartbeat_s() == 1);
  CHECK(alice->registry_ttl_s() == 5);
  CHECK(alice->max_frame_bytes() == 1048576);
  CHECK(alice->server() == "amp-e2e/0");

  amp::client_options o;
  o.url = server.url();
  o.token = "not.a.jwt";
  auto refused = client::connect(o);
  REQUIRE(code_of(refused) == errc::unauthenticated);
  CHECK_FALSE(refused.error().message().empty());

  // A server error travels back with its code; the session stays up.
  CHECK(code_of(alice->send("Bob", "1")) == errc::invalid_name);
  CHECK(code_of(alice->ack(999)) == errc::not_found);
  CHECK(alice->is_open());
}

TEST_CASE("against the gateway: a message goes from one client's send to another's inbox",
          "[client][e2e]") {
  gateway_server server;
  auto alice = server.connect("alice");
  auto bob = server.connect("bob");
  push_queue bob_pushes(*bob);

  amp::message_options o;
  o.type = "greeting";
  o.correlation = "c-1";
  auto sent = must(alice->send("bob", R"({"hi":1})", o));
  auto message = bob_pushes.next("message");
  REQUIRE(message.op() == "message");
  CHECK(message.int_at("/seq") == sent.seq);
  CHECK(message.string_at("/envelope/from") == "alice");
  CHECK(message.string_at("/envelope/id") == sent.msg_id);
  CHECK(message.string_at("/envelope/type") == "greeting");
  CHECK(message.raw_at("/envelope/body") == R"({"hi":1})");
  must(bob->ack(sent.seq));
  CHECK(code_of(bob->ack(sent.seq)) == errc::not_found);
}

TEST_CASE("against the gateway: an operation scattered, replied to, read, retried and cancelled",
          "[client][e2e][operations]") {
  gateway_server server;
  auto boss = server.connect("boss");
  auto alfa = server.connect("alfa");
  auto bravo = server.connect("bravo");
  push_queue boss_pushes(*boss), alfa_pushes(*alfa), bravo_pushes(*bravo);

  amp::scatter_options o;
  o.type = "review.request";
  o.bodies_json = R"({"bravo":{"part":2}})";
  o.quorum = 2;
  o.timeout = std::chrono::milliseconds(60000);
  o.partial_on_timeout = true;
  o.idempotency_key = "k-1";
  auto started = must(boss->scatter({"bravo", "alfa", "alfa"}, R"({"part":1})", o));
  CHECK(started.created);
  CHECK(started.members == std::vector<std::string>{"alfa", "bravo"});
  // The key names the operation made: a repeat with other members and body is answered with it.
  auto repeat = o;
  repeat.bodies_json.clear();
  auto again = must(boss->scatter({"alfa", "charlie"}, "0", repeat));
  CHECK_FALSE(again.created);
  CHECK(again.operation == started.operation);

  auto a = alfa_pushes.next("message");
  CHECK(a.string_at("/envelope/operation/id") == started.operation);
  CHECK(a.raw_at("/envelope/body") == R"({"part":1})");
  CHECK(bravo_pushes.next("message").raw_at("/envelope/body") == R"({"part":2})");

  CHECK(must(boss->retry(started.operation, "bravo")) == 2);
  CHECK(bravo_pushes.next("message").int_at("/envelope/operation/attempt") == 2);
  auto replied = must(alfa->reply(started.operation, 1, true, R"("ok")"));
  CHECK(replied.state == "open");
  CHECK_FALSE(replied.duplicate);
  CHECK(must(alfa->reply(started.operation, 1)).duplicate);
  CHECK(code_of(bravo->reply(started.operation, 1)) == errc::conflict);
  CHECK(must(bravo->reply(started.operation, 2)).state == "completed");
  CHECK(code_of(alfa->reply(started.operation, 1)) == errc::conflict);
  auto notice = boss_pushes.next("message");
  CHECK(notice.string_at("/envelope/type") == "amp.operation.completed");
  auto record = must(bravo->operation(started.operation));
  CHECK(record.string_at("/operation/state") == "completed");
  CHECK(record.string_at("/operation/branches/alfa/state") == "replied");
  CHECK(code_of(boss->cancel_operation(started.operation)) == errc::conflict);

  auto multicast = must(boss->scatter({"alfa"}, "1"));
  CHECK(must(boss->operation(multicast.operation)).string_at("/operation/state") == "completed");
  amp::scatter_options gather;
  gather.quorum = 2;
  gather.timeout = std::chrono::milliseconds(60000);
  auto audience = must(boss->scatter_to_audience("all", "1", gather));
  CHECK(audience.members == std::vector<std::string>{"alfa", "bravo"});
  auto cancelled = must(boss->cancel_operation(audience.operation));
  CHECK(cancelled.string_at("/state") == "cancelled");
  CHECK(cancelled.string_at("/branches/alfa") == "stopped");
  CHECK(code_of(boss->reply(audience.operation, 1, true, "{")) == errc::bad_request);
}

TEST_CASE("against the gateway: a subscriber gets what is published", "[client][e2e]") {
  gateway_server server;
  auto alice = server.connect("alice");
  auto bob = server.connect("bob");
  push_queue bob_pushes(*bob);
  auto first = must(alice->publish("news.eu", R"("before")"));
  auto sub = must(bob->subscribe("news.>", must(amp::subscribe_from::parse("all"))));
  auto second = must(alice->publish("news.us", R"("after")"));
  for (auto [seq, topic] : {std::pair{first.seq, "news.eu"}, std::pair{second.seq, "news.us"}}) {
    auto event = bob_pushes.next("event");
    REQUIRE(event.op() == "event");
    CHECK(event.string_at("/sub") == sub);
    CHECK(event.int_at("/seq") == seq);
    CHECK(event.string_at("/topic") == topic);
  }
  must(bob->unsubscribe(sub));
}

TEST_CASE("against the gateway: amp work and amp submit --wait run a task end to end",
          "[client][e2e][binary]") {
  gateway_server server;
  auto worker = std::async(std::launch::async, [&] {
    return run_amp({"work", "--url", server.url(), "--token", gateway_server::token("w1"), "--job",
                    "echo", "--count", "1", "--", "sh", "-c",
                    R"(read body; printf '{"got":%s,"attempt":%s}' "$body" "$AMP_ATTEMPT")"});
  });
  // The worker is registered once who lists it.
  auto alice = server.connect("alice");
  REQUIRE(eventually(10000ms, [&] {
    auto who = alice->who("echo");
    return who && who->size_at("/participants") == 1u;
  }));

  auto submitted =
      run_amp({"submit", "--url", server.url(), "--token", gateway_server::token("alice"), "--job",
               "echo", "--wait", "--timeout", "20", R"({"n":7})"});
  INFO(submitted.err);
  CHECK(submitted.status == 0);
  auto lines = submitted.out;
  CHECK_THAT(lines, Catch::Contains(R"("created":true)"));
  CHECK_THAT(lines, Catch::Contains(R"("state":"completed")"));
  CHECK_THAT(lines, Catch::Contains(R"("result":{"got":{"n":7},"attempt":1})"));

  REQUIRE(worker.wait_for(20s) == std::future_status::ready);
  auto work = worker.get();
  INFO(work.err);
  CHECK(work.status == 0);
  CHECK_THAT(work.out, Catch::Contains(R"("state":"completed")"));
  // The worker said bye: it is gone from the registry.
  REQUIRE(eventually(5000ms, [&] {
    auto who = alice->who("echo");
    return who && who->size_at("/participants") == 0u;
  }));
}

TEST_CASE(
    "against the gateway: amp scatter waits for the outcome, amp listen shows the branch, "
    "amp reply answers it",
    "[client][e2e][binary][operations]") {
  gateway_server server;
  auto url = server.url();
  auto scatter = std::async(std::launch::async, [&] {
    return run_amp({"scatter", "--url", url, "--token", gateway_server::token("boss"), "--to",
                    "alfa", "--quorum", "1", "--timeout-ms", "20000", "--type", "review",
                    R"({"doc":1})"});
  });
  auto listened =
      run_amp({"listen", "--url", url, "--token", gateway_server::token("alfa"), "--count", "1"});
  INFO(listened.err);
  REQUIRE(listened.status == 0);
  auto envelope = must(client_frame::parse(listened.out));
  CHECK(envelope.string_at("/from") == "boss");
  CHECK(envelope.string_at("/operation/branch") == "alfa");
  CHECK(envelope.int_at("/operation/attempt") == 1);
  auto op = envelope.string_at("/operation/id").value_or("");
  auto replied = run_amp({"reply", "--url", url, "--token", gateway_server::token("alfa"),
                          "--operation", op, "--attempt", "1", R"("fine")"});
  INFO(replied.err);
  CHECK(replied.status == 0);
  CHECK(replied.out == R"({"operation":")" + op + R"(","state":"completed"})" + "\n");
  REQUIRE(scatter.wait_for(20s) == std::future_status::ready);
  auto outcome = scatter.get();
  INFO(outcome.err);
  CHECK(outcome.status == 0);
  CHECK_THAT(outcome.out, Catch::Contains(R"("operation":")" + op + R"(","created":true)"));
  CHECK_THAT(outcome.out, Catch::Contains(R"("state":"completed")"));
  CHECK_THAT(outcome.out, Catch::Contains(R"("replies":{"alfa":{"accept":true,"body":"fine")"));
  auto record = run_amp({"operation", "--url", url, "--token", gateway_server::token("boss"), op});
  CHECK_THAT(record.out, Catch::Contains(R"("state":"completed")"));
}

TEST_CASE("against the gateway: the client's own worker claims, heartbeats and fails a task",
          "[client][e2e]") {
  gateway_server server;
  auto worker = server.connect("w1");
  push_queue offers(*worker);
  must(worker->register_worker({"resize"}, 1));
  auto alice = server.connect("alice");
  push_queue notices(*alice);
  amp::submit_options so;
  so.max_attempts = 1;
  auto submitted = must(alice->submit("resize", R"({"w":640})", so));
  CHECK(submitted.created);

  auto offer = offers.next("offer");
  REQUIRE(offer.op() == "offer");
  CHECK(offer.string_at("/task") == submitted.task);
  CHECK(offer.raw_at("/envelope/body") == R"({"w":640})");
  auto claim = must(worker->claim(submitted.task));
  CHECK(claim.attempt == 1);
  CHECK_FALSE(must(worker->heartbeat(submitted.task)).empty());
  CHECK(must(worker->heartbeat()).size_at("/leases") == 1u);
  amp::fail_options no_retry;
  no_retry.retry = false;
  auto failed = must(worker->fail(submitted.task, "bad_input", "no such image", no_retry));
  CHECK(failed.state == "failed");

  auto notice = notices.next("message");
  REQUIRE(notice.op() == "message");
  CHECK(notice.string_at("/envelope/from") == "$broker");
  CHECK(notice.string_at("/envelope/type") == "amp.task.failed");
  CHECK(notice.string_at("/envelope/body/error/code") == "bad_input");
  auto record = must(alice->task(submitted.task, true));
  CHECK(record.string_at("/task/state") == "failed");
  CHECK(record.size_at("/history") >= 2u);
  must(worker->bye());
  CHECK(worker->close_code() == 1000);
}
