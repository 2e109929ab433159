#pragma once

/// \file
/// The record of an operation (spec §12) and the rules of its changes, as pure functions:
/// a reply and its vote, the decision (early, or at the deadline), a fenced retry of a
/// branch, a branch acknowledged by its member, and a cancel. The broker keeps one record
/// per operation and changes it only by a compare-and-set on the revision it read, so each
/// function here runs on a copy of the latest record and the write decides whether the
/// change happened: of concurrent changes exactly one wins, and the loser reads again and
/// applies its change to the winner's record. A decision is therefore taken once.
///
/// All functions are thread-safe (they touch only their arguments).

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "amp/broker/task_store.hpp"
#include "amp/clock.hpp"
#include "amp/result.hpp"

namespace amp {

/// Where an operation is: `open`, then once and for good one of the others.
enum class operation_state { open, completed, partial, failed, cancelled };

/// Where one member's branch is: `pending` (its message is stored, not acknowledged by the
/// member), `delivered` (acknowledged), `replied`, `stopped` (withdrawn by a cancel before
/// the member acknowledged it).
enum class branch_state { pending, delivered, replied, stopped };

/// What a gathering operation becomes at its deadline without its quorum: `partial` (when
/// at least one branch accepted) or `failed`.
enum class timeout_rule { failed, partial };

/// The wire names: `open`, `completed`, … ; `pending`, … ; `failed`, `partial`.
std::string_view to_string(operation_state s) noexcept;
std::string_view to_string(branch_state s) noexcept;
std::string_view to_string(timeout_rule r) noexcept;

/// A member's answer, as recorded.
struct branch_reply {
  bool accept = true;
  std::string body = "null";  ///< one serialized JSON value
  time_point at{};
  friend bool operator==(const branch_reply&, const branch_reply&) = default;
};

/// One member's branch.
struct operation_branch {
  int attempt = 1;  ///< raised by each retry; a reply must carry the current one
  branch_state state = branch_state::pending;
  std::optional<branch_reply> reply{};
  /// Not in the spec's record, kept for the broker: the inbox stream sequence of the
  /// current attempt's message (0: not stored yet), which a cancel withdraws.
  std::uint64_t seq = 0;
  friend bool operator==(const operation_branch&, const operation_branch&) = default;
};

/// The record of an operation (spec §12). Names are kept as validated strings.
struct operation_record {
  std::string operation;  ///< `o_…`
  std::string ns;
  std::string initiator;
  int quorum = 0;  ///< 0: a multicast, which gathers nothing
  timeout_rule on_timeout = timeout_rule::failed;
  operation_state state = operation_state::open;
  time_point created_at{};
  time_point updated_at{};
  time_point timeout_at{};  ///< epoch: no deadline (a multicast)
  /// One branch per member, by member name: its keys are the members, sorted.
  std::map<std::string, operation_branch, std::less<>> branches;
  /// Why it failed, when that is not the replies' doing: code `timeout` at the deadline.
  std::optional<task_error> error{};
  std::uint64_t revision = 0;  ///< the revision this record was read at (not stored)

  /// Not in the spec's record, kept for the broker:
  bool sent = false;          ///< every branch's first message is stored
  bool notified = false;      ///< the initiator's notice of the end is stored
  std::string idem_key{};     ///< task-store key of its idempotency binding; empty: none
  std::uint64_t due_seq = 0;  ///< its message in the operations stream (what it sends)

