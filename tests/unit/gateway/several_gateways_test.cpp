// Two gateways on one memory transport (two servers of one broker, spec §13): offers go to
// the least loaded worker, on either gateway, whichever gateway fetched the task.

#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <string>

#include "amp/subjects.hpp"
#include "unit/gateway/session_rig.hpp"

using namespace amp;
using namespace amp::testing;
using namespace std::chrono_literals;

namespace {

std::string submit(wire& w, int id) {
  auto n = std::to_string(id);
  auto ok = w.request(R"({"op":"submit","id":)" + n + R"(,"job":"resize","body":)" + n + "}", n);
  REQUIRE(ok.op() == "ok");
  return ok.str("/task");
}

void claim(wire& w, const std::string& task, int id) {
  auto n = std::to_string(id);
  auto ok = w.request(R"({"op":"claim","id":)" + n + R"(,"task":")" + task + "\"}", n);
  REQUIRE(ok.op() == "ok");
}

std::uint64_t handed(const gateway_rig& rig) {
  auto text = rig.gw->metrics_text();
  auto at = text.find("\namp_offers_handed_total ");
  REQUIRE(at != std::string::npos);
  return std::stoull(text.substr(at + 25));
}

// Says what another gateway would (`event`, `data`) on the namespace's work subject, or on
// `subject`.
void say(gateway_rig& rig, std::string_view event, std::string data, std::string subject = {}) {
  must(rig.backend->publish_core(
      {.subject = subject.empty()
                      ? subjects::work_control_subject(namespace_name::make("demo").value())
                      : subject,
       .data = std::move(data),
       .headers = {{"Amp-Peer", "0123456789abcdef"}, {"Amp-Event", std::string(event)}}}));
}

// How long a gateway waits to tell the others what changed of its workers.
constexpr auto k_tell_after = 20ms;

// Two gateways of one broker, with 10 s leases and registry entries that outlast the test.
struct two_gateways {
  static void tweak(server_config& c) {
    c.default_job.lease_s = 10;
    c.registry_ttl_s = 600;
  }
  gateway_rig one{tweak};
  gateway_rig two{one, tweak};
};

}  // namespace

TEST_CASE("a task goes to the least loaded worker whichever gateway fetched it",
          "[session][several]") {
  gateway_rig one;
  gateway_rig two(one, {});
  auto prod = one.connect("prod");
  auto w1 = one.connect("w1");
  REQUIRE(w1.request(R"({"op":"register","id":1,"jobs":["resize"],"slots":6})", "1").op() == "ok");
  // w1 holds three leases before w2 comes.
  for (int i = 0; i < 3; ++i) {
    auto task = submit(prod, 10 + i);
    auto o = w1.next("offer");
    REQUIRE(o);
    REQUIRE(o->str("/task") == task);
    claim(w1, task, 20 + i);
  }
  auto w2 = two.connect("w2");
  REQUIRE(w2.request(R"({"op":"register","id":2,"jobs":["resize"],"slots":6})", "2").op() == "ok");
  // Both gateways now fetch (each has a free worker), but the next three tasks are w2's:
  // 0/6, 1/6 and 2/6 are all less than w1's 3/6.
  for (int i = 0; i < 3; ++i) {
    auto task = submit(prod, 30 + i);
    CHECK_FALSE(w1.next("offer"));
    auto o = w2.next("offer");
    REQUIRE(o);
    CHECK(o->str("/task") == task);
    CHECK(o->num("/attempt") == 1);
    CHECK(o->str("/envelope/from") == "prod");
    claim(w2, task, 40 + i);
  }
  CHECK(handed(one) + handed(two) > 0);
  // Level: they take turns (a tie stays with the gateway that fetched it), with time for
  // the gateways to tell each other of each claim.
  std::map<std::string, int> load{{"w1", 3}, {"w2", 3}};
  for (int i = 0; i < 4; ++i) {
    one.clock->advance(k_tell_after);
    auto task = submit(prod, 50 + i);
    auto o1 = w1.next("offer");
    auto o2 = w2.next("offer");
    REQUIRE(o1.has_value() != o2.has_value());
    auto& w = o1 ? w1 : w2;
    CHECK((o1 ? *o1 : *o2).str("/task") == task);
    claim(w, task, 60 + i);
    ++load[o1 ? "w1" : "w2"];
    CHECK(std::abs(load["w1"] - load["w2"]) <= 1);
  }
  // The completes go through w2's gateway, which granted its leases.
  auto hb = w2.request(R"({"op":"heartbeat","id":70})", "70");
  REQUIRE(hb.op() == "ok");
  CHECK(hb.raw("/leases").find("\"task\"") != std::string::npos);
}

