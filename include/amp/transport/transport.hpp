#pragma once

/// \file
/// The pluggable transport: the small slice of JetStream that the broker needs, as an
/// interface with two implementations (`memory_transport`, `jetstream_transport`).
/// Its vocabulary is JetStream's: streams with retention and limits, publish with a
/// message id for deduplication, durable pull consumers with AckWait and the four kinds
/// of acknowledgement, ordered replay, KV buckets with revisions, history, watch and
/// per-key TTL, and core messages (sent to whoever subscribes at the moment, not stored),
/// which gateways use to tell each other things. One conformance suite (tests/conformance) holds
/// every implementation to the same behaviour.
///
/// Threads. Every member function is thread-safe. Operations come in two kinds:
/// - data operations (`async_publish`, `async_fetch`, `async_acknowledge`, `async_kv_*`;
///   `acknowledge` sends without waiting for an outcome)
///   complete through a handler. The handler may run before the call returns (the
///   memory transport completes most operations at once), on the thread that made a
///   waiting fetch satisfiable (a publisher, or the clock's timer thread), or on a
///   backend thread (cnats); it must not block for long. A handler should not throw: if
///   one does (also a subscription handler or a watch callback), the transport catches
///   the exception where it called the handler, reports it through its options'
///   `on_handler_error`, and goes on as if the handler had returned. Each has a blocking wrapper of
///   the same name without `async_`, which must not be called from a handler.
/// - administrative operations (`ensure_*`, `*_info`, `delete_*`, `kv_keys`, `kv_history`,
///   subscriptions and watches) block and return a `result`.
/// - `publish_core` sends without waiting and returns a `result`.
///
/// Errors. Names are checked before anything reaches the backend: a bad stream, consumer,
/// bucket or subject name is `invalid_name` and changes nothing. Missing objects are
/// `not_found`; a stale revision, an existing key, a clashing configuration or an
/// overlapping work-queue filter is `conflict`; stream limits are `limit_exceeded` or
/// `payload_too_large`; an unreachable backend is `unavailable` (nothing was stored).
///
/// Writing a backend. Derive from `transport` and implement the protected `do_*` members
/// (and `caps`, `clock`, `ping`). The public members check what can be checked without the
/// backend (names, subjects and filters, configurations, a fetch batch of at least 1, a
/// per-key TTL that is positive and that `caps()` supports, an update's expected revision of
/// at least 1, the callbacks of a subscription or watch) and answer a failed check
/// themselves, so a `do_*` member sees only arguments that passed; what only the backend can
/// judge (an ack token, a stream's limits, what exists) stays with it.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "amp/clock.hpp"
#include "amp/result.hpp"

namespace amp {

using namespace std::chrono_literals;

/// Completion handler of an asynchronous transport operation.
template <class T>
using completion = std::function<void(result<T>)>;

/// Message headers, in order; a name may repeat.
using header_list = std::vector<std::pair<std::string, std::string>>;

/// The first value of header `name` (case-sensitive), if any.
std::optional<std::string_view> find_header(const header_list& headers, std::string_view name);

/// What a stream keeps (JetStream RetentionPolicy).
enum class retention_policy {
  limits,      ///< keep until a limit removes them; acks do not remove
  work_queue,  ///< a message is removed once a consumer acks or terms it
  interest,    ///< removed once every consumer has acked it
};

/// Where a stream or bucket keeps its data.
enum class storage_type { file, memory };

/// Which messages a full stream refuses or drops.
enum class discard_policy {
  old_messages,  ///< drop the oldest to make room
  new_messages,  ///< refuse the publish (`limit_exceeded`)
};

/// Configuration of a stream. Limits of zero or less and zero durations mean "unlimited".
struct stream_config {
  std::string name{};                   ///< stream name: no `.`, `*`, `>`, `/`, `\`, whitespace
  std::vector<std::string> subjects{};  ///< subject filters the stream captures
  retention_policy retention = retention_policy::limits;
  storage_type storage = storage_type::file;
  std::int64_t max_msgs = -1;
  std::int64_t max_bytes = -1;  ///< counts subject, headers and data
  std::int64_t max_msgs_per_subject = -1;
  /// Largest message: its data and its header block as NATS sends it ("NATS/1.0\r\n", a
  /// "name: value\r\n" line per header and for `msg_id`'s Nats-Msg-Id, "\r\n"), as
  /// JetStream counts it; larger publishes are `payload_too_large`. 0 or less: no limit.
  std::int32_t max_msg_size = -1;
  duration max_age = duration::zero();
  discard_policy discard = discard_policy::old_messages;
  duration duplicate_window = 2min;  ///< `msg_id` dedup window
  int replicas = 1;

