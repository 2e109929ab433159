#include "amp/broker/registry.hpp"

#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "amp/timestamp.hpp"
#include "broker/common.hpp"
#include "detail/minify.hpp"
#include "detail/simdjson_adapter.hpp"
#include "detail/string_hash.hpp"
#include "detail/write_batch.hpp"

namespace amp {
namespace {

namespace dom = simdjson::dom;
using namespace std::chrono_literals;

// Compare-and-set attempts before giving up with `conflict`.
constexpr int k_attempts = 8;
// How long the initial entries of a watch may take to arrive.
constexpr auto k_listing_timeout = 10s;
// The sweeper's shortest period.
constexpr duration k_min_sweep_period = 10ms;

// What the stored value says about the key: a registration or a refresh (up), or a
// tombstone that records why the entry went down (it keeps the last entry).
enum class record_state { registered, refreshed, expired, left };

struct record {
  registry_entry entry;
  record_state state = record_state::registered;
  // The leases held through each registry object that wrote a load (a gateway each, by its
  // id); `entry.load` is their sum.
  std::map<std::string, int, std::less<>> loads;
};

int sum_of(const std::map<std::string, int, std::less<>>& loads) {
  std::int64_t n = 0;
  for (const auto& [source, load] : loads) n += load;
  return static_cast<int>(std::min<std::int64_t>(n, INT32_MAX));
}

bool is_up(record_state s) {
  return s == record_state::registered || s == record_state::refreshed;
}

std::string_view state_name(record_state s) {
  switch (s) {
    case record_state::registered: return "registered";
    case record_state::refreshed: return "refreshed";
    case record_state::expired: return "expired";
    case record_state::left: return "left";
  }
  return "registered";
}

std::optional<record_state> state_from(std::string_view s) {
  for (auto st : {record_state::registered, record_state::refreshed, record_state::expired,
                  record_state::left}) {
    if (s == state_name(st)) return st;
  }
  return std::nullopt;
}

// Timestamps are stored with milliseconds; entries carry exactly what is stored.
time_point to_millis(time_point t) {
  return std::chrono::time_point_cast<duration>(std::chrono::floor<std::chrono::milliseconds>(t));
}

void write_entry_members(json_writer& w, const registry_entry& e) {
  w.key("participant").string(e.participant.view());
  w.key("jobs").begin_array();
  for (const auto& j : e.jobs) w.string(j.view());
  w.end_array();
  w.key("slots").integer(e.slots);
  w.key("load").integer(e.load);
  w.key("meta").raw(e.meta.empty() ? std::string_view("{}") : std::string_view(e.meta));
  w.key("updated_at").string(format_timestamp(e.updated_at));
  w.key("expires_at").string(format_timestamp(e.expires_at));
}

std::string encode(const record& r) {
  json_writer w(256 + r.entry.meta.size());
  w.begin_object();
  w.key("v").integer(1);
  w.key("state").string(state_name(r.state));
  write_entry_members(w, r.entry);
  if (!r.loads.empty()) {
    w.key("loads").begin_object();
    for (const auto& [source, load] : r.loads) w.key(source).integer(load);
    w.end_object();
  }
  w.end_object();
  return w.take();
}

// The stored record of `key`; nullopt for a value that is not one of ours (another
// format version, or damaged), which every reader treats as no entry.
std::optional<record> decode(std::string_view json, std::string_view key) {
  thread_local dom::parser parser;
  dom::object o;
  if (parser.parse(json.data(), json.size()).get_object().get(o)) return std::nullopt;
  std::int64_t version = 0;
  if (o["v"].get_int64().get(version) || version != 1) return std::nullopt;

  std::string_view text;
  if (o["participant"].get_string().get(text) || text != key) return std::nullopt;
  auto participant = participant_name::make(text);
  if (!participant) return std::nullopt;
  if (o["state"].get_string().get(text)) return std::nullopt;
  auto state = state_from(text);
  if (!state) return std::nullopt;

  record r{.entry = {.participant = *std::move(participant)}, .state = *state, .loads = {}};
  dom::array jobs;
  if (o["jobs"].get_array().get(jobs)) return std::nullopt;
  for (auto j : jobs) {
    if (j.get_string().get(text)) return std::nullopt;
    auto job = job_name::make(text);
    if (!job) return std::nullopt;
    r.entry.jobs.push_back(*std::move(job));
  }
  std::int64_t slots = 0;
  std::int64_t load = 0;
  if (o["slots"].get_int64().get(slots) || slots < 0 || slots > max_registry_slots) {
    return std::nullopt;
  }
  if (o["load"].get_int64().get(load) || load < 0 || load > INT32_MAX) return std::nullopt;
  r.entry.slots = static_cast<int>(slots);
  r.entry.load = static_cast<int>(load);
  dom::object loads;
  if (!o["loads"].get_object().get(loads)) {
    for (auto [source, value] : loads) {
      std::int64_t n = 0;
      if (value.get_int64().get(n) || n < 0 || n > INT32_MAX) return std::nullopt;
      r.loads.emplace(std::string(source), static_cast<int>(n));
    }
  }
  dom::object meta;
  if (o["meta"].get_object().get(meta)) return std::nullopt;
  r.entry.meta = detail::minify(meta);
  for (auto [name, field] : {std::pair{"updated_at", &r.entry.updated_at},
                             std::pair{"expires_at", &r.entry.expires_at}}) {
    if (o[name].get_string().get(text)) return std::nullopt;
    auto t = parse_timestamp(text);
    if (!t) return std::nullopt;
    *field = *t;
  }
  return r;
}

// `meta_json` minified when it is a JSON object; `bad_request` saying why not otherwise.
result<std::string> checked_meta(std::string_view meta_json) {
  thread_local dom::parser parser;
  dom::element root;
  if (auto code = parser.parse(meta_json.data(), meta_json.size()).get(root)) {
    return unexpected(errc::bad_request,
                      std::string("meta: not valid JSON: ") + simdjson::error_message(code));
  }
  if (root.type() != dom::element_type::OBJECT) {
    return unexpected(errc::bad_request, fmt::format("meta must be a JSON object, not {}",
                                                     detail::type_name(root.type())));
  }
  return simdjson::minify(root);
}

std::vector<job_name> without_duplicates(std::vector<job_name> jobs) {
  std::vector<job_name> out;
  out.reserve(jobs.size());
  for (auto& j : jobs) {
    if (std::find(out.begin(), out.end(), j) == out.end()) out.push_back(std::move(j));
  }
  return out;
}

bool lists(const registry_entry& e, const job_name& job) {
  return std::find(e.jobs.begin(), e.jobs.end(), job) != e.jobs.end();
}

// What a key holds now.
struct current {
  std::uint64_t revision = 0;  // 0: no value (missing, deleted, purged or expired)
  std::optional<record> rec;   // nullopt: no value, or one that is not a record
};

unexpected busy(const participant_name& p) {
  return unexpected(errc::conflict, fmt::format("the registry entry of {} kept changing; try again",
                                                quoted(p.view())));
}

// `not_found` for a heartbeat of `p`, whose key holds `c` (no entry, or a tombstone).
unexpected not_live(const participant_name& p, const current& c) {
  if (!c.rec) {
    return unexpected(errc::not_found,
                      fmt::format("participant {} has no registry entry (never registered, or "
                                  "it expired)",
                                  quoted(p.view())));
  }
  if (c.rec->state == record_state::expired) {
    return unexpected(errc::not_found,
                      fmt::format("the registration of {} expired at {}", quoted(p.view()),
                                  format_timestamp(c.rec->entry.expires_at)));
  }
  return unexpected(errc::not_found, fmt::format("participant {} has left", quoted(p.view())));
}

// Collects the latest value of every key of a bucket (a watch until it has caught up).
result<std::vector<kv_entry>> list_bucket(transport& t, const std::string& bucket) {
  struct listing {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::vector<kv_entry> entries;
  };
  auto l = std::make_shared<listing>();
  auto sub = t.kv_watch(bucket, {},
                        {.on_entry =
                             [l](const kv_entry& e) {
                               std::lock_guard lock(l->mu);
                               if (!l->done) l->entries.push_back(e);
                             },
                         .on_caught_up =
                             [l] {
                               std::lock_guard lock(l->mu);
                               l->done = true;
                               l->cv.notify_all();
                             }});
  if (!sub) return std::move(sub).error();
  detail::write_batch::flush();
  std::unique_lock lock(l->mu);
  bool done = l->cv.wait_for(lock, k_listing_timeout, [&] { return l->done; });
  auto entries = std::move(l->entries);
  lock.unlock();
  (*sub)->stop();
  if (!done) {
    return unexpected(errc::unavailable,
                      fmt::format("listing bucket \"{}\" did not complete in time", bucket));
  }
  return entries;
}

// The state of one `watch`: the entries it considers up, and the caller's callback.
struct watch_state {
  std::mutex mu;
  std::condition_variable cv;
  bool caught_up = false;
  std::map<std::string, registry_entry, std::less<>> up;
  std::vector<registry_entry> initial;
  std::shared_ptr<amp::clock> clock;
  std::function<void(const presence_event&)> on_event;

