// Session ops: the inbox (send, ack, nack, deliveries) and topics (publish, subscribe,
// unsubscribe).

#include "gateway/session_impl.hpp"

#include <fmt/format.h>

namespace amp {

using namespace detail::session_util;

void session::impl::deliver(const inbox_message& m) {
  remember_branch(m);
  json_writer w;
  w.begin_object().key("op").string("message").key("seq").integer(m.seq);
  w.key("delivery").integer(m.delivery).key("envelope").raw(to_json(m.env)).end_object();
  emit(w.take(), "message");
}

void session::impl::on_send(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto to = participant_name::make(string_or_empty(rq.frame, "to")).value();
  if (!me.grants.may_send(to)) {
    return fail(rq, errc::forbidden,
                fmt::format("not granted to send to {}", amp::quoted(to.view())));
  }
  auto body = raw_at(rq.frame, "body");
  if (auto r = check_body(body); !r) return fail(rq, r.error());
  auto env = check_envelope(me, std::string(to.view()), body, string_or_empty(rq.frame, "type"),
                            headers_at(rq.frame), string_or_empty(rq.frame, "msg_id"),
                            string_or_empty(rq.frame, "reply_to"),
                            string_or_empty(rq.frame, "correlation"));
  if (!env) return fail(rq, env.error());
  admit_async(rq, me, body.size(),
              [self = shared_from_this(), st, env = std::move(*env)](
                  const request& admitted, const budget_spend& spend) mutable {
                st->b->inbox().async_send(std::move(env),
                                          self->answer_later<send_result>(admitted, spend));
              });
}

void session::impl::on_ack(request& rq) {
  auto seq = int_at(rq.frame, "seq").value_or(0);
  auto delay = std::chrono::milliseconds(int_at(rq.frame, "delay_ms").value_or(0));
  result<void> done = error(errc::not_found, "no reader");
  std::optional<operation_ref> branch;
  {
    // ack and nack never block; the reader may be stopped by closed() meanwhile.
    std::lock_guard lock(mu);
    if (reader && seq > 0) {
      done = rq.op == "ack" ? reader->ack(static_cast<std::uint64_t>(seq))
                            : reader->nack(static_cast<std::uint64_t>(seq), delay);
      if (done && rq.op == "ack") branch = take_branch_locked(static_cast<std::uint64_t>(seq));
    }
  }
  if (!done) {
    if (done.error().code() == errc::not_found) {
      return fail(
          rq, errc::not_found,
          fmt::format("no message with seq {} is in flight to you (unknown or already settled)",
                      seq));
    }
    return fail(rq, done.error());
  }
  // An operation's branch: answered once its record says `delivered`, so that a cancel the
  // member's ack came before finds it acknowledged (`unknown`, not `stopped`).
  if (branch) return branch_delivered(*branch, rq);
  reply_ok(rq);
}

void session::impl::on_publish(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto t = topic::make(string_or_empty(rq.frame, "topic")).value();
  if (!me.grants.may_publish(t)) {
    return fail(rq, errc::forbidden,
                fmt::format("not granted to publish to {}", amp::quoted(t.view())));
  }
  auto body = raw_at(rq.frame, "body");
  if (auto r = check_body(body); !r) return fail(rq, r.error());
  auto env = check_envelope(me, std::string(t.view()), body, string_or_empty(rq.frame, "type"),
                            headers_at(rq.frame), string_or_empty(rq.frame, "msg_id"));
  if (!env) return fail(rq, env.error());
  admit_async(rq, me, body.size(),
              [self = shared_from_this(), st, env = std::move(*env)](
                  const request& admitted, const budget_spend& spend) mutable {
                st->b->topics().async_publish(std::move(env),
                                              self->answer_later<publish_result>(admitted, spend));
              });
}

result<replay_from> session::impl::replay_of(dom::element frame) {
  dom::element from;
  if (frame.at_key("from").get(from)) return replay_from::new_events();
  std::string_view s;
  if (!from.get_string().get(s)) {
    if (s == "all") return replay_from::all();
    if (s == "last") return replay_from::last();
    return replay_from::new_events();
  }
  std::int64_t seq = 0;
  if (!from.at_key("seq").get_int64().get(seq)) {
    return replay_from::sequence(static_cast<std::uint64_t>(seq));
  }
  std::string_view time;
  if (!from.at_key("time").get_string().get(time)) {
    auto t = parse_timestamp(time);
    if (!t)
      return error(errc::bad_request, fmt::format("/from/time: {}", t.error().message()),
                   "/from/time");
    return replay_from::at_time(*t);
  }
  return error(errc::bad_request,
               "/from: must be \"new\", \"all\", \"last\", {\"seq\":N} or {\"time\":T}");
}

void session::impl::on_subscribe(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto pattern = topic_pattern::make(string_or_empty(rq.frame, "topic")).value();
  auto from = replay_of(rq.frame);
  if (!from) return fail(rq, from.error());
  if (!me.grants.may_subscribe(pattern)) {
    return fail(
        rq, errc::forbidden,
        fmt::format("not granted to subscribe to {} (every topic it matches must be granted)",
                    amp::quoted(pattern.view())));
  }
  auto state = std::make_shared<sub_state>();
  {
    std::lock_guard lock(mu);
    auto name = string_or_empty(rq.frame, "sub");
    if (name.empty()) {
      // Outside the names a client makes up; one it reused is passed over.
      do {
        name = fmt::format("_s{}", next_sub++);
      } while (subs.contains(name));
    } else if (subs.contains(name)) {
      return fail(rq, errc::conflict,
                  fmt::format("subscription {} is already in use", amp::quoted(name)));
    }
    if (subs.size() >= gw->opts.config.limits.max_subscriptions) {
      return fail(rq, errc::limit_exceeded,
                  fmt::format("a session may have {} subscriptions (max_subscriptions)",
                              gw->opts.config.limits.max_subscriptions));
    }
    state->name = name;
    subs.emplace(name, state);
  }
  std::weak_ptr<impl> weak = shared_from_this();
  auto on_event = [weak, state](const topic_event& ev) {
    auto self = weak.lock();
    if (!self) return false;
    json_writer w;
    w.begin_object().key("op").string("event").key("sub").string(state->name);
    w.key("seq").integer(ev.seq).key("topic").string(ev.t.view());
    w.key("envelope").raw(to_json(ev.env)).end_object();
    auto frame = w.take();
    std::lock_guard lock(state->mu);
    if (state->over) return false;
    if (!state->started) {
      if (state->pending_bytes + frame.size() > self->gw->opts.outbound_limit_bytes) return false;
      state->pending_bytes += frame.size();
      state->pending.push_back(std::move(frame));
      return true;
    }
    return self->emit(std::move(frame), "event", out_kind::event);
  };
  auto on_dropped = [weak, state](std::uint64_t last_seq) {
    auto self = weak.lock();
    if (!self) return;
    std::unique_ptr<topic_subscription> done;
    {
      std::lock_guard lock(state->mu);
      state->over = true;
      if (!state->started) {
        // Dropped during the replay, before the ok: the events taken so far wait in
        // `pending`; on_subscribe sends them after the ok, then sub_dropped.
        state->dropped_at = last_seq;
        return;
      }
      done = std::move(state->s);
    }
    self->retire(std::move(done));
    self->announce_drop(state, last_seq);
  };
  auto s =
      gw->timed([&] { return st->b->topics().subscribe(pattern, *from, on_event, on_dropped); });
  if (!s) {
    std::lock_guard lock(mu);
    subs.erase(state->name);
    return fail(rq, s.error());
  }
  std::unique_ptr<topic_subscription> stale;
  {
    std::lock_guard lock(state->mu);
    state->s = std::move(*s);
    if (ended) stale = std::move(state->s);
  }
  if (stale) {
    stale->stop();
    return;
  }
  json_writer w;
  w.begin_object().key("sub").string(state->name).end_object();
  reply_members(rq, w.take());
  std::optional<std::uint64_t> dropped_at;
  {
    std::lock_guard lock(state->mu);
    for (auto& frame : state->pending) emit(std::move(frame), "event", out_kind::forced);
    state->pending.clear();
    state->pending_bytes = 0;
    state->started = true;
    dropped_at = state->dropped_at;
    if (dropped_at) stale = std::move(state->s);
  }
  if (dropped_at) {
    retire(std::move(stale));
    announce_drop(state, *dropped_at);
  }
}

void session::impl::announce_drop(const std::shared_ptr<sub_state>& state, std::uint64_t last_seq) {
  json_writer w;
  w.begin_object().key("op").string("sub_dropped").key("sub").string(state->name);
  w.key("reason").string("slow_consumer").key("last_seq").integer(last_seq).end_object();
  emit(w.take(), "sub_dropped", out_kind::forced);
  gw->metrics.slow_consumer();
  gw->log("warn", "sub_dropped",
          fmt::format("\"session\":{},\"sub\":{},\"last_seq\":{}", json_quote(id),
                      json_quote(state->name), last_seq));
  std::lock_guard lock(mu);
  auto it = subs.find(state->name);
  if (it != subs.end() && it->second == state) subs.erase(it);
}

void session::impl::on_unsubscribe(request& rq) {
  auto name = string_or_empty(rq.frame, "sub");
  std::shared_ptr<sub_state> state;
  {
    std::lock_guard lock(mu);
    auto it = subs.find(name);
    if (it == subs.end())
      return fail(rq, errc::not_found, fmt::format("no subscription {}", amp::quoted(name)));
    state = it->second;
    subs.erase(it);
  }
  stop_sub(*state);
  reply_ok(rq);
}

void session::impl::retire(std::unique_ptr<topic_subscription> s) {
  if (!s) return;
  s->stop();
  auto holder = std::make_shared<std::unique_ptr<topic_subscription>>(std::move(s));
  gw->post([holder] { holder->reset(); });
}

void session::impl::stop_sub(sub_state& state) {
  std::unique_ptr<topic_subscription> s;
  {
    std::lock_guard lock(state.mu);
    state.over = true;
    s = std::move(state.s);
  }
  if (s) s->stop();
}

}  // namespace amp
