// The gateways of a namespace as one broker for its workers (spec §13): each tells the
// others, in core messages on `amp.<ns>.ctl.work`, which workers it has (per session: the
// participant, its jobs, slots and how busy it is), and hands a fetched task to another
// gateway, on `amp.<ns>.ctl.work.<gateway>`, when a worker there is less loaded than its
// own best. Core messages are not stored: what is lost only makes an offer less well
// placed, and a handed offer that is lost comes back at the job consumer's AckWait, as an
// offer left open does.
//
// What is sent, headers `Amp-Peer` (the sender's id) and `Amp-Event`:
// - `workers`: `{"seq","hello":bool,"workers":[{"key","who","jobs","slots","busy"}…],
//   "gone":[key…]}`,
//   the workers that changed (or all of them, at most 500 a message): sessions registered
//   for a job with a slot (one with 0 slots or no job gets no offer, and is not told).
//   `hello` (the first such worker here; in the first message of all of them) replaces what the
//   others knew of this gateway and asks them for all of theirs. `seq` numbers the tellings of the
//   sender in the order it made them: they may be sent in another order (from two threads),
//   and what a worker's entry says is taken only from a telling newer than the one it came
//   from.
// - `bye`: the last worker here is gone.
// - `offer` (to one gateway): `job_queue::offer_text`.
// - `lease_lost`, `cancelled`: `{"task","holder"}`, from the gateway whose job queue saw
//   the lease end (or the task cancelled) and has no session of the holder; a gateway with
//   sessions of the holder reads the record and pushes the op to them if it confirms it
//   (the holder no longer holds a live lease; the task cancelled).
// Changes are told only while another gateway with workers is known, together once per
// `k_tell_after` (a hello and a bye at once); all the workers are told every `k_refresh`
// in any case, and a gateway not heard for three of those is
// forgotten.

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>

#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "gateway/gateway_state.hpp"

namespace amp {

namespace {

using detail::k_event_header;
using detail::k_peer_header;
constexpr std::string_view k_workers_event = "workers";
constexpr std::string_view k_bye_event = "bye";
constexpr std::string_view k_offer_event = "offer";
constexpr std::string_view k_lease_lost_event = "lease_lost";
constexpr std::string_view k_cancelled_event = "cancelled";

// How often a gateway with workers tells all of them, whatever changed.
constexpr auto k_refresh = std::chrono::seconds(5);
// How long a change of the workers here waits to be told, so that the changes of a busy
// gateway go out together.
constexpr auto k_tell_after = std::chrono::milliseconds(20);
// The most workers in one message.
constexpr std::size_t k_workers_per_message = 500;

// Says `event` (`data`) on `subject`, signed with this gateway's `id`.
result<void> say(transport& backend, std::string subject, std::string_view id,
                 std::string_view event, std::string data) {
  return backend.publish_core({.subject = std::move(subject),
                               .data = std::move(data),
                               .headers = {{std::string(k_peer_header), std::string(id)},
                                           {std::string(k_event_header), std::string(event)}}});
}

// Whether a session could take an offer, and so is told to the others: registered for a
// job with a slot (a presence-only registration, 0 slots or no job, never gets one).
bool offerable(const detail::worker& w) {
  return w.registered && w.slots > 0 && !w.jobs.empty();
}

// Whether any session of `st` could take an offer. `st.mu` held.
bool any_offerable(const detail::ns_state& st) {
  return std::any_of(st.workers.begin(), st.workers.end(),
                     [](const auto& w) { return offerable(w.second); });
}

std::string worker_key(const void* key) {
  return fmt::format("{:x}", reinterpret_cast<std::uintptr_t>(key));
}

// `a` is less loaded than `b`: busy/slots, without division; ties by name.
bool less_loaded(int a_busy, int a_slots, std::string_view a_who, int b_busy, int b_slots,
                 std::string_view b_who) {
  auto l = std::int64_t{a_busy} * b_slots;
  auto r = std::int64_t{b_busy} * a_slots;
  return l < r || (l == r && a_who < b_who);
}

struct heard_workers {
  std::uint64_t seq = 0;
  bool hello = false;
  std::vector<std::pair<std::string, detail::remote_worker>> workers;
  std::vector<std::string> gone;
};

std::optional<heard_workers> read_workers(std::string_view text, time_point now) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object o;
  if (parser.parse(text.data(), text.size()).get(o) != simdjson::SUCCESS) return std::nullopt;
  heard_workers h;
  simdjson::dom::array workers, gone;
  if (o["seq"].get(h.seq) || o["hello"].get(h.hello) || o["workers"].get(workers) ||
      o["gone"].get(gone)) {
    return std::nullopt;
  }
  for (auto w : workers) {
    std::string_view key, who;
    std::int64_t slots = 0, busy = 0;
    simdjson::dom::array jobs;
    if (w["key"].get(key) || w["who"].get(who) || w["slots"].get(slots) || w["busy"].get(busy) ||
        w["jobs"].get(jobs) || slots < 0 || slots > 1024 || busy < 0 || busy > 1 << 20 ||
        !participant_name::make(who)) {
      return std::nullopt;
    }
    detail::remote_worker r{.who = std::string(who),
                            .jobs = {},
                            .slots = static_cast<int>(slots),
                            .busy = static_cast<int>(busy),
                            .heard = now,
                            .seq = h.seq};
    for (auto j : jobs) {
      std::string_view s;
      if (j.get(s)) return std::nullopt;
      auto job = job_name::make(s);
      if (!job) return std::nullopt;
      r.jobs.push_back(std::move(*job));
    }
    h.workers.emplace_back(std::string(key), std::move(r));
  }
  for (auto g : gone) {
    std::string_view key;
    if (g.get(key)) return std::nullopt;
    h.gone.emplace_back(key);
  }
  return h;
}

}  // namespace