  // The event a change of the bucket means to this watcher, if any.
  std::optional<presence_event> translate(const kv_entry& e) {
    auto now = clock->now();
    auto it = up.find(e.key);
    auto down = [&](presence_reason why, registry_entry last) {
      up.erase(it);
      auto p = last.participant;
      return presence_event{.participant = std::move(p),
                            .state = presence_state::down,
                            .reason = why,
                            .entry = std::move(last)};
    };
    if (e.op != kv_op::put) {
      if (it == up.end()) return std::nullopt;
      // A backend's TTL removed it (some report that as a purge), or someone deleted it.
      bool ran_out = e.op == kv_op::expired || it->second.expires_at <= now;
      return down(ran_out ? presence_reason::expired : presence_reason::left,
                  std::move(it->second));
    }
    auto rec = decode(e.value, e.key);
    if (!rec) return std::nullopt;
    switch (rec->state) {
      case record_state::registered:
        up.insert_or_assign(e.key, rec->entry);
        return presence_event{.participant = rec->entry.participant,
                              .state = presence_state::up,
                              .reason = presence_reason::registered,
                              .entry = std::move(rec->entry)};
      case record_state::refreshed:
        if (it != up.end()) {
          it->second = std::move(rec->entry);
          return std::nullopt;
        }
        // The registration went by unseen (a watcher that fell behind).
        if (rec->entry.expires_at <= now) return std::nullopt;
        up.emplace(e.key, rec->entry);
        return presence_event{.participant = rec->entry.participant,
                              .state = presence_state::up,
                              .reason = presence_reason::registered,
                              .entry = std::move(rec->entry)};
      case record_state::expired:
      case record_state::left:
        if (it == up.end()) return std::nullopt;
        return down(
            rec->state == record_state::expired ? presence_reason::expired : presence_reason::left,
            std::move(rec->entry));
    }
    return std::nullopt;
  }

