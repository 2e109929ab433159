#include "amp/sink/sink.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "detail/wait_for.hpp"
#include "detail/write_batch.hpp"
#include "sink/rows.hpp"
#include "transport/stream_rules.hpp"

namespace amp::sink {
namespace {

constexpr duration k_optional_pause = std::chrono::seconds(10);
constexpr duration k_lag_every = std::chrono::seconds(1);
constexpr std::size_t k_max_reason = 1024;
constexpr duration k_fill_slice = std::chrono::milliseconds(100);
constexpr std::string_view k_nats_header_prefix = "Nats-";

// What became of one consumed message in a batch.
enum class fate {
  pass_over,  // not the sink's: acknowledged without a row
  commit,     // its row is in the batch
  folded,     // another message of the batch with its key stands for it (skip or replace)
  unwritable  // tried and failed: nak, or dead-letter on the last try
};

struct entry {
  const message* m = nullptr;
  fate what = fate::pass_over;
  std::size_t row = 0;   // index in the batch's rows, with commit
  std::string reason{};  // with unwritable
  bool duplicate = false;
  std::size_t owner = 0;  // with folded: the entry that stands for it
};

// A header value without line breaks or control characters, at most k_max_reason bytes.
std::string header_value(std::string_view text) {
  std::string out(text.substr(0, k_max_reason));
  for (auto& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return out;
}

deliver_policy policy_of(const start_position& p) {
  switch (p.from) {
    case start_position::kind::new_messages: return deliver_policy::new_messages;
    case start_position::kind::all: return deliver_policy::all;
    case start_position::kind::sequence: return deliver_policy::by_start_sequence;
    case start_position::kind::time: return deliver_policy::by_start_time;
  }
  return deliver_policy::all;
}

}  // namespace

void histogram::observe(double seconds) noexcept {
  for (std::size_t i = 0; i < std::size(bounds); ++i) {
    if (seconds <= bounds[i]) ++buckets[i];
  }
  ++count;
  sum += seconds;
}

struct sink::impl {
  struct slot {
    std::unique_ptr<target> t;
    bool required = true;
    bool opened = false;
    time_point retry_at{};  // an optional target that failed rests until then
  };

  std::shared_ptr<transport> backend;
  sink_config config;
  detail::source_rules rules;
  sink_options options;
  std::string stream;
  std::string filter;
  std::string dlq_subject;
  std::vector<slot> targets;

  bool prepared = false;
  std::vector<message> held;  // a batch whose required targets were away
  duration next_backoff{};
  time_point lag_at{};
  time_point probe_at{};
  // With `from: {"seq":N}`, N: what JetStream delivers below it (it moves a start beyond
  // the stream's end down to the next message stored) is passed over.
  std::uint64_t start_floor = 0;
  std::atomic<bool> stopping{false};
  std::atomic<bool> is_ready{false};
  mutable std::mutex stats_mutex;
  sink_stats counters;

  impl(std::shared_ptr<transport> b, sink_config c, sink_options o)
      : backend(std::move(b)),
        config(std::move(c)),
        rules(detail::source_rules::of(config)),
        options(std::move(o)),
        stream(detail::source_stream(rules)),
        filter(detail::source_filter(rules)),
        dlq_subject(subjects::dlq_subject(rules.ns, sink_name::make(config.name).value())) {}

  void log(std::string_view level, std::string_view event, const std::string& detail) const {
    if (options.log) options.log(level, event, detail);
  }

  template <class F>
  void count(F&& f) {
    std::lock_guard lock(stats_mutex);
    f(counters);
  }

