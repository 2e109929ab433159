// Fault injection on JetStream (spec §4, §5, §7, §13): streams of tasks and inbox messages
// run through real amp-servers on a real nats-server (or a 3-node cluster) while a process is
// killed with SIGKILL, stopped with SIGSTOP past a lease, or restarted. The clients behave as
// a careful user's would: they reconnect when their server dies, resubmit with the same
// idempotency key and resend with the same msg_id when they were not answered, complete with
// the attempt their claim returned, and ack what they receive. Each case counts what was
// acknowledged and what arrived, prints the tallies, and asserts that nothing acknowledged is
// lost, that no task is completed twice and that every submitter is told.

#include <catch2/catch.hpp>

#include <nats/nats.h>
#include <simdjson.h>

#include <websocketpp/config/asio_no_tls_client.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "amp/gateway/auth.hpp"
#include "amp/json.hpp"
#include "server/server_process.hpp"
#include "server/ws_client.hpp"
#include "support/checks.hpp"
#include "support/leader_probe.hpp"
#include "support/nats_server.hpp"

namespace {

using namespace std::chrono_literals;
using amp::testing::eventually;
using amp::testing::http_get;
using amp::testing::leader_probe;
using amp::testing::nats_cluster;
using amp::testing::nats_server;
using amp::testing::server_process;
using amp::testing::temp_dir;
using steady = std::chrono::steady_clock;
using ws = amp::testing::ws_client<websocketpp::config::asio_client>;

constexpr const char* k_secret = "fault-test-secret-of-at-least-32-bytes";
constexpr const char* k_ns = "demo";
constexpr const char* k_job = "crunch";
constexpr const char* k_listener = "l1";

std::string token(const std::string& participant, const std::string& grants) {
  amp::token_claims claims{.sub = participant,
                           .ns = k_ns,
                           .exp = std::chrono::system_clock::now() + std::chrono::hours(1),
                           .amp_json = grants};
  return amp::mint_token(claims, amp::jwt_alg::hs256, k_secret).value();
}

std::string producer_grants() {
  return std::string(R"({"submit":[")") + k_job + R"("]})";
}
std::string worker_grants() {
  return std::string(R"({"work":[")") + k_job + R"("]})";
}
std::string sender_grants() {
  return std::string(R"({"send":[")") + k_listener + R"("]})";
}

/// The configuration file of the amp-servers of a case: `nats` at `url` with `replicas`,
/// every job with a lease of `lease_s` and room for many attempts, in-flight inbox messages
/// back after 2 s.
std::vector<std::string> server_args(const temp_dir& dir, const std::string& url, int replicas,
                                     int lease_s) {
  std::ostringstream config;
  config << R"({"nats": {"url": )" << amp::json_quote(url) << R"(, "replicas": )" << replicas
         << R"(}, "inbox_ack_s": 2, "jobs": {"*": {"lease_s": )" << lease_s
         << R"(, "max_attempts": 100, "decline_delay_ms": 100}}})";
  const auto file = dir.write("amp-server.json", config.str());
  return {"--config", file.string(), "--secret", k_secret};
}

/// What the tests read from a server frame.
struct frame {
  std::string op;
  std::optional<std::int64_t> id;
  std::string code;  // of an error
  std::string task;  // "task" when a string, or the record's id in a `task` reply
  std::int64_t attempt = -1;
  bool created = false;
  bool duplicate = false;
  std::int64_t seq = -1;
  std::int64_t delivery = -1;
  std::string state;  // "state", or the record's state in a `task` reply
  struct {
    std::string id, from, type, body_task, body_state;
    std::int64_t body_attempt = -1;
  } envelope;
  std::string text;

  bool is_reply() const { return op == "ok" || op == "error"; }
};

frame parse(simdjson::dom::parser& parser, std::string text) {
  frame f;
  simdjson::dom::element doc;
  if (parser.parse(text).get(doc) != simdjson::SUCCESS) {
    f.op = "(not JSON)";
    f.text = std::move(text);
    return f;
  }
  const auto str = [](simdjson::dom::element e, const char* key, std::string& out) {
    std::string_view v;
    if (e[key].get(v) == simdjson::SUCCESS) out = std::string(v);
  };
  const auto integer = [](simdjson::dom::element e, const char* key, std::int64_t& out) {
    std::int64_t v = 0;
    if (e[key].get(v) == simdjson::SUCCESS) out = v;
  };
  const auto boolean = [](simdjson::dom::element e, const char* key, bool& out) {
    bool v = false;
    if (e[key].get(v) == simdjson::SUCCESS) out = v;
  };
  str(doc, "op", f.op);
  std::int64_t id = 0;
  if (doc["id"].get(id) == simdjson::SUCCESS) f.id = id;
  str(doc, "code", f.code);
  simdjson::dom::element task;
  if (doc["task"].get(task) == simdjson::SUCCESS) {
    if (task.is_string()) {
      str(doc, "task", f.task);
    } else if (task.is_object()) {
      str(task, "task", f.task);
      str(task, "state", f.state);
      integer(task, "attempt", f.attempt);
    }
  }
  integer(doc, "attempt", f.attempt);
  boolean(doc, "created", f.created);
  boolean(doc, "duplicate", f.duplicate);
  integer(doc, "seq", f.seq);
  integer(doc, "delivery", f.delivery);
  str(doc, "state", f.state);
  simdjson::dom::element envelope;
  if (doc["envelope"].get(envelope) == simdjson::SUCCESS) {
    str(envelope, "id", f.envelope.id);
    str(envelope, "from", f.envelope.from);
    str(envelope, "type", f.envelope.type);
    simdjson::dom::element body;
    if (envelope["body"].get(body) == simdjson::SUCCESS) {
      str(body, "task", f.envelope.body_task);
      str(body, "state", f.envelope.body_state);
      integer(body, "attempt", f.envelope.body_attempt);
    }
  }
  f.text = std::move(text);
  return f;
}

/// One amp.v1 session over WebSocket, used from one thread: requests with an `id` are
/// answered in order of need, and what the server pushes (offers, messages, lease_lost…)
/// waits in a queue. A session whose connection closed, or whose request went unanswered,
/// is broken: the caller opens a new one.
class session {
 public:
  explicit session(const std::string& url) : ws_(url, {"amp.v1"}) {}
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  /// Connects to `url` and says hello as `participant` (again while the backend is
  /// `unavailable`); nothing when the server is not there or does not accept within `limit`.
  static std::unique_ptr<session> open(const std::string& url, const std::string& participant,
                                       const std::string& grants,
                                       std::chrono::milliseconds limit = 5s) {
    const auto deadline = steady::now() + limit;
    auto s = std::make_unique<session>(url);
    if (!s->ws_.wait_open(limit)) return nullptr;
    const std::string hello =
        R"({"op":"hello","token":)" + amp::json_quote(token(participant, grants)) + "}";
    while (steady::now() < deadline) {
      auto r = s->request(hello, limit);
      if (!r) return nullptr;
      if (r->op == "ok") return s;
      if (r->code != "unavailable") return nullptr;
      std::this_thread::sleep_for(100ms);
    }
    return nullptr;
  }

  /// Sends `json` (an object) with a fresh `id` and waits for its reply; nothing (and the
  /// session is broken) when the connection closes or `limit` passes first.
  std::optional<frame> request(const std::string& json, std::chrono::milliseconds limit = 20s) {
    const std::int64_t id = next_id_++;
    if (!send("{\"id\":" + std::to_string(id) + "," + json.substr(1))) return std::nullopt;
    const auto deadline = steady::now() + limit;
    for (;;) {
      auto f = read(deadline);
      if (!f) {
        broken_ = true;
        return std::nullopt;
      }
      if (f->is_reply() && f->id == id) return f;
      keep(std::move(*f));
    }
  }

  /// Sends `json` without waiting for anything; false (and broken) when it cannot be sent.
  bool send(const std::string& json) {
    try {
      ws_.send(json);
      return true;
    } catch (const std::exception&) {
      broken_ = true;
      return false;
    }
  }

  /// The next frame the server pushed, waiting at most `limit`.
  std::optional<frame> next_push(std::chrono::milliseconds limit) {
    const auto deadline = steady::now() + limit;
    while (pushes_.empty()) {
      auto f = read(deadline);
      if (!f) return std::nullopt;
      keep(std::move(*f));
    }
    auto f = std::move(pushes_.front());
    pushes_.pop_front();
    return f;
  }

  bool broken() const { return broken_; }
  /// Errors that answered no request of ours (e.g. an `ack` sent without `id`), by code.
  const std::map<std::string, int>& stray_errors() const { return stray_; }

 private:
  std::optional<frame> read(steady::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
    auto text = ws_.next(std::max(left, 0ms));
    if (!text) {
      if (ws_.wait_closed(0ms) || ws_.failed()) broken_ = true;
      return std::nullopt;
    }
    return parse(parser_, std::move(*text));
  }
  void keep(frame f) {
    if (f.is_reply()) {
      // The late answer of a request given up on, or an error without `id`.
      if (f.op == "error") ++stray_[f.code];
      return;
    }
    pushes_.push_back(std::move(f));
  }

  ws ws_;
  simdjson::dom::parser parser_;
  std::deque<frame> pushes_;
  std::map<std::string, int> stray_;
  std::int64_t next_id_ = 1;
  bool broken_ = false;
};

/// What the clients of a fleet did and saw. Guarded by `mu`.
struct tallies {
  mutable std::mutex mu;

  // Tasks.
  std::map<std::string, std::string> task_of_key;  // idempotency key -> task
  std::map<std::string, std::string> submitter;    // task -> producer
  int submit_oks = 0;                              // ok replies to submit
  int resubmits = 0;           // submits sent again (unanswered, or unavailable)
  int submit_unavailable = 0;  // submits answered unavailable
  int created_false = 0;       // ok with "created":false (each after a retry)
  int offers = 0;
  int claims = 0;          // claims answered ok
  int claims_refused = 0;  // not_found or conflict: the offer had moved on
  int claim_unavailable = 0;
  int claims_unanswered = 0;  // the connection went while a claim was out
  std::map<std::string, std::vector<std::int64_t>> completed;  // task -> attempts completed
                                                               // with ok, not duplicate
  std::map<std::string, int> completed_again;  // task -> "duplicate":true after a retry of
                                               // an unanswered or unavailable complete
  int complete_unavailable = 0;
  int complete_unanswered = 0;
  int complete_lease_lost = 0;
  int lease_lost_pushes = 0;
  std::map<std::string, int> completes_by_worker;             // ok, not duplicate
  std::map<std::string, int> registrations;                   // worker -> `register`s answered ok
  std::map<std::string, std::set<std::int64_t>> notice_seqs;  // task -> seqs of its notices
  std::map<std::string, int> notices;                         // task -> notices delivered
  std::set<std::string> failed;                               // tasks with a failed notice

  // Inbox messages.
  std::map<std::string, std::int64_t> sent;  // msg_id -> seq of the first ok
  int send_oks = 0;
  int resends = 0;
  int send_unavailable = 0;
  int sent_twice = 0;  // a resend answered with another seq than an earlier ok
  std::map<std::string, std::set<std::int64_t>> received;  // msg_id -> seqs delivered
  int deliveries = 0;

  int reconnects = 0;
  std::map<std::string, int> stray_errors;
  std::vector<std::string> unexpected;  // anything a careful client would not expect

  /// What the clients saw of each task, with the time since the tallies began: printed for
  /// the tasks that went wrong. Call with `mu` held.
  void event(const std::string& task, const std::string& what) {
    const auto at = std::chrono::duration<double>(steady::now() - started).count();
    std::ostringstream line;
    line.precision(3);
    line << std::fixed << at << " " << what;
    events[task].push_back(line.str());
  }
  std::map<std::string, std::vector<std::string>> events;
  steady::time_point started = steady::now();

  void note(const std::string& what) {
    std::lock_guard lock(mu);
    if (unexpected.size() < 50) unexpected.push_back(what);
  }
};

/// Derived counts, for the report and the assertions.
struct summary {
  int submitted = 0;         // distinct tasks acknowledged by ok
  int completed = 0;         // tasks with exactly one ok, not duplicate, complete
  int completed_twice = 0;   // tasks with more than one
  int completed_unseen = 0;  // no ok seen, but "duplicate":true after an unanswered retry
  int never_completed = 0;   // neither
  int notified = 0;          // distinct tasks with a completion notice
  int not_notified = 0;
  int notice_redeliveries = 0;   // notices delivered again with a seq already seen
  int notices_stored_twice = 0;  // tasks whose notice came with two different seqs
  int notices_unknown = 0;       // notices of tasks nobody saw acknowledged
  int failed = 0;
  int messages_sent = 0;      // distinct msg_ids acknowledged by ok
  int messages_received = 0;  // of those, received at least once
  int messages_lost = 0;
  int message_redeliveries = 0;
  int messages_stored_twice = 0;  // msg_ids delivered with two different seqs

  std::string text;
};

summary summarize(const tallies& t, const std::string& title) {
  std::lock_guard lock(t.mu);
  summary s;
  s.submitted = static_cast<int>(t.submitter.size());
  for (const auto& [task, who] : t.submitter) {
    const auto c = t.completed.find(task);
    const std::size_t n = c == t.completed.end() ? 0 : c->second.size();
    if (n == 1) ++s.completed;
    if (n > 1) ++s.completed_twice;
    if (n == 0 && t.completed_again.count(task)) ++s.completed_unseen;
    if (n == 0 && !t.completed_again.count(task)) ++s.never_completed;
    if (t.notices.count(task)) {
      ++s.notified;
    } else {
      ++s.not_notified;
    }
  }
  for (const auto& [task, seqs] : t.notice_seqs) {
    if (!t.submitter.count(task)) ++s.notices_unknown;
    if (seqs.size() > 1) ++s.notices_stored_twice;
    s.notice_redeliveries += t.notices.at(task) - static_cast<int>(seqs.size());
  }
  s.failed = static_cast<int>(t.failed.size());
  s.messages_sent = static_cast<int>(t.sent.size());
  int received_deliveries = 0;
  for (const auto& [id, seqs] : t.received) {
    if (seqs.size() > 1) ++s.messages_stored_twice;
    received_deliveries += static_cast<int>(seqs.size());
  }
  s.message_redeliveries = t.deliveries - received_deliveries;
  for (const auto& [id, seq] : t.sent) {
    if (t.received.count(id)) {
      ++s.messages_received;
    } else {
      ++s.messages_lost;
    }
  }

  std::ostringstream out;
  out << "fault tallies: " << title << "\n"
      << "  tasks: submitted " << s.submitted << " (submit ok " << t.submit_oks << ", resubmitted "
      << t.resubmits << ", unavailable " << t.submit_unavailable << ", created:false "
      << t.created_false << ")\n"
      << "         offers " << t.offers << ", claims ok " << t.claims << ", refused "
      << t.claims_refused << ", unavailable " << t.claim_unavailable << ", unanswered "
      << t.claims_unanswered << "\n"
      << "         completed " << s.completed << ", completed twice " << s.completed_twice
      << ", completed with the ok unseen (duplicate:true on retry) " << s.completed_unseen
      << ", never completed " << s.never_completed << "\n"
      << "         complete unanswered " << t.complete_unanswered << ", unavailable "
      << t.complete_unavailable << ", lease_lost " << t.complete_lease_lost
      << "; lease_lost pushes " << t.lease_lost_pushes << "\n"
      << "         failed " << s.failed << "; notified " << s.notified << ", not notified "
      << s.not_notified << ", notices redelivered (same seq) " << s.notice_redeliveries
      << ", notices stored twice (another seq) " << s.notices_stored_twice
      << ", notices of unknown tasks " << s.notices_unknown << "\n"
      << "  messages: sent " << s.messages_sent << " (send ok " << t.send_oks << ", resent "
      << t.resends << ", unavailable " << t.send_unavailable << ", resend stored again "
      << t.sent_twice << "), received " << s.messages_received << ", lost " << s.messages_lost
      << ", deliveries " << t.deliveries << ", redelivered (same seq) " << s.message_redeliveries
      << ", stored twice (another seq) " << s.messages_stored_twice << "\n"
      << "  clients: reconnects " << t.reconnects << ", registrations";
  for (const auto& [w, n] : t.registrations) out << " " << w << "=" << n;
  out << ", completes by worker";
  for (const auto& [w, n] : t.completes_by_worker) out << " " << w << "=" << n;
  out << ", stray errors";
  for (const auto& [code, n] : t.stray_errors) out << " " << code << "=" << n;
  out << "\n";
  for (const auto& u : t.unexpected) out << "  unexpected: " << u << "\n";
  int shown = 0;
  for (const auto& [task, who] : t.submitter) {
    const auto c = t.completed.find(task);
    const std::size_t n = c == t.completed.end() ? 0 : c->second.size();
    const bool done = n == 1 || (n == 0 && t.completed_again.count(task));
    if ((done && t.notices.count(task)) || shown++ >= 5) continue;
    out << "  what the clients saw of " << task << ":\n";
    if (const auto ev = t.events.find(task); ev != t.events.end())
      for (const auto& e : ev->second) out << "    " << e << "\n";
  }
  s.text = out.str();
  return s;
}

struct fleet_options {
  int producers = 2;
  int workers = 3;
  int senders = 1;
  std::chrono::milliseconds submit_pace = 5ms;  // between a producer's submits
  std::chrono::milliseconds send_pace = 10ms;   // between a sender's sends
  std::chrono::milliseconds work_time = 0ms;    // between claim and complete
  std::chrono::seconds lease{3};                // the job's lease_s
};

/// Producers, workers, senders and one listener, each on its own thread with its own
/// session, spread over `urls` and moving to the next URL when their server goes.
class fleet {
 public:
  fleet(std::vector<std::string> urls, fleet_options o) : urls_(std::move(urls)), o_(o) {
    for (int i = 1; i <= o_.producers; ++i) threads_.emplace_back([this, i] { producer(i); });
    for (int i = 1; i <= o_.workers; ++i) threads_.emplace_back([this, i] { worker(i); });
    for (int i = 1; i <= o_.senders; ++i) threads_.emplace_back([this, i] { sender(i); });
    threads_.emplace_back([this] { listener(); });
  }
  ~fleet() { stop(); }
  fleet(const fleet&) = delete;
  fleet& operator=(const fleet&) = delete;

  /// Tasks completed (ok, not duplicate) so far.
  int completed() const { return completed_; }
  /// Waits until `n` more tasks than now have been completed, at most `limit`.
  bool progress(int n, std::chrono::milliseconds limit) {
    const int target = completed_ + n;
    return eventually(
        limit, [&] { return completed_ >= target; }, 10ms);
  }
  std::map<std::string, int> completes_by_worker() const {
    std::lock_guard lock(t.mu);
    return t.completes_by_worker;
  }

  /// Producers and senders stop starting new tasks and messages (each finishes the one it
  /// has begun); producers keep reading their notices and workers keep working.
  void stop_producing() { producing_ = false; }
  /// Producers and senders wait (true) or go on (false); workers and listeners go on.
  void pause_producing(bool paused) { paused_ = paused; }
  /// While on, a worker that claims a task holds the lease (heartbeating) instead of
  /// completing it; it completes once this is off. holding(): the workers doing so.
  void hold_leases(bool on) { hold_ = on; }
  int holding() const { return holding_; }
  /// Waits (at most `limit`) until every producer and sender has finished, every task
  /// acknowledged has its completion notice and every message acknowledged was received.
  bool drain(std::chrono::milliseconds limit) {
    return eventually(limit, [&] {
      if (producers_done_ < o_.producers || senders_done_ < o_.senders) return false;
      std::lock_guard lock(t.mu);
      for (const auto& [task, who] : t.submitter)
        if (!t.notices.count(task)) return false;
      for (const auto& [id, seq] : t.sent)
        if (!t.received.count(id)) return false;
      return true;
    });
  }
  void stop() {
    producing_ = false;
    running_ = false;
    for (auto& th : threads_)
      if (th.joinable()) th.join();
  }

  tallies t;

 private:
  /// A session with `name` on the first of the servers (from `next` on) that accepts it.
  std::unique_ptr<session> connect(std::size_t& next, const std::string& name,
                                   const std::string& grants, bool& first) {
    const auto started = steady::now();
    bool complained = false;
    while (running_) {
      const auto& url = urls_[next++ % urls_.size()];
      if (auto s = session::open(url, name, grants)) {
        if (!first) {
          std::lock_guard lock(t.mu);
          ++t.reconnects;
        }
        first = false;
        return s;
      }
      if (!complained && steady::now() - started > 30s) {
        t.note(name + ": no server accepted it for 30 s");
        complained = true;
      }
      std::this_thread::sleep_for(50ms);
    }
    return nullptr;
  }

  void close(std::unique_ptr<session>& s) {
    if (!s) return;
    std::lock_guard lock(t.mu);
    for (const auto& [code, n] : s->stray_errors()) t.stray_errors[code] += n;
    s.reset();
  }

  /// A notice or a message: recorded, then acked.
  void on_message(session& s, const std::string& name, const frame& f) {
    s.send(R"({"op":"ack","seq":)" + std::to_string(f.seq) + "}");
    std::lock_guard lock(t.mu);
    if (name == k_listener) {
      ++t.deliveries;
      t.received[f.envelope.id].insert(f.seq);
      return;
    }
    if (f.envelope.from != "$broker") {
      if (t.unexpected.size() < 50) t.unexpected.push_back(name + " got " + f.text);
      return;
    }
    const auto& task = f.envelope.body_task;
    t.event(task, name + " notice " + f.envelope.type + " seq " + std::to_string(f.seq) +
                      " delivery " + std::to_string(f.delivery));
    if (f.envelope.type == "amp.task.completed" && f.envelope.body_state == "completed") {
      ++t.notices[task];
      t.notice_seqs[task].insert(f.seq);
      const auto who = t.submitter.find(task);
      if (who != t.submitter.end() && who->second != name && t.unexpected.size() < 50)
        t.unexpected.push_back(name + " was told of " + task + " of " + who->second);
    } else if (f.envelope.type == "amp.task.failed") {
      t.failed.insert(task);
    } else if (t.unexpected.size() < 50) {
      t.unexpected.push_back(name + " got the notice " + f.text);
    }
  }

  void producer(int i) {
    const std::string name = "p" + std::to_string(i);
    std::size_t next = static_cast<std::size_t>(i);
    bool first = true;
    std::unique_ptr<session> s;
    const auto ensure = [&] {
      if (s && !s->broken()) return true;
      close(s);
      s = connect(next, name, producer_grants(), first);
      return s != nullptr;
    };
    const auto take_pushes = [&](std::chrono::milliseconds limit) {
      while (auto f = s->next_push(limit)) {
        if (f->op == "message") on_message(*s, name, *f);
        limit = 0ms;
      }
    };
    for (int k = 0; running_ && producing_; ++k) {
      hold();
      const std::string key = name + "-" + std::to_string(k);
      const std::string submit = R"({"op":"submit","job":")" + std::string(k_job) +
                                 R"(","idempotency_key":")" + key +
                                 R"(","max_attempts":100,"body":{"key":")" + key + R"("}})";
      int tries = 0;
      while (running_) {
        if (!ensure()) break;
        if (tries++ > 0) {
          std::lock_guard lock(t.mu);
          ++t.resubmits;
        }
        auto r = s->request(submit);
        if (!r) continue;  // unanswered: the task may exist; the same key finds it
        if (r->op == "ok") {
          std::lock_guard lock(t.mu);
          ++t.submit_oks;
          if (!r->created) ++t.created_false;
          auto [bound, fresh] = t.task_of_key.emplace(key, r->task);
          if (!fresh && bound->second != r->task && t.unexpected.size() < 50)
            t.unexpected.push_back(key + " named " + bound->second + " and " + r->task);
          t.submitter.emplace(r->task, name);
          t.event(r->task, name + " submit " + key + " ok, created " +
                               (r->created ? "true" : "false") + ", try " + std::to_string(tries));
          if (!r->created && tries == 1 && t.unexpected.size() < 50)
            t.unexpected.push_back("created:false on a first submit: " + r->text);
          break;
        }
        if (r->code == "unavailable") {
          std::lock_guard lock(t.mu);
          ++t.submit_unavailable;
        } else {
          t.note(name + " submit: " + r->text);
        }
        std::this_thread::sleep_for(100ms);
      }
      if (s && !s->broken()) take_pushes(0ms);
      std::this_thread::sleep_for(o_.submit_pace);
    }
    ++producers_done_;
    while (running_) {
      if (!ensure()) break;
      take_pushes(100ms);
    }
    close(s);
  }

  void worker(int i) {
    const std::string name = "w" + std::to_string(i);
    const std::string register_frame =
        R"({"op":"register","jobs":[")" + std::string(k_job) + R"("],"slots":1})";
    std::size_t next = static_cast<std::size_t>(i);
    bool first = true;
    std::unique_ptr<session> s;
    // A session, registered: after every new connection, never otherwise.
    const auto ensure = [&] {
      while (running_) {
        if (s && !s->broken()) return true;
        close(s);
        s = connect(next, name, worker_grants(), first);
        if (!s) return false;
        for (;;) {
          auto r = s->request(register_frame);
          if (!r) break;
          if (r->op == "ok") {
            std::lock_guard lock(t.mu);
            ++t.registrations[name];
            return true;
          }
          if (r->code != "unavailable") {
            t.note(name + " register: " + r->text);
            break;
          }
          std::this_thread::sleep_for(100ms);
        }
      }
      return false;
    };
    auto last_heartbeat = steady::now();
    while (running_) {
      if (!ensure()) break;
      if (steady::now() - last_heartbeat >= 1s) {
        last_heartbeat = steady::now();
        auto r = s->request(R"({"op":"heartbeat"})");
        if (r && r->op == "error" && r->code != "unavailable")
          t.note(name + " heartbeat: " + r->text);
        continue;
      }
      auto f = s->next_push(100ms);
      if (!f) continue;
      if (f->op == "lease_lost") {
        std::lock_guard lock(t.mu);
        ++t.lease_lost_pushes;
        continue;
      }
      if (f->op != "offer") continue;  // presence and the like
      const std::string task = f->task;
      {
        std::lock_guard lock(t.mu);
        ++t.offers;
        t.event(task, name + " offer attempt " + std::to_string(f->attempt));
      }
      const auto offered_at = steady::now();
      std::int64_t attempt = -1;
      for (;;) {
        auto r = s->request(R"({"op":"claim","task":")" + task + R"("})");
        bool again = false;
        {
          std::lock_guard lock(t.mu);
          t.event(task, name + " claim: " +
                            (!r              ? std::string("no answer")
                             : r->op == "ok" ? "ok attempt " + std::to_string(r->attempt)
                                             : r->code));
          if (!r) {
            ++t.claims_unanswered;  // if it was made, its lease runs out
          } else if (r->op == "ok") {
            ++t.claims;
            attempt = r->attempt;
          } else if (r->code == "not_found" || r->code == "conflict") {
            ++t.claims_refused;
          } else if (r->code == "unavailable") {
            ++t.claim_unavailable;
            again = steady::now() - offered_at < o_.lease;  // until the offer lapses
          } else if (t.unexpected.size() < 50) {
            t.unexpected.push_back(name + " claim: " + r->text);
          }
        }
        if (!again) break;
        std::this_thread::sleep_for(100ms);
      }
      if (attempt < 0) continue;
      if (hold_) {
        ++holding_;
        while (hold_ && running_ && !s->broken()) {
          if (steady::now() - last_heartbeat >= 1s) {
            last_heartbeat = steady::now();
            s->request(R"({"op":"heartbeat"})");
          }
          if (auto p = s->next_push(100ms); p && p->op == "lease_lost") {
            std::lock_guard lock(t.mu);
            ++t.lease_lost_pushes;
          }
        }
        --holding_;
      }
      if (o_.work_time > 0ms) std::this_thread::sleep_for(o_.work_time);
      const std::string complete = R"({"op":"complete","task":")" + task + R"(","attempt":)" +
                                   std::to_string(attempt) + R"(,"result":{"by":")" + name +
                                   R"("}})";
      bool retried = false;  // after an unanswered or unavailable complete
      while (running_ && ensure()) {
        auto r = s->request(complete);
        bool again = false;
        {
          std::lock_guard lock(t.mu);
          t.event(task, name + " complete attempt " + std::to_string(attempt) + ": " +
                            (!r              ? std::string("no answer")
                             : r->op == "ok" ? (r->duplicate ? "ok duplicate" : "ok")
                                             : r->code));
          if (!r) {
            ++t.complete_unanswered;
            again = true;
          } else if (r->op == "ok" && !r->duplicate) {
            t.completed[task].push_back(attempt);
            ++t.completes_by_worker[name];
            ++completed_;
          } else if (r->op == "ok") {
            if (retried) {
              ++t.completed_again[task];
            } else if (t.unexpected.size() < 50) {
              t.unexpected.push_back(name + " complete, first try: " + r->text);
            }
          } else if (r->code == "lease_lost") {
            ++t.complete_lease_lost;  // it is offered again
          } else if (r->code == "unavailable") {
            ++t.complete_unavailable;
            again = true;
          } else if (t.unexpected.size() < 50) {
            t.unexpected.push_back(name + " complete: " + r->text);
          }
        }
        if (!again) break;
        retried = true;
        if (r) std::this_thread::sleep_for(100ms);
      }
    }
    close(s);
  }

  void sender(int i) {
    const std::string name = "s" + std::to_string(i);
    std::size_t next = static_cast<std::size_t>(i);
    bool first = true;
    std::unique_ptr<session> s;
    for (int k = 0; running_ && producing_; ++k) {
      hold();
      const std::string msg_id = name + "-" + std::to_string(k);
      const std::string send = R"({"op":"send","to":")" + std::string(k_listener) +
                               R"(","msg_id":")" + msg_id + R"(","body":{"n":)" +
                               std::to_string(k) + "}}";
      bool retried = false;
      while (running_) {
        if (!s || s->broken()) {
          close(s);
          s = connect(next, name, sender_grants(), first);
          if (!s) break;
        }
        if (retried) {
          std::lock_guard lock(t.mu);
          ++t.resends;
        }
        auto r = s->request(send);
        retried = true;
        if (!r) continue;
        {
          std::lock_guard lock(t.mu);
          if (r->op == "ok") {
            ++t.send_oks;
            auto [first_ok, fresh] = t.sent.emplace(msg_id, r->seq);
            if (!fresh && first_ok->second != r->seq) ++t.sent_twice;
            break;
          }
          if (r->code == "unavailable") {
            ++t.send_unavailable;
          } else if (t.unexpected.size() < 50) {
            t.unexpected.push_back(name + " send: " + r->text);
          }
        }
        std::this_thread::sleep_for(100ms);
      }
      std::this_thread::sleep_for(o_.send_pace);
    }
    ++senders_done_;
    close(s);
  }

  void listener() {
    std::size_t next = 0;
    bool first = true;
    std::unique_ptr<session> s;
    while (running_) {
      if (!s || s->broken()) {
        close(s);
        s = connect(next, k_listener, "", first);
        if (!s) break;
      }
      if (auto f = s->next_push(100ms); f && f->op == "message") on_message(*s, k_listener, *f);
    }
    close(s);
  }

  std::vector<std::string> urls_;
  fleet_options o_;
  std::atomic<bool> producing_{true};
  std::atomic<bool> paused_{false};

  void hold() const {
    while (paused_ && running_) std::this_thread::sleep_for(10ms);
  }
  std::atomic<bool> running_{true};
  std::atomic<int> producers_done_{0};
  std::atomic<int> senders_done_{0};
  std::atomic<int> completed_{0};
  std::atomic<bool> hold_{false};
  std::atomic<int> holding_{0};
  std::vector<std::thread> threads_;
};