  void take_initial(const kv_entry& e) {
    auto rec = e.op == kv_op::put ? decode(e.value, e.key) : std::nullopt;
    if (rec && is_up(rec->state) && rec->entry.expires_at > clock->now()) {
      up.insert_or_assign(e.key, std::move(rec->entry));
    } else {
      up.erase(e.key);
    }
  }
};

}  // namespace

std::string to_json(const registry_entry& e) {
  json_writer w(192 + e.meta.size());
  w.begin_object();
  write_entry_members(w, e);
  w.end_object();
  return w.take();
}

std::string_view to_string(presence_state s) noexcept {
  return s == presence_state::up ? "up" : "down";
}

std::string_view to_string(presence_reason r) noexcept {
  switch (r) {
    case presence_reason::registered: return "registered";
    case presence_reason::expired: return "expired";
    case presence_reason::left: return "left";
  }
  return "registered";
}

struct registry::impl : std::enable_shared_from_this<impl> {
  std::shared_ptr<transport> t;
  std::shared_ptr<amp::clock> clock;
  std::string bucket;
  duration ttl{};
  bool per_key = false;
  std::string id;  // this object among the others that write loads (`record::loads`)

  // What this object knows of entries that were up, by key: its own successful writes
  // (registrations, refreshes), so that a heartbeat can write on the revision it
  // remembers without reading first. With the sweeper (`!per_key`) it is also the
  // sweeper's view of the bucket, kept by a watch, so a write of another registry
  // is seen there too; the sweeper's chain of timers goes with it (`generation`
  // identifies the current link). Per key, only the latest revision is kept.
  struct cached {
    std::uint64_t revision = 0;
    record rec;
  };
  // Where the sweeper and `async_heartbeat`'s long way run: `config.run`, or a pool of
  // `config.workers` threads, made at `open` for the sweeper, else when first needed (`runner`).
  std::optional<broker_config> config;  // set by `open`
  std::shared_ptr<detail::worker_pool> pool;
  executor run;
  duration period{};
  std::mutex mu;  // never held across a transport call
  bool stopped = false;
  std::unordered_map<std::string, cached, detail::string_hash, std::equal_to<>> cache;
  time_point next_prune{};
  std::unique_ptr<subscription> cache_watch;
  timer_id timer = 0;
  time_point armed_at = time_point::max();
  std::uint64_t generation = 0;

