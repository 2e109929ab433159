// A producer and two workers in one process, on the broker primitives of amp.
//
// The producer submits tasks of job "resize" and reads its inbox, where the broker tells
// it when each task ends. Each worker registers for the job, takes offers, claims them,
// and completes them (worker w2 fails its first attempt of every third task, which the
// job queue retries). Leases, attempts and commit-then-ack are the broker's business.
//
// Run: build/bin/amp-example-jobs                  (embedded memory transport)
//      build/bin/amp-example-jobs --nats URL       (a nats-server with JetStream)
// Exits 0 when every task completed exactly once.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "amp/broker/broker.hpp"
#include "amp/transport/jetstream.hpp"
#include "amp/transport/memory.hpp"

namespace {

int fail(const char* what, const amp::error& e) {
  std::fprintf(stderr, "amp-example-jobs: %s: %s\n", what, e.to_string().c_str());
  return 1;
}

// One worker: register, then fetch offers for its free slots, claim, work, complete.
void work(amp::broker& b, const std::string& name, std::atomic<bool>& stop) {
  auto me = *amp::participant_name::make(name);
  auto job = *amp::job_name::make("resize");
  if (auto r = b.registry().register_participant(me, {job}, 2, R"({"gpu":false})"); !r) {
    std::fprintf(stderr, "%s: register: %s\n", name.c_str(), r.error().to_string().c_str());
    return;
  }
  int seen = 0;
  while (!stop) {
    auto offers = b.jobs().fetch(job, 2, std::chrono::milliseconds(200));
    if (!offers) continue;  // unavailable: try again
    for (const auto& o : *offers) {
      auto lease = b.jobs().claim(o, me);
      if (!lease) continue;  // another worker won it, or it moved on
      auto task = lease->task;
      if (name == "w2" && lease->attempt == 1 && ++seen % 3 == 0) {
        (void)b.jobs().fail(task, me, {"busy", "try again"}, true, std::chrono::milliseconds(10));
        std::printf("%s: attempt 1 of %s failed, to be retried\n", name.c_str(),
                    task.str().c_str());
        continue;
      }
      auto result = "{\"resized\":" + o.env.body + ",\"by\":\"" + name + "\"}";
      if (auto r = b.jobs().complete(task, me, result); r) {
        std::printf("%s: completed %s (attempt %d)\n", name.c_str(), task.str().c_str(),
                    lease->attempt);
      }
    }
    (void)b.registry().heartbeat(me);
  }
  (void)b.registry().leave(me);
}

}  // namespace

int main(int argc, char** argv) {
  std::shared_ptr<amp::transport> transport;
  if (argc == 3 && std::strcmp(argv[1], "--nats") == 0) {
    auto js = amp::jetstream_transport::connect({.url = argv[2]});
    if (!js) return fail("connect", js.error());
    transport = *js;
  } else if (argc == 1) {
    transport = amp::memory_transport::create();  // the one line that differs
  } else {
    std::fprintf(stderr, "usage: amp-example-jobs [--nats URL]\n");
    return 2;
  }

  auto opened = amp::broker::open(transport, {.ns = *amp::namespace_name::make("example")});
  if (!opened) return fail("open broker", opened.error());
  auto b = *opened;

  auto producer = *amp::participant_name::make("producer");
  std::mutex mu;
  std::condition_variable cv;
  std::set<std::string> ended;  // notice ids: "<task>.completed"
  std::atomic<amp::inbox_reader*> inbox{nullptr};
  auto reader = b->inbox().attach(producer, [&](const amp::inbox_message& m) {
    {
      std::lock_guard lock(mu);
      if (m.env.from == amp::broker_sender && m.env.type == "amp.task.completed") {
        ended.insert(m.env.id);
      }
    }
    cv.notify_all();
    if (auto* r = inbox.load()) r->async_ack(m.seq, [](amp::result<void>) {});
  });
  if (!reader) return fail("attach", reader.error());
  inbox = reader->get();

  std::atomic<bool> stop{false};
  std::thread w1([&] { work(*b, "w1", stop); });
  std::thread w2([&] { work(*b, "w2", stop); });

  constexpr int k_tasks = 12;
  std::set<std::string> submitted;
  for (int i = 1; i <= k_tasks; ++i) {
    auto r = b->jobs().submit({.job = *amp::job_name::make("resize"),
                               .from = producer,
                               .body = std::to_string(i * 100),
                               .idempotency_key = "image-" + std::to_string(i)});
    if (!r) return fail("submit", r.error());
    submitted.insert(r->task.str());
    std::printf("producer: submitted %s\n", r->task.str().c_str());
  }

  bool all = false;
  {
    std::unique_lock lock(mu);
    all = cv.wait_for(lock, std::chrono::seconds(30),
                      [&] { return ended.size() >= static_cast<std::size_t>(k_tasks); });
  }
  stop = true;
  w1.join();
  w2.join();
  inbox = nullptr;
  reader->reset();

  int exactly_once = 0;
  for (const auto& id : submitted) {
    auto rec = b->tasks().get(b->config().ns, *amp::task_id::make(id));
    if (rec && rec->state == amp::task_state::completed) ++exactly_once;
  }
  std::printf("producer: %zu completion notices, %d of %d tasks completed\n", ended.size(),
              exactly_once, k_tasks);
  return all && exactly_once == k_tasks && ended.size() == static_cast<std::size_t>(k_tasks) ? 0
                                                                                             : 1;
}
