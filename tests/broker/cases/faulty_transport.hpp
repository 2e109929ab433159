#pragma once

// A transport that forwards to another and fails chosen data operations: the way the
// broker cases inject a crash or an outage between two steps. `fault` is asked before
// each data operation with its name ("publish", "ack", "nak", "in_progress", "term",
// "kv_get", "kv_create", "kv_update", "kv_put", "kv_delete", "kv_purge", "kv_erase",
// "fetch") and the subject, key, ack token or consumer it concerns; an error it returns is the
// operation's answer, and the operation does not reach the real transport. `late_naks` lengthens
// the delay of every nak with a delay, as a server that receives the nak later redelivers later;
// `late_receipts` makes fetched messages arrive later than the consumer sent them (their
// `delivered_at`), as over a slow network. `hold_updates` keeps the compare-and-set updates of
// the keys it names in flight: each is answered `unavailable` at once and reaches the real
// transport only at `land_held`, in the order they were made (a write whose answer was lost
// with a dying stream leader, applied by the next one). `defer_updates` keeps the
// compare-and-set updates of the keys it names from going anywhere, unanswered, until
// `release_deferred` sends them on (a backend that is slow to answer).

#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "amp/transport/transport.hpp"

namespace amp::broker_testing {

class faulty_transport final : public transport {
 public:
  using fault_fn = std::function<std::optional<error>(std::string_view op, std::string_view what)>;

  explicit faulty_transport(std::shared_ptr<transport> inner) : inner_(std::move(inner)) {}

  void set_fault(fault_fn f) {
    std::lock_guard lock(mu_);
    fault_ = std::move(f);
  }

  void late_naks(duration extra) {
    std::lock_guard lock(mu_);
    nak_extra_ = extra;
  }

  void late_receipts(duration extra) {
    std::lock_guard lock(mu_);
    receipt_extra_ = extra;
  }

  void hold_updates(std::function<bool(std::string_view key)> which) {
    std::lock_guard lock(mu_);
    hold_ = std::move(which);
  }

  /// Stops holding and lets the held updates land; how many there were.
  std::size_t land_held() {
    std::vector<held_update> held;
    {
      std::lock_guard lock(mu_);
      hold_ = {};
      held.swap(held_);
    }
    for (auto& h : held) {
      auto landed = std::make_shared<std::promise<void>>();
      inner_->async_kv_update(h.bucket, h.key, std::move(h.value), h.revision, h.ttl,
                              [landed](result<std::uint64_t>) { landed->set_value(); });
      landed->get_future().wait();
    }
    return held.size();
  }

  void defer_updates(std::function<bool(std::string_view key)> which) {
    std::lock_guard lock(mu_);
    defer_ = std::move(which);
  }

  /// Stops deferring and sends the deferred updates on, in the order they were made; how
  /// many there were. Their answers come as the real transport gives them.
  std::size_t release_deferred() {
    std::vector<deferred_update> deferred;
    {
      std::lock_guard lock(mu_);
      defer_ = {};
      deferred.swap(deferred_);
    }
    for (auto& d : deferred) {
      inner_->async_kv_update(d.bucket, d.key, std::move(d.value), d.revision, d.ttl,
                              std::move(d.done));
    }
    return deferred.size();
  }

  capabilities caps() const override { return inner_->caps(); }
  std::shared_ptr<amp::clock> clock() const override { return inner_->clock(); }
  result<void> ping() override { return inner_->ping(); }

