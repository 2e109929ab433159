#include "amp/broker/task_store.hpp"

#include <openssl/evp.h>
#include <simdjson.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "amp/broker/operation_record.hpp"
#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "amp/timestamp.hpp"
#include "broker/common.hpp"
#include "detail/minify.hpp"
#include "detail/simdjson_adapter.hpp"
#include "detail/wait_for.hpp"

namespace amp {

std::string_view to_string(task_state s) noexcept {
  switch (s) {
    case task_state::queued: return "queued";
    case task_state::running: return "running";
    case task_state::completed: return "completed";
    case task_state::failed: return "failed";
    case task_state::cancelled: return "cancelled";
  }
  return "queued";
}

bool is_terminal(task_state s) noexcept {
  return s == task_state::completed || s == task_state::failed || s == task_state::cancelled;
}

namespace {

constexpr int k_history = 64;
constexpr std::size_t k_max_idempotency_key = 256;

// The sweeper: ends taken per fetch, held at most (each until its time comes), how long it
// waits when there is nothing to take or the backend failed, how often at most it looks
// while ends are held back, and when it stops waiting for one it held back (its consumer's
// AckWait: by then another server's sweeper has it, or it comes again anyway).
constexpr std::size_t k_sweep_batch = 128;
constexpr std::int64_t k_sweep_pending = 1024;
constexpr duration k_sweep_idle = std::chrono::minutes(10);
constexpr duration k_sweep_retry = std::chrono::seconds(5);
constexpr duration k_sweep_pace = std::chrono::seconds(1);
constexpr duration k_sweep_ack_wait = std::chrono::minutes(1);
// Pauses before an end that was not stored is sent again: the first, doubling to the limit.
constexpr duration k_end_retry_first = std::chrono::milliseconds(500);
constexpr duration k_end_retry_limit = std::chrono::seconds(30);

std::optional<task_state> state_from(std::string_view s) {
  for (auto st : {task_state::queued, task_state::running, task_state::completed,
                  task_state::failed, task_state::cancelled}) {
    if (to_string(st) == s) return st;
  }
  return std::nullopt;
}

void write_string_or_null(json_writer& w, std::string_view key, const std::string& v) {
  w.key(key);
  if (v.empty()) {
    w.null();
  } else {
    w.string(v);
  }
}

// The spec's members, then either the revision (wire form) or the broker's own members.
std::string write_record(const task_record& r, bool stored) {
  json_writer w(512 + r.result.size() + (r.error ? r.error->message.size() : 0));
  w.begin_object();
  w.key("task").string(r.task);
  w.key("ns").string(r.ns);
  w.key("job").string(r.job);
  w.key("state").string(to_string(r.state));
  w.key("attempt").integer(r.attempt);
  w.key("max_attempts").integer(r.max_attempts);
  w.key("submitted_by").string(r.submitted_by);
  write_string_or_null(w, "owner", r.owner);
  detail::write_time_or_null(w, "lease_expires_at", r.lease_expires_at);
  detail::write_time_or_null(w, "created_at", r.created_at);
  detail::write_time_or_null(w, "updated_at", r.updated_at);
  w.key("result");
  if (r.result.empty()) {
    w.null();
  } else {
    w.raw(r.result);
  }
  w.key("error");
  detail::write_task_error(w, r.error);
  if (stored) {
    w.key("holders").begin_array();
    for (const auto& h : r.holders) w.string(h);
    w.end_array();
    w.key("ack").string(r.ack_token);
    w.key("job_seq").integer(r.job_seq);
    if (!r.idem_key.empty()) w.key("idem").string(r.idem_key);
    if (r.notified) w.key("notified").boolean(true);
  } else {
    w.key("revision").integer(r.revision);
  }
  w.end_object();
  return w.take();
}

std::string sha256_hex(std::string_view a, std::string_view b) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, a.data(), a.size());
  const char zero = '\0';
  EVP_DigestUpdate(ctx, &zero, 1);
  EVP_DigestUpdate(ctx, b.data(), b.size());
  EVP_DigestFinal_ex(ctx, md.data(), &len);
  EVP_MD_CTX_free(ctx);
  std::string out;
  out.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) out += fmt::format("{:02x}", md[i]);
  return out;
}

}  // namespace

