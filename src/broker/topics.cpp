#include "amp/broker/topics.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <utility>

#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "broker/common.hpp"

namespace amp {
namespace {

// A publish that passed every check: what goes to the stream, and the envelope id.
struct prepared {
  outgoing_message out;
  std::string msg_id;
};

result<prepared> prepare(const namespace_name& ns, sealed_envelope env) {
  if (auto r = detail::check_sealed_for(env, ns); !r) return r.error();
  auto to = topic::make(env.get().to);
  if (!to) return unexpected(errc::invalid_name, "to: " + to.error().message());
  if (!env.get().reply_to.empty() || !env.get().correlation.empty()) {
    return unexpected(errc::bad_request, "a topic event has no reply_to or correlation");
  }
  prepared p;
  p.out.subject = subjects::topic_subject(ns, *to);
  p.out.msg_id = detail::dedup_id(env.get().from, env.get().to, env.get().id);
  p.msg_id = env.get().id;
  p.out.data = std::move(env).json();
  return p;
}

result<prepared> prepare(const namespace_name& ns, time_point now, topic_message msg) {
  // seal checks in the spec's order: shape, then names, then the envelope.
  auto env = sealed_envelope::seal({.from = std::move(msg.from),
                                    .to = msg.to.str(),
                                    .body = std::move(msg.body),
                                    .type = std::move(msg.type),
                                    .headers = std::move(msg.headers),
                                    .msg_id = std::move(msg.msg_id)},
                                   ns.view(), now);
  if (!env) return std::move(env).error();
  return prepare(ns, std::move(*env));
}

// Publishes what `prepare` made (or answers its error).
void store(transport& t, result<prepared> p, completion<publish_result> done) {
  if (!p) return done(std::move(p).error());
  t.async_publish(std::move(p->out), [done = std::move(done),
                                      id = std::move(p->msg_id)](result<publish_ack> ack) mutable {
    if (!ack) return done(std::move(ack).error());
    done(publish_result{.seq = ack->seq, .msg_id = std::move(id), .duplicate = ack->duplicate});
  });
}

// What a subscription's callbacks share with its handle. The transport runs `handle` one
// message at a time; `stop` may come from any thread.
class subscription_state {
 public:
  subscription_state(namespace_name ns, topic_pattern pattern,
                     std::function<bool(const topic_event&)> on_event,
                     std::function<void(std::uint64_t)> on_dropped)
      : ns_(std::move(ns)),
        pattern_(std::move(pattern)),
        on_event_(std::move(on_event)),
        on_dropped_(std::move(on_dropped)) {}

  // Whatever the transport delivers from before the requested start is passed over (not
  // every backend holds to a start beyond the stream's end).
  void start_at(std::uint64_t seq, std::optional<time_point> time) {
    min_seq_ = seq;
    not_before_ = time;
  }

  void handle(const message& m) {
    if (stopped_.load()) return;
    if (m.seq < min_seq_) return;
    if (not_before_) {
      if (m.time < *not_before_) return;
      not_before_.reset();  // in stream order from here on
    }
    auto t = subjects::topic_from_subject(ns_, m.subject);
    if (!t || !pattern_.matches(*t)) return skip(m.seq);
    auto env = parse_envelope(m.data);
    if (!env || env->ns != ns_.str() || env->to != t->str()) return skip(m.seq);
    const topic_event event{.seq = m.seq, .t = std::move(*t), .env = std::move(*env)};
    if (on_event_(event)) {
      last_seq_.store(m.seq);
      return;
    }
    // Refused: nothing matching lies between what was taken and this event (the replay
    // is gap-free), so resuming at its sequence loses nothing and repeats nothing.
    last_seq_.store(m.seq - 1);
    if (stopped_.exchange(true)) return;  // stopped meanwhile: a stop is not a drop
    dropped_.store(true);
    stop_inner();
    if (on_dropped_) on_dropped_(m.seq - 1);
  }

  // Called by `subscribe` once the transport has returned the replay, which may already
  // have delivered (and been refused) on this or another thread.
  void attach(std::shared_ptr<subscription> inner) {
    {
      std::lock_guard lock(mu_);
      inner_ = inner;
    }
    if (stopped_.load()) inner->stop();
  }

  void stop() noexcept {
    stopped_.store(true);
    stop_inner();
  }

  std::shared_ptr<subscription> detach() {
    std::lock_guard lock(mu_);
    return std::exchange(inner_, nullptr);
  }

  std::uint64_t last_seq() const noexcept { return last_seq_.load(); }
  bool dropped() const noexcept { return dropped_.load(); }
  const topic_pattern& pattern() const noexcept { return pattern_; }

 private:
  void skip(std::uint64_t seq) { last_seq_.store(seq); }

  void stop_inner() noexcept {
    std::shared_ptr<subscription> inner;
    {
      std::lock_guard lock(mu_);
      inner = inner_;
    }
    // Outside the lock: from another thread this waits for a running callback.
    if (inner) inner->stop();
  }

