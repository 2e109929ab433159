#pragma once

/// \file
/// Plain configuration of the broker primitives of one namespace (`amp/broker/*.hpp`):
/// what spec §11 calls `heartbeat_s`, `registry_ttl_s`, `inbox_ack_s`, `inbox_window` and
/// `jobs`, plus where the backend keeps the data. Every primitive takes the same
/// `broker_config`, so one value configures a whole `amp::broker`.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "amp/clock.hpp"
#include "amp/names.hpp"
#include "amp/transport/transport.hpp"

namespace amp {

/// How a job's tasks are leased and retried (spec §7, §11 `jobs`).
struct job_config {
  /// Lease length: the job consumer's AckWait and the lease a claim or heartbeat grants.
  duration lease = std::chrono::seconds(30);
  /// Claims a task may have when its submitter does not say (1..100).
  int max_attempts = 3;
  /// How long a declined task waits before it is offered again.
  duration decline_delay = std::chrono::seconds(1);

  friend bool operator==(const job_config&, const job_config&) = default;
};

/// Runs a piece of broker work. The broker never does blocking backend calls on the
/// clock's timer thread or on a transport's callback thread: it hands them to this.
using executor = std::function<void(std::function<void()>)>;

/// An executor that runs the work at once, on the calling thread. Only for a transport
/// whose operations never wait on another thread (the memory transport): it makes timer
/// work run inside `manual_clock::advance`, which deterministic tests want.
executor inline_executor();

/// The configuration of the broker primitives of one namespace.
struct broker_config {
  /// The namespace every primitive works in (required).
  namespace_name ns;
  /// Where streams and buckets keep their data, and how many replicas they have.
  storage_type storage = storage_type::file;
  int replicas = 1;
  /// `msg_id` deduplication window of every stream (spec §5: 2 minutes).
  duration duplicate_window = std::chrono::minutes(2);

  /// Inbox: redelivery of what is not acked within this (spec `inbox_ack_s`).
  duration inbox_ack_wait = std::chrono::seconds(30);
  /// Inbox: unacked messages in flight to one participant at most (spec `inbox_window`).
  int inbox_window = 64;

  /// Inbox: age after which an unacked message is dropped (zero: kept until acked), and
  /// the bytes the inbox stream may hold (zero or less: no limit). A full inbox stream
  /// refuses new messages (`limit_exceeded`) rather than drop old ones. An inbox stream
  /// made with other limits is changed to these when the inbox opens.
  duration inbox_max_age = std::chrono::hours(24 * 7);
  std::int64_t inbox_max_bytes = -1;
  /// Inbox: a participant's consumer (`inbox_<participant>`) that has been idle this long
  /// (no reader attached, so no fetch waiting, and no ack) is removed by the backend
  /// (`consumer_config::inactive_threshold`); its messages stay in the inbox stream and
  /// are all delivered when a reader attaches again. Zero: never removed.
  duration inbox_idle_consumer = std::chrono::hours(24 * 7);

  /// Topics: how long the topic stream keeps events for replay (zero: no age limit), and
  /// how many bytes at most (zero or less: no limit); the oldest go first. A topic stream
  /// made with other limits is changed to these when the topics open.
  duration topic_max_age = std::chrono::hours(24);
  std::int64_t topic_max_bytes = -1;

  /// Registry: an entry not refreshed within this expires (spec `registry_ttl_s`).
  duration registry_ttl = std::chrono::seconds(30);
  /// Registry: use the sweeper even when the transport has per-key TTL.
  bool registry_force_sweeper = false;

  /// Tasks: how long a task's record, its history and its idempotency binding are kept
  /// after the task ends (spec §7: at least 24 hours); then the task store removes them.
  /// Zero keeps them for ever.
  duration task_retention = std::chrono::hours(24);

  /// Jobs: the configuration of a job not named in `jobs` (spec `jobs["*"]`).
  job_config default_job{};
  /// Jobs by name (spec `jobs`).
  std::map<std::string, job_config, std::less<>> jobs{};

  /// Where timer work and post-processing of asynchronous fetches run. Empty: an
  /// internal pool of `workers` threads owned by each primitive that needs one.
  executor run{};
  std::size_t workers = 2;

  /// The configuration of `job`: its entry in `jobs`, or `default_job`.
  const job_config& job(const job_name& job) const {
    auto it = jobs.find(job.view());
    return it == jobs.end() ? default_job : it->second;
  }
};

}  // namespace amp
