#pragma once

/// \file
/// The job queue of one namespace (spec §7): submit, offer, claim, heartbeat, complete,
/// fail, decline, cancel, with leases and attempts.
///
/// Mapping. Tasks of job `j` are messages on `amp.<ns>.job.<j>` in the work-queue stream
/// `AMP_TASKS_<ns>`, read through the durable pull consumer `job_<j>` whose AckWait is
/// the job's lease; the task store (`task_store`) holds each task's record. The record is
/// the truth; the message only carries the task and its lease timer:
/// - submit publishes the message first (`Nats-Msg-Id` = the task id), then creates the
///   record. If the second step never happens (a crash, the backend gone), the message
///   is still there and whoever fetches it creates the record from it ("adoption"), so a
///   task is never lost; a retry with the same idempotency key finds the same task id and
///   publishes again under the same message id, so it is never duplicated.
/// - a task's message is judged by its record when it is fetched. The first delivery of a
///   task submitted through this job queue is judged by the record it wrote (kept from the
///   submit, at most 16,384 of them; an `async_fetch` that brings the message before the
///   record is written waits for the write, the whole batch with it, while the blocking
///   `fetch` reads instead): no read. A task changed meanwhile through another job queue
///   (cancelled through another gateway) is then offered, and its claim is `conflict`.
/// - a claim is a compare-and-set on the record the task was offered with; it sends no
///   in-progress ack, so a task that runs on past AckWait from its delivery is delivered
///   again shortly before its lease ends and held back (a nak) until then. A heartbeat
///   extends the lease in the record, then sends in-progress. The record keeps the
///   message's ack token, so any broker on the same backend can finish a task, not only
///   the one that offered it. A write on a lease held here starts from the record as last
///   written here (a compare-and-set: if anything changed the task since, the write fails,
///   the record is read and the write tried again), so a complete or a heartbeat costs one
///   write, not a read and a write.
/// - complete and fail check the lease in the record, commit the outcome, notify the
///   submitter, and only then acknowledge the message (commit-then-ack; the
///   acknowledgements of the job queue are not confirmed, `transport::acknowledge`: a lost
///   one brings the message again, judged as above). A holder whose
///   lease is gone gets `lease_lost` and nothing is acknowledged. With
///   `job_events::async_notify` (the broker's default) complete and cancel return once the
///   outcome is committed; the notice and then the acknowledgement follow in the
///   background (fail still waits for its notice).
/// - a message delivered again is judged by the record: a task already ended is
///   acknowledged and never offered; a live lease defers it (nak until the lease ends);
///   an expired lease returns the task to `queued`, or ends it `failed` with
///   `attempts_exhausted` once `max_attempts` claims are spent (the message is termed:
///   JetStream's MaxDeliver cannot count attempts, since a decline also counts).
///
/// Threads. Every member is thread-safe. The blocking members wait on the backend: do
/// not call them from a transport callback. Events (`job_events`) run on the broker's
/// executor (`broker_config::run`); so do `async_fetch` completions, except for a batch
/// judged without the store (each message the first delivery of a task submitted through
/// this job queue and still queued, with an attempt left), whose completion runs on the
/// transport's thread that brought the batch or wrote the last of its records: do not block
/// in it.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "amp/broker/config.hpp"
#include "amp/broker/task_store.hpp"
#include "amp/envelope.hpp"
#include "amp/names.hpp"
#include "amp/result.hpp"
#include "amp/transport/transport.hpp"