TEST_CASE("a task handed to a worker on another gateway and left unclaimed comes back",
          "[session][several]") {
  two_gateways g;
  auto& one = g.one;
  auto& two = g.two;
  auto prod = one.connect("prod");
  auto w1 = one.connect("w1");
  REQUIRE(w1.request(R"({"op":"register","id":1,"jobs":["resize"],"slots":2})", "1").op() == "ok");
  auto first = submit(prod, 2);
  REQUIRE(w1.next("offer"));
  claim(w1, first, 3);
  auto w2 = two.connect("w2");
  REQUIRE(w2.request(R"({"op":"register","id":4,"jobs":["resize"],"slots":2})", "4").op() == "ok");
  auto task = submit(prod, 5);
  auto o = w2.next("offer");
  REQUIRE(o);
  CHECK(o->str("/task") == task);
  // Not claimed: it lapses with the lease, and is offered again (no attempt counted), to
  // w2 again, the less loaded (w1 keeps its lease by a heartbeat).
  one.clock->advance(9s);
  CHECK(w1.request(R"({"op":"heartbeat","id":6})", "6").op() == "ok");
  one.clock->advance(3s);
  CHECK_FALSE(w1.next("offer"));
  auto again = w2.next("offer");
  REQUIRE(again);
  CHECK(again->str("/task") == task);
  CHECK(again->num("/attempt") == 1);
  claim(w2, task, 7);
}

TEST_CASE("a worker connected to another gateway than the submitter gets the work",
          "[session][several]") {
  gateway_rig one;
  gateway_rig two(one, {});
  auto w = two.connect("w");
  REQUIRE(w.request(R"({"op":"register","id":1,"jobs":["resize"]})", "1").op() == "ok");
  auto prod = one.connect("prod");
  auto task = submit(prod, 2);
  auto o = w.next("offer");
  REQUIRE(o);
  CHECK(o->str("/task") == task);
  claim(w, task, 3);
  auto done = w.request(R"({"op":"complete","id":4,"task":")" + task + R"(","result":5})", "4");
  CHECK(done.str("/state") == "completed");
  auto notice = prod.next("message");
  REQUIRE(notice);
  CHECK(notice->str("/envelope/type") == "amp.task.completed");
  CHECK(notice->raw("/envelope/body/result") == "5");
}

TEST_CASE("what other gateways say of their workers cannot break offers", "[session][several]") {
  gateway_rig one;
  auto w = one.connect("w");
  REQUIRE(w.request(R"({"op":"register","id":1,"jobs":["resize"]})", "1").op() == "ok");
  say(one, "workers", "not json");
  say(one, "workers", R"({"hello":true,"workers":[{"key":"k"}],"gone":[]})");
  say(one, "workers",
      R"({"hello":false,"workers":[{"key":"k","who":"../x","jobs":[],"slots":1,"busy":0}],"gone":[]})");
  // A worker said to be idle elsewhere but not in the registry gets nothing.
  say(one, "workers",
      R"({"seq":1,"hello":false,"workers":[{"key":"k","who":"ghost","jobs":["resize"],"slots":9,"busy":0}],"gone":[]})");
  say(one, "offer", "not an offer");
  say(one, "offer", "not an offer either",
      subjects::work_offer_subject(namespace_name::make("demo").value(), "0123456789abcdef"));
  say(one, "what", "{}");
  auto prod = one.connect("prod");
  auto task = submit(prod, 2);
  auto o = w.next("offer");
  REQUIRE(o);
  CHECK(o->str("/task") == task);
  CHECK(handed(one) == 0);
}

