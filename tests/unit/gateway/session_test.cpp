// The session gateway driven frame by frame (spec amp.v1), on the memory transport with a
// manual clock: every op, every error code, the order of the checks.

#include <catch2/catch.hpp>

#include <fmt/format.h>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>

#include "broker/cases/faulty_transport.hpp"
#include "unit/gateway/session_rig.hpp"

namespace {

using namespace std::chrono_literals;
using amp::testing::frame;
using amp::testing::gateway_rig;
using amp::testing::wire;

// A rig whose backend is a faulty_transport over the memory transport; jobs have a 10 s
// lease, registry entries live 600 s.
struct faulty_rig {
  std::shared_ptr<amp::broker_testing::faulty_transport> faults;
  gateway_rig rig{[](amp::server_config& c) {
                    c.default_job.lease_s = 10;
                    c.registry_ttl_s = 600;
                  },
                  4u << 20, amp::inline_executor(),
                  [this](std::shared_ptr<amp::transport> inner) {
                    faults =
                        std::make_shared<amp::broker_testing::faulty_transport>(std::move(inner));
                    return faults;
                  }};
};

}  // namespace

TEST_CASE("hello answers with the session's facts, other ops before it are unauthenticated",
          "[session]") {
  gateway_rig rig;
  auto w = rig.open();
  auto early = w.request(R"({"op":"send","id":1,"to":"bob","body":1})", "1");
  CHECK(early.code() == "unauthenticated");
  CHECK_FALSE(w.carrier->close_code.has_value());

  auto ok = w.request(R"({"op":"hello","id":2,"token":")" + rig.token("alice") + "\"}", "2");
  REQUIRE(ok.op() == "ok");
  CHECK(ok.str("/participant") == "alice");
  CHECK(ok.str("/ns") == "demo");
  CHECK(ok.num("/heartbeat_s") == 10);
  CHECK(ok.num("/registry_ttl_s") == 30);
  CHECK(ok.num("/max_frame_bytes") == 1048576);
  CHECK(ok.str("/server") == "amp-test/1");
  CHECK(ok.str("/session") == w.s->id());
  CHECK(rig.gw->sessions() == 1);

  auto again = w.request(R"({"op":"hello","id":3,"token":")" + rig.token("alice") + "\"}", "3");
  CHECK(again.code() == "bad_request");
}

TEST_CASE("a failed hello is unauthenticated and closes with 4401", "[session]") {
  gateway_rig rig;
  auto w = rig.open();
  auto bad = w.request(R"({"op":"hello","id":1,"token":"not.a.token"})", "1");
  CHECK(bad.code() == "unauthenticated");
  CHECK(w.carrier->close_code == 4401);
  CHECK(rig.gw->sessions() == 0);

  auto other = rig.open();
  auto forged = amp::testing::must(
      amp::mint_token({.sub = "alice", .ns = "demo", .exp = rig.clock->now() + 1h},
                      amp::jwt_alg::hs256, "another-secret-another-secret-another"));
  CHECK(other.request(R"({"op":"hello","id":1,"token":")" + forged + "\"}", "1").code() ==
        "unauthenticated");
  CHECK(other.carrier->close_code == 4401);
}

TEST_CASE("no hello within 5 s: unauthenticated with id null, close 4401", "[session]") {
  gateway_rig rig;
  auto w = rig.open();
  rig.clock->advance(4900ms);
  CHECK_FALSE(w.carrier->close_code.has_value());
  rig.clock->advance(200ms);
  auto e = w.next("error");
  REQUIRE(e);
  CHECK(e->code() == "unauthenticated");
  CHECK(e->raw("/id") == "null");
  CHECK(w.carrier->close_code == 4401);

  auto in_time = rig.connect("alice");
  rig.clock->advance(10s);
  CHECK_FALSE(in_time.carrier->close_code.has_value());
}

TEST_CASE("over max_sessions hello is limit_exceeded and closes with 1013", "[session]") {
  gateway_rig rig([](amp::server_config& c) { c.limits.max_sessions = 2; });
  auto a = rig.connect("a");
  auto b = rig.connect("b");
  auto c = rig.open();
  auto r = c.request(R"({"op":"hello","id":1,"token":")" + rig.token("c") + "\"}", "1");
  CHECK(r.code() == "limit_exceeded");
  CHECK(c.carrier->close_code == 1013);
  a.s->closed();
  auto d = rig.connect("d");  // a's place is free again
  CHECK(rig.gw->sessions() == 2);
}

TEST_CASE("over limits.max_pending a new connection is closed with 1013 before hello",
          "[session]") {
  gateway_rig rig([](amp::server_config& c) { c.limits.max_pending = 2; });
  auto a = rig.open();
  auto b = rig.open();
  auto c = rig.open();  // the third waiting for hello
  CHECK(c.carrier->close_code == 1013);
  c.s->closed();  // the carrier reports the close
  CHECK_FALSE(a.carrier->close_code);
  CHECK_FALSE(b.carrier->close_code);
  // Once one says hello, there is room for one more.
  CHECK(a.request(R"({"op":"hello","id":1,"token":")" + rig.token("a") + "\"}", "1").op() == "ok");
  auto d = rig.open();
  CHECK_FALSE(d.carrier->close_code);
  CHECK(d.request(R"({"op":"hello","id":1,"token":")" + rig.token("d") + "\"}", "1").op() == "ok");
  CHECK(rig.gw->sessions() == 2);
}

TEST_CASE("bad frames are bad_request, with id null when the id cannot be used, the session stays",
          "[session]") {
  gateway_rig rig;
  auto w = rig.connect("alice");
  w.send("{nope");
  auto e = w.next("error");
  REQUIRE(e);
  CHECK(e->code() == "bad_request");
  CHECK(e->raw("/id") == "null");
  w.send("[1,2]");
  CHECK(w.next("error")->code() == "bad_request");
  w.send(R"({"op":"who","id":{"x":1}})");
  e = w.next("error");
  CHECK(e->code() == "bad_request");
  CHECK(e->raw("/id") == "null");
  w.send(R"({"op":"who","id":")" + std::string(65, 'x') + "\"}");
  CHECK(w.next("error")->raw("/id") == "null");
  CHECK(w.request(R"({"op":"frobnicate","id":7})", "7").code() == "bad_request");
  CHECK(w.request(R"({"id":8})", "8").code() == "bad_request");
  CHECK(w.request(R"({"op":"send","id":9,"body":1})", "9").code() == "bad_request");
  // type before name, name before grant
  CHECK(w.request(R"({"op":"send","id":10,"to":42,"body":1})", "10").code() == "bad_request");
  auto none = rig.connect("nobody", "{}");
  CHECK(none.request(R"({"op":"send","id":11,"to":"Bob","body":1})", "11").code() ==
        "invalid_name");
  CHECK(none.request(R"({"op":"send","id":12,"to":"bob","body":1})", "12").code() == "forbidden");
  w.s->receive_binary();
  e = w.next("error");
  REQUIRE(e);
  CHECK(e->code() == "bad_request");
  CHECK(e->raw("/id") == "null");
  // a request without id gets no ok, but its failure is reported with id null
  w.send(R"({"op":"who"})");
  CHECK(w.count("ok") == 0);
  w.send(R"({"op":"ack","seq":999})");
  e = w.next("error");
  REQUIRE(e);
  CHECK(e->code() == "not_found");
  CHECK(e->raw("/id") == "null");
  CHECK(w.request(R"({"op":"who","id":-5})", "-5").op() == "ok");
  CHECK_FALSE(w.carrier->close_code.has_value());
}