  // The dead-letter stream and the consumer. `conflict` and `bad_request` can never pass;
  // `unavailable` and `not_found` (the source stream is not there yet) may.
  result<void> prepare() {
    // Its duplicate window outlasts AckWait: an original whose acknowledgement was lost
    // after its dead letter was stored comes back within it, and is not stored twice.
    auto dlq = backend->ensure_stream(
        {.name = subjects::dlq_stream(rules.ns),
         .subjects = {subjects::dlq_subjects(rules.ns)},
         .duplicate_window = std::max<duration>(std::chrono::minutes(2), 2 * config.ack_wait)});
    // A dead-letter stream configured otherwise by its operator is theirs to keep.
    if (!dlq && dlq.error().code() == errc::conflict) {
      dlq = backend->stream_info_of(subjects::dlq_stream(rules.ns));
    }
    if (!dlq) return dlq.error();

    consumer_config c{.stream = stream,
                      .durable = config.name,
                      .filter_subject = filter,
                      .ack_wait = config.ack_wait,
                      .max_ack_pending = static_cast<std::int64_t>(
                          std::max<std::size_t>(1000, 2 * config.max_messages)),
                      .max_deliver = -1,
                      .deliver = policy_of(config.from),
                      .start_seq = config.from.seq,
                      .start_time = config.from.time};
    auto existing = backend->consumer_info_of(stream, config.name);
    if (!existing) {
      if (existing.error().code() != errc::not_found) return existing.error();
      if (auto s = backend->stream_info_of(stream); !s) {
        if (s.error().code() == errc::not_found) {
          return unexpected(errc::not_found,
                            fmt::format("the stream {} is not there yet (nothing was stored in "
                                        "namespace {} so far)",
                                        stream, rules.ns.view()));
        }
        return s.error();
      }
      auto made = backend->ensure_consumer(c);
      if (!made) return made.error();
      note_start(made->config);
      log("info", "consumer_created",
          fmt::format("\"stream\":{},\"consumer\":{},\"filter\":{}", json_quote(stream),
                      json_quote(config.name), json_quote(filter)));
      return {};
    }
    const auto& old = existing->config;
    note_start(old);
    if (rules.kind == source_kind::tasks && old.filter_subject != filter) {
      return unexpected(errc::conflict,
                        fmt::format("the consumer {} of {} reads {}, not {}: a sink of another "
                                    "namespace has this name (sinks of tasks share one stream: "
                                    "give this one another name)",
                                    config.name, stream, old.filter_subject, filter));
    }
    // `from` counts only when the consumer is first made.
    c.deliver = old.deliver;
    c.start_seq = old.start_seq;
    c.start_time = old.start_time;
    c.inactive_threshold = old.inactive_threshold;
    if (c == old) return {};
    auto changed = backend->update_consumer(c);
    if (!changed) return changed.error();
    log("info", "consumer_updated",
        fmt::format("\"consumer\":{},\"filter\":{}", json_quote(config.name), json_quote(filter)));
    return {};
  }

  void note_start(const consumer_config& c) {
    start_floor = c.deliver == deliver_policy::by_start_sequence ? c.start_seq : 0;
  }

  // The next batch's first messages, asked for while the current batch is written (one
  // pull request in flight at a time).
  struct prefetch_state {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    bool abandoned = false;  // the sink went: what comes is given back
    result<std::vector<message>> got{std::vector<message>{}};
  };
  std::shared_ptr<prefetch_state> prefetch;

  void start_prefetch() {
    if (prefetch || stopping.load()) return;
    auto p = std::make_shared<prefetch_state>();
    prefetch = p;
    backend->async_fetch(
        stream, config.name, {.batch = config.max_messages, .max_wait = options.idle_wait},
        // Weak: the transport holds this completion while the
        // fetch waits, and must not be kept alive by it.
        [p, weak = std::weak_ptr<transport>(backend)](result<std::vector<message>> r) {
          std::lock_guard lock(p->mutex);
          if (p->abandoned) {
            if (auto t = weak.lock(); t && r) give_back(*t, *r);
            return;
          }
          p->got = std::move(r);
          p->done = true;
          p->cv.notify_all();
        });
  }