/// The task records (the `task` op, asked by each submitter): how many say `completed`,
/// with the attempt that was completed when the worker saw its ok. Those not read within
/// `limit` count as `other`.
struct records {
  int completed = 0;
  int other = 0;
  int wrong_attempt = 0;
  std::vector<std::string> examples;
};

records check_records(const std::vector<std::string>& urls, const tallies& t,
                      std::chrono::milliseconds limit = 30s) {
  std::map<std::string, std::vector<std::string>> by_submitter;
  std::map<std::string, std::int64_t> attempt_of;
  {
    std::lock_guard lock(t.mu);
    for (const auto& [task, who] : t.submitter) by_submitter[who].push_back(task);
    for (const auto& [task, attempts] : t.completed)
      if (attempts.size() == 1) attempt_of[task] = attempts.front();
  }
  records out;
  const auto deadline = steady::now() + limit;
  std::size_t next = 0;
  for (const auto& [who, tasks] : by_submitter) {
    std::unique_ptr<session> s;
    for (const auto& task : tasks) {
      std::optional<frame> r;
      for (int tries = 0; tries < 3 && !(r && r->op == "ok") && steady::now() < deadline; ++tries) {
        if (!s || s->broken()) s = session::open(urls[next++ % urls.size()], who, "");
        if (s) r = s->request(R"({"op":"task","task":")" + task + R"("})", 5s);
      }
      if (r && r->op == "ok" && r->state == "completed") {
        ++out.completed;
        const auto a = attempt_of.find(task);
        if (a != attempt_of.end() && a->second != r->attempt) {
          ++out.wrong_attempt;
          if (out.examples.size() < 5) out.examples.push_back(r->text);
        }
      } else {
        ++out.other;
        if (out.examples.size() < 5 && s && !s->broken()) {
          // With its history, to show where it stopped.
          auto h = s->request(R"({"op":"task","history":true,"task":")" + task + R"("})", 5s);
          out.examples.push_back(task + ": " + (h ? h->text : r ? r->text : "no answer"));
        }
      }
    }
  }
  return out;
}

