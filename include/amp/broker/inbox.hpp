#pragma once

/// \file
/// Inbox messages (spec §5): durable, acknowledged, point-to-point messages between the
/// participants of one namespace.
///
/// On the backend an inbox is stream `AMP_INBOX_<ns>` (work-queue retention, subjects
/// `amp.<ns>.inbox.*`) and one durable pull consumer per participant (`inbox_<name>`,
/// filtered on `amp.<ns>.inbox.<name>`, AckWait `inbox_ack_wait`, max_ack_pending
/// `inbox_window`). A message waits in the stream until its recipient acks it, whether
/// the recipient is online or not; the window holds across every gateway that serves the
/// participant, because the consumer itself enforces it.
///
/// Delivery. `inbox::attach` attaches a receiver (an `inbox_reader`) to a participant's
/// inbox. Each `inbox` object runs one delivery loop per participant with at least one
/// attached reader, shared by all of them: every message the consumer delivers goes to
/// every reader of the participant (the spec's "every connected session"; a reader that
/// acks or nacks it before the others have seen it spares them that delivery), and an ack
/// or nack from any of them settles it. The loop is driven by asynchronous fetches, not by a
/// thread, so one process can serve tens of thousands of attached participants. It keeps
/// at most `inbox_window` unacked messages in flight, pauses when the window is full and
/// resumes on ack, nack, or when an unacked message falls due for redelivery. A message
/// not acked within `inbox_ack_wait` is delivered again with `delivery` one higher; a late
/// ack of it still counts.
/// When the last reader of a participant detaches, what is in flight to it is handed back
/// (nak), so a participant that reconnects gets it without waiting for AckWait: at once
/// when a reader attaches again or no fetch is out, else when the fetch that is out
/// returns (within 5 s), so that fetch cannot count a delivery that reaches nobody. A
/// message that arrives while no reader is attached but a fetch is still out is taken by
/// that fetch and handed back too: its next delivery counts 2. A
/// reader sees the deliveries made after it attached (a message already in flight when it
/// attaches reaches it when it is redelivered).
///
/// Idle participants. A participant with nothing in flight whose last fetch (it waits up
/// to 5 s) found nothing is parked: no fetch is out for it, so an idle participant costs the
/// backend nothing. While any participant is parked, the `inbox` object listens on
/// `amp.<ns>.inbox.*` (one core subscription, dropped 30 s after the last one woke, so
/// participants that all read cost nothing per message), and a message stored for a parked
/// participant wakes it; the first fetch that finds nothing makes the subscription and the
/// next one parks. A nak, or an ack (should it be lost), wakes the loop when the message
/// could come back; a delivery another gateway tells of wakes it at once. A parked
/// participant still fetches once every 2 minutes (every half `inbox_idle_consumer` when
/// that is shorter, which keeps its consumer), and `look_again` wakes them all after the
/// backend was cut off. Readers that outlive their `inbox` object no longer park.
///
/// Several gateways. `inbox` objects of one namespace in different processes (or in one)
/// tell each other of their deliveries over core messages (`subjects::inbox_control_subject`):
/// a message one of them fetched reaches the readers of the participant in every other as
/// the same delivery, and an ack or nack in any settles it in all (an `ack` elsewhere is then
/// `not_found`); they say so only while another object has said it has readers of the
/// participant. Each object delivers in the order of its own fetches, so a participant's
/// readers in different objects may see messages in different orders; a core message lost
/// (a process cut from the backend) leaves that object's readers to the next delivery.
///
/// Threads. Every member function is thread-safe. Functions that do not start with
/// `async_` and are not marked non-blocking block on the backend: do not call them from a
/// transport callback or from an `on_message` callback (use the `async_` forms there).

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

namespace detail {
struct inbox_core;
class inbox_mailbox;
}  // namespace detail

