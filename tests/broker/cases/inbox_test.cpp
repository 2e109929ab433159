// Inbox messages (spec §5) on every transport: send, delivery to attached readers, ack,
// nack, the window and redelivery.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "amp/broker/inbox.hpp"
#include "amp/subjects.hpp"
#include "broker/cases/broker_helpers.hpp"
#include "broker/cases/faulty_transport.hpp"

namespace amp::broker_testing {
namespace {

using namespace std::chrono_literals;

// What a reader received, in order.
using inbox_log = callback_log<inbox_message>;

// On a real backend, gives deliveries that should not happen the time to show up.
void quiet_period(fixture& fx) {
  if (fx.real_time()) std::this_thread::sleep_for(300ms);
}

inbox_send note(std::string_view to, std::string_view from, std::string body = R"({"n":1})",
                std::string msg_id = {}) {
  return inbox_send{.to = pname(to),
                    .from = std::string(from),
                    .body = std::move(body),
                    .msg_id = std::move(msg_id)};
}

std::uint64_t stored_messages(fixture& fx, const broker_config& cfg) {
  return must(fx.transport().stream_info_of(subjects::inbox_stream(cfg.ns))).state.messages;
}

struct setup {
  std::unique_ptr<fixture> fx = make_fixture();
  broker_config cfg = config_for(*fx);
  std::shared_ptr<inbox> box;

  explicit setup(duration ack_wait = 1s, int window = 64,
                 duration idle = std::chrono::hours(24 * 7)) {
    cfg.inbox_ack_wait = ack_wait;
    cfg.inbox_window = window;
    cfg.inbox_idle_consumer = idle;
    box = must(inbox::open(fx->shared_transport(), cfg));
  }
};

// Whether participant `who` has an inbox consumer.
bool has_consumer(fixture& fx, const broker_config& cfg, std::string_view who) {
  auto r = fx.transport().consumer_info_of(subjects::inbox_stream(cfg.ns),
                                           subjects::inbox_consumer(pname(who)));
  if (!r && r.error().code() != errc::not_found) FAIL(r.error().to_string());
  return r.has_value();
}

// Waits until the backend has removed `who`'s idle consumer: on a manual clock the case
// has advanced past the idle time; JetStream notices idleness now and then.
bool consumer_removed(fixture& fx, const broker_config& cfg, std::string_view who) {
  if (!fx.real_time()) return !has_consumer(fx, cfg, who);
  return eventually([&] { return !has_consumer(fx, cfg, who); }, 15s);
}

}  // namespace

TEST_CASE("inbox: the participants with an inbox are those attached once or with messages",
          "[inbox]") {
  setup s;
  CHECK(must(s.box->participants()).empty());
  inbox_log log;
  { auto reader = must(s.box->attach(pname("carol"), log.callback())); }
  must(s.box->send(note("bob", "alice")));
  auto sent = must(s.box->send(note("dave", "alice")));
  auto names = must(s.box->participants());
  CHECK(names == std::vector<participant_name>{pname("bob"), pname("carol"), pname("dave")});
  // dave's only message is taken: dave has an inbox no more (never attached).
  must(s.fx->transport().delete_message(subjects::inbox_stream(s.cfg.ns), sent.seq));
  CHECK(must(s.box->participants()) == std::vector<participant_name>{pname("bob"), pname("carol")});
}

TEST_CASE("inbox: a message sent to an offline participant is delivered when it attaches",
          "[inbox]") {
  setup s;
  auto before =
      std::chrono::time_point_cast<std::chrono::milliseconds>(s.fx->transport().clock()->now());
  auto sent = must(s.box->send(inbox_send{.to = pname("bob"),
                                          .from = "alice",
                                          .body = R"({"text": "hi", "n": [1, 2]})",
                                          .type = "review.request",
                                          .headers = {{"k", "v"}},
                                          .reply_to = "alice",
                                          .correlation = "c-1"}));
  auto after = s.fx->transport().clock()->now();
  CHECK(sent.seq > 0);
  CHECK_FALSE(sent.msg_id.empty());
  CHECK_FALSE(sent.duplicate);

  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  REQUIRE(log.reaches(1));
  auto m = log.at(0);
  CHECK(m.seq == sent.seq);
  CHECK(m.delivery == 1);
  CHECK(m.env.id == sent.msg_id);
  CHECK(m.env.from == "alice");
  CHECK(m.env.to == "bob");
  CHECK(m.env.ns == s.cfg.ns.str());
  CHECK(m.env.type == "review.request");
  CHECK(m.env.body == R"({"text":"hi","n":[1,2]})");
  CHECK(m.env.headers == std::vector<std::pair<std::string, std::string>>{{"k", "v"}});
  CHECK(m.env.reply_to == "alice");
  CHECK(m.env.correlation == "c-1");
  CHECK(m.env.ts >= before);
  CHECK(m.env.ts <= after);
  CHECK(reader->participant() == pname("bob"));
  quiet_period(*s.fx);
  CHECK(log.size() == 1);
}

TEST_CASE(
    "inbox: opening with other limits changes the stream's and keeps its messages and a full "
    "inbox refuses new ones",
    "[inbox][retention]") {
  setup s;
  must(s.box->send(note("bob", "alice")));
  auto cfg = s.cfg;
  cfg.inbox_max_age = std::chrono::hours(1);
  cfg.inbox_max_bytes = 1 << 20;
  auto again = must(inbox::open(s.fx->shared_transport(), cfg));
  auto info = must(s.fx->transport().stream_info_of(subjects::inbox_stream(cfg.ns)));
  CHECK(info.config.max_age == std::chrono::hours(1));
  CHECK(info.config.max_bytes == 1 << 20);
  CHECK(info.config.discard == discard_policy::new_messages);
  CHECK(info.state.messages == 1);
  // Filled to the byte limit, the next send is refused and nothing stored is dropped.
  const std::string big(200 * 1024, 'x');
  int stored = 1;
  result<send_result> last = must(again->send(note("bob", "alice")));
  ++stored;
  while (last) {
    last = again->send(note("bob", "alice", "\"" + big + "\""));
    if (last) ++stored;
  }
  CHECK(last.error().code() == errc::limit_exceeded);
  CHECK(stored_messages(*s.fx, cfg) == static_cast<std::uint64_t>(stored));
}

TEST_CASE("inbox: a message sent while the recipient is attached reaches it", "[inbox]") {
  setup s;
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  auto sent = must(s.box->send(note("bob", "$broker", R"("system")")));
  REQUIRE(log.reaches(1));
  CHECK(log.at(0).seq == sent.seq);
  CHECK(log.at(0).env.from == "$broker");
  CHECK(log.at(0).env.body == R"("system")");
  must(reader->ack(sent.seq));
}

result<send_result> send_sealed(inbox& box, sealed_envelope env) {
  std::promise<result<send_result>> answer;
  box.async_send(std::move(env), [&](result<send_result> r) { answer.set_value(std::move(r)); });
  return answer.get_future().get();
}

TEST_CASE("inbox: a sealed envelope is stored as it was sealed, deduplicated as a send is",
          "[inbox]") {
  setup s;
  auto now = s.fx->transport().clock()->now();
  auto sealed = must(sealed_envelope::seal({.from = "alice",
                                            .to = "bob",
                                            .body = R"({ "n" : [1, 2] })",
                                            .type = "note.x",
                                            .headers = {{"k", "v"}},
                                            .msg_id = "m-7",
                                            .reply_to = "alice",
                                            .correlation = "c-1"},
                                           s.cfg.ns.view(), now));
  const envelope expected = sealed.get();
  CHECK(expected.body == R"({"n":[1,2]})");
  CHECK(expected.ns == s.cfg.ns.str());
  CHECK(must(parse_envelope(sealed.json())) == expected);
  auto sent = must(send_sealed(*s.box, sealed));
  CHECK(sent.msg_id == "m-7");
  CHECK_FALSE(sent.duplicate);
  auto again = must(send_sealed(*s.box, sealed));
  CHECK(again.duplicate);
  CHECK(again.seq == sent.seq);
  // The same message sent the unsealed way is the same message: stored once.
  auto plain = must(s.box->send(note("bob", "alice", "1", "m-7")));
  CHECK(plain.duplicate);
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  REQUIRE(log.reaches(1));
  CHECK(log.at(0).seq == sent.seq);
  CHECK(log.at(0).env == expected);
  must(reader->ack(sent.seq));
  quiet_period(*s.fx);
  CHECK(log.size() == 1);
}

TEST_CASE(
    "inbox: a sealed envelope for another namespace, a non-participant or emptied stores nothing",
    "[inbox]") {
  setup s;
  auto now = s.fx->transport().clock()->now();
  auto elsewhere =
      must(sealed_envelope::seal({.from = "alice", .to = "bob", .body = "1"}, "elsewhere", now));
  auto r = send_sealed(*s.box, elsewhere);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::bad_request);
  CHECK(r.error().message().find("elsewhere") != std::string::npos);
  auto to_topic = must(
      sealed_envelope::seal({.from = "alice", .to = "news.eu", .body = "1"}, s.cfg.ns.view(), now));
  r = send_sealed(*s.box, to_topic);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_name);
  CHECK(r.error().message().rfind("to: ", 0) == 0);
  auto taken = must(
      sealed_envelope::seal({.from = "alice", .to = "bob", .body = "1"}, s.cfg.ns.view(), now));
  CHECK_FALSE(std::string(std::move(taken).json()).empty());
  r = send_sealed(*s.box, std::move(taken));  // emptied by json() &&
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::bad_request);
  CHECK(stored_messages(*s.fx, s.cfg) == 0);
}

