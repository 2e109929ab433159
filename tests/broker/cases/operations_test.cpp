// Operations (spec §12): multicast, scatter-gather with a quorum, fenced retries, cancel
// with withdrawal, the deadline taken by whichever broker is alive, one notice.

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "amp/broker/inbox.hpp"
#include "amp/broker/operations.hpp"
#include "amp/broker/task_store.hpp"
#include "amp/subjects.hpp"
#include "broker/cases/broker_helpers.hpp"
#include "broker/cases/faulty_transport.hpp"

namespace amp::broker_testing {
namespace {

using inbox_log = callback_log<inbox_message>;

// One broker's view of operations: its task store, inbox and operations, on `t`.
struct node {
  std::shared_ptr<task_store> store;
  std::shared_ptr<amp::inbox> box;
  std::shared_ptr<operations> ops;
  callback_log<std::pair<std::string, std::vector<std::string>>> cancels;

  node(std::shared_ptr<transport> t, const broker_config& cfg) {
    store = must(task_store::open(t, cfg));
    box = must(inbox::open(t, cfg));
    auto told = cancels.callback();
    ops = must(operations::open(
        t, cfg, store, box,
        {.cancelled = [told](const operation_id& op, const std::vector<std::string>& members) {
          told({op.str(), members});
        }}));
  }
};

// A participant's inbox as its sessions see it: every delivery, acked on demand.
struct reader {
  inbox_log log;
  std::unique_ptr<inbox_reader> r;
  reader(amp::inbox& box, std::string_view who) {
    r = must(box.attach(pname(who), log.callback()));
  }
  // The deliveries of `type` so far.
  std::vector<inbox_message> of_type(std::string_view type) const {
    std::vector<inbox_message> out;
    for (const auto& m : log.all())
      if (m.env.type == type) out.push_back(m);
    return out;
  }
};

std::vector<participant_name> names(std::initializer_list<std::string_view> list) {
  std::vector<participant_name> out;
  for (auto n : list) out.push_back(pname(n));
  return out;
}

broker_config tweaked(fixture& fx, const std::function<void(broker_config&)>& tweak) {
  auto cfg = config_for(fx);
  if (tweak) tweak(cfg);
  return cfg;
}

struct setup {
  std::unique_ptr<fixture> fx = make_fixture();
  broker_config cfg;
  node a;
  duration timeout = fx->real_time() ? std::chrono::seconds(1) : std::chrono::seconds(30);

  explicit setup(const std::function<void(broker_config&)>& tweak = {})
      : cfg(tweaked(*fx, tweak)), a(fx->shared_transport(), cfg) {}

