// amp::client against a scripted server (tests/client/fake_server.hpp): the session opening,
// replies matched by id, pushes, timeouts and closes a user of the client would notice.

#include <catch2/catch.hpp>

#include <websocketpp/config/asio_no_tls.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "amp/client.hpp"
#include "client/fake_server.hpp"
#include "support/checks.hpp"

namespace {

using namespace std::chrono_literals;
using amp::client;
using amp::client_frame;
using amp::client_options;
using amp::errc;
using amp::testing::after_hello;
using amp::testing::code_of;
using amp::testing::error_for;
using amp::testing::eventually;
using amp::testing::fake_server;
using amp::testing::must;
using amp::testing::ok_for;
using peer = fake_server::peer;

client_options options_for(const fake_server& s, std::string token = "tok") {
  client_options o;
  o.url = s.url();
  o.token = std::move(token);
  o.connect_timeout = 5s;
  o.request_timeout = 5s;
  return o;
}

std::unique_ptr<client> connect(const fake_server& s) {
  return must(client::connect(options_for(s)));
}

/// Records the pushes a client delivers. The handler shares the record, so that it may
/// outlive this object.
class push_log {
 public:
  void attach(client& c) {
    c.on_push([r = record_](const client_frame& f) {
      std::lock_guard lock(r->mutex);
      r->frames.push_back(f);
    });
  }
  std::vector<client_frame> snapshot() const {
    std::lock_guard lock(record_->mutex);
    return record_->frames;
  }
  std::vector<std::string> ops() const {
    std::vector<std::string> out;
    for (auto& f : snapshot()) out.push_back(f.op());
    return out;
  }
  std::size_t size() const { return snapshot().size(); }

 private:
  struct record {
    std::mutex mutex;
    std::vector<client_frame> frames;
  };
  std::shared_ptr<record> record_ = std::make_shared<record>();
};

/// A loopback port on which nothing listens.
std::uint16_t closed_port() {
  websocketpp::lib::asio::io_context io;
  websocketpp::lib::asio::ip::tcp::acceptor acceptor(
      io, {websocketpp::lib::asio::ip::address_v4::loopback(), 0});
  return acceptor.local_endpoint().port();
}

template <class F>
auto elapsed(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::steady_clock::now() - start;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Opening the session

TEST_CASE("connect offers amp.v1, sends hello with the token first, and reads the session",
          "[client]") {
  fake_server s(after_hello(nullptr));
  auto c = must(client::connect(options_for(s, "my.jwt.token")));

  CHECK(c->participant() == "alice");
  CHECK(c->ns() == "demo");
  CHECK(c->session() == "sess-1");
  CHECK(c->heartbeat_s() == 10);
  CHECK(c->registry_ttl_s() == 30);
  CHECK(c->max_frame_bytes() == 1048576);
  CHECK(c->server() == "fake-server/1.0");
  CHECK(c->welcome().op() == "ok");
  CHECK(c->is_open());
  CHECK_FALSE(c->close_code());

  const auto offered = s.offered_subprotocols();
  REQUIRE(offered.size() == 1);
  CHECK(offered[0] == std::vector<std::string>{"amp.v1"});
  const auto frames = s.frames();
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].op() == "hello");
  CHECK(frames[0].string_at("/token") == "my.jwt.token");
  CHECK(frames[0].int_at("/id").has_value());
}

TEST_CASE("a refused hello is unauthenticated with the server's message", "[client]") {
  SECTION("error, then close 4401") {
    fake_server s([](peer& p, const fake_server::frame_in& in) {
      auto f = must(client_frame::parse(in.text));
      p.send(error_for(f, "unauthenticated", "token expired at 2026-01-01T00:00:00.000Z"));
      p.close(4401, "unauthenticated");
    });
    auto c = client::connect(options_for(s));
    REQUIRE(code_of(c) == errc::unauthenticated);
    CHECK_THAT(c.error().message(), Catch::Contains("token expired"));
  }
  SECTION("close 4401 without an error frame") {
    fake_server s([](peer& p, const fake_server::frame_in&) { p.close(4401, "bad token"); });
    auto c = client::connect(options_for(s));
    REQUIRE(code_of(c) == errc::unauthenticated);
    CHECK_THAT(c.error().message(), Catch::Contains("4401"));
  }
}

