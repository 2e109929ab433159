// Session ops: hello (and its deadline), bye, and the end of a connection.

#include "gateway/session_impl.hpp"

#include <fmt/format.h>

namespace amp {

using namespace detail::session_util;

void session::impl::start_hello_deadline() {
  std::weak_ptr<impl> weak = shared_from_this();
  auto at = gw->clk->now() + gw->opts.hello_timeout;
  auto t = gw->clk->call_at(at, [weak] {
    auto self = weak.lock();
    if (!self) return;
    {
      std::lock_guard lock(self->mu);
      if (self->ident) return;
    }
    if (self->ended) return;
    self->reply_error("null", error(errc::unauthenticated, "no hello within the deadline"), {},
                      out_kind::forced);
    self->request_close(close_code::unauthenticated, "no hello");
    self->gw->log("info", "hello_timeout", fmt::format("\"session\":{}", json_quote(self->id)));
  });
  std::lock_guard lock(mu);
  hello_timer = t;
}

void session::impl::on_hello(request& rq) {
  auto token = string_or_empty(rq.frame, "token");
  auto verified = gw->auth->verify(token, gw->clk->now());
  if (!verified) {
    reply_error(rq.id_json, verified.error(), {}, out_kind::forced);
    request_close(close_code::unauthenticated, "unauthenticated");
    gw->log("info", "hello_failed",
            fmt::format("\"session\":{},\"reason\":{}", json_quote(id),
                        json_quote(verified.error().message())));
    return;
  }
  if (gw->shutting_down) {
    reply_error(rq.id_json, error(errc::unavailable, "the server is shutting down"), {},
                out_kind::forced);
    request_close(close_code::going_away, "shutting down");
    return;
  }
  auto max = gw->opts.config.limits.max_sessions;
  if (!gw->metrics.try_open(max)) {
    reply_error(
        rq.id_json,
        error(errc::limit_exceeded, fmt::format("the server has max_sessions ({}) sessions", max)),
        {}, out_kind::forced);
    request_close(close_code::try_again_later, "too many sessions");
    gw->log("warn", "max_sessions", fmt::format("\"session\":{}", json_quote(id)));
    return;
  }
  auto& me = *verified;
  bool opened = false;  // the place in max_sessions reserved above
  auto release_place = [&] {
    if (!opened) gw->metrics.session_closed();
  };
  auto state = gw->ns_for(me.ns);
  if (!state) {
    release_place();
    return fail(rq, state.error());
  }
  auto self = shared_from_this();
  std::weak_ptr<impl> weak = self;
  auto attached = gw->timed([&] {
    return (*state)->b->inbox().attach(me.participant, [weak](const inbox_message& m) {
      if (auto s = weak.lock()) s->deliver(m);
    });
  });
  if (!attached) {
    release_place();
    return fail(rq, attached.error());
  }
  {
    std::lock_guard lock(mu);
    if (ended) {  // closed meanwhile: the reader stops as it goes out of scope
      release_place();
      return;
    }
    opened = true;
    ident = std::make_shared<const identity>(me);
    ns = *state;
    reader = std::move(*attached);
    counted = true;
    pending_counted = false;
    if (hello_timer) gw->clk->cancel(hello_timer);
  }
  gw->pending_connections.fetch_sub(1);
  {
    std::lock_guard lock((*state)->mu);
    auto& w = (*state)->workers[this];
    w.s = self;
    w.who = me.participant.str();
  }
  const auto& c = gw->opts.config;
  json_writer w;
  w.begin_object();
  w.key("session").string(id).key("participant").string(me.participant.view());
  w.key("ns").string(me.ns.view()).key("heartbeat_s").integer(c.heartbeat_s);
  w.key("registry_ttl_s").integer(c.registry_ttl_s);
  w.key("max_frame_bytes").integer(c.limits.max_frame_bytes);
  w.key("server").string(gw->opts.server_name).end_object();
  auto members = w.take();
  reply_ok(rq, std::string_view(members).substr(1, members.size() - 2));
  gw->log("info", "session_open",
          fmt::format("\"session\":{},\"participant\":{},\"ns\":{}", json_quote(id),
                      json_quote(me.participant.view()), json_quote(me.ns.view())));
}

void session::impl::on_bye(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  std::vector<std::string> leases;
  // The entry is the participant's: while another of its sessions here is registered it
  // stays (written from that session's registration when this one's was another).
  struct registration {
    std::vector<job_name> jobs;
    int slots = 0;
    std::string meta;
  };
  std::optional<registration> staying;
  bool rewrite = false;
  {
    std::lock_guard lock(st->mu);
    auto it = st->workers.find(this);
    detail::worker* mine = it == st->workers.end() ? nullptr : &it->second;
    if (mine) {
      for (const auto& [task, job] : mine->leases) leases.push_back(task);
    }
    for (const auto& [key, w] : st->workers) {
      if (key == this || !w.registered || w.who != me.participant.view()) continue;
      staying = registration{w.jobs, w.slots, w.meta};
      rewrite = mine && mine->registered &&
                (mine->jobs != w.jobs || mine->slots != w.slots || mine->meta != w.meta);
      break;
    }
    if (mine) mine->registered = false;
  }
  if (!staying) {
    auto left = gw->timed([&] { return st->b->registry().leave(me.participant); });
    if (!left) return fail(rq, left.error());
  } else if (rewrite) {
    auto entry = gw->timed([&] {
      return st->b->registry().register_participant(me.participant, staying->jobs, staying->slots,
                                                    staying->meta, load_of(me, *st));
    });
    if (!entry) return fail(rq, entry.error());
    remember_entry(*st, *entry);
  }
  for (const auto& task : leases) {
    auto released = gw->timed(
        [&] { return st->b->jobs().release_lease(task_id::make(task).value(), me.participant); });
    if (released) lease_over(st, task, released->job);
  }
  gw->workers_changed(st);
  reply_ok(rq);
  request_close(close_code::normal, "bye");
  gw->log("info", "bye",
          fmt::format("\"session\":{},\"participant\":{}", json_quote(id),
                      json_quote(me.participant.view())));
}

void session::impl::on_closed() {
  {
    std::lock_guard lock(out_mu);
    close_requested = true;
  }
  ended = true;
  frames->close();
  std::unique_ptr<inbox_reader> r;
  std::map<std::string, std::shared_ptr<sub_state>, std::less<>> s;
  std::shared_ptr<detail::ns_state> st;
  bool was_counted = false;
  bool was_pending = false;
  {
    std::lock_guard lock(mu);
    r = std::move(reader);
    s = std::move(subs);
    subs.clear();
    st = ns;
    was_counted = std::exchange(counted, false);
    was_pending = std::exchange(pending_counted, false);
    if (hello_timer) gw->clk->cancel(hello_timer);
  }
  if (r) r->stop();
  for (auto& [name, state] : s) stop_sub(*state);
  if (was_pending) gw->pending_connections.fetch_sub(1);
  if (was_counted) gw->metrics.session_closed();
  {
    std::lock_guard lock(gw->mu);
    gw->all_sessions.erase(this);
  }
  if (!st) return;
  std::vector<std::shared_ptr<const offer>> offers;
  {
    std::lock_guard lock(st->mu);
    st->watchers.erase(this);
    auto it = st->workers.find(this);
    if (it != st->workers.end()) {
      for (auto& [task, o] : it->second.offers) {
        gw->clk->cancel(o.lapse);
        offers.push_back(std::move(o.o));
      }
      st->workers.erase(it);
    }
  }
  auto g = gw;
  for (auto& o : offers) {
    g->post([g, st, o = std::move(o)] { g->offer_done(st, *o, true); });
  }
  g->workers_changed(st);
  if (was_counted) g->log("info", "session_closed", fmt::format("\"session\":{}", json_quote(id)));
}

}  // namespace amp