TEST_CASE("inbox: a repeated msg_id from the same sender to the same recipient is stored once",
          "[inbox]") {
  setup s;
  auto first = must(s.box->send(note("bob", "alice", R"({"n":1})", "m-1")));
  CHECK_FALSE(first.duplicate);
  CHECK(first.msg_id == "m-1");
  auto again = must(s.box->send(note("bob", "alice", R"({"n":2})", "m-1")));
  CHECK(again.duplicate);
  CHECK(again.seq == first.seq);
  CHECK(again.msg_id == "m-1");

  auto other_sender = must(s.box->send(note("bob", "carol", R"({"n":3})", "m-1")));
  CHECK_FALSE(other_sender.duplicate);
  CHECK(other_sender.seq != first.seq);
  auto other_recipient = must(s.box->send(note("dave", "alice", R"({"n":4})", "m-1")));
  CHECK_FALSE(other_recipient.duplicate);

  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  REQUIRE(log.reaches(2));
  quiet_period(*s.fx);
  REQUIRE(log.size() == 2);
  CHECK(log.at(0).seq == first.seq);
  CHECK(log.at(0).env.body == R"({"n":1})");
  CHECK(log.at(1).seq == other_sender.seq);
  CHECK(log.at(1).env.from == "carol");
}

TEST_CASE("inbox: messages without msg_id get unique ids and are never deduplicated", "[inbox]") {
  setup s;
  auto a = must(s.box->send(note("bob", "alice")));
  auto b = must(s.box->send(note("bob", "alice")));
  CHECK(a.msg_id != b.msg_id);
  CHECK(a.seq != b.seq);
  CHECK_FALSE(b.duplicate);
  CHECK(stored_messages(*s.fx, s.cfg) == 2);
}

TEST_CASE("inbox: an acked message is removed and never redelivered", "[inbox]") {
  setup s;
  auto sent = must(s.box->send(note("bob", "alice")));
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  REQUIRE(log.reaches(1));
  must(reader->ack(sent.seq));
  CHECK(eventually([&] { return stored_messages(*s.fx, s.cfg) == 0; }));
  s.fx->advance(s.cfg.inbox_ack_wait * 2);
  quiet_period(*s.fx);
  CHECK(log.size() == 1);

  // Nor does a participant that comes back get it.
  reader.reset();
  inbox_log later;
  auto again = must(s.box->attach(pname("bob"), later.callback()));
  quiet_period(*s.fx);
  CHECK(later.size() == 0);
}