TEST_CASE("over max_sessions, connect fails with limit_exceeded", "[client]") {
  fake_server s([](peer& p, const fake_server::frame_in& in) {
    auto f = must(client_frame::parse(in.text));
    p.send(error_for(f, "limit_exceeded", "max_sessions (1) reached"));
    p.close(1013, "try again later");
  });
  auto c = client::connect(options_for(s));
  REQUIRE(code_of(c) == errc::limit_exceeded);
  CHECK_THAT(c.error().message(), Catch::Contains("max_sessions"));
}

TEST_CASE(
    "connect fails with unavailable when nothing listens, the handshake is refused, or "
    "hello is not answered in time",
    "[client]") {
  SECTION("nothing listens") {
    client_options o;
    o.url = "ws://127.0.0.1:" + std::to_string(closed_port()) + "/amp";
    o.token = "t";
    auto c = client::connect(o);
    REQUIRE(code_of(c) == errc::unavailable);
    CHECK_THAT(c.error().message(), Catch::Contains("cannot connect"));
  }
  SECTION("the server refuses the handshake") {
    fake_server s(after_hello(nullptr), {.refuse_handshake = true});
    auto c = client::connect(options_for(s));
    REQUIRE(code_of(c) == errc::unavailable);
    CHECK_THAT(c.error().message(), Catch::Contains("HTTP 400"));
  }
  SECTION("hello is never answered") {
    fake_server s(nullptr);
    auto o = options_for(s);
    o.connect_timeout = 300ms;
    amp::result<std::unique_ptr<client>> c = amp::unexpected(errc::internal, "not run");
    const auto took = elapsed([&] { c = client::connect(o); });
    REQUIRE(code_of(c) == errc::unavailable);
    CHECK_THAT(c.error().message(), Catch::Contains("within"));
    CHECK(took < 3s);
  }
}

TEST_CASE("connect refuses a URL that is not ws:// or wss://", "[client]") {
  client_options o;
  o.url = "http://127.0.0.1:8080/amp";
  CHECK(code_of(client::connect(o)) == errc::bad_request);
  o.url = "127.0.0.1:8080";
  CHECK(code_of(client::connect(o)) == errc::bad_request);
  o.url = "ws://";
  CHECK(code_of(client::connect(o)) == errc::bad_request);
}

// ---------------------------------------------------------------------------------------
// Requests and replies

TEST_CASE("replies are matched to their requests by id, whatever their order", "[client]") {
  // The server holds back the first two requests and answers them in reverse order.
  std::vector<client_frame> held;
  fake_server s(after_hello([&held](peer& p, const client_frame& f) {
    held.push_back(f);
    if (held.size() < 2) return;
    for (auto it = held.rbegin(); it != held.rend(); ++it) {
      p.send(ok_for(*it, R"("echo":")" + it->op() + "\""));
    }
    held.clear();
  }));
  auto c = connect(s);

  auto who = std::async(std::launch::async, [&] { return c->request("who"); });
  REQUIRE(eventually(2000ms, [&] { return s.frames().size() == 2; }));
  auto task = std::async(std::launch::async, [&] { return c->request("task", R"("task":"t_1")"); });

  auto who_reply = must(who.get());
  auto task_reply = must(task.get());
  CHECK(who_reply.string_at("/echo") == "who");
  CHECK(task_reply.string_at("/echo") == "task");

  // Every request carried its own id.
  auto frames = s.frames();
  REQUIRE(frames.size() == 3);
  CHECK(frames[1].int_at("/id") != frames[2].int_at("/id"));
  CHECK(frames[2].string_at("/task") == "t_1");
}

TEST_CASE("an error reply is the wire's code, message and path", "[client]") {
  fake_server s(after_hello([](peer& p, const client_frame& f) {
    if (f.op() == "send") {
      p.send(error_for(f, "invalid_envelope", "body/w: must be an integer", R"("path":"/body/w")"));
    } else if (f.op() == "publish") {
      p.send(error_for(f, "rate_limited", "too fast", R"("retry_after_ms":250)"));
    } else {
      p.send(error_for(f, "no_such_code", "what"));
    }
  }));
  auto c = connect(s);

  auto sent = c->send("bob", R"({"w":"x"})");
  REQUIRE(code_of(sent) == errc::invalid_envelope);
  CHECK(sent.error().message() == "body/w: must be an integer");
  CHECK(sent.error().path() == "/body/w");

  auto published = c->publish("news.eu", "1");
  REQUIRE(code_of(published) == errc::rate_limited);
  CHECK_THAT(published.error().message(), Catch::Contains("retry after 250 ms"));

  auto other = c->request("who");
  REQUIRE(code_of(other) == errc::internal);
  CHECK_THAT(other.error().message(), Catch::Contains("no_such_code"));
}

