// The presence registry (spec §4) on every transport: registration, heartbeats, expiry
// (per-key TTL where the backend has it, the sweeper otherwise or when forced), leave,
// who/eligible and watch.

#include "amp/broker/registry.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <future>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "amp/subjects.hpp"
#include "amp/timestamp.hpp"
#include "broker/cases/broker_helpers.hpp"
#include "broker/cases/faulty_transport.hpp"

namespace amp::broker_testing {
namespace {

using namespace std::chrono_literals;

// Collects the events of a watch; they arrive on the transport's thread.
class recorder : public callback_log<presence_event> {
 public:
  // Registers a marker participant and waits for its `up`: every event caused before is
  // then in (a watch delivers in order), so the list can be checked for what must not be
  // there. Returns the events but the marker's.
  std::vector<presence_event> settled(registry& reg) {
    auto marker = pname("zz-marker");
    auto markers = [&] {
      std::lock_guard lock(mu_);
      return std::count_if(items_.begin(), items_.end(),
                           [&](const presence_event& e) { return e.participant == marker; });
    };
    auto before = markers();
    must(reg.register_participant(marker, {}, 1, "{}"));
    REQUIRE(eventually([&] { return markers() > before; }));
    auto all = this->all();
    // What came after the marker was caused later.
    auto last = std::find_if(all.rbegin(), all.rend(),
                             [&](const presence_event& e) { return e.participant == marker; });
    all.erase(last.base(), all.end());
    std::erase_if(all, [&](const presence_event& e) { return e.participant == marker; });
    return all;
  }
};

std::vector<std::string> names_of(const std::vector<registry_entry>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.participant.str());
  return out;
}

bool is_event(const presence_event& e, std::string_view who, presence_state s, presence_reason r) {
  return e.participant.view() == who && e.state == s && e.reason == r;
}

// The KV operations of one key that reach the backend through a faulty_transport, by
// name ("kv_get", "kv_update", ...), in order.
class kv_op_log {
 public:
  static std::shared_ptr<kv_op_log> on(faulty_transport& t, std::string key) {
    auto log = std::make_shared<kv_op_log>();
    t.set_fault([log, key = std::move(key)](std::string_view op,
                                            std::string_view what) -> std::optional<error> {
      if (what == key && op.starts_with("kv_")) {
        std::lock_guard lock(log->mu_);
        log->ops_.emplace_back(op);
      }
      return std::nullopt;
    });
    return log;
  }

  // What was logged since the last call.
  std::vector<std::string> take() {
    std::lock_guard lock(mu_);
    return std::exchange(ops_, {});
  }

 private:
  std::mutex mu_;
  std::vector<std::string> ops_;
};

using ops = std::vector<std::string>;

// A faulty_transport over the fixture's, logging the KV operations on the registry key of
// participant `name`.
struct logged_key {
  logged_key(conformance::fixture& fx, const broker_config& cfg, std::string_view name)
      : t(std::make_shared<faulty_transport>(fx.shared_transport())),
        w(pname(name)),
        bucket(subjects::registry_bucket(cfg.ns)),
        key(subjects::registry_key(w)),
        log(kv_op_log::on(*t, key)) {}

  std::shared_ptr<faulty_transport> t;
  participant_name w;
  std::string bucket;
  std::string key;
  std::shared_ptr<kv_op_log> log;
};

// `async_heartbeat`, waited for; fails the test when `done` is not called exactly once.
result<registry_entry> async_heartbeat(registry& reg, const participant_name& p,
                                       std::optional<int> load = std::nullopt) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto got = std::make_shared<std::promise<result<registry_entry>>>();
  auto answer = got->get_future();
  reg.async_heartbeat(p, load, [calls, got](result<registry_entry> r) {
    if (calls->fetch_add(1) == 0) got->set_value(std::move(r));
  });
  REQUIRE(answer.wait_for(10s) == std::future_status::ready);
  auto r = answer.get();
  CHECK(calls->load() == 1);
  return r;
}

constexpr auto up = presence_state::up;
constexpr auto down = presence_state::down;
constexpr auto registered = presence_reason::registered;
constexpr auto expired = presence_reason::expired;
constexpr auto left = presence_reason::left;

}  // namespace

