#pragma once

// A plain cnats connection to a JetStream cluster, to ask who leads a stream and whether
// its replicas are current: for tests that kill cluster nodes.

#include <nats/nats.h>

#include <optional>
#include <string>
#include <vector>

namespace amp::testing {

class leader_probe {
 public:
  /// Connects to any of `urls` (reconnecting for ever); a probe that cannot connect
  /// answers nothing.
  explicit leader_probe(const std::vector<std::string>& urls);
  ~leader_probe();
  leader_probe(const leader_probe&) = delete;
  leader_probe& operator=(const leader_probe&) = delete;

  /// The server name of the stream's leader, if JetStream answers and there is one.
  std::optional<std::string> leader_of(const char* stream);

  /// Whether the stream (or its consumer `durable`) has a leader and two replicas beside
  /// it, both current and online: a node that was down has caught up.
  bool caught_up(const char* stream, const char* durable = nullptr);

  /// How the last `caught_up` saw the replicas: `name current/offline lag active_ms`, for
  /// a failure's message.
  const std::string& last_view() const noexcept { return last_view_; }

 private:
  bool current(const jsClusterInfo* c);

  std::string last_view_;

  natsOptions* opts_ = nullptr;
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
};

}  // namespace amp::testing