  result<std::vector<message>> take_prefetch() {
    auto p = std::move(prefetch);
    std::unique_lock lock(p->mutex);
    p->cv.wait(lock, [&] { return p->done; });
    return std::move(p->got);
  }

  static void give_back(transport& t, const std::vector<message>& messages) {
    for (const auto& m : messages) t.acknowledge(m, ack_kind::nak);
  }

  // What a prefetch brought or will bring that will not be written (the sink stops or
  // goes): given back for prompt redelivery, without waiting for it.
  void give_back_prefetch() {
    if (!prefetch) return;
    auto p = std::move(prefetch);
    std::lock_guard lock(p->mutex);
    if (!p->done) {
      p->abandoned = true;
      return;
    }
    if (p->got) give_back(*backend, *p->got);
  }

  // Waits up to `idle_wait` for a first message (or takes what the prefetch brought), then
  // fills the batch up to `max_messages` until `max_wait` after the first message was stored:
  // an event waits for its batch at most that long, and a backlog does not wait at all.
  result<std::vector<message>> fetch_batch() {
    std::optional<result<std::vector<message>>> prefetched;
    if (prefetch) prefetched = take_prefetch();
    // A prefetch that ran out empty (or failed) is followed by a fetch of our own.
    auto first =
        prefetched && *prefetched && !(*prefetched)->empty()
            ? std::move(*prefetched)
            : backend->fetch(stream, config.name,
                             {.batch = config.max_messages, .max_wait = options.idle_wait});
    if (!first || first->empty()) return first;
    auto batch = std::move(*first);
    const auto now = backend->clock()->now();
    // The backend's storage time, unless its clock runs ahead of ours.
    const auto deadline = std::min(batch.front().time, now) + config.max_wait;
    while (batch.size() < config.max_messages && !stopping.load()) {
      const auto left = deadline - backend->clock()->now();
      // In slices, so that a stop is heard within one however long batches wait to fill.
      auto more = backend->fetch(stream, config.name,
                                 {.batch = config.max_messages - batch.size(),
                                  .max_wait = std::clamp(left, duration::zero(), k_fill_slice)});
      if (!more) break;
      if (more->empty()) {
        if (left <= k_fill_slice) break;
        continue;
      }
      std::move(more->begin(), more->end(), std::back_inserter(batch));
    }
    return batch;
  }

  step_result transient(std::string_view event, const std::string& detail) {
    is_ready = false;
    next_backoff = next_backoff == duration::zero()
                       ? options.backoff_min
                       : std::min(next_backoff * 2, options.backoff_max);
    count([](sink_stats& s) { ++s.transient_failures; });
    log("warn", event, detail);
    // Kept in hand: AckWait starts over, so the batch is not redelivered meanwhile; so is
    // what the prefetch brought.
    for (const auto& m : held) backend->acknowledge(m, ack_kind::in_progress);
    if (prefetch) {
      std::lock_guard lock(prefetch->mutex);
      if (prefetch->done && prefetch->got) {
        for (const auto& m : *prefetch->got) backend->acknowledge(m, ack_kind::in_progress);
      }
    }
    return step_result::transient;
  }

  step_result step() {
    if (!prepared) {
      if (auto r = prepare(); !r) {
        return transient("source_unavailable",
                         fmt::format("\"error\":{}", json_quote(r.error().message())));
      }
      prepared = true;
    }
    if (held.empty()) {
      auto batch = fetch_batch();
      if (!batch) {
        if (batch.error().code() == errc::not_found) prepared = false;  // consumer removed
        return transient("fetch_failed",
                         fmt::format("\"error\":{}", json_quote(batch.error().message())));
      }
      held = std::move(*batch);
      if (!held.empty()) start_prefetch();
      refresh_lag();
      if (held.empty()) {
        check_readiness();
        return step_result::idle;
      }
    }
    return write_held();
  }

