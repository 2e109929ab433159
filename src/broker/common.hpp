#pragma once

// What the broker primitives share: their worker pool, unique ids, and the one way an
// envelope is made from what a caller supplies.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "amp/broker/config.hpp"
#include "amp/broker/task_store.hpp"
#include "amp/envelope.hpp"
#include "amp/json.hpp"
#include "amp/result.hpp"

namespace amp::detail {

// Threads that run posted work in order of posting. Destruction runs what is queued,
// then joins (a pool destroyed by one of its own jobs lets that thread finish alone).
class worker_pool {
 public:
  explicit worker_pool(std::size_t threads);
  ~worker_pool();
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  void post(std::function<void()> work);

 private:
  struct core {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;
    bool stopping = false;
  };
  static void run(const std::shared_ptr<core>& c);

  std::shared_ptr<core> core_ = std::make_shared<core>();
  std::vector<std::thread> threads_;
};

// The executor of `config`, or a pool made for the caller (kept alive in `pool`).
// The stream as `config` says, made when missing; one that exists with other limits (an
// older configuration, or another server's) gets these. Other differences: `conflict`.
result<stream_info> ensure_limits(transport& t, const stream_config& config);

executor executor_for(const broker_config& config, std::shared_ptr<worker_pool>& pool);

// `prefix` + 9 base-36 digits of milliseconds since the epoch + 3 of a per-process counter
// + 8 random: unique, and in creation order when compared as strings (within a process
// always; across processes to the millisecond).
std::string unique_id(std::string_view prefix, time_point now);

// The headers of the core messages a namespace's brokers and gateways on several servers
// send each other: who says it (its id among them), and what.
inline constexpr std::string_view k_peer_header = "Amp-Peer";
inline constexpr std::string_view k_event_header = "Amp-Event";

// The `Nats-Msg-Id` that makes `msg_id` deduplicate per sender and destination.
std::string dedup_id(std::string_view from, std::string_view to, std::string_view msg_id);

// `bad_request` unless `env` was sealed for namespace `ns` (and still holds its text).
result<void> check_sealed_for(const sealed_envelope& env, const namespace_name& ns);

// Writes a task's error as `{"code","message"}`, or null.
void write_task_error(json_writer& w, const std::optional<task_error>& e);

// Writes `key` and `t` as a timestamp, or null for the epoch.
void write_time_or_null(json_writer& w, std::string_view key, time_point t);

}  // namespace amp::detail