TEST_CASE("pushes reach the push handler while a request is pending", "[client]") {
  fake_server s(after_hello([](peer& p, const client_frame& f) {
    // Before the reply: one frame of every kind the server pushes.
    p.send(
        R"({"op":"message","seq":1,"delivery":1,"envelope":{"id":"m1","from":"bob","to":"alice","ns":"demo","ts":"2026-01-01T00:00:00.000Z","body":{"n":1}}})");
    p.send(
        R"({"op":"offer","task":"t_1","job":"resize","attempt":1,"max_attempts":3,"lease_s":30,"envelope":{"body":2}})");
    p.send(R"({"op":"event","sub":"s1","seq":9,"topic":"news.eu","envelope":{"body":3}})");
    p.send(R"({"op":"presence","participant":"w1","state":"up","reason":"registered","entry":{}})");
    p.send(R"({"op":"lease_lost","task":"t_0"})");
    p.send(R"({"op":"cancelled","task":"t_2"})");
    p.send(R"({"op":"sub_dropped","sub":"s1","reason":"slow_consumer","last_seq":9})");
    p.send(R"({"op":"error","id":null,"code":"not_found","message":"no such seq"})");
    p.send(ok_for(f, R"("participants":[])"));
  }));
  auto c = connect(s);
  push_log pushes;
  pushes.attach(*c);

  auto reply = must(c->who());
  CHECK(reply.size_at("/participants") == 0u);
  REQUIRE(eventually(2000ms, [&] { return pushes.size() == 8; }));
  CHECK(pushes.ops() == std::vector<std::string>{"message", "offer", "event", "presence",
                                                 "lease_lost", "cancelled", "sub_dropped",
                                                 "error"});
  auto message = pushes.snapshot()[0];
  CHECK(message.int_at("/seq") == 1);
  CHECK(message.string_at("/envelope/from") == "bob");
  CHECK(message.raw_at("/envelope/body") == R"({"n":1})");
}

TEST_CASE("pushes that arrive before a push handler is set are kept, in order", "[client]") {
  fake_server s([](peer& p, const fake_server::frame_in& in) {
    auto f = must(client_frame::parse(in.text));
    if (f.op() != "hello") return;
    p.send(amp::testing::welcome(f.raw_at("/id").value_or("null")));
    for (int i = 1; i <= 3; ++i) {
      p.send(R"({"op":"message","seq":)" + std::to_string(i) + R"(,"envelope":{"body":null}})");
    }
  });
  auto c = connect(s);
  std::this_thread::sleep_for(100ms);  // the backlog arrives before anyone listens
  push_log pushes;
  pushes.attach(*c);
  REQUIRE(eventually(2000ms, [&] { return pushes.size() == 3; }));
  auto frames = pushes.snapshot();
  for (int i = 0; i < 3; ++i) CHECK(frames[static_cast<std::size_t>(i)].int_at("/seq") == i + 1);
}

TEST_CASE("a request without a reply times out, and its late reply becomes a push", "[client]") {
  std::vector<client_frame> held;
  fake_server s(after_hello([&held](peer&, const client_frame& f) { held.push_back(f); }));
  auto o = options_for(s);
  o.request_timeout = 200ms;
  auto c = must(client::connect(o));
  push_log pushes;
  pushes.attach(*c);

  amp::result<client_frame> r = client_frame();
  const auto took = elapsed([&] { r = c->request("who"); });
  REQUIRE(code_of(r) == errc::unavailable);
  CHECK_THAT(r.error().message(), Catch::Contains("no reply to who"));
  CHECK(took >= 150ms);
  CHECK(took < 2s);

  s.with_peer([&](peer& p) { p.send(ok_for(held.at(0), R"("late":true)")); });
  REQUIRE(eventually(2000ms, [&] { return pushes.size() == 1; }));
  CHECK(pushes.snapshot()[0].op() == "ok");
  CHECK(pushes.snapshot()[0].bool_at("/late") == true);
  CHECK(c->is_open());
}

