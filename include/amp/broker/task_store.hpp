#pragma once

/// \file
/// The task store (spec §7): one KV key per task in bucket `AMP_TASK_STATE`
/// (`<ns>.<task>`), history kept, every change a compare-and-set on the revision that
/// was read, so two concurrent transitions of one task can never both succeed. It also
/// keeps the idempotency index: an idempotency key of a submitter maps to one task id for
/// as long as the store keeps the task.
///
/// Retention: a write that ends a task records the end in the stream `AMP_ENDED_<ns>`
/// (sent just before the write, not waited for; an end that is not stored is sent again in
/// the background until it is, while the store is open: docs/broker.md); the store's
/// sweeper takes each end once `task_retention` has passed
/// since it and removes the task's record, with its history, and its idempotency binding,
/// leaving no marker (`transport::async_kv_erase`). Several stores on one namespace (one
/// per server) share the sweeping through one durable consumer.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "amp/broker/config.hpp"
#include "amp/clock.hpp"
#include "amp/names.hpp"
#include "amp/result.hpp"
#include "amp/transport/transport.hpp"

namespace amp {

/// Where a task is in its life (spec §7).
enum class task_state { queued, running, completed, failed, cancelled };

/// `queued`, `running`, ... (the wire names).
std::string_view to_string(task_state s) noexcept;
/// True for completed, failed and cancelled.
bool is_terminal(task_state s) noexcept;

/// An error a task failed with: `{"code","message"}`.
struct task_error {
  std::string code;
  std::string message;
  friend bool operator==(const task_error&, const task_error&) = default;
};

/// The task record (spec §7). Names are kept as validated strings.
struct task_record {
  std::string task;
  std::string ns;
  std::string job;
  task_state state = task_state::queued;
  int attempt = 0;  ///< claims made so far
  int max_attempts = 3;
  std::string submitted_by;
  std::string owner;              ///< empty: none (always empty while queued)
  time_point lease_expires_at{};  ///< epoch: none
  time_point created_at{};
  time_point updated_at{};
  std::string result;  ///< serialized JSON; empty: none
  std::optional<task_error> error{};
  std::uint64_t revision = 0;  ///< the KV revision this record was read at (not stored)

  /// Not in the spec's record, kept for the broker:
  std::vector<std::string> holders{};  ///< every participant that held a lease, in order
  std::string ack_token{};             ///< the job message's ack token of the current claim
  std::uint64_t job_seq = 0;           ///< stream sequence of the job message
  std::string idem_key{};              ///< task-store key of its idempotency binding; empty: none
  /// The submitter was told of the end where the job message was not at hand (a queued task
  /// cancelled): its later delivery lets the message go without telling again. `history`
  /// lists a revision that only sets it in place of the revision before it.
  bool notified = false;

  bool has_owner() const noexcept { return !owner.empty(); }
  bool has_lease() const noexcept { return lease_expires_at != time_point{}; }

  friend bool operator==(const task_record&, const task_record&) = default;
};

/// The record as the spec's JSON object (the `task` op and history entries): `task, ns,
/// job, state, attempt, max_attempts, submitted_by, owner, lease_expires_at, created_at,
/// updated_at, result, error, revision`, with null for what is absent.
std::string to_json(const task_record& r);

/// The record in the broker's own format, as the task store keeps it (the spec's members
/// but `revision`, plus `holders`, `ack`, `job_seq`, `idem`, `notified`).
std::string to_stored_json(const task_record& r);

/// Reads a stored record (the broker's own format, `to_stored_json`). `internal` when the
/// text is not one. The revision is not in it: 0.
result<task_record> parse_task_record(std::string_view json);

/// The task store. Thread-safe; every call blocks on the backend (do not call from a
/// transport callback).
class task_store : public std::enable_shared_from_this<task_store> {
 public:
  /// Ensures the bucket (history 64, `config.storage`, `config.replicas`) and the
  /// task-ends stream of `config.ns` with its consumer, and starts the sweeper (unless
  /// `config.task_retention` is zero), whose work runs on `config.run` (or a pool of its
  /// own) and stops when the store is destroyed.
  /// Errors: `unavailable`, `conflict` when the bucket or stream exists with another
  /// configuration.
  static result<std::shared_ptr<task_store>> open(std::shared_ptr<transport> t,
                                                  const broker_config& config);

  /// A new task id: `t_` + creation time + a counter + randomness. Ids sort by creation
  /// time (to the millisecond across processes, exactly within one).
  task_id new_id() const;