TEST_CASE(
    "send stamps from, dedups msg_id, delivers to every session of the recipient, ack and nack",
    "[session]") {
  gateway_rig rig;
  auto alice = rig.connect("alice");
  auto bob1 = rig.connect("bob");
  auto bob2 = rig.connect("bob");
  auto sent = alice.request(
      R"({"op":"send","id":1,"to":"bob","from":"mallory","body":{"x":1},"type":"review.request",)"
      R"("headers":{"k":"v"},"msg_id":"m-1","reply_to":"alice","correlation":"c-1"})",
      "1");
  REQUIRE(sent.op() == "ok");
  CHECK(sent.str("/msg_id") == "m-1");
  CHECK_FALSE(sent.flag("/duplicate"));
  auto seq = sent.num("/seq");
  for (auto* b : {&bob1, &bob2}) {
    auto m = b->next("message");
    REQUIRE(m);
    CHECK(m->num("/seq") == seq);
    CHECK(m->num("/delivery") == 1);
    CHECK(m->str("/envelope/from") == "alice");
    CHECK(m->str("/envelope/to") == "bob");
    CHECK(m->str("/envelope/id") == "m-1");
    CHECK(m->str("/envelope/ns") == "demo");
    CHECK(m->raw("/envelope/body") == R"({"x":1})");
    CHECK(m->str("/envelope/headers/k") == "v");
    CHECK(m->str("/envelope/correlation") == "c-1");
  }
  auto dup = alice.request(R"({"op":"send","id":2,"to":"bob","body":{"x":2},"msg_id":"m-1"})", "2");
  CHECK(dup.flag("/duplicate"));
  CHECK(dup.num("/seq") == seq);
  CHECK(bob1.count("message") == 0);

  CHECK(bob1.request(R"({"op":"nack","id":3,"seq":)" + std::to_string(seq) + "}", "3").op() ==
        "ok");
  auto again = bob2.next("message");
  REQUIRE(again);
  CHECK(again->num("/delivery") == 2);
  CHECK(bob2.request(R"({"op":"ack","id":4,"seq":)" + std::to_string(seq) + "}", "4").op() == "ok");
  CHECK(bob1.request(R"({"op":"ack","id":5,"seq":)" + std::to_string(seq) + "}", "5").code() ==
        "not_found");
}

TEST_CASE(
    "unacked inbox messages come again after inbox_ack_s, messages wait for an absent recipient",
    "[session]") {
  gateway_rig rig([](amp::server_config& c) { c.inbox_ack_s = 5; });
  auto alice = rig.connect("alice");
  REQUIRE(alice.request(R"({"op":"send","id":1,"to":"carol","body":"hi"})", "1").op() == "ok");
  auto carol = rig.connect("carol");
  auto m = carol.next("message");
  REQUIRE(m);
  CHECK(m->raw("/envelope/body") == R"("hi")");
  rig.clock->advance(6s);
  auto again = carol.next("message");
  REQUIRE(again);
  CHECK(again->num("/delivery") == 2);
}

TEST_CASE("payload_too_large, invalid_envelope and body schemas come in the spec's order",
          "[session]") {
  gateway_rig rig([](amp::server_config& c) { c.limits.max_body_bytes = 64; });
  auto w = rig.connect("alice");
  auto big = w.request(R"({"op":"send","id":1,"to":"bob","type":"bad type!","body":")" +
                           std::string(100, 'x') + "\"}",
                       "1");
  CHECK(big.code() == "payload_too_large");
  auto bad_type = w.request(R"({"op":"send","id":2,"to":"bob","type":"bad type!","body":1})", "2");
  CHECK(bad_type.code() == "invalid_envelope");
  CHECK(bad_type.str("/path") == "/type");
  auto bad_header =
      w.request(R"({"op":"publish","id":3,"topic":"news.eu","headers":{"":"v"},"body":1})", "3");
  CHECK(bad_header.code() == "invalid_envelope");
}

TEST_CASE("publish and subscribe with replay, ok comes before the events, sub names", "[session]") {
  gateway_rig rig([](amp::server_config& c) { c.limits.max_subscriptions = 2; });
  auto pub = rig.connect("pub");
  for (int i = 0; i < 3; ++i) {
    auto r = pub.request(
        R"({"op":"publish","id":1,"topic":"news.eu","body":)" + std::to_string(i) + "}", "1");
    REQUIRE(r.op() == "ok");
  }
  REQUIRE(pub.request(R"({"op":"publish","id":2,"topic":"sport.eu","body":9})", "2").op() == "ok");
  auto sub = rig.connect("sub", R"({"subscribe":["news.>"]})");
  sub.send(R"({"op":"subscribe","id":3,"topic":"news.*","from":"all"})");
  sub.collect();
  REQUIRE(sub.seen.size() == 4);
  CHECK(sub.seen[0].op() == "ok");
  auto name = sub.seen[0].str("/sub");
  CHECK(name == "_s1");  // outside the names a client may choose
  for (int i = 0; i < 3; ++i) {
    CHECK(sub.seen[1 + i].op() == "event");
    CHECK(sub.seen[1 + i].str("/sub") == name);
    CHECK(sub.seen[1 + i].raw("/envelope/body") == std::to_string(i));
    CHECK(sub.seen[1 + i].str("/topic") == "news.eu");
  }
  sub.seen.clear();
  CHECK(sub.request(R"({"op":"subscribe","id":4,"topic":">","sub":"x"})", "4").code() ==
        "forbidden");
  // The server's names are outside those a client makes up: "s1" is free; "_s1" is in use.
  CHECK(sub.request(R"({"op":"subscribe","id":5,"topic":"news.eu","sub":"_s1"})", "5").code() ==
        "conflict");
  CHECK(sub.request(R"({"op":"unsubscribe","id":51,"sub":"_x"})", "51").code() == "invalid_name");
  REQUIRE(sub.request(R"({"op":"subscribe","id":52,"topic":"news.eu","sub":"s1"})", "52").op() ==
          "ok");
  CHECK(sub.request(R"({"op":"subscribe","id":53,"topic":"news.eu","sub":"s1"})", "53").code() ==
        "conflict");
  CHECK(sub.request(R"({"op":"unsubscribe","id":54,"sub":"s1"})", "54").op() == "ok");
  CHECK(
      sub.request(R"({"op":"subscribe","id":6,"topic":"news.eu","sub":"last","from":"last"})", "6")
          .op() == "ok");
  auto last = sub.next("event");
  REQUIRE(last);
  CHECK(last->raw("/envelope/body") == "2");
  CHECK(sub.request(R"({"op":"subscribe","id":7,"topic":"news.eu"})", "7").code() ==
        "limit_exceeded");
  CHECK(sub.request(R"({"op":"unsubscribe","id":8,"sub":"last"})", "8").op() == "ok");
  CHECK(sub.request(R"({"op":"unsubscribe","id":9,"sub":"last"})", "9").code() == "not_found");
  REQUIRE(pub.request(R"({"op":"publish","id":10,"topic":"news.eu","body":3,"msg_id":"d"})", "10")
              .op() == "ok");
  auto dup =
      pub.request(R"({"op":"publish","id":11,"topic":"news.eu","body":3,"msg_id":"d"})", "11");
  CHECK(dup.flag("/duplicate"));
  CHECK(sub.count("event") == 1);
  CHECK(pub.request(R"({"op":"publish","id":12,"topic":"news.*","body":1})", "12").code() ==
        "invalid_name");
  CHECK(sub.request(R"({"op":"unsubscribe","id":91,"sub":")" + name + R"("})", "91").op() == "ok");
  CHECK(sub.request(R"({"op":"unsubscribe","id":92,"sub":")" + name + R"("})", "92").code() ==
        "not_found");
}

TEST_CASE("a subscriber that does not read is dropped with the seq to resume from", "[session]") {
  gateway_rig rig({}, 4096);
  auto pub = rig.connect("pub");
  auto sub = rig.connect("sub");
  REQUIRE(sub.request(R"({"op":"subscribe","id":1,"topic":"feed","sub":"f"})", "1").op() == "ok");
  REQUIRE(pub.request(R"({"op":"publish","id":1,"topic":"feed","body":1})", "1").op() == "ok");
  REQUIRE(sub.next("event"));
  sub.carrier->buffered = 4000;  // the client stopped reading
  auto second = pub.request(R"({"op":"publish","id":2,"topic":"feed","body":2})", "2");
  auto dropped = sub.next("sub_dropped");
  REQUIRE(dropped);
  CHECK(dropped->str("/sub") == "f");
  CHECK(dropped->str("/reason") == "slow_consumer");
  CHECK(dropped->num("/last_seq") == second.num("/seq") - 1);
  sub.carrier->buffered = 0;
  auto resumed = sub.request(R"({"op":"subscribe","id":2,"topic":"feed","sub":"f","from":{"seq":)" +
                                 std::to_string(dropped->num("/last_seq") + 1) + "}}",
                             "2");
  REQUIRE(resumed.op() == "ok");
  auto ev = sub.next("event");
  REQUIRE(ev);
  CHECK(ev->num("/seq") == second.num("/seq"));
}