/// The assertions every case makes. `stored_twice_allowed`: a notice or message may be
/// stored again (nats-server 2.9.10 forgets msg_id dedup state over its own restart).
void check(const summary& s, const tallies& t, const records& r, bool stored_twice_allowed) {
  INFO(s.text);
  std::string examples;
  for (const auto& e : r.examples) examples += "record: " + e + "\n";
  INFO(examples);
  CHECK(s.submitted > 0);
  CHECK(s.messages_sent > 0);
  // Nothing acknowledged is lost.
  CHECK(s.never_completed == 0);
  CHECK(s.not_notified == 0);
  CHECK(s.failed == 0);
  CHECK(s.messages_lost == 0);
  CHECK(s.messages_received == s.messages_sent);
  // Nothing is completed twice.
  CHECK(s.completed_twice == 0);
  CHECK(s.completed + s.completed_unseen == s.submitted);
  CHECK(s.notices_unknown == 0);
  // The records agree.
  CHECK(r.completed == s.submitted);
  CHECK(r.other == 0);
  CHECK(r.wrong_attempt == 0);
  if (!stored_twice_allowed) {
    CHECK(s.notices_stored_twice == 0);
    CHECK(s.messages_stored_twice == 0);
  }
  std::lock_guard lock(t.mu);
  CHECK(t.unexpected.empty());
}

