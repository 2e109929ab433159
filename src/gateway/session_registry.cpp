// Session ops: the registry (register, heartbeat, who, watch).

#include "gateway/session_impl.hpp"

#include <fmt/format.h>

namespace amp {

using namespace detail::session_util;

namespace {

// The most bytes of a registry entry's `meta` (minified), which every watcher receives.
constexpr std::size_t k_max_meta_bytes = 4096;

}  // namespace

int session::impl::load_of(const identity& me, detail::ns_state& st) {
  return static_cast<int>(st.b->jobs().leases_of(me.participant).size());
}

void session::impl::remember_entry(detail::ns_state& st, const registry_entry& e) {
  std::lock_guard lock(st.mu);
  if (auto it = st.live.find(e.participant.view()); it != st.live.end()) {
    it->second = e;
  } else {
    st.live.emplace(std::string(e.participant.view()), e);
  }
}

void session::impl::on_register(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  std::vector<job_name> jobs;
  dom::array arr;
  if (!rq.frame.at_key("jobs").get_array().get(arr)) {
    for (auto j : arr) {
      std::string_view s;
      if (!j.get_string().get(s)) jobs.push_back(job_name::make(s).value());
    }
  }
  for (const auto& j : jobs) {
    if (!me.grants.may_work(j)) {
      return fail(rq, errc::forbidden,
                  fmt::format("not granted to work on job {}", amp::quoted(j.view())));
    }
  }
  auto slots = static_cast<int>(int_at(rq.frame, "slots").value_or(1));
  auto meta = raw_at(rq.frame, "meta");
  if (meta.empty()) meta = "{}";
  if (meta.size() > k_max_meta_bytes) {
    return fail(rq, error(errc::payload_too_large,
                          fmt::format("meta is {} bytes; at most {} are allowed", meta.size(),
                                      k_max_meta_bytes),
                          "/meta"));
  }
  auto entry = gw->timed([&] {
    return st->b->registry().register_participant(me.participant, jobs, slots, meta,
                                                  load_of(me, *st));
  });
  if (!entry) return fail(rq, entry.error());
  remember_entry(*st, *entry);
  {
    std::lock_guard lock(st->mu);
    // A session that closed meanwhile has had its entry removed: it must not come back.
    if (ended) return;
    auto& w = st->workers[this];
    w.registered = true;
    w.jobs = entry->jobs;
    w.slots = entry->slots;
    w.meta = entry->meta;
  }
  reply_members(rq, fmt::format("{{\"expires_in_s\":{}}}", gw->opts.config.registry_ttl_s));
  gw->log("info", "registered",
          fmt::format("\"session\":{},\"participant\":{},\"slots\":{}", json_quote(id),
                      json_quote(me.participant.view()), slots));
  gw->pump_all(st, entry->jobs);
}

void session::impl::refresh_entry(const identity& me, const std::shared_ptr<detail::ns_state>& st) {
  auto load = load_of(me, *st);
  auto refreshed = gw->timed([&] { return st->b->registry().heartbeat(me.participant, load); });
  if (refreshed) {
    remember_entry(*st, *refreshed);
  } else if (refreshed.error().code() == errc::not_found) {
    register_again(me, st);
  }
}

void session::impl::register_again(const identity& me,
                                   const std::shared_ptr<detail::ns_state>& st) {
  std::vector<job_name> jobs;
  int slots = 0;
  std::string meta;
  {
    std::lock_guard lock(st->mu);
    auto it = st->workers.find(this);
    if (it == st->workers.end() || !it->second.registered) return;
    auto& w = it->second;
    jobs = w.jobs;
    slots = w.slots;
    meta = w.meta;
  }
  auto entry = gw->timed([&] {
    return st->b->registry().register_participant(me.participant, jobs, slots, meta,
                                                  load_of(me, *st));
  });
  if (entry) {
    remember_entry(*st, *entry);
    gw->pump_all(st, entry->jobs);
  }
}

bool session::impl::holds_leases(detail::ns_state& st) {
  std::lock_guard lock(st.mu);
  auto it = st.workers.find(this);
  return it != st.workers.end() && !it->second.leases.empty();
}

void session::impl::heartbeat_alone(const request& rq, std::shared_ptr<const identity> me,
                                    std::shared_ptr<detail::ns_state> st) {
  // The answer does not depend on the refresh: like a blocking heartbeat's, it is ok when
  // the backend could not refresh the entry (it then expires, and watchers see it go).
  auto answer = [self = shared_from_this(), rq = later(rq)] {
    self->reply_members(rq, R"({"leases":[]})");
  };
  auto load = load_of(*me, *st);
  st->b->registry().async_heartbeat(
      me->participant, load,
      [self = shared_from_this(), me, st, answer = std::move(answer),
       started = std::chrono::steady_clock::now()](result<registry_entry> refreshed) {
        self->gw->metrics.backend(seconds_since(started));
        if (refreshed) {
          self->remember_entry(*st, *refreshed);
        } else if (refreshed.error().code() == errc::not_found) {
          return self->gw->post([self, me, st, answer] {
            self->register_again(*me, st);
            answer();
          });
        }
        answer();
      });
}

void session::impl::on_heartbeat(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto one = string_at(rq.frame, "task");
  if (!one && !holds_leases(*st)) return heartbeat_alone(rq, here.first, st);
  refresh_entry(me, st);
  if (one) {
    auto t = task_id::make(*one).value();
    auto l =
        gw->timed([&] { return st->b->jobs().heartbeat(t, me.participant, attempt_of(rq.frame)); });
    if (!l) {
      if (l.error().code() == errc::lease_lost) lease_refused(st, me.participant, t);
      return fail(rq, l.error());
    }
    {
      std::lock_guard lock(st->mu);
      auto it = st->workers.find(this);
      if (it != st->workers.end()) it->second.leases.insert_or_assign(t.str(), l->job);
    }
    json_writer w;
    w.begin_object()
        .key("task")
        .string(t.view())
        .key("expires_at")
        .string(format_timestamp(l->expires_at));
    w.end_object();
    return reply_members(rq, w.take());
  }
  // Only the leases held through this session (spec §4): one claimed in a session that is
  // gone runs out unless a session adopts it.
  std::vector<std::string> held;
  {
    std::lock_guard lock(st->mu);
    auto it = st->workers.find(this);
    if (it != st->workers.end()) {
      for (const auto& [task, job] : it->second.leases) held.push_back(task);
    }
  }
  // Each lease on its own: one the backend could not extend does not keep the others from
  // being extended; the answer is then that error, naming the leases it concerns.
  std::optional<error> trouble;
  std::vector<std::string> not_extended;
  json_writer w;
  w.begin_object().key("leases").begin_array();
  for (const auto& task : held) {
    auto t = task_id::make(task).value();
    auto l = gw->timed([&] { return st->b->jobs().heartbeat(t, me.participant); });
    if (!l) {
      if (l.error().code() == errc::lease_lost) {
        lease_over(st, task, {});
      } else {
        if (!trouble) trouble = l.error();
        not_extended.push_back(task);
      }
      continue;
    }
    w.begin_object()
        .key("task")
        .string(l->task.view())
        .key("expires_at")
        .string(format_timestamp(l->expires_at));
    w.end_object();
  }
  w.end_array().end_object();
  if (trouble) {
    return fail(
        rq, error(trouble->code(), fmt::format("not extended: {} ({}); the others were",
                                               fmt::join(not_extended, ", "), trouble->message())));
  }
  reply_members(rq, w.take());
}

void session::impl::on_who(request& rq) {
  auto here = who();
  auto& st = here.second;
  std::optional<job_name> job;
  if (auto j = string_at(rq.frame, "job")) job = job_name::make(*j).value();
  auto entries = gw->timed([&] { return st->b->registry().live(job); });
  if (!entries) return fail(rq, entries.error());
  json_writer w;
  w.begin_object().key("participants").begin_array();
  for (const auto& e : *entries) w.raw(to_json(e));
  w.end_array().end_object();
  reply_members(rq, w.take());
}

void session::impl::on_watch(request& rq) {
  auto here = who();
  auto& st = here.second;
  auto now = gw->clk->now();
  json_writer w;
  w.begin_object().key("participants").begin_array();
  std::lock_guard lock(st->mu);  // presence events are sent under it: none overtakes this ok
  for (const auto& [name, e] : st->live) {
    if (e.expires_at > now) w.raw(to_json(e));
  }
  w.end_array().end_object();
  st->watchers[this] = weak_from_this();
  reply_members(rq, w.take());
}

}  // namespace amp