std::string to_json(const task_record& r) {
  return write_record(r, false);
}

std::string to_stored_json(const task_record& r) {
  return write_record(r, true);
}

result<task_record> parse_task_record(std::string_view json) {
  thread_local simdjson::dom::parser parser;  // reused for its buffers
  detail::parser_release release(parser);
  simdjson::dom::element doc;
  simdjson::dom::object o;
  if (parser.parse(json.data(), json.size()).get(doc) != simdjson::SUCCESS ||
      doc.get(o) != simdjson::SUCCESS) {
    return unexpected(errc::internal, "task record: not a JSON object");
  }
  task_record r;
  r.task = detail::string_member(o, "task");
  r.ns = detail::string_member(o, "ns");
  r.job = detail::string_member(o, "job");
  auto st = state_from(detail::string_member(o, "state"));
  if (!st || r.task.empty()) return unexpected(errc::internal, "task record: no task or state");
  r.state = *st;
  std::int64_t n = 0;
  if (o["attempt"].get(n) == simdjson::SUCCESS) r.attempt = static_cast<int>(n);
  if (o["max_attempts"].get(n) == simdjson::SUCCESS) r.max_attempts = static_cast<int>(n);
  r.submitted_by = detail::string_member(o, "submitted_by");
  r.owner = detail::string_member(o, "owner");
  for (auto [key, field] :
       {std::pair{"lease_expires_at", &r.lease_expires_at}, std::pair{"created_at", &r.created_at},
        std::pair{"updated_at", &r.updated_at}}) {
    auto t = detail::time_member(o, key);
    if (!t) return unexpected(errc::internal, "task record: " + t.error().message());
    *field = *t;
  }
  simdjson::dom::element e;
  if (o["result"].get(e) == simdjson::SUCCESS && !e.is_null()) r.result = detail::minify(e);
  simdjson::dom::object err;
  if (o["error"].get(err) == simdjson::SUCCESS) {
    r.error = task_error{detail::string_member(err, "code"), detail::string_member(err, "message")};
  }
  simdjson::dom::array holders;
  if (o["holders"].get(holders) == simdjson::SUCCESS) {
    for (auto h : holders) {
      std::string_view s;
      if (h.get(s) == simdjson::SUCCESS) r.holders.emplace_back(s);
    }
  }
  r.ack_token = detail::string_member(o, "ack");
  r.idem_key = detail::string_member(o, "idem");
  std::uint64_t seq = 0;
  if (o["job_seq"].get(seq) == simdjson::SUCCESS) r.job_seq = seq;
  bool notified = false;
  if (o["notified"].get(notified) == simdjson::SUCCESS) r.notified = notified;
  return r;
}

// Takes the ends of a namespace's tasks from `AMP_ENDED_<ns>` once their retention has
// passed and removes each task's binding and record. An end not yet due is handed back
// with a delay that brings it again when it is; the ends arrive in the order the tasks
// ended, so the sweeper then waits for the first of them. The due ends of a batch are
// removed side by side: the sweeper keeps up with as many ends a second as the backend
// answers removals, not as one removal after another allows.
class task_store::sweeper : public std::enable_shared_from_this<sweeper> {
 public:
  sweeper(std::shared_ptr<transport> t, std::string bucket, const broker_config& config,
          executor run, std::shared_ptr<detail::worker_pool> pool)
      : t_(std::move(t)),
        clock_(t_->clock()),
        bucket_(std::move(bucket)),
        ns_(config.ns),
        ends_{.name = subjects::ended_stream(ns_),
              .subjects = {subjects::ended_subject(ns_)},
              .retention = retention_policy::work_queue,
              .storage = config.storage,
              .duplicate_window = config.duplicate_window,
              .replicas = config.replicas},
        retention_(config.task_retention),
        run_(std::move(run)),
        pool_(std::move(pool)) {}