TEST_CASE("inbox: an unacked message is delivered again after the ack wait", "[inbox]") {
  setup s;
  auto sent = must(s.box->send(note("bob", "alice")));
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  REQUIRE(log.reaches(1));
  CHECK(log.at(0).delivery == 1);
  s.fx->advance(s.cfg.inbox_ack_wait / 2);
  CHECK(log.size() == 1);
  s.fx->advance(s.cfg.inbox_ack_wait / 2);
  REQUIRE(log.reaches(2));
  CHECK(log.at(1).seq == sent.seq);
  CHECK(log.at(1).delivery == 2);
  CHECK(log.at(1).env == log.at(0).env);
  must(reader->ack(sent.seq));
  s.fx->advance(s.cfg.inbox_ack_wait * 2);
  quiet_period(*s.fx);
  CHECK(log.size() == 2);
}

TEST_CASE("inbox: an ack of the first delivery after the ack wait still counts", "[inbox]") {
  setup s;
  auto sent = must(s.box->send(note("bob", "alice")));
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  REQUIRE(log.reaches(1));
  s.fx->advance(s.cfg.inbox_ack_wait);
  REQUIRE(log.reaches(2));
  must(reader->ack(sent.seq));
  CHECK(code_of(reader->ack(sent.seq)) == errc::not_found);
  CHECK(eventually([&] { return stored_messages(*s.fx, s.cfg) == 0; }));
}

TEST_CASE("inbox: a nack with a delay redelivers after the delay, counting a delivery", "[inbox]") {
  setup s(5s);
  auto sent = must(s.box->send(note("bob", "alice")));
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  REQUIRE(log.reaches(1));
  must(reader->nack(sent.seq, 2s));
  CHECK(code_of(reader->ack(sent.seq)) == errc::not_found);  // no longer in flight
  s.fx->advance(1s);
  CHECK(log.size() == 1);
  s.fx->advance(1s);
  REQUIRE(log.reaches(2));
  CHECK(log.at(1).seq == sent.seq);
  CHECK(log.at(1).delivery == 2);

  // Without a delay it comes back at once.
  must(reader->nack(sent.seq));
  REQUIRE(log.reaches(3, 2s));
  CHECK(log.at(2).delivery == 3);
  must(reader->ack(sent.seq));
}

TEST_CASE("inbox: ack and nack of a seq that is not in flight are not_found", "[inbox]") {
  setup s;
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  CHECK(code_of(reader->ack(424242)) == errc::not_found);
  CHECK(code_of(reader->nack(424242)) == errc::not_found);

  auto sent = must(s.box->send(note("bob", "alice")));
  REQUIRE(log.reaches(1));
  CHECK(code_of(reader->nack(sent.seq, -1s)) == errc::bad_request);
  must(reader->ack(sent.seq));  // the bad nack changed nothing
  CHECK(code_of(reader->ack(sent.seq)) == errc::not_found);
  CHECK(code_of(reader->nack(sent.seq)) == errc::not_found);

  // Another participant's message is not in flight to bob.
  inbox_log carol_log;
  auto carol = must(s.box->attach(pname("carol"), carol_log.callback()));
  auto to_carol = must(s.box->send(note("carol", "alice")));
  REQUIRE(carol_log.reaches(1));
  CHECK(code_of(reader->ack(to_carol.seq)) == errc::not_found);
  must(carol->ack(to_carol.seq));

  // A stopped reader settles nothing.
  auto next = must(s.box->send(note("carol", "alice")));
  REQUIRE(carol_log.reaches(2));
  auto second = must(s.box->attach(pname("carol"), [](const inbox_message&) {}));
  second->stop();
  CHECK(code_of(second->ack(next.seq)) == errc::not_found);
  must(carol->ack(next.seq));
}

TEST_CASE("inbox: async ack and nack report the outcome", "[inbox]") {
  setup s;
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  auto sent = must(s.box->send(note("bob", "alice")));
  REQUIRE(log.reaches(1));
  std::atomic<int> acked{-1};
  reader->async_ack(sent.seq, [&](result<void> r) { acked = static_cast<int>(code_of(r)); });
  CHECK(eventually([&] { return acked.load() == 0; }));
  std::atomic<int> again{-1};
  reader->async_nack(sent.seq, 0s, [&](result<void> r) { again = static_cast<int>(code_of(r)); });
  CHECK(eventually([&] { return again.load() == static_cast<int>(errc::not_found); }));
}

TEST_CASE("inbox: at most inbox_window messages are in flight until acked", "[inbox]") {
  setup s(30s, 3);
  std::vector<std::uint64_t> seqs;
  for (int i = 0; i < 10; ++i) seqs.push_back(must(s.box->send(note("bob", "alice"))).seq);
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  REQUIRE(log.reaches(3));
  quiet_period(*s.fx);
  REQUIRE(log.size() == 3);

  must(reader->ack(seqs[0]));
  REQUIRE(log.reaches(4));
  quiet_period(*s.fx);
  CHECK(log.size() == 4);

  // A nack frees a place as well; the nacked message comes back first.
  must(reader->nack(seqs[1]));
  REQUIRE(log.reaches(5));
  CHECK(log.at(4).seq == seqs[1]);
  CHECK(log.at(4).delivery == 2);

  for (std::size_t acked = 1; acked < seqs.size(); ++acked) {
    must(reader->ack(seqs[acked]));
    if (acked + 3 < seqs.size()) REQUIRE(log.reaches(5 + acked));
  }
  quiet_period(*s.fx);
  auto all = log.all();
  REQUIRE(all.size() == 11);
  std::vector<std::uint64_t> first_deliveries;
  for (const auto& m : all) {
    if (m.delivery == 1) first_deliveries.push_back(m.seq);
  }
  CHECK(first_deliveries == seqs);
  CHECK(eventually([&] { return stored_messages(*s.fx, s.cfg) == 0; }));
}