TEST_CASE("a client whose frames pile up past four times the limit is closed with 1008",
          "[session]") {
  gateway_rig rig({}, 1024);
  auto alice = rig.connect("alice");
  auto bob = rig.connect("bob");
  bob.carrier->buffered = 5000;
  REQUIRE(alice.request(R"({"op":"send","id":1,"to":"bob","body":1})", "1").op() == "ok");
  CHECK(bob.carrier->close_code == 1008);
}

TEST_CASE("jobs: offer, claim, complete, and the submitter's notice", "[session]") {
  gateway_rig rig;
  auto worker = rig.connect("w1");
  auto reg = worker.request(R"({"op":"register","id":1,"jobs":["resize"],"slots":2})", "1");
  REQUIRE(reg.op() == "ok");
  CHECK(reg.num("/expires_in_s") == 30);
  auto producer = rig.connect("prod");
  auto sub = producer.request(
      R"({"op":"submit","id":2,"job":"resize","body":{"w":640},"type":"img.resize"})", "2");
  REQUIRE(sub.op() == "ok");
  CHECK(sub.flag("/created"));
  auto task = sub.str("/task");
  auto offer = worker.next("offer");
  REQUIRE(offer);
  CHECK(offer->str("/task") == task);
  CHECK(offer->str("/job") == "resize");
  CHECK(offer->num("/attempt") == 1);
  CHECK(offer->num("/max_attempts") == 3);
  CHECK(offer->num("/lease_s") == 30);
  CHECK(offer->str("/envelope/from") == "prod");
  CHECK(offer->str("/envelope/to") == "resize");
  CHECK(offer->raw("/envelope/body") == R"({"w":640})");

  auto claim = worker.request(R"({"op":"claim","id":3,"task":")" + task + "\"}", "3");
  REQUIRE(claim.op() == "ok");
  CHECK(claim.num("/attempt") == 1);
  CHECK(claim.has("/lease_expires_at"));
  CHECK(worker.request(R"({"op":"claim","id":4,"task":")" + task + "\"}", "4").code() ==
        "not_found");

  auto hb = worker.request(R"({"op":"heartbeat","id":5})", "5");
  REQUIRE(hb.op() == "ok");
  CHECK(hb.str("/leases/0/task") == task);
  auto one = worker.request(R"({"op":"heartbeat","id":6,"task":")" + task + "\"}", "6");
  CHECK(one.str("/task") == task);

  auto done = worker.request(
      R"({"op":"complete","id":7,"task":")" + task + R"(","result":{"ok":true}})", "7");
  REQUIRE(done.op() == "ok");
  CHECK(done.str("/state") == "completed");
  auto again = worker.request(
      R"({"op":"complete","id":8,"task":")" + task + R"(","result":{"ok":true}})", "8");
  CHECK(again.flag("/duplicate"));

  auto notice = producer.next("message");
  REQUIRE(notice);
  CHECK(notice->str("/envelope/from") == "$broker");
  CHECK(notice->str("/envelope/type") == "amp.task.completed");
  CHECK(notice->str("/envelope/body/task") == task);
  CHECK(notice->raw("/envelope/body/result") == R"({"ok":true})");

  auto record =
      producer.request(R"({"op":"task","id":9,"task":")" + task + R"(","history":true})", "9");
  REQUIRE(record.op() == "ok");
  CHECK(record.str("/task/state") == "completed");
  CHECK(record.str("/history/0/state") == "queued");
  auto stranger = rig.connect("stranger");
  CHECK(stranger.request(R"({"op":"task","id":10,"task":")" + task + "\"}", "10").code() ==
        "not_found");
  auto admin = rig.connect("root", R"({"admin":true})");
  CHECK(admin.request(R"({"op":"task","id":11,"task":")" + task + "\"}", "11").op() == "ok");
}

TEST_CASE(
    "the lease-expiry story: claim, silence, lease_lost, offered again, late complete refused",
    "[session]") {
  gateway_rig rig([](amp::server_config& c) {
    c.default_job.lease_s = 10;
    c.default_job.max_attempts = 2;
    c.registry_ttl_s = 600;
  });
  auto worker = rig.connect("w1");
  REQUIRE(worker.request(R"({"op":"register","id":1,"jobs":["resize"]})", "1").op() == "ok");
  auto producer = rig.connect("prod");
  auto task =
      producer.request(R"({"op":"submit","id":2,"job":"resize","body":1})", "2").str("/task");
  REQUIRE(worker.next("offer"));
  REQUIRE(worker.request(R"({"op":"claim","id":3,"task":")" + task + "\"}", "3").op() == "ok");
  rig.clock->advance(11s);
  auto lost = worker.next("lease_lost");
  REQUIRE(lost);
  CHECK(lost->str("/task") == task);
  rig.clock->advance(2s);
  auto offer = worker.next("offer");
  REQUIRE(offer);
  CHECK(offer->num("/attempt") == 2);
  CHECK(worker.request(R"({"op":"complete","id":4,"task":")" + task + "\"}", "4").code() ==
        "lease_lost");
  // the second claim is the last attempt; its lease runs out too: failed, attempts_exhausted
  REQUIRE(worker.request(R"({"op":"claim","id":5,"task":")" + task + "\"}", "5").op() == "ok");
  rig.clock->advance(11s);
  REQUIRE(worker.next("lease_lost"));
  rig.clock->advance(5s);
  auto notice = producer.next("message");
  REQUIRE(notice);
  CHECK(notice->str("/envelope/type") == "amp.task.failed");
  CHECK(notice->str("/envelope/body/error/code") == "attempts_exhausted");
}

TEST_CASE(
    "leases per session: heartbeat extends this session's, a task heartbeat adopts, the fence",
    "[session]") {
  gateway_rig rig;
  auto a = rig.connect("w1");
  auto b = rig.connect("w1");  // the same participant, another connection
  REQUIRE(a.request(R"({"op":"register","id":1,"jobs":["resize"]})", "1").op() == "ok");
  auto producer = rig.connect("prod");
  auto task =
      producer.request(R"({"op":"submit","id":2,"job":"resize","body":1})", "2").str("/task");
  REQUIRE(a.next("offer"));
  REQUIRE(a.request(R"({"op":"claim","id":3,"task":")" + task + "\"}", "3").num("/attempt") == 1);

  auto mine = a.request(R"({"op":"heartbeat","id":4})", "4");
  CHECK(mine.str("/leases/0/task") == task);
  auto none = b.request(R"({"op":"heartbeat","id":5})", "5");
  REQUIRE(none.op() == "ok");
  CHECK(none.raw("/leases") == "[]");

  CHECK(
      b.request(R"({"op":"heartbeat","id":6,"task":")" + task + R"(","attempt":2})", "6").code() ==
      "lease_lost");
  CHECK(b.request(R"({"op":"heartbeat","id":7,"task":")" + task + R"(","attempt":"1"})", "7")
            .code() == "bad_request");
  CHECK(b.request(R"({"op":"heartbeat","id":8,"task":")" + task + R"(","attempt":4294967297})",
                  "8")
            .code() == "lease_lost");  // not narrowed to attempt 1
  auto adopted =
      b.request(R"({"op":"heartbeat","id":9,"task":")" + task + R"(","attempt":1})", "9");
  REQUIRE(adopted.op() == "ok");
  CHECK(b.request(R"({"op":"heartbeat","id":10})", "10").str("/leases/0/task") == task);

  CHECK(
      a.request(R"({"op":"complete","id":11,"task":")" + task + R"(","attempt":2})", "11").code() ==
      "lease_lost");
  CHECK(a.request(R"({"op":"fail","id":12,"task":")" + task +
                      R"(","attempt":0,"error":{"code":"x","message":"y"}})",
                  "12")
            .code() == "lease_lost");
  auto record = producer.request(R"({"op":"task","id":13,"task":")" + task + "\"}", "13");
  CHECK(record.str("/task/state") == "running");
  auto done = a.request(
      R"({"op":"complete","id":14,"task":")" + task + R"(","attempt":1,"result":"ok"})", "14");
  REQUIRE(done.op() == "ok");
  CHECK(done.str("/state") == "completed");
}