TEST_CASE("registry: registering again replaces the entry and watchers see it up each time",
          "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  auto reg = must(registry::open(fx->shared_transport(), cfg));
  recorder rec;
  std::vector<registry_entry> initial{registry_entry{.participant = pname("x")}};
  auto watch = must(reg->watch(rec.callback(), &initial));
  CHECK(initial.empty());

  auto first = must(reg->register_participant(pname("w1"), {jname("resize"), jname("resize")}, 4,
                                              R"( {"gpu": true, "zone": "eu"} )"));
  CHECK(names_of({first}) == std::vector<std::string>{"w1"});
  CHECK(first.jobs == std::vector{jname("resize")});
  CHECK(first.slots == 4);
  CHECK(first.load == 0);
  CHECK(first.meta == R"({"gpu":true,"zone":"eu"})");
  CHECK(first.expires_at - first.updated_at == cfg.registry_ttl);
  CHECK(to_json(first) == R"({"participant":"w1","jobs":["resize"],"slots":4,"load":0,)"
                          R"("meta":{"gpu":true,"zone":"eu"},"updated_at":")" +
                              format_timestamp(first.updated_at) + R"(","expires_at":")" +
                              format_timestamp(first.expires_at) + R"("})");
  REQUIRE(rec.reaches(1));
  auto ev = rec.all();
  CHECK(is_event(ev[0], "w1", up, registered));
  CHECK(ev[0].entry == first);

  auto second =
      must(reg->register_participant(pname("w1"), {jname("thumb"), jname("resize")}, 2, "{}", 1));
  REQUIRE(rec.reaches(2));
  ev = rec.all();
  CHECK(is_event(ev[1], "w1", up, registered));
  CHECK(ev[1].entry == second);
  CHECK(second.jobs == std::vector{jname("thumb"), jname("resize")});
  CHECK(second.load == 1);

  CHECK(must(reg->live()) == std::vector{second});
  CHECK(must(reg->get(pname("w1"))) == second);
  CHECK(must(reg->get(pname("nobody"))) == std::nullopt);

  // A watch that starts now lists the entry and gets no event for it.
  recorder late;
  std::vector<registry_entry> now;
  auto watch2 = must(reg->watch(late.callback(), &now));
  CHECK(now == std::vector{second});
  CHECK(late.settled(*reg).empty());
  CHECK(rec.settled(*reg).size() == 2);
}

TEST_CASE("registry: heartbeats keep an entry alive past the ttl and are not events",
          "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.registry_ttl = fx->real_time() ? 2s : 30s;
  auto reg = must(registry::open(fx->shared_transport(), cfg));
  recorder rec;
  auto watch = must(reg->watch(rec.callback()));
  auto entry = must(reg->register_participant(pname("w1"), {jname("resize")}, 4, "{}"));

  fx->advance(cfg.registry_ttl / 2);
  auto refreshed = must(reg->heartbeat(pname("w1"), 3));
  CHECK(refreshed.load == 3);
  CHECK(refreshed.updated_at > entry.updated_at);
  CHECK(refreshed.expires_at - refreshed.updated_at == cfg.registry_ttl);
  CHECK(refreshed.slots == 4);
  CHECK(refreshed.jobs == entry.jobs);

  fx->advance(cfg.registry_ttl / 2);  // past the first expires_at
  auto again = must(reg->heartbeat(pname("w1")));
  CHECK(again.load == 3);  // kept when not given
  CHECK(again.expires_at > entry.expires_at);

  fx->advance(cfg.registry_ttl / 2);
  auto now = must(reg->live());
  REQUIRE(now.size() == 1);
  CHECK(now[0] == again);
  CHECK(must(reg->get(pname("w1"))) == again);

  auto ev = rec.settled(*reg);
  REQUIRE(ev.size() == 1);
  CHECK(is_event(ev[0], "w1", up, registered));
}