TEST_CASE("inbox: a full window still redelivers what is not acked in time", "[inbox]") {
  setup s(1s, 2);
  std::vector<std::uint64_t> seqs;
  for (int i = 0; i < 3; ++i) seqs.push_back(must(s.box->send(note("bob", "alice"))).seq);
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  REQUIRE(log.reaches(2));
  s.fx->advance(s.cfg.inbox_ack_wait);
  REQUIRE(log.reaches(4));
  auto all = log.all();
  CHECK(all[2].delivery == 2);
  CHECK(all[3].delivery == 2);
  CHECK(all[2].seq != seqs[2]);
  CHECK(all[3].seq != seqs[2]);
  must(reader->ack(seqs[0]));
  must(reader->ack(seqs[1]));
  REQUIRE(log.reaches(5));
  CHECK(log.at(4).seq == seqs[2]);
  CHECK(log.at(4).delivery == 1);
  must(reader->ack(seqs[2]));
}

TEST_CASE("inbox: every reader of a participant gets each message, an ack from one counts",
          "[inbox]") {
  setup s;
  inbox_log one, two, other;
  auto r1 = must(s.box->attach(pname("bob"), one.callback()));
  auto r2 = must(s.box->attach(pname("bob"), two.callback()));
  auto r3 = must(s.box->attach(pname("carol"), other.callback()));
  auto sent = must(s.box->send(note("bob", "alice")));
  REQUIRE(one.reaches(1));
  REQUIRE(two.reaches(1));
  CHECK(one.at(0).seq == sent.seq);
  CHECK(two.at(0).seq == sent.seq);
  must(r2->ack(sent.seq));
  CHECK(code_of(r1->ack(sent.seq)) == errc::not_found);
  s.fx->advance(s.cfg.inbox_ack_wait * 2);
  quiet_period(*s.fx);
  CHECK(one.size() == 1);
  CHECK(two.size() == 1);
  CHECK(other.size() == 0);

  // One reader leaving does not hand back what is in flight to the other.
  auto next = must(s.box->send(note("bob", "alice")));
  REQUIRE(one.reaches(2));
  REQUIRE(two.reaches(2));
  r1->stop();
  quiet_period(*s.fx);
  CHECK(two.size() == 2);
  must(r2->ack(next.seq));
}

TEST_CASE("inbox: when the last reader detaches, what was in flight goes to the next at once",
          "[inbox]") {
  setup s(30s);
  auto sent = must(s.box->send(note("bob", "alice")));
  inbox_log first;
  auto reader = must(s.box->attach(pname("bob"), first.callback()));
  REQUIRE(first.reaches(1));
  reader.reset();

  inbox_log second;
  auto back = must(s.box->attach(pname("bob"), second.callback()));
  // Far sooner than the 30 s ack wait, and without moving a manual clock.
  REQUIRE(second.reaches(1, 5s));
  CHECK(second.at(0).seq == sent.seq);
  CHECK(second.at(0).delivery == 2);  // one delivery per delivery: none to nobody
  must(back->ack(sent.seq));
  CHECK(first.size() == 1);
}

TEST_CASE("inbox: what is handed back while nobody reads counts no delivery that reached nobody",
          "[inbox]") {
  setup s(30s);
  auto sent = must(s.box->send(note("bob", "alice")));
  inbox_log first;
  auto reader = must(s.box->attach(pname("bob"), first.callback()));
  REQUIRE(first.reaches(1));
  reader.reset();
  s.fx->advance(6s);  // the fetch that was out when bob left has come back
  quiet_period(*s.fx);

  inbox_log second;
  auto back = must(s.box->attach(pname("bob"), second.callback()));
  REQUIRE(second.reaches(1, 10s));
  CHECK(second.at(0).seq == sent.seq);
  CHECK(second.at(0).delivery == 2);
  must(back->ack(sent.seq));
}

TEST_CASE("inbox: a reader may stop itself from its callback", "[inbox]") {
  setup s(30s);
  std::unique_ptr<inbox_reader> reader;
  std::mutex mu;
  std::atomic<int> calls{0};
  reader = must(s.box->attach(pname("bob"), [&](const inbox_message&) {
    ++calls;
    std::lock_guard lock(mu);
    reader.reset();  // destroys the reader inside its own callback
  }));
  // The callback needs `reader` set before the first delivery: send after attaching.
  auto a = must(s.box->send(note("bob", "alice")));
  auto b = must(s.box->send(note("bob", "alice")));
  CHECK(eventually([&] {
    std::lock_guard lock(mu);
    return reader == nullptr;
  }));
  quiet_period(*s.fx);
  CHECK(calls.load() == 1);

  inbox_log log;
  auto next = must(s.box->attach(pname("bob"), log.callback()));
  REQUIRE(log.reaches(2, 5s));
  must(next->ack(a.seq));
  must(next->ack(b.seq));
}

TEST_CASE("inbox: a callback may answer with async_send and ack", "[inbox]") {
  setup s;
  inbox_log alice_log;
  auto alice = must(s.box->attach(pname("alice"), alice_log.callback()));
  std::shared_ptr<inbox> box = s.box;
  std::unique_ptr<inbox_reader> bob;
  std::atomic<bool> ready{false};
  bob = must(s.box->attach(pname("bob"), [&, box](const inbox_message& m) {
    while (!ready.load()) std::this_thread::yield();
    box->async_send(inbox_send{.to = pname("alice"),
                               .from = "bob",
                               .body = m.env.body,
                               .correlation = m.env.correlation},
                    [](result<send_result>) {});
    (void)bob->ack(m.seq);
  }));
  ready = true;
  must(s.box->send(inbox_send{
      .to = pname("bob"), .from = "alice", .body = R"({"q":"ping"})", .correlation = "c-7"}));
  REQUIRE(alice_log.reaches(1));
  CHECK(alice_log.at(0).env.from == "bob");
  CHECK(alice_log.at(0).env.body == R"({"q":"ping"})");
  CHECK(alice_log.at(0).env.correlation == "c-7");
  CHECK(eventually([&] { return stored_messages(*s.fx, s.cfg) == 1; }));  // alice's, unacked
}