TEST_CASE("a lease whose end the backend could not judge is judged when it is back: no stall",
          "[session]") {
  faulty_rig f;
  auto& rig = f.rig;
  auto& faults = f.faults;
  auto worker = rig.connect("w1");
  REQUIRE(worker.request(R"({"op":"register","id":1,"jobs":["j"],"slots":1})", "1").op() == "ok");
  auto producer = rig.connect("prod");
  auto first = producer.request(R"({"op":"submit","id":2,"job":"j","body":1})", "2").str("/task");
  REQUIRE(worker.next("offer"));
  REQUIRE(worker.request(R"({"op":"claim","id":3,"task":")" + first + "\"}", "3").op() == "ok");
  auto second = producer.request(R"({"op":"submit","id":4,"job":"j","body":2})", "4").str("/task");
  CHECK_FALSE(worker.next("offer"));  // its one slot is taken

  faults->set_fault([](std::string_view op, std::string_view) -> std::optional<amp::error> {
    if (op == "kv_get") return amp::error(amp::errc::unavailable, "backend away");
    return std::nullopt;
  });
  rig.clock->advance(11s);
  CHECK_FALSE(worker.next("lease_lost"));
  faults->set_fault({});
  rig.clock->advance(2s);
  auto lost = worker.next("lease_lost");
  REQUIRE(lost);
  CHECK(lost->str("/task") == first);
  rig.clock->advance(2s);
  auto offer = worker.next("offer");
  REQUIRE(offer);
  std::set<std::string> tasks{first, second};
  CHECK(tasks.contains(offer->str("/task")));
}

TEST_CASE("the slot of an offer being claimed is not offered again before the claim's answer",
          "[session]") {
  faulty_rig f;
  auto& rig = f.rig;
  auto& faults = f.faults;
  auto w1 = rig.connect("w1");
  REQUIRE(w1.request(R"({"op":"register","id":1,"jobs":["j"],"slots":1})", "1").op() == "ok");
  auto producer = rig.connect("prod");
  auto first = producer.request(R"({"op":"submit","id":2,"job":"j","body":1})", "2").str("/task");
  auto offered = w1.next("offer");
  REQUIRE(offered);
  REQUIRE(offered->str("/task") == first);
  // The claim's write stays unanswered: w1's one slot is neither free nor leased yet.
  faults->defer_updates([](std::string_view) { return true; });
  w1.send(R"({"op":"claim","id":3,"task":")" + first + "\"}");
  auto second = producer.request(R"({"op":"submit","id":4,"job":"j","body":2})", "4").str("/task");
  // A second worker registering offers the job's work again: the second task goes to it,
  // not to w1.
  auto w2 = rig.connect("w2");
  REQUIRE(w2.request(R"({"op":"register","id":5,"jobs":["j"],"slots":1})", "5").op() == "ok");
  auto to_w2 = w2.next("offer");
  REQUIRE(to_w2);
  CHECK(to_w2->str("/task") == second);
  CHECK_FALSE(w1.next("offer"));
  CHECK(faults->release_deferred() == 1);
  w1.collect();
  CHECK(w1.count("ok") == 1);
  CHECK_FALSE(w1.next("offer"));
}

TEST_CASE(
    "the task for a slot that a complete frees is fetched meanwhile, offered after its answer",
    "[session]") {
  faulty_rig f;
  auto& rig = f.rig;
  auto& faults = f.faults;
  auto w1 = rig.connect("w1");
  REQUIRE(w1.request(R"({"op":"register","id":1,"jobs":["j"],"slots":1})", "1").op() == "ok");
  auto producer = rig.connect("prod");
  auto first = producer.request(R"({"op":"submit","id":2,"job":"j","body":1})", "2").str("/task");
  REQUIRE(w1.next("offer"));
  auto claimed = w1.request(R"({"op":"claim","id":3,"task":")" + first + "\"}", "3");
  REQUIRE(claimed.op() == "ok");
  const auto attempt = std::to_string(claimed.num("/attempt"));
  auto second = producer.request(R"({"op":"submit","id":4,"job":"j","body":2})", "4").str("/task");
  CHECK_FALSE(w1.next("offer"));  // its one slot is taken

  // A complete that names another attempt fails at once: the task fetched meanwhile finds
  // no free slot and is handed back, not lost.
  auto wrong = w1.request(
      R"({"op":"complete","id":5,"task":")" + first + R"(","attempt":99,"result":1})", "5");
  CHECK(wrong.code() == "lease_lost");
  CHECK_FALSE(w1.next("offer"));

  // The complete's write stays unanswered: the second task is fetched, but not offered.
  std::atomic<int> fetches{0};
  faults->set_fault([&](std::string_view op, std::string_view) -> std::optional<amp::error> {
    if (op == "fetch") ++fetches;
    return std::nullopt;
  });
  faults->defer_updates([](std::string_view) { return true; });
  w1.send(R"({"op":"complete","id":6,"task":")" + first + R"(","attempt":)" + attempt +
          R"(,"result":1})");
  CHECK(fetches.load() == 1);
  CHECK_FALSE(w1.next("offer"));
  CHECK(w1.count("ok") == 0);
  CHECK(faults->release_deferred() >= 1);
  // The answer first, then the offer of the second task to the freed slot.
  w1.collect();
  REQUIRE(w1.seen.size() >= 2);
  CHECK(w1.seen[0].op() == "ok");
  CHECK(w1.seen[0].raw("/id") == "6");
  auto offered = w1.next("offer");
  REQUIRE(offered);
  CHECK(offered->str("/task") == second);
}

TEST_CASE("decline offers again without an attempt, an unclaimed offer lapses, fail with retry",
          "[session]") {
  gateway_rig rig([](amp::server_config& c) {
    c.default_job.lease_s = 10;
    c.default_job.decline_delay_ms = 500;
    c.registry_ttl_s = 600;
  });
  auto worker = rig.connect("w1");
  REQUIRE(worker.request(R"({"op":"register","id":1,"jobs":["j"]})", "1").op() == "ok");
  auto producer = rig.connect("prod");
  auto task = producer.request(R"({"op":"submit","id":2,"job":"j","body":1,"max_attempts":5})", "2")
                  .str("/task");
  REQUIRE(worker.next("offer"));
  CHECK(worker.request(R"({"op":"decline","id":3,"task":")" + task + "\"}", "3").op() == "ok");
  rig.clock->advance(600ms);
  auto again = worker.next("offer");
  REQUIRE(again);
  CHECK(again->num("/attempt") == 1);
  rig.clock->advance(10s);  // lapses, unclaimed
  rig.clock->advance(1s);
  auto third = worker.next("offer");
  REQUIRE(third);
  CHECK(third->num("/attempt") == 1);
  REQUIRE(worker.request(R"({"op":"claim","id":4,"task":")" + task + "\"}", "4").op() == "ok");
  auto failed = worker.request(
      R"({"op":"fail","id":5,"task":")" + task +
          R"(","error":{"code":"oops","message":"no"},"retry":true,"retry_delay_ms":100})",
      "5");
  REQUIRE(failed.op() == "ok");
  CHECK(failed.str("/state") == "queued");
  CHECK(failed.num("/attempt") == 1);
  rig.clock->advance(200ms);
  auto retried = worker.next("offer");
  REQUIRE(retried);
  CHECK(retried->num("/attempt") == 2);
}

TEST_CASE("a lapsed offer is left to the AckWait, and a redelivery on offer is not withdrawn",
          "[session]") {
  faulty_rig f;
  auto& rig = f.rig;
  auto& faults = f.faults;
  std::atomic<int> naks{0};
  faults->set_fault([&](std::string_view op, std::string_view) -> std::optional<amp::error> {
    if (op == "nak") ++naks;
    return std::nullopt;
  });
  auto worker = rig.connect("w1");
  REQUIRE(worker.request(R"({"op":"register","id":1,"jobs":["j"],"slots":2})", "1").op() == "ok");
  auto producer = rig.connect("prod");
  auto task = producer.request(R"({"op":"submit","id":2,"job":"j","body":1})", "2").str("/task");
  REQUIRE(worker.next("offer"));
  // From now on deliveries arrive 2 s after the consumer sent them.
  faults->late_receipts(2s);
  rig.clock->advance(10s);  // lapses with the consumer's AckWait: offered again, no nak
  auto again = worker.next("offer");
  REQUIRE(again);
  CHECK(again->str("/task") == task);
  CHECK(naks == 0);

  // The AckWait brings the task back while it is still on offer here (the offer lapses 2 s
  // later on this side). The fresh offer replaces the old one, whose lapse must not take
  // it away.
  rig.clock->advance(10s);
  auto third = worker.next("offer");
  REQUIRE(third);
  CHECK(third->str("/task") == task);
  rig.clock->advance(3s);  // past the replaced offer's lapse
  CHECK_FALSE(worker.next("offer"));
  auto claim = worker.request(R"({"op":"claim","id":3,"task":")" + task + "\"}", "3");
  CHECK(claim.op() == "ok");
  CHECK(naks == 0);
}