TEST_CASE("registry: an entry not refreshed expires once and leaves who and eligible",
          "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.registry_ttl = fx->real_time() ? 2s : 30s;
  auto reg = must(registry::open(fx->shared_transport(), cfg));
  recorder rec;
  auto watch = must(reg->watch(rec.callback()));
  auto w1 = must(reg->register_participant(pname("w1"), {jname("resize")}, 1, R"({"a":1})"));
  must(reg->register_participant(pname("w2"), {jname("resize")}, 1, "{}"));

  fx->advance(cfg.registry_ttl / 2);
  must(reg->heartbeat(pname("w2")));
  fx->advance(cfg.registry_ttl / 2);

  REQUIRE(rec.reaches(3));
  auto ev = rec.all();
  CHECK(is_event(ev[2], "w1", down, expired));
  CHECK(ev[2].entry == w1);
  CHECK(names_of(must(reg->live())) == std::vector<std::string>{"w2"});
  CHECK(names_of(must(reg->eligible(jname("resize")))) == std::vector<std::string>{"w2"});
  CHECK(must(reg->get(pname("w1"))) == std::nullopt);

  auto hb = reg->heartbeat(pname("w1"));
  CHECK(code_of(hb) == errc::not_found);
  CHECK_THAT(text_of(hb), Catch::Contains("expired"));

  // Registering again brings it back.
  must(reg->register_participant(pname("w1"), {jname("resize")}, 1, "{}"));
  ev = rec.settled(*reg);
  REQUIRE(ev.size() == 4);
  CHECK(is_event(ev[0], "w1", up, registered));
  CHECK(is_event(ev[1], "w2", up, registered));
  CHECK(is_event(ev[2], "w1", down, expired));
  CHECK(is_event(ev[3], "w1", up, registered));
  CHECK(names_of(must(reg->live())) == std::vector<std::string>{"w1", "w2", "zz-marker"});
}

TEST_CASE("registry: leave takes the participant down at once, and only once", "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.registry_ttl = fx->real_time() ? 1s : 30s;
  auto reg = must(registry::open(fx->shared_transport(), cfg));
  recorder rec;
  auto watch = must(reg->watch(rec.callback()));
  auto w1 = must(reg->register_participant(pname("w1"), {jname("resize")}, 2, "{}"));

  must(reg->leave(pname("w1")));
  REQUIRE(rec.reaches(2));
  auto ev = rec.all();
  CHECK(is_event(ev[1], "w1", down, left));
  CHECK(ev[1].entry == w1);
  CHECK(must(reg->live()).empty());
  CHECK(must(reg->get(pname("w1"))) == std::nullopt);
  auto hb = reg->heartbeat(pname("w1"));
  CHECK(code_of(hb) == errc::not_found);
  CHECK_THAT(text_of(hb), Catch::Contains("left"));

  // Leaving again, or without ever registering, changes nothing; nor does the ttl running
  // out afterwards.
  must(reg->leave(pname("w1")));
  must(reg->leave(pname("never")));
  fx->advance(cfg.registry_ttl * 2);
  ev = rec.settled(*reg);
  REQUIRE(ev.size() == 2);

  must(reg->register_participant(pname("w1"), {}, 1, "{}"));
  REQUIRE(rec.reaches(4));
  CHECK(is_event(rec.all()[3], "w1", up, registered));
}

TEST_CASE("registry: eligible lists the least loaded first and skips full and zero-slot ones",
          "[registry]") {
  auto fx = make_fixture();
  auto reg = must(registry::open(fx->shared_transport(), config_for(*fx)));
  auto resize = jname("resize");
  must(reg->register_participant(pname("a"), {resize}, 4, "{}", 2));               // 1/2
  must(reg->register_participant(pname("b"), {jname("thumb"), resize}, 2, "{}"));  // 0
  must(reg->register_participant(pname("c"), {resize}, 0, "{}"));                  // no offers
  must(reg->register_participant(pname("d"), {resize}, 1, "{}", 1));               // full
  must(reg->register_participant(pname("e"), {resize}, 2, "{}", 1));               // 1/2
  must(reg->register_participant(pname("f"), {jname("thumb")}, 8, "{}"));          // other job
  must(reg->register_participant(pname("g"), {resize}, 3, "{}", 1));               // 1/3
  must(reg->register_participant(pname("h"), {resize}, 1, "{}", 5));               // over full

  CHECK(names_of(must(reg->eligible(resize))) == std::vector<std::string>{"b", "g", "a", "e"});
  CHECK(names_of(must(reg->eligible(jname("thumb")))) == std::vector<std::string>{"b", "f"});
  CHECK(must(reg->eligible(jname("nothing"))).empty());

  // Load reported with a heartbeat moves a participant.
  must(reg->heartbeat(pname("b"), 2));
  must(reg->heartbeat(pname("a"), 0));
  CHECK(names_of(must(reg->eligible(resize))) == std::vector<std::string>{"a", "g", "e"});
}