  // The stream of ends and the sweeper's consumer, made when missing (blocks).
  result<void> ensure() {
    if (auto r = t_->ensure_stream(ends_); !r) return r.error();
    if (auto r = t_->ensure_consumer({.stream = ends_.name,
                                      .durable = subjects::sweeper_consumer(),
                                      .ack_wait = k_sweep_ack_wait,
                                      .max_ack_pending = k_sweep_pending});
        !r) {
      return r.error();
    }
    return {};
  }

  void start() { arm(clock_->now()); }

  // Runs `work` where the sweeper's own work runs.
  void post(std::function<void()> work) { run_(std::move(work)); }

  void stop() {
    std::lock_guard lock(mu_);
    stopped_ = true;
    if (timer_ != 0) clock_->cancel(timer_);
    timer_ = 0;
  }

 private:
  enum class outcome { removed, later, failed };

  void arm(time_point at) {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    if (timer_ != 0) clock_->cancel(timer_);
    std::weak_ptr<sweeper> weak = weak_from_this();
    // The clock's thread only hands the work over (making the stream again blocks).
    timer_ = clock_->call_at(at, [weak] {
      auto self = weak.lock();
      if (!self) return;
      self->run_([weak] {
        if (auto s = weak.lock()) s->fetch();
      });
    });
  }