  bool open_required() {
    for (auto& s : targets) {
      if (!s.required || s.opened) continue;
      auto r = s.t->open();
      if (!r) {
        log("warn", "target_unavailable",
            fmt::format("\"target\":{},\"error\":{}", json_quote(s.t->describe()),
                        json_quote(r.error().message())));
        return false;
      }
      s.opened = true;
    }
    return true;
  }

  // With nothing written (idle, or only messages without a row): ready once the required
  // targets open, and while they answer a probe every `probe_every`.
  void check_readiness() {
    const auto now = backend->clock()->now();
    if (!is_ready) {
      is_ready = open_required();
    } else if (now >= probe_at) {
      is_ready = probe_required();
    } else {
      return;
    }
    probe_at = now + options.probe_every;
  }

  bool probe_required() {
    for (auto& s : targets) {
      if (!s.required || !s.opened) continue;
      if (auto r = s.t->probe(); !r) {
        s.opened = false;
        log("warn", "target_unavailable",
            fmt::format("\"target\":{},\"error\":{}", json_quote(s.t->describe()),
                        json_quote(r.error().message())));
        return false;
      }
    }
    return true;
  }

  void refresh_lag() {
    const auto now = backend->clock()->now();
    if (now < lag_at) return;
    lag_at = now + k_lag_every;
    if (auto info = backend->consumer_info_of(stream, config.name)) {
      count([&](sink_stats& s) { s.lag = info->num_pending; });
    }
  }

  // Maps the held messages to rows, one per key: a later message with a key the batch has
  // already is folded into it (skip: the first stays; replace: the last wins) or, with
  // `fail`, refused.
  std::vector<row> rows_of(std::vector<entry>& entries) {
    std::vector<row> rows;
    std::vector<std::size_t> owner;  // per row: the entry it came from
    std::unordered_map<std::string, std::size_t> by_key;
    std::unordered_map<std::uint64_t, std::size_t> by_seq;
    for (std::size_t i = 0; i < held.size(); ++i) {
      auto& e = entries[i];
      e.m = &held[i];
      // The same message twice (a redelivery met its earlier delivery): one row, and the
      // second delivery goes as the first does.
      if (auto [at, fresh] = by_seq.try_emplace(held[i].seq, i); !fresh) {
        e.what = fate::folded;
        e.owner = at->second;
        continue;
      }
      if (held[i].seq < start_floor) continue;  // passed over
      auto mapped = detail::map_message(rules, held[i]);
      if (mapped.what == detail::mapped::kind::pass_over) continue;
      if (mapped.what == detail::mapped::kind::unwritable) {
        e.what = fate::unwritable;
        e.reason = std::move(mapped.reason);
        continue;
      }
      auto [it, fresh] = by_key.try_emplace(mapped.r.key, rows.size());
      if (fresh) {
        e.what = fate::commit;
        e.row = rows.size();
        rows.push_back(std::move(mapped.r));
        owner.push_back(i);
        continue;
      }
      const auto r = it->second;
      switch (config.on_duplicate) {
        case duplicate_mode::skip:
          e.what = fate::folded;
          e.duplicate = true;
          e.owner = owner[r];
          break;
        case duplicate_mode::replace:
          entries[owner[r]].what = fate::folded;
          entries[owner[r]].duplicate = true;
          entries[owner[r]].owner = i;
          rows[r] = std::move(mapped.r);
          owner[r] = i;
          e.what = fate::commit;
          e.row = r;
          break;
        case duplicate_mode::fail:
          e.what = fate::unwritable;
          e.reason = fmt::format("duplicate key {} (on_duplicate: fail)", amp::quoted(it->first));
          break;
      }
    }
    return rows;
  }