TEST_CASE("registry: the load is the sum of what each gateway's registry last said", "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  auto one = must(registry::open(fx->shared_transport(), cfg));
  auto two = must(registry::open(fx->shared_transport(), cfg));  // another gateway's
  auto w = pname("w");
  CHECK(must(one->register_participant(w, {jname("resize")}, 8, "{}", 2)).load == 2);
  CHECK(must(two->heartbeat(w, 3)).load == 5);  // its sessions on both gateways hold leases
  CHECK(must(one->heartbeat(w, 1)).load == 4);
  CHECK(must(two->heartbeat(w)).load == 4);  // no load said: unchanged
  auto seen = must(one->live(jname("resize")));
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].load == 4);
  CHECK(must(two->heartbeat(w, 0)).load == 1);
  // Registering again starts over with what the registering gateway holds.
  CHECK(must(two->register_participant(w, {jname("resize")}, 8, "{}", 6)).load == 6);
  CHECK(must(one->heartbeat(w, 1)).load == 7);
}

TEST_CASE("registry: who lists live entries, filtered by job", "[registry]") {
  auto fx = make_fixture();
  auto reg = must(registry::open(fx->shared_transport(), config_for(*fx)));
  CHECK(must(reg->live()).empty());
  must(reg->register_participant(pname("c"), {}, 1, "{}"));
  must(reg->register_participant(pname("a"), {jname("resize"), jname("thumb")}, 1, "{}"));
  must(reg->register_participant(pname("b"), {jname("thumb")}, 0, "{}"));

  CHECK(names_of(must(reg->live())) == std::vector<std::string>{"a", "b", "c"});
  CHECK(names_of(must(reg->live(jname("resize")))) == std::vector<std::string>{"a"});
  CHECK(names_of(must(reg->live(jname("thumb")))) == std::vector<std::string>{"a", "b"});
  CHECK(must(reg->live(jname("other"))).empty());
}

TEST_CASE("registry: bad slots, load or meta are refused and change nothing", "[registry]") {
  auto fx = make_fixture();
  auto reg = must(registry::open(fx->shared_transport(), config_for(*fx)));
  recorder rec;
  auto watch = must(reg->watch(rec.callback()));
  auto w1 = must(reg->register_participant(pname("w1"), {jname("resize")}, 2, R"({"k":"v"})"));

  auto check_refused = [&](result<registry_entry> r, std::string_view says) {
    CHECK(code_of(r) == errc::bad_request);
    CHECK_THAT(text_of(r), Catch::Contains(std::string(says)));
  };
  check_refused(reg->register_participant(pname("w1"), {}, -1, "{}"), "slots must be 0..1024");
  check_refused(reg->register_participant(pname("w1"), {}, 1025, "{}"), "not 1025");
  check_refused(reg->register_participant(pname("w1"), {}, 1, "{}", -1), "load");
  check_refused(reg->register_participant(pname("w1"), {}, 1, "[1]"), "not an array");
  check_refused(reg->register_participant(pname("w1"), {}, 1, R"("text")"), "not a string");
  check_refused(reg->register_participant(pname("w1"), {}, 1, "null"), "not null");
  check_refused(reg->register_participant(pname("w1"), {}, 1, R"({"a":)"), "not valid JSON");
  check_refused(reg->register_participant(pname("w1"), {}, 1, ""), "not valid JSON");
  check_refused(reg->register_participant(pname("w1"), {}, 1, "{} {}"), "not valid JSON");
  check_refused(reg->register_participant(pname("w2"), {}, 1, "[]"), "object");
  check_refused(reg->heartbeat(pname("w1"), -3), "load must not be negative");

  CHECK(must(reg->get(pname("w1"))) == w1);
  CHECK(must(reg->get(pname("w2"))) == std::nullopt);
  auto ev = rec.settled(*reg);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].entry == w1);

  // The limits themselves are fine.
  CHECK(must(reg->register_participant(pname("w3"), {}, 1024, "{}")).slots == 1024);
  CHECK(must(reg->register_participant(pname("w4"), {}, 0, "{}")).slots == 0);

  auto cfg = config_for(*fx);
  cfg.registry_ttl = 0s;
  CHECK(code_of(registry::open(fx->shared_transport(), cfg)) == errc::bad_request);
  cfg.registry_ttl = 13h;
  CHECK(code_of(registry::open(fx->shared_transport(), cfg)) == errc::bad_request);
}