TEST_CASE("requests pending when the server closes fail at once with its close code", "[client]") {
  fake_server s(after_hello([](peer& p, const client_frame&) { p.close(1001, "shutdown"); }));
  std::atomic<int> closed_code{0};
  std::string closed_reason;
  auto c = connect(s);  // request_timeout 5 s
  c->on_close([&](int code, const std::string& reason) {
    closed_reason = reason;
    closed_code = code;
  });

  amp::result<client_frame> r = client_frame();
  const auto took = elapsed([&] { r = c->request("watch"); });
  REQUIRE(code_of(r) == errc::unavailable);
  CHECK_THAT(r.error().message(), Catch::Contains("1001"));
  CHECK(took < 2s);

  REQUIRE(eventually(2000ms, [&] { return closed_code == 1001; }));
  CHECK(closed_reason == "shutdown");
  CHECK(c->close_code() == 1001);
  CHECK(c->close_reason() == "shutdown");
  CHECK_FALSE(c->is_open());
  CHECK(c->wait_closed(0s));

  // After the close, requests fail without waiting, and a late close handler runs at once.
  CHECK(code_of(c->request("who")) == errc::unavailable);
  CHECK(code_of(c->notify("ack", R"("seq":1)")) == errc::unavailable);
  bool told = false;
  c->on_close([&](int code, const std::string&) { told = code == 1001; });
  CHECK(told);
}

TEST_CASE("several threads' requests all fail when the connection drops", "[client]") {
  std::atomic<int> seen{0};
  fake_server s(after_hello([&seen](peer& p, const client_frame&) {
    if (++seen == 4) p.close(1011, "crash");
  }));
  auto c = connect(s);
  std::vector<std::future<amp::result<client_frame>>> calls;
  for (int i = 0; i < 4; ++i) {
    calls.push_back(std::async(std::launch::async, [&] { return c->request("who"); }));
  }
  for (auto& call : calls) {
    REQUIRE(call.wait_for(3s) == std::future_status::ready);
    CHECK(code_of(call.get()) == errc::unavailable);
  }
  CHECK(c->close_code() == 1011);
}

TEST_CASE("a blocking request from a handler fails instead of deadlocking, async_request works",
          "[client]") {
  fake_server s(after_hello([](peer& p, const client_frame& f) {
    if (f.op() == "ping") {
      p.send(R"({"op":"message","seq":5,"envelope":{"body":1}})");
      p.send(ok_for(f));
    } else if (f.op() == "ack") {
      p.send(ok_for(f, R"("acked":)" + f.raw_at("/seq").value_or("null")));
    }
  }));
  std::promise<amp::errc> blocking;
  std::promise<amp::result<client_frame>> async_reply;
  auto c = connect(s);
  c->on_push([&](const client_frame& f) {
    if (f.op() != "message") return;
    blocking.set_value(code_of(c->request("ack", R"("seq":5)")));
    c->async_request("ack", R"({"seq":5})",
                     [&](amp::result<client_frame> r) { async_reply.set_value(std::move(r)); });
  });
  must(c->request("ping"));
  auto blocking_code = blocking.get_future();
  REQUIRE(blocking_code.wait_for(2s) == std::future_status::ready);
  CHECK(blocking_code.get() == errc::bad_request);
  auto reply = async_reply.get_future();
  REQUIRE(reply.wait_for(2s) == std::future_status::ready);
  auto acked = must(reply.get());
  CHECK(acked.int_at("/acked") == 5);
}

TEST_CASE("fields that do not make a JSON frame, and frames over max_frame_bytes, are not sent",
          "[client]") {
  fake_server s(after_hello([](peer& p, const client_frame& f) { p.send(ok_for(f)); }, 1024));
  auto c = connect(s);
  CHECK(c->max_frame_bytes() == 1024);

  CHECK(code_of(c->request("send", R"("to":)")) == errc::bad_request);
  CHECK(code_of(c->request("send", R"({"to":"bob"},{"x":1})")) == errc::bad_request);
  CHECK(code_of(c->send("bob", "{not json")) == errc::bad_request);
  CHECK(code_of(c->submit("resize", "")) == errc::bad_request);
  amp::message_options headers_not_object;
  headers_not_object.headers_json = "[1]";
  CHECK(code_of(c->send("bob", "1", headers_not_object)) == errc::bad_request);
  CHECK(code_of(c->send("bob", '"' + std::string(2000, 'x') + '"')) == errc::payload_too_large);
  CHECK(code_of(c->notify("ack", "\"seq\":")) == errc::bad_request);

  // Only hello reached the server; the connection is fine.
  CHECK(s.frames().size() == 1);
  must(c->request("who"));
  CHECK(s.frames().size() == 2);
}