  void fetch() {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      timer_ = 0;
    }
    std::weak_ptr<sweeper> weak = weak_from_this();
    t_->async_fetch(ends_.name, subjects::sweeper_consumer(), {.batch = k_sweep_batch},
                    [weak](result<std::vector<message>> got) {
                      auto self = weak.lock();
                      if (!self) return;
                      self->run_([weak, got = std::move(got)]() mutable {
                        if (auto s = weak.lock()) s->sweep(std::move(got));
                      });
                    });
  }

  // One fetched batch: its due ends are removed all at once, each on its own; it ends when
  // the last removal has answered.
  struct pass {
    std::atomic<int> open{1};
    std::atomic<bool> held_back{false};
  };
  using removal_done = std::function<void(outcome, time_point)>;

  void sweep(result<std::vector<message>> got) {
    if (!got) {
      // Deleted under us (by hand, or with the stream): made again, then tried again.
      if (got.error().code() == errc::not_found) (void)ensure();
      return arm(clock_->now() + k_sweep_retry);
    }
    if (got->empty()) return arm(next_look(clock_->now()));
    auto p = std::make_shared<pass>();
    const auto now = clock_->now();
    for (auto& m : *got) {
      forget(m.seq);
      const auto due = m.time + retention_;
      if (due > now) {
        hold(m, due, *p);
        continue;
      }
      ++p->open;
      auto data = m.data;
      remove(
          data, now, [self = shared_from_this(), p, m = std::move(m)](outcome what, time_point at) {
            if (what == outcome::removed) {
              self->t_->async_acknowledge(m, ack_kind::ack, {}, [](result<void>) {});
            } else {
              self->hold(m, what == outcome::failed ? self->clock_->now() + k_sweep_retry : at, *p);
            }
            self->finish(p);
          });
    }
    finish(p);
  }

  void finish(const std::shared_ptr<pass>& p) {
    if (--p->open > 0) return;
    if (!p->held_back) return fetch();  // all taken: there may be more
    arm(next_look(clock_->now()));
  }

  // Hands an end back until `due`, and remembers when it will come again.
  void hold(const message& m, time_point due, pass& p) {
    p.held_back = true;
    const auto now = clock_->now();
    {
      std::lock_guard lock(mu_);
      held_[m.seq] = due;
    }
    t_->async_acknowledge(m, ack_kind::nak, std::max(due - now, duration::zero()),
                          [](result<void>) {});
  }

  void forget(std::uint64_t seq) {
    std::lock_guard lock(mu_);
    held_.erase(seq);
  }

  // When to fetch again: when the first end held back falls due, at most once a second (so a
  // fetch takes every end that fell due meanwhile, and one that is due but not back yet, as
  // the server redelivers on its own clock, is looked for again a second later), else after
  // the idle time. A fetch finds nothing while every end the consumer may hand out is held
  // back: an empty fetch is no reason to wait the idle time while ends are held.
  time_point next_look(time_point now) {
    auto at = now + std::min(retention_, k_sweep_idle);
    std::lock_guard lock(mu_);
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->second + k_sweep_ack_wait < now) {
        it = held_.erase(it);
        continue;
      }
      at = std::min(at, std::max(it->second, now + k_sweep_pace));
      ++it;
    }
    return at;
  }

  // What the sweeper needs of a stored record: whether it ended, when it last changed and
  // its idempotency binding (empty: none).
  struct ending {
    bool ended = false;
    time_point updated_at{};
    std::string idem;
  };

  // Removes the ended task or operation `text` (its binding first: a binding whose record
  // is gone would make a resubmission finish the old task instead of starting a new one),
  // then says what became of it: removed (or nothing to remove), later (not due: the record
  // changed after the end) or failed (the backend did not answer).
  void remove(const std::string& text, time_point now, removal_done done) {
    std::string key;
    std::function<std::optional<ending>(std::string_view)> read;
    if (auto task = task_id::make(text)) {
      key = subjects::task_key(ns_, *task);
      read = [](std::string_view v) -> std::optional<ending> {
        auto rec = parse_task_record(v);
        if (!rec) return std::nullopt;
        return ending{is_terminal(rec->state), rec->updated_at, rec->idem_key};
      };
    } else if (auto op = operation_id::make(text)) {
      key = subjects::operation_key(ns_, *op);
      read = [](std::string_view v) -> std::optional<ending> {
        auto rec = parse_operation_record(v);
        if (!rec) return std::nullopt;
        return ending{is_closed(rec->state), rec->updated_at, rec->idem_key};
      };
    } else {
      return done(outcome::removed, {});  // not an end of ours: drop it
    }
    t_->async_kv_get(bucket_, key,
                     [self = shared_from_this(), text, key, now, read = std::move(read),
                      done = std::move(done)](result<kv_entry> entry) mutable {
                       if (!entry) {
                         const bool gone = entry.error().code() == errc::not_found;
                         return done(gone ? outcome::removed : outcome::failed, {});
                       }
                       auto rec = read(entry->value);
                       // Not ended (an end whose write lost its race): the write that ends it sends
                       // another.
                       if (!rec || !rec->ended) return done(outcome::removed, {});
                       if (auto until = rec->updated_at + self->retention_; until > now) {
                         return done(outcome::later, until);
                       }
                       if (rec->idem.empty()) return self->erase(key, std::move(done));
                       self->unbind(text, rec->idem, key, std::move(done));
                     });
  }

  // Removes the binding `idem` when it still names `id`, then the record `key`.
  void unbind(const std::string& id, const std::string& idem, std::string key, removal_done done) {
    t_->async_kv_get(bucket_, idem,
                     [self = shared_from_this(), id, idem, key = std::move(key),
                      done = std::move(done)](result<kv_entry> bound) mutable {
                       if (!bound && bound.error().code() != errc::not_found) {
                         return done(outcome::failed, {});
                       }
                       if (!bound || bound->value != id) return self->erase(key, std::move(done));
                       self->t_->async_kv_erase(self->bucket_, idem,
                                                [self, key = std::move(key),
                                                 done = std::move(done)](result<void> r) mutable {
                                                  if (!r) return done(outcome::failed, {});
                                                  self->erase(key, std::move(done));
                                                });
                     });
  }

  void erase(const std::string& key, removal_done done) {
    t_->async_kv_erase(bucket_, key, [done = std::move(done)](result<void> r) {
      done(r ? outcome::removed : outcome::failed, {});
    });
  }

  std::shared_ptr<transport> t_;
  std::shared_ptr<amp::clock> clock_;
  std::string bucket_;
  namespace_name ns_;
  stream_config ends_;
  duration retention_;
  executor run_;
  std::shared_ptr<detail::worker_pool> pool_;
  std::mutex mu_;
  bool stopped_ = false;
  timer_id timer_ = 0;
  // The ends this sweeper handed back, each with the time it falls due (sequence → due).
  std::map<std::uint64_t, time_point> held_;  // guarded by mu_
};

