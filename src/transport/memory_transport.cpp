#include "amp/transport/memory.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "amp/subjects.hpp"
#include "detail/serial_queue.hpp"
#include "transport/stream_rules.hpp"

namespace amp {
namespace {

using namespace std::chrono_literals;
using detail::serial_queue;

std::atomic<std::uint64_t> next_instance_id{0};

// Handlers collected under the lock and run after it is released. Declare before the
// lock guard so that the guard is destroyed (unlocked) first. A handler that throws is
// reported to the sink and the others still run.
class deferred {
 public:
  explicit deferred(const detail::handler_error_sink& sink) : sink_(sink) {}
  deferred(const deferred&) = delete;
  deferred& operator=(const deferred&) = delete;
  ~deferred() {
    for (auto& fn : calls_) detail::call_guarded(sink_, "the memory transport", fn);
  }
  void add(std::function<void()> fn) { calls_.push_back(std::move(fn)); }
  template <class T>
  void complete(completion<T> done, result<T> r) {
    calls_.push_back([done = std::move(done), r = std::move(r)]() mutable { done(std::move(r)); });
  }
  void drain(std::shared_ptr<serial_queue> q) {
    calls_.push_back([q = std::move(q)] { q->drain(); });
  }

 private:
  const detail::handler_error_sink& sink_;
  std::vector<std::function<void()>> calls_;
};

unexpected missing(std::string_view what, std::string_view name) {
  return unexpected(errc::not_found, fmt::format("{} \"{}\" not found", what, name));
}

struct consumer_state;

struct stored_message {
  message msg;  // stream, subject, data, headers, seq, time
  std::size_t bytes = 0;
  std::optional<time_point> expires;     // a KV revision's per-key TTL
  std::vector<consumer_state*> holders;  // the consumers that have it pending
};

struct pending_delivery {
  std::uint64_t deliveries = 0;
  time_point deadline;
};

struct fetch_waiter {
  std::uint64_t id = 0;
  std::size_t batch = 1;
  time_point deadline;
  completion<std::vector<message>> done;
};

struct ordered_sub {
  std::string filter;
  std::uint64_t first_seq = 1;  // a start beyond the end: live messages before it are skipped
  time_point not_before{};      // a start time in the future: the same for earlier messages
  std::shared_ptr<serial_queue> queue;
  std::function<void(const message&)> on_message;
};

// A `subscribe_core` subscription.
struct core_sub {
  std::string filter;
  std::shared_ptr<serial_queue> queue;
  std::function<void(const message&)> on_message;
};

struct consumer_state {
  consumer_config config;
  std::uint64_t uid = 0;  // distinguishes a consumer from a deleted one of the same name
  std::uint64_t next_seq = 1;
  std::uint64_t delivered_stream_seq = 0;
  std::uint64_t consumer_seq = 0;
  std::map<std::uint64_t, pending_delivery> pending;  // by stream sequence
  // No pending delivery that may be delivered again falls due before this: a lower bound,
  // lowered wherever a deadline is set, so `collect` looks through `pending` only from then.
  time_point due_hint = time_point::max();
  std::deque<fetch_waiter> waiters;
  timer_id wake_timer = 0;
  time_point wake_at;
  // With an inactive_threshold: the last use, and one timer that looks again at or after
  // last use + threshold (a use moves `last_used` only; the timer re-arms itself).
  time_point last_used;
  timer_id idle_timer = 0;
  time_point idle_at;
};

// A filter without wildcards matches one subject: itself.
bool is_concrete(std::string_view filter) {
  return !filter.empty() && filter.find_first_of("*>") == std::string_view::npos;
}

struct by_durable {
  bool operator()(const consumer_state* a, const consumer_state* b) const {
    return a->config.durable < b->config.durable;
  }
};

struct stream_state_impl {
  stream_config config;
  std::map<std::uint64_t, stored_message> msgs;
  std::unordered_map<std::string, std::set<std::uint64_t>> by_subject;
  std::uint64_t last_seq = 0;
  std::uint64_t bytes = 0;
  std::unordered_map<std::string, std::pair<std::uint64_t, time_point>> dedup;
  std::deque<std::pair<time_point, std::string>> dedup_order;
  std::map<std::string, consumer_state, std::less<>> consumers;
  // The consumers again, so that a publish or an overlap check looks only at those that
  // can match: by filter when it is concrete, and the others (wildcards, no filter).
  std::unordered_map<std::string, std::vector<consumer_state*>> by_filter;
  std::set<consumer_state*, by_durable> wildcard_consumers;
  std::vector<std::shared_ptr<ordered_sub>> subs;

  stream_state_impl() = default;
  stream_state_impl(const stream_state_impl&) = delete;  // the indexes point into itself
  stream_state_impl& operator=(const stream_state_impl&) = delete;

  void index(consumer_state& c) {
    if (is_concrete(c.config.filter_subject)) {
      by_filter[c.config.filter_subject].push_back(&c);
    } else {
      wildcard_consumers.insert(&c);
    }
  }

  void unindex(consumer_state& c) {
    if (!is_concrete(c.config.filter_subject)) {
      wildcard_consumers.erase(&c);
      return;
    }
    auto it = by_filter.find(c.config.filter_subject);
    if (it == by_filter.end()) return;
    std::erase(it->second, &c);
    if (it->second.empty()) by_filter.erase(it);
  }

  // Calls `fn` with each consumer whose filter matches `subject`, in no particular order.
  template <class F>
  void for_each_matching(const std::string& subject, F&& fn) const {
    if (auto it = by_filter.find(subject); it != by_filter.end()) {
      for (auto* c : it->second) fn(*c);
    }
    for (auto* c : wildcard_consumers) {
      if (c->config.filter_subject.empty() ||
          subjects::subject_matches(c->config.filter_subject, subject)) {
        fn(*c);
      }
    }
  }
};

struct kv_watcher {
  std::string filter;
  std::shared_ptr<serial_queue> queue;
  std::function<void(const kv_entry&)> on_entry;
};

// A bucket's revisions are the messages of its stream (`kv_stream_name`), as on JetStream,
// so that consumers read them like any stream's; the bucket keeps the rest.
struct bucket_state {
  kv_config config;
  std::string stream;  // kv_stream_name(bucket)
  std::string prefix;  // "$KV.<bucket>."
  std::vector<std::shared_ptr<kv_watcher>> watchers;
  // Per key, one timer at the earliest per-key TTL of its revisions; when it fires, the
  // next one is armed for what is left.
  std::map<std::string, std::pair<timer_id, time_point>, std::less<>> ttl_timers;
  bool ttl_written = false;  // a write had a per-key TTL: until then, nothing expires by key
};

class queue_subscription final : public subscription {
 public:
  explicit queue_subscription(std::shared_ptr<serial_queue> q) : queue_(std::move(q)) {}
  ~queue_subscription() override { stop(); }
  void stop() noexcept override { queue_->stop(); }

 private:
  std::shared_ptr<serial_queue> queue_;
};

class memory_backend final : public transport, public std::enable_shared_from_this<memory_backend> {
 public:
  memory_backend(std::shared_ptr<amp::clock> clock, detail::handler_error_sink sink)
      : sink_(std::move(sink)), clock_(std::move(clock)), instance_(++next_instance_id) {}

  ~memory_backend() override {
    std::lock_guard lock(mu_);
    for (auto& [name, s] : streams_) {
      for (auto& [cname, c] : s.consumers) {
        if (c.wake_timer) clock_->cancel(c.wake_timer);
        if (c.idle_timer) clock_->cancel(c.idle_timer);
      }
    }
    for (auto id : ttl_timers_) clock_->cancel(id);
  }

  void handler_threw(std::string_view where) noexcept override {
    detail::report_current_exception(sink_, where);
  }

  capabilities caps() const override {
    return {.backend = "memory", .persistent = false, .per_key_ttl = true};
  }

  std::shared_ptr<amp::clock> clock() const override { return clock_; }

  result<void> ping() override { return {}; }

  // ----- streams ------------------------------------------------------------------

