#pragma once

/// \file
/// A sink (`amp-sink-v1.md`, seed 004): consumes a namespace's topics or its ended tasks
/// through a durable consumer, in batches, commits each batch to its targets, and only then
/// acknowledges it. Redelivery is normal (a crash between commit and ack redelivers), so
/// every row has an idempotency key and a key already stored is resolved as `on_duplicate`
/// says; a message that can never be written goes to the dead-letter stream `AMP_DLQ_<ns>`
/// first, and is acknowledged only once that publication is.
///
/// The consumer. `name` names the durable consumer: on `AMP_TOPICS_<ns>` for `topics`, on
/// the task store's stream `KV_AMP_TASK_STATE` (filtered on the namespace's task keys) for
/// `tasks`. nats-server 2.9 gives a consumer one filter subject, so one topic pattern is
/// the consumer's filter, and several are served by one consumer filtered on the narrowest
/// subject that covers them all (`amp.<ns>.topic.>` at worst): the sink acknowledges the
/// events that no pattern matches without writing them. Each event is then written once
/// however many patterns match it. A restarted sink with the same name goes on from the
/// consumer's acknowledgements; a changed pattern list changes the consumer's filter.
///
/// Tasks. Each task of the namespace that reaches `completed`, `failed` or `cancelled` is
/// written once, as its final record (the spec's task object, `revision` included) in
/// `body`; `type` is the job, `sender` the submitter, `ts` when it ended, `msg_id` the task
/// id. The task store's other revisions (a task still running, an operation's record, an
/// idempotency binding, the mark that a cancelled task's submitter was told) are
/// acknowledged without a row.
///
/// Failures. A target that cannot be used now (`unavailable`) fails the whole batch:
/// nothing is acknowledged, the batch's messages are kept in progress, and the caller tries
/// again after `backoff()`; `ready()` is false until a batch commits. A message that cannot
/// be written (no valid envelope, a missing or ill-typed `payload_field`, `fail` meeting
/// another message's key, a row a required target refuses) is not acknowledged but
/// negatively acknowledged with a delay, so JetStream redelivers it; its delivery count
/// counts the tries, and on the `dlq.max_failures`-th it is published to
/// `amp.<ns>.dlq.<name>` (its data and headers, plus `Amp-Dlq-Reason`, `Amp-Dlq-Stream`,
/// `Amp-Dlq-Seq`, with the message id `<name>:<stream>:<seq>` so a crash after the
/// publication does not dead-letter it twice), then acknowledged. The rest of its batch is
/// committed as usual. An optional target that fails is logged and counted and skipped for
/// a while; it never holds an acknowledgement back.
///
/// Threads: `step` and `run` are called from one thread; `stats`, `ready` and `stop` from
/// any.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "amp/result.hpp"
#include "amp/sink/config.hpp"
#include "amp/sink/target.hpp"
#include "amp/transport/transport.hpp"