namespace amp {

/// What `submit` takes.
struct submit_request {
  job_name job;
  participant_name from;  ///< the submitter (the authenticated participant)
  std::string body;       ///< one JSON value
  std::string type{};
  std::vector<std::pair<std::string, std::string>> headers{};
  std::optional<int> max_attempts{};  ///< 1..100; absent: the job's configuration
  std::string idempotency_key{};      ///< 1..256 bytes; empty: none
};

/// What a submit of a sealed job message adds to it (see `job_queue::async_submit`).
struct job_submit_options {
  std::optional<int> max_attempts{};  ///< 1..100; absent: the job's configuration
  std::string idempotency_key{};      ///< 1..256 bytes; empty: none
};

struct submit_result {
  task_id task;
  bool created = true;  ///< false when the idempotency key was already bound
};

/// A task offered for claiming: the record as it was read, and the job message.
struct offer {
  task_record task;
  envelope env;            ///< the submitter's envelope (`to` = the job)
  int attempt = 1;         ///< the attempt a claim would get
  duration lease{};        ///< the job's lease
  time_point lapses_at{};  ///< without a claim or decline by then, the task is offered again
  message msg;             ///< the delivered job message
};

/// A lease held on a task.
struct lease {
  task_id task;
  int attempt = 0;
  time_point expires_at{};
  std::string job{};  ///< the task's job
};

/// The outcome of `complete`.
struct completion_result {
  task_record task;
  bool duplicate = false;  ///< this participant had already completed it
};

/// A message the job queue sends a task's submitter when the task ends (spec §7): from
/// `$broker`, of `type` `amp.task.completed|failed|cancelled`, with `body`
/// `{"task","job","state","attempt","result"|"error"}`. `msg_id` (`<task>.<state>`)
/// makes repeats harmless.
struct task_notice {
  participant_name to;
  std::string type;
  std::string body;
  std::string msg_id;
};

/// What the job queue tells its user. Each runs on the executor; each may be empty.
struct job_events {
  /// `holder`'s lease on `task` ran out (only for leases granted or extended here).
  std::function<void(const participant_name& holder, const task_id& task)> lease_lost{};
  /// `task`, held by `holder` through this job queue, was cancelled: through this job
  /// queue, or through another of the namespace (another gateway), which says so in a core
  /// message on `subjects::task_control_subject` that this one checks against the record.
  std::function<void(const participant_name& holder, const task_id& task)> cancelled{};
  /// Delivers a `task_notice` (the broker wires this to the inbox). An error leaves the
  /// job message unacknowledged, so the notice is sent again when it is delivered again.
  std::function<result<void>(const task_notice&)> notify{};
  /// The same, asynchronously: calls `done` once the notice is stored (or failed to be),
  /// on any thread. When set (and `notify` is not), complete and cancel return once the
  /// outcome is committed, and the notice and then the acknowledgement follow in the
  /// background; fail and a redelivered task wait for it. `notify`, when also set, is used
  /// instead.
  std::function<void(const task_notice&, std::function<void(result<void>)> done)> async_notify{};
};

/// Who asks: the participant, and whether it has `admin` (spec §3).
struct viewer {
  participant_name who;
  bool admin = false;
};

class job_queue {
 public:
  /// Ensures the tasks stream, uses `store` (opened here when null) and subscribes to what
  /// the other job queues of the namespace say (`subjects::task_control_subject`).
  /// Errors: `unavailable`; `conflict` when the stream exists with another configuration.
  static result<std::shared_ptr<job_queue>> open(std::shared_ptr<transport> t,
                                                 const broker_config& config,
                                                 std::shared_ptr<task_store> store = {},
                                                 job_events events = {});
  ~job_queue();
  job_queue(const job_queue&) = delete;
  job_queue& operator=(const job_queue&) = delete;

  /// Submits a task. Errors: `bad_request` (body not JSON, max_attempts outside 1..100,
  /// bad idempotency key), `invalid_envelope` (type, headers), `unavailable`. Makes no
  /// consumer: the job's durable consumer is made by its first `fetch` (a worker's), so
  /// job names nobody works on cost a stored message each, nothing more. With an idempotency key
  /// already bound, returns that task with `created = false` (and finishes its submission if an
  /// earlier attempt was cut short).
  result<submit_result> submit(submit_request request);
  /// `submit`, asynchronously: `done` runs on a transport thread, or on the calling thread
  /// when the request is refused before anything is sent. With an idempotency key the key
  /// is bound first, blocking.
  void async_submit(submit_request request, completion<submit_result> done);
  /// `async_submit` of a job message sealed already (`sealed_envelope::seal` with `to` the
  /// job, `from` the submitter and `msg_id` a task id from `task_store::new_id`): its id
  /// becomes the task's, its `ts` the task's creation, and its text is stored without being
  /// checked or written again. Errors, leaving nothing stored: `bad_request` when it was
  /// sealed for another namespace, is empty (its text taken), or its id is not a task id;
  /// `invalid_name` ("to: …", "from: …") when `to` is not a job name or `from` not a
  /// participant name; then those of `async_submit`.
  void async_submit(sealed_envelope env, job_submit_options options,
                    completion<submit_result> done);

  /// Up to `n` offers of `job`: waits up to `max_wait` for the first. Messages whose
  /// task ended are acknowledged, not offered; see the file comment. The first fetch of a
  /// job makes its durable consumer (blocking): `conflict` when it exists with another
  /// lease. Call it for the jobs a worker may take (the gateway: registered with a grant).
  result<std::vector<offer>> fetch(const job_name& job, std::size_t n, duration max_wait);
  /// The same, completing on the executor or on a transport thread (see "Threads" above).
  void async_fetch(const job_name& job, std::size_t n, duration max_wait,
                   completion<std::vector<offer>> done);
  /// Whether fetches of `job` need no setup any more (its consumer was made by an earlier
  /// fetch): then `async_fetch` does not block its caller. Any thread.
  bool fetch_ready(const job_name& job) const;

  /// Claims an offered task for `who`: attempt + 1, lease until now + the job's lease.
  /// Errors: `not_found` when the offer lapsed; `conflict` when the task moved on (another
  /// claim won, it was cancelled); `unavailable`.
  result<lease> claim(const offer& o, const participant_name& who);
  /// `claim`, asynchronously: `done` runs on a transport thread or, when the write was lost
  /// (perhaps to this very claim, sent before), on the executor after reading the record
  /// (or at once on the calling thread for an offer that lapsed). Do not wait for it on
  /// the executor's threads. The offer is shared, not copied: keep it unchanged until `done`.
  void async_claim(std::shared_ptr<const offer> o, const participant_name& who,
                   completion<lease> done);
  /// Hands an offer back: offered again after the job's `decline_delay`; no attempt.
  result<void> decline(const offer& o);
  /// Hands an offer back at once (its session went away, or no session could take it); no
  /// attempt. Sent without waiting for the backend to confirm it (`transport::acknowledge`):
  /// it never blocks, so it is safe on a transport thread, and it always succeeds; if it is
  /// lost, the message comes back after the consumer's AckWait.
  result<void> release(const offer& o);