  friend bool operator==(const stream_config&, const stream_config&) = default;
};

/// The current contents of a stream.
struct stream_state {
  std::uint64_t messages = 0;
  std::uint64_t bytes = 0;
  std::uint64_t first_seq = 0;  ///< 0 when empty and never written
  std::uint64_t last_seq = 0;
  std::uint64_t consumers = 0;
};

struct stream_info {
  stream_config config{};
  stream_state state{};
};

/// A message to publish.
struct outgoing_message {
  std::string subject{};
  std::string data{};
  header_list headers{};
  /// Deduplication id (JetStream `Nats-Msg-Id`): a second publish with the same id within
  /// the stream's duplicate window stores nothing and returns the first sequence. A publish
  /// that was refused (too large, stream full) leaves its id free.
  std::string msg_id{};
};

/// The stream's answer to a publish.
struct publish_ack {
  std::string stream{};
  std::uint64_t seq = 0;
  bool duplicate = false;  ///< true when `msg_id` was seen within the window
};

/// A stored message, as fetched from a consumer, replayed, or read by sequence.
struct message {
  std::string stream{};
  std::string subject{};
  std::string data{};
  header_list headers{};
  std::uint64_t seq = 0;  ///< stream sequence
  time_point time{};      ///< when the stream stored it

  // Set on messages delivered by a durable consumer (`async_fetch`):
  std::string consumer{};
  std::uint64_t delivery_count = 0;  ///< 1 on first delivery; +1 per redelivery (a nak counts)
  std::uint64_t consumer_seq = 0;
  std::string ack_token{};  ///< opaque; identifies the message to `async_acknowledge`
  /// When this delivery reached the transport, on its clock: the consumer's `ack_wait`
  /// runs from about then.
  time_point delivered_at{};
};

/// Where a consumer or replay starts.
enum class deliver_policy {
  all,                ///< from the first stored message
  last,               ///< from the last message matching the filter
  new_messages,       ///< only what is published after creation
  by_start_sequence,  ///< from `start_seq` (inclusive). Beyond the stream's end, a consumer
                      ///< starts at the next message stored (JetStream moves it down); a
                      ///< replay waits for `start_seq`
  by_start_time,      ///< from the first message stored at or after `start_time`
};

/// A durable pull consumer. Acks are explicit; redelivery is unlimited unless
/// `max_deliver` is set.
struct consumer_config {
  std::string stream{};
  std::string durable{};                ///< consumer name, same grammar as stream names
  std::string filter_subject{};         ///< empty: every subject of the stream
  duration ack_wait = 30s;              ///< redelivery after this long without ack or in-progress
  std::int64_t max_ack_pending = 1000;  ///< delivered but unacked at most; -1 unlimited
  std::int64_t max_deliver = -1;        ///< -1 unlimited
  deliver_policy deliver = deliver_policy::all;
  std::uint64_t start_seq = 0;  ///< with `by_start_sequence`
  time_point start_time{};      ///< with `by_start_time`
  /// Zero: never. Otherwise the backend deletes the consumer (as `delete_consumer` does)
  /// once it has had no fetch waiting and no fetch, acknowledgement, create or update for
  /// this long; `consumer_info_of` is not use. What it had delivered but not acked stays
  /// in the stream (on a work-queue stream a consumer made again gets it). JetStream's
  /// `inactive_threshold` (honoured on durables by nats-server 2.9 and later), which
  /// checks now and then: it may remove the consumer up to about one more threshold
  /// later, never earlier. The memory transport removes it at last use + threshold.
  duration inactive_threshold = duration::zero();

