#pragma once

/// \file
/// The broker of one namespace: the five primitives of AMP and its operations over one transport,
/// opened together and wired to each other (a task that ends notifies its submitter's inbox from
/// `$broker`). A C++ service uses it in-process without any server:
///
/// ```cpp
/// auto t = amp::memory_transport::create();              // or jetstream_transport::connect(...)
/// auto b = amp::broker::open(t, {.ns = *amp::namespace_name::make("demo")});
/// auto task = (*b)->jobs().submit({.job = ..., .from = ..., .body = R"({"w":640})"});
/// ```
///
/// Several brokers (in one process or in several, e.g. several gateways) may serve one
/// namespace on one backend: every rule holds across them (see each primitive).

#include <memory>

#include "amp/broker/config.hpp"
#include "amp/broker/inbox.hpp"
#include "amp/broker/job_queue.hpp"
#include "amp/broker/operations.hpp"
#include "amp/broker/registry.hpp"
#include "amp/broker/task_store.hpp"
#include "amp/broker/topics.hpp"
#include "amp/result.hpp"
#include "amp/transport/transport.hpp"

namespace amp {

class broker {
 public:
  /// Opens every primitive of `config.ns` (creating streams, buckets and, when needed,
  /// the registry sweeper). `events.lease_lost` and `events.cancelled` are passed to the
  /// job queue; when neither `events.notify` nor `events.async_notify` is set, notices go to
  /// the inbox (a `$broker` message) through `async_notify`. `ops` is passed to the
  /// operations (spec §12).
  /// Blocks. Errors: those of the primitives' `open` (`conflict`, `unavailable`,
  /// `bad_request` for a configuration out of range).
  static result<std::shared_ptr<broker>> open(std::shared_ptr<transport> t, broker_config config,
                                              job_events events = {}, operation_events ops = {});

  const broker_config& config() const noexcept { return config_; }
  const std::shared_ptr<transport>& backend() const noexcept { return transport_; }

  amp::inbox& inbox() const noexcept { return *inbox_; }
  amp::topics& topics() const noexcept { return *topics_; }
  amp::registry& registry() const noexcept { return *registry_; }
  amp::job_queue& jobs() const noexcept { return *jobs_; }
  amp::task_store& tasks() const noexcept { return *tasks_; }
  amp::operations& operations() const noexcept { return *operations_; }

  broker(std::shared_ptr<transport> t, broker_config config);

 private:
  std::shared_ptr<transport> transport_;
  broker_config config_;
  std::shared_ptr<amp::task_store> tasks_;
  std::shared_ptr<amp::inbox> inbox_;
  std::shared_ptr<amp::topics> topics_;
  std::shared_ptr<amp::registry> registry_;
  std::shared_ptr<amp::job_queue> jobs_;
  std::shared_ptr<amp::operations> operations_;
};

}  // namespace amp