TEST_CASE("idempotent submit and cancel", "[session]") {
  gateway_rig rig;
  auto producer = rig.connect("prod");
  auto first = producer.request(
      R"({"op":"submit","id":1,"job":"j","body":1,"idempotency_key":"order-42"})", "1");
  auto second = producer.request(
      R"({"op":"submit","id":2,"job":"j","body":1,"idempotency_key":"order-42"})", "2");
  CHECK(first.flag("/created"));
  CHECK_FALSE(second.flag("/created"));
  CHECK(first.str("/task") == second.str("/task"));
  auto task = first.str("/task");
  auto other = rig.connect("other");
  CHECK(other.request(R"({"op":"cancel","id":3,"task":")" + task + "\"}", "3").code() ==
        "not_found");
  auto c = producer.request(R"({"op":"cancel","id":4,"task":")" + task + "\"}", "4");
  REQUIRE(c.op() == "ok");
  CHECK(c.str("/state") == "cancelled");
  CHECK(producer.request(R"({"op":"cancel","id":5,"task":")" + task + "\"}", "5").code() ==
        "conflict");
  auto notice = producer.next("message");
  REQUIRE(notice);
  CHECK(notice->str("/envelope/type") == "amp.task.cancelled");
  auto none = rig.connect("none", "{}");
  CHECK(none.request(R"({"op":"submit","id":6,"job":"j","body":1})", "6").code() == "forbidden");
  CHECK(none.request(R"({"op":"register","id":7,"jobs":["j"]})", "7").code() == "forbidden");
}

TEST_CASE("a running holder gets cancelled when its task is cancelled", "[session]") {
  gateway_rig rig;
  auto worker = rig.connect("w1");
  REQUIRE(worker.request(R"({"op":"register","id":1,"jobs":["j"]})", "1").op() == "ok");
  auto producer = rig.connect("prod");
  auto task = producer.request(R"({"op":"submit","id":2,"job":"j","body":1})", "2").str("/task");
  REQUIRE(worker.next("offer"));
  REQUIRE(worker.request(R"({"op":"claim","id":3,"task":")" + task + "\"}", "3").op() == "ok");
  REQUIRE(producer.request(R"({"op":"cancel","id":4,"task":")" + task + "\"}", "4").op() == "ok");
  auto c = worker.next("cancelled");
  REQUIRE(c);
  CHECK(c->str("/task") == task);
  CHECK(worker.request(R"({"op":"complete","id":5,"task":")" + task + "\"}", "5").code() ==
        "lease_lost");
}

TEST_CASE("presence: watch, who, expiry without heartbeats, bye", "[session]") {
  gateway_rig rig;
  auto watcher = rig.connect("watcher");
  auto w = watcher.request(R"({"op":"watch","id":1})", "1");
  REQUIRE(w.op() == "ok");
  CHECK(w.raw("/participants") == "[]");
  auto worker = rig.connect("w1");
  REQUIRE(
      worker.request(R"({"op":"register","id":1,"jobs":["j"],"slots":3,"meta":{"zone":"eu"}})", "1")
          .op() == "ok");
  auto up = watcher.next("presence");
  REQUIRE(up);
  CHECK(up->str("/participant") == "w1");
  CHECK(up->str("/state") == "up");
  CHECK(up->str("/reason") == "registered");
  CHECK(up->num("/entry/slots") == 3);
  CHECK(up->str("/entry/meta/zone") == "eu");
  auto who = watcher.request(R"({"op":"who","id":2,"job":"j"})", "2");
  CHECK(who.str("/participants/0/participant") == "w1");
  CHECK(watcher.request(R"({"op":"who","id":3,"job":"other"})", "3").raw("/participants") == "[]");

  rig.clock->advance(20s);
  REQUIRE(worker.request(R"({"op":"heartbeat","id":4})", "4").op() == "ok");
  rig.clock->advance(20s);
  CHECK_FALSE(watcher.next("presence"));  // refreshed at 20 s: still up at 40 s
  rig.clock->advance(15s);
  auto down = watcher.next("presence");
  REQUIRE(down);
  CHECK(down->str("/state") == "down");
  CHECK(down->str("/reason") == "expired");
  CHECK_FALSE(worker.carrier->close_code.has_value());

  REQUIRE(worker.request(R"({"op":"heartbeat","id":5})", "5").op() == "ok");  // registers again
  auto back = watcher.next("presence");
  REQUIRE(back);
  CHECK(back->str("/state") == "up");
  auto bye = worker.request(R"({"op":"bye","id":6})", "6");
  CHECK(bye.op() == "ok");
  CHECK(worker.carrier->close_code == 1000);
  auto left = watcher.next("presence");
  REQUIRE(left);
  CHECK(left->str("/reason") == "left");
}

TEST_CASE("bye leaves the entry to another registered session of the participant", "[session]") {
  gateway_rig rig([](amp::server_config& c) { c.registry_ttl_s = 600; });
  auto watcher = rig.connect("watcher");
  REQUIRE(watcher.request(R"({"op":"watch","id":1})", "1").op() == "ok");
  auto a = rig.connect("w1");
  auto b = rig.connect("w1");
  auto c = rig.connect("w1");  // never registers
  REQUIRE(a.request(R"({"op":"register","id":1,"jobs":["j"],"slots":1})", "1").op() == "ok");
  REQUIRE(b.request(R"({"op":"register","id":1,"jobs":["k"],"slots":2})", "1").op() == "ok");
  REQUIRE(watcher.next("presence"));
  REQUIRE(watcher.next("presence"));
  auto jobs_listed = [&](std::string_view id) {
    auto who = watcher.request(fmt::format(R"({{"op":"who","id":{}}})", id), std::string(id));
    return who.raw("/participants/0/jobs");
  };
  CHECK(jobs_listed("2") == R"(["k"])");

  REQUIRE(c.request(R"({"op":"bye","id":2})", "2").op() == "ok");  // not registered: no change
  CHECK_FALSE(watcher.next("presence"));
  CHECK(jobs_listed("3") == R"(["k"])");

  REQUIRE(b.request(R"({"op":"bye","id":2})", "2").op() == "ok");  // a stays: the entry is a's
  auto again = watcher.next("presence");
  REQUIRE(again);
  CHECK(again->str("/state") == "up");
  CHECK(again->raw("/entry/jobs") == R"(["j"])");
  CHECK(jobs_listed("4") == R"(["j"])");
  auto producer = rig.connect("prod");
  auto task = producer.request(R"({"op":"submit","id":2,"job":"j","body":1})", "2").str("/task");
  auto offer = a.next("offer");
  REQUIRE(offer);
  CHECK(offer->str("/task") == task);

  REQUIRE(a.request(R"({"op":"bye","id":2})", "2").op() == "ok");  // the last one: down, left
  auto down = watcher.next("presence");
  REQUIRE(down);
  CHECK(down->str("/state") == "down");
  CHECK(down->str("/reason") == "left");
  CHECK(watcher.request(R"({"op":"who","id":5})", "5").raw("/participants") == "[]");
}