  step_result write_held() {
    std::vector<entry> entries(held.size());
    auto rows = rows_of(entries);
    // Per row: whether every required target took it, and why not.
    std::vector<std::string> refused(rows.size());
    std::vector<bool> duplicate(rows.size(), false);
    std::vector<bool> changed(rows.size(), false);
    const auto started = std::chrono::steady_clock::now();
    if (!rows.empty()) {
      for (auto& s : targets) {
        if (!s.required) continue;
        auto written = s.t->write(rows, config.on_duplicate);
        if (!written) {
          s.opened = false;
          return transient(
              "target_unavailable",
              fmt::format("\"target\":{},\"error\":{},\"messages\":{}", json_quote(s.t->describe()),
                          json_quote(written.error().message()), held.size()));
        }
        s.opened = true;
        if (written->outcomes.size() != rows.size() || written->reasons.size() != rows.size()) {
          s.opened = false;
          return transient(
              "target_failed",
              fmt::format("\"target\":{},\"error\":\"{} outcomes for {} rows\"",
                          json_quote(s.t->describe()), written->outcomes.size(), rows.size()));
        }
        for (std::size_t r = 0; r < rows.size(); ++r) {
          switch (written->outcomes[r]) {
            case row_outcome::written:
            case row_outcome::replaced: changed[r] = true; break;
            case row_outcome::same:
            case row_outcome::skipped: duplicate[r] = true; break;
            case row_outcome::duplicate:
              if (refused[r].empty()) {
                refused[r] = fmt::format(
                    "{}: key {} is stored for another message "
                    "(on_duplicate: fail)",
                    s.t->describe(), amp::quoted(rows[r].key));
              }
              break;
            case row_outcome::refused:
              if (refused[r].empty()) refused[r] = written->reasons[r];
              break;
          }
        }
      }
    }
    const auto committed_at = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(committed_at - started).count();

    for (auto& e : entries) {
      if (e.what == fate::commit && !refused[e.row].empty()) {
        e.what = fate::unwritable;
        e.reason = refused[e.row];
      }
    }
    auto acked = settle(entries);
    // Optional targets after the acknowledgement: they never hold it back.
    write_optional(rows, refused);

    std::uint64_t committed = 0;
    std::uint64_t duplicates = 0;
    std::uint64_t passed = 0;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      if (refused[r].empty()) committed += changed[r] ? 1 : 0;
    }
    for (const auto& e : entries) {
      if (e.what == fate::pass_over) ++passed;
      if (e.duplicate || (e.what == fate::commit && duplicate[e.row])) ++duplicates;
    }
    count([&](sink_stats& s) {
      s.committed += committed;
      s.duplicates_skipped += duplicates;
      s.passed_over += passed;
      s.acked += acked.size();
      ++s.batches;
      if (!rows.empty()) s.commit_seconds.observe(seconds);
    });
    held.clear();
    next_backoff = duration::zero();
    if (rows.empty()) {
      check_readiness();
    } else {
      is_ready = true;
      probe_at = backend->clock()->now() + options.probe_every;  // the commit answered
    }
    if (options.on_acked && !acked.empty()) {
      options.on_acked({.seqs = std::move(acked),
                        .committed = committed_at,
                        .acked = std::chrono::steady_clock::now()});
    }
    return step_result::committed;
  }

  void write_optional(const std::vector<row>& rows, const std::vector<std::string>& refused) {
    const auto now = backend->clock()->now();
    if (std::none_of(targets.begin(), targets.end(),
                     [&](const slot& s) { return !s.required && now >= s.retry_at; })) {
      return;
    }
    std::vector<row> side;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      if (refused[r].empty()) side.push_back(rows[r]);
    }
    if (side.empty()) return;
    for (auto& s : targets) {
      if (s.required || now < s.retry_at) continue;
      auto written = s.t->write(side, config.on_duplicate);
      std::size_t not_taken = 0;
      if (written) {
        not_taken = static_cast<std::size_t>(
            std::count_if(written->outcomes.begin(), written->outcomes.end(), [](row_outcome o) {
              return o == row_outcome::refused || o == row_outcome::duplicate;
            }));
      }
      if (written && not_taken == 0) continue;
      count([](sink_stats& st) { ++st.optional_failures; });
      if (!written) s.retry_at = now + k_optional_pause;
      log("warn", "optional_target_failed",
          fmt::format(
              "\"target\":{},\"error\":{}", json_quote(s.t->describe()),
              json_quote(written ? fmt::format("{} of {} rows not taken", not_taken, side.size())
                                 : written.error().message())));
    }
  }