  operation_start gather(std::initializer_list<std::string_view> members, int quorum,
                         timeout_rule rule = timeout_rule::failed) {
    return {.initiator = pname("boss"),
            .members = names(members),
            .body = R"({"doc":42})",
            .type = "review.request",
            .quorum = quorum,
            .timeout = timeout,
            .on_timeout = rule};
  }
};

TEST_CASE("a scatter sends each member its branch and completes at its quorum", "[operations]") {
  setup s;
  reader boss(*s.a.box, "boss"), alfa(*s.a.box, "alfa"), bravo(*s.a.box, "bravo"),
      charlie(*s.a.box, "charlie");
  auto start = s.gather({"charlie", "alfa", "bravo", "alfa"}, 2);
  start.bodies = {{"bravo", R"({"doc":42,"part":2})"}};
  start.headers = {{"trace", "t-1"}};
  auto started = must(s.a.ops->start(start));
  CHECK(started.created);
  CHECK(started.members == std::vector<std::string>{"alfa", "bravo", "charlie"});
  const auto& op = started.operation;

  REQUIRE(alfa.log.reaches(1));
  REQUIRE(bravo.log.reaches(1));
  REQUIRE(charlie.log.reaches(1));
  auto branch = alfa.log.at(0);
  CHECK(branch.env.from == "boss");
  CHECK(branch.env.type == "review.request");
  CHECK(branch.env.body == R"({"doc":42})");
  CHECK(branch.env.headers == std::vector<std::pair<std::string, std::string>>{{"trace", "t-1"}});
  REQUIRE(branch.env.operation.has_value());
  CHECK(branch.env.operation->id == op.str());
  CHECK(branch.env.operation->branch == "alfa");
  CHECK(branch.env.operation->attempt == 1);
  auto record = must(s.a.ops->get(op));
  CHECK(branch.env.operation->reply_by == record.timeout_at);
  CHECK(record.timeout_at == record.created_at + s.timeout);
  CHECK(bravo.log.at(0).env.body == R"({"doc":42,"part":2})");
  CHECK(bravo.log.at(0).env.operation->branch == "bravo");

  // Votes: a refusal, a duplicate, then the quorum.
  CHECK(must(s.a.ops->reply(op, pname("alfa"), 1, false, R"("no")")).state ==
        operation_state::open);
  auto dup = must(s.a.ops->reply(op, pname("alfa"), 1, true, "null"));
  CHECK(dup.duplicate);
  CHECK(dup.state == operation_state::open);
  CHECK(code_of(s.a.ops->reply(op, pname("mallory"), 1, true, "")) == errc::forbidden);
  CHECK(code_of(s.a.ops->reply(op, pname("bravo"), 2, true, "")) == errc::conflict);
  CHECK(code_of(s.a.ops->reply(s.a.ops->new_id(), pname("bravo"), 1, true, "")) == errc::not_found);
  CHECK(code_of(s.a.ops->reply(op, pname("bravo"), 1, true, "{")) == errc::bad_request);
  CHECK(must(s.a.ops->reply(op, pname("bravo"), 1, true, R"({"ok":true})")).state ==
        operation_state::open);
  CHECK(must(s.a.ops->reply(op, pname("charlie"), 1, true, "")).state ==
        operation_state::completed);
  CHECK(code_of(s.a.ops->reply(op, pname("charlie"), 1, true, "")) == errc::conflict);

  REQUIRE(boss.log.reaches(1));
  auto notice = boss.log.at(0);
  must(boss.r->ack(notice.seq));
  CHECK(notice.env.from == "$broker");
  CHECK(notice.env.type == "amp.operation.completed");
  record = must(s.a.ops->get(op));
  CHECK(record.state == operation_state::completed);
  CHECK(record.notified);
  CHECK(notice.env.body == amp::notice_body(record));
  CHECK(notice.env.body.find(R"("bravo":{"accept":true,"body":{"ok":true})") != std::string::npos);
  CHECK(notice.env.body.find(R"("missing":[])") != std::string::npos);
  // The operation's message left the operations stream: nothing is left to look at.
  CHECK(eventually([&] {
    return must(s.fx->transport().stream_info_of(subjects::operations_stream(s.cfg.ns)))
               .state.messages == 0;
  }));
  s.fx->advance(s.timeout + std::chrono::seconds(1));
  CHECK(boss.of_type("amp.operation.completed").size() == 1);
  CHECK(boss.log.size() == 1);
}

TEST_CASE("a multicast completes once its branches are stored and gathers nothing",
          "[operations]") {
  setup s;
  reader boss(*s.a.box, "boss"), alfa(*s.a.box, "alfa");
  auto started = must(s.a.ops->start({.initiator = pname("boss"),
                                      .members = names({"alfa", "bravo"}),
                                      .body = R"("hello")",
                                      .type = "note"}));
  REQUIRE(alfa.log.reaches(1));
  CHECK_FALSE(alfa.log.at(0).env.operation->reply_by != time_point{});
  auto record = must(s.a.ops->get(started.operation));
  CHECK(record.state == operation_state::completed);
  CHECK(record.quorum == 0);
  CHECK(record.timeout_at == time_point{});
  CHECK(record.branches.at("bravo").seq != 0);
  REQUIRE(boss.log.reaches(1));
  CHECK(boss.log.at(0).env.type == "amp.operation.completed");
  CHECK(code_of(s.a.ops->reply(started.operation, pname("alfa"), 1, true, "")) == errc::conflict);

  // Decided already, the operation still records that alfa acknowledged its branch.
  must(alfa.r->ack(alfa.log.at(0).seq));
  std::atomic<bool> changed{false}, ran{false};
  s.a.ops->async_delivered(started.operation, pname("alfa"), 1, [&](bool c) {
    changed = c;
    ran = true;
  });
  REQUIRE(eventually([&] { return ran.load(); }));
  CHECK(changed);
  record = must(s.a.ops->get(started.operation));
  CHECK(record.branches.at("alfa").state == branch_state::delivered);
  CHECK(record.branches.at("bravo").state == branch_state::pending);
}

TEST_CASE("rejections that make the quorum impossible fail an operation at once", "[operations]") {
  setup s;
  reader boss(*s.a.box, "boss");
  auto op = must(s.a.ops->start(s.gather({"alfa", "bravo", "charlie"}, 2))).operation;
  CHECK(must(s.a.ops->reply(op, pname("alfa"), 1, false, "")).state == operation_state::open);
  CHECK(must(s.a.ops->reply(op, pname("bravo"), 1, false, "")).state == operation_state::failed);
  REQUIRE(boss.log.reaches(1));
  CHECK(boss.log.at(0).env.type == "amp.operation.failed");
  CHECK(boss.log.at(0).env.body.find(R"("missing":["charlie"])") != std::string::npos);
  CHECK_FALSE(must(s.a.ops->get(op)).error.has_value());  // the replies decided, not time
}

TEST_CASE("at its deadline an operation is partial or failed, decided by the broker",
          "[operations][time]") {
  setup s;
  reader boss(*s.a.box, "boss");
  auto partial = must(s.a.ops->start(s.gather({"alfa", "bravo"}, 2, timeout_rule::partial)));
  auto failed =
      must(s.a.ops->start(s.gather({"alfa", "bravo", "charlie"}, 2, timeout_rule::partial)));
  must(s.a.ops->reply(partial.operation, pname("bravo"), 1, true, R"("yes")"));
  must(s.a.ops->reply(failed.operation, pname("bravo"), 1, false, ""));
  CHECK(boss.log.size() == 0);

  s.fx->advance(s.timeout + std::chrono::milliseconds(200));
  REQUIRE(boss.log.reaches(2));
  std::map<std::string, inbox_message> by_type;
  for (const auto& m : boss.log.all()) {
    by_type[m.env.type] = m;
    must(boss.r->ack(m.seq));
  }
  REQUIRE(by_type.count("amp.operation.partial") == 1);
  REQUIRE(by_type.count("amp.operation.failed") == 1);
  auto p = must(s.a.ops->get(partial.operation));
  CHECK(p.state == operation_state::partial);
  CHECK(by_type["amp.operation.partial"].env.body.find(R"("missing":["alfa"])") !=
        std::string::npos);
  auto f = must(s.a.ops->get(failed.operation));
  CHECK(f.state == operation_state::failed);
  REQUIRE(f.error.has_value());
  CHECK(f.error->code == "timeout");
  CHECK(by_type["amp.operation.failed"].env.body.find(R"("code":"timeout")") != std::string::npos);
  CHECK(code_of(s.a.ops->reply(partial.operation, pname("alfa"), 1, true, "")) == errc::conflict);
  s.fx->advance(s.timeout);
  CHECK(boss.log.size() == 2);
}

TEST_CASE("a reply after the deadline decides the operation and is refused", "[operations]") {
  auto fx = make_fixture();
  if (fx->real_time()) return;  // the deadlines loop would decide first: memory only
  auto cfg = config_for(*fx);
  // A clock the loop does not see: the consumer's redelivery is held back past the deadline.
  auto t = std::make_shared<faulty_transport>(fx->shared_transport());
  node a(t, cfg);
  reader boss(*a.box, "boss");
  t->set_fault([](std::string_view op, std::string_view) -> std::optional<error> {
    if (op == "fetch") return error(errc::unavailable, "fetch refused");
    return std::nullopt;
  });
  auto op = must(a.ops->start({.initiator = pname("boss"),
                               .members = names({"alfa"}),
                               .quorum = 1,
                               .timeout = std::chrono::seconds(1)}))
                .operation;
  fx->advance(std::chrono::seconds(2));
  CHECK(code_of(a.ops->reply(op, pname("alfa"), 1, true, "")) == errc::conflict);
  auto r = must(a.ops->get(op));
  CHECK(r.state == operation_state::failed);
  CHECK(r.error->code == "timeout");
  REQUIRE(boss.log.reaches(1));
  CHECK(boss.log.at(0).env.type == "amp.operation.failed");
}

TEST_CASE("a retry sends the branch again with a higher attempt and fences the old one",
          "[operations]") {
  setup s;
  reader bravo(*s.a.box, "bravo");
  auto op = must(s.a.ops->start(s.gather({"alfa", "bravo"}, 2))).operation;
  REQUIRE(bravo.log.reaches(1));
  CHECK(code_of(s.a.ops->retry(op, pname("bravo"), pname("bravo"))) == errc::forbidden);
  CHECK(code_of(s.a.ops->retry(op, pname("mallory"), pname("bravo"))) == errc::not_found);
  CHECK(code_of(s.a.ops->retry(op, pname("boss"), pname("zulu"))) == errc::not_found);
  CHECK(must(s.a.ops->retry(op, pname("boss"), pname("bravo"))) == 2);
  REQUIRE(bravo.log.reaches(2));
  auto again = bravo.log.at(1);
  CHECK(again.env.operation->attempt == 2);
  CHECK(again.env.operation->branch == "bravo");
  CHECK(again.env.body == bravo.log.at(0).env.body);
  CHECK(again.seq != bravo.log.at(0).seq);
  auto r = must(s.a.ops->get(op));
  CHECK(r.branches.at("bravo").attempt == 2);
  CHECK(r.branches.at("bravo").seq == again.seq);

  CHECK(code_of(s.a.ops->reply(op, pname("bravo"), 1, true, "")) == errc::conflict);
  must(s.a.ops->reply(op, pname("bravo"), 2, true, ""));
  CHECK(code_of(s.a.ops->retry(op, pname("boss"), pname("bravo"))) == errc::conflict);
  must(s.a.ops->reply(op, pname("alfa"), 1, true, ""));
  CHECK(code_of(s.a.ops->retry(op, pname("boss"), pname("alfa"))) == errc::conflict);
}

TEST_CASE("a retry withdraws the old attempt's message unless it was acknowledged",
          "[operations]") {
  setup s([](broker_config& c) { c.inbox_ack_wait = std::chrono::seconds(2); });
  auto op = must(s.a.ops->start(s.gather({"alfa", "bravo"}, 2))).operation;
  {
    // alfa took its branch and acknowledged it; bravo's is in flight, not acknowledged.
    reader alfa(*s.a.box, "alfa");
    REQUIRE(alfa.log.reaches(1));
    must(alfa.r->ack(alfa.log.at(0).seq));
  }
  auto bravo = std::make_unique<reader>(*s.a.box, "bravo");
  REQUIRE(bravo->log.reaches(1));
  const auto first = bravo->log.at(0).seq;
  CHECK(must(s.a.ops->retry(op, pname("boss"), pname("bravo"))) == 2);
  CHECK(must(s.a.ops->retry(op, pname("boss"), pname("alfa"))) == 2);
  REQUIRE(bravo->log.reaches(2));
  CHECK(bravo->log.at(1).env.operation->attempt == 2);
  must(bravo->r->ack(bravo->log.at(1).seq));
  CHECK(code_of(s.fx->shared_transport()->get_message(subjects::inbox_stream(s.cfg.ns), first)) ==
        errc::not_found);

  // Past the ack wait, nothing of attempt 1 comes back: bravo's was withdrawn, alfa's acked.
  bravo.reset();
  s.fx->advance(s.cfg.inbox_ack_wait + std::chrono::seconds(1));
  reader bravo_again(*s.a.box, "bravo");
  reader alfa_again(*s.a.box, "alfa");
  REQUIRE(alfa_again.log.reaches(1));
  s.fx->advance(std::chrono::seconds(1));
  CHECK(alfa_again.log.size() == 1);
  CHECK(alfa_again.log.at(0).env.operation->attempt == 2);
  CHECK(bravo_again.log.size() == 0);
}

TEST_CASE("a cancel withdraws what was not acknowledged and tells stopped, unknown and done apart",
          "[operations]") {
  setup s([](broker_config& c) { c.inbox_ack_wait = std::chrono::seconds(2); });
  reader boss(*s.a.box, "boss");
  auto op = must(s.a.ops->start(s.gather({"alfa", "bravo", "charlie", "delta"}, 4))).operation;
  must(s.a.ops->reply(op, pname("alfa"), 1, true, ""));
  {
    // charlie took its branch and acknowledged it.
    reader charlie(*s.a.box, "charlie");
    REQUIRE(charlie.log.reaches(1));
    must(charlie.r->ack(charlie.log.at(0).seq));
    bool changed = false;
    std::atomic<bool> ran{false};
    s.a.ops->async_delivered(op, pname("charlie"), 1, [&](bool c) {
      changed = c;
      ran = true;
    });
    REQUIRE(eventually([&] { return ran.load(); }));
    CHECK(changed);
  }
  CHECK(must(s.a.ops->get(op)).branches.at("charlie").state == branch_state::delivered);
  // delta has its branch in flight, not acknowledged.
  auto delta = std::make_unique<reader>(*s.a.box, "delta");
  REQUIRE(delta->log.reaches(1));

  CHECK(code_of(s.a.ops->cancel(op, {.who = pname("bravo")})) == errc::forbidden);
  CHECK(code_of(s.a.ops->cancel(op, {.who = pname("mallory")})) == errc::not_found);
  auto outcome = must(s.a.ops->cancel(op, {.who = pname("boss")}));
  CHECK(outcome.at("alfa") == cancel_outcome::already_completed);
  CHECK(outcome.at("bravo") == cancel_outcome::stopped);
  CHECK(outcome.at("charlie") == cancel_outcome::unknown);
  CHECK(outcome.at("delta") == cancel_outcome::stopped);
  CHECK(code_of(s.a.ops->cancel(op, {.who = pname("boss")})) == errc::conflict);
  CHECK(code_of(s.a.ops->reply(op, pname("bravo"), 1, true, "")) == errc::conflict);

  REQUIRE(s.a.cancels.reaches(1));
  CHECK(s.a.cancels.at(0).first == op.str());
  CHECK(s.a.cancels.at(0).second == std::vector<std::string>{"bravo", "charlie", "delta"});
  REQUIRE(boss.log.reaches(1));
  CHECK(boss.log.at(0).env.type == "amp.operation.cancelled");
  auto r = must(s.a.ops->get(op));
  CHECK(r.state == operation_state::cancelled);
  CHECK(r.branches.at("bravo").state == branch_state::stopped);

  // Withdrawn: bravo, never attached, and delta, attached again, get nothing more.
  delta.reset();
  s.fx->advance(s.cfg.inbox_ack_wait + std::chrono::seconds(1));
  reader bravo(*s.a.box, "bravo");
  reader delta_again(*s.a.box, "delta");
  s.fx->advance(std::chrono::seconds(1));
  CHECK(bravo.log.size() == 0);
  CHECK(delta_again.log.size() == 0);
}

TEST_CASE("the same idempotency key from the same initiator returns the same operation",
          "[operations]") {
  setup s;
  reader alfa(*s.a.box, "alfa");
  auto start = s.gather({"alfa"}, 1);
  start.idempotency_key = "review-42";
  auto first = must(s.a.ops->start(start));
  auto again = must(s.a.ops->start(start));
  CHECK(first.created);
  CHECK_FALSE(again.created);
  CHECK(again.operation == first.operation);
  CHECK(again.members == std::vector<std::string>{"alfa"});
  start.initiator = pname("other");
  auto others = must(s.a.ops->start(start));
  CHECK(others.created);
  CHECK(others.operation != first.operation);
  REQUIRE(alfa.log.reaches(2));
  s.fx->advance(std::chrono::seconds(1));
  CHECK(alfa.log.size() == 2);  // one branch per operation, not per start
}

TEST_CASE("a start with bad input is refused and leaves nothing behind", "[operations]") {
  setup s;
  auto ok = s.gather({"alfa", "bravo"}, 1);
  auto refused = [&](operation_start in) { return code_of(s.a.ops->start(std::move(in))); };
  auto with = [&](auto change) {
    auto in = ok;
    change(in);
    return in;
  };
  CHECK(refused(with([](auto& in) { in.members.clear(); })) == errc::bad_request);
  CHECK(refused(with([](auto& in) { in.quorum = 3; })) == errc::bad_request);
  CHECK(refused(with([](auto& in) { in.quorum = -1; })) == errc::bad_request);
  CHECK(refused(with([](auto& in) { in.timeout = {}; })) == errc::bad_request);
  CHECK(refused(with([](auto& in) { in.timeout = std::chrono::milliseconds(99); })) ==
        errc::bad_request);
  CHECK(refused(with([](auto& in) { in.timeout = std::chrono::hours(25); })) == errc::bad_request);
  CHECK(refused(with([](auto& in) { in.body = "{\"a\":"; })) == errc::bad_request);
  CHECK(refused(with([](auto& in) { in.bodies = {{"zulu", "1"}}; })) == errc::bad_request);
  CHECK(refused(with([](auto& in) { in.bodies = {{"alfa", "[1,"}}; })) == errc::bad_request);
  CHECK(refused(with([](auto& in) { in.type = std::string(300, 'x'); })) == errc::invalid_envelope);
  CHECK(refused(with([](auto& in) { in.idempotency_key = std::string(257, 'k'); })) ==
        errc::bad_request);
  std::vector<participant_name> many;
  for (int i = 0; i <= 1000; ++i) many.push_back(pname("m" + std::to_string(i)));
  CHECK(refused(with([&](auto& in) { in.members = many; })) == errc::bad_request);

  auto& t = s.fx->transport();
  CHECK(must(t.stream_info_of(subjects::operations_stream(s.cfg.ns))).state.messages == 0);
  auto inbox = t.stream_info_of(subjects::inbox_stream(s.cfg.ns));
  CHECK(must(std::move(inbox)).state.messages == 0);
}

TEST_CASE("the record shows the whole operation to its initiator and a branch to a member",
          "[operations]") {
  setup s;
  auto op = must(s.a.ops->start(s.gather({"alfa", "bravo"}, 1))).operation;
  auto whole = must(s.a.ops->view(op, {.who = pname("boss")}));
  CHECK(whole.find(R"("alfa":{)") != std::string::npos);
  CHECK(whole.find(R"("bravo":{)") != std::string::npos);
  CHECK(must(s.a.ops->view(op, {.who = pname("root"), .admin = true})) == whole);
  auto own = must(s.a.ops->view(op, {.who = pname("bravo")}));
  CHECK(own.find(R"("alfa":{)") == std::string::npos);
  CHECK(own.find(R"("bravo":{"attempt":1,"state":"pending","reply":null})") != std::string::npos);
  CHECK(code_of(s.a.ops->view(op, {.who = pname("mallory")})) == errc::not_found);
  CHECK(code_of(s.a.ops->view(s.a.ops->new_id(), {.who = pname("boss")})) == errc::not_found);
}

TEST_CASE("branches a broker failed to send are sent by the deadlines loop", "[operations][time]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  auto t = std::make_shared<faulty_transport>(fx->shared_transport());
  node a(t, cfg);
  reader boss(*a.box, "boss"), alfa(*a.box, "alfa");
  const auto inbox_subject = subjects::inbox_subject(cfg.ns, pname("alfa"));
  std::atomic<bool> down{true};
  t->set_fault([&](std::string_view op, std::string_view what) -> std::optional<error> {
    if (down && op == "publish" && what == inbox_subject) {
      return error(errc::unavailable, "inbox away");
    }
    return std::nullopt;
  });
  auto started = must(
      a.ops->start({.initiator = pname("boss"), .members = names({"alfa", "bravo"}), .body = "1"}));
  auto r = must(a.ops->get(started.operation));
  CHECK(r.state == operation_state::open);
  CHECK(r.branches.at("alfa").seq == 0);
  CHECK(r.branches.at("bravo").seq != 0);
  down = false;
  fx->advance(std::chrono::seconds(6));
  REQUIRE(alfa.log.reaches(1));
  CHECK(alfa.log.at(0).env.operation->branch == "alfa");
  REQUIRE(eventually(
      [&] { return must(a.ops->get(started.operation)).state == operation_state::completed; }));
  REQUIRE(boss.log.reaches(1));
  CHECK(boss.log.at(0).env.type == "amp.operation.completed");
}

TEST_CASE("another broker decides an operation whose broker is gone, and takes its replies",
          "[operations][time]") {
  setup s;
  node b(s.fx->shared_transport(), s.cfg);
  reader boss(*b.box, "boss");
  auto started =
      must(s.a.ops->start(s.gather({"alfa", "bravo", "charlie"}, 2, timeout_rule::partial)));
  must(b.ops->reply(started.operation, pname("alfa"), 1, true, R"("from b")"));
  s.a.ops.reset();  // the starting broker's operations stop
  s.fx->advance(s.timeout + std::chrono::milliseconds(200));
  REQUIRE(boss.log.reaches(1));
  CHECK(boss.log.at(0).env.type == "amp.operation.partial");
  s.fx->advance(std::chrono::seconds(1));
  CHECK(boss.log.size() == 1);
}

TEST_CASE("a cancel through one broker is told to the members through every broker",
          "[operations]") {
  setup s;
  node b(s.fx->shared_transport(), s.cfg);
  auto op = must(s.a.ops->start(s.gather({"alfa", "bravo"}, 2))).operation;
  must(b.ops->cancel(op, {.who = pname("root"), .admin = true}));
  REQUIRE(s.a.cancels.reaches(1));
  REQUIRE(b.cancels.reaches(1));
  CHECK(s.a.cancels.at(0).second == std::vector<std::string>{"alfa", "bravo"});
  CHECK(b.cancels.at(0).first == op.str());
}

TEST_CASE("ended operations are swept with their idempotency binding", "[operations][time]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.task_retention = fx->real_time() ? std::chrono::seconds(2) : std::chrono::hours(24);
  node a(fx->shared_transport(), cfg);
  auto start = operation_start{
      .initiator = pname("boss"), .members = names({"alfa"}), .idempotency_key = "once"};
  auto first = must(a.ops->start(start));
  REQUIRE(must(a.ops->get(first.operation)).state == operation_state::completed);
  fx->advance(cfg.task_retention + std::chrono::seconds(2));
  REQUIRE(eventually([&] { return code_of(a.ops->get(first.operation)) == errc::not_found; }));
  auto again = must(a.ops->start(start));
  CHECK(again.created);
  CHECK(again.operation != first.operation);
}

// Members reply, retry and a cancel races the deadline, on two brokers; whatever the
// interleaving: one decision, votes only from distinct branches at their current attempt,
// one notice.
TEST_CASE("a randomized run keeps the invariants of operations", "[operations][random]") {
  setup s;
  node b(s.fx->shared_transport(), s.cfg);
  reader boss(*s.a.box, "boss");
  std::mt19937 rng(20261206);
  const int rounds = s.fx->real_time() ? 6 : 40;
  std::vector<operation_id> ops;
  std::map<std::string, std::map<std::string, int>> attempts;   // op → member → attempt
  std::map<std::string, std::map<std::string, bool>> accepted;  // op → member → first accept
  std::map<std::string, int> quorum;
  for (int i = 0; i < rounds; ++i) {
    int n = 1 + static_cast<int>(rng() % 5);
    std::vector<std::string> members;
    for (int m = 0; m < n; ++m) members.push_back("m" + std::to_string(m));
    operation_start start{.initiator = pname("boss"), .members = {}, .body = "1"};
    for (const auto& m : members) start.members.push_back(pname(m));
    start.quorum = 1 + static_cast<int>(rng() % n);
    start.timeout = s.timeout;
    start.on_timeout = rng() % 2 ? timeout_rule::partial : timeout_rule::failed;
    auto op = must(s.a.ops->start(start)).operation;
    ops.push_back(op);
    quorum[op.str()] = start.quorum;
    for (const auto& m : members) attempts[op.str()][m] = 1;
    for (int step = 0; step < 8; ++step) {
      auto& via = rng() % 2 ? *s.a.ops : *b.ops;
      const auto& member = members[rng() % members.size()];
      switch (rng() % 5) {
        case 0:
        case 1: {
          // A reply, at the current attempt or (1 in 4) a stale one.
          int at = attempts[op.str()][member];
          bool stale = at > 1 && rng() % 4 == 0;
          bool yes = rng() % 3 != 0;
          auto r = via.reply(op, pname(member), stale ? at - 1 : at, yes, "");
          if (stale) CHECK(code_of(r) == errc::conflict);
          if (r && !r->duplicate) accepted[op.str()].emplace(member, yes);
          break;
        }
        case 2: {
          auto r = via.retry(op, pname("boss"), pname(member));
          if (r) attempts[op.str()][member] = *r;
          break;
        }
        case 3: (void)via.cancel(op, {.who = pname("boss")}); break;
        default: s.fx->advance(s.timeout / 4); break;
      }
    }
  }
  s.fx->advance(s.timeout + std::chrono::milliseconds(300));
  REQUIRE(boss.log.reaches(ops.size(), std::chrono::seconds(20)));
  s.fx->advance(std::chrono::milliseconds(500));
  std::map<std::string, int> notices;
  std::set<std::uint64_t> seen;  // a notice not acked in time is delivered again
  for (const auto& m : boss.log.all()) {
    if (!seen.insert(m.seq).second) continue;
    auto at = m.env.body.find("\"operation\":\"");
    REQUIRE(at != std::string::npos);
    ++notices[m.env.body.substr(at + 13, m.env.body.find('"', at + 13) - at - 13)];
  }
  for (const auto& op : ops) {
    INFO(op.str());
    CHECK(notices[op.str()] == 1);
    auto r = must(s.a.ops->get(op));
    CHECK(is_closed(r.state));
    // The replies recorded are exactly the first accepted reply of each branch.
    std::map<std::string, bool> recorded;
    for (const auto& [member, br] : r.branches) {
      if (br.reply) recorded[member] = br.reply->accept;
      CHECK(br.attempt == attempts[op.str()][member]);
    }
    CHECK(recorded == accepted[op.str()]);
    const int yes = amp::accepted(r);
    if (r.state == operation_state::completed) CHECK(yes >= quorum[op.str()]);
    if (r.state == operation_state::partial) CHECK((yes > 0 && yes < quorum[op.str()]));
    if (r.state != operation_state::completed) CHECK(yes < quorum[op.str()]);
  }
}

}  // namespace
}  // namespace amp::broker_testing