namespace detail {
namespace {

// What to tell the others of the workers of `st` now (all of them when `all`), and records
// it as told. `st.mu` held.
std::vector<std::string> workers_news(ns_state& st, bool all, bool hello) {
  std::vector<std::string> out;
  json_writer w;
  std::size_t in_message = 0;
  const auto seq = ++st.tellings;
  auto begin = [&] {
    w = json_writer();
    // Only the first says hello: the others add to it.
    w.begin_object().key("seq").integer(seq).key("hello").boolean(hello && out.empty());
    w.key("workers").begin_array();
    in_message = 0;
  };
  auto gone_and_end = [&](const std::vector<std::string>& gone) {
    w.end_array().key("gone").begin_array();
    for (const auto& g : gone) w.string(g);
    w.end_array().end_object();
    out.push_back(w.take());
  };
  begin();
  std::map<const void*, told_worker> now;
  for (const auto& [key, wk] : st.workers) {
    if (!offerable(wk)) continue;
    told_worker t{.jobs = wk.jobs, .slots = wk.slots, .busy = wk.busy()};
    auto before = st.told.find(key);
    const bool changed = before == st.told.end() || !(before->second == t);
    if (all || changed) {
      if (in_message == k_workers_per_message) {
        gone_and_end({});
        begin();
      }
      w.begin_object().key("key").string(worker_key(key)).key("who").string(wk.who);
      w.key("jobs").begin_array();
      for (const auto& j : t.jobs) w.string(j.view());
      w.end_array().key("slots").integer(t.slots).key("busy").integer(t.busy).end_object();
      ++in_message;
    }
    now.emplace(key, std::move(t));
  }
  std::vector<std::string> gone;
  for (const auto& [key, t] : st.told) {
    if (!now.contains(key)) gone.push_back(worker_key(key));
  }
  if (in_message > 0 || !gone.empty()) {
    gone_and_end(gone);
  }
  st.told = std::move(now);
  return out;
}

}  // namespace
}  // namespace detail

