#include "amp/broker/operations.hpp"

#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "amp/envelope.hpp"
#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "broker/common.hpp"
#include "detail/guarded.hpp"
#include "detail/minify.hpp"
#include "detail/simdjson_adapter.hpp"
#include "detail/wait_for.hpp"

namespace amp {

namespace {

// The deadlines loop: operations taken per fetch, how long a fetch waits for one, the
// consumer's AckWait (a gateway that dies holding an operation, or with a fetch waiting that
// the server hands it to, leaves it to another after this; a look that takes longer is
// repeated by another gateway, which is harmless: every change is a compare-and-set), and how long
// a fresh operation is left to the gateway that starts it before another sends what it left unsent.
// A branch sent twice is stored once (its msg_id), so the grace only spares the backend work.
constexpr std::size_t k_due_batch = 32;
constexpr duration k_due_wait = std::chrono::seconds(5);
constexpr duration k_due_ack_wait = std::chrono::seconds(5);
constexpr duration k_resend_grace = std::chrono::seconds(5);
constexpr duration k_retry_pause = std::chrono::seconds(1);
// Compare-and-set rounds before a change gives up (`unavailable`): each lost round means
// another change won, so this many in a row only happen under a storm of changes.
constexpr int k_rounds = 64;

std::string member_list(const std::vector<std::string>& members) {
  json_writer w(16 * members.size() + 16);
  w.begin_array();
  for (const auto& m : members) w.string(m);
  w.end_array();
  return w.take();
}

// What an operation sends: stored once, in its message of the operations stream.
struct manifest {
  std::string operation;
  time_point timeout_at{};  // the epoch: none
  std::string type;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body = "null";
  std::map<std::string, std::string, std::less<>> bodies;

  const std::string& body_of(std::string_view member) const {
    auto it = bodies.find(member);
    return it == bodies.end() ? body : it->second;
  }
};

std::string write_manifest(const manifest& m) {
  std::size_t n = 256 + m.body.size();
  for (const auto& [k, v] : m.bodies) n += k.size() + v.size() + 8;
  json_writer w(n);
  w.begin_object().key("operation").string(m.operation);
  detail::write_time_or_null(w, "timeout_at", m.timeout_at);
  if (!m.type.empty()) w.key("type").string(m.type);
  w.key("headers").begin_array();
  for (const auto& [k, v] : m.headers) w.begin_array().string(k).string(v).end_array();
  w.end_array();
  w.key("body").raw(m.body);
  w.key("bodies").begin_object();
  for (const auto& [k, v] : m.bodies) w.key(k).raw(v);
  w.end_object().end_object();
  return w.take();
}

result<manifest> read_manifest(std::string_view text) {
  thread_local simdjson::dom::parser parser;
  detail::parser_release release(parser);
  simdjson::dom::object o;
  auto bad = [] { return unexpected(errc::internal, "operation message: malformed"); };
  if (parser.parse(text.data(), text.size()).get(o) != simdjson::SUCCESS) return bad();
  manifest m;
  m.operation = detail::string_member(o, "operation");
  m.type = detail::string_member(o, "type");
  auto deadline = detail::time_member(o, "timeout_at");
  if (!deadline) return bad();
  m.timeout_at = *deadline;
  simdjson::dom::array headers;
  if (o["headers"].get(headers) == simdjson::SUCCESS) {
    for (auto h : headers) {
      simdjson::dom::array pair;
      std::string_view k, v;
      if (h.get(pair) != simdjson::SUCCESS || pair.size() != 2 ||
          pair.at(0).get(k) != simdjson::SUCCESS || pair.at(1).get(v) != simdjson::SUCCESS) {
        return bad();
      }
      m.headers.emplace_back(k, v);
    }
  }
  simdjson::dom::element body;
  if (o["body"].get(body) != simdjson::SUCCESS) return bad();
  m.body = detail::minify(body);
  simdjson::dom::object bodies;
  if (o["bodies"].get(bodies) == simdjson::SUCCESS) {
    for (auto [k, v] : bodies) m.bodies.emplace(std::string(k), detail::minify(v));
  }
  if (!operation_id::make(m.operation)) return bad();
  return m;
}

// `text` as one minified JSON value; `bad_request` naming `what` otherwise.
result<std::string> json_value(std::string_view text, std::string_view what) {
  thread_local simdjson::dom::parser parser;
  detail::parser_release release(parser);
  simdjson::dom::element e;
  if (parser.parse(text.data(), text.size()).get(e) != simdjson::SUCCESS) {
    return unexpected(errc::bad_request, fmt::format("{} is not one JSON value", what));
  }
  return detail::minify(e);
}

// The answer to a start that found its operation made already (its idempotency key).
operation_started started_earlier(const operation_record& r) {
  operation_started out{*operation_id::make(r.operation), false, {}};
  for (const auto& entry : r.branches) out.members.push_back(entry.first);
  return out;
}

error no_operation(const operation_id& op) {
  return error(errc::not_found, fmt::format("no operation {}", amp::quoted(op.view())));
}

}  // namespace

struct operations::state : std::enable_shared_from_this<operations::state> {
  explicit state(broker_config c) : config(std::move(c)) {}