TEST_CASE("inbox: async_send reports the sequence", "[inbox]") {
  setup s;
  std::mutex mu;
  std::optional<result<send_result>> answer;
  s.box->async_send(note("bob", "alice", "[1]", "x-1"), [&](result<send_result> r) {
    std::lock_guard lock(mu);
    answer = std::move(r);
  });
  REQUIRE(eventually([&] {
    std::lock_guard lock(mu);
    return answer.has_value();
  }));
  auto r = must(std::move(*answer));
  CHECK(r.seq > 0);
  CHECK(r.msg_id == "x-1");

  std::optional<result<send_result>> refused;
  s.box->async_send(note("bob", "Alice"), [&](result<send_result> e) { refused = std::move(e); });
  REQUIRE(refused.has_value());  // bad input is answered at once
  CHECK(code_of(*refused) == errc::invalid_name);
}

namespace {

// Attaches `n` participants to one inbox object, then sends each its own message.
// This process's thread count (Linux).
int thread_count() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

void many_participants(int n) {
  setup s(30s);
  const int threads_before = thread_count();
  std::vector<inbox_log> logs(static_cast<std::size_t>(n));
  std::vector<std::unique_ptr<inbox_reader>> readers;
  readers.reserve(logs.size());
  auto name = [](int i) { return pname("p" + std::to_string(i)); };
  for (int i = 0; i < n; ++i) {
    readers.push_back(must(s.box->attach(name(i), logs[static_cast<std::size_t>(i)].callback())));
  }
  // Every participant has a waiting fetch now, and no thread of its own.
  CHECK(thread_count() - threads_before < 8);
  // In rounds of 500, so that the memory transport's stream stays short.
  for (int round = 0; round < n; round += 500) {
    std::vector<std::uint64_t> seqs;
    for (int i = round; i < std::min(n, round + 500); ++i) {
      auto sent =
          must(s.box->send(inbox_send{.to = name(i), .from = "alice", .body = std::to_string(i)}));
      seqs.push_back(sent.seq);
    }
    for (int i = round; i < std::min(n, round + 500); ++i) {
      auto& log = logs[static_cast<std::size_t>(i)];
      REQUIRE(log.reaches(1, 30s));
      auto m = log.at(0);
      REQUIRE(m.seq == seqs[static_cast<std::size_t>(i - round)]);
      REQUIRE(m.env.body == std::to_string(i));
      REQUIRE(m.env.to == name(i).str());
      must(readers[static_cast<std::size_t>(i)]->ack(m.seq));
    }
  }
  quiet_period(*s.fx);
  for (const auto& log : logs) REQUIRE(log.size() == 1);
  CHECK(eventually([&] { return stored_messages(*s.fx, s.cfg) == 0; }, 30s));
}

}  // namespace

TEST_CASE("inbox: many attached participants each get their own messages", "[inbox]") {
  many_participants(500);
}

// 10,000 participants: one consumer and one waiting fetch each, so a transport that scans
// every consumer on publish or on consumer creation shows up here as quadratic time.
TEST_CASE("inbox: ten thousand attached participants each get their own messages",
          "[inbox-scale]") {
  many_participants(10000);
}

TEST_CASE("inbox: bad input is refused precisely and stores nothing", "[inbox]") {
  setup s;
  auto refuse = [&](inbox_send m) { return code_of(s.box->send(std::move(m))); };
  CHECK(refuse(note("bob", "alice", "")) == errc::bad_request);
  CHECK(refuse(note("bob", "alice", "{")) == errc::bad_request);
  CHECK(refuse(note("bob", "alice", "1 2")) == errc::bad_request);
  CHECK(refuse(note("bob", "alice", R"({"a":1},"from":"x")")) == errc::bad_request);
  CHECK(refuse(note("bob", "alice", "not json")) == errc::bad_request);
  CHECK(refuse(note("bob", "Alice")) == errc::invalid_name);
  CHECK(refuse(note("bob", "")) == errc::invalid_name);
  CHECK(refuse(note("bob", "$root")) == errc::invalid_name);
  CHECK(refuse(note("bob", "a.b")) == errc::invalid_name);
  // A bad body is reported before a bad sender (spec §1 order).
  CHECK(refuse(note("bob", "Alice", "{")) == errc::bad_request);

  auto with = [](auto change) {
    inbox_send m = note("bob", "alice");
    change(m);
    return m;
  };
  CHECK(refuse(with([](inbox_send& m) { m.reply_to = "Bob"; })) == errc::invalid_name);
  CHECK(refuse(with([](inbox_send& m) { m.type = "bad type"; })) == errc::invalid_envelope);
  CHECK(refuse(with([](inbox_send& m) { m.msg_id = std::string(129, 'x'); })) ==
        errc::invalid_envelope);
  CHECK(refuse(with([](inbox_send& m) { m.msg_id = "a\nb"; })) == errc::invalid_envelope);
  CHECK(refuse(with([](inbox_send& m) { m.correlation = std::string(257, 'c'); })) ==
        errc::invalid_envelope);
  CHECK(refuse(with([](inbox_send& m) {
          m.headers = {{"k", "1"}, {"k", "2"}};
        })) == errc::invalid_envelope);
  auto e = s.box->send(with([](inbox_send& m) { m.type = "bad type"; }));
  CHECK(e.error().path() == "/type");

  CHECK(stored_messages(*s.fx, s.cfg) == 0);
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  quiet_period(*s.fx);
  CHECK(log.size() == 0);
  CHECK(code_of(s.box->attach(pname("bob"), nullptr)) == errc::bad_request);

  // And a good one after all that is the first message stored.
  auto ok = must(s.box->send(note("bob", "alice")));
  REQUIRE(log.reaches(1));
  CHECK(log.at(0).seq == ok.seq);
  must(reader->ack(ok.seq));
}