/// The report, printed for the record and kept for a failure's message.
void report(const summary& s, const records& r) {
  std::cout << s.text << "  records: completed " << r.completed << ", other " << r.other
            << ", attempt differing from the completed one " << r.wrong_attempt << "\n";
  for (const auto& e : r.examples) std::cout << "  record: " << e << "\n";
  std::cout << std::flush;
}

bool ready(const server_process& p, int status) {
  return http_get(p.port(), "/readyz").status == status;
}

/// How the cluster answers, through each node, for the task store's key of `task`: the
/// revision a direct get returns (any replica may serve one; the node's own is preferred)
/// and the one the stream leader returns (STREAM.MSG.GET). For the report of a stuck task.
std::string replica_views(const nats_cluster& cluster, const std::string& task) {
  const std::string subject = std::string("$KV.AMP_TASK_STATE.") + k_ns + "." + task;
  const std::string direct = "$JS.API.DIRECT.GET.KV_AMP_TASK_STATE." + subject;
  const std::string last = R"({"last_by_subj":")" + subject + R"("})";
  simdjson::dom::parser parser;
  std::ostringstream out;
  out << task << ":";
  for (int i = 0; i < cluster.size(); ++i) {
    out << " " << cluster.node(i).name() << " ";
    natsConnection* nc = nullptr;
    if (natsConnection_ConnectTo(&nc, cluster.node(i).url().c_str()) != NATS_OK) {
      out << "(not connected);";
      natsConnection_Destroy(nc);
      continue;
    }
    natsMsg* reply = nullptr;
    const char* seq = "?";
    if (natsConnection_RequestString(&reply, nc, direct.c_str(), "", 2000) == NATS_OK)
      natsMsgHeader_Get(reply, "Nats-Sequence", &seq);
    out << "direct get revision " << seq;
    natsMsg_Destroy(reply);
    reply = nullptr;
    std::int64_t leader_seq = -1;
    if (natsConnection_RequestString(&reply, nc, "$JS.API.STREAM.MSG.GET.KV_AMP_TASK_STATE",
                                     last.c_str(), 2000) == NATS_OK) {
      simdjson::dom::element doc;
      if (parser.parse(natsMsg_GetData(reply),
                       static_cast<std::size_t>(natsMsg_GetDataLength(reply)))
                  .get(doc) != simdjson::SUCCESS ||
          doc["message"]["seq"].get(leader_seq) != simdjson::SUCCESS)
        leader_seq = -1;
    }
    out << ", leader " << leader_seq << ";";
    natsMsg_Destroy(reply);
    natsConnection_Destroy(nc);
  }
  return out.str();
}

}  // namespace