  // Acknowledges what is committed or not the sink's, dead-letters what is due, naks the
  // rest; waits for the acknowledgements. Returns the sequences acknowledged.
  std::vector<std::uint64_t> settle(std::vector<entry>& entries) {
    std::vector<const message*> to_ack;
    for (auto& e : entries) {
      if (e.what == fate::folded) {
        // Acknowledged with the message that stands for it once that one is committed;
        // otherwise tried again on its own.
        const entry* o = &entries[e.owner];
        while (o->what == fate::folded) o = &entries[o->owner];
        if (o->what == fate::commit) {
          to_ack.push_back(e.m);
        } else {
          backend->acknowledge(*e.m, ack_kind::nak, options.backoff_min);
        }
        continue;
      }
      if (e.what != fate::unwritable) {
        to_ack.push_back(e.m);
        continue;
      }
      count([](sink_stats& s) { ++s.failures; });
      const auto tries = e.m->delivery_count;
      if (tries < static_cast<std::uint64_t>(config.max_failures)) {
        const auto delay = std::min<duration>(
            options.backoff_min * (1LL << std::min<std::uint64_t>(tries, 10)), options.backoff_max);
        log("warn", "message_failed",
            fmt::format("\"seq\":{},\"try\":{},\"error\":{}", e.m->seq, tries,
                        json_quote(e.reason)));
        backend->acknowledge(*e.m, ack_kind::nak, delay);
        continue;
      }
      if (dead_letter(*e.m, e.reason)) to_ack.push_back(e.m);
    }
    std::vector<std::uint64_t> acked;
    if (to_ack.empty()) return acked;
    // One confirmed acknowledgement for the batch: the others go first, unconfirmed, on the
    // same connection, and JetStream handles a connection's acknowledgements in the order
    // sent, so the last one's confirmation says every one before it was taken too.
    amp::detail::write_batch one_write;  // every acknowledgement in one write
    for (std::size_t i = 0; i + 1 < to_ack.size(); ++i) {
      backend->acknowledge(*to_ack[i], ack_kind::ack);
    }
    auto confirmed = amp::detail::wait_for<void>([&](completion<void> done) {
      backend->async_acknowledge(*to_ack.back(), ack_kind::ack, duration::zero(), std::move(done));
    });
    if (!confirmed) {
      log("warn", "ack_failed",
          fmt::format("\"error\":{}", json_quote(confirmed.error().message())));
      return acked;
    }
    for (const auto* m : to_ack) acked.push_back(m->seq);
    std::sort(acked.begin(), acked.end());
    return acked;
  }

