#pragma once

/// \file
/// Operations (spec §12): one identified branch to each member of an audience frozen at
/// the start, delivered through the members' inboxes, and, with a quorum, the members'
/// replies gathered under a completion rule.
///
/// On the backend an operation is
/// - its record (`operation_record`) in the task store bucket, key `<ns>.<operation>`:
///   history kept, every change a compare-and-set on the revision read, so of concurrent
///   changes (replies on several gateways, a reply racing the deadline or a cancel) exactly
///   one wins and the loser applies its change to the winner's record: the decision is
///   taken once, by the write that closes the record;
/// - one message in the stream `AMP_OPS_<ns>` (work queue) holding what the operation
///   sends (type, headers, each member's body), kept while the operation is open. The
///   durable consumer `deadlines`, shared by every `operations` object of the namespace (one
///   per gateway), hands it back with a delay until the deadline: whichever gateway is
///   alive then takes the decision, sends the branches a gateway that died left unsent,
///   and notifies the initiator. It is removed once the initiator is notified;
/// - the branch messages in the members' inboxes (`inbox`), from the initiator, with the
///   envelope's `operation` member; deduplicated per attempt (`msg_id`
///   `<operation>.<member>.<attempt>`), so a branch sent again is stored once;
/// - the initiator's notice of the end: a `$broker` message of type `amp.operation.<state>`
///   with `notice_body`, stored once (`msg_id` `<operation>.end`) and recorded (`notified`).
///
/// Ended operations are swept with the tasks (`task_store::operation_ended`).
///
/// Threads. Every member function is thread-safe. Those that do not start with `async_`
/// block on the backend: do not call them from a transport callback.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "amp/broker/config.hpp"
#include "amp/broker/inbox.hpp"
#include "amp/broker/job_queue.hpp"
#include "amp/broker/operation_record.hpp"
#include "amp/broker/task_store.hpp"
#include "amp/clock.hpp"
#include "amp/names.hpp"
#include "amp/result.hpp"
#include "amp/transport/transport.hpp"

namespace amp {

/// Members an operation may have at most (spec §12).
inline constexpr std::size_t max_operation_members = 1000;
/// The deadline of a gathering operation: from 100 ms to 24 hours after its start.
inline constexpr duration min_operation_timeout = std::chrono::milliseconds(100);
inline constexpr duration max_operation_timeout = std::chrono::hours(24);

/// What starts an operation (the `scatter` op, the audience resolved by the caller).
struct operation_start {
  participant_name initiator;
  /// The audience: 1 to `max_operation_members` names once duplicates are collapsed.
  std::vector<participant_name> members;
  std::string body = "null";  ///< one serialized JSON value, for members not in `bodies`
  /// A member's own body (scatter with branch-specific input); each key must be a member.
  std::map<std::string, std::string, std::less<>> bodies{};
  std::string type{};
  std::vector<std::pair<std::string, std::string>> headers{};
  int quorum = 0;      ///< 0: a multicast; otherwise 1..members
  duration timeout{};  ///< with a quorum: the deadline after the start
  timeout_rule on_timeout = timeout_rule::failed;
  std::string idempotency_key{};  ///< empty: none
};

/// The answer to a start.
struct operation_started {
  operation_id operation;
  bool created = true;               ///< false: the idempotency key named an earlier one
  std::vector<std::string> members;  ///< sorted, duplicates collapsed
};

/// The answer to a reply.
struct operation_replied {
  operation_state state = operation_state::open;  ///< after the reply
  bool duplicate = false;                         ///< the branch had replied already: no vote added
};

/// What an `operations` object tells its owner.
struct operation_events {
  /// `members` of `operation`, cancelled through any gateway of the namespace, should be
  /// told (their branch was `stopped` or `unknown`). Runs on a transport thread; must not
  /// block. Every `operations` object of the namespace gets it.
  std::function<void(const operation_id& operation, const std::vector<std::string>& members)>
      cancelled{};
};

class operations : public std::enable_shared_from_this<operations> {
 public:
  /// Ensures the stream `AMP_OPS_<ns>` and its consumer `deadlines`, subscribes to the
  /// cancels of the other gateways (`subjects::operation_control_subject`) and starts taking
  /// the operations that fall due; that work runs on `config.run` (or a pool of its own)
  /// and stops when this object is destroyed. Blocks. Errors: `unavailable`; `conflict`
  /// when the stream exists with another configuration.
  static result<std::shared_ptr<operations>> open(std::shared_ptr<transport> t,
                                                  const broker_config& config,
                                                  std::shared_ptr<task_store> store,
                                                  std::shared_ptr<amp::inbox> box,
                                                  operation_events events = {});

