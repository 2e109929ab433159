#pragma once

/// \file
/// The one place in amp that spells NATS subjects and the names of streams, consumers,
/// key-value buckets and keys (see the "NATS mapping" of the architecture). The builders
/// take validated names only (`amp/names.hpp`), so nothing unchecked reaches NATS; their
/// results always pass the syntax checks below.
///
/// The checks are for raw strings at the transport boundary: a transport refuses a
/// subject, filter or name that fails them with `errc::invalid_name` and the check's
/// message (which names the value, escaped, and what is wrong with it).
///
/// Every function here is pure and thread-safe.

#include <cstddef>
#include <string>
#include <string_view>

#include "amp/names.hpp"
#include "amp/result.hpp"

namespace amp::subjects {

/// The longest stream or consumer name accepted by `check_stream_name` and
/// `check_consumer_name`.
inline constexpr std::size_t max_stream_name_length = 255;
/// The longest bucket name accepted by `check_bucket_name` (a bucket is the stream
/// `KV_<bucket>`, which must stay within `max_stream_name_length`).
inline constexpr std::size_t max_bucket_name_length = max_stream_name_length - 3;

/// \name Inboxes
/// Stream `AMP_INBOX_<ns>` with subjects `amp.<ns>.inbox.*`; one durable consumer per
/// participant, filtered on that participant's subject.
///@{
/// `AMP_INBOX_<ns>`.
std::string inbox_stream(const namespace_name& ns);
/// `amp.<ns>.inbox.*`, the subjects of the inbox stream.
std::string inbox_subjects(const namespace_name& ns);
/// `amp.<ns>.inbox.<participant>`, where messages to `participant` are published.
std::string inbox_subject(const namespace_name& ns, const participant_name& participant);
/// `inbox_<participant>`, the durable consumer of a participant's inbox.
std::string inbox_consumer(const participant_name& participant);
///@}

/// \name Job queues
/// Stream `AMP_TASKS_<ns>` with subjects `amp.<ns>.job.*`; one durable pull consumer
/// per job.
///@{
/// `AMP_TASKS_<ns>`.
std::string tasks_stream(const namespace_name& ns);
/// `amp.<ns>.job.*`, the subjects of the tasks stream.
std::string job_subjects(const namespace_name& ns);
/// `amp.<ns>.job.<job>`, where tasks of `job` are published.
std::string job_subject(const namespace_name& ns, const job_name& job);
/// `job_<job>`, the durable consumer of a job's queue.
std::string job_consumer(const job_name& job);
///@}

/// \name Task ends
/// Stream `AMP_ENDED_<ns>` with subject `amp.<ns>.task.ended`: one message per task that
/// ended, work-queue retention, one durable consumer `sweeper` through which the task
/// store removes the task's record and idempotency binding once its retention has passed.
///@{
/// `AMP_ENDED_<ns>`.
std::string ended_stream(const namespace_name& ns);
/// `amp.<ns>.task.ended`, the one subject of the task-ends stream.
std::string ended_subject(const namespace_name& ns);
/// `sweeper`, the durable consumer of the task-ends stream.
std::string sweeper_consumer();
///@}

/// \name Operations (spec §12)
/// Stream `AMP_OPS_<ns>` with subject `amp.<ns>.operation.due`: one message per open
/// operation (what it sends, and its deadline), work-queue retention, one durable consumer
/// `deadlines` shared by the gateways of the namespace, through which whichever is alive
/// decides the operation at its deadline, sends what a gateway that died left unsent, and
/// notifies the initiator. The record is in the task store bucket (`operation_key`).
///@{
/// `AMP_OPS_<ns>`.
std::string operations_stream(const namespace_name& ns);
/// `amp.<ns>.operation.due`, the one subject of the operations stream.
std::string operation_due_subject(const namespace_name& ns);
/// `deadlines`, the durable consumer of the operations stream.
std::string deadlines_consumer();
///@}

/// \name Control messages between gateways
/// Core subjects (no stream captures them): what the brokers of one namespace on several
/// gateways tell each other.
///@{
/// `amp.<ns>.ctl.tasks`: a running task was cancelled (its holder may be connected to
/// another gateway).
std::string task_control_subject(const namespace_name& ns);
/// `amp.<ns>.ctl.operations`: an operation was cancelled (its members may be connected to
/// another gateway).
std::string operation_control_subject(const namespace_name& ns);
/// `amp.<ns>.ctl.inbox.*`: what the inboxes of a namespace on several gateways tell each
/// other of a participant's deliveries (one subject per participant).
std::string inbox_control_subjects(const namespace_name& ns);
/// `amp.<ns>.ctl.inbox.<participant>`.
std::string inbox_control_subject(const namespace_name& ns, const participant_name& participant);
/// `amp.<ns>.ctl.work`: what the gateways of a namespace tell each other of their workers
/// (who is registered there, with how many slots, how busy).
std::string work_control_subject(const namespace_name& ns);
/// `amp.<ns>.ctl.work.<gateway>`: offers one gateway hands to another's workers. `gateway`
/// is the receiver's id, one subject token (the caller makes it: letters and digits).
std::string work_offer_subject(const namespace_name& ns, std::string_view gateway);
///@}

/// \name Topics
/// Stream `AMP_TOPICS_<ns>` with subjects `amp.<ns>.topic.>`; one consumer per
/// subscriber, filtered on its pattern.
///@{
/// `AMP_TOPICS_<ns>`.
std::string topics_stream(const namespace_name& ns);
/// `amp.<ns>.topic.>`, the subjects of the topics stream.
std::string topic_subjects(const namespace_name& ns);
/// `amp.<ns>.topic.<topic>`, where events on `t` are published.
std::string topic_subject(const namespace_name& ns, const topic& t);
/// `amp.<ns>.topic.<pattern>`, the consumer filter of a subscription; it matches the
/// subject of a topic exactly when `pattern` matches the topic.
std::string topic_filter(const namespace_name& ns, const topic_pattern& pattern);
/// The topic of a subject made by `topic_subject(ns, …)`. Errors: `invalid_name` when
/// `subject` is not under `amp.<ns>.topic.` or what follows is not a valid topic.
result<topic> topic_from_subject(const namespace_name& ns, std::string_view subject);
///@}

/// \name Dead letters (`amp-sink-v1.md`)
/// Stream `AMP_DLQ_<ns>` with subjects `amp.<ns>.dlq.*`: what a sink could never write,
/// one subject per sink.
///@{
/// `AMP_DLQ_<ns>`.
std::string dlq_stream(const namespace_name& ns);
/// `amp.<ns>.dlq.*`, the subjects of the dead-letter stream.
std::string dlq_subjects(const namespace_name& ns);
/// `amp.<ns>.dlq.<sink>`, where `sink` publishes what it dead-letters.
std::string dlq_subject(const namespace_name& ns, const sink_name& sink);
///@}

/// \name Key-value stores
///@{
/// `AMP_REGISTRY_<ns>`, the registry bucket of a namespace.
std::string registry_bucket(const namespace_name& ns);
/// `<participant>`, the registry key of a participant.
std::string registry_key(const participant_name& participant);
/// `AMP_TASK_STATE`, the task store bucket (shared by all namespaces).
std::string task_state_bucket();
/// `<ns>.<task>`, the key of a task in the task store.
std::string task_key(const namespace_name& ns, const task_id& task);
/// `<ns>.<operation>`, the key of an operation's record in the task store (spec §12).
std::string operation_key(const namespace_name& ns, const operation_id& operation);
/// `<ns>.idem.<digest>`, the task store key that binds an idempotency key to a task;
/// `digest` is the lower-case hex SHA-256 of the submitter and the key (64 characters).
std::string idempotency_key(const namespace_name& ns, std::string_view digest);
/// `AMP_BUDGETS`, the bucket of per-day budget counters (shared by all namespaces).
std::string budget_bucket();
/// `<ns>.<participant>.<day>`, the budget counter of a participant on a UTC day
/// (`day` is `yyyymmdd`).
std::string budget_key(const namespace_name& ns, const participant_name& participant,
                       std::string_view day);
///@}

/// \name Syntax checks for raw input
/// Each returns success or `errc::invalid_name` with a message that quotes the value
/// (escaped, see `amp::quoted`) and says what is wrong and at which byte position. All
/// refuse bytes outside printable ASCII (whitespace, control characters, non-ASCII).
///@{
/// A concrete subject to publish to: non-empty tokens separated by `.`, no `*` or `>`
/// anywhere.
result<void> check_subject(std::string_view subject);
/// A subscription filter: like a subject, but a token may be `*` (a whole token) and
/// the last token may be `>`.
result<void> check_filter(std::string_view filter);
/// A stream name: 1 to 255 bytes, none of `.`, `*`, `>`, `/`, `\`.
result<void> check_stream_name(std::string_view name);
/// A consumer name: the rules of `check_stream_name`.
result<void> check_consumer_name(std::string_view name);
/// A key-value bucket name: `^[a-zA-Z0-9_-]+$`, at most 252 bytes.
result<void> check_bucket_name(std::string_view name);
/// A key-value key: `^[-/_=.a-zA-Z0-9]+$`, not starting or ending with `.`, no empty
/// token (`..`).
result<void> check_kv_key(std::string_view key);
///@}

/// NATS wildcard matching: true when `subject` is matched by `filter`, where a `*`
/// token matches any one token and a last `>` token matches one or more tokens. Both
/// are expected to have passed `check_filter`/`check_subject`; for other input the
/// answer is that of a plain token-by-token comparison.
bool subject_matches(std::string_view filter, std::string_view subject) noexcept;

/// True when some concrete subject matches both filters (NATS semantics as in
/// `subject_matches`). Both are expected to have passed `check_filter`.
bool filters_overlap(std::string_view a, std::string_view b) noexcept;

}  // namespace amp::subjects
