#pragma once

/// \file
/// Topics (spec §6): publish an event on a topic, and subscribe to a topic pattern with
/// replay. Events live in the stream `AMP_TOPICS_<ns>` (subjects `amp.<ns>.topic.>`,
/// limits retention: kept for `broker_config::topic_max_age` and up to
/// `topic_max_bytes`, the oldest going first). Each event is one envelope, stored as JSON
/// on `amp.<ns>.topic.<topic>`; its stream sequence is the `seq` publishers and
/// subscribers see. A subscription is an ordered replay of that stream, filtered on the
/// pattern: it never skips a matching event and never repeats one.
///
/// Slow subscribers. `topics` keeps no buffer of its own: it hands each event to the
/// subscriber's `on_event`, which says whether it could take it. A subscriber that
/// cannot (its own bounded buffer is full) is dropped, and told where to resume so that a
/// new subscription from there loses nothing (spec `sub_dropped`).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "amp/broker/config.hpp"
#include "amp/clock.hpp"
#include "amp/envelope.hpp"
#include "amp/names.hpp"
#include "amp/result.hpp"
#include "amp/transport/transport.hpp"

namespace amp {

/// What a publisher supplies for one event.
struct topic_message {
  topic to;               ///< the topic (already validated)
  std::string from;       ///< the sender: a participant name, or `$broker`
  std::string body;       ///< one serialized JSON value
  std::string type{};     ///< optional message type; empty: none
  header_list headers{};  ///< optional headers, names unique
  std::string msg_id{};   ///< optional dedup id; empty: a new unique one
};

/// The answer to a publish (the spec's `{"seq","duplicate"}`, plus the envelope id).
struct publish_result {
  std::uint64_t seq = 0;   ///< stream sequence of the event (of the first, for a duplicate)
  std::string msg_id;      ///< the envelope's id: the caller's `msg_id` or the one made
  bool duplicate = false;  ///< true when `msg_id` was already published within the window
};

/// One event as a subscriber sees it.
struct topic_event {
  std::uint64_t seq = 0;  ///< stream sequence; rises from event to event, not by one
  topic t;                ///< the event's topic
  envelope env;           ///< the stored envelope (`env.to == t.str()`)
};

/// Where a subscription starts (spec §6 `from`).
struct replay_from {
  enum class kind {
    new_events,  ///< only events stored after the subscription starts (default)
    all,         ///< every stored event
    last,        ///< the latest stored event matching the pattern, then what follows
    sequence,    ///< the first matching event at or after `seq` (which must be >= 1)
    time,        ///< the first matching event stored at or after `time`
  };
  kind from = kind::new_events;
  std::uint64_t seq = 0;  ///< with `kind::sequence`
  time_point time{};      ///< with `kind::time`; the backend's storage time counts

  static replay_from new_events() { return {}; }
  static replay_from all() { return {.from = kind::all}; }
  static replay_from last() { return {.from = kind::last}; }
  static replay_from sequence(std::uint64_t seq) { return {.from = kind::sequence, .seq = seq}; }
  static replay_from at_time(time_point t) { return {.from = kind::time, .time = t}; }
};

/// A live topic subscription; destroying it stops it.
class topic_subscription {
 public:
  virtual ~topic_subscription() = default;
  topic_subscription(const topic_subscription&) = delete;
  topic_subscription& operator=(const topic_subscription&) = delete;

  /// Stops the callbacks. When called from outside a callback, no callback runs after it
  /// returns; from inside one (of this subscription), none runs after that callback
  /// returns. Idempotent; `on_dropped` is not called for a stop.
  virtual void stop() noexcept = 0;

  /// The resume position: every event matching the pattern with a sequence at or below
  /// it (and at or after the start) has been passed to `on_event` and taken, or was not
  /// an event (see `topics::subscribe`). 0 before the first. After a drop, the value
  /// `on_dropped` reported. Thread-safe.
  virtual std::uint64_t last_seq() const noexcept = 0;

  /// True once the subscription was dropped because `on_event` refused an event.
  virtual bool dropped() const noexcept = 0;

  /// The pattern subscribed to.
  virtual const topic_pattern& pattern() const noexcept = 0;