TEST_CASE("send_frame and send_binary reach the server as they are, notify sends no id",
          "[client]") {
  fake_server s(after_hello([](peer& p, const client_frame& f) {
    if (f.op().empty()) {  // binary or not JSON
      p.send(R"({"op":"error","id":null,"code":"bad_request","message":"text frames only"})");
    }
  }));
  auto c = connect(s);
  push_log pushes;
  pushes.attach(*c);

  must(c->send_frame("not json at all"));
  must(c->send_binary(std::string("\x00\xff{", 3)));
  must(c->notify("ack", R"("seq":17)"));
  REQUIRE(eventually(2000ms, [&] { return s.received().size() == 4; }));
  auto in = s.received();
  CHECK(in[1].text == "not json at all");
  CHECK_FALSE(in[1].binary);
  CHECK(in[2].binary);
  CHECK(in[2].text == std::string("\x00\xff{", 3));
  CHECK(in[3].text == R"({"op":"ack","seq":17})");

  REQUIRE(eventually(2000ms, [&] { return pushes.size() == 2; }));
  for (auto& f : pushes.snapshot()) {
    CHECK(f.op() == "error");
    CHECK(f.has("/id"));
    CHECK(f.raw_at("/id") == "null");
  }
}

TEST_CASE("the request wrappers send the frames of the spec and read their replies", "[client]") {
  fake_server s(after_hello([](peer& p, const client_frame& f) {
    const auto& op = f.op();
    if (op == "send")
      p.send(ok_for(f, R"("seq":17,"msg_id":"m-1","duplicate":true)"));
    else if (op == "publish")
      p.send(ok_for(f, R"("seq":4,"duplicate":false)"));
    else if (op == "subscribe")
      p.send(ok_for(f, R"("sub":"s9")"));
    else if (op == "submit")
      p.send(ok_for(f, R"("task":"t_1","created":false)"));
    else if (op == "register")
      p.send(ok_for(f, R"("expires_in_s":30)"));
    else if (op == "claim")
      p.send(
          ok_for(f, R"("task":"t_1","attempt":2,"lease_expires_at":"2026-01-01T00:00:30.000Z")"));
    else if (op == "complete")
      p.send(ok_for(f, R"("task":"t_1","state":"completed","duplicate":true)"));
    else if (op == "fail")
      p.send(ok_for(f, R"("task":"t_1","state":"queued","attempt":2)"));
    else if (op == "heartbeat" && f.has("/task"))
      p.send(ok_for(f, R"("task":"t_1","expires_at":"2026-01-01T00:01:00.000Z")"));
    else if (op == "heartbeat")
      p.send(ok_for(f, R"("leases":[{"task":"t_1","expires_at":"x"}])"));
    else if (op == "task")
      p.send(ok_for(f, R"("task":{"task":"t_1","state":"running"},"history":[])"));
    else
      p.send(ok_for(f));
  }));
  auto c = connect(s);

  amp::message_options mo;
  mo.type = "review.request";
  mo.msg_id = "m-1";
  mo.reply_to = "alice";
  mo.correlation = "c-1";
  mo.headers_json = R"({"k":"v"})";
  auto sent = must(c->send("bob", R"( {"x": [1, 2]} )", mo));
  CHECK(sent.seq == 17);
  CHECK(sent.msg_id == "m-1");
  CHECK(sent.duplicate);
  auto f = s.frames("send").at(0);
  CHECK(f.string_at("/to") == "bob");
  CHECK(f.raw_at("/body") == R"({"x":[1,2]})");
  CHECK(f.string_at("/type") == "review.request");
  CHECK(f.string_at("/msg_id") == "m-1");
  CHECK(f.string_at("/reply_to") == "alice");
  CHECK(f.string_at("/correlation") == "c-1");
  CHECK(f.string_at("/headers/k") == "v");

  must(c->ack(17));
  must(c->nack(18, 1500ms));
  must(c->nack(19));
  CHECK(s.frames("ack").at(0).int_at("/seq") == 17);
  CHECK(s.frames("nack").at(0).int_at("/delay_ms") == 1500);
  CHECK_FALSE(s.frames("nack").at(1).has("/delay_ms"));

  auto published = must(c->publish("news.eu", "\"hi\""));
  CHECK(published.seq == 4);
  CHECK_FALSE(published.duplicate);
  CHECK(s.frames("publish").at(0).string_at("/topic") == "news.eu");

  CHECK(must(c->subscribe("news.>", amp::subscribe_from::at_seq(8), "mine")) == "s9");
  auto sub = s.frames("subscribe").at(0);
  CHECK(sub.string_at("/topic") == "news.>");
  CHECK(sub.int_at("/from/seq") == 8);
  CHECK(sub.string_at("/sub") == "mine");
  must(c->subscribe("news.*"));
  CHECK(s.frames("subscribe").at(1).string_at("/from") == "new");
  CHECK_FALSE(s.frames("subscribe").at(1).has("/sub"));
  must(c->unsubscribe("s9"));
  CHECK(s.frames("unsubscribe").at(0).string_at("/sub") == "s9");

  amp::submit_options so;
  so.max_attempts = 5;
  so.idempotency_key = "order-42";
  auto submitted = must(c->submit("resize", R"({"w":640})", so));
  CHECK(submitted.task == "t_1");
  CHECK_FALSE(submitted.created);
  auto sf = s.frames("submit").at(0);
  CHECK(sf.string_at("/job") == "resize");
  CHECK(sf.int_at("/max_attempts") == 5);
  CHECK(sf.string_at("/idempotency_key") == "order-42");
  CHECK(sf.raw_at("/body") == R"({"w":640})");

  CHECK(must(c->register_worker({"resize", "thumb"}, 4, R"({"host":"a"})")) == 30);
  auto rf = s.frames("register").at(0);
  CHECK(rf.raw_at("/jobs") == R"(["resize","thumb"])");
  CHECK(rf.int_at("/slots") == 4);
  CHECK(rf.string_at("/meta/host") == "a");

  auto claimed = must(c->claim("t_1"));
  CHECK(claimed.attempt == 2);
  CHECK(claimed.lease_expires_at == "2026-01-01T00:00:30.000Z");

  auto completed = must(c->complete("t_1", R"({"url":"x"})"));
  CHECK(completed.duplicate);
  CHECK(s.frames("complete").at(0).raw_at("/result") == R"({"url":"x"})");

  amp::fail_options fo;
  fo.retry_delay = 250ms;
  auto failed = must(c->fail("t_1", "exit_3", "boom", fo));
  CHECK(failed.state == "queued");
  CHECK(failed.attempt == 2);
  auto ff = s.frames("fail").at(0);
  CHECK(ff.string_at("/error/code") == "exit_3");
  CHECK(ff.string_at("/error/message") == "boom");
  CHECK(ff.bool_at("/retry") == true);
  CHECK(ff.int_at("/retry_delay_ms") == 250);

  auto beat = must(c->heartbeat());
  CHECK(beat.string_at("/leases/0/task") == "t_1");
  CHECK(must(c->heartbeat("t_1")) == "2026-01-01T00:01:00.000Z");
  must(c->decline("t_2"));
  must(c->cancel("t_3"));
  CHECK(s.frames("cancel").at(0).string_at("/task") == "t_3");

  auto record = must(c->task("t_1", true));
  CHECK(record.string_at("/task/state") == "running");
  CHECK(s.frames("task").at(0).bool_at("/history") == true);
  must(c->who("resize"));
  CHECK(s.frames("who").at(0).string_at("/job") == "resize");
  must(c->watch());
}