TEST_CASE("rate limits answer rate_limited with retry_after_ms, budgets budget_exhausted",
          "[session]") {
  gateway_rig rig([](amp::server_config& c) {
    c.default_policy.rate = {.per_s = 1, .burst = 2, .bytes_per_s = 1e6};
    c.participant_policies["frugal"].per_day = std::optional<std::int64_t>(1);
  });
  auto w = rig.connect("alice");
  CHECK(w.request(R"({"op":"send","id":1,"to":"bob","body":1})", "1").op() == "ok");
  CHECK(w.request(R"({"op":"send","id":2,"to":"bob","body":1})", "2").op() == "ok");
  auto limited = w.request(R"({"op":"send","id":3,"to":"bob","body":1})", "3");
  CHECK(limited.code() == "rate_limited");
  CHECK(limited.num("/retry_after_ms") > 0);
  rig.clock->advance(std::chrono::milliseconds(limited.num("/retry_after_ms")));
  CHECK(w.request(R"({"op":"send","id":4,"to":"bob","body":1})", "4").op() == "ok");

  auto f = rig.connect("frugal");
  CHECK(f.request(R"({"op":"publish","id":1,"topic":"t","body":1})", "1").op() == "ok");
  CHECK(f.request(R"({"op":"publish","id":2,"topic":"t","body":1})", "2").code() ==
        "budget_exhausted");
}

TEST_CASE("a duplicate send or publish gives its budget unit back, also when answered at once",
          "[session]") {
  // The memory transport answers inside the budget's own completion: the refund must not
  // wait for the budget's counter there (it once did, and the session hung).
  gateway_rig rig([](amp::server_config& c) { c.default_policy.budget.per_day = 3; });
  auto a = rig.connect("alice");
  auto first = a.request(R"({"op":"send","id":1,"to":"bob","body":1,"msg_id":"x"})", "1");
  REQUIRE(first.op() == "ok");  // unit 1
  auto again = a.request(R"({"op":"send","id":2,"to":"bob","body":1,"msg_id":"x"})", "2");
  REQUIRE(again.op() == "ok");  // unit 2, given back
  CHECK(again.flag("/duplicate"));
  CHECK(again.num("/seq") == first.num("/seq"));
  auto published = a.request(R"({"op":"publish","id":3,"topic":"t","body":1,"msg_id":"p"})", "3");
  REQUIRE(published.op() == "ok");  // unit 2
  auto dup = a.request(R"({"op":"publish","id":4,"topic":"t","body":1,"msg_id":"p"})", "4");
  REQUIRE(dup.op() == "ok");  // unit 3, given back
  CHECK(dup.flag("/duplicate"));
  CHECK(a.request(R"({"op":"send","id":5,"to":"bob","body":2})", "5").op() == "ok");  // unit 3
  CHECK(a.request(R"({"op":"send","id":6,"to":"bob","body":3})", "6").code() == "budget_exhausted");
}

TEST_CASE("a body schema of the message type refuses a mismatch with its path", "[session]") {
  auto dir = std::filesystem::temp_directory_path() / "amp-session-schema-test";
  std::filesystem::create_directories(dir);
  auto file = dir / "resize.json";
  {
    std::ofstream out(file);
    out << R"({"type":"object","required":["w"],"properties":{"w":{"type":"integer"}}})";
  }
  gateway_rig rig([&](amp::server_config& c) { c.schemas["img.resize"] = file.string(); });
  auto w = rig.connect("alice");
  auto bad =
      w.request(R"({"op":"submit","id":1,"job":"j","type":"img.resize","body":{"w":"wide"}})", "1");
  CHECK(bad.code() == "invalid_envelope");
  CHECK(bad.str("/path") == "/body/w");
  CHECK(w.request(R"({"op":"submit","id":2,"job":"j","type":"img.resize","body":{"w":640}})", "2")
            .op() == "ok");
  CHECK(
      w.request(R"({"op":"submit","id":3,"job":"j","type":"other","body":{"w":"x"}})", "3").op() ==
      "ok");
  std::filesystem::remove_all(dir);
}

TEST_CASE("closing a session hands its open offers back at once", "[session]") {
  gateway_rig rig([](amp::server_config& c) { c.registry_ttl_s = 600; });
  auto w1 = rig.connect("w1");
  REQUIRE(w1.request(R"({"op":"register","id":1,"jobs":["j"]})", "1").op() == "ok");
  auto producer = rig.connect("prod");
  auto task = producer.request(R"({"op":"submit","id":2,"job":"j","body":1})", "2").str("/task");
  REQUIRE(w1.next("offer"));
  auto w2 = rig.connect("w2");
  REQUIRE(w2.request(R"({"op":"register","id":1,"jobs":["j"]})", "1").op() == "ok");
  CHECK_FALSE(w2.next("offer"));
  w1.s->closed();
  auto o = w2.next("offer");
  REQUIRE(o);
  CHECK(o->str("/task") == task);
}

TEST_CASE("metrics count sessions, frames, errors and transitions", "[session]") {
  gateway_rig rig;
  auto w = rig.connect("alice");
  CHECK(w.request(R"({"op":"submit","id":1,"job":"j","body":1})", "1").op() == "ok");
  CHECK(w.request(R"({"op":"bogus","id":2})", "2").code() == "bad_request");
  auto text = rig.gw->metrics_text();
  CHECK(text.find("amp_sessions 1\n") != std::string::npos);
  CHECK(text.find("amp_frames_in_total{op=\"submit\"} 1\n") != std::string::npos);
  CHECK(text.find("amp_errors_total{code=\"bad_request\"} 1\n") != std::string::npos);
  CHECK(text.find("amp_task_transitions_total{to=\"queued\"} 1\n") != std::string::npos);
  CHECK(text.find("# TYPE amp_backend_seconds histogram") != std::string::npos);
  CHECK(rig.gw->ready());
}

TEST_CASE("shutdown closes every session with 1001", "[session]") {
  gateway_rig rig;
  auto a = rig.connect("a");
  auto pending = rig.open();
  rig.gw->shutdown();
  CHECK(a.carrier->close_code == 1001);
  CHECK(pending.carrier->close_code == 1001);
  CHECK_FALSE(rig.gw->ready());
}

TEST_CASE("an idempotent resubmission is answered with its task even when the budget is spent",
          "[session]") {
  gateway_rig rig([](amp::server_config& c) {
    c.participant_policies["prod"].per_day = std::optional<std::int64_t>(1);
  });
  auto w = rig.connect("prod");
  auto first = w.request(R"({"op":"submit","id":1,"job":"j","body":1,"idempotency_key":"k"})", "1");
  REQUIRE(first.op() == "ok");
  CHECK(w.request(R"({"op":"submit","id":2,"job":"j","body":2})", "2").code() ==
        "budget_exhausted");
  auto again = w.request(R"({"op":"submit","id":3,"job":"j","body":1,"idempotency_key":"k"})", "3");
  REQUIRE(again.op() == "ok");
  CHECK_FALSE(again.flag("/created"));
  CHECK(again.str("/task") == first.str("/task"));
}

TEST_CASE(
    "a replay larger than the outbound limit: the ok, the events up to last_seq, then sub_dropped",
    "[session]") {
  gateway_rig rig({}, 4096);
  auto pub = rig.connect("pub");
  std::vector<std::int64_t> seqs;
  for (int i = 0; i < 20; ++i) {
    auto r = pub.request(
        R"({"op":"publish","id":1,"topic":"big","body":")" + std::string(500, 'x') + "\"}", "1");
    REQUIRE(r.op() == "ok");
    seqs.push_back(r.num("/seq"));
  }
  auto sub = rig.connect("sub");
  sub.send(R"({"op":"subscribe","id":"s","topic":"big","from":"all"})");
  sub.collect();
  REQUIRE(sub.seen.size() >= 3);
  CHECK(sub.seen.front().op() == "ok");
  CHECK(sub.seen.back().op() == "sub_dropped");
  auto last_seq = sub.seen.back().num("/last_seq");
  std::vector<std::int64_t> got;
  for (std::size_t i = 1; i + 1 < sub.seen.size(); ++i) {
    REQUIRE(sub.seen[i].op() == "event");
    got.push_back(sub.seen[i].num("/seq"));
  }
  REQUIRE_FALSE(got.empty());
  CHECK(got.back() == last_seq);
  CHECK(got == std::vector<std::int64_t>(seqs.begin(),
                                         seqs.begin() + static_cast<std::ptrdiff_t>(got.size())));
  CHECK(got.size() < seqs.size());
}