  friend bool operator==(const consumer_config&, const consumer_config&) = default;
};

struct consumer_info {
  consumer_config config{};
  std::uint64_t num_pending = 0;           ///< matching messages not yet delivered
  std::uint64_t num_ack_pending = 0;       ///< delivered, not yet acked or termed
  std::uint64_t num_redelivered = 0;       ///< of the ack-pending, those delivered more than once
  std::uint64_t delivered_stream_seq = 0;  ///< highest stream sequence delivered
  std::uint64_t ack_floor_stream_seq = 0;  ///< every sequence at or below is acked
};

/// A pull. `max_wait` zero: answer at once with what is available (possibly nothing).
/// Otherwise wait until at least one message is available, then answer with up to
/// `batch` of those available at that moment; an empty answer means `max_wait` passed.
struct fetch_request {
  std::size_t batch = 1;
  duration max_wait = duration::zero();
};

/// The four acknowledgements of JetStream.
enum class ack_kind {
  ack,          ///< done: on a work-queue stream the message is removed
  nak,          ///< redeliver after the given delay (zero: at once); counts as a delivery
  in_progress,  ///< still working: restarts the full AckWait
  term,         ///< never redeliver: on a work-queue stream the message is removed
};

/// A live subscription or watch; destroying it stops it.
class subscription {
 public:
  virtual ~subscription() = default;
  /// Stops callbacks. When called from outside a callback, no callback runs after it
  /// returns; from inside one, none runs after that callback returns. Idempotent.
  virtual void stop() noexcept = 0;

 protected:
  subscription() = default;
};

/// An ordered replay of a stream: every matching message once, in stream order, without
/// gaps, then live messages as they are stored.
struct replay_request {
  std::string stream{};
  std::string filter_subject{};  ///< empty: every subject
  deliver_policy start = deliver_policy::new_messages;
  std::uint64_t start_seq = 0;
  time_point start_time{};
};

/// The stream that keeps bucket `bucket`'s revisions, on every backend (as on JetStream):
/// `KV_<bucket>`, capturing `$KV.<bucket>.<key>`, one message per revision (its sequence is
/// the revision), markers carrying the header `KV-Operation` `DEL` or `PURGE`. Consumers may
/// read it like any stream; writes belong to the `kv_*` calls.
inline std::string kv_stream_name(std::string_view bucket) {
  return "KV_" + std::string(bucket);
}

/// The subject of `key`'s revisions in bucket `bucket`'s stream.
inline std::string kv_subject_of(std::string_view bucket, std::string_view key) {
  std::string s = "$KV.";
  s.append(bucket).append(".").append(key);
  return s;
}

/// Configuration of a KV bucket.
struct kv_config {
  std::string bucket{};             ///< `[A-Za-z0-9_-]+`
  int history = 1;                  ///< revisions kept per key, 1..64
  duration ttl = duration::zero();  ///< age after which any value is removed; zero: never
  storage_type storage = storage_type::file;
  int replicas = 1;
  std::int32_t max_value_size = -1;  ///< bytes; zero or less: unlimited

  friend bool operator==(const kv_config&, const kv_config&) = default;
};

/// What a KV revision did to its key.
enum class kv_op {
  put,
  del,      ///< deleted; earlier revisions stay in history
  purge,    ///< purged; earlier revisions are gone
  expired,  ///< its per-key TTL ran out; earlier revisions are gone
};

struct kv_entry {
  std::string bucket{};
  std::string key{};
  std::string value{};         ///< empty for del, purge and expired
  std::uint64_t revision = 0;  ///< the bucket's sequence number; rises with every write
  time_point created{};
  kv_op op = kv_op::put;
};

/// What a watch reports.
struct kv_watch_options {
  /// Keys to watch, with `*` and `>` as in subjects; empty means every key.
  std::string key_filter{};
  /// Report every retained revision of the matching keys first, not only the latest.
  bool include_history = false;
  /// Skip the initial values: report only what changes after the watch starts.
  bool updates_only = false;
};

/// Callbacks of a watch. They run one at a time, in revision order.
struct kv_watch_handlers {
  /// Each entry: first the latest value of every live matching key (unless
  /// `updates_only`), then every put, del, purge and expiry as it happens. A watcher that
  /// falls behind on JetStream may miss revisions that the bucket's `history` or a purge
  /// no longer keeps; it always sees the latest.
  std::function<void(const kv_entry&)> on_entry{};
  /// Once, after the initial values (at once when there are none or `updates_only`).
  std::function<void()> on_caught_up{};
};

/// What a backend can do; the broker adapts to it.
struct capabilities {
  std::string backend{};     ///< "memory" or "jetstream"
  bool persistent = false;   ///< survives the process
  bool per_key_ttl = false;  ///< `ttl` on KV writes is honoured
};

/// The transport interface. Create one through a backend's factory
/// (`memory_transport::create`, `jetstream_transport::connect`); share it freely.
class transport {
 public:
  virtual ~transport() = default;
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;