task_store::task_store(std::shared_ptr<transport> t, std::string bucket)
    : transport_(std::move(t)), bucket_(std::move(bucket)) {}

task_store::~task_store() {
  if (sweeper_) sweeper_->stop();
}

result<std::shared_ptr<task_store>> task_store::open(std::shared_ptr<transport> t,
                                                     const broker_config& config) {
  if (config.task_retention < duration::zero()) {
    return unexpected(errc::bad_request, "task_retention must not be negative");
  }
  kv_config kv{.bucket = subjects::task_state_bucket(),
               .history = k_history,
               .storage = config.storage,
               .replicas = config.replicas};
  if (auto r = t->ensure_bucket(kv); !r) return r.error();
  auto store = std::make_shared<task_store>(t, kv.bucket);
  if (config.task_retention == duration::zero()) return store;
  std::shared_ptr<detail::worker_pool> pool;
  auto run = detail::executor_for(config, pool);
  auto sweeper = std::make_shared<task_store::sweeper>(std::move(t), kv.bucket, config,
                                                       std::move(run), std::move(pool));
  if (auto r = sweeper->ensure(); !r) return r.error();
  store->sweeper_ = std::move(sweeper);
  store->sweeper_->start();
  return store;
}

task_id task_store::new_id() const {
  return *task_id::make(detail::unique_id("t_", transport_->clock()->now()));
}

namespace {

result<task_record> record_of(const kv_entry& e) {
  return parse_task_record(e.value).transform([&](task_record r) {
    r.revision = e.revision;
    return r;
  });
}

result<task_record> key_of(const task_record& r, std::string& key) {
  auto ns = namespace_name::make(r.ns);
  if (!ns) return ns.error();
  auto id = task_id::make(r.task);
  if (!id) return id.error();
  key = subjects::task_key(*ns, *id);
  return r;
}

}  // namespace

namespace {

// The record `r` as written at revision `rev`, or the write's error (`conflict` worded
// with `on_conflict`).
result<task_record> written_as(task_record r, result<std::uint64_t> rev,
                               std::string_view on_conflict) {
  return rev
      .transform_error([&](const error& e) {
        if (e.code() != errc::conflict) return e;
        return error(errc::conflict, fmt::format("task {} {}", r.task, on_conflict));
      })
      .transform([&](std::uint64_t at) {
        r.revision = at;
        return std::move(r);
      });
}

}  // namespace

result<task_record> task_store::create(task_record r) {
  return detail::wait_for<task_record>(
      [&](auto done) { async_create(std::move(r), std::move(done)); });
}

void task_store::async_create(task_record r, completion<task_record> done) {
  std::string key;
  if (auto k = key_of(r, key); !k) return done(k.error());
  auto value = write_record(r, true);
  transport_->async_kv_create(
      bucket_, key, std::move(value), std::nullopt,
      [r = std::move(r), done = std::move(done)](result<std::uint64_t> rev) mutable {
        done(written_as(std::move(r), std::move(rev), "exists"));
      });
}

namespace {

result<task_record> record_or_error(const result<kv_entry>& e, const task_id& task) {
  if (e) return record_of(*e);
  if (e.error().code() == errc::not_found) {
    return unexpected(errc::not_found, fmt::format("no task {}", task.view()));
  }
  return e.error();
}

}  // namespace

result<task_record> task_store::get(const namespace_name& ns, const task_id& task) {
  return record_or_error(transport_->kv_get(bucket_, subjects::task_key(ns, task)), task);
}

std::vector<result<task_record>> task_store::get_many(const namespace_name& ns,
                                                      const std::vector<task_id>& tasks) {
  auto entries = detail::wait_for_all<kv_entry>(tasks.size(), [&](std::size_t i, auto done) {
    transport_->async_kv_get(bucket_, subjects::task_key(ns, tasks[i]), std::move(done));
  });
  std::vector<result<task_record>> out;
  out.reserve(tasks.size());
  for (std::size_t i = 0; i < tasks.size(); ++i)
    out.push_back(record_or_error(entries[i], tasks[i]));
  return out;
}

