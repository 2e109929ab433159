// A work queue on the embedded memory transport, written against amp::transport only:
// the producer records each task in a KV bucket and publishes a job; the worker pulls,
// claims the task with a compare-and-set on its revision, commits the result, and only
// then acknowledges the job message (commit-then-ack).
//
// Run: build/bin/amp-example-memory   (exits 0 when every task completed exactly once)

#include <cstdio>
#include <string>

#include "amp/transport/memory.hpp"

namespace {

int fail(const char* what, const amp::error& e) {
  std::fprintf(stderr, "amp-example-memory: %s: %s\n", what, e.to_string().c_str());
  return 1;
}

}  // namespace

int main() {
  auto transport = amp::memory_transport::create();

  amp::stream_config jobs{.name = "EXAMPLE_JOBS",
                          .subjects = {"example.job.*"},
                          .retention = amp::retention_policy::work_queue};
  if (auto r = transport->ensure_stream(jobs); !r) return fail("stream", r.error());
  amp::consumer_config worker{.stream = "EXAMPLE_JOBS",
                              .durable = "resize",
                              .filter_subject = "example.job.resize",
                              .ack_wait = std::chrono::seconds(30)};
  if (auto r = transport->ensure_consumer(worker); !r) return fail("consumer", r.error());
  if (auto r = transport->ensure_bucket({.bucket = "EXAMPLE_TASKS", .history = 8}); !r) {
    return fail("bucket", r.error());
  }

  constexpr int tasks = 5;
  for (int i = 1; i <= tasks; ++i) {
    std::string id = "t" + std::to_string(i);
    if (auto r = transport->kv_create("EXAMPLE_TASKS", id, "queued"); !r) {
      return fail("record task", r.error());
    }
    auto ack = transport->publish({.subject = "example.job.resize",
                                   .data = "image-" + std::to_string(i) + ".png",
                                   .headers = {{"task", id}},
                                   .msg_id = id});
    if (!ack) return fail("publish", ack.error());
    std::printf("submitted %s as job message %llu\n", id.c_str(),
                static_cast<unsigned long long>(ack->seq));
  }

  int done = 0;
  while (true) {
    auto batch = transport->fetch("EXAMPLE_JOBS", "resize", {.batch = 2});
    if (!batch) return fail("fetch", batch.error());
    if (batch->empty()) break;
    for (const auto& msg : *batch) {
      std::string id(amp::find_header(msg.headers, "task").value_or(""));
      auto record = transport->kv_get("EXAMPLE_TASKS", id);
      if (!record) return fail("read task", record.error());
      auto claimed = transport->kv_update("EXAMPLE_TASKS", id, "running", record->revision);
      if (!claimed) return fail("claim", claimed.error());
      auto completed = transport->kv_update("EXAMPLE_TASKS", id, "completed:" + msg.data, *claimed);
      if (!completed) return fail("complete", completed.error());
      if (auto r = transport->ack(msg); !r) return fail("ack", r.error());
      std::printf("worker completed %s (%s) at revision %llu\n", id.c_str(), msg.data.c_str(),
                  static_cast<unsigned long long>(*completed));
      ++done;
    }
  }

  auto info = transport->stream_info_of("EXAMPLE_JOBS");
  if (!info) return fail("stream info", info.error());
  if (done != tasks || info->state.messages != 0) {
    std::fprintf(stderr, "amp-example-memory: completed %d of %d, %llu left in the queue\n", done,
                 tasks, static_cast<unsigned long long>(info->state.messages));
    return 1;
  }
  std::printf("all %d tasks completed; the work queue is empty\n", tasks);
  return 0;
}