  const namespace_name ns_;
  const topic_pattern pattern_;
  const std::function<bool(const topic_event&)> on_event_;
  const std::function<void(std::uint64_t)> on_dropped_;
  std::uint64_t min_seq_ = 0;
  std::optional<time_point> not_before_;
  std::atomic<bool> stopped_{false};
  std::atomic<bool> dropped_{false};
  std::atomic<std::uint64_t> last_seq_{0};
  std::mutex mu_;
  std::shared_ptr<subscription> inner_;
};

class topic_subscription_impl final : public topic_subscription {
 public:
  topic_subscription_impl(std::shared_ptr<subscription_state> state,
                          std::shared_ptr<transport> backend)
      : state_(std::move(state)), backend_(std::move(backend)) {}

  ~topic_subscription_impl() override {
    state_->stop();
    // The transport holds our callback, which holds the state: let go of the replay here
    // (while the transport is certainly alive) so that nothing keeps the other alive.
    state_->detach().reset();
  }

  void stop() noexcept override { state_->stop(); }
  std::uint64_t last_seq() const noexcept override { return state_->last_seq(); }
  bool dropped() const noexcept override { return state_->dropped(); }
  const topic_pattern& pattern() const noexcept override { return state_->pattern(); }

 private:
  std::shared_ptr<subscription_state> state_;
  std::shared_ptr<transport> backend_;
};

}  // namespace

topics::topics(std::shared_ptr<transport> t, namespace_name ns)
    : transport_(std::move(t)), ns_(std::move(ns)), stream_(subjects::topics_stream(ns_)) {}

result<std::shared_ptr<topics>> topics::open(std::shared_ptr<transport> t,
                                             const broker_config& config) {
  if (!t) return unexpected(errc::bad_request, "topics need a transport");
  stream_config sc;
  sc.name = subjects::topics_stream(config.ns);
  sc.subjects = {subjects::topic_subjects(config.ns)};
  sc.retention = retention_policy::limits;
  sc.storage = config.storage;
  sc.max_bytes = config.topic_max_bytes > 0 ? config.topic_max_bytes : -1;
  sc.max_age = std::max(config.topic_max_age, duration::zero());
  sc.duplicate_window = config.duplicate_window;
  // JetStream refuses a duplicate window longer than the max age.
  if (sc.max_age > duration::zero())
    sc.duplicate_window = std::min(sc.duplicate_window, sc.max_age);
  sc.replicas = config.replicas;
  if (auto r = detail::ensure_limits(*t, sc); !r) return std::move(r).error();
  return std::shared_ptr<topics>(new topics(std::move(t), config.ns));
}

result<publish_result> topics::publish(topic_message msg) {
  auto p = prepare(ns_, transport_->clock()->now(), std::move(msg));
  if (!p) return std::move(p).error();
  auto ack = transport_->publish(std::move(p->out));
  if (!ack) return std::move(ack).error();
  return publish_result{
      .seq = ack->seq, .msg_id = std::move(p->msg_id), .duplicate = ack->duplicate};
}

void topics::async_publish(topic_message msg, completion<publish_result> done) {
  store(*transport_, prepare(ns_, transport_->clock()->now(), std::move(msg)), std::move(done));
}

void topics::async_publish(sealed_envelope env, completion<publish_result> done) {
  store(*transport_, prepare(ns_, std::move(env)), std::move(done));
}

result<std::unique_ptr<topic_subscription>> topics::subscribe(
    const topic_pattern& pattern, replay_from from,
    std::function<bool(const topic_event&)> on_event,
    std::function<void(std::uint64_t last_seq)> on_dropped) {
  if (!on_event) return unexpected(errc::bad_request, "subscribe needs an on_event callback");
  replay_request request{.stream = stream_, .filter_subject = subjects::topic_filter(ns_, pattern)};
  switch (from.from) {
    case replay_from::kind::new_events: request.start = deliver_policy::new_messages; break;
    case replay_from::kind::all: request.start = deliver_policy::all; break;
    case replay_from::kind::last: request.start = deliver_policy::last; break;
    case replay_from::kind::sequence:
      if (from.seq == 0) {
        return unexpected(errc::bad_request, "a replay from a sequence starts at 1 or later");
      }
      request.start = deliver_policy::by_start_sequence;
      request.start_seq = from.seq;
      break;
    case replay_from::kind::time:
      request.start = deliver_policy::by_start_time;
      request.start_time = from.time;
      break;
    default: return unexpected(errc::bad_request, "unknown replay start");
  }
  auto state = std::make_shared<subscription_state>(ns_, pattern, std::move(on_event),
                                                    std::move(on_dropped));
  if (from.from == replay_from::kind::sequence) state->start_at(from.seq, std::nullopt);
  if (from.from == replay_from::kind::time) state->start_at(0, from.time);
  auto inner =
      transport_->subscribe_ordered(request, [state](const message& m) { state->handle(m); });
  if (!inner) return std::move(inner).error();
  state->attach(std::shared_ptr<subscription>(std::move(*inner)));
  return std::unique_ptr<topic_subscription>(
      std::make_unique<topic_subscription_impl>(std::move(state), transport_));
}

}  // namespace amp