result<task_record> task_store::update(task_record r) {
  return detail::wait_for<task_record>(
      [&](auto done) { async_update(std::move(r), std::move(done)); });
}

void task_store::async_update(task_record r, completion<task_record> done) {
  std::string key;
  if (auto k = key_of(r, key); !k) return done(k.error());
  // A write that ends the task goes out right behind its end, without waiting for it: the
  // answer is the write's. An end that is not stored is sent again (send_end), so a record
  // that ends is swept in time even if its end was refused; an end whose write fails is
  // dropped by the sweeper, which finds the record not ended.
  if (sweeper_ && is_terminal(r.state)) {
    auto ns = *namespace_name::make(r.ns);  // checked by key_of
    send_end({.subject = subjects::ended_subject(ns),
              .data = r.task,
              .msg_id = fmt::format("{}.{}", r.task, r.revision)},
             0);
  }
  write(std::move(r), key, std::move(done));
}

void task_store::operation_ended(const namespace_name& ns, const operation_id& operation) {
  if (!sweeper_) return;
  send_end({.subject = subjects::ended_subject(ns),
            .data = operation.str(),
            .msg_id = fmt::format("{}.end", operation.view())},
           0);
}

void task_store::send_end(outgoing_message end, int attempt) {
  std::weak_ptr<task_store> weak = weak_from_this();
  auto copy = end;
  transport_->async_publish(std::move(copy), [weak, end = std::move(end),
                                              attempt](result<publish_ack> sent) mutable {
    if (sent) return;
    auto self = weak.lock();
    if (!self) return;
    // The stream of ends was deleted: it is made again (blocking, so on the sweeper's
    // executor) before the end is sent once more, at once the first time. Refused or
    // unanswered otherwise (the backend is away; the end may have been stored, which its
    // msg_id makes harmless to repeat): again after a pause that doubles up to a limit.
    const bool remake = sent.error().code() == errc::not_found;
    auto again = [weak, end = std::move(end), attempt, remake]() mutable {
      auto store = weak.lock();
      if (!store) return;
      if (!remake) return store->send_end(std::move(end), attempt + 1);
      auto sweeping = store->sweeper_;
      sweeping->post([weak, sweeping, end = std::move(end), attempt]() mutable {
        auto again_store = weak.lock();
        if (!again_store) return;
        (void)sweeping->ensure();  // if it fails, the next attempt finds out and waits
        again_store->send_end(std::move(end), attempt + 1);
      });
    };
    if (remake && attempt == 0) return again();
    const auto& clock = self->transport_->clock();
    const auto pause = std::min(k_end_retry_limit, k_end_retry_first * (1 << std::min(attempt, 8)));
    clock->call_at(clock->now() + pause, std::move(again));
  });
}

void task_store::write(task_record r, const std::string& key, completion<task_record> done) {
  auto value = write_record(r, true);
  auto expected = r.revision;
  transport_->async_kv_update(
      bucket_, key, std::move(value), expected, std::nullopt,
      [r = std::move(r), done = std::move(done)](result<std::uint64_t> rev) mutable {
        done(written_as(std::move(r), std::move(rev), "moved on"));
      });
}

result<std::vector<task_record>> task_store::history(const namespace_name& ns,
                                                     const task_id& task) {
  auto entries = transport_->kv_history(bucket_, subjects::task_key(ns, task));
  if (!entries) {
    if (entries.error().code() == errc::not_found) {
      return unexpected(errc::not_found, fmt::format("no task {}", task.view()));
    }
    return entries.error();
  }
  std::vector<task_record> out;
  for (const auto& e : *entries) {
    if (e.op != kv_op::put) continue;
    auto r = record_of(e);
    if (!r) return r.error();
    if (!out.empty() && r->notified && !out.back().notified) {
      // A revision that only records the notice is not a change: it stands in for the one
      // before it, so the last entry is the record as `get` reads it.
      auto marked = out.back();
      marked.notified = true;
      marked.revision = r->revision;
      if (marked == *r) out.pop_back();
    }
    out.push_back(std::move(*r));
  }
  if (out.empty()) return unexpected(errc::not_found, fmt::format("no task {}", task.view()));
  return out;
}