TEST_CASE("registry: with two sweepers on one namespace every expiry is one down event",
          "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.registry_ttl = fx->real_time() ? 2s : 20s;
  auto watcher_cfg = cfg;
  cfg.registry_force_sweeper = true;
  auto a = must(registry::open(fx->shared_transport(), cfg));
  auto b = must(registry::open(fx->shared_transport(), cfg));
  auto c = must(registry::open(fx->shared_transport(), watcher_cfg));
  CHECK(a->uses_sweeper());
  CHECK(b->uses_sweeper());
  recorder rec;
  auto watch = must(c->watch(rec.callback()));

  must(a->register_participant(pname("w1"), {jname("resize")}, 1, "{}"));
  must(b->register_participant(pname("w2"), {jname("resize")}, 1, "{}"));
  must(a->register_participant(pname("w3"), {jname("resize")}, 1, "{}"));
  fx->advance(cfg.registry_ttl / 2);
  must(b->heartbeat(pname("w3")));
  fx->advance(cfg.registry_ttl / 2);  // w1 and w2 run out; w3 not yet
  REQUIRE(rec.reaches(5));
  CHECK(names_of(must(a->live())) == std::vector<std::string>{"w3"});
  CHECK(names_of(must(b->live())) == std::vector<std::string>{"w3"});
  CHECK(names_of(must(c->live())) == std::vector<std::string>{"w3"});

  fx->advance(cfg.registry_ttl);  // w3 runs out too
  REQUIRE(rec.reaches(6));
  fx->advance(cfg.registry_ttl);  // nothing more to record
  auto ev = rec.settled(*c);
  std::map<std::string, std::vector<std::string>> seen;
  for (const auto& e : ev) {
    seen[e.participant.str()].push_back(std::string(to_string(e.state)) + "/" +
                                        std::string(to_string(e.reason)));
  }
  std::vector<std::string> once{"up/registered", "down/expired"};
  CHECK(seen["w1"] == once);
  CHECK(seen["w2"] == once);
  CHECK(seen["w3"] == once);
  CHECK(must(c->live()).size() == 1);  // the marker
}

TEST_CASE("registry: an entry whose gateway is gone is not live and still expires once",
          "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.registry_ttl = fx->real_time() ? 1s : 20s;
  auto observer_cfg = cfg;
  cfg.registry_force_sweeper = true;
  auto observer = must(registry::open(fx->shared_transport(), observer_cfg));
  recorder rec;
  auto watch = must(observer->watch(rec.callback()));
  {
    auto gone = must(registry::open(fx->shared_transport(), cfg));
    must(gone->register_participant(pname("w1"), {jname("resize")}, 1, "{}"));
  }
  REQUIRE(rec.reaches(1));
  fx->advance(cfg.registry_ttl * 2);

  // Whether or not anything has recorded the expiry yet, nobody lists it.
  CHECK(must(observer->live()).empty());
  CHECK(must(observer->eligible(jname("resize"))).empty());
  CHECK(must(observer->get(pname("w1"))) == std::nullopt);
  std::vector<registry_entry> now;
  recorder late;
  auto watch2 = must(observer->watch(late.callback(), &now));
  CHECK(now.empty());
  CHECK(code_of(observer->heartbeat(pname("w1"))) == errc::not_found);

  auto ev = rec.settled(*observer);
  REQUIRE(ev.size() == 2);
  CHECK(is_event(ev[1], "w1", down, expired));
  CHECK(late.settled(*observer).empty());
}

