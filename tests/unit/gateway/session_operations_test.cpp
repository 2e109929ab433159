// Operations through a session (spec §12): scatter, reply, operation, retry, cancel with
// `operation`, the checks in the order of §1, the policy counted once.

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "unit/gateway/session_rig.hpp"

namespace {

using namespace std::chrono_literals;
using amp::testing::frame;
using amp::testing::gateway_rig;
using amp::testing::wire;

// The `message` frames `w` got so far, of type `type` (empty: every one not from $broker).
std::vector<frame> messages(wire& w, std::string_view type) {
  std::vector<frame> out;
  while (auto m = w.next("message")) {
    if (type.empty() ? m->str("/envelope/from") != "$broker" : m->str("/envelope/type") == type) {
      out.push_back(*m);
    }
  }
  return out;
}

TEST_CASE("a scatter reaches each member as a branch and completes at its quorum",
          "[session][operations]") {
  gateway_rig rig;
  auto boss = rig.connect("boss");
  auto alfa = rig.connect("alfa");
  auto bravo = rig.connect("bravo");
  auto ok = boss.request(
      R"({"op":"scatter","id":1,"to":["charlie","alfa","bravo","alfa","boss"],"body":{"doc":1},)"
      R"("bodies":{"bravo":{"doc":2}},"type":"review.request","quorum":2,"timeout_ms":30000,)"
      R"("on_timeout":"partial"})",
      "1");
  REQUIRE(ok.op() == "ok");
  CHECK(ok.flag("/created"));
  CHECK(ok.raw("/members") == R"(["alfa","bravo","charlie"])");
  const auto op = ok.str("/operation");
  CHECK(op.rfind("o_", 0) == 0);

  auto a = messages(alfa, "review.request");
  REQUIRE(a.size() == 1);
  CHECK(a[0].str("/envelope/from") == "boss");
  CHECK(a[0].raw("/envelope/body") == R"({"doc":1})");
  CHECK(a[0].str("/envelope/operation/id") == op);
  CHECK(a[0].str("/envelope/operation/branch") == "alfa");
  CHECK(a[0].num("/envelope/operation/attempt") == 1);
  CHECK(a[0].str("/envelope/operation/reply_by") != "<absent>");
  auto b = messages(bravo, "review.request");
  REQUIRE(b.size() == 1);
  CHECK(b[0].raw("/envelope/body") == R"({"doc":2})");

  auto r1 = alfa.request(R"({"op":"reply","id":2,"operation":")" + op +
                             R"(","attempt":1,"accept":true,"body":"fine"})",
                         "2");
  CHECK(r1.str("/state") == "open");
  CHECK_FALSE(r1.has("/duplicate"));
  auto dup = alfa.request(R"({"op":"reply","id":3,"operation":")" + op + R"(","attempt":1})", "3");
  CHECK(dup.str("/state") == "open");
  CHECK(dup.flag("/duplicate"));
  CHECK(bravo.request(R"({"op":"reply","id":4,"operation":")" + op + R"(","attempt":2})", "4")
            .code() == "conflict");
  CHECK(boss.request(R"({"op":"reply","id":5,"operation":")" + op + R"(","attempt":1})", "5")
            .code() == "forbidden");
  CHECK(bravo.request(R"({"op":"reply","id":6,"operation":")" + op + R"(","attempt":1})", "6")
            .str("/state") == "completed");
  CHECK(bravo.request(R"({"op":"reply","id":7,"operation":")" + op + R"(","attempt":1})", "7")
            .code() == "conflict");

  auto notice = messages(boss, "amp.operation.completed");
  REQUIRE(notice.size() == 1);
  CHECK(notice[0].str("/envelope/from") == "$broker");
  CHECK(notice[0].str("/envelope/body/operation") == op);
  CHECK(notice[0].raw("/envelope/body/missing") == R"(["charlie"])");
  CHECK(notice[0].raw("/envelope/body/replies/alfa/body") == R"("fine")");

  auto whole = boss.request(R"({"op":"operation","id":8,"operation":")" + op + "\"}", "8");
  CHECK(whole.str("/operation/state") == "completed");
  CHECK(whole.str("/operation/initiator") == "boss");
  CHECK(whole.raw("/operation/members") == R"(["alfa","bravo","charlie"])");
  CHECK(whole.num("/operation/quorum") == 2);
  CHECK(whole.str("/operation/branches/alfa/state") == "replied");
  CHECK(whole.has("/operation/revision"));
  auto own = alfa.request(R"({"op":"operation","id":9,"operation":")" + op + "\"}", "9");
  CHECK(own.has("/operation/branches/alfa"));
  CHECK_FALSE(own.has("/operation/branches/bravo"));
  auto stranger = rig.connect("mallory");
  CHECK(stranger.request(R"({"op":"operation","id":10,"operation":")" + op + "\"}", "10").code() ==
        "not_found");
}