namespace {

result<void> check_idempotency_key(std::string_view key) {
  if (key.empty() || key.size() > k_max_idempotency_key) {
    return unexpected(errc::bad_request,
                      fmt::format("idempotency_key must be 1 to {} bytes, not {}",
                                  k_max_idempotency_key, key.size()));
  }
  return {};
}

// What the keys of operations are hashed with in place of the initiator's name: no name
// holds a space, so no submitter's key can stand for an operation's.
std::string operation_scope(const participant_name& initiator) {
  return "operation " + initiator.str();
}

}  // namespace

result<std::pair<std::string, bool>> task_store::bind(const std::string& kv_key,
                                                      const std::string& proposed) {
  for (int round = 0; round < 3; ++round) {
    auto created = transport_->kv_create(bucket_, kv_key, proposed);
    if (created) return std::pair{proposed, true};
    if (created.error().code() != errc::conflict) return created.error();
    auto existing = transport_->kv_get(bucket_, kv_key);
    if (existing) return std::pair{std::move(existing->value), false};
    if (existing.error().code() != errc::not_found) return existing.error();
  }
  return unexpected(errc::unavailable, "idempotency index kept changing; try again");
}

result<task_store::binding> task_store::bind_idempotency_key(const namespace_name& ns,
                                                             const participant_name& submitter,
                                                             std::string_view key,
                                                             const task_id& proposed) {
  if (auto r = check_idempotency_key(key); !r) return r.error();
  auto kv_key = subjects::idempotency_key(ns, sha256_hex(submitter.view(), key));
  auto bound = bind(kv_key, proposed.str());
  if (!bound) return bound.error();
  auto id = task_id::make(bound->first);
  if (!id) return unexpected(errc::internal, "idempotency index holds a bad task id");
  return binding{*id, bound->second, kv_key};
}

result<task_store::operation_binding> task_store::bind_operation_key(
    const namespace_name& ns, const participant_name& initiator, std::string_view key,
    const operation_id& proposed) {
  if (auto r = check_idempotency_key(key); !r) return r.error();
  auto kv_key = subjects::idempotency_key(ns, sha256_hex(operation_scope(initiator), key));
  auto bound = bind(kv_key, proposed.str());
  if (!bound) return bound.error();
  auto id = operation_id::make(bound->first);
  if (!id) return unexpected(errc::internal, "idempotency index holds a bad operation id");
  return operation_binding{*id, bound->second, kv_key};
}

result<std::optional<operation_id>> task_store::find_operation_key(
    const namespace_name& ns, const participant_name& initiator, std::string_view key) {
  if (auto r = check_idempotency_key(key); !r) return r.error();
  auto existing = transport_->kv_get(
      bucket_, subjects::idempotency_key(ns, sha256_hex(operation_scope(initiator), key)));
  if (!existing) {
    if (existing.error().code() == errc::not_found) return std::optional<operation_id>{};
    return existing.error();
  }
  auto id = operation_id::make(existing->value);
  if (!id) return unexpected(errc::internal, "idempotency index holds a bad operation id");
  return std::optional<operation_id>(*id);
}

result<std::optional<task_id>> task_store::find_idempotency_key(const namespace_name& ns,
                                                                const participant_name& submitter,
                                                                std::string_view key) {
  if (auto r = check_idempotency_key(key); !r) return r.error();
  auto existing =
      transport_->kv_get(bucket_, subjects::idempotency_key(ns, sha256_hex(submitter.view(), key)));
  if (!existing) {
    if (existing.error().code() == errc::not_found) return std::optional<task_id>{};
    return existing.error();
  }
  auto id = task_id::make(existing->value);
  if (!id) return unexpected(errc::internal, "idempotency index holds a bad task id");
  return std::optional<task_id>(*id);
}

}  // namespace amp