  result<stream_info> do_ensure_stream(const stream_config& c) override {
    return inner_->ensure_stream(c);
  }
  result<stream_info> do_update_stream(const stream_config& c) override {
    return inner_->update_stream(c);
  }
  result<stream_info> do_stream_info_of(std::string_view s) override {
    return inner_->stream_info_of(s);
  }
  result<void> do_delete_stream(std::string_view s) override { return inner_->delete_stream(s); }
  result<std::map<std::string, std::uint64_t>> do_stream_subjects(std::string_view s,
                                                                  std::string_view f) override {
    return inner_->stream_subjects(s, f);
  }
  result<std::vector<std::string>> do_consumer_names(std::string_view s) override {
    return inner_->consumer_names(s);
  }
  result<message> do_get_message(std::string_view s, std::uint64_t seq) override {
    return inner_->get_message(s, seq);
  }
  void do_async_delete_message(std::string_view s, std::uint64_t seq,
                               completion<void> done) override {
    if (auto e = check("delete_message", s)) return done(std::move(*e));
    inner_->async_delete_message(s, seq, std::move(done));
  }
  result<message> do_get_last_message(std::string_view s, std::string_view f) override {
    return inner_->get_last_message(s, f);
  }
  void do_async_publish(outgoing_message msg, completion<publish_ack> done) override {
    if (auto e = check("publish", msg.subject)) return done(std::move(*e));
    inner_->async_publish(std::move(msg), std::move(done));
  }
  result<consumer_info> do_ensure_consumer(const consumer_config& c) override {
    return inner_->ensure_consumer(c);
  }
  result<consumer_info> do_update_consumer(const consumer_config& c) override {
    return inner_->update_consumer(c);
  }
  result<consumer_info> do_consumer_info_of(std::string_view s, std::string_view d) override {
    return inner_->consumer_info_of(s, d);
  }
  result<void> do_delete_consumer(std::string_view s, std::string_view d) override {
    return inner_->delete_consumer(s, d);
  }
  void do_async_fetch(std::string_view s, std::string_view d, fetch_request r,
                      completion<std::vector<message>> done) override {
    if (auto e = check("fetch", d)) return done(std::move(*e));
    duration extra;
    {
      std::lock_guard lock(mu_);
      extra = receipt_extra_;
    }
    if (extra == duration::zero()) return inner_->async_fetch(s, d, r, std::move(done));
    inner_->async_fetch(s, d, r, [extra, done = std::move(done)](result<std::vector<message>> got) {
      if (got) {
        for (auto& m : *got) m.delivered_at += extra;
      }
      done(std::move(got));
    });
  }
  void do_async_acknowledge(const message& msg, ack_kind kind, duration delay,
                            completion<void> done) override {
    static constexpr std::string_view names[] = {"ack", "nak", "in_progress", "term"};
    if (auto e = check(names[static_cast<int>(kind)], msg.ack_token)) return done(std::move(*e));
    if (kind == ack_kind::nak && delay > duration::zero()) {
      std::lock_guard lock(mu_);
      delay += nak_extra_;
    }
    inner_->async_acknowledge(msg, kind, delay, std::move(done));
  }
  // The unconfirmed form goes to the inner transport's unconfirmed form; an injected fault
  // drops it, as a lost acknowledgement.
  void do_acknowledge(const message& msg, ack_kind kind, duration delay) override {
    static constexpr std::string_view names[] = {"ack", "nak", "in_progress", "term"};
    if (check(names[static_cast<int>(kind)], msg.ack_token)) return;
    if (kind == ack_kind::nak && delay > duration::zero()) {
      std::lock_guard lock(mu_);
      delay += nak_extra_;
    }
    inner_->acknowledge(msg, kind, delay);
  }
  result<std::unique_ptr<subscription>> do_subscribe_ordered(
      const replay_request& r, std::function<void(const message&)> on_message) override {
    return inner_->subscribe_ordered(r, std::move(on_message));
  }
  result<void> do_publish_core(outgoing_message msg) override {
    if (auto e = check("publish_core", msg.subject)) return std::move(*e);
    return inner_->publish_core(std::move(msg));
  }
  result<std::unique_ptr<subscription>> do_subscribe_core(
      std::string_view filter, std::function<void(const message&)> on_message) override {
    return inner_->subscribe_core(filter, std::move(on_message));
  }
  result<void> do_ensure_bucket(const kv_config& c) override { return inner_->ensure_bucket(c); }
  result<void> do_delete_bucket(std::string_view b) override { return inner_->delete_bucket(b); }
  void do_async_kv_get(std::string_view b, std::string_view k, completion<kv_entry> done) override {
    if (auto e = check("kv_get", k)) return done(std::move(*e));
    inner_->async_kv_get(b, k, std::move(done));
  }
  void do_async_kv_create(std::string_view b, std::string_view k, std::string v,
                          std::optional<duration> ttl, completion<std::uint64_t> done) override {
    if (auto e = check("kv_create", k)) return done(std::move(*e));
    inner_->async_kv_create(b, k, std::move(v), ttl, std::move(done));
  }
  void do_async_kv_update(std::string_view b, std::string_view k, std::string v, std::uint64_t rev,
                          std::optional<duration> ttl, completion<std::uint64_t> done) override {
    if (auto e = check("kv_update", k)) return done(std::move(*e));
    {
      std::unique_lock lock(mu_);
      if (defer_ && defer_(k)) {
        deferred_.push_back(deferred_update{std::string(b), std::string(k), std::move(v), rev, ttl,
                                            std::move(done)});
        return;
      }
      if (hold_ && hold_(k)) {
        held_.push_back(held_update{std::string(b), std::string(k), std::move(v), rev, ttl});
        lock.unlock();
        return done(unexpected(errc::unavailable, "injected: no answer (the write is in flight)"));
      }
    }
    inner_->async_kv_update(b, k, std::move(v), rev, ttl, std::move(done));
  }
  void do_async_kv_put(std::string_view b, std::string_view k, std::string v,
                       std::optional<duration> ttl, completion<std::uint64_t> done) override {
    if (auto e = check("kv_put", k)) return done(std::move(*e));
    inner_->async_kv_put(b, k, std::move(v), ttl, std::move(done));
  }
  void do_async_kv_delete(std::string_view b, std::string_view k, completion<void> done) override {
    if (auto e = check("kv_delete", k)) return done(std::move(*e));
    inner_->async_kv_delete(b, k, std::move(done));
  }
  void do_async_kv_purge(std::string_view b, std::string_view k, completion<void> done) override {
    if (auto e = check("kv_purge", k)) return done(std::move(*e));
    inner_->async_kv_purge(b, k, std::move(done));
  }
  void do_async_kv_erase(std::string_view b, std::string_view k, completion<void> done) override {
    if (auto e = check("kv_erase", k)) return done(std::move(*e));
    inner_->async_kv_erase(b, k, std::move(done));
  }
  result<std::vector<std::string>> do_kv_keys(std::string_view b) override {
    return inner_->kv_keys(b);
  }
  result<std::vector<kv_entry>> do_kv_history(std::string_view b, std::string_view k) override {
    return inner_->kv_history(b, k);
  }
  result<std::unique_ptr<subscription>> do_kv_watch(std::string_view b, const kv_watch_options& o,
                                                    kv_watch_handlers h) override {
    return inner_->kv_watch(b, o, std::move(h));
  }

 private:
  std::optional<error> check(std::string_view op, std::string_view what) {
    fault_fn f;
    {
      std::lock_guard lock(mu_);
      f = fault_;
    }
    return f ? f(op, what) : std::nullopt;
  }

  std::shared_ptr<transport> inner_;
  std::mutex mu_;
  fault_fn fault_;
  struct held_update {
    std::string bucket;
    std::string key;
    std::string value;
    std::uint64_t revision;
    std::optional<duration> ttl;
  };

  duration nak_extra_{};
  duration receipt_extra_{};
  std::function<bool(std::string_view)> hold_;
  std::vector<held_update> held_;
  struct deferred_update {
    std::string bucket;
    std::string key;
    std::string value;
    std::uint64_t revision = 0;
    std::optional<duration> ttl;
    completion<std::uint64_t> done;
  };
  std::function<bool(std::string_view)> defer_;
  std::vector<deferred_update> deferred_;
};

}  // namespace amp::broker_testing