  result<stream_info> do_ensure_stream(const stream_config& config) override {
    std::lock_guard lock(mu_);
    if (auto it = streams_.find(config.name); it != streams_.end()) {
      if (auto diff = detail::differing_setting(it->second.config, config); !diff.empty()) {
        return unexpected(errc::conflict, fmt::format("stream \"{}\" exists with a different {}",
                                                      config.name, diff));
      }
      return info(it->second);
    }
    if (auto free = check_subjects_free(config); !free) return free.error();
    auto& s = streams_[config.name];
    s.config = config;
    return info(s);
  }

  // No other stream may capture a subject of `config`'s.
  result<void> check_subjects_free(const stream_config& config) const {
    for (const auto& [name, other] : streams_) {
      for (const auto& mine : config.subjects) {
        for (const auto& theirs : other.config.subjects) {
          if (subjects::filters_overlap(mine, theirs)) {
            return unexpected(
                errc::conflict,
                fmt::format("subjects \"{}\" overlap stream \"{}\" (\"{}\")", mine, name, theirs));
          }
        }
      }
    }
    return {};
  }

  result<stream_info> do_update_stream(const stream_config& config) override {
    std::lock_guard lock(mu_);
    auto* s = find_stream(config.name);
    if (!s) return missing("stream", config.name);
    if (auto fixed = detail::fixed_setting_change(s->config, config); !fixed.empty()) {
      return unexpected(errc::conflict,
                        fmt::format("stream \"{}\": its {} cannot be changed", config.name, fixed));
    }
    s->config = config;
    // A bucket's settings are its stream's, as on JetStream.
    if (auto* b = bucket_of_stream(config.name)) {
      b->config.history = static_cast<int>(config.max_msgs_per_subject);
      b->config.ttl = config.max_age;
      b->config.max_value_size = config.max_msg_size > 0 ? config.max_msg_size : -1;
      b->config.replicas = config.replicas;
    }
    expire_messages(*s);
    trim_subjects(*s);
    trim_to_limits(*s);
    return info(*s);
  }

  result<stream_info> do_stream_info_of(std::string_view stream) override {
    std::lock_guard lock(mu_);
    auto* s = find_stream(stream);
    if (!s) return missing("stream", stream);
    expire_messages(*s);
    return info(*s);
  }

  result<void> do_delete_stream(std::string_view stream) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto it = streams_.find(stream);
    if (it == streams_.end()) return missing("stream", stream);
    // A bucket's stream takes the bucket with it, as on JetStream.
    if (auto* b = bucket_of_stream(stream)) drop_bucket(buckets_.find(b->config.bucket));
    drop_stream(it, after);
    return {};
  }

  void drop_stream(std::map<std::string, stream_state_impl, std::less<>>::iterator it,
                   deferred& after) {
    for (auto& [cname, c] : it->second.consumers) {
      fail_waiters(c, cname, after);
      if (c.idle_timer) clock_->cancel(c.idle_timer);
    }
    for (auto& sub : it->second.subs) sub->queue->stop();
    streams_.erase(it);
  }

  result<std::map<std::string, std::uint64_t>> do_stream_subjects(
      std::string_view stream, std::string_view filter) override {
    std::lock_guard lock(mu_);
    auto* s = find_stream(stream);
    if (!s) return missing("stream", stream);
    expire_messages(*s);
    std::map<std::string, std::uint64_t> out;
    for (const auto& [subject, seqs] : s->by_subject) {
      if (!seqs.empty() && subjects::subject_matches(filter, subject))
        out.emplace(subject, seqs.size());
    }
    return out;
  }

  result<std::vector<std::string>> do_consumer_names(std::string_view stream) override {
    std::lock_guard lock(mu_);
    auto* s = find_stream(stream);
    if (!s) return missing("stream", stream);
    std::vector<std::string> out;
    for (const auto& [name, c] : s->consumers) out.push_back(name);
    return out;
  }

  result<message> do_get_message(std::string_view stream, std::uint64_t seq) override {
    std::lock_guard lock(mu_);
    auto stored = find_message(stream, seq);
    if (!stored) return stored.error();
    return stored->second->msg;
  }

  // The stream and its message at `seq`, messages past their age removed first.
  result<std::pair<stream_state_impl*, stored_message*>> find_message(std::string_view stream,
                                                                      std::uint64_t seq) {
    auto* s = find_stream(stream);
    if (!s) return missing("stream", stream);
    expire_messages(*s);
    auto it = s->msgs.find(seq);
    if (it == s->msgs.end()) {
      return unexpected(errc::not_found,
                        fmt::format("no message {} in stream \"{}\"", seq, stream));
    }
    return std::pair{s, &it->second};
  }

  void do_async_delete_message(std::string_view stream, std::uint64_t seq,
                               completion<void> done) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto r = delete_message_locked(stream, seq, after);
    after.complete<void>(std::move(done), std::move(r));
  }

  // A pending delivery of the message goes with it (JetStream drops it when it would be
  // redelivered; here at once), which may let a waiting fetch of its holders go on.
  result<void> delete_message_locked(std::string_view stream, std::uint64_t seq, deferred& after) {
    auto stored = find_message(stream, seq);
    if (!stored) return stored.error();
    auto [s, msg] = *stored;
    auto holders = msg->holders;
    remove_message(*s, seq);
    for (auto* c : holders) serve_waiters(*s, *c, after);
    return {};
  }

  result<message> do_get_last_message(std::string_view stream,
                                      std::string_view subject_filter) override {
    std::lock_guard lock(mu_);
    auto* s = find_stream(stream);
    if (!s) return missing("stream", stream);
    expire_messages(*s);
    auto seq = last_matching(*s, subject_filter);
    if (seq == 0) {
      return unexpected(errc::not_found, fmt::format("no message on \"{}\" in stream \"{}\"",
                                                     subject_filter, stream));
    }
    return s->msgs.at(seq).msg;
  }