  std::shared_ptr<transport> t;
  std::shared_ptr<amp::clock> clock;
  broker_config config;
  std::shared_ptr<task_store> store;
  std::shared_ptr<amp::inbox> box;
  operation_events events;
  std::string bucket;
  stream_config due_stream;
  std::string inbox_stream;
  executor run;
  std::shared_ptr<detail::worker_pool> pool;
  std::unique_ptr<subscription> control;

  std::mutex mu;
  bool stopped = false;
  bool pumping = false;
  bool again = false;

  const namespace_name& ns() const { return config.ns; }
  std::string key_of(const operation_id& op) const { return subjects::operation_key(ns(), op); }

  // ----- the record -------------------------------------------------------------------

  result<operation_record> read(const operation_id& op) {
    auto e = t->kv_get(bucket, key_of(op));
    if (!e) {
      if (e.error().code() == errc::not_found) return no_operation(op);
      return e.error();
    }
    auto r = parse_operation_record(e->value);
    if (!r) return r.error();
    r->revision = e->revision;
    return r;
  }

  // Writes `r` over the revision it was read at; `conflict` when another change won.
  result<void> write(operation_record& r) {
    auto op = *operation_id::make(r.operation);
    auto rev = t->kv_update(bucket, key_of(op), to_stored_json(r), r.revision);
    if (!rev) return rev.error();
    r.revision = *rev;
    return {};
  }

  // Reads the record and applies `change` to it until the write of a change wins. `change`
  // says whether there is anything to write (false: the record is returned as read) or
  // fails, which ends the loop with its error.
  template <class Change>
  result<operation_record> change(const operation_id& op, Change&& change) {
    for (int round = 0; round < k_rounds; ++round) {
      auto r = read(op);
      if (!r) return r.error();
      result<bool> wanted = change(*r);
      if (!wanted) return wanted.error();
      if (!*wanted) return r;
      auto w = write(*r);
      if (w) return r;
      if (w.error().code() != errc::conflict) return w.error();
    }
    return unexpected(errc::unavailable,
                      fmt::format("operation {} kept changing; try again", amp::quoted(op.view())));
  }

  // ----- sending ------------------------------------------------------------------------

  result<sealed_envelope> seal(const manifest& m, const operation_record& r,
                               const std::string& member, int attempt, time_point now) {
    return sealed_envelope::seal(
        {.from = r.initiator,
         .to = member,
         .body = m.body_of(member),
         .type = m.type,
         .headers = m.headers,
         .msg_id = fmt::format("{}.{}.{}", r.operation, member, attempt),
         .operation = operation_ref{.id = r.operation,
                                    .branch = member,
                                    .attempt = attempt,
                                    .reply_by = r.quorum > 0 ? r.timeout_at : time_point{}}},
        ns().view(), now);
  }

  // Stores the branch messages of `members` at their current attempts, side by side;
  // returns each one's sequence (0 for one that failed).
  std::map<std::string, std::uint64_t> send(const manifest& m, const operation_record& r,
                                            const std::vector<std::string>& members) {
    const auto now = clock->now();
    std::vector<std::optional<sealed_envelope>> sealed;
    for (const auto& member : members) {
      auto env = seal(m, r, member, r.branches.at(member).attempt, now);
      sealed.push_back(env ? std::optional(std::move(*env)) : std::nullopt);
    }
    auto sent = detail::wait_for_all<send_result>(members.size(), [&](std::size_t i, auto done) {
      if (!sealed[i]) return done(unexpected(errc::internal, "branch envelope refused"));
      box->async_send(std::move(*sealed[i]), std::move(done));
    });
    std::map<std::string, std::uint64_t> seqs;
    for (std::size_t i = 0; i < members.size(); ++i) {
      seqs[members[i]] = sent[i] ? sent[i]->seq : 0;
    }
    return seqs;
  }

