#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "amp/broker/operation_record.hpp"
#include "amp/error.hpp"
#include "amp/timestamp.hpp"

using namespace std::chrono_literals;
using amp::branch_state;
using amp::cancel_outcome;
using amp::errc;
using amp::operation_record;
using amp::operation_state;

namespace {

const amp::time_point t0 = amp::parse_timestamp("2026-12-06T10:00:00.000Z").value();

// An open operation of `members` started at t0; `quorum` 0 is a multicast.
operation_record open_op(std::vector<std::string> members, int quorum,
                         amp::timeout_rule rule = amp::timeout_rule::failed) {
  operation_record r;
  r.operation = "o_test";
  r.ns = "acme";
  r.initiator = "boss";
  r.quorum = quorum;
  r.on_timeout = rule;
  r.created_at = r.updated_at = t0;
  if (quorum > 0) r.timeout_at = t0 + 30s;
  for (const auto& m : members) r.branches[m] = {};
  return r;
}

errc code_of(const auto& r) {
  REQUIRE_FALSE(r.has_value());
  return r.error().code();
}

}  // namespace

TEST_CASE("a quorum of distinct acceptances completes the operation, at the reply that makes it",
          "[operation_record]") {
  auto r = open_op({"alfa", "bravo", "charlie"}, 2);
  auto first = amp::apply_reply(r, "alfa", 1, true, "{\"ok\":1}", t0 + 1s);
  REQUIRE(first.has_value());
  CHECK_FALSE(first->decided);
  CHECK(r.state == operation_state::open);
  CHECK(r.branches["alfa"].state == branch_state::replied);

  auto second = amp::apply_reply(r, "bravo", 1, true, "", t0 + 2s);
  REQUIRE(second.has_value());
  CHECK(second->decided);
  CHECK(r.state == operation_state::completed);
  CHECK(r.updated_at == t0 + 2s);
  CHECK(r.branches["bravo"].reply->body == "null");
  CHECK_FALSE(r.error.has_value());
  CHECK(amp::missing(r) == std::vector<std::string>{"charlie"});

  // after the decision a reply is refused and changes nothing
  auto before = r;
  CHECK(code_of(amp::apply_reply(r, "charlie", 1, true, "1", t0 + 3s)) == errc::conflict);
  CHECK(r == before);
}

TEST_CASE("a second reply of a branch is a duplicate and adds no vote", "[operation_record]") {
  auto r = open_op({"alfa", "bravo", "charlie"}, 2);
  REQUIRE(amp::apply_reply(r, "alfa", 1, true, "1", t0 + 1s).has_value());
  auto again = amp::apply_reply(r, "alfa", 1, true, "2", t0 + 2s);
  REQUIRE(again.has_value());
  CHECK(again->duplicate);
  CHECK_FALSE(again->decided);
  CHECK(amp::accepted(r) == 1);
  CHECK(r.state == operation_state::open);
  CHECK(r.branches["alfa"].reply->body == "1");
  CHECK(r.branches["alfa"].reply->at == t0 + 1s);
}

TEST_CASE("replies from a non-member or with a stale or future attempt are refused",
          "[operation_record]") {
  auto r = open_op({"alfa", "bravo"}, 1);
  auto before = r;
  CHECK(code_of(amp::apply_reply(r, "mallory", 1, true, "1", t0)) == errc::forbidden);
  CHECK(code_of(amp::apply_reply(r, "alfa", 2, true, "1", t0)) == errc::conflict);
  CHECK(r == before);

  r.branches["alfa"].seq = 5;
  REQUIRE(amp::retry_branch(r, "alfa", t0 + 1s).value() == 2);
  CHECK(r.branches["alfa"].seq == 0);  // the new attempt's message is not stored yet
  before = r;
  CHECK(code_of(amp::apply_reply(r, "alfa", 1, true, "1", t0 + 2s)) == errc::conflict);
  CHECK(r == before);
  auto current = amp::apply_reply(r, "alfa", 2, true, "1", t0 + 2s);
  REQUIRE(current.has_value());
  CHECK(current->decided);
  CHECK(r.state == operation_state::completed);
}