TEST_CASE("inbox: open refuses an impossible configuration", "[inbox]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.inbox_window = 0;
  CHECK(code_of(inbox::open(fx->shared_transport(), cfg)) == errc::bad_request);
  cfg.inbox_window = 1;
  cfg.inbox_ack_wait = 0s;
  CHECK(code_of(inbox::open(fx->shared_transport(), cfg)) == errc::bad_request);
  CHECK(code_of(fx->transport().stream_info_of(subjects::inbox_stream(cfg.ns))) == errc::not_found);
}

TEST_CASE("inbox: a consumer deleted under an attached reader is made again", "[inbox]") {
  setup s(30s);
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  auto stream = subjects::inbox_stream(s.cfg.ns);
  auto consumer = subjects::inbox_consumer(pname("bob"));
  must(s.fx->transport().delete_consumer(stream, consumer));
  // The failed fetch is retried after a short backoff.
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    s.fx->advance(100ms);
    back = s.fx->transport().consumer_info_of(stream, consumer).has_value();
  }
  REQUIRE(back);
  auto sent = must(s.box->send(note("bob", "alice")));
  REQUIRE(log.reaches(1));
  CHECK(log.at(0).seq == sent.seq);
  must(reader->ack(sent.seq));
}

TEST_CASE("inbox: a consumer made with another ack wait or window takes the new ones", "[inbox]") {
  setup s(30s, 64);
  auto first = must(s.box->attach(pname("bob"), [](const inbox_message&) {}));
  first.reset();
  auto cfg = s.cfg;
  cfg.inbox_ack_wait = 10s;
  cfg.inbox_window = 3;
  auto other = must(inbox::open(s.fx->shared_transport(), cfg));
  auto second = must(other->attach(pname("bob"), [](const inbox_message&) {}));
  auto info = must(s.fx->transport().consumer_info_of(subjects::inbox_stream(cfg.ns),
                                                      subjects::inbox_consumer(pname("bob"))));
  CHECK(info.config.ack_wait == 10s);
  CHECK(info.config.max_ack_pending == 3);
}

TEST_CASE("inbox: two inbox objects on one namespace share the participant's window", "[inbox]") {
  setup s(30s, 2);
  auto other = must(inbox::open(s.fx->shared_transport(), s.cfg));
  std::vector<std::uint64_t> seqs;
  for (int i = 0; i < 5; ++i) seqs.push_back(must(s.box->send(note("bob", "alice"))).seq);
  inbox_log here, there;
  auto r1 = must(s.box->attach(pname("bob"), here.callback()));
  auto r2 = must(other->attach(pname("bob"), there.callback()));
  // Two messages in flight in all, whichever gateway fetched them (what one fetched before
  // the other had a reader reaches that one when it is delivered again).
  REQUIRE(eventually([&] { return here.size() + there.size() >= 2; }));
  quiet_period(*s.fx);
  std::set<std::uint64_t> in_flight;
  for (const auto& m : here.all()) in_flight.insert(m.seq);
  for (const auto& m : there.all()) in_flight.insert(m.seq);
  CHECK(in_flight.size() == 2);
}

TEST_CASE(
    "inbox: deliveries are told to other gateways only while one has readers of the "
    "participant",
    "[inbox][several]") {
  setup s(30s);
  callback_log<std::string> said;  // the events on the namespace's inbox control subjects
  auto listen = must(s.fx->transport().subscribe_core(
      subjects::inbox_control_subjects(s.cfg.ns), [&](const message& m) {
        said.callback()(std::string(find_header(m.headers, "Amp-Event").value_or("?")));
      }));
  auto count = [&](std::string_view event) {
    auto all = said.all();
    return std::count(all.begin(), all.end(), event);
  };
  inbox_log here, there;
  auto r1 = must(s.box->attach(pname("bob"), here.callback()));
  auto first = must(s.box->send(note("bob", "alice"))).seq;
  REQUIRE(here.reaches(1));
  must(r1->ack(first));
  quiet_period(*s.fx);
  CHECK(said.all() == std::vector<std::string>{"attached"});  // alone: nothing more is said

  auto other = must(inbox::open(s.fx->shared_transport(), s.cfg));
  auto r2 = must(other->attach(pname("bob"), there.callback()));
  REQUIRE(eventually([&] { return count("present") == 1; }));  // the first one answers
  auto second = must(s.box->send(note("bob", "alice"))).seq;
  REQUIRE(here.reaches(2));
  REQUIRE(there.reaches(1));
  must(r2->ack(second));
  REQUIRE(eventually([&] { return count("delivered") == 1 && count("settled") == 1; }));

  r2->stop();
  REQUIRE(eventually([&] { return count("detached") == 1; }));
  auto third = must(s.box->send(note("bob", "alice"))).seq;
  REQUIRE(here.reaches(3));
  must(r1->ack(third));
  quiet_period(*s.fx);
  CHECK(count("delivered") == 1);
  CHECK(count("settled") == 1);
  CHECK(there.size() == 1);
}

TEST_CASE(
    "inbox: what one gateway fetched before it heard of another's readers reaches them too, "
    "as a first delivery",
    "[inbox][several]") {
  setup s(30s);
  inbox_log here, there;
  auto r1 = must(s.box->attach(pname("bob"), here.callback()));
  auto seq = must(s.box->send(note("bob", "alice"))).seq;
  REQUIRE(here.reaches(1));  // fetched and in flight here, unacked
  auto other = must(inbox::open(s.fx->shared_transport(), s.cfg));
  auto r2 = must(other->attach(pname("bob"), there.callback()));
  REQUIRE(there.reaches(1));
  CHECK(there.at(0).seq == seq);
  CHECK(there.at(0).delivery == 1);
  CHECK(there.at(0).env == here.at(0).env);
  // Acked there: settled here too.
  must(r2->ack(seq));
  quiet_period(*s.fx);
  CHECK(code_of(r1->ack(seq)) == errc::not_found);
  CHECK(eventually([&] { return stored_messages(*s.fx, s.cfg) == 0; }));
  CHECK(here.size() == 1);
  CHECK(there.size() == 1);
}