  virtual capabilities caps() const = 0;

  /// The clock the transport stamps and expires by.
  virtual std::shared_ptr<amp::clock> clock() const = 0;

  /// `ok` when the backend answers; `unavailable` otherwise.
  virtual result<void> ping() = 0;

  /// How many times the connection to the backend was made again after it was lost (0 for
  /// the memory transport, which has none). A change means `subscribe_core` subscribers
  /// may have missed what was sent meanwhile. Non-blocking; any thread.
  virtual std::uint64_t connection_epoch() const noexcept { return 0; }

  // ----- streams --------------------------------------------------------------------

  /// Creates the stream when missing; returns it unchanged when it exists with the same
  /// configuration; `conflict` naming the differing setting otherwise (never changes it).
  /// `bad_request` for an impossible configuration (no subjects, replicas < 1, ...).
  result<stream_info> ensure_stream(const stream_config& config);
  /// Changes the limits of an existing stream to those of `config`: `max_msgs`,
  /// `max_bytes`, `max_msgs_per_subject`, `max_msg_size`, `max_age`, `discard` and
  /// `duplicate_window`. What the new limits no longer admit is removed at once, oldest
  /// first. `not_found` when the stream is missing; `conflict` naming the setting when its
  /// `subjects`, `retention`, `storage` or `replicas` differ (those never change);
  /// `bad_request` as for `ensure_stream`.
  result<stream_info> update_stream(const stream_config& config);
  result<stream_info> stream_info_of(std::string_view stream);
  /// The subjects of the stream that match `filter` (`*`, `>`) and hold at least one
  /// message, each with how many it holds. `not_found` for a missing stream.
  result<std::map<std::string, std::uint64_t>> stream_subjects(std::string_view stream,
                                                               std::string_view filter);
  result<void> delete_stream(std::string_view stream);
  /// The message at `seq`; `not_found` if there is none (never stored, or removed).
  result<message> get_message(std::string_view stream, std::uint64_t seq);
  /// The last message whose subject matches `subject_filter`; `not_found` if none.
  result<message> get_last_message(std::string_view stream, std::string_view subject_filter);
  /// Removes the message at `seq` from the stream (a withdrawal: JetStream's message delete,
  /// without overwriting the data). No consumer delivers it after that: a delivery of it
  /// that is pending is dropped when it would be redelivered, and an acknowledgement of it
  /// succeeds and changes nothing. `not_found` when the stream is missing or holds no
  /// message at `seq` (never stored, removed already, acknowledged from a work queue).
  void async_delete_message(std::string_view stream, std::uint64_t seq, completion<void> done);
  result<void> delete_message(std::string_view stream, std::uint64_t seq);

  /// Stores a message in the stream capturing its subject. `not_found` when no stream
  /// captures it; `payload_too_large` over `max_msg_size`; `limit_exceeded` when the
  /// stream is full and discards new messages.
  /// Order: publishes handed over one after another (each `async_publish` returned before
  /// the next is called) are stored in that order, without waiting for one another's
  /// answers (JetStream: written in turn on one connection). The one exception is a publish
  /// the backend must retry (JetStream: the stream had no leader for a moment, or the
  /// connection was down when it was handed over): it may be stored after publishes handed
  /// over later; its `msg_id` keeps a retry from storing it twice.
  void async_publish(outgoing_message msg, completion<publish_ack> done);
  result<publish_ack> publish(outgoing_message msg);

  // ----- durable pull consumers -----------------------------------------------------