result<void> gateway::impl::open_exchange(const std::shared_ptr<detail::ns_state>& st) {
  std::weak_ptr<impl> weak = shared_from_this();
  std::weak_ptr<detail::ns_state> weak_st = st;
  // `handed`: heard on this gateway's own subject, where only offers come.
  auto on_message = [weak, weak_st](const message& m, bool handed) {
    auto self = weak.lock();
    auto ns = weak_st.lock();
    if (!self || !ns) return;
    auto peer = find_header(m.headers, k_peer_header);
    auto event = find_header(m.headers, k_event_header);
    if (!peer || !event || *peer == self->id) return;
    if (handed) {
      if (*event != k_offer_event) return;
      auto o = ns->b->jobs().offer_from_text(m.data);
      if (!o) {
        self->log("warn", "bad_offer",
                  fmt::format("\"ns\":{},\"from\":{},\"message\":{}", json_quote(ns->ns.view()),
                              json_quote(*peer), json_quote(o.error().message())));
        return;
      }
      auto job = job_name::make(o->task.job).value();
      // Not taken here (the worker it was meant for is busy or gone by now): whoever handed
      // it knew too little, so all the workers here are told again.
      const bool taken =
          self->place_offer(ns, job, std::make_shared<const offer>(std::move(*o)), false);
      return self->workers_changed(ns, !taken);
    }
    if (*event == k_lease_lost_event || *event == k_cancelled_event) {
      return self->heard_of_holder(ns, *event, m.data);
    }
    auto now = self->clk->now();
    bool answer = false;
    {
      std::lock_guard lock(ns->mu);
      if (*event == k_bye_event) {
        ns->peers.erase(std::string(*peer));
        return;
      }
      if (*event != k_workers_event) return;
      auto h = read_workers(m.data, now);
      if (!h) return;
      auto& p = ns->peers[std::string(*peer)];
      p.heard = now;
      if (h->hello) p.workers.clear();  // it starts again: what it said before is over
      for (auto& [key, w] : h->workers) {
        auto [it, added] = p.workers.try_emplace(std::move(key), w);
        if (!added && it->second.seq < w.seq) it->second = std::move(w);
      }
      for (const auto& key : h->gone) {
        auto it = p.workers.find(key);
        if (it != p.workers.end() && it->second.seq < h->seq) p.workers.erase(it);
      }
      // A hello is answered with all the workers here, if there are any.
      answer = h->hello && ns->announced;
    }
    if (answer) self->workers_changed(ns, true);
  };
  auto heard =
      opts.backend->subscribe_core(subjects::work_control_subject(st->ns),
                                   [on_message](const message& m) { on_message(m, false); });
  if (!heard) return heard.error();
  auto handed =
      opts.backend->subscribe_core(subjects::work_offer_subject(st->ns, id),
                                   [on_message](const message& m) { on_message(m, true); });
  if (!handed) return handed.error();
  st->work_heard = std::move(*heard);
  st->work_handed = std::move(*handed);
  // Every k_refresh: all the workers here told again, gateways not heard of for long
  // forgotten.
  auto refresh = std::make_shared<std::function<void()>>();
  *refresh = [weak, weak_st, refresh_weak = std::weak_ptr(refresh)] {
    auto self = weak.lock();
    auto ns = weak_st.lock();
    auto again = refresh_weak.lock();
    if (!self || !ns || !again || self->shutting_down) return;
    {
      std::lock_guard lock(ns->mu);
      auto now = self->clk->now();
      std::erase_if(ns->peers, [&](const auto& p) { return p.second.heard + 3 * k_refresh < now; });
      ns->refresh = self->clk->call_at(now + k_refresh, [again] { (*again)(); });
    }
    self->workers_changed(ns, true);
  };
  {
    std::lock_guard lock(st->mu);
    st->refresh = clk->call_at(clk->now() + k_refresh, [refresh] { (*refresh)(); });
  }
  return {};
}

void gateway::impl::workers_changed(const std::shared_ptr<detail::ns_state>& st, bool all) {
  bool now = all;
  {
    std::lock_guard lock(st->mu);
    st->tell_all = st->tell_all || all;
    if (st->telling) return;
    const bool any = any_offerable(*st);
    if (any == st->announced && (!any || (st->peers.empty() && !st->tell_all))) return;
    st->telling = true;
    now = now || any != st->announced;
  }
  if (now) {
    post([self = shared_from_this(), st] { self->tell_workers(st); });
    return;
  }
  clk->call_at(clk->now() + k_tell_after, [weak = weak_from_this(), weak_st = std::weak_ptr(st)] {
    auto self = weak.lock();
    auto ns = weak_st.lock();
    if (!self || !ns) return;
    self->post([self, ns] { self->tell_workers(ns); });
  });
}