  ~impl() { shutdown(); }

  executor runner() {
    std::lock_guard lock(mu);
    if (!run) run = detail::executor_for(*config, pool);
    return run;
  }

  void shutdown() {
    std::unique_ptr<subscription> w;
    {
      std::lock_guard lock(mu);
      stopped = true;
      if (timer != 0) clock->cancel(timer);
      timer = 0;
      w = std::move(cache_watch);
    }
    if (w) w->stop();
  }

  // The TTL written with each value on a backend with per-key TTL. Whole seconds (what
  // JetStream takes), rounded up so the backend never removes an entry before its
  // `expires_at`.
  std::optional<duration> key_ttl() const {
    if (!per_key) return std::nullopt;
    return std::chrono::ceil<std::chrono::seconds>(ttl);
  }

  result<current> read(const std::string& key) {
    auto e = t->kv_get(bucket, key);
    if (!e) {
      if (e.error().code() == errc::not_found) return current{};
      return std::move(e).error();
    }
    return current{.revision = e->revision, .rec = decode(e->value, key)};
  }

  // Writes the tombstone of `c` on its revision.
  result<current> write_down(const std::string& key, const current& c, record_state why) {
    record tomb = *c.rec;
    tomb.state = why;
    auto rev = t->kv_update(bucket, key, encode(tomb), c.revision, key_ttl());
    if (!rev) return std::move(rev).error();
    return current{.revision = *rev, .rec = std::move(tomb)};
  }

  // What `key` holds, after recording the expiry of an entry past its `expires_at`.
  result<current> read_settled(const participant_name& p, const std::string& key) {
    for (int i = 0; i < k_attempts; ++i) {
      auto c = read(key);
      if (!c) return c;
      if (!c->rec || !is_up(c->rec->state) || c->rec->entry.expires_at > clock->now()) return c;
      auto down = write_down(key, *c, record_state::expired);
      if (down || down.error().code() != errc::conflict) return down;
    }
    return busy(p);
  }

  // ----- what this object remembers (`cache`) ------------------------------------------

  // Keeps `rec`, the value of `key` at `revision`, unless a later revision is kept.
  void keep_locked(const std::string& key, std::uint64_t revision, record rec) {
    auto it = cache.find(key);
    if (it != cache.end() && it->second.revision >= revision) return;
    auto expires = rec.entry.expires_at;
    if (it == cache.end()) {
      cache.emplace(key, cached{.revision = revision, .rec = std::move(rec)});
    } else {
      it->second = cached{.revision = revision, .rec = std::move(rec)};
    }
    // Only an entry written with a shorter TTL elsewhere can be due before the next tick.
    if (timer != 0 && expires < armed_at) arm_locked(expires);
  }