TEST_CASE("a scatter's checks run in the spec's order and refuse without storing",
          "[session][operations]") {
  gateway_rig rig([](amp::server_config& c) { c.limits.max_body_bytes = 64; });
  auto boss = rig.connect("boss", R"({"send":["alfa","bravo"]})");
  auto code = [&](std::string body) {
    return boss.request(R"({"op":"scatter","id":1,)" + body + "}", "1").code();
  };
  CHECK(code(R"("to":42,"body":1)") == "bad_request");
  CHECK(code(R"("body":1)") == "bad_request");                                    // neither
  CHECK(code(R"("to":["alfa"],"audience":"online","body":1)") == "bad_request");  // both
  CHECK(code(R"("audience":"everyone","body":1)") == "bad_request");
  CHECK(code(R"("to":[],"body":1)") == "bad_request");
  CHECK(code(R"("to":["alfa"],"quorum":1,"body":1)") == "bad_request");  // no timeout_ms
  CHECK(code(R"("to":["alfa"],"quorum":1,"timeout_ms":99,"body":1)") == "bad_request");
  CHECK(code(R"("to":["alfa"],"quorum":1,"timeout_ms":1000,"on_timeout":"x","body":1)") ==
        "bad_request");
  CHECK(code(R"("to":["Alfa"],"quorum":1,"timeout_ms":1000,"body":1)") == "invalid_name");
  CHECK(code(R"("to":["zulu"],"body":1)") == "forbidden");
  CHECK(code(R"("to":["alfa","bravo"],"quorum":3,"timeout_ms":1000,"body":1)") == "bad_request");
  CHECK(code(R"("to":["alfa"],"bodies":{"bravo":1},"body":1)") == "bad_request");
  CHECK(code(R"("to":["alfa"],"bodies":{"Bravo":1},"body":1)") == "invalid_name");
  CHECK(code(R"("audience":"online","body":1)") == "forbidden");  // needs send: ["*"]
  CHECK(code(R"("to":["alfa"],"body":")" + std::string(80, 'x') + "\"") == "payload_too_large");
  CHECK(code(R"("to":["alfa"],"bodies":{"alfa":")" + std::string(80, 'x') + "\"}") ==
        "payload_too_large");
  CHECK(code(R"("to":["alfa"],"type":"bad type","body":1)") == "invalid_envelope");
  CHECK(code(R"("to":["alfa"],"idempotency_key":"","body":1)") == "bad_request");

  auto alfa = rig.connect("alfa");
  CHECK(alfa.count("message") == 0);
  CHECK(alfa.request(R"({"op":"reply","id":2,"operation":"nope","attempt":1})", "2").code() ==
        "invalid_name");
  CHECK(alfa.request(R"({"op":"reply","id":3,"operation":"o_unknown1","attempt":1})", "3").code() ==
        "not_found");
  CHECK(alfa.request(R"({"op":"reply","id":4,"operation":"o_unknown1"})", "4").code() ==
        "bad_request");
  CHECK(alfa.request(R"({"op":"cancel","id":5,"operation":"o_a","task":"t_a"})", "5").code() ==
        "bad_request");
  CHECK(alfa.request(R"({"op":"cancel","id":6})", "6").code() == "bad_request");
  CHECK(alfa.request(R"({"op":"retry","id":7,"operation":"o_a"})", "7").code() == "bad_request");
  CHECK(alfa.request(R"({"op":"retry","id":8,"operation":"o_a","member":"B"})", "8").code() ==
        "invalid_name");
}