TEST_CASE("registry: heartbeats racing the expiry never lose or repeat a down event",
          "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.registry_ttl = fx->real_time() ? 1s : 20s;
  cfg.registry_force_sweeper = true;
  auto a = must(registry::open(fx->shared_transport(), cfg));
  auto b = must(registry::open(fx->shared_transport(), cfg));
  auto observer = must(registry::open(fx->shared_transport(), cfg));
  recorder rec;
  auto watch = must(observer->watch(rec.callback()));
  must(a->register_participant(pname("w1"), {}, 1, "{}"));
  fx->advance(cfg.registry_ttl / 2);

  // Each round the clock reaches the entry's expiry while a heartbeat is under way: the
  // heartbeat either refreshes the entry in time or finds it expired (and the caller
  // registers again), depending on which comes first.
  const int rounds = fx->real_time() ? 4 : 60;
  int lost = 0;
  for (int i = 0; i < rounds; ++i) {
    std::latch start(2);
    result<registry_entry> hb = unexpected(errc::internal, "not run");
    auto& via = i % 2 ? *a : *b;
    std::thread beat([&] {
      start.arrive_and_wait();
      hb = via.heartbeat(pname("w1"));
    });
    std::thread tick([&] {
      start.arrive_and_wait();
      // A head start that differs from round to round, so that either side wins some.
      for (int spin = 0; spin < (i % 8) * 2; ++spin) std::this_thread::yield();
      fx->advance(cfg.registry_ttl / 2);
    });
    beat.join();
    tick.join();
    if (!hb) {
      REQUIRE(code_of(hb) == errc::not_found);
      ++lost;
      must(via.register_participant(pname("w1"), {}, 1, "{}"));
      fx->advance(cfg.registry_ttl / 2);
    }
  }
  fx->advance(cfg.registry_ttl * 2);
  REQUIRE(rec.reaches(static_cast<std::size_t>(2 * lost + 2)));
  auto ev = rec.settled(*observer);
  INFO("heartbeats that lost the race: " << lost << " of " << rounds);
  REQUIRE(ev.size() == static_cast<std::size_t>(2 * lost + 2));
  for (std::size_t i = 0; i < ev.size(); ++i) {
    if (i % 2 == 0) {
      CHECK(is_event(ev[i], "w1", up, registered));
    } else {
      CHECK(is_event(ev[i], "w1", down, expired));
    }
  }
}

TEST_CASE("registry: a heartbeat when nothing changed is one write", "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.registry_ttl = fx->real_time() ? 3s : 30s;
  cfg.registry_force_sweeper = GENERATE(false, true);
  logged_key k(*fx, cfg, "w1");
  auto& [t, w, bucket, key, log] = k;
  auto reg = must(registry::open(t, cfg));
  auto revision = [&] { return must(fx->transport().kv_get(k.bucket, k.key)).revision; };

  auto last = must(reg->register_participant(w, {jname("resize")}, 4, "{}", 1));
  auto registered_at = revision();
  for (int i = 1; i <= 3; ++i) {
    fx->advance(cfg.registry_ttl / 4);
    log->take();
    auto hb = must(reg->heartbeat(w, i == 2 ? std::optional(2) : std::nullopt));
    CHECK(log->take() == ops{"kv_update"});
    CHECK(revision() == registered_at + static_cast<std::uint64_t>(i));
    CHECK(hb.updated_at > last.updated_at);
    CHECK(hb.expires_at - hb.updated_at == cfg.registry_ttl);
    CHECK(hb.load == (i >= 2 ? 2 : 1));
    CHECK(hb.jobs == last.jobs);
    CHECK(hb.slots == 4);
    CHECK(must(reg->get(w)) == hb);
    last = hb;
  }
}

TEST_CASE("registry: a heartbeat after another gateway wrote the entry keeps both loads",
          "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.registry_force_sweeper = GENERATE(false, true);
  logged_key k(*fx, cfg, "w");
  auto& [t, w, bucket, key, log] = k;
  auto one = must(registry::open(t, cfg));
  auto two = must(registry::open(t, cfg));  // another gateway's

  must(one->register_participant(w, {jname("resize")}, 8, "{}", 2));
  CHECK(must(one->heartbeat(w)).load == 2);
  CHECK(must(two->heartbeat(w, 3)).load == 5);
  log->take();
  // What `one` wrote last is not the entry any more: without a watch of the bucket it
  // finds out by its write failing, and reads.
  auto hb = must(one->heartbeat(w, 1));
  CHECK(hb.load == 4);
  auto seen = log->take();
  if (one->uses_sweeper()) {
    CHECK((seen == ops{"kv_update"} || seen == ops{"kv_update", "kv_get", "kv_update"}));
  } else {
    CHECK(seen == ops{"kv_update", "kv_get", "kv_update"});
  }
  CHECK(must(two->get(w)) == hb);
  CHECK(must(two->heartbeat(w)).load == 4);
  CHECK(must(one->heartbeat(w)).load == 4);
  CHECK(must(two->heartbeat(w, 0)).load == 1);
  CHECK(must(one->heartbeat(w, 5)).load == 5);
  CHECK(must(one->get(w))->load == 5);
}