  // Remembers a successful write of this object.
  void remember(const std::string& key, std::uint64_t revision, const record& rec) {
    std::lock_guard lock(mu);
    if (stopped) return;
    keep_locked(key, revision, rec);
    prune_locked(clock->now());
  }

  // Forgets `key`: after it was found down at revision `down_at` (0: gone, at a revision
  // not known), or after a call on it failed (nullopt). The sweeper's view keeps an up
  // entry until it is known to be down at a later revision (else its expiry might never
  // be recorded): a stale revision costs one `conflict` at most.
  void forget(const std::string& key, std::optional<std::uint64_t> down_at = std::nullopt) {
    std::lock_guard lock(mu);
    auto it = cache.find(key);
    if (it == cache.end()) return;
    if (!per_key && !(down_at && it->second.revision < *down_at)) return;
    cache.erase(it);
  }

  // Without the sweeper nothing else empties the map of participants that vanished
  // without leaving, so at most once per ttl the entries that ran out are dropped: it
  // holds only what this object wrote within the last two ttl, for O(1) amortized work
  // per write. (With the sweeper, the sweeper and the watch remove them.)
  void prune_locked(time_point now) {
    if (!per_key || now < next_prune) return;
    std::erase_if(cache, [&](const auto& kv) { return kv.second.rec.entry.expires_at <= now; });
    next_prune = now + ttl;
  }

  // The remembered value of `key` while it is up by the clock at `now`.
  std::optional<current> remembered(const std::string& key, time_point now) {
    std::lock_guard lock(mu);
    auto it = cache.find(key);
    if (it == cache.end() || it->second.rec.entry.expires_at <= now) return std::nullopt;
    return current{.revision = it->second.revision, .rec = it->second.rec};
  }

  result<registry_entry> register_participant(const participant_name& p, std::vector<job_name> jobs,
                                              int slots, std::string_view meta_json, int load) {
    if (slots < 0 || slots > max_registry_slots) {
      return unexpected(errc::bad_request,
                        fmt::format("slots must be 0..{}, not {}", max_registry_slots, slots));
    }
    if (load < 0) return negative_load(load);
    auto meta = checked_meta(meta_json);
    if (!meta) return std::move(meta).error();
    record rec{.entry = {.participant = p,
                         .jobs = without_duplicates(std::move(jobs)),
                         .slots = slots,
                         .load = load,
                         .meta = *std::move(meta)},
               .state = record_state::registered,
               .loads = {{id, load}}};
    auto key = subjects::registry_key(p);
    for (int i = 0; i < k_attempts; ++i) {
      auto c = read_settled(p, key);
      if (!c) return std::move(c).error();
      rec.entry.updated_at = to_millis(clock->now());
      rec.entry.expires_at = to_millis(rec.entry.updated_at + ttl);
      auto rev = write_up(key, rec, c->revision);
      if (rev) return rec.entry;
      if (rev.error().code() != errc::conflict) return std::move(rev).error();
    }
    forget(key);
    return busy(p);
  }

  // Writes `rec`, an up entry, on `revision` (0: creates the key) and remembers it; forgets
  // the key after an error other than `conflict` (someone else wrote it).
  result<std::uint64_t> write_up(const std::string& key, const record& rec,
                                 std::uint64_t revision) {
    auto rev = revision == 0 ? t->kv_create(bucket, key, encode(rec), key_ttl())
                             : t->kv_update(bucket, key, encode(rec), revision, key_ttl());
    if (rev) {
      remember(key, *rev, rec);
    } else if (rev.error().code() != errc::conflict) {
      forget(key);
    }
    return rev;
  }

  // The refresh of `rec` at `now`, with this object's `load` when given.
  record refreshed(record rec, std::optional<int> load, time_point now) const {
    rec.state = record_state::refreshed;
    if (load) {
      rec.loads.insert_or_assign(id, *load);
      rec.entry.load = sum_of(rec.loads);
    }
    rec.entry.updated_at = to_millis(now);
    rec.entry.expires_at = to_millis(rec.entry.updated_at + ttl);
    return rec;
  }

