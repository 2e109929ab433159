// The broker facade: the primitives of one namespace wired together. A task that ends
// tells its submitter through the inbox, from `$broker` (spec §7).

#include <map>
#include <mutex>
#include <vector>

#include "amp/broker/broker.hpp"
#include "broker/cases/broker_helpers.hpp"

namespace amp::broker_testing {
namespace {

using inbox_log = callback_log<inbox_message>;

TEST_CASE("a task's end reaches its submitter's inbox from $broker", "[broker]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.default_job.lease = fx->real_time() ? std::chrono::seconds(2) : std::chrono::seconds(30);
  auto b = must(broker::open(fx->shared_transport(), cfg));
  auto alice = pname("alice");
  auto w1 = pname("w1");
  auto job = jname("resize");
  inbox_log log;
  auto reader = must(b->inbox().attach(alice, log.callback()));

  auto done = must(b->jobs().submit({.job = job, .from = alice, .body = "1"})).task;
  auto failed = must(b->jobs().submit({.job = job, .from = alice, .body = "2"})).task;
  auto cancelled = must(b->jobs().submit({.job = job, .from = alice, .body = "3"})).task;
  auto wait = fx->real_time() ? std::chrono::seconds(1) : duration::zero();
  std::vector<offer> offers;
  for (int i = 0; i < 10 && offers.size() < 3; ++i) {
    auto more = must(b->jobs().fetch(job, 3 - offers.size(), wait));
    offers.insert(offers.end(), more.begin(), more.end());
  }
  REQUIRE(offers.size() == 3);
  for (const auto& o : offers) {
    if (o.task.task == cancelled.str()) continue;
    must(b->jobs().claim(o, w1));
  }
  must(b->jobs().complete(done, w1, R"({"size":[64,64]})"));
  must(b->jobs().fail(failed, w1, {"bad_image", "cannot decode"}, false, {}));
  must(b->jobs().cancel(cancelled, viewer{.who = alice}));

  REQUIRE(eventually([&] { return log.size() >= 3; }));
  auto got = log.all();
  REQUIRE(got.size() == 3);
  std::map<std::string, std::string> bodies;
  for (const auto& m : got) {
    CHECK(m.env.from == "$broker");
    CHECK(m.env.to == "alice");
    CHECK(m.env.ns == cfg.ns.str());
    bodies[m.env.type] = m.env.body;
    must(reader->ack(m.seq));
  }
  CHECK(bodies["amp.task.completed"] == R"({"task":")" + done.str() +
                                            R"(","job":"resize","state":"completed","attempt":1,)"
                                            R"("result":{"size":[64,64]}})");
  CHECK(bodies["amp.task.failed"] ==
        R"({"task":")" + failed.str() +
            R"(","job":"resize","state":"failed","attempt":1,)"
            R"("error":{"code":"bad_image","message":"cannot decode"}})");
  CHECK(bodies["amp.task.cancelled"] ==
        R"({"task":")" + cancelled.str() +
            R"(","job":"resize","state":"cancelled","attempt":0,)"
            R"("error":{"code":"cancelled","message":"cancelled by alice"}})");
}

TEST_CASE("two brokers on one namespace share its tasks and messages", "[broker]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  auto a = must(broker::open(fx->shared_transport(), cfg));
  auto b = must(broker::open(fx->shared_transport(), cfg));
  auto alice = pname("alice");
  auto job = jname("resize");
  auto id = must(a->jobs().submit({.job = job, .from = alice, .body = "1"})).task;
  auto wait = fx->real_time() ? std::chrono::seconds(1) : duration::zero();
  auto offers = must(b->jobs().fetch(job, 1, wait));
  REQUIRE(offers.size() == 1);
  CHECK(offers[0].task.task == id.str());
  must(b->jobs().claim(offers[0], pname("w1")));
  // The other broker finishes it: the record carries what it needs.
  must(a->jobs().complete(id, pname("w1"), "true"));
  CHECK(must(b->tasks().get(cfg.ns, id)).state == task_state::completed);
  CHECK(must(b->jobs().fetch(job, 1, {})).empty());
}

}  // namespace
}  // namespace amp::broker_testing