TEST_CASE(
    "inbox: a participant read through two inbox objects (two gateways) gets every message on "
    "both, and an ack on either settles it",
    "[inbox][several]") {
  setup s(30s);
  auto other = must(inbox::open(s.fx->shared_transport(), s.cfg));
  inbox_log here, there;
  auto r1 = must(s.box->attach(pname("bob"), here.callback()));
  auto r2 = must(other->attach(pname("bob"), there.callback()));
  std::vector<std::uint64_t> seqs;
  for (int i = 1; i <= 6; ++i) {
    seqs.push_back(must(s.box->send(note("bob", "alice", fmt::format(R"({{"n":{}}})", i)))).seq);
  }
  REQUIRE(here.reaches(6));
  REQUIRE(there.reaches(6));
  // Each once on each, as a first delivery, the same envelope (the order is each gateway's
  // fetch order: two gateways fetch in turn).
  auto by_seq = [](const inbox_log& log) {
    std::map<std::uint64_t, inbox_message> out;
    for (const auto& m : log.all()) out.emplace(m.seq, m);
    return out;
  };
  auto mine = by_seq(here), theirs = by_seq(there);
  REQUIRE(mine.size() == seqs.size());
  REQUIRE(theirs.size() == seqs.size());
  for (auto seq : seqs) {
    INFO(seq);
    REQUIRE(mine.contains(seq));
    REQUIRE(theirs.contains(seq));
    CHECK(mine.at(seq).delivery == 1);
    CHECK(theirs.at(seq).delivery == 1);
    CHECK(mine.at(seq).env == theirs.at(seq).env);
  }
  // Acked on either side: settled for both (the other's ack is then not_found).
  for (std::size_t i = 0; i < seqs.size(); ++i) must((i % 2 == 0 ? r1 : r2)->ack(seqs[i]));
  quiet_period(*s.fx);  // the word from the other gateway is a core message away
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    auto& late = i % 2 == 0 ? r2 : r1;
    CHECK(code_of(late->ack(seqs[i])) == errc::not_found);
  }
  CHECK(eventually([&] { return stored_messages(*s.fx, s.cfg) == 0; }));
  // A nack on one side: delivered again to both, as delivery 2.
  auto again = must(s.box->send(note("bob", "alice"))).seq;
  REQUIRE(here.reaches(7));
  REQUIRE(there.reaches(7));
  must(r2->nack(again));
  REQUIRE(here.reaches(8));
  REQUIRE(there.reaches(8));
  CHECK(here.at(7).seq == again);
  CHECK(here.at(7).delivery == 2);
  CHECK(there.at(7).delivery == 2);
  must(r1->ack(again));
  CHECK(eventually([&] { return stored_messages(*s.fx, s.cfg) == 0; }));
  // One gateway's last reader leaving hands back nothing the other fetched.
  auto last = must(s.box->send(note("bob", "alice"))).seq;
  REQUIRE(here.reaches(9));
  REQUIRE(there.reaches(9));
  r2->stop();
  quiet_period(*s.fx);
  CHECK(here.size() == 9);
  must(r1->ack(last));
  CHECK(eventually([&] { return stored_messages(*s.fx, s.cfg) == 0; }));
}

// ----- idle consumers (inbox_idle_consumer) ------------------------------------------------

TEST_CASE(
    "inbox: a participant away longer than inbox_idle_consumer loses its consumer, "
    "not its messages",
    "[inbox][idle]") {
  setup s(30s, 64, 1s);
  auto m1 = must(s.box->send(note("bob", "alice", R"({"n":1})")));
  auto m2 = must(s.box->send(note("bob", "alice", R"({"n":2})")));
  inbox_log first;
  auto reader = must(s.box->attach(pname("bob"), first.callback()));
  REQUIRE(first.reaches(2));
  must(reader->ack(m1.seq));
  reader->stop();  // m2 is handed back, unacked
  auto m3 = must(s.box->send(note("bob", "alice", R"({"n":3})")));

  // The fetch that was out when bob left ends after 5 s; 1 s later the consumer is idle.
  if (!s.fx->real_time()) s.fx->advance(7s);
  REQUIRE(consumer_removed(*s.fx, s.cfg, "bob"));
  auto m4 = must(s.box->send(note("bob", "alice", R"({"n":4})")));
  CHECK(stored_messages(*s.fx, s.cfg) == 3);

  // Back again: everything not acked comes, once each, m1 never again. The stopped
  // reader still holds bob's mailbox, which believes the consumer exists: its first fetch
  // finds it gone and makes it again (on JetStream a pull on a missing consumer is not
  // answered, so that takes the transport's op_timeout).
  inbox_log second;
  auto again = must(s.box->attach(pname("bob"), second.callback()));
  REQUIRE(second.reaches(3, 20s));
  CHECK(has_consumer(*s.fx, s.cfg, "bob"));
  std::vector<std::uint64_t> seqs;
  for (const auto& m : second.all()) seqs.push_back(m.seq);
  CHECK(seqs == std::vector<std::uint64_t>{m2.seq, m3.seq, m4.seq});
  CHECK(second.at(1).env.body == R"({"n":3})");
  for (auto seq : seqs) must(again->ack(seq));
  CHECK(eventually([&] { return stored_messages(*s.fx, s.cfg) == 0; }));
  quiet_period(*s.fx);
  CHECK(second.size() == 3);
  CHECK(first.size() == 2);
}