TEST_CASE(
    "kill -9 of an amp-server mid-stream, 20 times: nothing acknowledged is lost and no "
    "task is completed twice",
    "[fault][kill]") {
  auto nats = nats_server::start();
  temp_dir dir;
  const auto args = server_args(dir, nats.url(), 1, 3);
  std::vector<server_process> servers;
  servers.reserve(2);
  servers.push_back(server_process::start(args));
  servers.push_back(server_process::start(args));

  const auto started = steady::now();
  fleet f({servers[0].url(), servers[1].url()},
          {.producers = 3, .workers = 4, .senders = 1, .work_time = 5ms});
  REQUIRE(f.progress(20, 30s));
  // Each kill hits the server that every client is on: the others moved there when the
  // previous one was killed. It comes at a random moment after 40 more tasks completed.
  std::random_device random;
  const auto seed = random();
  std::mt19937 jitter(seed);
  std::cout << "kill -9 x20: jitter seed " << seed << "\n";
  for (int kill = 0; kill < 20; ++kill) {
    INFO("kill " << kill + 1 << ", seed " << seed);
    auto& victim = servers[static_cast<std::size_t>(kill % 2)];
    REQUIRE(f.progress(40, 15s));  // mid-stream: tasks are flowing through the victim
    std::this_thread::sleep_for(std::chrono::milliseconds(jitter() % 200));
    victim.signal(SIGKILL);
    REQUIRE(victim.wait_exit(5s) == 128 + SIGKILL);
    victim.restart();
  }
  REQUIRE(f.progress(10, 15s));
  f.stop_producing();
  const bool drained = f.drain(40s);
  f.stop();
  const auto s = summarize(f.t, "kill -9 of amp-server x20 (two servers on one nats-server)");
  const auto r = check_records({servers[0].url(), servers[1].url()}, f.t);
  report(s, r);
  std::cout << "  elapsed " << std::chrono::duration<double>(steady::now() - started).count()
            << " s\n";
  INFO(s.text);
  CHECK(drained);
  check(s, f.t, r, false);
}