  // With `trust_memory`, the first attempt writes on the value remembered, when there is one
  // that has not run out by the clock (only a read records an expiry): when nothing changed
  // since, that is the one operation. A `conflict` (someone else wrote it: a refresh, a
  // registration, an expiry, a leave) reads it.
  result<registry_entry> heartbeat(const participant_name& p, std::optional<int> load,
                                   bool trust_memory = true) {
    if (load && *load < 0) return negative_load(*load);
    auto key = subjects::registry_key(p);
    auto known = trust_memory ? remembered(key, clock->now()) : std::nullopt;
    for (int i = 0; i < k_attempts; ++i) {
      auto c = known ? result<current>(*std::exchange(known, std::nullopt)) : read_settled(p, key);
      if (!c) {
        forget(key);
        return std::move(c).error();
      }
      if (!c->rec || !is_up(c->rec->state)) {
        forget(key, c->revision);
        return not_live(p, *c);
      }
      auto rec = refreshed(*std::move(c->rec), load, clock->now());
      auto rev = write_up(key, rec, c->revision);
      if (rev) return rec.entry;
      if (rev.error().code() != errc::conflict) return std::move(rev).error();
    }
    forget(key);
    return busy(p);
  }

  static error negative_load(int load) {
    return error(errc::bad_request, fmt::format("load must not be negative, not {}", load));
  }

  // `heartbeat`'s first attempt sent without waiting; whatever needs more (nothing
  // remembered, or the write found the entry changed) runs as `heartbeat` on `run`.
  void async_heartbeat(const participant_name& p, std::optional<int> load,
                       completion<registry_entry> done) {
    if (load && *load < 0) return done(negative_load(*load));
    auto key = subjects::registry_key(p);
    auto known = remembered(key, clock->now());
    auto the_long_way = [self = shared_from_this(), p, load, done] {
      self->runner()([self, p, load, done] { done(self->heartbeat(p, load, false)); });
    };
    if (!known || !known->rec || !is_up(known->rec->state)) return the_long_way();
    auto rec = refreshed(*std::move(known->rec), load, clock->now());
    auto value = encode(rec);
    t->async_kv_update(bucket, key, std::move(value), known->revision, key_ttl(),
                       [self = shared_from_this(), key, rec = std::move(rec), done,
                        the_long_way](result<std::uint64_t> rev) {
                         if (rev) {
                           self->remember(key, *rev, rec);
                           return done(rec.entry);
                         }
                         if (rev.error().code() == errc::conflict) return the_long_way();
                         self->forget(key);
                         done(std::move(rev).error());
                       });
  }

  result<void> leave(const participant_name& p) {
    auto key = subjects::registry_key(p);
    for (int i = 0; i < k_attempts; ++i) {
      auto c = read_settled(p, key);
      if (!c) {
        forget(key);
        return std::move(c).error();
      }
      if (!c->rec || !is_up(c->rec->state)) {
        forget(key, c->revision);
        return {};
      }
      auto down = write_down(key, *c, record_state::left);
      if (down) {
        forget(key, down->revision);
        return {};
      }
      if (down.error().code() != errc::conflict) {
        forget(key);
        return std::move(down).error();
      }
    }
    forget(key);
    return busy(p);
  }

  result<std::optional<registry_entry>> get(const participant_name& p) {
    auto key = subjects::registry_key(p);
    auto c = read(key);
    if (!c) return std::move(c).error();
    if (!c->rec || !is_up(c->rec->state) || c->rec->entry.expires_at <= clock->now()) {
      return std::optional<registry_entry>{};
    }
    return std::optional<registry_entry>(std::move(c->rec->entry));
  }