  // Records the sequences of branch messages sent at `attempts`, and `all_sent` (every
  // first message stored), deciding a multicast. A branch cancelled meanwhile gets its
  // message withdrawn. Returns the record as written.
  result<operation_record> record_sent(const operation_id& op,
                                       const std::map<std::string, std::uint64_t>& seqs,
                                       const std::map<std::string, int>& attempts) {
    std::vector<std::uint64_t> withdraw;
    auto r = change(op, [&](operation_record& rec) -> result<bool> {
      withdraw.clear();
      bool changed = false;
      for (const auto& [member, seq] : seqs) {
        auto it = rec.branches.find(member);
        if (seq == 0 || it == rec.branches.end() || it->second.attempt != attempts.at(member)) {
          continue;
        }
        if (it->second.state == branch_state::stopped) withdraw.push_back(seq);
        if (it->second.seq == 0) {
          it->second.seq = seq;
          changed = true;
        }
      }
      if (!rec.sent && std::all_of(rec.branches.begin(), rec.branches.end(),
                                   [](const auto& b) { return b.second.seq != 0; })) {
        rec.sent = true;
        changed = true;
        (void)decide(rec, clock->now());
      }
      return changed;
    });
    for (auto seq : withdraw) (void)t->delete_message(inbox_stream, seq);
    return r;
  }

  // Sends the branches whose current attempt's message is not stored, and records them.
  result<operation_record> send_unsent(const manifest& m, const operation_record& r) {
    std::vector<std::string> members;
    std::map<std::string, int> attempts;
    for (const auto& [member, b] : r.branches) {
      if (b.seq == 0 && b.state == branch_state::pending) {
        members.push_back(member);
        attempts[member] = b.attempt;
      }
    }
    if (members.empty() && r.sent) return r;
    auto seqs = send(m, r, members);
    return record_sent(*operation_id::make(r.operation), seqs, attempts);
  }

  result<manifest> manifest_of(const operation_record& r) {
    auto msg = t->get_message(due_stream.name, r.due_seq);
    if (!msg) return msg.error();
    auto m = read_manifest(msg->data);
    if (m && m->operation != r.operation) {
      return unexpected(errc::internal, "operation message of another operation");
    }
    return m;
  }

  // ----- the end ------------------------------------------------------------------------

  // What follows the close of an operation, once: the initiator's notice (stored once
  // whoever sends it), recorded; its message in the operations stream removed; its end
  // handed to the sweeper. Safe to run again (a gateway that died midway leaves it to the
  // deadlines loop).
  result<void> finish(operation_record r) {
    auto op = *operation_id::make(r.operation);
    if (!r.notified) {
      auto initiator = participant_name::make(r.initiator);
      if (initiator) {
        auto sent = box->send({.to = *initiator,
                               .from = std::string(broker_sender),
                               .body = notice_body(r),
                               .type = fmt::format("amp.operation.{}", to_string(r.state)),
                               .msg_id = fmt::format("{}.end", r.operation)});
        if (!sent) return sent.error();
      }
      auto marked = change(op, [](operation_record& rec) -> result<bool> {
        if (rec.notified) return false;
        rec.notified = true;
        return true;
      });
      if (!marked) return marked.error();
      r = std::move(*marked);
    }
    if (r.due_seq != 0) {
      auto gone = t->delete_message(due_stream.name, r.due_seq);
      if (!gone && gone.error().code() != errc::not_found) return gone.error();
    }
    store->operation_ended(ns(), op);
    return {};
  }

  // A change that found the operation past its deadline wrote the decision instead: the
  // end follows, and the change is refused as on a closed operation.
  error decided_at_deadline(const operation_record& r) {
    (void)finish(r);
    return error(errc::conflict, fmt::format("operation {} is {}: its deadline passed",
                                             amp::quoted(r.operation), to_string(r.state)));
  }

