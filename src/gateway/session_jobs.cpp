// Session ops: jobs (submit, claim, decline, complete, fail, cancel, task), offers and
// leases as this session sees them.

#include "gateway/session_impl.hpp"

#include <fmt/format.h>

namespace amp {

using namespace detail::session_util;

void session::impl::on_submit(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto job = job_name::make(string_or_empty(rq.frame, "job")).value();
  if (!me.grants.may_submit(job)) {
    return fail(rq, errc::forbidden,
                fmt::format("not granted to submit to job {}", amp::quoted(job.view())));
  }
  auto body = raw_at(rq.frame, "body");
  if (auto r = check_body(body); !r) return fail(rq, r.error());
  auto type = string_or_empty(rq.frame, "type");
  auto headers = headers_at(rq.frame);
  const auto bytes = body.size();
  // Sealed once, here, with the task's id: the job queue stores it as it is.
  auto env = check_envelope(me, std::string(job.view()), std::move(body), std::move(type),
                            std::move(headers), st->b->tasks().new_id().str());
  if (!env) return fail(rq, env.error());
  job_submit_options options{.idempotency_key =
                                 std::string(string_or_empty(rq.frame, "idempotency_key"))};
  if (auto m = int_at(rq.frame, "max_attempts")) options.max_attempts = static_cast<int>(*m);
  if (options.idempotency_key.empty()) {
    return admit_async(
        rq, me, bytes,
        [self = shared_from_this(), st, env = std::move(*env), options = std::move(options)](
            const request& admitted, const budget_spend& spend) mutable {
          self->submit(admitted, *st, std::move(env), std::move(options), spend);
        });
  }
  // A resubmission (an idempotency key already bound) counts against the rate, not the
  // budget: it is answered with its task even when the budget is spent. Finding the key's
  // binding blocks: a keyed submit runs on the executor (see runs_here).
  auto spend = admit(rq, me, bytes, [&]() -> result<bool> {
    auto bound = gw->timed([&] {
      return st->b->tasks().find_idempotency_key(me.ns, me.participant, options.idempotency_key);
    });
    if (!bound) return bound.error();
    return !bound->has_value();
  });
  if (spend) submit(rq, *st, std::move(*env), std::move(options), *spend);
}

void session::impl::submit(const request& rq, detail::ns_state& st, sealed_envelope env,
                           job_submit_options options, const budget_spend& spend) {
  auto started = std::chrono::steady_clock::now();
  st.b->jobs().async_submit(
      std::move(env), std::move(options),
      [self = shared_from_this(), rq = later(rq), spend, started](result<submit_result> submitted) {
        self->gw->metrics.backend(seconds_since(started));
        if (!submitted || !submitted->created) {
          // A failure, or a resubmission (which counts against the rate, not the budget):
          // the refund may block, so not on the transport's thread.
          return self->gw->post([self, rq, spend, submitted] {
            self->refund(spend);
            if (!submitted) return self->fail(rq, submitted.error());
            self->answer_submitted(rq, *submitted);
          });
        }
        self->gw->metrics.transition("queued");
        self->answer_submitted(rq, *submitted);
      });
}

void session::impl::answer_submitted(const request& rq, const submit_result& submitted) {
  json_writer w;
  w.begin_object()
      .key("task")
      .string(submitted.task.view())
      .key("created")
      .boolean(submitted.created);
  w.end_object();
  reply_members(rq, w.take());
}

std::shared_ptr<const offer> session::impl::take_offer(detail::ns_state& st, std::string_view task,
                                                       bool claiming) {
  std::lock_guard lock(st.mu);
  auto wit = st.workers.find(this);
  if (wit == st.workers.end()) return nullptr;
  auto it = wit->second.offers.find(task);
  if (it == wit->second.offers.end()) return nullptr;
  auto o = std::move(it->second);
  wit->second.offers.erase(it);
  if (claiming) ++wit->second.claiming;
  gw->clk->cancel(o.lapse);
  return std::move(o.o);
}

void session::impl::on_claim(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto task = string_or_empty(rq.frame, "task");
  auto o = take_offer(*st, task, true);
  if (!o)
    return fail(rq, errc::not_found,
                fmt::format("no open offer of task {} for you", amp::quoted(task)));
  auto started = std::chrono::steady_clock::now();
  st->b->jobs().async_claim(
      o, me.participant,
      [self = shared_from_this(), rq = later(rq), st, o, started](result<lease> l) {
        self->gw->metrics.backend(seconds_since(started));
        {
          std::lock_guard lock(st->mu);
          // Not for a session that closed meanwhile: the lease runs out in the broker.
          auto it = st->workers.find(self.get());
          if (it != st->workers.end()) {
            --it->second.claiming;
            if (l) it->second.leases.insert_or_assign(o->task.task, o->task.job);
          }
        }
        if (!l) {
          // Handing the offer back may block: not on the transport's thread.
          return self->gw->post([self, rq, st, o, l] {
            self->fail(rq, l.error());
            auto code = l.error().code();  // conflict, not_found: the offer is over already
            self->gw->offer_done(st, *o, code != errc::conflict && code != errc::not_found);
          });
        }
        self->gw->metrics.transition("running");
        json_writer w;
        w.begin_object().key("task").string(o->task.task).key("attempt").integer(l->attempt);
        w.key("lease_expires_at").string(format_timestamp_chars(l->expires_at).view()).end_object();
        self->reply_members(rq, w.take());
      });
}

void session::impl::on_decline(request& rq) {
  auto here = who();
  auto& st = here.second;
  auto task = string_or_empty(rq.frame, "task");
  auto o = take_offer(*st, task, false);
  if (!o)
    return fail(rq, errc::not_found,
                fmt::format("no open offer of task {} for you", amp::quoted(task)));
  auto r = gw->timed([&] { return st->b->jobs().decline(*o); });
  if (!r) {
    fail(rq, r.error());
  } else {
    reply_ok(rq);
  }
  gw->pump(st, job_name::make(o->task.job).value());
}

void session::impl::lease_over(const std::shared_ptr<detail::ns_state>& st, std::string_view task,
                               std::string_view job) {
  std::string of(job);
  {
    std::lock_guard lock(st->mu);
    auto it = st->workers.find(this);
    if (it != st->workers.end()) {
      auto l = it->second.leases.find(task);
      if (l != it->second.leases.end()) {
        if (of.empty()) of = l->second;
        it->second.leases.erase(l);
      }
    }
  }
  if (auto j = job_name::make(of)) gw->pump(st, *j);
}

void session::impl::lease_refused(const std::shared_ptr<detail::ns_state>& st,
                                  const participant_name& who, const task_id& task) {
  if (!st->b->jobs().holds(task, who)) lease_over(st, task.view(), {});
}

void session::impl::on_complete(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto t = task_id::make(string_or_empty(rq.frame, "task")).value();
  auto result_json = raw_at(rq.frame, "result");
  if (result_json.empty()) result_json = "null";
  if (result_json.size() > gw->opts.config.limits.max_body_bytes) {
    return fail(rq, error(errc::payload_too_large,
                          fmt::format("result is {} bytes; max_body_bytes is {}",
                                      result_json.size(), gw->opts.config.limits.max_body_bytes),
                          "/result"));
  }
  auto started = std::chrono::steady_clock::now();
  auto ahead = gw->fetch_ahead(st, this, t.view());
  st->b->jobs().async_complete(
      t, me.participant, std::string(result_json), attempt_of(rq.frame),
      [self = shared_from_this(), rq = later(rq), st, t, who = me.participant, started,
       ahead](result<completion_result> done) {
        self->gw->metrics.backend(seconds_since(started));
        if (!done) {
          self->fail(rq, done.error());
          if (ahead) self->gw->fetch_ahead_settled(st, ahead);
          if (done.error().code() != errc::lease_lost) return;
          // Freeing the slot offers more work, which may block: not on this thread.
          return self->gw->post([self, st, t, who] { self->lease_refused(st, who, t); });
        }
        if (!done->duplicate) self->gw->metrics.transition("completed");
        json_writer w;
        w.begin_object().key("task").string(t.view()).key("state").string("completed");
        if (done->duplicate) w.key("duplicate").boolean(true);
        w.end_object();
        self->reply_members(rq, w.take());
        // The freed slot is offered more work at once, unless setting its job up for
        // fetching would block this (the transport's) thread.
        auto job = job_name::make(done->task.job);
        if (ahead) {
          // The fetch for the freed slot is out already (the pump finds it so).
          self->lease_over(st, t.view(), done->task.job);
          return self->gw->fetch_ahead_settled(st, ahead);
        }
        if (job && st->b->jobs().fetch_ready(*job))
          return self->lease_over(st, t.view(), job->view());
        self->gw->post(
            [self, st, t, job = done->task.job] { self->lease_over(st, t.view(), job); });
      });
}

void session::impl::on_fail(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto t = task_id::make(string_or_empty(rq.frame, "task")).value();
  task_error err;
  dom::element e;
  if (!rq.frame.at_key("error").get(e)) {
    err.code = string_or_empty(e, "code");
    err.message = string_or_empty(e, "message");
  }
  auto retry = bool_or(rq.frame, "retry", false);
  auto delay = std::chrono::milliseconds(int_at(rq.frame, "retry_delay_ms").value_or(0));
  auto r = gw->timed([&] {
    return st->b->jobs().fail(t, me.participant, err, retry, delay, attempt_of(rq.frame));
  });
  if (!r) {
    if (r.error().code() == errc::lease_lost) lease_refused(st, me.participant, t);
    return fail(rq, r.error());
  }
  gw->metrics.transition(to_string(r->state));
  lease_over(st, t.view(), r->job);
  json_writer w;
  w.begin_object().key("task").string(t.view()).key("state").string(to_string(r->state));
  w.key("attempt").integer(r->attempt).end_object();
  reply_members(rq, w.take());
}

void session::impl::on_cancel(request& rq) {
  if (rq.frame["operation"].error() == simdjson::SUCCESS) return cancel_operation(rq);
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto t = task_id::make(string_or_empty(rq.frame, "task")).value();
  auto r = gw->timed(
      [&] { return st->b->jobs().cancel(t, {.who = me.participant, .admin = me.grants.admin}); });
  if (!r) return fail(rq, r.error());
  gw->metrics.transition("cancelled");
  json_writer w;
  w.begin_object().key("task").string(t.view()).key("state").string("cancelled").end_object();
  reply_members(rq, w.take());
}

void session::impl::on_task(request& rq) {
  auto here = who();
  const identity& me = *here.first;
  auto& st = here.second;
  auto t = task_id::make(string_or_empty(rq.frame, "task")).value();
  viewer v{.who = me.participant, .admin = me.grants.admin};
  auto record = gw->timed([&] { return st->b->jobs().get(t, v); });
  if (!record) return fail(rq, record.error());
  json_writer w;
  w.begin_object().key("task").raw(to_json(*record));
  if (bool_or(rq.frame, "history", false)) {
    auto history = gw->timed([&] { return st->b->jobs().history(t, v); });
    if (!history) return fail(rq, history.error());
    w.key("history").begin_array();
    for (const auto& h : *history) w.raw(to_json(h));
    w.end_array();
  }
  w.end_object();
  reply_members(rq, w.take());
}

}  // namespace amp