  /// An offer as text for another job queue of the namespace (another gateway's), which
  /// `offer_from_text` turns back into the offer: the record and the revision it was read
  /// at, the attempt, when it lapses, the envelope and the job message's ack token. Any thread.
  std::string offer_text(const offer& o) const;
  /// The offer `offer_text` wrote, to claim, decline or release here as if fetched here: a
  /// claim is the same compare-and-set, so two claims of one task still never both win.
  /// Its lease is this job queue's for the job, and it lapses at the latest a lease from
  /// now. `bad_request` for anything else: not JSON, a task of another namespace, one not
  /// queued or with no attempt left, a bad envelope or no ack token. Nothing is read or
  /// written. Any thread.
  result<offer> offer_from_text(std::string_view text) const;

  /// Extends `who`'s lease on `task`. `lease_lost` when `who` does not hold a live lease
  /// (the lease is then no longer counted in `leases_of`), or when `attempt` is given and
  /// is not the task's current attempt (the fence, spec §7; a live lease of the current
  /// attempt stays counted).
  result<lease> heartbeat(const task_id& task, const participant_name& who,
                          std::optional<int> attempt = std::nullopt);
  /// What `heartbeat_all` did to one lease.
  struct heartbeat_outcome {
    task_id task;
    result<lease> extended;  ///< the lease as extended, or `heartbeat`'s error
  };
  /// Extends every lease `who` holds through this job queue, each on its own: an error on
  /// one (the backend away) does not stop the others. One outcome per lease, in task order.
  std::vector<heartbeat_outcome> heartbeat_all(const participant_name& who);
  /// The leases `who` holds through this job queue.
  std::vector<task_id> leases_of(const participant_name& who) const;
  /// Whether `who` holds the lease on `task` through this job queue (as `leases_of` would
  /// list it), without listing the others.
  bool holds(const task_id& task, const participant_name& who) const;
  /// Whether `async_complete(task, who, …, attempt)` would start from the record this job
  /// queue wrote for `who`'s live lease, without reading the record on the executor first
  /// (it may still find the record changed, and read it then). Any thread.
  bool completes_from_written(const task_id& task, const participant_name& who,
                              std::optional<int> attempt) const;
  /// Gives up `who`'s lease on `task` now (bye): as if it expired, but without a
  /// `lease_lost` event. `lease_lost` when `who` does not hold it.
  result<task_record> release_lease(const task_id& task, const participant_name& who);

  /// Completes `task` with `result_json`. With `attempt`, only that attempt of the task
  /// (the fence: a holder whose lease moved on to a newer attempt, perhaps its own through
  /// another process, gets `lease_lost`). Errors: `bad_request` (result not JSON),
  /// `lease_lost` (not the live holder, or not the current attempt; nothing is
  /// acknowledged), `not_found`.
  result<completion_result> complete(const task_id& task, const participant_name& who,
                                     std::string result_json,
                                     std::optional<int> attempt = std::nullopt);
  /// `complete`, asynchronously: `done` runs on a transport thread, on the executor (when
  /// `completes_from_written` is false the record is read and written there, blocking), or
  /// at once on the calling thread when the answer needs no write (a stale attempt, say).
  /// Never blocks the calling thread.
  void async_complete(const task_id& task, const participant_name& who, std::string result_json,
                      std::optional<int> attempt, completion<completion_result> done);
  /// Fails the current attempt: back to `queued` after `retry_delay` when `retry` and
  /// attempts are left, else `failed`. `attempt` and errors as `complete`.
  result<task_record> fail(const task_id& task, const participant_name& who, task_error error,
                           bool retry, duration retry_delay,
                           std::optional<int> attempt = std::nullopt);
  /// Cancels a task not yet ended (its submitter or an admin). Errors: `not_found` for
  /// anyone else, `conflict` when it already ended.
  result<task_record> cancel(const task_id& task, const viewer& by);

  /// The record, for its submitter, anyone who held it, or an admin; `not_found` for
  /// anyone else.
  result<task_record> get(const task_id& task, const viewer& by);
  /// Every retained revision, oldest first; visibility as `get`.
  result<std::vector<task_record>> history(const task_id& task, const viewer& by);

  /// The configuration of `job`.
  const job_config& config_of(const job_name& job) const;
  const std::shared_ptr<task_store>& store() const noexcept;

  /// Stops timers; pending events are dropped. Called by the destructor.
  void close();

  struct state;
  explicit job_queue(std::shared_ptr<state> s);

 private:
  std::shared_ptr<state> s_;
};

}  // namespace amp
