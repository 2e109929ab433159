// Session ops: operations (spec §12): scatter, reply, operation, retry, and cancel with
// `operation`; a branch acknowledged by its member is recorded as delivered.

#include "gateway/session_impl.hpp"

#include <fmt/format.h>

#include "detail/minify.hpp"

namespace amp {

using namespace detail::session_util;

namespace {

operation_id operation_of(dom::element frame) {
  // The names pass accepted it.
  return operation_id::make(string_or_empty(frame, "operation")).value();
}

// The members of a `bodies` object, minified, by member.
std::map<std::string, std::string, std::less<>> bodies_at(dom::element frame) {
  std::map<std::string, std::string, std::less<>> out;
  dom::object bodies;
  if (frame["bodies"].get(bodies) != simdjson::SUCCESS) return out;
  for (auto [member, value] : bodies) out.emplace(std::string(member), detail::minify(value));
  return out;
}

}  // namespace

result<std::vector<participant_name>> session::impl::resolve_audience(detail::ns_state& st,
                                                                      const participant_name& me,
                                                                      std::string_view audience,
                                                                      bool include_self) {
  std::vector<participant_name> members;
  if (audience == "online") {
    std::lock_guard lock(st.mu);
    for (const auto& [name, entry] : st.live) {
      if (name == me.view() && !include_self) continue;
      members.push_back(participant_name::make(name).value());
    }
    return members;
  }
  auto all = gw->timed([&] { return st.b->inbox().participants(); });
  if (!all) return all.error();
  for (auto& name : *all) {
    if (name == me && !include_self) continue;
    members.push_back(std::move(name));
  }
  return members;
}

namespace {

// bad_request for members (those of `to`, or an audience resolved) who are nobody, fewer than
// the quorum or more than an operation may have, or who leave out a member of `bodies`;
// `what` names them in the message.
result<void> check_members(std::string_view what, const std::vector<participant_name>& members,
                           int quorum,
                           const std::map<std::string, std::string, std::less<>>& bodies) {
  if (members.empty()) {
    return unexpected(errc::bad_request,
                      fmt::format("{} names nobody (the initiator only with include_self)", what));
  }
  if (quorum > static_cast<int>(members.size())) {
    return unexpected(errc::bad_request, fmt::format("quorum {} is more than the {} members of {}",
                                                     quorum, members.size(), what));
  }
  if (members.size() > max_operation_members) {
    return unexpected(errc::bad_request,
                      fmt::format("{} has {} members; an operation has at most {}", what,
                                  members.size(), max_operation_members));
  }
  std::set<std::string_view> named;
  for (const auto& m : members) named.insert(m.view());
  for (const auto& [member, body] : bodies) {
    if (!named.count(member)) {
      return unexpected(errc::bad_request,
                        fmt::format("bodies: {} is not a member", amp::quoted(member)));
    }
  }
  return {};
}

}  // namespace

void session::impl::on_scatter(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  const bool include_self = bool_or(rq.frame, "include_self", false);
  const auto audience = string_or_empty(rq.frame, "audience");
  auto bodies = bodies_at(rq.frame);
  const auto quorum = static_cast<int>(int_at(rq.frame, "quorum").value_or(0));
  const auto key = string_or_empty(rq.frame, "idempotency_key");

  // bad_request, after the schemas: what the frame says of itself.
  std::vector<participant_name> members;
  dom::array to;
  if (rq.frame["to"].get(to) == simdjson::SUCCESS) {
    std::set<std::string, std::less<>> named;
    for (auto e : to) {
      auto name = participant_name::make(e.get_string().value()).value();
      if (name == me.participant && !include_self) continue;
      if (named.insert(name.str()).second) members.push_back(std::move(name));
    }
    if (auto refused = check_members("to", members, quorum, bodies); !refused) {
      return fail(rq, refused.error());
    }
  }
  if (rq.frame["idempotency_key"].error() == simdjson::SUCCESS &&
      (key.empty() || key.size() > 256)) {
    return fail(rq, errc::bad_request,
                fmt::format("idempotency_key must be 1 to 256 bytes, not {}", key.size()));
  }

  // forbidden: every member must be granted by `send`; an audience needs `send: ["*"]`.
  if (audience.empty()) {
    for (const auto& m : members) {
      if (!me.grants.may_send(m)) {
        return fail(rq, errc::forbidden,
                    fmt::format("not granted to send to {}", amp::quoted(m.view())));
      }
    }
  } else if (!me.grants.may_send_anyone()) {
    return fail(rq, errc::forbidden,
                fmt::format("audience {} needs the grant send: [\"*\"]", amp::quoted(audience)));
  } else {
    // The audience, resolved now: what it makes bad_request comes before the policy (§1).
    auto resolved = resolve_audience(*st, me.participant, audience, include_self);
    if (!resolved) return fail(rq, resolved.error());
    members = std::move(*resolved);
    const auto what = "audience " + amp::quoted(audience);
    if (auto refused = check_members(what, members, quorum, bodies); !refused) {
      return fail(rq, refused.error());
    }
  }

  // payload_too_large, then invalid_envelope: each body sent, as on `send`.
  auto body = raw_at(rq.frame, "body");
  if (body.empty()) body = "null";
  const auto type = string_or_empty(rq.frame, "type");
  auto headers = headers_at(rq.frame);
  // `body` goes to the members `bodies` leaves out; when it leaves out nobody, it is not sent.
  const auto without_own =
      std::find_if(members.begin(), members.end(),
                   [&](const participant_name& m) { return !bodies.count(m.view()); });
  std::size_t bytes = body.size();
  if (without_own != members.end()) {
    if (auto r = check_body(body); !r) return fail(rq, r.error());
  }
  for (const auto& [member, b] : bodies) {
    if (auto r = check_body(b); !r) {
      return fail(rq, error(r.error().code(), r.error().message(), "/bodies/" + member));
    }
    bytes += b.size();
  }
  if (without_own != members.end()) {
    if (auto env = check_envelope(me, without_own->str(), body, type, headers, {}); !env) {
      return fail(rq, env.error());
    }
  }
  for (const auto& [member, b] : bodies) {
    if (auto env = check_envelope(me, member, b, type, headers, {}); !env) {
      auto e = env.error();
      auto path =
          e.path().rfind("/body", 0) == 0 ? "/bodies/" + member + e.path().substr(5) : e.path();
      return fail(rq, error(e.code(), e.message(), std::move(path)));
    }
  }

  // rate and budget, once for the whole operation; a repeat of a bound idempotency key
  // counts against the rate only, and is answered even when the budget is spent.
  std::function<result<bool>()> counts;
  if (!key.empty()) {
    counts = [&]() -> result<bool> {
      auto bound =
          gw->timed([&] { return st->b->tasks().find_operation_key(me.ns, me.participant, key); });
      if (!bound) return bound.error();
      return !bound->has_value();
    };
  }
  auto spend = admit(rq, me, bytes, counts);
  if (!spend) return;

  operation_start start{
      .initiator = me.participant,
      .members = std::move(members),
      .body = std::move(body),
      .bodies = std::move(bodies),
      .type = type,
      .headers = std::move(headers),
      .quorum = quorum,
      .timeout = std::chrono::milliseconds(int_at(rq.frame, "timeout_ms").value_or(0)),
      .on_timeout = string_or_empty(rq.frame, "on_timeout") == "partial" ? timeout_rule::partial
                                                                         : timeout_rule::failed,
      .idempotency_key = key};
  auto started = gw->timed([&] { return st->b->operations().start(std::move(start)); });
  // A start that failed, or found its key bound (a repeat): the budget unit goes back.
  if (!started || !started->created) refund(*spend);
  if (!started) return fail(rq, started.error());
  json_writer w;
  w.begin_object().key("operation").string(started->operation.view());
  w.key("created").boolean(started->created).key("members").begin_array();
  for (const auto& m : started->members) w.string(m);
  w.end_array().end_object();
  reply_members(rq, w.take());
}

void session::impl::on_reply(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto op = operation_of(rq.frame);
  auto body = raw_at(rq.frame, "body");
  if (body.empty()) body = "null";
  if (auto r = check_body(body); !r) {
    // forbidden before payload_too_large (§1): someone who is not a member learns that.
    if (auto rec = gw->timed([&] { return st->b->operations().get(op); }); rec) {
      if (auto m = check_member(*rec, me.participant.view()); !m) return fail(rq, m.error());
    }
    return fail(rq, r.error());
  }
  auto replied = gw->timed([&] {
    return st->b->operations().reply(op, me.participant, attempt_of(rq.frame).value_or(-1),
                                     bool_or(rq.frame, "accept", true), std::move(body));
  });
  if (!replied) return fail(rq, replied.error());
  json_writer w;
  w.begin_object()
      .key("operation")
      .string(op.view())
      .key("state")
      .string(to_string(replied->state));
  if (replied->duplicate) w.key("duplicate").boolean(true);
  w.end_object();
  reply_members(rq, w.take());
}

void session::impl::on_operation(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto op = operation_of(rq.frame);
  auto record = gw->timed([&] {
    return st->b->operations().view(op, {.who = me.participant, .admin = me.grants.admin});
  });
  if (!record) return fail(rq, record.error());
  json_writer w;
  w.begin_object().key("operation").raw(*record).end_object();
  reply_members(rq, w.take());
}

void session::impl::on_retry(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto op = operation_of(rq.frame);
  auto member = participant_name::make(string_or_empty(rq.frame, "member")).value();
  // A retry counts against the rate, not the budget. forbidden comes before rate_limited
  // (§1): only a retry the rate refuses reads the record to learn whether a member asked (the
  // broker refuses the others' itself).
  if (auto verdict = gw->pol->take_rate(me.ns, me.participant, 0); !verdict.allowed) {
    if (auto rec = gw->timed([&] { return st->b->operations().get(op); }); rec) {
      if (auto m = refuse_member(*rec, me.participant.view(), "retry a branch of"); !m) {
        return fail(rq, m.error());
      }
    }
    return fail(rq, error(errc::rate_limited, verdict.message), verdict.retry_after.count());
  }
  auto attempt = gw->timed([&] { return st->b->operations().retry(op, me.participant, member); });
  if (!attempt) return fail(rq, attempt.error());
  json_writer w;
  w.begin_object().key("operation").string(op.view()).key("member").string(member.view());
  w.key("attempt").integer(*attempt).end_object();
  reply_members(rq, w.take());
}

void session::impl::cancel_operation(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto op = operation_of(rq.frame);
  auto outcome = gw->timed([&] {
    return st->b->operations().cancel(op, {.who = me.participant, .admin = me.grants.admin});
  });
  if (!outcome) return fail(rq, outcome.error());
  json_writer w;
  w.begin_object().key("operation").string(op.view()).key("state").string("cancelled");
  w.key("branches").begin_object();
  for (const auto& [member, c] : *outcome) w.key(member).string(to_string(c));
  w.end_object().end_object();
  reply_members(rq, w.take());
}

void session::impl::remember_branch(const inbox_message& m) {
  if (!m.env.operation || m.env.operation->branch != m.env.to) return;
  std::lock_guard lock(mu);
  branches_in_flight.insert_or_assign(m.seq, *m.env.operation);
}

std::optional<operation_ref> session::impl::take_branch_locked(std::uint64_t seq) {
  if (branches_in_flight.empty()) return std::nullopt;
  auto it = branches_in_flight.find(seq);
  if (it == branches_in_flight.end()) return std::nullopt;
  auto ref = std::move(it->second);
  branches_in_flight.erase(it);
  return ref;
}

void session::impl::branch_delivered(const operation_ref& ref, const request& ack) {
  auto op = operation_id::make(ref.id);
  if (!op) return reply_ok(ack);
  auto here = who();
  // The ack took effect whatever the record's write does: the answer is ok either way.
  here.second->b->operations().async_delivered(
      *op, here.first->participant, ref.attempt,
      [self = shared_from_this(), rq = later(ack)](bool) { self->reply_ok(rq); });
}

}  // namespace amp