  result<std::vector<registry_entry>> live(const std::optional<job_name>& job) {
    auto entries = list_bucket(*t, bucket);
    if (!entries) return std::move(entries).error();
    auto now = clock->now();
    std::vector<registry_entry> out;
    for (const auto& e : *entries) {
      if (e.op != kv_op::put) continue;
      auto rec = decode(e.value, e.key);
      if (!rec || !is_up(rec->state) || rec->entry.expires_at <= now) continue;
      if (job && !lists(rec->entry, *job)) continue;
      out.push_back(std::move(rec->entry));
    }
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.participant < b.participant; });
    return out;
  }

  result<std::vector<registry_entry>> eligible(const job_name& job) {
    auto all = live(job);
    if (!all) return all;
    std::erase_if(*all, [](const registry_entry& e) { return e.load >= e.slots; });
    // load/slots without division: a.load/a.slots < b.load/b.slots.
    std::stable_sort(all->begin(), all->end(), [](const auto& a, const auto& b) {
      auto l = static_cast<std::int64_t>(a.load) * b.slots;
      auto r = static_cast<std::int64_t>(b.load) * a.slots;
      return l < r;
    });
    return all;
  }

  result<std::unique_ptr<subscription>> watch(std::function<void(const presence_event&)> on_event,
                                              std::vector<registry_entry>* now) {
    if (!on_event) return unexpected(errc::bad_request, "watch needs a callback");
    auto w = std::make_shared<watch_state>();
    w->clock = clock;
    w->on_event = std::move(on_event);
    auto sub = t->kv_watch(bucket, {},
                           {.on_entry =
                                [w](const kv_entry& e) {
                                  std::optional<presence_event> ev;
                                  {
                                    std::lock_guard lock(w->mu);
                                    if (!w->caught_up) return w->take_initial(e);
                                    ev = w->translate(e);
                                  }
                                  if (ev) w->on_event(*ev);
                                },
                            .on_caught_up =
                                [w] {
                                  std::lock_guard lock(w->mu);
                                  w->caught_up = true;
                                  for (const auto& [key, entry] : w->up)
                                    w->initial.push_back(entry);
                                  w->cv.notify_all();
                                }});
    if (!sub) return sub;
    detail::write_batch::flush();
    std::unique_lock lock(w->mu);
    if (!w->cv.wait_for(lock, k_listing_timeout, [&] { return w->caught_up; })) {
      lock.unlock();
      (*sub)->stop();
      return unexpected(errc::unavailable,
                        fmt::format("watch of bucket \"{}\": the initial entries did not arrive "
                                    "in time",
                                    bucket));
    }
    if (now) *now = std::move(w->initial);  // sorted: taken from a map by key
    w->initial.clear();
    return sub;
  }

  // ----- the sweeper ------------------------------------------------------------------

  result<void> start_sweeper() {
    std::weak_ptr<impl> weak = weak_from_this();
    auto sub = t->kv_watch(bucket, {}, {.on_entry = [weak](const kv_entry& e) {
                             if (auto self = weak.lock()) self->on_cache_entry(e);
                           }});
    if (!sub) return std::move(sub).error();
    std::lock_guard lock(mu);
    cache_watch = *std::move(sub);
    auto next = clock->now() + period;
    for (const auto& [key, c] : cache) next = std::min(next, c.rec.entry.expires_at);
    arm_locked(next);
    return {};
  }

  void on_cache_entry(const kv_entry& e) {
    auto rec = e.op == kv_op::put ? decode(e.value, e.key) : std::nullopt;
    std::lock_guard lock(mu);
    if (stopped) return;
    // A write of this object is kept as soon as it succeeds: the watch may bring what
    // came before it later.
    if (!rec || !is_up(rec->state)) {
      if (auto it = cache.find(e.key); it != cache.end() && it->second.revision < e.revision) {
        cache.erase(it);
      }
      return;
    }
    keep_locked(e.key, e.revision, *std::move(rec));
  }

  void arm_locked(time_point at) {
    if (stopped) return;
    if (timer != 0) clock->cancel(timer);
    auto gen = ++generation;
    armed_at = at;
    std::weak_ptr<impl> weak = weak_from_this();
    // The clock's thread only hands the work over: sweeping blocks on the backend.
    timer = clock->call_at(at, [weak, gen] {
      auto self = weak.lock();
      if (!self) return;
      self->run([weak, gen] {
        if (auto s = weak.lock()) s->sweep(gen);
      });
    });
  }

  void sweep(std::uint64_t gen) {
    std::vector<std::pair<std::string, cached>> due;
    time_point now;
    time_point next;
    {
      std::lock_guard lock(mu);
      if (stopped || gen != generation) return;
      timer = 0;
      now = clock->now();
      next = now + period;
      for (const auto& [key, c] : cache) {
        if (c.rec.entry.expires_at <= now) {
          due.emplace_back(key, c);
        } else {
          next = std::min(next, c.rec.entry.expires_at);
        }
      }
    }
    for (auto& [key, c] : due) {
      // Of several sweepers (and heartbeats) exactly one write on this revision succeeds;
      // a `conflict` means someone else recorded the expiry or refreshed the entry, and
      // the watch brings the news. Other failures are retried at the next tick.
      current cur{.revision = c.revision, .rec = std::move(c.rec)};
      if (auto r = write_down(key, cur, record_state::expired); r) {
        std::lock_guard lock(mu);
        if (auto it = cache.find(key); it != cache.end() && it->second.revision == c.revision) {
          cache.erase(it);
        }
      }
    }
    std::lock_guard lock(mu);
    if (gen == generation) arm_locked(next);
  }
};