namespace {

// An executor that keeps the work until the test runs it, newest first: the most
// adversarial order a pool of threads could produce.
struct lifo_executor {
  struct work_queue {
    std::mutex mu;
    std::vector<std::function<void()>> work;
    std::size_t size() {
      std::lock_guard lock(mu);
      return work.size();
    }
  };
  std::shared_ptr<work_queue> queue = std::make_shared<work_queue>();

  lifo_executor() = default;
  lifo_executor(const lifo_executor&) = delete;
  lifo_executor& operator=(const lifo_executor&) = delete;
  // Work posted while the rig shuts down (its timers fire then, on another thread than the
  // shutdown's) holds the gateway, whose executor holds this queue: it is dropped here, or
  // the two would keep each other alive.
  ~lifo_executor() {
    for (;;) {
      std::vector<std::function<void()>> left;
      {
        std::lock_guard lock(queue->mu);
        left.swap(queue->work);
      }
      if (left.empty()) break;
    }
  }

  amp::executor run() const {
    return [q = queue](std::function<void()> work) {
      std::lock_guard lock(q->mu);
      q->work.push_back(std::move(work));
    };
  }
  void drain() const {
    for (;;) {
      std::function<void()> work;
      {
        std::lock_guard lock(queue->mu);
        if (queue->work.empty()) return;
        work = std::move(queue->work.back());
        queue->work.pop_back();
      }
      work();
    }
  }
};

std::vector<std::string> ids_of(wire& w, std::string_view op) {
  w.collect();
  std::vector<std::string> out;
  for (auto& f : w.seen) {
    if (f.op() == op) out.push_back(f.raw("/id"));
  }
  return out;
}

// A session that said hello as `sub`, on a gateway whose executor is `pool`.
wire connect_through(const lifo_executor& pool, gateway_rig& rig, std::string_view sub) {
  auto w = rig.open();
  w.send(R"({"op":"hello","id":"h","token":")" + rig.token(sub) + "\"}");
  pool.drain();
  REQUIRE(ids_of(w, "ok") == std::vector<std::string>{"\"h\""});
  w.seen.clear();
  return w;
}

}  // namespace

TEST_CASE("frames of a session run concurrently across lanes, in order within one, barriers alone",
          "[session]") {
  lifo_executor pool;
  gateway_rig rig({}, 4u << 20, pool.run());
  auto alice = connect_through(pool, rig, "alice");
  auto bob = connect_through(pool, rig, "bob");

  // Two submits keep no order: run newest first, their replies come newest first (with
  // idempotency keys: without, a submit does not wait for the executor).
  alice.send(R"({"op":"submit","id":1,"job":"j","body":1,"idempotency_key":"k1"})");
  alice.send(R"({"op":"submit","id":2,"job":"j","body":2,"idempotency_key":"k2"})");
  pool.drain();
  CHECK(ids_of(alice, "ok") == std::vector<std::string>{"2", "1"});
  alice.seen.clear();

  // Two sends to one recipient keep theirs, whatever the executor does.
  alice.send(R"({"op":"send","id":3,"to":"bob","body":"first"})");
  alice.send(R"({"op":"send","id":4,"to":"bob","body":"second"})");
  pool.drain();
  CHECK(ids_of(alice, "ok") == std::vector<std::string>{"3", "4"});
  auto m1 = bob.next("message");
  auto m2 = bob.next("message");
  REQUIRE(m1);
  REQUIRE(m2);
  CHECK(m1->raw("/envelope/body") == R"("first")");
  CHECK(m2->raw("/envelope/body") == R"("second")");
  alice.seen.clear();

  // A barrier waits for what came before it, and what comes after waits for it.
  alice.send(R"({"op":"submit","id":5,"job":"j","body":5})");
  alice.send(R"({"op":"who","id":6})");
  alice.send(R"({"op":"submit","id":7,"job":"j","body":7})");
  pool.drain();
  CHECK(ids_of(alice, "ok") == std::vector<std::string>{"5", "6", "7"});
}

TEST_CASE("ops that never wait for the backend run on the receiving thread, in their lane's order",
          "[session]") {
  lifo_executor pool;
  gateway_rig rig({}, 4u << 20, pool.run());
  auto alice = connect_through(pool, rig, "alice");

  // ack and claim are answered before receive returns, with nothing left to the executor.
  alice.send(R"({"op":"ack","id":1,"seq":99})");
  alice.send(R"({"op":"claim","id":2,"task":"t_1"})");
  CHECK(pool.queue->size() == 0);
  CHECK(ids_of(alice, "error") == std::vector<std::string>{"1", "2"});
  for (auto& f : alice.seen) CHECK(f.code() == "not_found");
  alice.seen.clear();

  // So is a submit without an idempotency key; one with a key finds its binding on the
  // executor, where any other op runs.
  alice.send(R"({"op":"submit","id":7,"job":"j","body":1})");
  CHECK(pool.queue->size() == 0);
  CHECK(ids_of(alice, "ok") == std::vector<std::string>{"7"});
  alice.seen.clear();
  alice.send(R"({"op":"submit","id":8,"job":"j","body":1,"idempotency_key":"k"})");
  alice.send(R"({"op":"who","id":3})");
  CHECK(pool.queue->size() == 1);  // the keyed submit; `who` waits for it (a barrier)
  CHECK(ids_of(alice, "ok").empty());
  pool.drain();
  CHECK(ids_of(alice, "ok") == std::vector<std::string>{"8", "3"});
  alice.seen.clear();

  // A claim behind a heartbeat on the same task waits for it, then runs on the executor.
  alice.send(R"({"op":"heartbeat","id":4,"task":"t_2"})");
  alice.send(R"({"op":"claim","id":5,"task":"t_2"})");
  alice.send(R"({"op":"complete","id":6,"task":"t_2","result":1})");
  CHECK(pool.queue->size() == 1);
  CHECK(ids_of(alice, "error").empty());
  pool.drain();
  CHECK(ids_of(alice, "error") == std::vector<std::string>{"4", "5", "6"});
  alice.seen.clear();

  // A complete of a lease this gateway did not write reads the record: on the executor.
  alice.send(R"({"op":"complete","id":9,"task":"t_3","result":1})");
  CHECK(pool.queue->size() == 1);
  pool.drain();
  CHECK(ids_of(alice, "error") == std::vector<std::string>{"9"});
}

TEST_CASE("keyed submits run on the executor, within the session's share of its threads",
          "[session]") {
  lifo_executor pool;
  gateway_rig rig({}, 4u << 20, pool.run(), {}, 8);  // 8 threads: 2 per session
  auto alice = connect_through(pool, rig, "alice");
  for (int i = 1; i <= 5; ++i) {
    alice.send(fmt::format(
        R"({{"op":"submit","id":{0},"job":"j","body":1,"idempotency_key":"k{0}"}})", i));
  }
  CHECK(pool.queue->size() == 2);
  CHECK(ids_of(alice, "ok").empty());
  pool.drain();
  CHECK(ids_of(alice, "ok").size() == 5);
}

TEST_CASE("claiming and completing an offered task are answered on the receiving thread",
          "[session]") {
  lifo_executor pool;
  gateway_rig rig({}, 4u << 20, pool.run());
  auto worker = connect_through(pool, rig, "w1");
  auto producer = connect_through(pool, rig, "prod");
  worker.send(R"({"op":"register","id":"r","jobs":["j"],"slots":1})");
  pool.drain();
  REQUIRE(ids_of(worker, "ok") == std::vector<std::string>{"\"r\""});
  worker.seen.clear();
  producer.send(R"({"op":"submit","id":1,"job":"j","body":{"n":1}})");
  CHECK(ids_of(producer, "ok") == std::vector<std::string>{"1"});
  pool.drain();
  auto offer = worker.next("offer");
  REQUIRE(offer);
  auto task = offer->str("/task");

  worker.send(R"({"op":"claim","id":2,"task":")" + task + "\"}");
  CHECK(ids_of(worker, "ok") == std::vector<std::string>{"2"});
  worker.seen.clear();
  worker.send(R"({"op":"complete","id":3,"attempt":1,"result":7,"task":")" + task + "\"}");
  CHECK(ids_of(worker, "ok") == std::vector<std::string>{"3"});  // before the executor ran
  pool.drain();
  auto notice = producer.next("message");
  REQUIRE(notice);
  CHECK(notice->str("/envelope/type") == "amp.task.completed");
}