TEST_CASE("so many rejections that the quorum cannot be met fail the operation at once",
          "[operation_record]") {
  auto r = open_op({"alfa", "bravo", "charlie", "delta"}, 3);
  REQUIRE_FALSE(amp::apply_reply(r, "alfa", 1, false, "1", t0 + 1s)->decided);
  CHECK(r.state == operation_state::open);  // 3 of the 3 others may still accept
  auto second = amp::apply_reply(r, "bravo", 1, false, "2", t0 + 2s);
  REQUIRE(second.has_value());
  CHECK(second->decided);
  CHECK(r.state == operation_state::failed);
  CHECK_FALSE(r.error.has_value());  // the replies say why
}

TEST_CASE("at the deadline an operation short of its quorum is partial or failed by its rule",
          "[operation_record]") {
  SECTION("partial with an acceptance") {
    auto r = open_op({"alfa", "bravo", "charlie"}, 3, amp::timeout_rule::partial);
    REQUIRE(amp::apply_reply(r, "alfa", 1, true, "1", t0 + 1s).has_value());
    CHECK_FALSE(amp::decide(r, t0 + 30s - 1ms));
    CHECK(r.state == operation_state::open);
    CHECK(amp::decide(r, t0 + 30s));
    CHECK(r.state == operation_state::partial);
    CHECK(r.updated_at == t0 + 30s);
    CHECK_FALSE(r.error.has_value());
    CHECK_FALSE(amp::decide(r, t0 + 31s));  // decided once
  }
  SECTION("partial without an acceptance fails") {
    auto r = open_op({"alfa", "bravo"}, 1, amp::timeout_rule::partial);
    CHECK(amp::decide(r, t0 + 31s));
    CHECK(r.state == operation_state::failed);
    REQUIRE(r.error.has_value());
    CHECK(r.error->code == "timeout");
  }
  SECTION("failed by the default rule, acceptances or not") {
    auto r = open_op({"alfa", "bravo", "charlie"}, 3);
    REQUIRE(amp::apply_reply(r, "alfa", 1, true, "1", t0 + 1s).has_value());
    CHECK(amp::decide(r, t0 + 30s));
    CHECK(r.state == operation_state::failed);
    CHECK(r.error->code == "timeout");
  }
  SECTION("past the deadline, before anyone decided, a reply, a retry and a cancel lose") {
    auto r = open_op({"alfa", "bravo", "charlie"}, 3, amp::timeout_rule::partial);
    REQUIRE(amp::apply_reply(r, "alfa", 1, true, "1", t0 + 1s).has_value());
    auto before = r;
    CHECK(code_of(amp::apply_reply(r, "bravo", 1, true, "1", t0 + 30s)) == errc::conflict);
    CHECK(code_of(amp::retry_branch(r, "bravo", t0 + 30s)) == errc::conflict);
    CHECK(code_of(amp::cancel_operation(r, t0 + 30s)) == errc::conflict);
    CHECK(r == before);
    CHECK(amp::decide(r, t0 + 30s));
    CHECK(r.state == operation_state::partial);
  }
}

TEST_CASE("a multicast completes once every branch is stored and gathers nothing",
          "[operation_record]") {
  auto r = open_op({"alfa", "bravo"}, 0);
  CHECK_FALSE(amp::decide(r, t0 + 1h));
  r.sent = true;
  CHECK(amp::decide(r, t0 + 1s));
  CHECK(r.state == operation_state::completed);
  CHECK(code_of(amp::apply_reply(r, "alfa", 1, true, "1", t0 + 2s)) == errc::conflict);
}

