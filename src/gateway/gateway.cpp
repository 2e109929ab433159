// The gateway of one process: configuration, namespaces, offers, presence fan-out,
// readiness, metrics and shutdown. The protocol of a session is in session_impl.hpp and the
// session*.cpp files it names.

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "amp/json.hpp"
#include "amp/timestamp.hpp"
#include "detail/run_in_turn.hpp"
#include "gateway/gateway_state.hpp"

namespace amp {

namespace {

// How long one fetch of offers waits for work before the gateway asks again.
constexpr auto k_fetch_wait = std::chrono::seconds(1);
// After a failed fetch, the gateway waits this long before it tries again.
constexpr auto k_fetch_retry = std::chrono::seconds(1);
// The most offers one fetch asks for.
constexpr std::size_t k_max_fetch = 256;

result<std::string> read_file(const std::string& key, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error(errc::bad_request, fmt::format("{}: cannot read {}", key, path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A secret file holds the secret, and perhaps the newline an editor adds after it.
std::string without_final_newline(std::string s) {
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (!s.empty() && s.back() == '\r') s.pop_back();
  return s;
}

// `freed`: slots of `w` counted as free although still busy.
bool eligible(const detail::worker& w, const job_name& job,
              const std::map<std::string, registry_entry, std::less<>>& live, time_point now,
              int freed = 0) {
  if (!w.registered || w.slots <= w.busy() - freed) return false;
  if (std::find(w.jobs.begin(), w.jobs.end(), job) == w.jobs.end()) return false;
  auto it = live.find(w.who);
  return it != live.end() && it->second.expires_at > now;
}

// Marks a fetch of `job` as out and returns how many tasks it may bring (the free slots of
// the eligible sessions, the lease on `task` of session `freeing` counted as free), unless a
// fetch is out or waits to be retried, or no slot is free: then 0 and nothing is marked.
std::size_t start_fetching(detail::ns_state& st, const job_name& job, time_point now,
                           const void* freeing = nullptr, std::string_view task = {}) {
  std::lock_guard lock(st.mu);
  if (st.fetching.contains(job.view()) || st.retry_armed.contains(job.view())) return 0;
  std::size_t free = 0;
  for (const auto& [key, w] : st.workers) {
    const int freed = freeing && key == freeing && w.leases.contains(task) ? 1 : 0;
    if (eligible(w, job, st.live, now, freed))
      free += static_cast<std::size_t>(w.slots - w.busy() + freed);
  }
  if (free > 0) st.fetching.insert(job.str());
  return free;
}

std::string presence_frame(const presence_event& ev) {
  json_writer w;
  w.begin_object().key("op").string("presence").key("participant").string(ev.participant.view());
  w.key("state").string(to_string(ev.state)).key("reason").string(to_string(ev.reason));
  w.key("entry").raw(to_json(ev.entry)).end_object();
  return w.take();
}

std::string offer_frame(const offer& o) {
  json_writer w(320 + o.env.body.size());
  w.begin_object().key("op").string("offer").key("task").string(o.task.task);
  w.key("job").string(o.task.job).key("attempt").integer(o.attempt);
  w.key("max_attempts").integer(o.task.max_attempts);
  w.key("lease_s").integer(std::chrono::duration_cast<std::chrono::seconds>(o.lease).count());
  w.key("envelope").raw(to_json(o.env)).end_object();
  return w.take();
}

}  // namespace

std::string detail::task_push(std::string_view op, const task_id& task) {
  return fmt::format("{{\"op\":\"{}\",\"task\":{}}}", op, json_quote(task.view()));
}

void gateway::impl::post(std::function<void()> work) {
  in_flight.fetch_add(1);
  run([self = shared_from_this(), work = std::move(work)] {
    self->run_here(work);
    self->in_flight.fetch_sub(1);
  });
}

void gateway::impl::run_here(const std::function<void()>& work) {
  try {
    work();
  } catch (const std::exception& e) {
    log("error", "internal", fmt::format("\"what\":{}", json_quote(e.what())));
  }
}

void gateway::impl::log(std::string_view level, std::string_view event, std::string_view fields) {
  if (!opts.log) return;
  auto line = fmt::format("{{\"ts\":\"{}\",\"level\":\"{}\",\"event\":\"{}\"{}{}}}",
                          format_timestamp(std::chrono::system_clock::now()), level, event,
                          fields.empty() ? "" : ",", fields);
  opts.log(log_line{.level = level, .event = event, .json = line});
}

void gateway::impl::check_ready() {
  const bool ok = opts.backend->ping().has_value();
  const bool was = ready.exchange(ok);
  if (ok != was) log(ok ? "info" : "warn", ok ? "backend_ready" : "backend_unreachable");
  const bool back = ok && !was;
  // Back, or connected again since the last look (a short cut the pings did not see): what
  // was stored meanwhile woke no parked participant.
  const auto epoch = opts.backend->connection_epoch();
  const bool reconnected = epoch != seen_epoch.exchange(epoch);
  if (back || reconnected) look_again();
  if (shutting_down) return;
  std::weak_ptr<impl> weak = shared_from_this();
  ready_timer = clk->call_at(clk->now() + opts.readiness_interval, [weak] {
    if (auto self = weak.lock()) self->post([self] { self->check_ready(); });
  });
}

void gateway::impl::look_again() {
  std::vector<std::shared_ptr<detail::ns_state>> open;
  {
    std::lock_guard lock(mu);
    for (const auto& [name, slot] : namespaces) {
      if (slot->opened) open.push_back(slot->opened);
    }
  }
  for (const auto& st : open) st->b->inbox().look_again();
}

result<std::shared_ptr<detail::ns_state>> gateway::impl::ns_for(const namespace_name& ns) {
  std::shared_ptr<ns_slot> slot;
  {
    std::lock_guard lock(mu);
    auto& s = namespaces[ns.str()];
    if (!s) s = std::make_shared<ns_slot>();
    slot = s;
  }
  std::lock_guard opening(slot->opening);
  {
    std::lock_guard lock(mu);
    if (slot->opened) return slot->opened;
  }

  auto st = std::make_shared<detail::ns_state>(ns);
  std::weak_ptr<detail::ns_state> weak_st = st;
  std::weak_ptr<impl> weak_gw = shared_from_this();
  // A lease that ran out, or a task cancelled under its holder: tell the holder's sessions
  // that hold it (or, if none does, every session of the holder here).
  auto tell_holder = [weak_gw, weak_st](std::string_view op, const participant_name& holder,
                                        const task_id& task) {
    auto gw = weak_gw.lock();
    auto state = weak_st.lock();
    if (!gw || !state) return;
    std::vector<std::shared_ptr<session::impl>> targets;
    std::vector<job_name> jobs;
    {
      std::lock_guard lock(state->mu);
      for (auto& [key, w] : state->workers) {
        if (w.who == holder.view() && w.leases.erase(task.str()) > 0) {
          if (auto s = w.s.lock()) targets.push_back(std::move(s));
          jobs.insert(jobs.end(), w.jobs.begin(), w.jobs.end());
        }
      }
      if (targets.empty()) {
        for (auto& [key, w] : state->workers) {
          if (w.who != holder.view()) continue;
          if (auto s = w.s.lock()) targets.push_back(std::move(s));
        }
      }
    }
    for (auto& s : targets) detail::push(*s, detail::task_push(op, task), op);
    // None here: the holder may be connected to another gateway.
    if (targets.empty()) gw->tell_holder_elsewhere(*state, op, holder, task);
    gw->pump_all(state, jobs);
  };
  job_events events;
  events.lease_lost = [weak_gw, tell_holder](const participant_name& holder, const task_id& task) {
    if (auto gw = weak_gw.lock()) {
      gw->metrics.lease_expiry();
      gw->log("info", "lease_expired",
              fmt::format("\"participant\":{},\"task\":{}", json_quote(holder.view()),
                          json_quote(task.view())));
    }
    tell_holder("lease_lost", holder, task);
  };
  events.cancelled = [tell_holder](const participant_name& holder, const task_id& task) {
    tell_holder("cancelled", holder, task);
  };

  // A cancelled operation: its members connected here are told (every gateway hears it).
  operation_events op_events;
  op_events.cancelled = [weak_st](const operation_id& op, const std::vector<std::string>& members) {
    auto state = weak_st.lock();
    if (!state) return;
    std::vector<std::shared_ptr<session::impl>> targets;
    {
      std::lock_guard lock(state->mu);
      for (auto& [key, w] : state->workers) {
        if (!std::binary_search(members.begin(), members.end(), w.who)) continue;
        if (auto s = w.s.lock()) targets.push_back(std::move(s));
      }
    }
    json_writer w;
    w.begin_object().key("op").string("cancelled").key("operation").string(op.view()).end_object();
    auto frame = w.take();
    for (auto& s : targets) detail::push(*s, frame, "cancelled");
  };

  auto config = opts.config.broker_for(ns);
  config.run = run;
  auto b = timed([&] { return broker::open(opts.backend, config, events, op_events); });
  if (!b) {
    log("error", "backend_error",
        fmt::format("\"ns\":{},\"code\":\"{}\",\"message\":{}", json_quote(ns.view()),
                    to_string(b.error().code()), json_quote(b.error().message())));
    return b.error();
  }
  st->b = *b;

  // The registry as this gateway sees it: who is live (for offers), and presence events
  // for the sessions that watch.
  // Events may come before `watch` returns the start state: an entry they changed is not
  // overwritten by that older state.
  struct start_state {
    bool started = false;
    std::set<std::string, std::less<>> touched;
  };
  auto start = std::make_shared<start_state>();
  auto on_presence = [weak_gw, weak_st, start](const presence_event& ev) {
    auto gw = weak_gw.lock();
    auto state = weak_st.lock();
    if (!gw || !state) return;
    std::vector<job_name> up_jobs;
    {
      std::lock_guard lock(state->mu);
      if (!start->started) start->touched.insert(ev.participant.str());
      if (ev.state == presence_state::up) {
        state->live.insert_or_assign(ev.participant.str(), ev.entry);
        up_jobs = ev.entry.jobs;
      } else {
        state->live.erase(ev.participant.str());
      }
      auto frame = presence_frame(ev);
      for (auto it = state->watchers.begin(); it != state->watchers.end();) {
        auto s = it->second.lock();
        if (!s) {
          it = state->watchers.erase(it);
          continue;
        }
        detail::push(*s, frame, "presence");
        ++it;
      }
    }
    if (!up_jobs.empty()) {
      gw->post([gw, state, up_jobs] { gw->pump_all(state, up_jobs); });
    }
  };
  std::vector<registry_entry> now;
  auto watch = st->b->registry().watch(on_presence, &now);
  if (!watch) return watch.error();
  {
    std::lock_guard lock(st->mu);
    for (auto& e : now) {
      if (!start->touched.contains(e.participant.view()))
        st->live.try_emplace(e.participant.str(), e);
    }
    start->started = true;
    start->touched.clear();
  }
  st->presence = std::move(*watch);
  if (auto r = open_exchange(st); !r) return r.error();
  {
    std::lock_guard lock(mu);
    slot->opened = st;
  }
  log("info", "namespace_open", fmt::format("\"ns\":{}", json_quote(ns.view())));
  return st;
}

void gateway::impl::pump_all(const std::shared_ptr<detail::ns_state>& ns,
                             const std::vector<job_name>& jobs) {
  for (const auto& j : jobs) pump(ns, j);
}

void gateway::impl::pump(const std::shared_ptr<detail::ns_state>& st, const job_name& job) {
  workers_changed(st);
  if (shutting_down) return;
  const auto free = start_fetching(*st, job, clk->now());
  if (free == 0) return;
  // Weak: a fetch waiting in the backend must not keep the gateway alive.
  std::weak_ptr<impl> weak = shared_from_this();
  std::weak_ptr<detail::ns_state> weak_st = st;
  in_flight.fetch_add(1);
  st->b->jobs().async_fetch(job, std::min(free, k_max_fetch), k_fetch_wait,
                            [weak, weak_st, job](result<std::vector<offer>> r) {
                              auto self = weak.lock();
                              if (!self) return;
                              if (auto ns = weak_st.lock())
                                self->deliver_offers(ns, job, std::move(r));
                              self->in_flight.fetch_sub(1);
                            });
}

std::shared_ptr<detail::fetch_ahead> gateway::impl::fetch_ahead(
    const std::shared_ptr<detail::ns_state>& st, const void* worker, std::string_view task) {
  if (shutting_down) return nullptr;
  std::optional<job_name> job;
  {
    std::lock_guard lock(st->mu);
    auto wit = st->workers.find(worker);
    if (wit == st->workers.end()) return nullptr;
    auto l = wit->second.leases.find(task);
    if (l == wit->second.leases.end()) return nullptr;
    if (auto j = job_name::make(l->second)) job = std::move(*j);
  }
  // Setting a job up for fetching blocks: that is left to the pump after the complete.
  if (!job || !st->b->jobs().fetch_ready(*job)) return nullptr;
  const auto free = start_fetching(*st, *job, clk->now(), worker, task);
  if (free == 0) return nullptr;
  auto ahead = std::make_shared<detail::fetch_ahead>(*job);
  std::weak_ptr<impl> weak = shared_from_this();
  std::weak_ptr<detail::ns_state> weak_st = st;
  // Counted until its offers are delivered: after the complete's outcome.
  in_flight.fetch_add(1);
  st->b->jobs().async_fetch(*job, std::min(free, k_max_fetch), k_fetch_wait,
                            [weak, weak_st, ahead](result<std::vector<offer>> r) {
                              auto self = weak.lock();
                              if (!self) return;
                              {
                                std::lock_guard lock(ahead->mu);
                                if (!ahead->settled) {
                                  ahead->got = std::move(r);
                                  return;
                                }
                              }
                              if (auto ns = weak_st.lock())
                                self->deliver_offers(ns, ahead->job, std::move(r));
                              self->in_flight.fetch_sub(1);
                            });
  return ahead;
}

void gateway::impl::fetch_ahead_settled(const std::shared_ptr<detail::ns_state>& st,
                                        const std::shared_ptr<detail::fetch_ahead>& ahead) {
  std::optional<result<std::vector<offer>>> got;
  {
    std::lock_guard lock(ahead->mu);
    ahead->settled = true;
    got.swap(ahead->got);
  }
  if (!got) return;  // the fetch delivers when it comes back
  deliver_offers(st, ahead->job, std::move(*got));
  in_flight.fetch_sub(1);
}

void gateway::impl::deliver_offers(const std::shared_ptr<detail::ns_state>& st, const job_name& job,
                                   result<std::vector<offer>> r) {
  {
    std::lock_guard lock(st->mu);
    st->fetching.erase(job.str());
  }
  if (!r) {
    log("warn", "backend_error",
        fmt::format("\"ns\":{},\"job\":{},\"op\":\"fetch\",\"code\":\"{}\",\"message\":{}",
                    json_quote(st->ns.view()), json_quote(job.view()), to_string(r.error().code()),
                    json_quote(r.error().message())));
    {
      std::lock_guard lock(st->mu);
      if (!st->retry_armed.insert(job.str()).second) return;
    }
    std::weak_ptr<impl> weak = shared_from_this();
    std::weak_ptr<detail::ns_state> weak_st = st;
    clk->call_at(clk->now() + k_fetch_retry, [weak, weak_st, job] {
      auto self = weak.lock();
      auto ns = weak_st.lock();
      if (!self || !ns) return;
      {
        std::lock_guard lock(ns->mu);
        ns->retry_armed.erase(job.str());
      }
      self->post([self, ns, job] { self->pump(ns, job); });
    });
    return;
  }
  for (auto& fetched : *r)
    place_offer(st, job, std::make_shared<const offer>(std::move(fetched)), true);
  if (st->b->jobs().fetch_ready(job)) {
    // Fetching for the slots still free does not block: here, in turn (this may be a
    // transport's thread, and the fetch may answer at once).
    return detail::run_in_turn(
        [self = shared_from_this(), st, job] { self->run_here([&] { self->pump(st, job); }); });
  }
  post([self = shared_from_this(), st, job] { self->pump(st, job); });
}

bool gateway::impl::place_offer(const std::shared_ptr<detail::ns_state>& st, const job_name& job,
                                std::shared_ptr<const offer> shared, bool may_hand) {
  const offer& o = *shared;
  std::shared_ptr<session::impl> target;
  std::optional<std::string> peer;
  {
    std::lock_guard lock(st->mu);
    auto now = clk->now();
    detail::worker* best = nullptr;
    for (auto& [key, w] : st->workers) {
      if (!eligible(w, job, st->live, now)) continue;
      // least loaded first: busy/slots, compared without division; ties by name
      if (!best || std::int64_t{w.busy()} * best->slots < std::int64_t{best->busy()} * w.slots ||
          (std::int64_t{w.busy()} * best->slots == std::int64_t{best->busy()} * w.slots &&
           w.who < best->who)) {
        best = &w;
      }
    }
    if (may_hand) peer = hand_to(*st, job, best, now);
    if (!peer && best) target = best->s.lock();
    if (target) {
      std::weak_ptr<impl> weak = shared_from_this();
      std::weak_ptr<session::impl> weak_s = target;
      auto task = o.task.task;
      auto serial = ++st->offers_made;
      std::weak_ptr<detail::ns_state> weak_st = st;
      auto lapse = clk->call_at(o.lapses_at, [weak, weak_st, weak_s, task, serial] {
        auto self = weak.lock();
        auto ns = weak_st.lock();
        if (!self || !ns) return;
        self->post([self, ns, weak_s, task, serial] {
          std::shared_ptr<const offer> lapsed;
          {
            std::lock_guard held(ns->mu);
            auto s = weak_s.lock();
            if (!s) return;
            auto wit = ns->workers.find(s.get());
            if (wit == ns->workers.end()) return;
            auto it = wit->second.offers.find(task);
            if (it == wit->second.offers.end() || it->second.serial != serial) return;
            lapsed = std::move(it->second.o);
            wit->second.offers.erase(it);
          }
          self->offer_done(ns, *lapsed, false);
        });
      });
      // A redelivery of a task still on offer here (it came back before the offer lapsed
      // on this gateway's clock) replaces the offer and its lapse.
      detail::open_offer fresh{.o = shared, .lapse = lapse, .serial = serial};
      auto [it, added] = best->offers.try_emplace(o.task.task, std::move(fresh));
      if (!added) {
        clk->cancel(it->second.lapse);
        it->second = std::move(fresh);
      }
    }
  }
  if (peer) {
    if (hand_over(*st, *peer, o)) return true;
    return place_offer(st, job, std::move(shared), false);  // not sent: here after all
  }
  if (!target) {
    (void)timed([&] { return st->b->jobs().release(o); });
    return false;
  }
  metrics.offer();
  detail::push(*target, offer_frame(o), "offer");
  return true;
}

void gateway::impl::offer_done(const std::shared_ptr<detail::ns_state>& st, const offer& o,
                               bool release) {
  if (release && !shutting_down) (void)timed([&] { return st->b->jobs().release(o); });
  if (auto j = job_name::make(o.task.job)) pump(st, *j);
}

// ---- gateway ------------------------------------------------------------------------------

gateway::gateway(std::shared_ptr<impl> p) : impl_(std::move(p)) {}

gateway::~gateway() {
  shutdown();
}

result<std::shared_ptr<gateway>> gateway::open(gateway_options options) {
  if (!options.backend) return error(errc::bad_request, "gateway_options.backend is required");
  if (auto r = check_server_config(options.config); !r) return r.error();
  const auto& c = options.config;
  auth_config ac;
  ac.alg = c.auth.alg;
  if (c.auth.secret) ac.secret = *c.auth.secret;
  if (c.auth.secret_file) {
    auto text = read_file("auth.secret_file", *c.auth.secret_file);
    if (!text) return text.error();
    ac.secret = without_final_newline(std::move(*text));
  }
  if (c.auth.public_key_file) {
    auto text = read_file("auth.public_key_file", *c.auth.public_key_file);
    if (!text) return text.error();
    ac.public_key_pem = std::move(*text);
  }
  if (c.auth.audience) ac.audience = *c.auth.audience;
  ac.leeway = std::chrono::seconds(c.auth.leeway_s);
  auto auth = authenticator::make(ac);
  if (!auth) return error(errc::bad_request, auth.error().message());

  auto p = std::make_shared<impl>();
  p->id = detail::unique_id("g", std::chrono::system_clock::now());
  for (const auto& [type, path] : c.schemas) {
    auto key = fmt::format("schemas.{}", type);
    auto text = read_file(key, path);
    if (!text) return text.error();
    auto schema = json_schema::parse(*text);
    if (!schema)
      return error(errc::bad_request,
                   fmt::format("{}: {}: {}", key, path, schema.error().message()));
    p->body_schemas.emplace(type, std::move(*schema));
  }
  auto pol = policy::open(options.backend, c.to_policy_config());
  if (!pol) return error(pol.error().code(), fmt::format("policy: {}", pol.error().message()));

  p->opts = std::move(options);
  p->auth = std::move(*auth);
  p->pol = std::move(*pol);
  p->clk = p->opts.backend->clock();
  if (p->opts.run) {
    p->run = p->opts.run;
  } else {
    p->pool = std::make_shared<detail::worker_pool>(p->opts.workers);
    std::weak_ptr<detail::worker_pool> weak = p->pool;
    p->run = [weak](std::function<void()> work) {
      if (auto pool = weak.lock()) pool->post(std::move(work));
    };
  }
  p->session_threads = static_cast<int>(std::clamp<std::size_t>(p->opts.workers / 4, 1, 64));
  p->check_ready();
  return std::make_shared<gateway>(p);
}

std::shared_ptr<session> gateway::open_session(std::shared_ptr<session_carrier> carrier) {
  auto id = detail::unique_id("sess_", impl_->clk->now());
  const auto pending = impl_->pending_connections.fetch_add(1) + 1;
  auto s = detail::new_session(impl_, std::move(carrier), id);
  {
    std::lock_guard lock(impl_->mu);
    impl_->all_sessions.emplace(s.get(), s);
  }
  const auto max_pending = static_cast<std::int64_t>(impl_->opts.config.limits.max_pending);
  if (impl_->shutting_down) {
    detail::close(*s, close_code::going_away, "shutting down");
  } else if (pending > max_pending) {
    impl_->log("warn", "max_pending",
               fmt::format("\"session\":{},\"pending\":{}", json_quote(id), pending));
    detail::close(*s, close_code::try_again_later, "too many connections have not said hello");
  }
  return std::make_shared<session>(std::move(s));
}

std::size_t gateway::sessions() const noexcept {
  return static_cast<std::size_t>(std::max<std::int64_t>(0, impl_->metrics.sessions()));
}

bool gateway::ready() const noexcept {
  return impl_->ready.load() && !impl_->shutting_down.load();
}

std::string gateway::metrics_text() const {
  return impl_->metrics.render(impl_->pending_connections.load());
}

const server_config& gateway::config() const noexcept {
  return impl_->opts.config;
}

void gateway::shutdown() {
  if (impl_->shutting_down.exchange(true)) return;
  impl_->clk->cancel(impl_->ready_timer);
  impl_->log("info", "shutdown", fmt::format("\"sessions\":{}", impl_->metrics.sessions()));
  std::vector<std::shared_ptr<session::impl>> all;
  {
    std::lock_guard lock(impl_->mu);
    for (auto& [key, weak] : impl_->all_sessions) {
      if (auto s = weak.lock()) all.push_back(std::move(s));
    }
  }
  for (auto& s : all) detail::close(*s, close_code::going_away, "server shutting down");
  // Work in flight ends on its own (a fetch waits at most k_fetch_wait); bounded wait.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (impl_->in_flight.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace amp