TEST_CASE("bye ends the session: the server's close 1000 is success", "[client]") {
  SECTION("ok, then close") {
    fake_server s(after_hello([](peer& p, const client_frame& f) {
      p.send(ok_for(f));
      p.close(1000, "bye");
    }));
    auto c = connect(s);
    must(c->bye());
    CHECK(c->close_code() == 1000);
  }
  SECTION("close without ok") {
    fake_server s(after_hello([](peer& p, const client_frame&) { p.close(1000, "bye"); }));
    auto c = connect(s);
    must(c->bye());
    CHECK(c->close_code() == 1000);
  }
}

TEST_CASE("close() ends the connection with the code given", "[client]") {
  fake_server s(after_hello(nullptr));
  auto c = connect(s);
  c->close(4000, "done here");
  CHECK_FALSE(c->is_open());
  CHECK(c->close_code() == 4000);  // the server echoes the client's code
  CHECK(code_of(c->request("who")) == errc::unavailable);
}

// ---------------------------------------------------------------------------------------
// Frames

TEST_CASE("client_frame reads members by JSON Pointer", "[client][frame]") {
  auto f = must(client_frame::parse(
      R"({"op":"ok","id":7,"seq":17,"big":1e3,"flag":false,"s":"a\"b","nested":{"a/b":[1,{"c":null}],"m~n":2},"empty":[]})"));
  CHECK(f.op() == "ok");
  CHECK(f.int_at("/seq") == 17);
  CHECK_FALSE(f.int_at("/s"));
  CHECK_FALSE(f.int_at("/big"));
  CHECK(f.number_at("/big") == 1000.0);
  CHECK(f.number_at("/seq") == 17.0);
  CHECK(f.bool_at("/flag") == false);
  CHECK(f.string_at("/s") == "a\"b");
  CHECK_FALSE(f.string_at("/seq"));
  CHECK(f.raw_at("/nested/a~1b") == R"([1,{"c":null}])");
  CHECK(f.int_at("/nested/a~1b/0") == 1);
  CHECK(f.raw_at("/nested/a~1b/1/c") == "null");
  CHECK(f.int_at("/nested/m~0n") == 2);
  CHECK(f.has("/nested/a~1b/1/c"));
  CHECK_FALSE(f.has("/nested/zz"));
  CHECK_FALSE(f.has("/nested/a~1b/5"));
  CHECK(f.size_at("/nested/a~1b") == 2u);
  CHECK(f.size_at("/nested") == 2u);
  CHECK(f.size_at("/empty") == 0u);
  CHECK_FALSE(f.size_at("/seq"));
  CHECK(f.raw_at("/s") == R"("a\"b")");
  CHECK(f.raw_at("")->starts_with(R"({"op":"ok","id":7,)"));
  CHECK(
      f.result_json() ==
      R"({"seq":17,"big":1000.0,"flag":false,"s":"a\"b","nested":{"a/b":[1,{"c":null}],"m~n":2},"empty":[]})");
}