TEST_CASE(
    "a retry raises the branch's attempt, only for an open operation and a branch that "
    "did not reply",
    "[operation_record]") {
  auto r = open_op({"alfa", "bravo", "charlie"}, 3);
  REQUIRE(amp::mark_delivered(r, "alfa", 1, t0 + 1s));
  auto a = amp::retry_branch(r, "alfa", t0 + 2s);
  REQUIRE(a.has_value());
  CHECK(*a == 2);
  CHECK(r.branches["alfa"].state == branch_state::pending);
  CHECK(amp::retry_branch(r, "alfa", t0 + 3s).value() == 3);

  REQUIRE(amp::apply_reply(r, "bravo", 1, true, "1", t0 + 3s).has_value());
  auto before = r;
  CHECK(code_of(amp::retry_branch(r, "bravo", t0 + 4s)) == errc::conflict);
  CHECK(code_of(amp::retry_branch(r, "zulu", t0 + 4s)) == errc::not_found);
  CHECK(r == before);

  REQUIRE(amp::decide(r, t0 + 30s));
  CHECK(code_of(amp::retry_branch(r, "charlie", t0 + 31s)) == errc::conflict);
}

TEST_CASE("an acknowledgement marks a pending branch of its attempt delivered, nothing else",
          "[operation_record]") {
  auto r = open_op({"alfa", "bravo"}, 2);
  CHECK_FALSE(amp::mark_delivered(r, "zulu", 1, t0));
  CHECK_FALSE(amp::mark_delivered(r, "alfa", 2, t0));
  CHECK(amp::mark_delivered(r, "alfa", 1, t0 + 1s));
  CHECK(r.branches["alfa"].state == branch_state::delivered);
  CHECK_FALSE(amp::mark_delivered(r, "alfa", 1, t0 + 2s));
  REQUIRE(amp::retry_branch(r, "bravo", t0 + 2s).has_value());
  CHECK_FALSE(amp::mark_delivered(r, "bravo", 1, t0 + 3s));  // the old attempt's message
  CHECK(amp::mark_delivered(r, "bravo", 2, t0 + 3s));
  REQUIRE(amp::apply_reply(r, "alfa", 1, true, "1", t0 + 4s).has_value());
  CHECK_FALSE(amp::mark_delivered(r, "alfa", 1, t0 + 5s));

  // Decided, the record still learns that a branch was acknowledged.
  auto m = open_op({"alfa", "bravo"}, 1);
  REQUIRE(amp::apply_reply(m, "alfa", 1, true, "1", t0 + 1s).value().decided);
  REQUIRE(m.state == operation_state::completed);
  CHECK(amp::mark_delivered(m, "bravo", 1, t0 + 2s));
  CHECK(m.branches["bravo"].state == branch_state::delivered);
}

TEST_CASE("only members reply, and a member who is not the initiator is refused its commands",
          "[operation_record]") {
  auto r = open_op({"alfa", "bravo"}, 2);
  CHECK(amp::check_member(r, "alfa").has_value());
  CHECK(amp::check_member(r, "zulu").error().code() == amp::errc::forbidden);
  CHECK(amp::refuse_member(r, "alfa", "cancel").error().code() == amp::errc::forbidden);
  CHECK(amp::refuse_member(r, "alfa", "cancel").error().message() ==
        "only the initiator may cancel operation \"" + r.operation + "\"");
  CHECK(amp::refuse_member(r, r.initiator, "cancel").has_value());
  CHECK(amp::refuse_member(r, "zulu", "cancel").has_value());  // the caller's not_found
  // A stranger is forbidden a reply even past the deadline, before any conflict.
  CHECK(amp::apply_reply(r, "zulu", 1, true, "1", t0 + 1h).error().code() == amp::errc::forbidden);
}

TEST_CASE("a cancel tells replied, withdrawn and acknowledged branches apart",
          "[operation_record]") {
  auto r = open_op({"alfa", "bravo", "charlie"}, 3);
  REQUIRE(amp::apply_reply(r, "alfa", 1, true, "1", t0 + 1s).has_value());
  REQUIRE(amp::mark_delivered(r, "charlie", 1, t0 + 1s));
  auto c = amp::cancel_operation(r, t0 + 2s);
  REQUIRE(c.has_value());
  CHECK(c->at("alfa") == cancel_outcome::already_completed);
  CHECK(c->at("bravo") == cancel_outcome::stopped);
  CHECK(c->at("charlie") == cancel_outcome::unknown);
  CHECK(r.state == operation_state::cancelled);
  CHECK(r.branches["bravo"].state == branch_state::stopped);
  CHECK(r.branches["charlie"].state == branch_state::delivered);
  CHECK(r.updated_at == t0 + 2s);

  auto before = r;
  CHECK(code_of(amp::cancel_operation(r, t0 + 3s)) == errc::conflict);
  CHECK(r == before);
  CHECK_FALSE(amp::decide(r, t0 + 1h));
}