TEST_CASE("lease_lost and cancelled reach the holder on another gateway than its lease's",
          "[session][several]") {
  two_gateways g;
  auto& one = g.one;
  auto& two = g.two;
  auto prod = one.connect("prod");
  auto w = one.connect("w");
  REQUIRE(w.request(R"({"op":"register","id":1,"jobs":["resize"],"slots":2})", "1").op() == "ok");
  auto first = submit(prod, 2);
  REQUIRE(w.next("offer"));
  claim(w, first, 3);
  auto second = submit(prod, 4);
  REQUIRE(w.next("offer"));
  claim(w, second, 5);
  // The worker's session on gateway one goes; it is still connected to gateway two.
  auto elsewhere = two.connect("w");
  auto bystander = two.connect("someone");
  w.s->closed();
  // A cancel (through either gateway) reaches it there at once.
  auto cancelled = prod.request(R"({"op":"cancel","id":6,"task":")" + first + "\"}", "6");
  REQUIRE(cancelled.op() == "ok");
  auto c = elsewhere.next("cancelled");
  REQUIRE(c);
  CHECK(c->str("/task") == first);
  // The other lease runs out on gateway one's clock: lease_lost there.
  one.clock->advance(11s);
  auto lost = elsewhere.next("lease_lost");
  REQUIRE(lost);
  CHECK(lost->str("/task") == second);
  CHECK_FALSE(elsewhere.next("lease_lost"));
  CHECK_FALSE(bystander.next("lease_lost"));
  CHECK_FALSE(bystander.next("cancelled"));
}

TEST_CASE("a lease_lost or cancelled said by another gateway is pushed only if the record says so",
          "[session][several]") {
  gateway_rig one;
  auto prod = one.connect("prod");
  auto w = one.connect("w");
  REQUIRE(w.request(R"({"op":"register","id":1,"jobs":["resize"]})", "1").op() == "ok");
  auto task = submit(prod, 2);
  REQUIRE(w.next("offer"));
  claim(w, task, 3);
  // The lease is live and w's, the task not cancelled: nothing is pushed.
  say(one, "lease_lost", R"({"task":")" + task + R"(","holder":"w"})");
  say(one, "cancelled", R"({"task":")" + task + R"(","holder":"w"})");
  say(one, "lease_lost", R"({"task":"../x","holder":"w"})");
  say(one, "lease_lost", "not json");
  CHECK_FALSE(w.next("lease_lost"));
  CHECK_FALSE(w.next("cancelled"));
  auto done = w.request(R"({"op":"complete","id":4,"task":")" + task + R"(","result":1})", "4");
  CHECK(done.str("/state") == "completed");
}

TEST_CASE("an older word of another gateway on a worker does not undo a newer one",
          "[session][several]") {
  gateway_rig one;
  auto prod = one.connect("prod");
  auto w = one.connect("w");
  REQUIRE(w.request(R"({"op":"register","id":1,"jobs":["resize"],"slots":2})", "1").op() == "ok");
  auto first = submit(prod, 2);
  REQUIRE(w.next("offer"));
  claim(w, first, 3);  // w: 1/2
  // "far" is live in the registry (its session went without bye), as if on another gateway.
  auto far = one.connect("far");
  REQUIRE(far.request(R"({"op":"register","id":4,"jobs":["resize"],"slots":5})", "4").op() == "ok");
  far.s->closed();
  // That gateway (here, the test) hears what is handed to it.
  const std::string peer = "0123456789abcdef";
  std::vector<std::string> handed_here;
  auto sub = must(one.backend->subscribe_core(
      subjects::work_offer_subject(namespace_name::make("demo").value(), peer),
      [&](const message& m) { handed_here.push_back(m.data); }));
  auto said = [](int seq, int busy) {
    return R"({"seq":)" + std::to_string(seq) +
           R"(,"hello":false,"workers":[{"key":"k","who":"far","jobs":["resize"],"slots":5,"busy":)" +
           std::to_string(busy) + R"(}],"gone":[]})";
  };
  say(one, "workers", said(2, 0));  // far is idle
  say(one, "workers", said(1, 5));  // an older telling, come late: far full
  auto task = submit(prod, 5);
  CHECK_FALSE(w.next("offer"));
  REQUIRE(handed_here.size() == 1);
  CHECK(handed_here[0].find(task) != std::string::npos);
  CHECK(handed(one) == 1);
}