  // Tells every gateway's `operations` (this one's too) whom to tell of a cancel.
  void announce_cancel(const operation_record& r, const std::vector<std::string>& members) {
    if (members.empty()) return;
    json_writer w;
    w.begin_object().key("operation").string(r.operation).key("members");
    w.raw(member_list(members)).end_object();
    if (!t->publish_core(
            {.subject = subjects::operation_control_subject(ns()), .data = w.take()})) {
      on_control_text(r.operation, members);  // the backend is away: at least this gateway's
    }
  }

  void on_control(const message& m) {
    thread_local simdjson::dom::parser parser;
    detail::parser_release release(parser);
    simdjson::dom::object o;
    if (parser.parse(m.data.data(), m.data.size()).get(o) != simdjson::SUCCESS) return;
    std::vector<std::string> members;
    simdjson::dom::array list;
    if (o["members"].get(list) != simdjson::SUCCESS) return;
    for (auto e : list) {
      std::string_view s;
      if (e.get(s) == simdjson::SUCCESS) members.emplace_back(s);
    }
    on_control_text(detail::string_member(o, "operation"), members);
  }

  void on_control_text(std::string_view op, const std::vector<std::string>& members) {
    auto id = operation_id::make(op);
    if (!id || !events.cancelled) return;
    try {
      events.cancelled(*id, members);
    } catch (...) {
      detail::report_current_exception({}, "operations: cancelled");
    }
  }

  // ----- the deadlines loop -------------------------------------------------------------

  // Keeps one fetch out on the deadlines consumer while not stopped. A fetch that answers
  // at once (the memory transport) comes back here through `again`, not deeper.
  void pump() {
    std::unique_lock lock(mu);
    if (pumping) {
      again = true;
      return;
    }
    pumping = true;
    do {
      again = false;
      if (stopped) break;
      lock.unlock();
      std::weak_ptr<state> weak = weak_from_this();
      t->async_fetch(due_stream.name, subjects::deadlines_consumer(),
                     {.batch = k_due_batch, .max_wait = k_due_wait},
                     [weak](result<std::vector<message>> got) {
                       auto self = weak.lock();
                       if (!self) return;
                       self->run([weak, got = std::move(got)]() mutable {
                         auto s = weak.lock();
                         if (!s) return;
                         s->take(std::move(got));
                       });
                     });
      lock.lock();
    } while (again);
    pumping = false;
  }

  void take(result<std::vector<message>> got) {
    if (!got) {
      if (got.error().code() == errc::not_found) (void)ensure();
      std::weak_ptr<state> weak = weak_from_this();
      clock->call_at(clock->now() + k_retry_pause, [weak] {
        if (auto s = weak.lock())
          s->run([weak] {
            if (auto back = weak.lock()) back->pump();
          });
      });
      return;
    }
    for (auto& m : *got) look(m);
    pump();
  }

  // One look at an operation that its message brought: decide it when due, send what is
  // unsent, finish it when closed; then hand the message back until the next look.
  void look(const message& m) {
    const auto now = clock->now();
    auto man = read_manifest(m.data);
    if (!man) return t->acknowledge(m, ack_kind::term);  // not ours
    auto op = *operation_id::make(man->operation);
    auto r = read(op);
    if (!r) {
      if (r.error().code() != errc::not_found) return later(m, now + k_retry_pause, now);
      // A start that stopped before its record: kept while a repeat of it (same
      // idempotency key) may still come and find this message by its msg_id.
      auto until = m.time + config.duplicate_window + k_resend_grace;
      if (now < until) return later(m, next_look(man->timeout_at, now + k_resend_grace), now);
      return t->acknowledge(m, ack_kind::term);
    }
    // Not the record's message (a repeat stored under another msg_id): dropped.
    if (r->due_seq != m.seq) return t->acknowledge(m, ack_kind::term);
    if (!is_closed(r->state)) {
      if (decide(*r, now)) {
        // Another change won: look again at once; the backend failed: after a pause.
        if (auto w = write(*r); !w) {
          return later(m, w.error().code() == errc::conflict ? now : now + k_retry_pause, now);
        }
      } else if (r->updated_at + k_resend_grace <= now) {
        auto sent = send_unsent(*man, *r);
        if (sent) *r = std::move(*sent);
      }
    }
    if (is_closed(r->state)) {
      if (auto done = finish(*r); !done) return later(m, now + k_retry_pause, now);
      return t->acknowledge(m, ack_kind::ack);
    }
    const bool unsent = std::any_of(r->branches.begin(), r->branches.end(), [](const auto& b) {
      return b.second.seq == 0 && b.second.state == branch_state::pending;
    });
    const auto resend = std::max(r->updated_at + k_resend_grace, now + k_retry_pause);
    const bool gathers = r->quorum > 0;
    later(m,
          next_look(gathers ? r->timeout_at : time_point{}, unsent    ? resend
                                                            : gathers ? time_point::max()
                                                                      : now + k_resend_grace),
          now);
  }