TEST_CASE(
    "an operation counts once against the budget, a repeat of its key not at all, even when spent",
    "[session][operations]") {
  gateway_rig rig(
      [](amp::server_config& c) { c.participant_policies["boss"].per_day = std::int64_t{2}; });
  auto boss = rig.connect("boss");
  auto start = [&](std::string id, std::string key) {
    return boss.request(R"({"op":"scatter","id":")" + id +
                            R"(","to":["alfa","bravo","charlie"],"body":1,"idempotency_key":")" +
                            key + "\"}",
                        "\"" + id + "\"");
  };
  auto first = start("a", "k1");
  REQUIRE(first.op() == "ok");
  auto again = start("b", "k1");
  REQUIRE(again.op() == "ok");
  CHECK_FALSE(again.flag("/created"));
  CHECK(again.str("/operation") == first.str("/operation"));
  CHECK(start("c", "k2").op() == "ok");
  CHECK(start("d", "k3").code() == "budget_exhausted");
  // A repeat is answered with its operation even when the budget is spent.
  auto spent = start("e", "k1");
  REQUIRE(spent.op() == "ok");
  CHECK(spent.str("/operation") == first.str("/operation"));
  CHECK_FALSE(spent.flag("/created"));
}

TEST_CASE("a retry sends a branch again, a cancel stops the rest and tells the members",
          "[session][operations]") {
  gateway_rig rig;
  auto boss = rig.connect("boss");
  auto alfa = rig.connect("alfa");
  auto bravo = rig.connect("bravo");
  auto charlie = rig.connect("charlie");
  auto ok =
      boss.request(R"({"op":"scatter","id":1,"to":["alfa","bravo","charlie"],"body":1,"quorum":3,)"
                   R"("timeout_ms":60000})",
                   "1");
  const auto op = ok.str("/operation");
  REQUIRE(messages(bravo, "").size() == 1);

  CHECK(bravo.request(R"({"op":"retry","id":2,"operation":")" + op + R"(","member":"bravo"})", "2")
            .code() == "forbidden");
  auto retried =
      boss.request(R"({"op":"retry","id":3,"operation":")" + op + R"(","member":"bravo"})", "3");
  CHECK(retried.num("/attempt") == 2);
  auto again = messages(bravo, "");
  REQUIRE(again.size() == 1);
  CHECK(again[0].num("/envelope/operation/attempt") == 2);
  CHECK(bravo.request(R"({"op":"reply","id":4,"operation":")" + op + R"(","attempt":1})", "4")
            .code() == "conflict");

  // alfa replied, charlie acked its branch (delivered), bravo did neither.
  CHECK(
      alfa.request(R"({"op":"reply","id":5,"operation":")" + op + R"(","attempt":1})", "5").op() ==
      "ok");
  auto c = messages(charlie, "");
  REQUIRE(c.size() == 1);
  REQUIRE(
      charlie.request(R"({"op":"ack","id":6,"seq":)" + std::to_string(c[0].num("/seq")) + "}", "6")
          .op() == "ok");
  auto seen = boss.request(R"({"op":"operation","id":7,"operation":")" + op + "\"}", "7");
  CHECK(seen.str("/operation/branches/charlie/state") == "delivered");

  CHECK(alfa.request(R"({"op":"cancel","id":8,"operation":")" + op + "\"}", "8").code() ==
        "forbidden");
  auto cancelled = boss.request(R"({"op":"cancel","id":9,"operation":")" + op + "\"}", "9");
  REQUIRE(cancelled.op() == "ok");
  CHECK(cancelled.str("/state") == "cancelled");
  CHECK(cancelled.str("/branches/alfa") == "already_completed");
  CHECK(cancelled.str("/branches/bravo") == "stopped");
  CHECK(cancelled.str("/branches/charlie") == "unknown");
  CHECK_FALSE(alfa.next("cancelled"));
  auto told = bravo.next("cancelled");
  REQUIRE(told);
  CHECK(told->str("/operation") == op);
  CHECK(charlie.next("cancelled"));
  CHECK(messages(boss, "amp.operation.cancelled").size() == 1);
  CHECK(boss.request(R"({"op":"cancel","id":10,"operation":")" + op + "\"}", "10").code() ==
        "conflict");
}