TEST_CASE("inbox: a reader whose consumer was removed under it gets it made again",
          "[inbox][idle]") {
  // The window is full (one message, not acked), so no fetch is out: the consumer idles
  // while the reader is attached and the mailbox believes it exists.
  setup s(30s, 1, 1s);
  auto m1 = must(s.box->send(note("bob", "alice", R"({"n":1})")));
  auto m2 = must(s.box->send(note("bob", "alice", R"({"n":2})")));
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  REQUIRE(log.reaches(1));
  CHECK(log.at(0).seq == m1.seq);
  if (!s.fx->real_time()) s.fx->advance(1s);
  REQUIRE(consumer_removed(*s.fx, s.cfg, "bob"));

  // The ack cannot reach the consumer that delivered m1: it says so, and the mailbox makes
  // the consumer again, which delivers m1 afresh.
  std::atomic<int> acked{-1};
  reader->async_ack(m1.seq, [&](result<void> r) { acked = static_cast<int>(code_of(r)); });
  CHECK(eventually([&] { return acked.load() == static_cast<int>(errc::not_found); }));
  REQUIRE(log.reaches(2));
  CHECK(log.at(1).seq == m1.seq);
  CHECK(has_consumer(*s.fx, s.cfg, "bob"));
  must(reader->ack(m1.seq));
  REQUIRE(log.reaches(3));
  CHECK(log.at(2).seq == m2.seq);
  must(reader->ack(m2.seq));
  CHECK(eventually([&] { return stored_messages(*s.fx, s.cfg) == 0; }));
  quiet_period(*s.fx);
  CHECK(log.size() == 3);
}

TEST_CASE("inbox: a participant with nothing to read has no fetch out until a message comes for it",
          "[inbox][idle]") {
  auto fx = make_fixture();
  auto cfg = config_for(*fx);
  cfg.inbox_ack_wait = 30s;
  auto counted = std::make_shared<faulty_transport>(fx->shared_transport());
  std::atomic<int> fetches{0};
  counted->set_fault([&](std::string_view op, std::string_view) -> std::optional<error> {
    if (op == "fetch") ++fetches;
    return std::nullopt;
  });
  auto box = must(inbox::open(counted, cfg));
  inbox_log log;
  auto reader = must(box->attach(pname("bob"), log.callback()));
  // Fetches wait 5 s. The first that finds nothing has the inbox listen for stored
  // messages; one made once it listens parks the loop: then no fetch is out.
  auto parks = [&] {
    for (int i = 0; i < 4; ++i) {
      const int before = fetches.load();
      fx->advance(5s);
      quiet_period(*fx);
      if (fetches.load() == before) return true;
    }
    return false;
  };
  REQUIRE(parks());
  int n = fetches.load();
  CHECK(n >= 2);
  if (!fx->real_time()) {
    fx->advance(100s);
    CHECK(fetches.load() == n);
  }

  // A message stored for bob, here by another inbox object (another gateway), wakes it.
  auto other = must(inbox::open(fx->shared_transport(), cfg));
  auto sent = must(other->send(note("bob", "alice")));
  REQUIRE(log.reaches(1));
  CHECK(log.at(0).seq == sent.seq);
  // The fetch it woke, and the next one, made while the message is in flight.
  CHECK(eventually([&] { return fetches.load() == n + 2; }));
  must(reader->ack(sent.seq));
  fx->advance(5s);
  quiet_period(*fx);
  CHECK(fetches.load() == n + 2);

  // One for somebody else does not; look_again does (as after a cut from the backend).
  must(other->send(note("carol", "alice")));
  quiet_period(*fx);
  CHECK(fetches.load() == n + 2);
  box->look_again();
  CHECK(eventually([&] { return fetches.load() == n + 3; }));
  fx->advance(5s);
  quiet_period(*fx);
  CHECK(fetches.load() == n + 3);

  // Parked, it looks again once the acked message's ack wait has passed (the ack may have
  // been lost, and the redelivery is announced by nothing stored), then every 2 minutes.
  if (!fx->real_time()) {
    fx->advance(19s);  // 29 s after the delivery
    CHECK(fetches.load() == n + 3);
    fx->advance(4s);
    CHECK(fetches.load() == n + 4);
    fx->advance(5s);
    fx->advance(115s);
    CHECK(fetches.load() == n + 4);
    fx->advance(10s);
    CHECK(fetches.load() == n + 5);
  }
  CHECK(log.size() == 1);
}

TEST_CASE("inbox: a parked participant gets a message nacked with a delay when the delay ends",
          "[inbox][idle]") {
  setup s(30s);
  auto sent = must(s.box->send(note("bob", "alice")));
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  REQUIRE(log.reaches(1));
  must(reader->nack(sent.seq, 8s));
  // The loop's fetches find nothing meanwhile, so it parks before the delay ends.
  s.fx->advance(7s);
  CHECK(log.size() == 1);
  s.fx->advance(2s);
  REQUIRE(log.reaches(2, 5s));
  CHECK(log.at(1).seq == sent.seq);
  CHECK(log.at(1).delivery == 2);
  must(reader->ack(sent.seq));
}

TEST_CASE("inbox: an attached reader with nothing to read keeps its consumer", "[inbox][idle]") {
  setup s(30s, 64, 1s);
  inbox_log log;
  auto reader = must(s.box->attach(pname("bob"), log.callback()));
  // Six idle times, and the reader's fetch (5 s) has been issued again once.
  s.fx->advance(6s);
  CHECK(has_consumer(*s.fx, s.cfg, "bob"));
  auto sent = must(s.box->send(note("bob", "alice")));
  REQUIRE(log.reaches(1));
  CHECK(log.at(0).seq == sent.seq);
  must(reader->ack(sent.seq));
  CHECK(eventually([&] { return stored_messages(*s.fx, s.cfg) == 0; }));
  CHECK(has_consumer(*s.fx, s.cfg, "bob"));
}

}  // namespace amp::broker_testing