TEST_CASE("an operation record is stored and read back whole", "[operation_record]") {
  auto r = open_op({"alfa", "bravo", "charlie"}, 2, amp::timeout_rule::partial);
  REQUIRE(amp::apply_reply(r, "alfa", 1, false, "{\"why\":[\"no\"]}", t0 + 1s).has_value());
  REQUIRE(amp::retry_branch(r, "bravo", t0 + 2s).has_value());
  REQUIRE(amp::mark_delivered(r, "charlie", 1, t0 + 2s));
  REQUIRE(amp::decide(r, t0 + 30s));
  r.sent = true;
  r.notified = true;
  r.idem_key = "acme.idem.abc";
  r.due_seq = 41;
  r.branches["charlie"].seq = 12;
  r.revision = 7;

  auto back = amp::parse_operation_record(amp::to_stored_json(r));
  REQUIRE(back.has_value());
  CHECK(back->revision == 0);
  back->revision = 7;
  CHECK(*back == r);
  CHECK(back->branches["alfa"].reply->body == "{\"why\":[\"no\"]}");
  CHECK(amp::to_json(r).find("\"seq\"") == std::string::npos);  // the broker's own

  CHECK(code_of(amp::parse_operation_record("[]")) == errc::internal);
  CHECK(code_of(amp::parse_operation_record("{\"operation\":\"o_x\",\"state\":\"open\"}")) ==
        errc::internal);
}

TEST_CASE("the record as the spec shows it, and as a member sees it", "[operation_record]") {
  auto r = open_op({"alfa", "bravo"}, 0);
  r.revision = 3;
  CHECK(amp::to_json(r) ==
        "{\"operation\":\"o_test\",\"ns\":\"acme\",\"initiator\":\"boss\","
        "\"members\":[\"alfa\",\"bravo\"],\"quorum\":null,\"state\":\"open\","
        "\"created_at\":\"2026-12-06T10:00:00.000Z\",\"updated_at\":\"2026-12-06T10:00:00.000Z\","
        "\"timeout_at\":null,\"branches\":{"
        "\"alfa\":{\"attempt\":1,\"state\":\"pending\",\"reply\":null},"
        "\"bravo\":{\"attempt\":1,\"state\":\"pending\",\"reply\":null}},\"revision\":3}");
  auto own = amp::to_json(r, "bravo");
  CHECK(own.find("\"alfa\":{") == std::string::npos);
  CHECK(own.find("\"bravo\":{\"attempt\":1") != std::string::npos);
}

TEST_CASE("the initiator's notice lists the replies and who is missing", "[operation_record]") {
  auto r = open_op({"alfa", "bravo", "charlie"}, 2);
  REQUIRE(amp::apply_reply(r, "bravo", 1, true, "\"yes\"", t0 + 1s).has_value());
  REQUIRE(amp::decide(r, t0 + 30s));
  CHECK(amp::notice_body(r) ==
        "{\"operation\":\"o_test\",\"state\":\"failed\",\"quorum\":2,"
        "\"members\":[\"alfa\",\"bravo\",\"charlie\"],"
        "\"replies\":{\"bravo\":{\"accept\":true,\"body\":\"yes\",\"at\":"
        "\"2026-12-06T10:00:01.000Z\"}},\"missing\":[\"alfa\",\"charlie\"],"
        "\"error\":{\"code\":\"timeout\",\"message\":\"1 of 3 members accepted by the deadline; "
        "the quorum is 2\"}}");
}