  /// Creates the durable consumer when missing; returns it when it exists with the same
  /// configuration; `conflict` when it differs. On a work-queue stream, a filter that
  /// overlaps another consumer's is `conflict` and `deliver` must be `all`
  /// (`bad_request` otherwise).
  result<consumer_info> ensure_consumer(const consumer_config& config);
  /// Changes an existing consumer's `filter_subject`, `ack_wait`, `max_ack_pending`,
  /// `max_deliver` or `inactive_threshold` (an update counts as use). `not_found` when missing;
  /// `conflict` for an overlapping work-queue filter or a change of stream or start position.
  result<consumer_info> update_consumer(const consumer_config& config);
  result<consumer_info> consumer_info_of(std::string_view stream, std::string_view durable);
  /// The names of the stream's durable consumers, sorted. `not_found` for a missing stream.
  result<std::vector<std::string>> consumer_names(std::string_view stream);
  result<void> delete_consumer(std::string_view stream, std::string_view durable);

  /// Pulls messages from a durable consumer: redeliveries due first, then new messages,
  /// in stream order, never more than `max_ack_pending` outstanding. Each delivery
  /// starts the consumer's AckWait for that message. `not_found` for a missing consumer.
  void async_fetch(std::string_view stream, std::string_view durable, fetch_request request,
                   completion<std::vector<message>> done);
  /// Blocking fetch. With a `manual_clock` and `max_wait` > 0 it returns only when a
  /// message arrives or another thread advances the clock.
  result<std::vector<message>> fetch(std::string_view stream, std::string_view durable,
                                     fetch_request request);

  /// Acknowledges a delivered message by its `ack_token`. As in JetStream, an
  /// acknowledgement of a message that is no longer pending (already acked or termed,
  /// or from an earlier delivery that was since redelivered and acked) changes nothing
  /// and succeeds; one from an earlier delivery of a message still pending applies to it.
  /// `nak_delay` is used by `nak` only. `bad_request` for a token this transport did not
  /// issue; `not_found` when the consumer that delivered the message no longer exists
  /// (deleted, or removed by `inactive_threshold`: the message stays in the stream).
  void async_acknowledge(const message& msg, ack_kind kind, duration nak_delay,
                         completion<void> done);
  result<void> ack(const message& msg);
  result<void> nak(const message& msg, duration delay = duration::zero());
  /// Sends an acknowledgement without asking the backend to confirm it (JetStream's plain
  /// ack, not AckSync): returns at once, never blocks and reports nothing, so the caller
  /// saves a reply and a wait (JetStream: while the connection is down, it is sent as
  /// `async_acknowledge` does, retried until the operation timeout, its outcome dropped).
  /// One that does not take effect (the backend stays away, the consumer is gone, a token
  /// this transport did not issue) changes nothing: the message
  /// stays pending and is delivered again after AckWait, as after a lost acknowledgement.
  /// Use it where the outcome would be ignored anyway; a caller that must know that the
  /// message is settled (before it answers, or before it counts) uses `async_acknowledge`.
  /// Safe from a handler.
  void acknowledge(const message& msg, ack_kind kind, duration nak_delay = duration::zero());
  result<void> in_progress(const message& msg);
  result<void> term(const message& msg);

  /// Ordered replay (an ephemeral ordered consumer). `on_message` runs one message at a
  /// time, in stream order. `not_found` for a missing stream.
  result<std::unique_ptr<subscription>> subscribe_ordered(
      const replay_request& request, std::function<void(const message&)> on_message);

  // ----- core messages (not stored) ------------------------------------------------

  /// Sends `msg` now to every `subscribe_core` subscription whose filter matches its
  /// subject, in this process or another on the same backend, and to nobody else (NATS
  /// core publish): at most once, unacknowledged, nothing kept for a subscriber that is
  /// not there. A stream that captures the subject stores it too, as NATS does (`msg_id`
  /// deduplicates there as in `async_publish`), and the caller learns nothing of that.
  /// Never blocks. Errors: `invalid_name` for a bad subject; `unavailable` when it cannot
  /// be sent now (the backend is away): nothing was sent.
  result<void> publish_core(outgoing_message msg);
  /// Receives the messages sent on subjects matching `subject_filter` (`*`, `>`) from the
  /// moment it returns: what `publish_core` and `async_publish` send (on JetStream any NATS
  /// message on the subject, KV writes too), stored or not. `on_message` runs one message
  /// at a time, each publisher's in the order it sent them; of the message only `subject`,
  /// `data` and `headers` are set (with `msg_id`, when given, as the header `Nats-Msg-Id`).
  /// What is sent while the subscriber's connection is away is lost. Errors:
  /// `invalid_name` for a bad filter, `bad_request` without a callback, `unavailable`.
  result<std::unique_ptr<subscription>> subscribe_core(
      std::string_view subject_filter, std::function<void(const message&)> on_message);