  /// Stores a new record; returns it with its revision. `conflict` when the task exists.
  result<task_record> create(task_record r);
  /// `create`, asynchronously: `done` runs on a transport thread (or at once on the calling
  /// thread when the record cannot be written at all).
  void async_create(task_record r, completion<task_record> done);
  /// The latest record; `not_found` when there is none.
  result<task_record> get(const namespace_name& ns, const task_id& task);
  /// The latest records of `tasks`, in their order, each as `get` would answer it. The
  /// reads go out together, so n records cost about one round trip, not n.
  std::vector<result<task_record>> get_many(const namespace_name& ns,
                                            const std::vector<task_id>& tasks);
  /// Writes `r` only when the task's latest revision is `r.revision`; returns the record
  /// with its new revision. `conflict` when the task moved on (someone else won). A record
  /// in a terminal state is also recorded as ended (see Retention above); the answer is the
  /// write's, whatever becomes of that.
  result<task_record> update(task_record r);
  /// `update`, asynchronously, like `async_create`.
  void async_update(task_record r, completion<task_record> done);
  /// Every retained revision of the task, oldest first (the bucket keeps the last 64).
  /// `not_found` when there is none.
  result<std::vector<task_record>> history(const namespace_name& ns, const task_id& task);

  /// The task id an idempotency key of `submitter` stands for. If the key is new it is
  /// bound to `proposed` and that is returned with `bound = true`; otherwise the task it
  /// was bound to earlier, with `bound = false`. Keys are 1..256 bytes of any content
  /// (`bad_request` otherwise); they are stored hashed (SHA-256). `key` is the binding's
  /// task-store key, for the task's record (`task_record::idem_key`).
  struct binding {
    task_id task;
    bool bound = false;
    std::string key{};
  };
  result<binding> bind_idempotency_key(const namespace_name& ns, const participant_name& submitter,
                                       std::string_view key, const task_id& proposed);

  /// The task an idempotency key of `submitter` is bound to, or `std::nullopt` when it is
  /// not bound (a read: nothing is bound). Errors: `bad_request` for a key outside
  /// 1..256 bytes, `unavailable`, `internal` for a stored value that is not a task id.
  result<std::optional<task_id>> find_idempotency_key(const namespace_name& ns,
                                                      const participant_name& submitter,
                                                      std::string_view key);

  /// The same index for operations (spec §12): an idempotency key of `initiator` stands
  /// for one operation. It is kept apart from the keys of `submit` (the same key may name a
  /// task and an operation). Errors as for `bind_idempotency_key`.
  struct operation_binding {
    operation_id operation;
    bool bound = false;
    std::string key{};
  };
  result<operation_binding> bind_operation_key(const namespace_name& ns,
                                               const participant_name& initiator,
                                               std::string_view key, const operation_id& proposed);

  /// The operation an idempotency key of `initiator` is bound to, or `std::nullopt` (a
  /// read). Errors as for `find_idempotency_key`.
  result<std::optional<operation_id>> find_operation_key(const namespace_name& ns,
                                                         const participant_name& initiator,
                                                         std::string_view key);

  /// Records that the operation whose record is `operation_key(ns, operation)` ended, so
  /// that the sweeper removes its record, its history and its idempotency binding once the
  /// retention has passed (as for a task; nothing when records are kept for ever).
  /// Non-blocking; the end is sent again in the background until it is stored.
  void operation_ended(const namespace_name& ns, const operation_id& operation);

  /// The bucket the records are in.
  const std::string& bucket() const noexcept { return bucket_; }

  const std::shared_ptr<transport>& backend() const noexcept { return transport_; }

  task_store(std::shared_ptr<transport> t, std::string bucket);
  ~task_store();
  task_store(const task_store&) = delete;
  task_store& operator=(const task_store&) = delete;

  class sweeper;

 private:
  void write(task_record r, const std::string& key, completion<task_record> done);
  // Binds `kv_key` to `proposed` unless it is bound already; returns what it is bound to.
  result<std::pair<std::string, bool>> bind(const std::string& kv_key, const std::string& proposed);
  // Records the end of a task in the stream of ends, until it is stored or this store is
  // gone (`attempt`: how many times it was sent before).
  void send_end(outgoing_message end, int attempt);

  std::shared_ptr<transport> transport_;
  std::string bucket_;
  std::shared_ptr<sweeper> sweeper_;  // empty: records are kept for ever
};

}  // namespace amp
