// jetstream_backend: fetches. Pulls on one consumer take turns (one in flight per consumer
// and connection, as the multiplexer routes pulled messages by consumer); the others wait
// in line with their own deadlines.

#include "transport/jetstream/backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "amp/timestamp.hpp"
#include "transport/stream_rules.hpp"

namespace amp::jetstream_detail {

namespace {

// Room made for a pull's messages when the first arrives: what it asked for, up to this.
constexpr std::size_t k_fetch_reserve = 256;

}  // namespace

void jetstream_backend::do_async_fetch(std::string_view stream, std::string_view durable,
                                       fetch_request request,
                                       completion<std::vector<message>> done) {
  done = detail::guarded(std::move(done), sink_, "fetch");
  auto f = std::make_shared<fetch_state>();
  f->stream = std::string(stream);
  f->durable = std::string(durable);
  f->key = pull_key(stream, durable);
  f->batch = request.batch;
  f->max_wait = std::max(request.max_wait, duration::zero());
  f->deadline = conn_->clock()->now() + f->max_wait;
  f->done = std::move(done);
  if (enter_line(f)) start_fetch(f);
}

void jetstream_backend::pull(const std::shared_ptr<fetch_state>& f, std::size_t n,
                             std::optional<duration> expires) {
  std::string body =
      expires
          ? fmt::format(R"({{"batch":{},"expires":{}}})", n, to_ns(*expires))
          // A no_wait pull that max_ack_pending holds back stays open on the server
          // (nats-server 2.9), to be served later to nobody: the expiry closes it.
          // The price: on an empty consumer the server answers only at the expiry.
          : fmt::format(R"({{"batch":{},"no_wait":true,"expires":{}}})", n, to_ns(k_pull_quiet));
  auto deadline = conn_->deadline() + (expires ? *expires : duration::zero());
  auto self = shared_from_this();
  auto received = std::make_shared<std::size_t>(0);
  set_waiting(f, expires.has_value());
  auto sent = conn_->send(
      fmt::format("$JS.API.CONSUMER.MSG.NEXT.{}.{}", f->stream, f->durable), body, nullptr,
      deadline,
      [self, f, n, expires, received](natsMsg* m) {
        auto status = header_value(m, "Status");
        if (natsMsg_IsNoResponders(m)) {
          // Nobody serves the consumer's pulls: it may be gone behind `known_`'s back
          // (removed by its inactive_threshold).
          self->check_consumer(f->stream, f->durable,
                               [self, f, n, expires, received](std::optional<error> e) {
                                 if (e) return self->fail_fetch(f, std::move(*e));
                                 self->after_pull(f, n, expires, *received);
                               });
          return true;
        }
        if (!status.empty()) {
          auto desc = header_value(m, "Description");
          if (status == "409" && desc.find("Deleted") != std::string::npos) {
            self->fail_fetch(
                f, error(errc::not_found, fmt::format("consumer \"{}\" was deleted", f->durable)));
            return true;
          }
          if (status == "100") return false;  // idle heartbeat
          self->after_pull(f, n, expires, *received);
          return true;
        }
        message msg;
        msg.subject = natsMsg_GetSubject(m);
        msg.data = data_of(m);
        msg.headers = headers_of(m);
        const char* reply = natsMsg_GetReply(m);
        if (!reply || !fill_from_ack_subject(msg, reply)) return false;
        msg.delivered_at = self->conn_->clock()->now();
        if (msg.time < f->not_before) {
          self->conn_->publish_raw(msg.ack_token, nullptr, "+ACK", nullptr);
        } else {
          if (f->got.empty()) f->got.reserve(std::min<std::size_t>(n, k_fetch_reserve));
          f->got.push_back(std::move(msg));
        }
        if (++*received < n) return false;
        self->after_pull(f, n, expires, *received);
        return true;
      },
      [self, f, n, expires, received] {
        if (*received == 0 && !expires) {
          // A no_wait pull is always answered at once; silence means the consumer (or
          // the server) is not there.
          return self->explain_silent_pull(f);
        }
        self->after_pull(f, n, expires, *received);
      },
      &f->key);
  if (!sent) fail_fetch(f, std::move(sent).error());
}

void jetstream_backend::after_pull(const std::shared_ptr<fetch_state>& f, std::size_t,
                                   std::optional<duration> expires, std::size_t received) {
  if (received == 0) answer_overdue(f);
  if (!expires) {
    if (!f->got.empty() || f->max_wait <= duration::zero()) return finish_fetch(f);
    if (f->got.size() >= f->batch) return finish_fetch(f);
    return pull(f, 1, f->max_wait);  // wait for the first message
  }
  // The waiting pull ended: with one message, take whatever else is there at once.
  if (received > 0 && f->got.size() < f->batch)
    return pull(f, f->batch - f->got.size(), std::nullopt);
  finish_fetch(f);
}

void jetstream_backend::explain_silent_pull(const std::shared_ptr<fetch_state>& f) {
  auto self = shared_from_this();
  // The consumer exists and the server answers: nothing could be delivered now
  // (max_ack_pending reached, or the server is slow).
  check_consumer(f->stream, f->durable, [self, f](std::optional<error> e) {
    if (e) return self->fail_fetch(f, std::move(*e));
    self->after_pull(f, f->batch, std::nullopt, 0);
  });
}

void jetstream_backend::finish_fetch(const std::shared_ptr<fetch_state>& f) {
  auto done = std::move(f->done);
  if (!done) return;
  leave_line(f);
  done(std::move(f->got));
}

void jetstream_backend::fail_fetch(const std::shared_ptr<fetch_state>& f, error e) {
  if (e.code() == errc::not_found) remember_consumer(f->stream, f->durable, false);
  // Messages already received are handed back for prompt redelivery.
  for (const auto& m : f->got) conn_->publish_raw(m.ack_token, nullptr, "-NAK", nullptr);
  f->got.clear();
  auto done = std::move(f->done);
  if (!done) return;
  leave_line(f);
  done(std::move(e));
}

bool jetstream_backend::enter_line(const std::shared_ptr<fetch_state>& f) {
  std::lock_guard lock(lines_mu_);
  auto [line, first] = lines_.try_emplace(f->key);
  if (first) return true;
  line->second.queued.push_back(f);
  arm_queue_timer(f, f->deadline, false);
  return false;
}

void jetstream_backend::arm_queue_timer(const std::shared_ptr<fetch_state>& f, time_point at,
                                        bool last) {
  std::weak_ptr<jetstream_backend> weak = weak_from_this();
  f->queue_timer = conn_->clock()->call_at(at, [weak, f, last] {
    if (auto self = weak.lock()) return self->queued_fetch_due(f, last);
    auto done = std::move(f->done);
    if (done) done(error(errc::unavailable, "transport closed"));
  });
}

void jetstream_backend::queued_fetch_due(const std::shared_ptr<fetch_state>& f, bool last) {
  {
    std::lock_guard lock(lines_mu_);
    auto line = lines_.find(f->key);
    if (line == lines_.end()) return;
    auto& queued = line->second.queued;
    auto it = std::find(queued.begin(), queued.end(), f);
    if (it == queued.end()) return;  // started meanwhile
    if (!last && !line->second.waiting) {
      arm_queue_timer(f, f->deadline + conn_->op_timeout(), true);
      return;
    }
    queued.erase(it);
  }
  answer_queued(f);
}

void jetstream_backend::answer_queued(const std::shared_ptr<fetch_state>& f) {
  auto done = std::move(f->done);
  if (done) done(std::vector<message>{});
}

void jetstream_backend::set_waiting(const std::shared_ptr<fetch_state>& f, bool waiting) {
  std::lock_guard lock(lines_mu_);
  auto line = lines_.find(f->key);
  if (line != lines_.end()) line->second.waiting = waiting;
}

void jetstream_backend::answer_overdue(const std::shared_ptr<fetch_state>& f) {
  std::vector<std::shared_ptr<fetch_state>> overdue;
  {
    std::lock_guard lock(lines_mu_);
    auto line = lines_.find(f->key);
    if (line == lines_.end()) return;
    auto now = conn_->clock()->now();
    auto& queued = line->second.queued;
    for (auto it = queued.begin(); it != queued.end();) {
      if ((*it)->deadline <= now) {
        conn_->clock()->cancel((*it)->queue_timer);
        overdue.push_back(std::move(*it));
        it = queued.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& q : overdue) answer_queued(q);
}

void jetstream_backend::leave_line(const std::shared_ptr<fetch_state>& f) {
  std::shared_ptr<fetch_state> next;
  {
    std::lock_guard lock(lines_mu_);
    auto line = lines_.find(f->key);
    if (line == lines_.end()) return;
    line->second.waiting = false;
    if (line->second.queued.empty()) {
      lines_.erase(line);
      return;
    }
    next = std::move(line->second.queued.front());
    line->second.queued.pop_front();
    conn_->clock()->cancel(next->queue_timer);
  }
  // With what is left of its max_wait (none left: it takes what is there, at once).
  auto left = next->deadline - conn_->clock()->now();
  next->max_wait = left >= 1ms ? left : duration::zero();
  // Started from the outermost call on this thread: a fetch that fails at once (the
  // connection is down) would otherwise start the next one from within, and so on.
  using start_list =
      std::deque<std::pair<std::shared_ptr<jetstream_backend>, std::shared_ptr<fetch_state>>>;
  thread_local start_list* starting = nullptr;
  if (starting) {
    starting->emplace_back(shared_from_this(), std::move(next));
    return;
  }
  start_list todo;
  todo.emplace_back(shared_from_this(), std::move(next));
  struct outermost {
    explicit outermost(start_list* list) { starting = list; }
    ~outermost() { starting = nullptr; }
    outermost(const outermost&) = delete;
    outermost& operator=(const outermost&) = delete;
  } scope(&todo);
  while (!todo.empty()) {
    auto [backend, g] = std::move(todo.front());
    todo.pop_front();
    backend->start_fetch(g);
  }
}

void jetstream_backend::start_fetch(const std::shared_ptr<fetch_state>& f) {
  if (auto known = known_consumer(f->stream, f->durable)) {
    f->not_before = *known;
    return pull(f, f->batch, std::nullopt);
  }
  // A pull on a missing consumer is never answered: check once before the first one.
  auto self = shared_from_this();
  check_consumer(f->stream, f->durable, [self, f](std::optional<error> e) {
    if (e) return self->fail_fetch(f, std::move(*e));
    f->not_before = self->known_consumer(f->stream, f->durable).value_or(time_point{});
    self->pull(f, f->batch, std::nullopt);
  });
}

}  // namespace amp::jetstream_detail