namespace amp::sink {

/// A count of observations by upper bound, as Prometheus histograms are kept.
struct histogram {
  /// Upper bounds, in seconds.
  static constexpr double bounds[] = {0.001, 0.002, 0.005, 0.01, 0.025, 0.05,
                                      0.1,   0.25,  0.5,   1,    2.5,   5};
  std::uint64_t buckets[std::size(bounds)] = {};  ///< observations at or under each bound
  std::uint64_t count = 0;
  double sum = 0;
  void observe(double seconds) noexcept;
};

/// What a sink has done since it started.
struct sink_stats {
  std::uint64_t committed = 0;           ///< rows written or replaced in the required targets
  std::uint64_t duplicates_skipped = 0;  ///< messages whose key was already stored
  std::uint64_t dead_lettered = 0;       ///< messages published to the dead-letter stream
  std::uint64_t batches = 0;             ///< batches committed
  std::uint64_t acked = 0;               ///< messages acknowledged (passed over ones included)
  std::uint64_t passed_over = 0;         ///< acknowledged without a row (not the sink's)
  std::uint64_t failures = 0;            ///< tries of messages that could not be written
  std::uint64_t transient_failures = 0;  ///< batches a required target could not take
  std::uint64_t optional_failures = 0;   ///< batches an optional target could not take
  std::uint64_t lag = 0;                 ///< messages in the stream not yet delivered
  histogram commit_seconds{};            ///< per batch: from the first write to the last commit
};

/// A batch whose acknowledgement was confirmed (for measurements).
struct acked_batch {
  std::vector<std::uint64_t> seqs;                  ///< stream sequences acknowledged, ascending
  std::chrono::steady_clock::time_point committed;  ///< the last required target committed
  std::chrono::steady_clock::time_point acked;      ///< the acknowledgement was confirmed
};

/// Hooks and pacing.
struct sink_options {
  /// One line of log: level ("info", "warn", "error"), event, detail (JSON members
  /// without braces, e.g. `"target":"…","error":"…"`). Called from the sink's thread.
  std::function<void(std::string_view level, std::string_view event, std::string_view detail)>
      log{};
  /// Called on the sink's thread after each batch's acknowledgements were confirmed.
  std::function<void(const acked_batch&)> on_acked{};
  /// Pause after a transient failure: doubles from `backoff_min` to `backoff_max`.
  duration backoff_min = std::chrono::milliseconds(100);
  duration backoff_max = std::chrono::seconds(5);
  /// How long an idle `step` waits for a first message.
  duration idle_wait = std::chrono::seconds(1);
  /// While idle, how often the required targets are probed (`target::probe`), so that
  /// `ready` turns false when one goes away with nothing to write.
  duration probe_every = std::chrono::seconds(5);
};

/// What one `step` did.
enum class step_result {
  idle,       ///< nothing arrived
  committed,  ///< a batch was committed and acknowledged
  transient,  ///< a required target or the backend could not be used: wait `backoff()`
};

class sink {
 public:
  /// Makes the sink: checks `config`, makes sure the dead-letter stream and the consumer
  /// exist (creating them; a consumer whose filter must change is updated), and takes
  /// `targets` (one per `config.targets`, in order; empty: the built-in ones). Targets are
  /// opened by the first `step`. Errors: `bad_request` for a bad configuration;
  /// `conflict` when a consumer of that name exists with another start or stream;
  /// `unavailable` when the backend cannot be reached; `not_found` when the source stream
  /// is missing (nothing was ever published in the namespace: start `amp-server` first).
  static result<std::unique_ptr<sink>> create(std::shared_ptr<transport> backend,
                                              sink_config config,
                                              std::vector<std::unique_ptr<target>> targets = {},
                                              sink_options options = {});
  ~sink();
  sink(const sink&) = delete;
  sink& operator=(const sink&) = delete;

  /// One batch: waits up to `idle_wait` for a first message, fills the batch for up to
  /// `batch.max_wait_ms` or `batch.max_messages`, writes it to the targets, then
  /// acknowledges what they committed and dead-letters what is due. A batch that failed
  /// transiently is kept and tried again by the next `step` before anything new is fetched.
  step_result step();

  /// Calls `step` until `stop()`, pausing after transient failures; returns after the batch
  /// in hand is committed and acknowledged (or, while its targets are away, left
  /// unacknowledged for redelivery).
  void run();
  /// Asks `run` to return. Thread-safe, signal-safe (one atomic store).
  void stop() noexcept;

  /// The pause before the next try after a transient failure.
  duration backoff() const;
  /// True once a batch committed or the targets opened, false while a required target or the
  /// backend is failing (noticed by a write, or by an idle sink's probe every `probe_every`).
  bool ready() const noexcept;
  sink_stats stats() const;
  const sink_config& config() const noexcept;

 private:
  struct impl;
  explicit sink(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// `stats` in the Prometheus text format, every series labelled `sink="<name>"`:
/// `amp_sink_messages_committed_total`, `amp_sink_duplicates_skipped_total`,
/// `amp_sink_dead_lettered_total`, `amp_sink_batches_total`, `amp_sink_acked_total`,
/// `amp_sink_passed_over_total`, `amp_sink_failures_total`,
/// `amp_sink_transient_failures_total`, `amp_sink_optional_failures_total` (counters),
/// `amp_sink_commit_seconds` (histogram), `amp_sink_lag` and `amp_sink_ready` (gauges).
std::string metrics_text(const sink_stats& stats, std::string_view name, bool ready);

/// `amp-sink --check`: checks `config` and opens every target (connects, creates what is
/// missing) without consuming; with `backend`, also looks for the source stream. Returns
/// one line per target and one for the source ("ok sqlite archive.db:events", "ok source
/// AMP_TOPICS_demo filter amp.demo.topic.> (12 messages)", or "wait source …" when the
/// stream is not there yet, which a running sink waits for); an error names the first
/// target that failed, or the backend's error.
result<std::vector<std::string>> check_sink(const sink_config& config,
                                            std::shared_ptr<transport> backend);

}  // namespace amp::sink