void gateway::impl::tell_workers(const std::shared_ptr<detail::ns_state>& st) {
  std::vector<std::string> messages;
  std::string_view event = k_workers_event;
  {
    std::lock_guard lock(st->mu);
    st->telling = false;
    const bool any = any_offerable(*st);
    const bool everyone = std::exchange(st->tell_all, false);
    if (!any) {
      if (!st->announced) return;
      st->announced = false;
      st->told.clear();
      event = k_bye_event;
      messages.emplace_back();
    } else {
      const bool hello = !st->announced;
      st->announced = true;
      // Unsaid while no other gateway listens: what changed is told when one says hello.
      if (!hello && !everyone && st->peers.empty()) return;
      messages = detail::workers_news(*st, hello || everyone, hello);
    }
  }
  for (auto& data : messages) {
    (void)say(*opts.backend, subjects::work_control_subject(st->ns), id, event, std::move(data));
  }
}

std::optional<std::string> gateway::impl::hand_to(detail::ns_state& st, const job_name& job,
                                                  const detail::worker* local, time_point now) {
  detail::remote_worker* best = nullptr;
  const std::string* best_peer = nullptr;
  for (auto& [peer, p] : st.peers) {
    for (auto& [key, w] : p.workers) {
      if (w.busy >= w.slots || w.heard + 3 * k_refresh < now ||
          std::find(w.jobs.begin(), w.jobs.end(), job) == w.jobs.end()) {
        continue;
      }
      auto live = st.live.find(w.who);
      if (live == st.live.end() || live->second.expires_at <= now) continue;
      if (!best || less_loaded(w.busy, w.slots, w.who, best->busy, best->slots, best->who)) {
        best = &w;
        best_peer = &peer;
      }
    }
  }
  if (!best) return std::nullopt;
  // Strictly less loaded than the best here: a tie stays here, which costs no message.
  if (local) {
    auto l = std::int64_t{best->busy} * local->slots;
    auto r = std::int64_t{local->busy()} * best->slots;
    if (l >= r) return std::nullopt;
  }
  ++best->busy;
  return *best_peer;
}

void gateway::impl::tell_holder_elsewhere(detail::ns_state& st, std::string_view op,
                                          const participant_name& holder, const task_id& task) {
  json_writer w;
  w.begin_object().key("task").string(task.view()).key("holder").string(holder.view());
  w.end_object();
  (void)say(*opts.backend, subjects::work_control_subject(st.ns), id, op, w.take());
}

void gateway::impl::heard_of_holder(const std::shared_ptr<detail::ns_state>& st,
                                    std::string_view op, std::string_view data) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object o;
  std::string_view task_text, holder_text;
  if (parser.parse(data.data(), data.size()).get(o) != simdjson::SUCCESS ||
      o["task"].get(task_text) || o["holder"].get(holder_text)) {
    return;
  }
  auto task = task_id::make(task_text);
  auto holder = participant_name::make(holder_text);
  if (!task || !holder) return;
  {
    std::lock_guard lock(st->mu);
    bool here = false;
    for (const auto& [key, w] : st->workers) here = here || w.who == holder->view();
    if (!here) return;
  }
  // The record says whether it is so (anyone on NATS may say it): read on the executor.
  post([self = shared_from_this(), st, op = std::string(op), task = std::move(*task),
        holder = std::move(*holder)] {
    auto rec = self->timed([&] { return st->b->tasks().get(st->ns, task); });
    if (!rec) return;
    const bool so = op == k_cancelled_event
                        ? rec->state == task_state::cancelled
                        : rec->state != task_state::running || rec->owner != holder.view() ||
                              rec->lease_expires_at <= self->clk->now();
    if (!so) return;
    std::vector<std::shared_ptr<session::impl>> targets;
    {
      std::lock_guard lock(st->mu);
      for (auto& [key, w] : st->workers) {
        if (w.who != holder.view()) continue;
        w.leases.erase(task.str());
        if (auto s = w.s.lock()) targets.push_back(std::move(s));
      }
    }
    auto frame = detail::task_push(op, task);
    for (auto& s : targets) detail::push(*s, frame, op);
  });
}

bool gateway::impl::hand_over(detail::ns_state& st, const std::string& peer, const offer& o) {
  auto sent = say(*opts.backend, subjects::work_offer_subject(st.ns, peer), id, k_offer_event,
                  st.b->jobs().offer_text(o));
  if (!sent) {
    std::lock_guard lock(st.mu);
    st.peers.erase(peer);  // told again at its next refresh, if it is there
    return false;
  }
  metrics.offer_handed();
  return true;
}

}  // namespace amp