TEST_CASE(
    "registry: a heartbeat once the entry ran out by the clock is not_found and refreshes "
    "nothing",
    "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  // On memory the backend's TTL is whole seconds, rounded up: at 1.7 s the entry has run
  // out by the clock while the backend still holds it as it was written.
  cfg.registry_ttl = fx->real_time() ? 1s : 1500ms;
  cfg.registry_force_sweeper = GENERATE(false, true);
  logged_key k(*fx, cfg, "w1");
  auto& [t, w, bucket, key, log] = k;
  auto reg = must(registry::open(t, cfg));
  recorder rec;
  auto watch = must(reg->watch(rec.callback()));
  auto entry = must(reg->register_participant(w, {}, 1, "{}"));
  must(reg->heartbeat(w));
  entry = must(reg->get(w)).value();

  fx->advance(cfg.registry_ttl + (fx->real_time() ? 0ms : 200ms));
  log->take();
  auto hb = reg->heartbeat(w);
  CHECK(code_of(hb) == errc::not_found);
  CHECK_THAT(text_of(hb), Catch::Contains("expired"));
  // A read, and at most the write that records the expiry (unless a sweeper or the
  // backend did already).
  auto seen = log->take();
  CHECK((seen == ops{"kv_get"} || seen == ops{"kv_get", "kv_update"}));
  if (auto stored = fx->transport().kv_get(bucket, key)) {
    CHECK_THAT(stored->value, Catch::Contains(R"("state":"expired")"));
    CHECK_THAT(stored->value,
               Catch::Contains(R"("expires_at":")" + format_timestamp(entry.expires_at) + "\""));
  } else {
    CHECK(code_of(stored) == errc::not_found);
  }
  CHECK(must(reg->get(w)) == std::nullopt);

  log->take();
  CHECK(code_of(reg->heartbeat(w)) == errc::not_found);
  CHECK(log->take() == ops{"kv_get"});
  auto ev = rec.settled(*reg);
  REQUIRE(ev.size() == 2);
  CHECK(is_event(ev[0], "w1", up, registered));
  CHECK(is_event(ev[1], "w1", down, expired));
}

TEST_CASE("registry: a heartbeat after a leave is not_found and writes nothing", "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.registry_force_sweeper = GENERATE(false, true);
  const bool other_leaves = GENERATE(false, true);  // through another gateway's registry
  logged_key k(*fx, cfg, "w1");
  auto& [t, w, bucket, key, log] = k;
  auto one = must(registry::open(t, cfg));
  auto two = must(registry::open(t, cfg));
  must(one->register_participant(w, {}, 1, "{}"));
  must(one->heartbeat(w));

  must((other_leaves ? two : one)->leave(w));
  auto before = must(fx->transport().kv_get(bucket, key));
  log->take();
  auto hb = one->heartbeat(w);
  CHECK(code_of(hb) == errc::not_found);
  CHECK_THAT(text_of(hb), Catch::Contains("left"));
  auto seen = log->take();
  CHECK((seen == ops{"kv_get"} || seen == ops{"kv_update", "kv_get"}));  // the update: refused
  auto after = must(fx->transport().kv_get(bucket, key));
  CHECK(after.revision == before.revision);
  CHECK(after.value == before.value);
  CHECK_THAT(after.value, Catch::Contains(R"("state":"left")"));
  CHECK(must(one->get(w)) == std::nullopt);

  // The registry forgot it: a read only. (A sweeper's watch that lags behind on a real
  // backend may bring back the entry as it was before the leave, for a moment.)
  log->take();
  CHECK(code_of(one->heartbeat(w)) == errc::not_found);
  seen = log->take();
  if (fx->real_time() && one->uses_sweeper()) {
    CHECK((seen == ops{"kv_get"} || seen == ops{"kv_update", "kv_get"}));
  } else {
    CHECK(seen == ops{"kv_get"});
  }
}