TEST_CASE(
    "SIGSTOP of an amp-server past a lease, then SIGCONT: the stale holder's complete is "
    "lease_lost and the task is completed once",
    "[fault][stop]") {
  auto nats = nats_server::start();
  temp_dir dir;
  constexpr int lease_s = 2;
  constexpr int tasks = 3;
  const auto args = server_args(dir, nats.url(), 1, lease_s);
  auto a = server_process::start(args);
  auto b = server_process::start(args);

  tallies t;
  auto producer = session::open(b.url(), "p1", producer_grants());
  REQUIRE(producer);
  // The worker's first session, on A.
  auto stale = session::open(a.url(), "w", worker_grants());
  REQUIRE(stale);
  auto reg = stale->request(R"({"op":"register","jobs":["crunch"],"slots":3})");
  REQUIRE(reg);
  REQUIRE(reg->op == "ok");

  std::vector<std::string> ids;
  for (int i = 0; i < tasks; ++i) {
    const std::string key = "stop-" + std::to_string(i);
    auto r = producer->request(R"({"op":"submit","job":"crunch","idempotency_key":")" + key +
                               R"(","body":{"key":")" + key + R"("}})");
    REQUIRE(r);
    INFO(r->text);
    REQUIRE(r->op == "ok");
    ids.push_back(r->task);
    t.submitter[r->task] = "p1";
    ++t.submit_oks;
  }
  std::set<std::string> claimed;
  while (claimed.size() < ids.size()) {
    auto offer = stale->next_push(15s);
    REQUIRE(offer);
    if (offer->op != "offer") continue;
    ++t.offers;
    CHECK(offer->attempt == 1);
    auto c = stale->request(R"({"op":"claim","task":")" + offer->task + R"("})");
    REQUIRE(c);
    INFO(c->text);
    REQUIRE(c->op == "ok");
    CHECK(c->attempt == 1);
    ++t.claims;
    claimed.insert(offer->task);
  }

  a.signal(SIGSTOP);
  const auto stopped_at = steady::now();
  // The same participant, on B: the tasks come back to it once the leases have run out.
  auto fresh = session::open(b.url(), "w", worker_grants());
  REQUIRE(fresh);
  reg = fresh->request(R"({"op":"register","jobs":["crunch"],"slots":3})");
  REQUIRE(reg);
  REQUIRE(reg->op == "ok");
  std::set<std::string> redone;
  while (redone.size() < ids.size()) {
    auto offer = fresh->next_push(30s);
    INFO("offers again after the SIGSTOP: " << redone.size());
    REQUIRE(offer);
    if (offer->op != "offer") continue;
    ++t.offers;
    CHECK(claimed.count(offer->task) == 1);
    CHECK(offer->attempt == 2);
    auto c = fresh->request(R"({"op":"claim","task":")" + offer->task + R"("})");
    REQUIRE(c);
    INFO(c->text);
    REQUIRE(c->op == "ok");
    REQUIRE(c->attempt == 2);
    ++t.claims;
    auto done = fresh->request(R"({"op":"complete","task":")" + offer->task +
                               R"(","attempt":2,"result":"second"})");
    REQUIRE(done);
    INFO(done->text);
    REQUIRE(done->op == "ok");
    CHECK_FALSE(done->duplicate);
    CHECK(done->state == "completed");
    t.completed[offer->task].push_back(2);
    redone.insert(offer->task);
  }
  const auto stopped_for = steady::now() - stopped_at;
  CHECK(stopped_for > std::chrono::seconds(lease_s));

  a.signal(SIGCONT);
  // The stale holder completes attempt 1 with the fence: lease_lost, and nothing changes.
  for (const auto& task : ids) {
    auto r = stale->request(R"({"op":"complete","task":")" + task +
                            R"(","attempt":1,"result":"stale"})");
    REQUIRE(r);
    INFO(r->text);
    CHECK(r->op == "error");
    CHECK(r->code == "lease_lost");
    if (r->code == "lease_lost") ++t.complete_lease_lost;
    if (r->op == "ok") t.completed[task].push_back(1);
  }
  // Its stale heartbeat with the fence too.
  auto hb = stale->request(R"({"op":"heartbeat","task":")" + ids.front() + R"(","attempt":1})");
  REQUIRE(hb);
  INFO(hb->text);
  CHECK(hb->code == "lease_lost");

  // The submitter is told of each task, completed by attempt 2.
  std::set<std::string> told;
  const auto deadline = steady::now() + 20s;
  while (told.size() < ids.size() && steady::now() < deadline) {
    auto m = producer->next_push(1s);
    if (!m || m->op != "message") continue;
    producer->send(R"({"op":"ack","seq":)" + std::to_string(m->seq) + "}");
    CHECK(m->envelope.from == "$broker");
    CHECK(m->envelope.type == "amp.task.completed");
    CHECK(m->envelope.body_attempt == 2);
    ++t.notices[m->envelope.body_task];
    t.notice_seqs[m->envelope.body_task].insert(m->seq);
    told.insert(m->envelope.body_task);
  }
  // The messages part is not this case's: one message, to make the tallies whole.
  auto sender = session::open(a.url(), "s1", sender_grants());
  auto listener = session::open(b.url(), k_listener, "");
  REQUIRE(sender);
  REQUIRE(listener);
  auto sent = sender->request(R"({"op":"send","to":"l1","msg_id":"after-sigcont","body":1})");
  REQUIRE(sent);
  REQUIRE(sent->op == "ok");
  t.sent["after-sigcont"] = sent->seq;
  ++t.send_oks;
  auto got = listener->next_push(15s);
  REQUIRE(got);
  REQUIRE(got->op == "message");
  t.received[got->envelope.id].insert(got->seq);
  ++t.deliveries;
  {
    std::lock_guard lock(t.mu);
    t.lease_lost_pushes = 0;
    while (auto p = stale->next_push(0ms))
      if (p->op == "lease_lost") ++t.lease_lost_pushes;
  }

  const auto s = summarize(t, "SIGSTOP of amp-server A past a 2 s lease, then SIGCONT");
  const auto r = check_records({b.url()}, t);
  report(s, r);
  std::cout << "  A stopped for " << std::chrono::duration<double>(stopped_for).count() << " s\n";
  check(s, t, r, false);
}