/// A message to send (the `send` op of spec §5, with the sender filled in by the caller).
struct inbox_send {
  participant_name to;  ///< the recipient; it need not exist or be online
  std::string from;     ///< the authenticated sender: a participant name, or `$broker`
  std::string body;     ///< one serialized JSON value
  std::string type{};   ///< optional, e.g. `review.request`
  std::vector<std::pair<std::string, std::string>> headers{};  ///< optional, names unique
  /// Optional deduplication id: a repeat from the same sender to the same recipient within
  /// `duplicate_window` is stored once. Empty: a new unique id.
  std::string msg_id{};
  std::string reply_to{};     ///< optional participant name
  std::string correlation{};  ///< optional, 1..256 characters
};

/// The answer to a send.
struct send_result {
  std::uint64_t seq = 0;   ///< stream sequence: the `seq` the recipient sees
  std::string msg_id;      ///< the envelope's `id`
  bool duplicate = false;  ///< true when `msg_id` was already stored; `seq` is the first one
};

/// One delivery of an inbox message to a reader.
struct inbox_message {
  std::uint64_t seq = 0;       ///< stream sequence; what `ack` and `nack` take
  std::uint64_t delivery = 0;  ///< 1 on first delivery, +1 per redelivery (a nack counts)
  envelope env;                ///< as sent: id, from, to, ns, type, ts, body, ...
};

/// A receiver attached to one participant's inbox, made by `inbox::attach`. Destroying
/// it detaches it (`stop`). It stays usable after its `inbox` is destroyed (it keeps the
/// transport alive).
class inbox_reader {
 public:
  ~inbox_reader();
  inbox_reader(const inbox_reader&) = delete;
  inbox_reader& operator=(const inbox_reader&) = delete;

  /// The participant whose inbox this reader receives.
  const participant_name& participant() const noexcept;

  /// Acknowledges the message with stream sequence `seq`: it is removed from the inbox
  /// and frees a place in the window. An ack from any reader of the participant counts.
  /// Non-blocking: it checks, sends the acknowledgement without asking the backend to
  /// confirm it (`transport::acknowledge`) and returns; safe from `on_message`. One that
  /// the backend does not take leaves the message unacked: it is delivered again after
  /// AckWait (use `async_ack` to learn the outcome). Errors: `not_found` when `seq` is not
  /// in flight to the participant (never delivered, already acked or nacked, handed back
  /// after the last reader detached) or this reader is stopped; nothing changes then.
  result<void> ack(std::uint64_t seq);

  /// Hands the message back for redelivery after `delay` (zero: at once); the redelivery
  /// counts as a delivery. Non-blocking, like `ack`. Errors: `bad_request` for a negative
  /// `delay`; `not_found` as for `ack`; nothing changes then.
  result<void> nack(std::uint64_t seq, duration delay = duration::zero());

  /// `ack`, reporting the backend's answer: `done` gets the errors of `ack`, or
  /// `unavailable` when the backend did not take the acknowledgement (the message stays
  /// in flight, so the ack may be retried; unacked, it is redelivered after AckWait).
  /// `done` runs on the calling thread (before this returns) or on a transport thread.
  void async_ack(std::uint64_t seq, completion<void> done);

  /// `nack`, reporting the backend's answer as `async_ack` does.
  void async_nack(std::uint64_t seq, duration delay, completion<void> done);

  /// Detaches the reader. When called from outside its callback, no callback of this
  /// reader runs after `stop` returns (it waits for one running on another thread); from
  /// inside one, none runs after that callback returns. When it was the participant's
  /// last reader in this `inbox`, the messages in flight are handed back (nak, see above)
  /// for prompt delivery to the next reader. Idempotent; non-blocking on the backend.
  void stop() noexcept;

 private:
  friend class inbox;
  inbox_reader(std::shared_ptr<detail::inbox_core> core,
               std::shared_ptr<detail::inbox_mailbox> mailbox, std::uint64_t id);
  result<void> settle(std::uint64_t seq, ack_kind kind, duration delay, completion<void> done);

  std::shared_ptr<detail::inbox_core> core_;  // keeps the transport alive
  std::shared_ptr<detail::inbox_mailbox> mailbox_;
  std::uint64_t id_;
};