  // The first of the deadline (the epoch: none) and `other`.
  static time_point next_look(time_point deadline, time_point other) {
    return deadline == time_point{} ? other : std::min(deadline, other);
  }

  void later(const message& m, time_point at, time_point now) {
    t->acknowledge(m, ack_kind::nak, std::max(at - now, duration::zero()));
  }

  result<void> ensure() {
    if (auto r = detail::ensure_limits(*t, due_stream); !r) return r.error();
    consumer_config c{.stream = due_stream.name,
                      .durable = subjects::deadlines_consumer(),
                      .ack_wait = k_due_ack_wait,
                      .max_ack_pending = -1};
    auto r = t->ensure_consumer(c);
    // Made by another version with other settings: brought to these.
    if (!r && r.error().code() == errc::conflict) r = t->update_consumer(c);
    if (!r) return r.error();
    return {};
  }

  void stop() {
    std::unique_ptr<subscription> sub;
    {
      std::lock_guard lock(mu);
      stopped = true;
      sub = std::move(control);
    }
    if (sub) sub->stop();
  }
};

operations::operations(std::shared_ptr<state> s) : s_(std::move(s)) {}

operations::~operations() {
  s_->stop();
}

const namespace_name& operations::ns() const noexcept {
  return s_->ns();
}

operation_id operations::new_id() const {
  return *operation_id::make(detail::unique_id("o_", s_->clock->now()));
}

result<std::shared_ptr<operations>> operations::open(std::shared_ptr<transport> t,
                                                     const broker_config& config,
                                                     std::shared_ptr<task_store> store,
                                                     std::shared_ptr<amp::inbox> box,
                                                     operation_events events) {
  if (!store || !box)
    return unexpected(errc::bad_request, "operations need a task store and an inbox");
  auto s = std::make_shared<state>(config);
  s->t = t;
  s->clock = t->clock();
  s->store = std::move(store);
  s->box = std::move(box);
  s->events = std::move(events);
  s->bucket = s->store->bucket();
  s->due_stream = {.name = subjects::operations_stream(config.ns),
                   .subjects = {subjects::operation_due_subject(config.ns)},
                   .retention = retention_policy::work_queue,
                   .storage = config.storage,
                   .duplicate_window = config.duplicate_window,
                   .replicas = config.replicas};
  s->inbox_stream = subjects::inbox_stream(config.ns);
  s->run = detail::executor_for(config, s->pool);
  if (auto r = s->ensure(); !r) return r.error();
  std::weak_ptr<state> weak = s;
  auto sub =
      t->subscribe_core(subjects::operation_control_subject(config.ns), [weak](const message& m) {
        if (auto self = weak.lock()) self->on_control(m);
      });
  if (!sub) return sub.error();
  s->control = std::move(*sub);
  auto ops = std::make_shared<operations>(s);
  s->run([weak] {
    if (auto self = weak.lock()) self->pump();
  });
  return ops;
}

result<operation_started> operations::start(operation_start in) {
  auto& s = *s_;
  const auto now = s.clock->now();
  std::set<std::string, std::less<>> members;
  for (const auto& m : in.members) members.insert(m.str());
  if (members.empty()) return unexpected(errc::bad_request, "an operation needs a member");
  if (members.size() > max_operation_members) {
    return unexpected(errc::bad_request, fmt::format("an operation has at most {} members, not {}",
                                                     max_operation_members, members.size()));
  }
  const auto n = static_cast<int>(members.size());
  if (in.quorum < 0 || in.quorum > n) {
    return unexpected(errc::bad_request,
                      fmt::format("quorum {} is impossible with {} members", in.quorum, n));
  }
  if (in.quorum > 0 && (in.timeout < min_operation_timeout || in.timeout > max_operation_timeout)) {
    return unexpected(errc::bad_request,
                      "an operation with a quorum needs timeout_ms from 100 to 86400000");
  }
  manifest m;
  m.type = in.type;
  m.headers = in.headers;
  auto body = json_value(in.body, "body");
  if (!body) return body.error();
  m.body = std::move(*body);
  for (auto& [member, text] : in.bodies) {
    if (!members.count(member)) {
      return unexpected(errc::bad_request,
                        fmt::format("bodies: {} is not a member", amp::quoted(member)));
    }
    auto b = json_value(text, fmt::format("bodies/{}", member));
    if (!b) return b.error();
    m.bodies.emplace(member, std::move(*b));
  }

  operation_record r;
  r.ns = s.ns().str();
  r.initiator = in.initiator.str();
  r.quorum = in.quorum;
  r.on_timeout = in.on_timeout;
  r.created_at = r.updated_at = now;
  r.timeout_at = in.quorum > 0 ? now + in.timeout : time_point{};
  for (const auto& member : members) r.branches.emplace(member, operation_branch{});
  auto op = new_id();
  r.operation = op.str();
  m.operation = r.operation;
  m.timeout_at = r.timeout_at;
  // The envelopes are checked before anything is stored (type, headers, bodies): each body
  // once, with a member that gets it (the branches differ in nothing else that is checked).
  std::vector<std::string> checked;
  auto shared = std::find_if(members.begin(), members.end(),
                             [&](const std::string& member) { return !m.bodies.count(member); });
  if (shared != members.end()) checked.push_back(*shared);
  for (const auto& entry : m.bodies) checked.push_back(entry.first);
  for (const auto& member : checked) {
    auto env = s.seal(m, r, member, 1, now);
    if (!env) return env.error();
  }

  bool bound_here = false;
  if (!in.idempotency_key.empty()) {
    auto bound = s.store->bind_operation_key(s.ns(), in.initiator, in.idempotency_key, op);
    if (!bound) return bound.error();
    r.idem_key = bound->key;
    bound_here = bound->bound;
    if (!bound->bound) {
      auto existing = s.read(bound->operation);
      if (existing) {
        return started_earlier(*existing);
      }
      if (existing.error().code() != errc::not_found) return existing.error();
      // A start with this key stopped before its record: this one goes on with it.
      op = bound->operation;
      r.operation = op.str();
      m.operation = r.operation;
    }
  }
  auto unbind = [&] {
    if (bound_here) (void)s.t->kv_erase(s.bucket, r.idem_key);
  };

  auto text = write_manifest(m);
  auto due = s.t->publish(
      {.subject = subjects::operation_due_subject(s.ns()), .data = text, .msg_id = r.operation});
  if (due && due->duplicate && !s.t->get_message(s.due_stream.name, due->seq)) {
    // Its first message was taken already (an orphan dropped): stored again under a new id.
    due = s.t->publish({.subject = subjects::operation_due_subject(s.ns()),
                        .data = std::move(text),
                        .msg_id = r.operation + ".again"});
  }
  if (!due) {
    unbind();
    return due.error();
  }
  r.due_seq = due->seq;
  auto created = s.t->kv_create(s.bucket, s.key_of(op), to_stored_json(r));
  if (!created) {
    if (created.error().code() == errc::conflict) {
      auto existing = s.read(op);
      if (!existing) return existing.error();
      return started_earlier(*existing);
    }
    (void)s.t->delete_message(s.due_stream.name, due->seq);
    unbind();
    return created.error();
  }
  r.revision = *created;
  std::vector<std::string> names(members.begin(), members.end());
  // What fails from here is in the record: the deadlines loop sends it, decides, notifies.
  auto sent = s.send_unsent(m, r);
  if (sent && is_closed(sent->state)) (void)s.finish(*sent);
  return operation_started{op, true, std::move(names)};
}

result<operation_replied> operations::reply(const operation_id& op, const participant_name& member,
                                            int attempt, bool accept, std::string body) {
  auto& s = *s_;
  auto value = json_value(body.empty() ? std::string_view("null") : std::string_view(body), "body");
  if (!value) return value.error();
  std::optional<error> refused;
  reply_effect effect;
  bool deadline = false;
  auto r = s.change(op, [&](operation_record& rec) -> result<bool> {
    const auto now = s.clock->now();
    refused.reset();
    deadline = false;
    if (auto m = check_member(rec, member.view()); !m) return m.error();
    if (!is_closed(rec.state) && decide(rec, now)) {
      // Past the deadline: the decision is the change, and the reply is refused.
      deadline = true;
      return true;
    }
    auto e = apply_reply(rec, member.view(), attempt, accept, *value, now);
    if (!e) return e.error();
    effect = *e;
    return !e->duplicate;
  });
  if (!r) return r.error();
  if (deadline) return s.decided_at_deadline(*r);
  if (effect.decided) (void)s.finish(*r);
  return operation_replied{r->state, effect.duplicate};
}

result<operation_record> operations::get(const operation_id& op) {
  return s_->read(op);
}

result<std::string> operations::view(const operation_id& op, const viewer& who) {
  auto r = s_->read(op);
  if (!r) return r.error();
  if (who.admin || who.who.view() == r->initiator) return to_json(*r);
  if (r->branches.count(who.who.view())) return to_json(*r, who.who.view());
  return no_operation(op);
}

result<int> operations::retry(const operation_id& op, const participant_name& by,
                              const participant_name& member) {
  auto& s = *s_;
  int attempt = 0;
  std::uint64_t withdraw = 0;
  bool deadline = false;
  auto r = s.change(op, [&](operation_record& rec) -> result<bool> {
    if (auto m = refuse_member(rec, by.view(), "retry a branch of"); !m) return m.error();
    if (by.view() != rec.initiator) return no_operation(op);
    const auto now = s.clock->now();
    if ((deadline = !is_closed(rec.state) && decide(rec, now))) return true;
    auto before = rec.branches.find(member.view());
    withdraw = before != rec.branches.end() && before->second.state == branch_state::pending
                   ? before->second.seq
                   : 0;
    auto a = retry_branch(rec, member.view(), now);
    if (!a) return a.error();
    attempt = *a;
    return true;
  });
  if (!r) return r.error();
  if (deadline) return s.decided_at_deadline(*r);
  // The old attempt's message, not acked yet, is withdrawn: it would only be `conflict`.
  if (withdraw != 0) (void)s.t->delete_message(s.inbox_stream, withdraw);
  auto m = s.manifest_of(*r);
  if (!m) return m.error();
  auto seqs = s.send(*m, *r, {member.str()});
  if (seqs[member.str()] == 0) {
    return unexpected(errc::unavailable,
                      fmt::format("attempt {} of branch {} is recorded but not yet sent", attempt,
                                  amp::quoted(member.view())));
  }
  (void)s.record_sent(op, seqs, {{member.str(), attempt}});
  return attempt;
}

result<std::map<std::string, cancel_outcome, std::less<>>> operations::cancel(
    const operation_id& op, const viewer& by) {
  auto& s = *s_;
  std::map<std::string, cancel_outcome, std::less<>> outcome;
  std::vector<std::uint64_t> withdraw;
  bool deadline = false;
  auto r = s.change(op, [&](operation_record& rec) -> result<bool> {
    if (!by.admin && by.who.view() != rec.initiator) {
      if (auto m = refuse_member(rec, by.who.view(), "cancel"); !m) return m.error();
      return no_operation(op);
    }
    const auto now = s.clock->now();
    if ((deadline = !is_closed(rec.state) && decide(rec, now))) return true;
    auto c = cancel_operation(rec, now);
    if (!c) return c.error();
    outcome = std::move(*c);
    withdraw.clear();
    for (const auto& [member, b] : rec.branches) {
      if (b.state == branch_state::stopped && b.seq != 0) withdraw.push_back(b.seq);
    }
    return true;
  });
  if (!r) return r.error();
  if (deadline) return s.decided_at_deadline(*r);
  for (auto seq : withdraw) (void)s.t->delete_message(s.inbox_stream, seq);
  std::vector<std::string> told;
  for (const auto& [member, c] : outcome) {
    if (c != cancel_outcome::already_completed) told.push_back(member);
  }
  s.announce_cancel(*r, told);
  (void)s.finish(*r);
  return outcome;
}

void operations::async_delivered(const operation_id& op, const participant_name& member,
                                 int attempt, std::function<void(bool)> done) {
  std::weak_ptr<state> weak = s_;
  s_->run([weak, op, member, attempt, done = std::move(done)] {
    auto s = weak.lock();
    bool changed = false;
    if (s) {
      auto r = s->change(op, [&](operation_record& rec) -> result<bool> {
        changed = mark_delivered(rec, member.view(), attempt, s->clock->now());
        return changed;
      });
      changed = changed && r.has_value();
    }
    if (done) done(changed);
  });
}

}  // namespace amp