TEST_CASE("a heartbeat is answered on the receiving thread unless it extends leases", "[session]") {
  lifo_executor pool;
  gateway_rig rig({}, 4u << 20, pool.run());
  auto worker = connect_through(pool, rig, "w1");
  auto producer = connect_through(pool, rig, "prod");
  worker.send(R"({"op":"register","id":"r","jobs":["j"],"slots":1})");
  pool.drain();
  REQUIRE(ids_of(worker, "ok") == std::vector<std::string>{"\"r\""});
  worker.seen.clear();
  auto expires_at = [&] {
    producer.send(R"({"op":"who","id":"who"})");
    pool.drain();
    auto who = producer.next("ok");
    REQUIRE(who);
    producer.seen.clear();
    return who->str("/participants/0/expires_at");
  };
  auto registered_until = expires_at();

  // Holding no lease: refreshed and answered before receive returns, nothing on the executor.
  rig.clock->advance(5s);
  pool.drain();
  worker.send(R"({"op":"heartbeat","id":1})");
  CHECK(pool.queue->size() == 0);
  auto hb = worker.next("ok");
  REQUIRE(hb);
  CHECK(hb->raw("/leases") == "[]");
  CHECK(expires_at() > registered_until);
  worker.seen.clear();

  // Holding a lease, the heartbeat extends it, which waits for the backend: on the executor.
  producer.send(R"({"op":"submit","id":2,"job":"j","body":1})");
  pool.drain();
  auto offer = worker.next("offer");
  REQUIRE(offer);
  auto task = offer->str("/task");
  worker.send(R"({"op":"claim","id":3,"task":")" + task + "\"}");
  CHECK(ids_of(worker, "ok") == std::vector<std::string>{"3"});
  worker.seen.clear();
  worker.send(R"({"op":"heartbeat","id":4})");
  CHECK(pool.queue->size() == 1);
  CHECK(ids_of(worker, "ok").empty());
  pool.drain();
  hb = worker.next("ok");
  REQUIRE(hb);
  CHECK(hb->str("/leases/0/task") == task);
}

TEST_CASE("a heartbeat brings back an entry that expired while its session stayed registered",
          "[session]") {
  lifo_executor pool;
  gateway_rig rig({}, 4u << 20, pool.run());
  auto worker = connect_through(pool, rig, "w1");
  auto other = connect_through(pool, rig, "w2");
  worker.send(R"({"op":"register","id":"r","jobs":["j"],"slots":1})");
  other.send(R"({"op":"heartbeat","id":"h"})");  // never registered: nothing to refresh
  pool.drain();
  REQUIRE(ids_of(worker, "ok") == std::vector<std::string>{"\"r\""});
  REQUIRE(ids_of(other, "ok") == std::vector<std::string>{"\"h\""});
  other.seen.clear();
  rig.clock->advance(31s);  // past registry_ttl_s (30)
  pool.drain();
  other.send(R"({"op":"who","id":"who"})");
  pool.drain();
  auto who = other.next("ok");
  REQUIRE(who);
  CHECK(who->raw("/participants") == "[]");
  other.seen.clear();

  worker.send(R"({"op":"heartbeat","id":1})");
  pool.drain();
  CHECK(ids_of(worker, "ok") == std::vector<std::string>{"\"r\"", "1"});
  other.send(R"({"op":"who","id":"who"})");
  pool.drain();
  who = other.next("ok");
  REQUIRE(who);
  CHECK(who->str("/participants/0/participant") == "w1");
  CHECK(who->raw("/participants/1") == "<absent>");
}

TEST_CASE("one session has at most a quarter of the executor's threads, however many frames",
          "[session]") {
  lifo_executor pool;
  gateway_rig rig({}, 4u << 20, pool.run(), {}, 8);  // 8 threads: 2 per session
  auto alice = connect_through(pool, rig, "alice");
  auto bob = connect_through(pool, rig, "bob");
  // Ten frames on ten tasks: ten lanes, nothing orders them, yet two are on the executor.
  for (int i = 1; i <= 10; ++i) {
    alice.send(fmt::format(R"({{"op":"task","id":{0},"task":"t_{0}"}})", i));
  }
  CHECK(pool.queue->size() == 2);
  bob.send(R"({"op":"who","id":"b"})");
  CHECK(pool.queue->size() == 3);  // another session is not held up behind them
  pool.drain();
  CHECK(ids_of(bob, "ok") == std::vector<std::string>{"\"b\""});
  auto answered = ids_of(alice, "error");
  CHECK(answered.size() == 10);
  for (auto& f : alice.seen) CHECK(f.code() == "not_found");
}

TEST_CASE("members a participant controls are bounded: meta, jobs, headers, errors, delays",
          "[session]") {
  gateway_rig rig;
  auto w = rig.connect("w1");
  // meta: 4096 bytes minified at most, payload_too_large like a body.
  const std::string fits = R"({"k":")" + std::string(4096 - 8, 'm') + "\"}";
  CHECK(w.request(R"({"op":"register","id":1,"jobs":["j"],"meta":)" + fits + "}", "1").op() ==
        "ok");
  auto big = w.request(
      R"({"op":"register","id":2,"jobs":["j"],"meta":{"k":")" + std::string(4096, 'm') + "\"}}",
      "2");
  CHECK(big.code() == "payload_too_large");
  CHECK(big.str("/path") == "/meta");
  auto who = w.request(R"({"op":"who","id":3,"job":"j"})", "3");
  CHECK(who.raw("/participants/0/meta") == fits);  // the refused register changed nothing

  std::string jobs = "[";
  for (int i = 0; i < 257; ++i) jobs += (i ? ",\"j" : "\"j") + std::to_string(i) + "\"";
  CHECK(w.request(R"({"op":"register","id":4,"jobs":)" + jobs + "]}", "4").code() == "bad_request");

  auto header = w.request(R"({"op":"publish","id":5,"topic":"news.eu","headers":{"k":")" +
                              std::string(4097, 'h') + R"("},"body":1})",
                          "5");
  CHECK(header.code() == "invalid_envelope");
  CHECK(header.str("/path") == "/headers/k");

  // Time values are at most one day, so that they never overflow a clock.
  CHECK(w.request(R"({"op":"nack","id":6,"seq":1,"delay_ms":86400001})", "6").code() ==
        "bad_request");
  CHECK(w.request(R"({"op":"nack","id":7,"seq":1,"delay_ms":9007199254740991})", "7").code() ==
        "bad_request");
  CHECK(w.request(R"({"op":"fail","id":8,"task":"t_1","error":{"code":"x","message":"m"},)"
                  R"("retry":true,"retry_delay_ms":86400001})",
                  "8")
            .code() == "bad_request");
  auto long_message =
      w.request(R"({"op":"fail","id":9,"task":"t_1","error":{"code":"x","message":")" +
                    std::string(4097, 'e') + R"("}})",
                "9");
  CHECK(long_message.code() == "bad_request");
  CHECK_THAT(long_message.str("/message"), Catch::Contains("/error/message"));
}

TEST_CASE("register, who, watch and the other ops are rate limited by the ops bucket",
          "[session]") {
  gateway_rig rig([](amp::server_config& c) { c.default_policy.ops = {.per_s = 10, .burst = 25}; });
  auto w = rig.connect("alice");
  CHECK(w.request(R"({"op":"who","id":1})", "1").op() == "ok");
  CHECK(w.request(R"({"op":"register","id":2,"jobs":["j"]})", "2").op() == "ok");
  auto limited = w.request(R"({"op":"who","id":3})", "3");  // 5 tokens left
  CHECK(limited.code() == "rate_limited");
  CHECK(limited.num("/retry_after_ms") == 500);
  // Cheap ops still pass, one token each, and bad frames are refused before the bucket.
  CHECK(w.request(R"({"op":"heartbeat","id":4})", "4").op() == "ok");
  CHECK(w.request(R"({"op":"who","id":5,"job":"Bad Name"})", "5").code() == "invalid_name");
  // send is not counted here: it has the spec's rate.
  CHECK(w.request(R"({"op":"send","id":6,"to":"bob","body":1})", "6").op() == "ok");
  rig.clock->advance(std::chrono::milliseconds(600));
  CHECK(w.request(R"({"op":"who","id":7})", "7").op() == "ok");
}