TEST_CASE("registry: after a heartbeat whose answer was lost the next one refreshes the entry",
          "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.registry_ttl = fx->real_time() ? 3s : 30s;
  cfg.registry_force_sweeper = GENERATE(false, true);
  const bool waiting = GENERATE(true, false);  // heartbeat, or async_heartbeat
  auto t = std::make_shared<faulty_transport>(fx->shared_transport());
  auto w = pname("w1");
  auto reg = must(registry::open(t, cfg));
  must(reg->register_participant(w, {}, 2, "{}"));
  auto beat = [&](std::optional<int> load = std::nullopt) {
    return waiting ? reg->heartbeat(w, load) : async_heartbeat(*reg, w, load);
  };

  // The write lands, but its answer is lost.
  t->hold_updates([&](std::string_view k) { return k == subjects::registry_key(w); });
  fx->advance(cfg.registry_ttl / 4);
  CHECK(code_of(beat(1)) == errc::unavailable);
  CHECK(t->land_held() == 1);
  CHECK(must(reg->get(w))->load == 1);

  fx->advance(cfg.registry_ttl / 4);
  auto hb = must(beat());
  CHECK(hb.load == 1);
  CHECK(must(reg->get(w)) == hb);
  fx->advance(cfg.registry_ttl / 4);
  auto again = must(beat(2));
  CHECK(again.expires_at > hb.expires_at);
  CHECK(must(reg->get(w)) == again);
}

TEST_CASE("registry: async_heartbeat refreshes like heartbeat, one write when nothing changed",
          "[registry]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.registry_ttl = fx->real_time() ? 3s : 30s;
  cfg.registry_force_sweeper = GENERATE(false, true);
  logged_key k(*fx, cfg, "w1");
  auto& [t, w, bucket, key, log] = k;
  auto one = must(registry::open(t, cfg));
  auto two = must(registry::open(t, cfg));  // another gateway's

  CHECK(code_of(async_heartbeat(*one, w)) == errc::not_found);  // never registered
  auto last = must(one->register_participant(w, {jname("resize")}, 4, "{}", 1));
  fx->advance(cfg.registry_ttl / 4);
  log->take();
  auto hb = must(async_heartbeat(*one, w, 2));
  CHECK(log->take() == ops{"kv_update"});
  CHECK(hb.updated_at > last.updated_at);
  CHECK(hb.expires_at - hb.updated_at == cfg.registry_ttl);
  CHECK(hb.load == 2);
  CHECK(hb.jobs == last.jobs);
  CHECK(must(one->get(w)) == hb);

  // Written by another registry since: the write finds that out, and the heartbeat goes on
  // by reading, keeping both loads.
  CHECK(must(two->heartbeat(w, 3)).load == 5);
  fx->advance(cfg.registry_ttl / 4);
  log->take();
  hb = must(async_heartbeat(*one, w, 1));
  CHECK(hb.load == 4);
  auto seen = log->take();
  if (one->uses_sweeper()) {
    CHECK((seen == ops{"kv_update"} || seen == ops{"kv_update", "kv_get", "kv_update"}));
  } else {
    CHECK(seen == ops{"kv_update", "kv_get", "kv_update"});
  }
  CHECK(must(two->get(w)) == hb);

  // Bad input changes nothing.
  auto before = must(fx->transport().kv_get(bucket, key));
  log->take();
  auto bad = async_heartbeat(*one, w, -1);
  CHECK(code_of(bad) == errc::bad_request);
  CHECK_THAT(text_of(bad), Catch::Contains("load must not be negative, not -1"));
  CHECK(log->take().empty());
  CHECK(must(fx->transport().kv_get(bucket, key)).revision == before.revision);

  must(two->leave(w));
  auto gone = async_heartbeat(*one, w);
  CHECK(code_of(gone) == errc::not_found);
  CHECK_THAT(text_of(gone), Catch::Contains("left"));
}

}  // namespace amp::broker_testing