  bool dead_letter(const message& m, const std::string& reason) {
    outgoing_message out{.subject = dlq_subject, .data = m.data, .headers = {}, .msg_id = {}};
    for (const auto& h : m.headers) {
      if (h.first == amp::detail::k_msg_id_header) {
        out.msg_id = h.second;  // sent as the same header, and the dead letter's dedup id
      } else if (!h.first.starts_with(k_nats_header_prefix)) {
        // JetStream's other headers (the expected last sequence of a KV write, a TTL, a
        // rollup) would be judged again against the dead-letter stream: they stay.
        out.headers.push_back(h);
      }
    }
    out.headers.emplace_back("Amp-Dlq-Reason", header_value(reason));
    out.headers.emplace_back("Amp-Dlq-Stream", m.stream);
    out.headers.emplace_back("Amp-Dlq-Seq", std::to_string(m.seq));
    // Deduplicated, so that a dead letter stored before an acknowledgement that was lost is
    // not stored again: by the original's id, or (none: a task's record, a message
    // published on NATS without one) by the sink's own.
    const auto own_id = fmt::format("{}:{}:{}", config.name, m.stream, m.seq);
    if (out.msg_id.empty()) out.msg_id = own_id;
    auto published = backend->publish(out);
    // The original's id was seen: this dead letter, or another one (another sink's of the
    // same message, another message with that id). Then this one is stored too, by its own
    // id, the original's kept as Amp-Dlq-Msg-Id.
    if (published && published->duplicate && out.msg_id != own_id &&
        !is_dead_letter_of(m, published->seq)) {
      log("warn", "dead_letter_id_taken",
          fmt::format("\"seq\":{},\"msg_id\":{},\"dlq_seq\":{}", m.seq, json_quote(out.msg_id),
                      published->seq));
      out.headers.emplace_back("Amp-Dlq-Msg-Id", std::move(out.msg_id));
      out.msg_id = own_id;
      published = backend->publish(std::move(out));
    }
    if (!published) {
      log("error", "dead_letter_failed",
          fmt::format("\"seq\":{},\"error\":{}", m.seq, json_quote(published.error().message())));
      backend->acknowledge(m, ack_kind::nak, options.backoff_max);
      return false;
    }
    if (!published->duplicate) count([](sink_stats& s) { ++s.dead_lettered; });
    log("warn", "dead_lettered",
        fmt::format("\"seq\":{},\"dlq_seq\":{},\"reason\":{}", m.seq, published->seq,
                    json_quote(reason)));
    return true;
  }

  // Whether the dead-letter stream's message `dlq_seq` is this sink's of `m`.
  bool is_dead_letter_of(const message& m, std::uint64_t dlq_seq) {
    auto stored = backend->get_message(subjects::dlq_stream(rules.ns), dlq_seq);
    return stored && stored->subject == dlq_subject &&
           find_header(stored->headers, "Amp-Dlq-Stream") == m.stream &&
           find_header(stored->headers, "Amp-Dlq-Seq") == std::to_string(m.seq);
  }
};

result<std::unique_ptr<sink>> sink::create(std::shared_ptr<transport> backend, sink_config config,
                                           std::vector<std::unique_ptr<target>> targets,
                                           sink_options options) {
  if (auto r = check_sink_config(config); !r) return r.error();
  if (!backend) return unexpected(errc::bad_request, "sink: no transport");
  if (!targets.empty() && targets.size() != config.targets.size()) {
    return unexpected(errc::bad_request, fmt::format("sink: {} targets for {} configured",
                                                     targets.size(), config.targets.size()));
  }
  if (targets.empty()) {
    for (const auto& t : config.targets) {
      auto made = make_target(t);
      if (!made) return made.error();
      targets.push_back(std::move(*made));
    }
  }
  auto p = std::make_unique<impl>(std::move(backend), std::move(config), std::move(options));
  for (std::size_t i = 0; i < targets.size(); ++i) {
    p->targets.push_back({.t = std::move(targets[i]), .required = p->config.targets[i].required});
  }
  if (auto r = p->prepare(); r) {
    p->prepared = true;
  } else if (r.error().code() != errc::unavailable && r.error().code() != errc::not_found) {
    return r.error();
  }
  return std::unique_ptr<sink>(new sink(std::move(p)));
}