TEST_CASE("an online audience is every participant with a live entry but the initiator",
          "[session][operations]") {
  gateway_rig rig;
  auto boss = rig.connect("boss");
  auto alfa = rig.connect("alfa");
  auto bravo = rig.connect("bravo");
  REQUIRE(alfa.request(R"({"op":"register","id":1,"jobs":[]})", "1").op() == "ok");
  REQUIRE(boss.request(R"({"op":"register","id":1,"jobs":[]})", "1").op() == "ok");
  auto ok = boss.request(R"({"op":"scatter","id":2,"audience":"online","body":"hi"})", "2");
  REQUIRE(ok.op() == "ok");
  CHECK(ok.raw("/members") == R"(["alfa"])");
  CHECK(messages(alfa, "").size() == 1);
  CHECK(messages(bravo, "").empty());
  auto self = boss.request(
      R"({"op":"scatter","id":3,"audience":"online","include_self":true,"body":"hi"})", "3");
  CHECK(self.raw("/members") == R"(["alfa","boss"])");
  auto lonely = rig.connect("lonely");
  CHECK(alfa.request(R"({"op":"bye","id":9})", "9").op() == "ok");
  REQUIRE(boss.request(R"({"op":"bye","id":9})", "9").op() == "ok");
  CHECK(lonely.request(R"({"op":"scatter","id":4,"audience":"online","body":1})", "4").code() ==
        "bad_request");
}

TEST_CASE("an audience of all is every participant with an inbox, connected or not",
          "[session][operations]") {
  gateway_rig rig;
  auto boss = rig.connect("boss");
  {
    auto gone = rig.connect("gone");  // attached once: its inbox stays
    REQUIRE(gone.request(R"({"op":"bye","id":1})", "1").op() == "ok");
  }
  auto alfa = rig.connect("alfa");
  // waiting was never connected, but a message waits for it.
  REQUIRE(alfa.request(R"({"op":"send","id":1,"to":"waiting","body":1})", "1").op() == "ok");
  auto ok = boss.request(
      R"({"op":"scatter","id":2,"audience":"all","body":"hi","quorum":3,"timeout_ms":1000})", "2");
  REQUIRE(ok.op() == "ok");
  CHECK(ok.raw("/members") == R"(["alfa","gone","waiting"])");
  auto five = boss.request(
      R"({"op":"scatter","id":3,"audience":"all","body":"hi","quorum":5,"timeout_ms":1000,)"
      R"("include_self":true})",
      "3");
  CHECK(five.code() == "bad_request");
  CHECK(
      boss.request(R"({"op":"scatter","id":4,"audience":"all","include_self":true,"body":1})", "4")
          .raw("/members") == R"(["alfa","boss","gone","waiting"])");
}