TEST_CASE(
    "kill -9 and restart of nats-server under load: the amp-servers stay, workers get "
    "offers again without registering again, every task is completed once",
    "[fault][nats]") {
  auto nats = nats_server::start();
  temp_dir dir;
  const auto args = server_args(dir, nats.url(), 1, 3);
  auto a = server_process::start(args);
  auto b = server_process::start(args);

  const auto started = steady::now();
  constexpr int workers = 4;
  fleet f({a.url(), b.url()},
          {.producers = 2, .workers = workers, .senders = 1, .work_time = 20ms});
  REQUIRE(f.progress(40, 30s));  // before

  // Two outages: one ended as soon as the clients have seen it, one of 6 s (longer than a
  // lease and than the servers' 5 s fetches).
  std::ostringstream outages;
  bool every_worker = true;
  for (const auto hold : {0s, 12s}) {
    INFO("outage held for " << hold.count() << " s");
    int unavailable_before = 0;
    int send_unavailable_before = 0;
    {
      std::lock_guard lock(f.t.mu);
      unavailable_before = f.t.submit_unavailable;
      send_unavailable_before = f.t.send_unavailable;
    }
    // Every worker holds a lease into the outage, where it runs out: the servers' lease
    // timers find the backend away, and must not give up on it (the slot would stay taken
    // and the worker get no more offers).
    const auto round_started = steady::now();
    f.hold_leases(true);
    CHECK(eventually(20s, [&] { return f.holding() == workers; }));
    const auto held = steady::now() - round_started;
    nats.kill();
    const auto killed_at = steady::now();
    const auto since_kill = [&] {
      return std::chrono::duration<double>(steady::now() - killed_at).count();
    };
    // During: both servers notice, and submits and sends are refused with unavailable (and
    // retried with the same key or msg_id).
    CHECK(eventually(20s, [&] { return ready(a, 503) && ready(b, 503); }));
    const double not_ready_at = since_kill();
    CHECK(eventually(20s, [&] {
      std::lock_guard lock(f.t.mu);
      return f.t.submit_unavailable > unavailable_before &&
             f.t.send_unavailable > send_unavailable_before;
    }));
    const double unavailable_at = since_kill();
    std::this_thread::sleep_until(killed_at + hold);
    const int during = f.completed();
    nats.restart();
    const double restarted_at = since_kill();
    CHECK(eventually(30s, [&] { return ready(a, 200) && ready(b, 200); }));
    const double ready_at = since_kill();
    f.hold_leases(false);

    // After: every worker gets offers again, on the session and registration it had.
    const auto at_recovery = f.completes_by_worker();
    const bool all_worked = eventually(30s, [&] {
      auto now = f.completes_by_worker();
      for (int w = 1; w <= workers; ++w) {
        const auto name = "w" + std::to_string(w);
        if (now[name] < (at_recovery.count(name) ? at_recovery.at(name) : 0) + 3) return false;
      }
      return true;
    });
    CHECK(all_worked);
    every_worker = every_worker && all_worked;
    outages << "  outage: every worker holding a lease after "
            << std::chrono::duration<double>(held).count() << " s; after the kill: /readyz 503 at "
            << not_ready_at << " s, unavailable seen at " << unavailable_at
            << " s, nats-server back at " << restarted_at << " s, /readyz 200 at " << ready_at
            << " s, every worker completed 3 more at " << since_kill() << " s; " << during
            << " tasks completed before\n";
    if (!all_worked) break;  // a worker stalled: the tallies tell the rest
    CHECK(f.progress(40, 20s));
  }
  f.stop_producing();
  const bool drained = f.drain(every_worker ? 40s : 5s);
  f.stop();
  const auto s = summarize(f.t, "kill -9 and restart of nats-server (same port and store)");
  const auto r = check_records({a.url(), b.url()}, f.t);
  report(s, r);
  std::cout << outages.str() << "  elapsed "
            << std::chrono::duration<double>(steady::now() - started).count() << " s\n";
  INFO(s.text);
  CHECK(every_worker);
  CHECK(drained);
  {
    std::lock_guard lock(f.t.mu);
    // The amp-servers stayed up: no session was lost, so no worker registered twice.
    CHECK(f.t.reconnects == 0);
    for (const auto& [w, n] : f.t.registrations) {
      INFO(w);
      CHECK(n == 1);
    }
  }
  check(s, f.t, r, true);
}