  // ----- KV buckets -----------------------------------------------------------------

  /// Creates the bucket when missing; unchanged when equal; `conflict` when it differs.
  result<void> ensure_bucket(const kv_config& config);
  result<void> delete_bucket(std::string_view bucket);

  /// The latest value; `not_found` when the key is missing, deleted, purged or expired.
  void async_kv_get(std::string_view bucket, std::string_view key, completion<kv_entry> done);
  /// Writes only when the key has no live value; `conflict` otherwise. Returns the
  /// revision. `ttl` (per-key TTL) needs `caps().per_key_ttl`: `bad_request` otherwise.
  void async_kv_create(std::string_view bucket, std::string_view key, std::string value,
                       std::optional<duration> ttl, completion<std::uint64_t> done);
  /// Writes only when the key's latest revision (of any op) is `expected_revision`;
  /// `conflict` otherwise (two updates on one revision: exactly one succeeds).
  void async_kv_update(std::string_view bucket, std::string_view key, std::string value,
                       std::uint64_t expected_revision, std::optional<duration> ttl,
                       completion<std::uint64_t> done);
  /// Writes unconditionally. Returns the revision.
  void async_kv_put(std::string_view bucket, std::string_view key, std::string value,
                    std::optional<duration> ttl, completion<std::uint64_t> done);
  /// Writes a delete marker; history stays. Succeeds for a missing key too.
  void async_kv_delete(std::string_view bucket, std::string_view key, completion<void> done);
  /// Removes every revision of the key and leaves one purge marker.
  void async_kv_purge(std::string_view bucket, std::string_view key, completion<void> done);
  /// Removes every revision of the key and leaves no marker: the key is as if it had never
  /// been written, and a later create of it succeeds (JetStream: a stream purge filtered on
  /// the key's subject). Watchers are not told. Succeeds for a missing key; `not_found` for a
  /// missing bucket. For retention, where a marker per removed key would be growth too.
  void async_kv_erase(std::string_view bucket, std::string_view key, completion<void> done);

  result<kv_entry> kv_get(std::string_view bucket, std::string_view key);
  result<std::uint64_t> kv_create(std::string_view bucket, std::string_view key, std::string value,
                                  std::optional<duration> ttl = std::nullopt);
  result<std::uint64_t> kv_update(std::string_view bucket, std::string_view key, std::string value,
                                  std::uint64_t expected_revision,
                                  std::optional<duration> ttl = std::nullopt);
  result<std::uint64_t> kv_put(std::string_view bucket, std::string_view key, std::string value,
                               std::optional<duration> ttl = std::nullopt);
  result<void> kv_delete(std::string_view bucket, std::string_view key);
  result<void> kv_purge(std::string_view bucket, std::string_view key);
  result<void> kv_erase(std::string_view bucket, std::string_view key);

  /// The keys with a live value, sorted.
  result<std::vector<std::string>> kv_keys(std::string_view bucket);
  /// Every retained revision of the key, oldest first, markers included; `not_found`
  /// when none is retained.
  result<std::vector<kv_entry>> kv_history(std::string_view bucket, std::string_view key);
  /// Watches a bucket; see `kv_watch_handlers`. `not_found` for a missing bucket.
  result<std::unique_ptr<subscription>> kv_watch(std::string_view bucket,
                                                 const kv_watch_options& options,
                                                 kv_watch_handlers handlers);

 protected:
  transport() = default;

  /// Called inside a catch block when a completion handler that a public member called
  /// itself (to answer a failed check) threw; `where` names the operation. The default writes
  /// one line to standard error; a backend reports it as it reports its own handlers'
  /// exceptions (`on_handler_error`).
  virtual void handler_threw(std::string_view where) noexcept;