TEST_CASE("a gateway tells the changes of its workers together, once per interval",
          "[session][several]") {
  gateway_rig one;
  auto w = one.connect("w");
  REQUIRE(w.request(R"({"op":"register","id":1,"jobs":["resize"],"slots":8})", "1").op() == "ok");
  // Another gateway (here, the test) says hello and listens.
  std::vector<std::string> told;
  auto sub = must(one.backend->subscribe_core(
      subjects::work_control_subject(namespace_name::make("demo").value()), [&](const message& m) {
        if (find_header(m.headers, "Amp-Peer") != "0123456789abcdef") told.push_back(m.data);
      }));
  say(one, "workers",
      R"({"seq":1,"hello":true,"workers":[{"key":"k","who":"far","jobs":["other"],"slots":1,"busy":0}],"gone":[]})");
  REQUIRE(told.size() == 1);  // the answer to the hello: at once
  CHECK(told[0].find(R"("busy":0)") != std::string::npos);
  auto prod = one.connect("prod");
  for (int i = 0; i < 3; ++i) {
    auto task = submit(prod, 10 + i);
    REQUIRE(w.next("offer"));
    claim(w, task, 20 + i);
  }
  // Three claims, nothing said yet; one message once the interval is over, with w at 3/8.
  CHECK(told.size() == 1);
  one.clock->advance(k_tell_after);
  REQUIRE(told.size() == 2);
  CHECK(told[1].find(R"("busy":3)") != std::string::npos);
  one.clock->advance(k_tell_after);
  CHECK(told.size() == 2);  // nothing changed since
}

TEST_CASE("a gateway tells only workers that could take an offer, and bye when none is left",
          "[session][several]") {
  gateway_rig one;
  std::vector<std::string> told;
  auto sub = must(one.backend->subscribe_core(
      subjects::work_control_subject(namespace_name::make("demo").value()), [&](const message& m) {
        if (find_header(m.headers, "Amp-Peer") != "0123456789abcdef") {
          told.push_back(std::string(find_header(m.headers, "Amp-Event").value_or("")) + " " +
                         m.data);
        }
      }));
  // Present, but never offered work: 0 slots, or no job. Nothing to tell, not even every
  // refresh interval.
  auto idle = one.connect("idle");
  auto jobless = one.connect("jobless");
  REQUIRE(idle.request(R"({"op":"register","id":1,"jobs":["resize"],"slots":0})", "1").op() ==
          "ok");
  REQUIRE(jobless.request(R"({"op":"register","id":1,"jobs":[],"slots":4})", "1").op() == "ok");
  one.clock->advance(6s);
  say(one, "workers",
      R"({"seq":1,"hello":true,"workers":[{"key":"k","who":"far","jobs":["other"],"slots":1,"busy":0}],"gone":[]})");
  one.clock->advance(6s);
  CHECK(told.empty());

  // A worker: told at once (the hello of this gateway); when it registers again with no
  // slot, the last worker here is gone: bye.
  auto w = one.connect("w");
  REQUIRE(w.request(R"({"op":"register","id":1,"jobs":["resize"],"slots":2})", "1").op() == "ok");
  REQUIRE(told.size() == 1);
  CHECK(told[0].starts_with("workers "));
  CHECK(told[0].find(R"("who":"w")") != std::string::npos);
  CHECK(told[0].find(R"("who":"idle")") == std::string::npos);
  CHECK(told[0].find(R"("who":"jobless")") == std::string::npos);
  REQUIRE(w.request(R"({"op":"register","id":2,"jobs":["resize"],"slots":0})", "2").op() == "ok");
  one.clock->advance(k_tell_after);
  REQUIRE(told.size() == 2);
  CHECK(told[1] == "bye ");
}