 protected:
  topic_subscription() = default;
};

/// The topics of one namespace. Thread-safe: share one instance freely (several
/// instances, in one process or many, may serve the same namespace on one backend).
class topics {
 public:
  /// Ensures the stream `AMP_TOPICS_<ns>`: subjects `amp.<ns>.topic.>`, limits retention,
  /// `config.storage`, `config.replicas`, max age `config.topic_max_age` (zero: none),
  /// max bytes `config.topic_max_bytes` (zero or less: none), and duplicate window
  /// `config.duplicate_window` (capped at the max age, which JetStream requires).
  /// Blocks on the backend. Errors: `unavailable`; `conflict` when the stream exists with
  /// another configuration (it is left as it is); `bad_request` for a configuration the
  /// backend refuses (e.g. `replicas` < 1).
  static result<std::shared_ptr<topics>> open(std::shared_ptr<transport> t,
                                              const broker_config& config);

  /// Publishes one event: the envelope (`to` = the topic, `from` as given, `ns`, `ts` =
  /// the transport clock's now, `id` = `msg_id` or a new unique id) is stored on the
  /// topic's subject. A `msg_id` already published by the same sender on the same topic
  /// within the duplicate window stores nothing: the result has the first event's `seq`
  /// and `duplicate = true`. Another sender, or another topic, does not count.
  ///
  /// Errors, checked in the spec's order, none of which stores anything:
  /// `bad_request` when `body` is empty or not exactly one JSON value;
  /// `invalid_name` when `from` is neither a participant name nor `$broker`;
  /// `invalid_envelope` (with `error().path()`, e.g. `/type`, `/id`, `/headers`) for a bad
  /// `type`, `msg_id` (1..128 characters, no control characters) or header;
  /// then the backend's: `payload_too_large`, `limit_exceeded`, `not_found` (the stream
  /// was deleted), `unavailable`.
  /// Blocks; must not be called from a transport callback (use `async_publish` there).
  result<publish_result> publish(topic_message msg);

  /// `publish` without blocking. `done` runs exactly once: on the calling thread before
  /// this returns when the input is refused (or when the backend answers at once, as the
  /// memory transport does), otherwise on the transport's thread; it must not block.
  void async_publish(topic_message msg, completion<publish_result> done);

  /// `async_publish` of an envelope sealed already (`sealed_envelope::seal`): stored as it
  /// is, without being checked or written again; `to` is the topic. Errors, leaving nothing
  /// stored: `bad_request` when it was sealed for another namespace, is empty (its text
  /// taken) or has a `reply_to` or `correlation` (a topic event has neither);
  /// `invalid_name` ("to: …") when its `to` is not a topic; then the backend's, as for
  /// `publish`.
  void async_publish(sealed_envelope env, completion<publish_result> done);

  /// Subscribes to the events whose topic `pattern` matches, starting at `from`.
  ///
  /// `on_event` receives each matching event exactly once, in stream order, with no
  /// matching event left out between the start and the end of the subscription. It
  /// returns true when it took the event, false when it cannot take it now (its bounded
  /// buffer is full): the subscription is then dropped, and `on_dropped(last_seq)` runs
  /// once, at once, with `last_seq` = the refused event's sequence - 1, so that a new
  /// subscription from `replay_from::sequence(last_seq + 1)` gets exactly the events
  /// this one did not deliver (nothing lost, nothing repeated). After `on_dropped` no
  /// callback of this subscription runs. `on_dropped` may be empty.
  ///
  /// A stored message that is not an event (its data does not parse as an envelope, or
  /// the envelope's `ns` or `to` do not match its subject) is skipped without a callback.
  ///
  /// Threads: the callbacks run one at a time, on the transport's delivery thread: on
  /// the memory transport the thread that stored the event (a publisher) or, for events
  /// already stored, the thread calling `subscribe`, before it returns; on JetStream a
  /// cnats thread. They must not throw or block, and must not call blocking transport or
  /// broker functions (hand such work to an executor); calling `stop()` of this
  /// subscription from them is fine.
  ///
  /// Errors: `bad_request` for an empty `on_event` or `kind::sequence` with `seq` 0;
  /// `not_found` when the stream is gone; `unavailable`.
  result<std::unique_ptr<topic_subscription>> subscribe(
      const topic_pattern& pattern, replay_from from,
      std::function<bool(const topic_event&)> on_event,
      std::function<void(std::uint64_t last_seq)> on_dropped = {});

  /// The namespace served.
  const namespace_name& ns() const noexcept { return ns_; }
  /// The stream holding the events (`AMP_TOPICS_<ns>`).
  const std::string& stream() const noexcept { return stream_; }

 private:
  topics(std::shared_ptr<transport> t, namespace_name ns);

  std::shared_ptr<transport> transport_;
  namespace_name ns_;
  std::string stream_;
};

}  // namespace amp