  // What a backend implements (see "Writing a backend" above). The public members have
  // checked every argument they can check alone (names, batch, ttl, callbacks) before they
  // call these; a completion is called at most once.
  virtual result<stream_info> do_ensure_stream(const stream_config& config) = 0;
  virtual result<stream_info> do_update_stream(const stream_config& config) = 0;
  virtual result<stream_info> do_stream_info_of(std::string_view stream) = 0;
  virtual result<void> do_delete_stream(std::string_view stream) = 0;
  virtual result<std::map<std::string, std::uint64_t>> do_stream_subjects(
      std::string_view stream, std::string_view filter) = 0;
  virtual result<std::vector<std::string>> do_consumer_names(std::string_view stream) = 0;
  virtual result<message> do_get_message(std::string_view stream, std::uint64_t seq) = 0;
  virtual void do_async_delete_message(std::string_view stream, std::uint64_t seq,
                                       completion<void> done) = 0;
  virtual result<message> do_get_last_message(std::string_view stream,
                                              std::string_view subject_filter) = 0;
  virtual void do_async_publish(outgoing_message msg, completion<publish_ack> done) = 0;
  virtual result<consumer_info> do_ensure_consumer(const consumer_config& config) = 0;
  virtual result<consumer_info> do_update_consumer(const consumer_config& config) = 0;
  virtual result<consumer_info> do_consumer_info_of(std::string_view stream,
                                                    std::string_view durable) = 0;
  virtual result<void> do_delete_consumer(std::string_view stream, std::string_view durable) = 0;
  virtual void do_async_fetch(std::string_view stream, std::string_view durable,
                              fetch_request request, completion<std::vector<message>> done) = 0;
  virtual void do_async_acknowledge(const message& msg, ack_kind kind, duration nak_delay,
                                    completion<void> done) = 0;
  /// `acknowledge`; by default `do_async_acknowledge` with its outcome dropped.
  virtual void do_acknowledge(const message& msg, ack_kind kind, duration nak_delay);
  virtual result<std::unique_ptr<subscription>> do_subscribe_ordered(
      const replay_request& request, std::function<void(const message&)> on_message) = 0;
  virtual result<void> do_publish_core(outgoing_message msg) = 0;
  virtual result<std::unique_ptr<subscription>> do_subscribe_core(
      std::string_view subject_filter, std::function<void(const message&)> on_message) = 0;
  virtual result<void> do_ensure_bucket(const kv_config& config) = 0;
  virtual result<void> do_delete_bucket(std::string_view bucket) = 0;
  virtual void do_async_kv_get(std::string_view bucket, std::string_view key,
                               completion<kv_entry> done) = 0;
  virtual void do_async_kv_create(std::string_view bucket, std::string_view key, std::string value,
                                  std::optional<duration> ttl, completion<std::uint64_t> done) = 0;
  virtual void do_async_kv_update(std::string_view bucket, std::string_view key, std::string value,
                                  std::uint64_t expected_revision, std::optional<duration> ttl,
                                  completion<std::uint64_t> done) = 0;
  virtual void do_async_kv_put(std::string_view bucket, std::string_view key, std::string value,
                               std::optional<duration> ttl, completion<std::uint64_t> done) = 0;
  virtual void do_async_kv_delete(std::string_view bucket, std::string_view key,
                                  completion<void> done) = 0;
  virtual void do_async_kv_purge(std::string_view bucket, std::string_view key,
                                 completion<void> done) = 0;
  virtual void do_async_kv_erase(std::string_view bucket, std::string_view key,
                                 completion<void> done) = 0;
  virtual result<std::vector<std::string>> do_kv_keys(std::string_view bucket) = 0;
  virtual result<std::vector<kv_entry>> do_kv_history(std::string_view bucket,
                                                      std::string_view key) = 0;
  virtual result<std::unique_ptr<subscription>> do_kv_watch(std::string_view bucket,
                                                            const kv_watch_options& options,
                                                            kv_watch_handlers handlers) = 0;

 private:
  template <class T>
  bool refused(result<void> check, completion<T>& done, std::string_view where);
};

}  // namespace amp