  friend bool operator==(const operation_record&, const operation_record&) = default;
};

/// True for every state but `open`.
bool is_closed(operation_state s) noexcept;

/// How many branches replied with `accept: true`, and with `accept: false`.
int accepted(const operation_record& r) noexcept;
int rejected(const operation_record& r) noexcept;

/// Members whose branch has not replied, in member order.
std::vector<std::string> missing(const operation_record& r);

/// What `apply_reply` did.
struct reply_effect {
  bool duplicate = false;  ///< the branch had replied already: nothing changed
  bool decided = false;    ///< this reply closed the operation
};

/// `forbidden` when `member` has no branch in `r` (the first check of a reply).
result<void> check_member(const operation_record& r, std::string_view member);

/// `forbidden` ("only the initiator may `what` …") when `by` is a member of `r` but not its
/// initiator; success for the initiator and for anyone else, whom callers answer
/// `not_found` (as for an unknown operation) or let through (an admin's cancel).
result<void> refuse_member(const operation_record& r, std::string_view by, std::string_view what);

/// Records `member`'s reply to its branch at `attempt`, then takes the decision it allows
/// (`decide`). Checked in this order, changing nothing on error: `forbidden` when `member`
/// has no branch; `conflict` when the operation is not open, or is past its deadline
/// (the deadline decides it: `decide`); `conflict` when `attempt` is not the branch's
/// current one (stale or future); then a branch that replied already is `duplicate` and
/// adds no vote.
result<reply_effect> apply_reply(operation_record& r, std::string_view member, int attempt,
                                 bool accept, std::string body, time_point now);

/// Closes an open operation when its outcome is settled at `now`; true when it did.
/// With a quorum: `completed` once `quorum` branches accepted; `failed` once so many
/// rejected that the quorum can no longer be met; at or after `timeout_at`, `partial`
/// (rule `partial` and at least one acceptance) or `failed` with error `timeout`. A
/// multicast is `completed` once `sent`. Sets `updated_at` when it closes.
bool decide(operation_record& r, time_point now);

/// Sends `member`'s branch again: its attempt is raised by one and it is `pending` again,
/// its message not yet stored (a reply carrying an older attempt is then `conflict`). Returns the
/// new attempt. Errors: `conflict` when the operation is not open, is past its deadline, or the
/// branch replied; `not_found` when `member` has no branch.
result<int> retry_branch(operation_record& r, std::string_view member, time_point now);

/// Records that `member` acknowledged its branch message of `attempt`: `pending` becomes
/// `delivered`, also once the operation is decided (a multicast is `completed` before its
/// members ack). True when that changed the record (false for another attempt, or a branch
/// past `pending`: a cancelled operation has none left).
bool mark_delivered(operation_record& r, std::string_view member, int attempt, time_point now);

/// What a cancel says of each branch: `already_completed` (it replied), `stopped` (its
/// message was not acknowledged: withdrawn), `unknown` (acknowledged, not answered).
enum class cancel_outcome { already_completed, stopped, unknown };
std::string_view to_string(cancel_outcome c) noexcept;

/// Cancels an open operation: `cancelled`, and each `pending` branch `stopped`. Returns
/// what that means for each member. Error: `conflict` when it is not open or is past its
/// deadline (which decides it first).
result<std::map<std::string, cancel_outcome, std::less<>>> cancel_operation(operation_record& r,
                                                                            time_point now);

/// The record as the spec's JSON object (the `operation` op): `operation, ns, initiator,
/// members, quorum (null for a multicast), state, created_at, updated_at, timeout_at (or
/// null), branches, revision`, plus `error` when it failed by timeout. With `only`, the
/// branches hold only that member's (what a member may see).
std::string to_json(const operation_record& r, std::optional<std::string_view> only = {});

/// The body of the initiator's notice of the end: `operation, state, quorum, members,
/// replies` (member → `{accept, body, at}`, replied branches only), `missing`, plus `error`
/// when there is one.
std::string notice_body(const operation_record& r);

/// The record in the broker's own format: the spec's members but `revision`, plus
/// `on_timeout`, `sent`, `notified`, `idem`, `due`, each branch's `seq`, and `error`. (`members` is
/// written for the reader's sake; reading takes the members from `branches`.)
std::string to_stored_json(const operation_record& r);

/// Reads a stored record (`to_stored_json`); its revision is 0. `internal` when the text
/// is not one.
result<operation_record> parse_operation_record(std::string_view json);

}  // namespace amp