TEST_CASE("client_frame::parse refuses what is not one JSON object", "[client][frame]") {
  CHECK(code_of(client_frame::parse("")) == errc::bad_request);
  CHECK(code_of(client_frame::parse("[1]")) == errc::bad_request);
  CHECK(code_of(client_frame::parse(R"({"op":)")) == errc::bad_request);
  CHECK(code_of(client_frame::parse("\"op\"")) == errc::bad_request);
  auto no_op = must(client_frame::parse(R"({"id":1})"));
  CHECK(no_op.op().empty());
  client_frame empty;
  CHECK(empty.op().empty());
  CHECK(empty.text().empty());
  CHECK_FALSE(empty.has(""));
  CHECK(empty.result_json() == "{}");
}

TEST_CASE("subscribe_from parses the command-line spelling and writes the wire's", "[client]") {
  CHECK(must(amp::subscribe_from::parse("new")).to_json() == R"("new")");
  CHECK(must(amp::subscribe_from::parse("all")).to_json() == R"("all")");
  CHECK(must(amp::subscribe_from::parse("last")).to_json() == R"("last")");
  CHECK(must(amp::subscribe_from::parse("seq:42")).to_json() == R"({"seq":42})");
  CHECK(must(amp::subscribe_from::parse("time:2026-11-30T12:00:00.123Z")).to_json() ==
        R"({"time":"2026-11-30T12:00:00.123Z"})");
  for (const char* bad : {"", "old", "seq:", "seq:0", "seq:-1", "seq:1x", "time:yesterday",
                          "time:2026-02-30T00:00:00Z"}) {
    INFO(bad);
    CHECK(code_of(amp::subscribe_from::parse(bad)) == errc::bad_request);
  }
}