registry::registry(std::shared_ptr<impl> p) : impl_(std::move(p)) {}

registry::~registry() {
  impl_->shutdown();
}

result<std::shared_ptr<registry>> registry::open(std::shared_ptr<transport> t,
                                                 const broker_config& config) {
  if (!t) return unexpected(errc::bad_request, "registry needs a transport");
  if (config.registry_ttl <= duration::zero() || config.registry_ttl > max_registry_ttl) {
    return unexpected(
        errc::bad_request,
        fmt::format(
            "registry_ttl must be more than 0 and at most {} h, not {} ms",
            std::chrono::duration_cast<std::chrono::hours>(max_registry_ttl).count(),
            std::chrono::duration_cast<std::chrono::milliseconds>(config.registry_ttl).count()));
  }
  kv_config kc{.bucket = subjects::registry_bucket(config.ns),
               .history = 1,
               .ttl = registry_tombstone_age,
               .storage = config.storage,
               .replicas = config.replicas};
  if (auto r = t->ensure_bucket(kc); !r) return std::move(r).error();

  auto p = std::make_shared<impl>();
  p->clock = t->clock();
  p->bucket = kc.bucket;
  p->id = detail::unique_id("r", p->clock->now());
  p->ttl = config.registry_ttl;
  p->per_key = t->caps().per_key_ttl && !config.registry_force_sweeper;
  p->t = std::move(t);
  p->config = config;
  p->run = config.run;
  if (!p->per_key) {
    p->period = std::max(k_min_sweep_period, config.registry_ttl / 4);
    p->runner();  // the sweeper runs there
    if (auto r = p->start_sweeper(); !r) return std::move(r).error();
  }
  return std::shared_ptr<registry>(new registry(std::move(p)));
}

result<registry_entry> registry::register_participant(const participant_name& participant,
                                                      std::vector<job_name> jobs, int slots,
                                                      std::string_view meta_json, int load) {
  return impl_->register_participant(participant, std::move(jobs), slots, meta_json, load);
}

result<registry_entry> registry::heartbeat(const participant_name& participant,
                                           std::optional<int> load) {
  return impl_->heartbeat(participant, load);
}

void registry::async_heartbeat(const participant_name& participant, std::optional<int> load,
                               completion<registry_entry> done) {
  impl_->async_heartbeat(participant, load, std::move(done));
}

result<void> registry::leave(const participant_name& participant) {
  return impl_->leave(participant);
}

result<std::optional<registry_entry>> registry::get(const participant_name& participant) {
  return impl_->get(participant);
}

result<std::vector<registry_entry>> registry::live(const std::optional<job_name>& job) {
  return impl_->live(job);
}

result<std::vector<registry_entry>> registry::eligible(const job_name& job) {
  return impl_->eligible(job);
}

result<std::unique_ptr<subscription>> registry::watch(
    std::function<void(const presence_event&)> on_event, std::vector<registry_entry>* now) {
  return impl_->watch(std::move(on_event), now);
}

bool registry::uses_sweeper() const noexcept {
  return !impl_->per_key;
}

}  // namespace amp