TEST_CASE("bad requests, members and strangers are told so before the policy and the body size",
          "[session][operations]") {
  gateway_rig rig([](amp::server_config& c) {
    c.limits.max_body_bytes = 64;
    c.participant_policies["boss"].per_day = std::int64_t{1};
    c.participant_policies["alfa"].per_s = 0.001;
    c.participant_policies["alfa"].burst = 1.0;
  });
  auto boss = rig.connect("boss");
  auto alfa = rig.connect("alfa");
  auto mallory = rig.connect("mallory");
  auto ok = boss.request(
      R"({"op":"scatter","id":1,"to":["alfa","bravo"],"body":1,"quorum":2,"timeout_ms":60000})",
      "1");
  REQUIRE(ok.op() == "ok");
  const auto op = ok.str("/operation");
  // The budget is spent; an audience of nobody (include_self left out) is still bad_request.
  CHECK(boss.request(R"({"op":"scatter","id":2,"to":["alfa"],"body":1})", "2").code() ==
        "budget_exhausted");
  // Nobody is registered: online is nobody.
  CHECK(boss.request(R"({"op":"scatter","id":3,"audience":"online","body":1})", "3").code() ==
        "bad_request");
  CHECK(boss.request(R"({"op":"scatter","id":4,"audience":"all","quorum":9,"timeout_ms":1000,)"
                     R"("body":1})",
                     "4")
            .code() == "bad_request");

  // alfa spends its one unit of rate; a retry by a member is forbidden all the same.
  CHECK(alfa.request(R"({"op":"send","id":5,"to":"bravo","body":1})", "5").op() == "ok");
  CHECK(alfa.request(R"({"op":"send","id":6,"to":"bravo","body":1})", "6").code() ==
        "rate_limited");
  CHECK(alfa.request(R"({"op":"retry","id":7,"operation":")" + op + R"(","member":"bravo"})", "7")
            .code() == "forbidden");
  // Someone of the ns who is not a member: forbidden before the body's size.
  const std::string big = R"(,"body":")" + std::string(80, 'x') + "\"}";
  CHECK(
      mallory.request(R"({"op":"reply","id":8,"operation":")" + op + R"(","attempt":1)" + big, "8")
          .code() == "forbidden");
  CHECK(alfa.request(R"({"op":"reply","id":9,"operation":")" + op + R"(","attempt":1)" + big, "9")
            .code() == "payload_too_large");
}

TEST_CASE("a body that bodies leaves nobody to receive is not checked", "[session][operations]") {
  gateway_rig rig([](amp::server_config& c) { c.limits.max_body_bytes = 64; });
  auto boss = rig.connect("boss");
  const std::string big = "\"" + std::string(80, 'x') + "\"";
  CHECK(boss.request(
                R"({"op":"scatter","id":1,"to":["alfa"],"bodies":{"alfa":2},"body":)" + big + "}",
                "1")
            .op() == "ok");
  CHECK(boss.request(R"({"op":"scatter","id":2,"to":["alfa","bravo"],"bodies":{"alfa":2},)"
                     R"("body":)" +
                         big + "}",
                     "2")
            .code() == "payload_too_large");
}

TEST_CASE("an acked branch is delivered once the ack is answered, even in a decided operation",
          "[session][operations]") {
  gateway_rig rig;
  auto boss = rig.connect("boss");
  auto alfa = rig.connect("alfa");
  auto bravo = rig.connect("bravo");
  auto ack_first = [&](amp::testing::wire& w, const std::string& id) {
    auto m = messages(w, "");
    REQUIRE(m.size() == 1);
    return w.request(
        R"({"op":"ack","id":)" + id + R"(,"seq":)" + std::to_string(m[0].num("/seq")) + "}", id);
  };
  auto multicast = boss.request(R"({"op":"scatter","id":1,"to":["alfa"],"body":1})", "1");
  const auto m = multicast.str("/operation");
  REQUIRE(ack_first(alfa, "2").op() == "ok");
  auto seen = boss.request(R"({"op":"operation","id":3,"operation":")" + m + "\"}", "3");
  CHECK(seen.str("/operation/state") == "completed");
  CHECK(seen.str("/operation/branches/alfa/state") == "delivered");

  auto gather = boss.request(
      R"({"op":"scatter","id":4,"to":["bravo"],"body":1,"quorum":1,"timeout_ms":60000})", "4");
  const auto g = gather.str("/operation");
  REQUIRE(ack_first(bravo, "5").op() == "ok");
  auto cancelled = boss.request(R"({"op":"cancel","id":6,"operation":")" + g + "\"}", "6");
  CHECK(cancelled.str("/branches/bravo") == "unknown");
}

}  // namespace