sink::sink(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
sink::~sink() {
  impl_->give_back_prefetch();
}

step_result sink::step() {
  return impl_->step();
}

void sink::run() {
  while (!impl_->stopping.load()) {
    if (step() == step_result::transient) {
      // Sleeps in short slices so that stop() is seen at once.
      const auto until = std::chrono::steady_clock::now() + impl_->next_backoff;
      while (!impl_->stopping.load() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  impl_->give_back_prefetch();
}

void sink::stop() noexcept {
  impl_->stopping.store(true);
}

duration sink::backoff() const {
  return impl_->next_backoff;
}

bool sink::ready() const noexcept {
  return impl_->is_ready.load();
}

sink_stats sink::stats() const {
  std::lock_guard lock(impl_->stats_mutex);
  return impl_->counters;
}

const sink_config& sink::config() const noexcept {
  return impl_->config;
}

std::string metrics_text(const sink_stats& s, std::string_view name, bool ready) {
  std::string out;
  const auto label = fmt::format("{{sink={}}}", json_quote(name));
  auto series = [&](std::string_view metric, std::string_view type, std::string_view help,
                    auto value) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} {2}\n{0}{3} {4}\n", metric, help, type, label,
                       value);
  };
  series("amp_sink_messages_committed_total", "counter",
         "Rows written or replaced in the required targets.", s.committed);
  series("amp_sink_duplicates_skipped_total", "counter",
         "Messages whose key was stored already (a redelivery, or another message's key).",
         s.duplicates_skipped);
  series("amp_sink_dead_lettered_total", "counter", "Messages published to the dead-letter stream.",
         s.dead_lettered);
  series("amp_sink_batches_total", "counter", "Batches committed and acknowledged.", s.batches);
  series("amp_sink_acked_total", "counter", "Messages acknowledged.", s.acked);
  series("amp_sink_passed_over_total", "counter",
         "Messages acknowledged without a row (not the sink's to write).", s.passed_over);
  series("amp_sink_failures_total", "counter", "Tries of messages that could not be written.",
         s.failures);
  series("amp_sink_transient_failures_total", "counter",
         "Batches that a required target or the backend could not take.", s.transient_failures);
  series("amp_sink_optional_failures_total", "counter",
         "Batches that an optional target did not take whole.", s.optional_failures);
  out +=
      "# HELP amp_sink_commit_seconds Time to commit a batch to the required targets.\n"
      "# TYPE amp_sink_commit_seconds histogram\n";
  for (std::size_t i = 0; i < std::size(histogram::bounds); ++i) {
    out += fmt::format("amp_sink_commit_seconds_bucket{{sink={},le=\"{}\"}} {}\n", json_quote(name),
                       histogram::bounds[i], s.commit_seconds.buckets[i]);
  }
  out += fmt::format("amp_sink_commit_seconds_bucket{{sink={},le=\"+Inf\"}} {}\n", json_quote(name),
                     s.commit_seconds.count);
  out += fmt::format("amp_sink_commit_seconds_sum{} {}\namp_sink_commit_seconds_count{} {}\n",
                     label, s.commit_seconds.sum, label, s.commit_seconds.count);
  series("amp_sink_lag", "gauge", "Messages in the source not yet delivered to the sink.", s.lag);
  series("amp_sink_ready", "gauge", "1 while the sink commits, 0 while a target is away.",
         ready ? 1 : 0);
  return out;
}

result<std::vector<std::string>> check_sink(const sink_config& config,
                                            std::shared_ptr<transport> backend) {
  if (auto r = check_sink_config(config); !r) return r.error();
  std::vector<std::string> lines;
  for (const auto& c : config.targets) {
    auto t = make_target(c);
    if (!t) return t.error();
    if (auto r = (*t)->open(); !r) return r.error();
    lines.push_back(fmt::format("ok {}{}", (*t)->describe(), c.required ? "" : " (optional)"));
  }
  if (backend) {
    const auto rules = detail::source_rules::of(config);
    const auto stream = detail::source_stream(rules);
    auto info = backend->stream_info_of(stream);
    if (!info && info.error().code() == errc::not_found) {
      lines.push_back(
          fmt::format("wait source {} filter {}: not there yet (made when the "
                      "namespace is first used); the sink waits for it",
                      stream, detail::source_filter(rules)));
      return lines;
    }
    if (!info) {
      return unexpected(info.error().code(),
                        fmt::format("source {}: {}", stream, info.error().message()));
    }
    lines.push_back(fmt::format("ok source {} filter {} ({} messages)", stream,
                                detail::source_filter(rules), info->state.messages));
  }
  return lines;
}

}  // namespace amp::sink