// On nats-server 2.9.10 the node that was SIGKILLed and restarted can come back with a
// replica of KV_AMP_TASK_STATE that holds records at other sequences than the leader's (e.g.
// revision 1261 where the leader has 1204, for a record written once). A direct get, which
// any replica may answer, then gives a revision the leader refuses in every compare-and-set;
// the transport reads a key from the leader after a refused one (read_from_leader in
// src/transport/jetstream/kv.cpp). Should a task still never complete, the tallies print the
// revision each node's direct get returns for it beside the leader's. The leader is killed
// twice, the second time once the first victim has caught up; when it does not (its
// replica of the job consumer can stay out for good on 2.9.10), the second kill is skipped
// with a warning rather than made a double fault.
TEST_CASE(
    "SIGKILL of the JetStream stream leader of a 3-node cluster under load: nothing "
    "acknowledged is lost and no task is completed twice",
    "[fault][cluster]") {
  auto cluster = nats_cluster::start(3);
  temp_dir dir;
  const auto args = server_args(dir, cluster.urls(), 3, 3);
  auto a = server_process::start(args);
  auto b = server_process::start(args);

  const auto started = steady::now();
  fleet f({a.url(), b.url()}, {.producers = 2, .workers = 3, .senders = 1, .work_time = 5ms});
  REQUIRE(f.progress(40, 30s));

  // Twice: the leader of the job stream is killed under load, the others elect a new one
  // and the work goes on on two nodes, then the node comes back.
  leader_probe probe(cluster.url_list());
  const std::string stream = std::string("AMP_TASKS_") + k_ns;
  const std::string inbox = std::string("AMP_INBOX_") + k_ns;
  std::ostringstream kills;
  bool flowing = true;
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round + 1);
    std::optional<std::string> leader;
    REQUIRE(
        eventually(20s, [&] { return (leader = probe.leader_of(stream.c_str())).has_value(); }));
    const int victim = cluster.node_index_by_name(*leader);
    REQUIRE(victim >= 0);
    const auto kv_leader = probe.leader_of("KV_AMP_TASK_STATE");
    const auto inbox_leader = probe.leader_of(inbox.c_str());
    const int before = f.completed();

    cluster.kill(victim);
    std::optional<std::string> next_leader;
    CHECK(eventually(30s, [&] {
      next_leader = probe.leader_of(stream.c_str());
      return next_leader && *next_leader != *leader;
    }));
    const bool on_two = f.progress(40, 30s);
    CHECK(on_two);
    cluster.restart(victim);
    const bool on_three = on_two && f.progress(40, 30s);
    CHECK(on_three);
    flowing = flowing && on_three;
    kills << "  killed " << *leader << ", the leader of " << stream << " (KV_AMP_TASK_STATE led by "
          << kv_leader.value_or("?") << ", " << inbox << " by " << inbox_leader.value_or("?")
          << ") after " << before << " tasks completed; new leader " << next_leader.value_or("?")
          << "\n";
    if (!flowing) break;  // stuck: the tallies tell the rest
    // A second kill before the restarted node has caught up would leave one current
    // replica of two: no quorum, which Raft cannot help. Kill again once it has: new work
    // waits (under full load nats-server 2.9.10 may not bring the restarted node's
    // replicas current within minutes), the workers drain what is queued, and the load
    // comes back before the next kill.
    if (round == 0 && flowing) {
      const std::string consumer = std::string("job_") + k_job;
      f.pause_producing(true);
      bool seen[4] = {false, false, false, false};
      const bool current = eventually(60s, [&] {
        seen[0] = seen[0] || probe.caught_up(stream.c_str());
        seen[1] = seen[1] || probe.caught_up("KV_AMP_TASK_STATE");
        seen[2] = seen[2] || probe.caught_up(inbox.c_str());
        seen[3] = seen[3] || probe.caught_up(stream.c_str(), consumer.c_str());
        return seen[0] && seen[1] && seen[2] && seen[3];
      });
      std::string consumer_view;
      if (!seen[3]) {
        probe.caught_up(stream.c_str(), consumer.c_str());
        consumer_view = probe.last_view();
      }
      f.pause_producing(false);
      CHECK(f.progress(40, 30s));
      if (!current) {
        // Seen with nats-server 2.9.10 in about one run of three: the restarted node's
        // replica of the job consumer never takes part again (its lag stays, its last
        // activity is the kill). A second kill would leave that consumer without quorum
        // for good: a double fault. The first round has been judged; the tallies below
        // judge everything up to here.
        std::ostringstream why;
        why << "second kill skipped: not current after 60 s: tasks " << seen[0] << ", task store "
            << seen[1] << ", inbox " << seen[2] << ", job consumer " << seen[3] << " ("
            << consumer_view << ")";
        WARN(why.str());
        kills << "  " << why.str() << "\n";
        break;
      }
    }
  }
  f.stop_producing();
  const bool drained = f.drain(flowing ? 45s : 5s);
  f.stop();
  std::ostringstream stuck;  // how the replicas answer for tasks that never completed
  {
    std::lock_guard lock(f.t.mu);
    int shown = 0;
    for (const auto& [task, who] : f.t.submitter) {
      if (f.t.completed.count(task) || f.t.completed_again.count(task) || shown++ >= 3) continue;
      stuck << "  not completed: " << replica_views(cluster, task) << "\n";
    }
  }
  const auto s = summarize(f.t, "SIGKILL of the AMP_TASKS stream leader of a 3-node cluster (R3)");
  const auto r = check_records({a.url(), b.url()}, f.t);
  report(s, r);
  if (!drained) {
    // What the servers said, for the diagnosis.
    const auto tail = [](const std::string& log, std::size_t lines) {
      std::size_t at = log.size();
      for (std::size_t n = 0; n <= lines && at != std::string::npos && at > 0; ++n)
        at = log.rfind('\n', at - 1);
      return at == std::string::npos ? log : log.substr(at + 1);
    };
    std::cout << "  amp-server A, last lines:\n"
              << tail(a.log(), 15) << "  amp-server B, last lines:\n"
              << tail(b.log(), 15) << cluster.log_tail(10);
  }
  std::cout << stuck.str() << kills.str() << "  elapsed "
            << std::chrono::duration<double>(steady::now() - started).count() << " s\n";
  INFO(s.text);
  CHECK(drained);
  check(s, f.t, r, false);
}