  /// Starts an operation: stores its record (every branch `pending`, attempt 1) and sends
  /// each member its branch. A multicast is `completed` (and its initiator notified) once
  /// every branch is stored. Errors, leaving nothing behind: `bad_request` for no member,
  /// more than `max_operation_members`, a quorum above the members or below 0, a missing or
  /// out-of-range timeout with a quorum, a body that is not one JSON value, or a `bodies`
  /// key that is not a member; `invalid_envelope` for a `type` or `headers` the envelope
  /// schema refuses; `payload_too_large` when what it sends (every body together) does
  /// not fit one backend message; `unavailable`. A start that failed with `unavailable`
  /// may be repeated with the same idempotency key: it goes on with the same operation.
  /// A key bound earlier returns that operation with `created = false`.
  result<operation_started> start(operation_start s);

  /// Records `member`'s reply at `attempt` (`apply_reply`), deciding the operation when the
  /// reply settles it and notifying the initiator then. An operation past its deadline is
  /// decided first (`conflict` for the reply). Errors: `not_found` for an unknown operation;
  /// `forbidden` for a participant with no branch; `conflict` (stale or future attempt,
  /// operation not open); `bad_request` for a body that is not one JSON value.
  result<operation_replied> reply(const operation_id& operation, const participant_name& member,
                                  int attempt, bool accept, std::string body);

  /// The latest record. `not_found` when there is none (never started, or swept).
  result<operation_record> get(const operation_id& operation);

  /// The record as `who` may see it (spec §12, the `operation` op): the whole record for the
  /// initiator and admins, the member's own branch for a member. `not_found` for anyone
  /// else, as for an unknown operation.
  result<std::string> view(const operation_id& operation, const viewer& who);

  /// Sends `member`'s branch again with its attempt raised by one (`retry_branch`); returns
  /// the new attempt. The old attempt's message, if the member has not acked it, is
  /// withdrawn from the inbox (not delivered again). Only the initiator may (`forbidden` for a
  /// member, `not_found` for anyone else); errors otherwise as `retry_branch`, or `unavailable`
  /// (the record says the new attempt: its message is sent again at the operation's next look).
  result<int> retry(const operation_id& operation, const participant_name& by,
                    const participant_name& member);

  /// Cancels an open operation (the initiator or an admin): `cancelled`, each unacknowledged
  /// branch message withdrawn from its member's inbox, the initiator notified, and the
  /// members with a `stopped` or `unknown` branch told through `operation_events::cancelled`
  /// on every gateway. Returns what became of each branch. Errors: `not_found` for anyone
  /// but the initiator, a member (`forbidden`) or an admin; `conflict` for a closed one.
  result<std::map<std::string, cancel_outcome, std::less<>>> cancel(const operation_id& operation,
                                                                    const viewer& by);

  /// Records that `member` acknowledged its branch message of `attempt`: the branch is
  /// `delivered` (`mark_delivered`), so a cancel no longer withdraws it. Asynchronous and
  /// best effort: `done` (optional) gets whether the record changed. Safe from a callback.
  void async_delivered(const operation_id& operation, const participant_name& member, int attempt,
                       std::function<void(bool)> done = {});

  /// A new operation id: `o_` + creation time + a counter + randomness.
  operation_id new_id() const;

  const namespace_name& ns() const noexcept;

  ~operations();
  operations(const operations&) = delete;
  operations& operator=(const operations&) = delete;

  struct state;
  explicit operations(std::shared_ptr<state> s);

 private:
  std::shared_ptr<state> s_;
};

}  // namespace amp