  void do_async_publish(outgoing_message msg, completion<publish_ack> done) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    after.complete(std::move(done), publish_locked(std::move(msg), after));
  }

  // ----- consumers ----------------------------------------------------------------

  result<consumer_info> do_ensure_consumer(const consumer_config& config) override {
    std::lock_guard lock(mu_);
    auto* s = find_stream(config.stream);
    if (!s) return missing("stream", config.stream);
    if (auto r = detail::check_consumer_fits(s->config, config); !r) return r.error();
    if (auto it = s->consumers.find(config.durable); it != s->consumers.end()) {
      if (auto diff = detail::differing_setting(it->second.config, config); !diff.empty()) {
        return unexpected(errc::conflict, fmt::format("consumer \"{}\" exists with a different {}",
                                                      config.durable, diff));
      }
      return info(*s, it->second);
    }
    if (auto r = check_overlap(*s, config); !r) return r.error();
    expire_messages(*s);
    auto& c = s->consumers[config.durable];
    c.config = config;
    c.uid = ++last_uid_;
    // A start beyond the end is the next message stored, as JetStream moves it down.
    c.next_seq = std::min(start_sequence(*s, config.filter_subject, config.deliver,
                                         config.start_seq, config.start_time),
                          s->last_seq + 1);
    s->index(c);
    used(*s, c);
    return info(*s, c);
  }

  result<consumer_info> do_update_consumer(const consumer_config& config) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto* s = find_stream(config.stream);
    if (!s) return missing("stream", config.stream);
    auto it = s->consumers.find(config.durable);
    if (it == s->consumers.end()) return missing("consumer", config.durable);
    auto& old = it->second.config;
    if (old.deliver != config.deliver || old.start_seq != config.start_seq ||
        old.start_time != config.start_time) {
      return unexpected(errc::conflict, fmt::format("consumer \"{}\": the start position cannot "
                                                    "be changed",
                                                    config.durable));
    }
    if (auto r = detail::check_consumer_fits(s->config, config); !r) return r.error();
    if (auto r = check_overlap(*s, config); !r) return r.error();
    bool refiltered = old.filter_subject != config.filter_subject;
    if (refiltered) s->unindex(it->second);
    old = config;
    it->second.due_hint = time_point::min();  // max_deliver may have changed what is due
    if (refiltered) s->index(it->second);
    used(*s, it->second);
    serve_waiters(*s, it->second, after);
    return info(*s, it->second);
  }

  result<consumer_info> do_consumer_info_of(std::string_view stream,
                                            std::string_view durable) override {
    std::lock_guard lock(mu_);
    auto* s = find_stream(stream);
    if (!s) return missing("stream", stream);
    auto it = s->consumers.find(durable);
    if (it == s->consumers.end()) return missing("consumer", durable);
    expire_messages(*s);
    return info(*s, it->second);
  }

  result<void> do_delete_consumer(std::string_view stream, std::string_view durable) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto* s = find_stream(stream);
    if (!s) return missing("stream", stream);
    auto it = s->consumers.find(durable);
    if (it == s->consumers.end()) return missing("consumer", durable);
    remove_consumer(*s, it, after);
    return {};
  }

  void do_async_fetch(std::string_view stream, std::string_view durable, fetch_request request,
                      completion<std::vector<message>> done) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto fail = [&](error e) { after.complete<std::vector<message>>(std::move(done), e); };
    auto* s = find_stream(stream);
    if (!s) return fail(missing("stream", stream).value());
    auto it = s->consumers.find(durable);
    if (it == s->consumers.end()) return fail(missing("consumer", durable).value());
    auto& c = it->second;
    expire_messages(*s);
    auto now = clock_->now();
    used(*s, c);
    // Earlier waiters are served first; a new request only takes what they left.
    std::vector<message> got;
    if (c.waiters.empty()) got = collect(*s, c, request.batch, now);
    if (!got.empty() || request.max_wait <= duration::zero()) {
      after.complete<std::vector<message>>(std::move(done), std::move(got));
      return;
    }
    c.waiters.push_back(fetch_waiter{.id = ++last_uid_,
                                     .batch = request.batch,
                                     .deadline = now + request.max_wait,
                                     .done = std::move(done)});
    arm_wake(*s, c);
  }

  void do_async_acknowledge(const message& msg, ack_kind kind, duration nak_delay,
                            completion<void> done) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    after.complete(std::move(done), acknowledge_locked(msg, kind, nak_delay, after));
  }

  result<std::unique_ptr<subscription>> do_subscribe_ordered(
      const replay_request& request, std::function<void(const message&)> on_message) override {
    auto sub = std::make_shared<ordered_sub>();
    sub->filter = detail::filter_or_all(request.filter_subject);
    sub->queue = std::make_shared<serial_queue>(sink_);
    sub->on_message = std::move(on_message);
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto* s = find_stream(request.stream);
    if (!s) return missing("stream", request.stream);
    expire_messages(*s);
    auto from =
        start_sequence(*s, sub->filter, request.start, request.start_seq, request.start_time);
    sub->first_seq = from;
    if (request.start == deliver_policy::by_start_time) sub->not_before = request.start_time;
    for (auto it = s->msgs.lower_bound(from); it != s->msgs.end(); ++it) {
      if (subjects::subject_matches(sub->filter, it->second.msg.subject)) {
        push_message(*sub, it->second.msg);
      }
    }
    std::erase_if(s->subs, [](const auto& x) { return x->queue->stopped(); });
    s->subs.push_back(sub);
    after.drain(sub->queue);
    return std::unique_ptr<subscription>(std::make_unique<queue_subscription>(sub->queue));
  }

  // ----- core messages --------------------------------------------------------------

  result<void> do_publish_core(outgoing_message msg) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    // As on NATS, a stream that captures the subject stores the message too; the sender
    // hears nothing of it (nor of a stream that refuses it, or of none capturing it).
    auto stored = publish_locked(std::move(msg), after);
    static_cast<void>(stored);
    return {};
  }

  // Hands `msg` to the core subscriptions that match its subject, as NATS does with every
  // message sent, stored or not (`mu_` held).
  void tell_core_subs(const outgoing_message& msg, deferred& after) {
    if (core_subs_.empty()) return;
    std::erase_if(core_subs_, [](const auto& x) { return x->queue->stopped(); });
    std::shared_ptr<const message> heard;  // one copy for every subscriber
    for (auto& sub : core_subs_) {
      if (!subjects::subject_matches(sub->filter, msg.subject)) continue;
      if (!heard) {
        auto m = std::make_shared<message>();
        m->subject = msg.subject;
        m->data = msg.data;
        m->headers = msg.headers;
        if (!msg.msg_id.empty()) m->headers.emplace_back(detail::k_msg_id_header, msg.msg_id);
        heard = std::move(m);
      }
      sub->queue->push([fn = sub->on_message, heard] { fn(*heard); });
      after.drain(sub->queue);
    }
  }

  result<std::unique_ptr<subscription>> do_subscribe_core(
      std::string_view subject_filter, std::function<void(const message&)> on_message) override {
    auto sub = std::make_shared<core_sub>();
    sub->filter = std::string(subject_filter);
    sub->queue = std::make_shared<serial_queue>(sink_);
    sub->on_message = std::move(on_message);
    std::lock_guard lock(mu_);
    std::erase_if(core_subs_, [](const auto& x) { return x->queue->stopped(); });
    core_subs_.push_back(sub);
    return std::unique_ptr<subscription>(std::make_unique<queue_subscription>(sub->queue));
  }

  // ----- KV -----------------------------------------------------------------------

  result<void> do_ensure_bucket(const kv_config& config) override {
    std::lock_guard lock(mu_);
    if (auto it = buckets_.find(config.bucket); it != buckets_.end()) {
      if (auto diff = differing_setting(it->second.config, config); !diff.empty()) {
        return unexpected(errc::conflict, fmt::format("bucket \"{}\" exists with a different {}",
                                                      config.bucket, diff));
      }
      return {};
    }
    auto sc = kv_stream_config(config);
    if (auto* existing = find_stream(sc.name)) {
      // A stream of that name made as a bucket's is that bucket, as on JetStream.
      if (auto diff = detail::differing_setting(existing->config, sc); !diff.empty()) {
        return unexpected(errc::conflict, fmt::format("bucket \"{}\": its stream \"{}\" exists "
                                                      "with a different {}",
                                                      config.bucket, sc.name, diff));
      }
    } else {
      if (auto free = check_subjects_free(sc); !free) return free.error();
      streams_[sc.name].config = sc;
    }
    auto& b = buckets_[config.bucket];
    b.config = config;
    b.stream = sc.name;
    b.prefix = kv_subject_of(config.bucket, "");
    return {};
  }

  result<void> do_delete_bucket(std::string_view bucket) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto it = buckets_.find(bucket);
    if (it == buckets_.end()) return missing("bucket", bucket);
    auto stream = streams_.find(it->second.stream);
    drop_bucket(it);
    if (stream != streams_.end()) drop_stream(stream, after);
    return {};
  }

  void drop_bucket(std::map<std::string, bucket_state, std::less<>>::iterator it) {
    for (auto& w : it->second.watchers) w->queue->stop();
    for (auto& [key, timer] : it->second.ttl_timers) {
      clock_->cancel(timer.first);
      ttl_timers_.erase(timer.first);
    }
    buckets_.erase(it);
  }

  void do_async_kv_get(std::string_view bucket, std::string_view key,
                       completion<kv_entry> done) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    after.complete(std::move(done), kv_get_locked(bucket, key, after));
  }

  void do_async_kv_create(std::string_view bucket, std::string_view key, std::string value,
                          std::optional<duration> ttl, completion<std::uint64_t> done) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    after.complete(std::move(done), kv_write(bucket, key, kv_op::put, std::move(value), ttl,
                                             write_rule::create, 0, after));
  }

  void do_async_kv_update(std::string_view bucket, std::string_view key, std::string value,
                          std::uint64_t expected_revision, std::optional<duration> ttl,
                          completion<std::uint64_t> done) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    after.complete(std::move(done), kv_write(bucket, key, kv_op::put, std::move(value), ttl,
                                             write_rule::update, expected_revision, after));
  }

  void do_async_kv_put(std::string_view bucket, std::string_view key, std::string value,
                       std::optional<duration> ttl, completion<std::uint64_t> done) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    after.complete(std::move(done), kv_write(bucket, key, kv_op::put, std::move(value), ttl,
                                             write_rule::any, 0, after));
  }

  void do_async_kv_delete(std::string_view bucket, std::string_view key,
                          completion<void> done) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto r = kv_write(bucket, key, kv_op::del, {}, std::nullopt, write_rule::any, 0, after);
    after.complete<void>(std::move(done), r ? result<void>() : result<void>(r.error()));
  }

  void do_async_kv_purge(std::string_view bucket, std::string_view key,
                         completion<void> done) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto r = kv_write(bucket, key, kv_op::purge, {}, std::nullopt, write_rule::any, 0, after);
    after.complete<void>(std::move(done), r ? result<void>() : result<void>(r.error()));
  }

  void do_async_kv_erase(std::string_view bucket, std::string_view key,
                         completion<void> done) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto r = kv_erase_locked(bucket, key, after);
    after.complete<void>(std::move(done), std::move(r));
  }

  result<void> kv_erase_locked(std::string_view bucket, std::string_view key, deferred& after) {
    auto* b = find_bucket(bucket);
    if (!b) return missing("bucket", bucket);
    if (auto t = b->ttl_timers.find(key); t != b->ttl_timers.end()) {
      clock_->cancel(t->second.first);
      ttl_timers_.erase(t->second.first);
      b->ttl_timers.erase(t);
    }
    remove_subject(stream_of(*b), b->prefix + std::string(key), after);
    return {};
  }

  result<std::vector<std::string>> do_kv_keys(std::string_view bucket) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto* b = find_bucket(bucket);
    if (!b) return missing("bucket", bucket);
    expire_bucket(*b, after);
    const auto& s = stream_of(*b);
    std::vector<std::string> keys;
    for (const auto& [subject, seqs] : s.by_subject) {
      if (!seqs.empty() && op_of(s.msgs.at(*seqs.rbegin()).msg.headers) == kv_op::put) {
        keys.push_back(subject.substr(b->prefix.size()));
      }
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  result<std::vector<kv_entry>> do_kv_history(std::string_view bucket,
                                              std::string_view key) override {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto* b = find_bucket(bucket);
    if (!b) return missing("bucket", bucket);
    auto& s = stream_of(*b);
    const auto subject = b->prefix + std::string(key);
    expire_messages(s);
    expire_key(*b, s, subject, after);
    auto it = s.by_subject.find(subject);
    if (it == s.by_subject.end() || it->second.empty()) return missing("key", key);
    std::vector<kv_entry> out;
    for (auto seq : it->second) out.push_back(entry_of(*b, s.msgs.at(seq).msg));
    return out;
  }

  result<std::unique_ptr<subscription>> do_kv_watch(std::string_view bucket,
                                                    const kv_watch_options& options,
                                                    kv_watch_handlers handlers) override {
    std::string filter = options.key_filter.empty() ? ">" : options.key_filter;
    auto w = std::make_shared<kv_watcher>();
    w->filter = filter;
    w->queue = std::make_shared<serial_queue>(sink_);
    w->on_entry = std::move(handlers.on_entry);
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto* b = find_bucket(bucket);
    if (!b) return missing("bucket", bucket);
    expire_bucket(*b, after);
    if (!options.updates_only) {
      const auto& s = stream_of(*b);
      std::vector<std::uint64_t> initial;
      for (const auto& [subject, seqs] : s.by_subject) {
        if (seqs.empty() ||
            !subjects::subject_matches(filter, std::string_view(subject).substr(b->prefix.size())))
          continue;
        if (options.include_history) {
          initial.insert(initial.end(), seqs.begin(), seqs.end());
        } else if (op_of(s.msgs.at(*seqs.rbegin()).msg.headers) == kv_op::put) {
          initial.push_back(*seqs.rbegin());
        }
      }
      std::sort(initial.begin(), initial.end());
      for (auto seq : initial) {
        w->queue->push([w, e = entry_of(*b, s.msgs.at(seq).msg)] { w->on_entry(e); });
      }
    }
    if (handlers.on_caught_up) w->queue->push(std::move(handlers.on_caught_up));
    std::erase_if(b->watchers, [](const auto& x) { return x->queue->stopped(); });
    b->watchers.push_back(w);
    after.drain(w->queue);
    return std::unique_ptr<subscription>(std::make_unique<queue_subscription>(w->queue));
  }

 private:
  enum class write_rule { any, create, update };

  // ----- validation ---------------------------------------------------------------

  // On a work-queue stream every message belongs to at most one consumer.
  static result<void> check_overlap(const stream_state_impl& s, const consumer_config& c) {
    if (s.config.retention != retention_policy::work_queue) return {};
    auto mine = detail::filter_or_all(c.filter_subject);
    // Reports the overlapping consumer first by name.
    const consumer_state* clash = nullptr;
    auto consider = [&](const consumer_state& other) {
      if (other.config.durable == c.durable) return;
      if (clash && clash->config.durable < other.config.durable) return;
      if (subjects::filters_overlap(mine, detail::filter_or_all(other.config.filter_subject))) {
        clash = &other;
      }
    };
    if (is_concrete(mine)) {
      // Two concrete filters overlap only when equal.
      if (auto it = s.by_filter.find(mine); it != s.by_filter.end()) {
        for (const auto* other : it->second) consider(*other);
      }
      for (const auto* other : s.wildcard_consumers) consider(*other);
    } else {
      for (const auto& [name, other] : s.consumers) consider(other);
    }
    if (clash) {
      return unexpected(errc::conflict,
                        fmt::format("consumer \"{}\": filter \"{}\" overlaps consumer \"{}\" "
                                    "(\"{}\") on work-queue stream \"{}\"",
                                    c.durable, mine, clash->config.durable,
                                    detail::filter_or_all(clash->config.filter_subject), c.stream));
    }
    return {};
  }

  static std::string differing_setting(const kv_config& a, const kv_config& b) {
    if (a.history != b.history) return fmt::format("history ({} vs {})", a.history, b.history);
    if (a.ttl != b.ttl) return "ttl";
    if (a.storage != b.storage) return "storage";
    if (a.replicas != b.replicas) return "replicas";
    auto limit = [](std::int32_t v) { return v > 0 ? v : -1; };
    if (limit(a.max_value_size) != limit(b.max_value_size)) return "max_value_size";
    return {};
  }

  // ----- streams ------------------------------------------------------------------

  stream_state_impl* find_stream(std::string_view name) {
    auto it = streams_.find(name);
    return it == streams_.end() ? nullptr : &it->second;
  }

  static stream_info info(const stream_state_impl& s) {
    stream_info i{.config = s.config, .state = {}};
    i.state.messages = s.msgs.size();
    i.state.bytes = s.bytes;
    i.state.last_seq = s.last_seq;
    i.state.first_seq =
        s.msgs.empty() ? (s.last_seq == 0 ? 0 : s.last_seq + 1) : s.msgs.begin()->first;
    i.state.consumers = s.consumers.size();
    return i;
  }

  static std::uint64_t last_matching(const stream_state_impl& s, std::string_view filter) {
    if (is_concrete(filter)) {
      auto it = s.by_subject.find(std::string(filter));
      return it == s.by_subject.end() || it->second.empty() ? 0 : *it->second.rbegin();
    }
    std::uint64_t best = 0;
    for (const auto& [subject, seqs] : s.by_subject) {
      if (!seqs.empty() && subjects::subject_matches(filter, subject)) {
        best = std::max(best, *seqs.rbegin());
      }
    }
    return best;
  }

  static std::uint64_t start_sequence(const stream_state_impl& s, const std::string& filter,
                                      deliver_policy policy, std::uint64_t start_seq,
                                      time_point start_time) {
    switch (policy) {
      case deliver_policy::all: return 1;
      case deliver_policy::new_messages: return s.last_seq + 1;
      case deliver_policy::last: {
        auto seq = last_matching(s, detail::filter_or_all(filter));
        return seq == 0 ? s.last_seq + 1 : seq;
      }
      case deliver_policy::by_start_sequence: return std::max<std::uint64_t>(start_seq, 1);
      case deliver_policy::by_start_time:
        for (const auto& [seq, m] : s.msgs) {
          if (m.msg.time >= start_time) return seq;
        }
        return s.last_seq + 1;
    }
    return 1;
  }

  // What JetStream counts against max_msg_size besides the data: the header block as sent
  // ("NATS/1.0", a line per header, Nats-Msg-Id among them, and the blank line).
  static std::size_t header_block_bytes(const outgoing_message& m, std::string_view msg_id) {
    if (m.headers.empty() && msg_id.empty()) return 0;
    constexpr std::string_view k_status_line = "NATS/1.0\r\n";
    std::size_t n = k_status_line.size() + 2;
    for (const auto& [k, v] : m.headers) n += k.size() + 2 + v.size() + 2;
    if (!msg_id.empty()) n += detail::k_msg_id_header.size() + 2 + msg_id.size() + 2;
    return n;
  }

  static std::size_t message_bytes(const outgoing_message& m) {
    std::size_t n = m.subject.size() + m.data.size();
    for (const auto& [k, v] : m.headers) n += k.size() + v.size();
    return n;
  }

  void remove_message(stream_state_impl& s, std::uint64_t seq) {
    auto it = s.msgs.find(seq);
    if (it == s.msgs.end()) return;
    s.bytes -= it->second.bytes;
    auto sub = s.by_subject.find(it->second.msg.subject);
    if (sub != s.by_subject.end()) {
      sub->second.erase(seq);
      if (sub->second.empty()) s.by_subject.erase(sub);
    }
    for (auto* c : it->second.holders) c->pending.erase(seq);
    s.msgs.erase(it);
  }

  // Removes the oldest messages until every subject is within its limit.
  void trim_subjects(stream_state_impl& s) {
    const auto& cfg = s.config;
    if (cfg.max_msgs_per_subject > 0) {
      std::vector<std::uint64_t> over;
      for (const auto& [subject, seqs] : s.by_subject) {
        auto extra = seqs.size() > static_cast<std::size_t>(cfg.max_msgs_per_subject)
                         ? seqs.size() - static_cast<std::size_t>(cfg.max_msgs_per_subject)
                         : 0;
        for (auto it = seqs.begin(); extra > 0; ++it, --extra) over.push_back(*it);
      }
      for (auto seq : over) remove_message(s, seq);
    }
  }

  // Removes the oldest messages until the stream is within its message and byte limits.
  void trim_to_limits(stream_state_impl& s) {
    const auto& cfg = s.config;
    while ((cfg.max_msgs > 0 && s.msgs.size() > static_cast<std::size_t>(cfg.max_msgs)) ||
           (cfg.max_bytes > 0 && s.bytes > static_cast<std::uint64_t>(cfg.max_bytes))) {
      remove_message(s, s.msgs.begin()->first);
    }
  }

  void expire_messages(stream_state_impl& s) {
    if (s.config.max_age <= duration::zero()) return;
    auto cutoff = clock_->now() - s.config.max_age;
    while (!s.msgs.empty() && s.msgs.begin()->second.msg.time <= cutoff) {
      remove_message(s, s.msgs.begin()->first);
    }
  }

  result<publish_ack> publish_locked(outgoing_message msg, deferred& after) {
    stream_state_impl* s = nullptr;
    const std::string* stream_name = nullptr;  // the key of `s` in streams_
    for (auto& [name, candidate] : streams_) {
      for (const auto& filter : candidate.config.subjects) {
        if (subjects::subject_matches(filter, msg.subject)) {
          s = &candidate;
          stream_name = &name;
        }
      }
    }
    tell_core_subs(msg, after);
    if (!s) {
      return unexpected(errc::not_found,
                        fmt::format("no stream captures subject \"{}\"", msg.subject));
    }
    const auto& cfg = s->config;
    auto now = clock_->now();
    expire_messages(*s);
    // The id's entry is made by the one lookup that finds a duplicate, and taken back if the
    // message is refused.
    std::string id = std::move(msg.msg_id);
    const bool keyed = !id.empty();
    decltype(s->dedup)::iterator id_entry;
    if (keyed) {
      while (!s->dedup_order.empty() &&
             s->dedup_order.front().first + cfg.duplicate_window <= now) {
        auto& [t, old] = s->dedup_order.front();
        auto it = s->dedup.find(old);
        if (it != s->dedup.end() && it->second.second == t) s->dedup.erase(it);
        s->dedup_order.pop_front();
      }
      auto [it, fresh] = s->dedup.try_emplace(id, 0, now);
      if (!fresh) {
        return publish_ack{.stream = *stream_name, .seq = it->second.first, .duplicate = true};
      }
      id_entry = it;
    }
    auto refuse = [&](errc code, std::string why) {
      if (keyed) s->dedup.erase(id_entry);
      return unexpected(code, std::move(why));
    };
    if (const auto size = msg.data.size() + header_block_bytes(msg, id);
        cfg.max_msg_size > 0 && size > static_cast<std::size_t>(cfg.max_msg_size)) {
      return refuse(errc::payload_too_large,
                    fmt::format("message of {} bytes with its headers exceeds max_msg_size {} of "
                                "stream \"{}\"",
                                size, cfg.max_msg_size, *stream_name));
    }
    if (refuses_new(*s, msg.subject, message_bytes(msg))) {
      return refuse(errc::limit_exceeded, fmt::format("stream \"{}\" is full", *stream_name));
    }
    auto* bucket = bucket_of_stream(*stream_name);  // then a KV write: see below
    const bool rollup = bucket && find_header(msg.headers, "Nats-Rollup") == "sub";
    // JetStream keeps the id with the message, as the header it came in.
    if (keyed) msg.headers.emplace_back(detail::k_msg_id_header, id);
    auto seq = store(*s, *stream_name, std::move(msg), std::nullopt, after);
    if (keyed) {
      id_entry->second.first = seq;
      s->dedup_order.emplace_back(now, std::move(id));
    }
    // On a bucket's subject, a KV write: its watchers hear it, and a rollup (as a purge
    // sends it) leaves only it of its key.
    if (bucket) {
      if (auto stored = s->msgs.find(seq); stored != s->msgs.end()) {
        if (rollup) {
          const auto& seqs = s->by_subject.at(stored->second.msg.subject);
          const std::vector<std::uint64_t> older(seqs.begin(), seqs.lower_bound(seq));
          for (auto old : older) remove_message(*s, old);
        }
        tell_watchers(*bucket, stored->second.msg, after);
      }
    }
    return publish_ack{.stream = *stream_name, .seq = seq, .duplicate = false};
  }

  // Discard new: the stream at its message or byte limit refuses a message, unless its
  // subject at its own limit makes the room by dropping its oldest (JetStream 2.9, which
  // has no discard_new_per_subject).
  static bool refuses_new(const stream_state_impl& s, const std::string& subject,
                          std::size_t bytes) {
    const auto& cfg = s.config;
    if (cfg.discard != discard_policy::new_messages) return false;
    auto same = s.by_subject.find(subject);
    const bool subject_full =
        cfg.max_msgs_per_subject > 0 && same != s.by_subject.end() &&
        same->second.size() >= static_cast<std::size_t>(cfg.max_msgs_per_subject);
    return (!subject_full && cfg.max_msgs > 0 &&
            s.msgs.size() >= static_cast<std::size_t>(cfg.max_msgs)) ||
           (cfg.max_bytes > 0 && s.bytes + bytes > static_cast<std::uint64_t>(cfg.max_bytes));
  }

  // Stores `msg` as the stream's next message, within its limits, and hands it to the
  // ordered subscriptions and waiting fetches that match. Returns its sequence.
  std::uint64_t store(stream_state_impl& s, const std::string& stream_name, outgoing_message msg,
                      std::optional<time_point> expires, deferred& after) {
    const auto& cfg = s.config;
    const auto seq = ++s.last_seq;
    const auto bytes = message_bytes(msg);
    auto& same_subject = s.by_subject[msg.subject];  // stays valid: no other subject is added
    same_subject.insert(seq);
    auto& stored = s.msgs[seq];
    stored.bytes = bytes;
    stored.expires = expires;
    stored.msg.stream = stream_name;
    stored.msg.subject = std::move(msg.subject);
    stored.msg.data = std::move(msg.data);
    stored.msg.headers = std::move(msg.headers);
    stored.msg.seq = seq;
    stored.msg.time = clock_->now();
    s.bytes += bytes;
    const auto subject = stored.msg.subject;
    if (cfg.max_msgs_per_subject > 0) {
      while (same_subject.size() > static_cast<std::size_t>(cfg.max_msgs_per_subject)) {
        remove_message(s, *same_subject.begin());
      }
    }
    trim_to_limits(s);
    if (auto kept = s.msgs.find(seq); kept != s.msgs.end()) {
      const auto& stored_msg = kept->second.msg;
      std::erase_if(s.subs, [](const auto& x) { return x->queue->stopped(); });
      for (auto& sub : s.subs) {
        if (subjects::subject_matches(sub->filter, subject) && seq >= sub->first_seq &&
            stored_msg.time >= sub->not_before) {
          push_message(*sub, stored_msg);
          after.drain(sub->queue);
        }
      }
      std::vector<consumer_state*> waiting;
      s.for_each_matching(subject, [&](consumer_state& c) {
        if (!c.waiters.empty()) waiting.push_back(&c);
      });
      std::sort(waiting.begin(), waiting.end(), by_durable{});  // served in name order
      for (auto* c : waiting) serve_waiters(s, *c, after);
    }
    return seq;
  }

  static void push_message(ordered_sub& sub, const message& m) {
    sub.queue->push([q = sub.on_message, m] { q(m); });
  }

  // ----- consumers ----------------------------------------------------------------

  static consumer_info info(const stream_state_impl& s, const consumer_state& c) {
    consumer_info i{.config = c.config};
    if (is_concrete(c.config.filter_subject)) {
      if (auto it = s.by_subject.find(c.config.filter_subject); it != s.by_subject.end()) {
        i.num_pending = static_cast<std::uint64_t>(
            std::distance(it->second.lower_bound(c.next_seq), it->second.end()));
      }
    } else {
      auto filter = detail::filter_or_all(c.config.filter_subject);
      for (auto it = s.msgs.lower_bound(c.next_seq); it != s.msgs.end(); ++it) {
        if (subjects::subject_matches(filter, it->second.msg.subject)) ++i.num_pending;
      }
    }
    i.num_ack_pending = c.pending.size();
    for (const auto& [seq, p] : c.pending) {
      if (p.deliveries > 1) ++i.num_redelivered;
    }
    i.delivered_stream_seq = c.delivered_stream_seq;
    i.ack_floor_stream_seq =
        c.pending.empty() ? c.delivered_stream_seq : c.pending.begin()->first - 1;
    return i;
  }

  std::string token(std::string_view stream, const consumer_state& c, std::uint64_t seq,
                    std::uint64_t delivery) const {
    // '.' cannot occur in stream or consumer names, so it separates the fields safely.
    return fmt::format("$MEM.{}.{}.{}.{}.{}.{}", instance_, stream, c.config.durable, c.uid, seq,
                       delivery);
  }

  message delivered(const stream_state_impl& s, const consumer_state& c, std::uint64_t seq,
                    std::uint64_t delivery, time_point now) const {
    message m = s.msgs.at(seq).msg;
    m.consumer = c.config.durable;
    m.delivered_at = now;
    m.delivery_count = delivery;
    m.consumer_seq = c.consumer_seq;
    m.ack_token = token(s.config.name, c, seq, delivery);
    return m;
  }

  std::vector<message> collect(stream_state_impl& s, consumer_state& c, std::size_t batch,
                               time_point now) {
    std::vector<message> out;
    // Redeliveries that are due, in stream order.
    if (c.due_hint <= now) {
      auto next_due = time_point::max();
      auto it = c.pending.begin();
      for (; it != c.pending.end() && out.size() < batch;) {
        auto& [seq, p] = *it;
        if (!s.msgs.count(seq)) {
          it = c.pending.erase(it);
          continue;
        }
        bool exhausted = c.config.max_deliver > 0 &&
                         p.deliveries >= static_cast<std::uint64_t>(c.config.max_deliver);
        if (p.deadline <= now && !exhausted) {
          ++p.deliveries;
          p.deadline = now + c.config.ack_wait;
          ++c.consumer_seq;
          out.push_back(delivered(s, c, seq, p.deliveries, now));
        }
        if (!exhausted) next_due = std::min(next_due, p.deadline);
        ++it;
      }
      // Stopped by the batch: what was not looked at may be due already.
      c.due_hint = it == c.pending.end() ? next_due : now;
    }
    while (out.size() < batch &&
           (c.config.max_ack_pending <= 0 ||
            c.pending.size() < static_cast<std::size_t>(c.config.max_ack_pending))) {
      auto it = next_match(s, c.config.filter_subject, c.next_seq);
      if (it == s.msgs.end()) {
        c.next_seq = s.last_seq + 1;
        break;
      }
      auto seq = it->first;
      c.next_seq = seq + 1;
      c.delivered_stream_seq = seq;
      auto [p, fresh] = c.pending.insert_or_assign(
          seq, pending_delivery{.deliveries = 1, .deadline = now + c.config.ack_wait});
      c.due_hint = std::min(c.due_hint, p->second.deadline);
      if (fresh) it->second.holders.push_back(&c);
      ++c.consumer_seq;
      out.push_back(delivered(s, c, seq, 1, now));
    }
    return out;
  }

  // The first message at or after `from` that `filter` matches; `s.msgs.end()` if none.
  static std::map<std::uint64_t, stored_message>::iterator next_match(stream_state_impl& s,
                                                                      const std::string& filter,
                                                                      std::uint64_t from) {
    if (is_concrete(filter)) {
      auto same = s.by_subject.find(filter);
      if (same == s.by_subject.end()) return s.msgs.end();
      auto seq = same->second.lower_bound(from);
      return seq == same->second.end() ? s.msgs.end() : s.msgs.find(*seq);
    }
    auto it = s.msgs.lower_bound(from);
    if (filter.empty()) return it;
    while (it != s.msgs.end() && !subjects::subject_matches(filter, it->second.msg.subject)) ++it;
    return it;
  }

  void serve_waiters(stream_state_impl& s, consumer_state& c, deferred& after) {
    auto now = clock_->now();
    while (!c.waiters.empty()) {
      auto& w = c.waiters.front();
      if (w.deadline <= now) {
        after.complete<std::vector<message>>(std::move(w.done), std::vector<message>{});
        c.waiters.pop_front();
        used(s, c);
        continue;
      }
      auto got = collect(s, c, w.batch, now);
      if (got.empty()) break;
      after.complete<std::vector<message>>(std::move(w.done), std::move(got));
      c.waiters.pop_front();
      used(s, c);
    }
    arm_wake(s, c);
  }

  void fail_waiters(consumer_state& c, std::string_view name, deferred& after) {
    for (auto& w : c.waiters) {
      after.complete<std::vector<message>>(std::move(w.done), missing("consumer", name).value());
    }
    c.waiters.clear();
    if (c.wake_timer) clock_->cancel(c.wake_timer);
    c.wake_timer = 0;
  }

  // Keeps one clock timer per consumer with waiters, at the earliest moment something
  // changes for them: a waiter's deadline or a redelivery falling due.
  void arm_wake(stream_state_impl& s, consumer_state& c) {
    if (c.waiters.empty()) {
      if (c.wake_timer) clock_->cancel(c.wake_timer);
      c.wake_timer = 0;
      return;
    }
    auto now = clock_->now();
    auto at = c.waiters.front().deadline;
    for (const auto& w : c.waiters) at = std::min(at, w.deadline);
    for (const auto& [seq, p] : c.pending) {
      bool exhausted = c.config.max_deliver > 0 &&
                       p.deliveries >= static_cast<std::uint64_t>(c.config.max_deliver);
      if (p.deadline > now && !exhausted) at = std::min(at, p.deadline);
    }
    if (c.wake_timer && c.wake_at == at) return;
    if (c.wake_timer) clock_->cancel(c.wake_timer);
    c.wake_at = at;
    std::weak_ptr<memory_backend> weak = weak_from_this();
    c.wake_timer = clock_->call_at(
        at, [weak, stream = s.config.name, durable = c.config.durable, uid = c.uid] {
          if (auto self = weak.lock()) self->on_wake(stream, durable, uid);
        });
  }

  void on_wake(const std::string& stream, const std::string& durable, std::uint64_t uid) {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto* s = find_stream(stream);
    if (!s) return;
    auto it = s->consumers.find(durable);
    if (it == s->consumers.end() || it->second.uid != uid) return;
    it->second.wake_timer = 0;
    expire_messages(*s);
    serve_waiters(*s, it->second, after);
  }

  // Removes a consumer; what it had pending stays in the stream for others.
  void remove_consumer(stream_state_impl& s,
                       std::map<std::string, consumer_state, std::less<>>::iterator it,
                       deferred& after) {
    auto& c = it->second;
    fail_waiters(c, it->first, after);
    if (c.idle_timer) clock_->cancel(c.idle_timer);
    for (const auto& [seq, p] : c.pending) {
      if (auto m = s.msgs.find(seq); m != s.msgs.end()) std::erase(m->second.holders, &c);
    }
    s.unindex(c);
    s.consumers.erase(it);
  }

  // Records a use of a consumer with an inactive_threshold (JetStream: a create, update,
  // pull or acknowledgement; not an info request).
  void used(stream_state_impl& s, consumer_state& c) {
    c.last_used = clock_->now();
    arm_idle(s, c);
  }

  // Keeps the idle timer at or before last use + threshold.
  void arm_idle(stream_state_impl& s, consumer_state& c) {
    auto threshold = c.config.inactive_threshold;
    if (threshold <= duration::zero()) {
      if (c.idle_timer) clock_->cancel(c.idle_timer);
      c.idle_timer = 0;
      return;
    }
    auto at = c.last_used + threshold;
    if (c.idle_timer && c.idle_at <= at) return;  // it fires first and looks again
    if (c.idle_timer) clock_->cancel(c.idle_timer);
    c.idle_at = at;
    std::weak_ptr<memory_backend> weak = weak_from_this();
    c.idle_timer = clock_->call_at(
        at, [weak, stream = s.config.name, durable = c.config.durable, uid = c.uid] {
          if (auto self = weak.lock()) self->on_idle(stream, durable, uid);
        });
  }

  void on_idle(const std::string& stream, const std::string& durable, std::uint64_t uid) {
    deferred after(sink_);
    std::lock_guard lock(mu_);
    auto* s = find_stream(stream);
    if (!s) return;
    auto it = s->consumers.find(durable);
    if (it == s->consumers.end() || it->second.uid != uid) return;
    auto& c = it->second;
    c.idle_timer = 0;
    auto now = clock_->now();
    if (!c.waiters.empty()) c.last_used = now;  // a waiting fetch is use
    if (c.config.inactive_threshold > duration::zero() &&
        c.last_used + c.config.inactive_threshold <= now) {
      remove_consumer(*s, it, after);
      return;
    }
    arm_idle(*s, c);
  }

  result<void> acknowledge_locked(const message& msg, ack_kind kind, duration nak_delay,
                                  deferred& after) {
    // $MEM.<instance>.<stream>.<consumer>.<uid>.<seq>.<delivery>
    std::vector<std::string_view> parts;
    std::string_view rest = msg.ack_token;
    while (true) {
      auto dot = rest.find('.');
      parts.push_back(rest.substr(0, dot));
      if (dot == std::string_view::npos) break;
      rest.remove_prefix(dot + 1);
    }
    auto number = [](std::string_view v, std::uint64_t& out) {
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
      return ec == std::errc() && p == v.data() + v.size();
    };
    std::uint64_t instance = 0, uid = 0, seq = 0, delivery = 0;
    if (parts.size() != 7 || parts[0] != "$MEM" || !number(parts[1], instance) ||
        !number(parts[4], uid) || !number(parts[5], seq) || !number(parts[6], delivery) ||
        instance != instance_) {
      return unexpected(errc::bad_request, "not an ack token of this transport");
    }
    auto* s = find_stream(parts[2]);
    if (!s) return missing("stream", parts[2]);
    auto cit = s->consumers.find(parts[3]);
    if (cit == s->consumers.end() || cit->second.uid != uid) return missing("consumer", parts[3]);
    auto& c = cit->second;
    used(*s, c);
    auto pit = c.pending.find(seq);
    if (pit == c.pending.end()) return {};  // no longer pending: JetStream ignores it
    auto now = clock_->now();
    switch (kind) {
      case ack_kind::in_progress:
        pit->second.deadline = now + c.config.ack_wait;
        c.due_hint = std::min(c.due_hint, pit->second.deadline);
        break;
      case ack_kind::nak:
        pit->second.deadline = now + std::max(nak_delay, duration::zero());
        c.due_hint = std::min(c.due_hint, pit->second.deadline);
        break;
      case ack_kind::ack:
      case ack_kind::term:
        if (auto m = s->msgs.find(seq); m != s->msgs.end()) std::erase(m->second.holders, &c);
        c.pending.erase(pit);
        if (s->config.retention == retention_policy::work_queue) {
          remove_message(*s, seq);
        } else if (s->config.retention == retention_policy::interest) {
          remove_if_no_interest(*s, seq);
        }
        break;
    }
    serve_waiters(*s, c, after);
    return {};
  }

  void remove_if_no_interest(stream_state_impl& s, std::uint64_t seq) {
    auto it = s.msgs.find(seq);
    if (it == s.msgs.end()) return;
    bool wanted = false;
    s.for_each_matching(it->second.msg.subject, [&](const consumer_state& c) {
      wanted = wanted || seq >= c.next_seq || c.pending.count(seq) > 0;
    });
    if (!wanted) remove_message(s, seq);
  }

  // ----- KV -----------------------------------------------------------------------

  bucket_state* find_bucket(std::string_view name) {
    auto it = buckets_.find(name);
    return it == buckets_.end() ? nullptr : &it->second;
  }

  // The bucket whose revisions `stream` keeps, if any.
  bucket_state* bucket_of_stream(std::string_view stream) {
    constexpr std::string_view k_prefix = "KV_";
    if (!stream.starts_with(k_prefix)) return nullptr;
    auto* b = find_bucket(stream.substr(k_prefix.size()));
    return b && b->stream == stream ? b : nullptr;
  }

  stream_state_impl& stream_of(const bucket_state& b) { return streams_.find(b.stream)->second; }

  // The stream of a bucket, configured as JetStream's KV makes it.
  static stream_config kv_stream_config(const kv_config& c) {
    return {.name = kv_stream_name(c.bucket),
            .subjects = {kv_subject_of(c.bucket, ">")},
            .retention = retention_policy::limits,
            .storage = c.storage,
            .max_msgs = -1,
            .max_bytes = -1,
            .max_msgs_per_subject = c.history,
            .max_msg_size = c.max_value_size > 0 ? c.max_value_size : -1,
            .max_age = c.ttl,
            .discard = discard_policy::new_messages,
            .duplicate_window = c.ttl > duration::zero() ? std::min<duration>(c.ttl, 2min) : 2min,
            .replicas = c.replicas};
  }

  static constexpr std::string_view k_kv_operation = "KV-Operation";
  static constexpr std::string_view k_marker_reason = "Nats-Marker-Reason";

  static kv_op op_of(const header_list& headers) {
    auto value = [&](std::string_view name) -> std::string_view {
      for (const auto& [k, v] : headers) {
        if (k == name) return v;
      }
      return {};
    };
    const auto op = value(k_kv_operation);
    if (op == "DEL") return kv_op::del;
    if (op == "PURGE") return value(k_marker_reason) == "MaxAge" ? kv_op::expired : kv_op::purge;
    return kv_op::put;
  }

  static header_list markers(kv_op op) {
    switch (op) {
      case kv_op::put: return {};
      case kv_op::del: return {{std::string(k_kv_operation), "DEL"}};
      case kv_op::purge: return {{std::string(k_kv_operation), "PURGE"}};
      case kv_op::expired:
        return {{std::string(k_kv_operation), "PURGE"}, {std::string(k_marker_reason), "MaxAge"}};
    }
    return {};
  }

  static kv_entry entry_of(const bucket_state& b, const message& m) {
    return {.bucket = b.config.bucket,
            .key = m.subject.substr(b.prefix.size()),
            .value = m.data,
            .revision = m.seq,
            .created = m.time,
            .op = op_of(m.headers)};
  }

  // The key's latest revision, or null.
  static const stored_message* latest(const stream_state_impl& s, const std::string& subject) {
    auto it = s.by_subject.find(subject);
    if (it == s.by_subject.end() || it->second.empty()) return nullptr;
    return &s.msgs.at(*it->second.rbegin());
  }

  // Removes every revision of a key; consumers that held one may take what follows.
  void remove_subject(stream_state_impl& s, const std::string& subject, deferred& after) {
    auto it = s.by_subject.find(subject);
    if (it == s.by_subject.end()) return;
    const std::vector<std::uint64_t> seqs(it->second.begin(), it->second.end());
    std::vector<consumer_state*> holders;
    for (auto seq : seqs) {
      const auto& h = s.msgs.at(seq).holders;
      holders.insert(holders.end(), h.begin(), h.end());
      remove_message(s, seq);
    }
    std::sort(holders.begin(), holders.end());
    holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
    for (auto* c : holders) serve_waiters(s, *c, after);
  }

  // Applies the bucket TTL and due per-key TTLs.
  void expire_bucket(bucket_state& b, deferred& after) {
    auto& s = stream_of(b);
    expire_messages(s);
    if (!b.ttl_written) return;
    std::vector<std::string> subjects;
    for (const auto& [subject, seqs] : s.by_subject) subjects.push_back(subject);
    for (const auto& subject : subjects) expire_key(b, s, subject, after);
  }

  // Removes the key's revisions whose per-key TTL ran out; when that was its latest value,
  // an `expired` marker takes the place of what is left.
  void expire_key(bucket_state& b, stream_state_impl& s, const std::string& subject,
                  deferred& after) {
    if (!b.ttl_written) return;
    const auto* last = latest(s, subject);
    if (!last) return;
    const auto now = clock_->now();
    const bool value_expired =
        last->expires && *last->expires <= now && op_of(last->msg.headers) == kv_op::put;
    std::vector<std::uint64_t> gone;
    for (auto seq : s.by_subject.at(subject)) {
      const auto& m = s.msgs.at(seq);
      if (m.expires && *m.expires <= now) gone.push_back(seq);
    }
    for (auto seq : gone) remove_message(s, seq);
    if (value_expired)
      append(b, s, kv_op::expired, kv_message(subject, kv_op::expired, {}), {}, after);
  }

  // A revision as its stream stores it.
  static outgoing_message kv_message(const std::string& subject, kv_op op, std::string value) {
    return {.subject = subject, .data = std::move(value), .headers = markers(op)};
  }

  // Stores the revision `m` of its key and tells the watchers. A purge or an expiry first
  // removes the key's earlier revisions.

  std::uint64_t append(bucket_state& b, stream_state_impl& s, kv_op op, outgoing_message m,
                       std::optional<time_point> expires, deferred& after) {
    if (op == kv_op::purge || op == kv_op::expired) remove_subject(s, m.subject, after);
    tell_core_subs(m, after);
    const auto seq = store(s, b.stream, std::move(m), expires, after);
    if (auto stored = s.msgs.find(seq); stored != s.msgs.end()) {
      tell_watchers(b, stored->second.msg, after);
    }
    return seq;
  }

  void tell_watchers(bucket_state& b, const message& m, deferred& after) {
    const auto key = std::string_view(m.subject).substr(b.prefix.size());
    std::erase_if(b.watchers, [](const auto& w) { return w->queue->stopped(); });
    for (auto& w : b.watchers) {
      if (subjects::subject_matches(w->filter, key)) {
        w->queue->push([w, e = entry_of(b, m)] { w->on_entry(e); });
        after.drain(w->queue);
      }
    }
  }

  result<kv_entry> kv_get_locked(std::string_view bucket, std::string_view key, deferred& after) {
    auto* b = find_bucket(bucket);
    if (!b) return missing("bucket", bucket);
    auto& s = stream_of(*b);
    const auto subject = b->prefix + std::string(key);
    expire_messages(s);
    expire_key(*b, s, subject, after);
    const auto* last = latest(s, subject);
    if (!last || op_of(last->msg.headers) != kv_op::put) return missing("key", key);
    return entry_of(*b, last->msg);
  }

  result<std::uint64_t> kv_write(std::string_view bucket, std::string_view key, kv_op op,
                                 std::string value, std::optional<duration> ttl, write_rule rule,
                                 std::uint64_t expected, deferred& after) {
    auto* b = find_bucket(bucket);
    if (!b) return missing("bucket", bucket);
    return kv_write(*b, key, op, std::move(value), ttl, rule, expected, after);
  }

  result<std::uint64_t> kv_write(bucket_state& b, std::string_view key, kv_op op, std::string value,
                                 std::optional<duration> ttl, write_rule rule,
                                 std::uint64_t expected, deferred& after) {
    if (b.config.max_value_size > 0 &&
        value.size() > static_cast<std::size_t>(b.config.max_value_size)) {
      return unexpected(errc::payload_too_large,
                        fmt::format("value of {} bytes exceeds max_value_size {} of bucket \"{}\"",
                                    value.size(), b.config.max_value_size, b.config.bucket));
    }
    auto& s = stream_of(b);
    const auto subject = b.prefix + std::string(key);
    expire_messages(s);
    expire_key(b, s, subject, after);
    const auto* last = latest(s, subject);
    if (rule == write_rule::create && last && op_of(last->msg.headers) == kv_op::put) {
      return unexpected(errc::conflict,
                        fmt::format("key \"{}\" exists (revision {})", key, last->msg.seq));
    }
    if (rule == write_rule::update && (!last || last->msg.seq != expected)) {
      return unexpected(errc::conflict,
                        fmt::format("key \"{}\": wrong last revision {} (expected {})", key,
                                    last ? last->msg.seq : 0, expected));
    }
    // A bucket's stream given limits of its own (update_stream) refuses as JetStream would.
    auto m = kv_message(subject, op, std::move(value));
    if (refuses_new(s, subject, message_bytes(m))) {
      return unexpected(
          errc::limit_exceeded,
          fmt::format("bucket \"{}\": its stream \"{}\" is full", b.config.bucket, b.stream));
    }
    std::optional<time_point> expires;
    if (ttl) {
      expires = clock_->now() + *ttl;
      b.ttl_written = true;
    }
    const auto revision = append(b, s, op, std::move(m), expires, after);
    if (expires) arm_ttl(b, std::string(key), *expires);
    return revision;
  }

  // One timer per key, for its latest write with a TTL (a newer write replaces it): when it
  // fires, that key alone is expired. Called under `mu_`.
  void arm_ttl(bucket_state& b, const std::string& key, time_point at) {
    auto existing = b.ttl_timers.find(key);
    if (existing != b.ttl_timers.end() && existing->second.second <= at) return;  // fires first
    std::weak_ptr<memory_backend> weak = weak_from_this();
    auto id = std::make_shared<timer_id>(0);
    *id = clock_->call_at(at, [weak, bucket = b.config.bucket, key, id] {
      auto self = weak.lock();
      if (!self) return;
      deferred after(self->sink_);
      std::lock_guard lock(self->mu_);
      self->ttl_timers_.erase(*id);
      auto* in = self->find_bucket(bucket);
      if (!in) return;
      auto t = in->ttl_timers.find(key);
      if (t == in->ttl_timers.end() || t->second.first != *id) return;
      in->ttl_timers.erase(t);
      auto& s = self->stream_of(*in);
      const auto subject = in->prefix + key;
      self->expire_key(*in, s, subject, after);
      // The next revision of the key with a TTL, if any.
      std::optional<time_point> next;
      if (auto seqs = s.by_subject.find(subject); seqs != s.by_subject.end()) {
        for (auto seq : seqs->second) {
          const auto& m = s.msgs.at(seq);
          if (m.expires && (!next || *m.expires < *next)) next = m.expires;
        }
      }
      if (next) self->arm_ttl(*in, key, *next);
    });
    if (existing != b.ttl_timers.end()) {
      clock_->cancel(existing->second.first);
      ttl_timers_.erase(existing->second.first);
      existing->second = {*id, at};
    } else {
      b.ttl_timers.emplace(key, std::pair{*id, at});
    }
    ttl_timers_.insert(*id);
  }

  const detail::handler_error_sink sink_;  // before everything that may hold a reference to it
  std::shared_ptr<amp::clock> clock_;
  const std::uint64_t instance_;
  std::mutex mu_;
  std::map<std::string, stream_state_impl, std::less<>> streams_;
  std::map<std::string, bucket_state, std::less<>> buckets_;
  std::vector<std::shared_ptr<core_sub>> core_subs_;
  std::set<timer_id> ttl_timers_;
  std::uint64_t last_uid_ = 0;
};

}  // namespace

std::shared_ptr<transport> memory_transport::create(memory_transport_options options) {
  auto clock = options.clock ? std::move(options.clock) : system_clock_source::shared();
  return std::make_shared<memory_backend>(std::move(clock), std::move(options.on_handler_error));
}

}  // namespace amp