/// The inbox messages of one namespace (`config.ns`).
class inbox {
 public:
  /// Ensures the stream `AMP_INBOX_<ns>` (work queue, `storage`, `replicas`,
  /// `duplicate_window`, `inbox_max_age`) and subscribes to what the inboxes of other
  /// gateways say (`subjects::inbox_control_subjects`). Blocks. Errors: `bad_request` for an
  /// `inbox_window` below 1 or an `inbox_ack_wait` that is not positive; `conflict` when
  /// the stream exists with another configuration; `unavailable`.
  static result<std::shared_ptr<inbox>> open(std::shared_ptr<transport> t,
                                             const broker_config& config);

  ~inbox();
  inbox(const inbox&) = delete;
  inbox& operator=(const inbox&) = delete;

  /// Stores a message for `msg.to` (spec §5): the envelope gets a unique `id` (or
  /// `msg_id`), `to`, `ns` and `ts` (now, to the millisecond). Blocks; do not call from a
  /// transport or `on_message` callback. On the memory transport, the recipient's
  /// readers may receive the message on this thread before `send` returns.
  /// Errors, in the spec's order, each leaving nothing stored: `bad_request` when `body`
  /// is missing or is not exactly one JSON value; `invalid_name` when `from` is neither a
  /// participant name nor `$broker`, or `reply_to` is not a participant name;
  /// `invalid_envelope` (with the JSON Pointer of the member) when `msg_id`, `type`,
  /// `headers` or `correlation` break the envelope schema; `payload_too_large`;
  /// `unavailable` (a retry with the same `msg_id` cannot store it twice).
  result<send_result> send(inbox_send msg);

  /// `send`, asynchronous: `done` runs on the calling thread (before this returns, always
  /// for invalid input) or on a transport thread, and must not block.
  void async_send(inbox_send msg, completion<send_result> done);

  /// `async_send` of an envelope sealed already (`sealed_envelope::seal`): stored as it is,
  /// without being checked or written again; `to` is the recipient. Errors, leaving nothing
  /// stored: `bad_request` when it was sealed for another namespace or is empty (its text
  /// taken); `invalid_name` ("to: …")
  /// when its `to` is not a participant name; then the backend's, as for `send`.
  void async_send(sealed_envelope env, completion<send_result> done);

  /// Attaches a receiver to `participant`'s inbox; `on_message` then gets every delivery
  /// to the participant, from what was waiting while it was away on. The first reader of
  /// a participant ensures its consumer (blocks; not from a callback).
  ///
  /// `on_message` runs on a transport thread, the clock's timer thread, or a thread that
  /// calls into the inbox or the transport (the memory transport delivers inside `send`,
  /// `ack` or a manual clock's `advance`); the deliveries of one participant run one at a
  /// time, in the order the consumer made them. It must not block; it may call `ack`,
  /// `nack`, `stop` and the `async_` functions, and destroy its own reader. An exception
  /// it throws is caught and dropped (the delivery counts as made).
  ///
  /// Errors: `bad_request` when `on_message` is empty; `unavailable`; `conflict` when
  /// another consumer of the stream overlaps the participant's subject. A consumer made
  /// by a configuration with another AckWait or window is updated to this one.
  result<std::unique_ptr<inbox_reader>> attach(
      const participant_name& participant, std::function<void(const inbox_message&)> on_message);

  /// Every participant with an inbox in this namespace (spec §12, the audience `all`), sorted:
  /// one whose consumer exists (it attached, and has not been idle `inbox_idle_consumer`
  /// since) or for whom messages wait. Blocks. Errors: `unavailable`.
  result<std::vector<participant_name>> participants();

  /// Makes every participant with readers here fetch now, parked or not. Call it when the
  /// backend comes back after a cut: a message stored meanwhile was not heard (see
  /// "Idle participants" above), and would otherwise wait for the next look of its
  /// participant (at most 2 minutes). Non-blocking; any thread.
  void look_again();

  /// The namespace of this inbox.
  const namespace_name& ns() const noexcept;

  /// Use `open`.
  explicit inbox(std::shared_ptr<detail::inbox_core> core);

 private:
  std::shared_ptr<detail::inbox_core> core_;
  std::unique_ptr<subscription> peers_;  // what the inboxes of other gateways say
};

}  // namespace amp
