// Concurrency: every member function is thread-safe. Races on one KV revision, on one
// key's creation and on one msg_id have exactly one winner; concurrent publishes get
// distinct, contiguous sequences; concurrent consumers never share a message.
//
// Catch's assertions are not thread-safe: the threads record what happened and the
// main thread checks it afterwards.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "conformance/cases/helpers.hpp"

namespace amp::conformance::cases {
namespace {

constexpr int threads_n = 8;

/// Runs `fn(i)` on `n` threads released together, and joins them.
template <class Fn>
void race(int n, Fn fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (!go.load()) std::this_thread::yield();
      fn(i);
    });
  }
  while (ready.load() < n) std::this_thread::yield();
  go = true;
  for (auto& th : threads) th.join();
}

TEST_CASE("racing kv_update on one revision: exactly one wins, the others conflict",
          "[concurrency][kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "raceupd", 10);
  auto b = create_bucket(t, c);
  const auto base = must(t.kv_put(c.bucket, "task", "queued"));

  std::vector<errc> codes(threads_n);
  std::vector<std::uint64_t> revs(threads_n, 0);
  race(threads_n, [&](int i) {
    auto r = t.kv_update(c.bucket, "task", "claimed by " + std::to_string(i), base);
    codes[static_cast<std::size_t>(i)] = code_of(r);
    if (r) revs[static_cast<std::size_t>(i)] = *r;
  });

  const auto winners = std::count(codes.begin(), codes.end(), errc{});
  const auto conflicts = std::count(codes.begin(), codes.end(), errc::conflict);
  CHECK(winners == 1);
  CHECK(conflicts == threads_n - 1);
  const auto w = static_cast<std::size_t>(
      std::distance(codes.begin(), std::find(codes.begin(), codes.end(), errc{})));
  REQUIRE(w < codes.size());
  auto e = must(t.kv_get(c.bucket, "task"));
  CHECK(e.value == "claimed by " + std::to_string(w));
  CHECK(e.revision == revs[w]);
  CHECK(must(t.kv_history(c.bucket, "task")).size() == 2);
}

TEST_CASE("racing kv_create of one key: exactly one wins", "[concurrency][kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "racecreate", 10);
  auto b = create_bucket(t, c);

  std::vector<errc> codes(threads_n);
  race(threads_n, [&](int i) {
    codes[static_cast<std::size_t>(i)] =
        code_of(t.kv_create(c.bucket, "lock", "owner " + std::to_string(i)));
  });
  CHECK(std::count(codes.begin(), codes.end(), errc{}) == 1);
  CHECK(std::count(codes.begin(), codes.end(), errc::conflict) == threads_n - 1);
  CHECK(must(t.kv_history(c.bucket, "lock")).size() == 1);
}

TEST_CASE("a chain of compare-and-set updates from many threads loses no write",
          "[concurrency][kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "racecounter");
  auto b = create_bucket(t, c);
  must(t.kv_put(c.bucket, "counter", "0"));
  constexpr int increments = 20;
  std::atomic<int> errors{0};
  race(4, [&](int) {
    for (int done = 0; done < increments;) {
      auto cur = t.kv_get(c.bucket, "counter");
      if (!cur) {
        ++errors;
        return;
      }
      auto next = std::to_string(std::stoi(cur->value) + 1);
      auto r = t.kv_update(c.bucket, "counter", next, cur->revision);
      if (r) {
        ++done;
      } else if (r.error().code() != errc::conflict) {
        ++errors;
        return;
      }
    }
  });
  CHECK(errors.load() == 0);
  CHECK(must(t.kv_get(c.bucket, "counter")).value == std::to_string(4 * increments));
}

TEST_CASE("concurrent kv_put on different keys gets distinct contiguous revisions",
          "[concurrency][kv]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto c = bucket_cfg(*fx, "raceput");
  auto b = create_bucket(t, c);
  constexpr int each = 25;
  std::mutex m;
  std::vector<std::uint64_t> revs;
  std::atomic<int> errors{0};
  race(threads_n, [&](int i) {
    for (int k = 0; k < each; ++k) {
      auto r = t.kv_put(c.bucket, "k" + std::to_string(i) + "." + std::to_string(k), "v");
      if (!r) {
        ++errors;
        continue;
      }
      std::lock_guard lock(m);
      revs.push_back(*r);
    }
  });
  CHECK(errors.load() == 0);
  std::sort(revs.begin(), revs.end());
  CHECK(revs == seq_range(1, threads_n * each));
  CHECK(must(t.kv_keys(c.bucket)).size() == static_cast<std::size_t>(threads_n * each));
}

TEST_CASE("concurrent publishes get distinct, contiguous sequences", "[concurrency][publish]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "racepub");
  sc.storage = storage_type::memory;
  auto s = create_stream(t, sc);
  constexpr int each = 25;
  std::mutex m;
  std::vector<std::uint64_t> seqs;
  std::atomic<int> errors{0};
  std::atomic<int> duplicates{0};
  race(threads_n, [&](int i) {
    for (int k = 0; k < each; ++k) {
      auto r = t.publish({.subject = subject_in(sc, "t" + std::to_string(i)),
                          .data = "x",
                          .msg_id = std::to_string(i) + "-" + std::to_string(k)});
      if (!r) {
        ++errors;
        continue;
      }
      if (r->duplicate) ++duplicates;
      std::lock_guard lock(m);
      seqs.push_back(r->seq);
    }
  });
  CHECK(errors.load() == 0);
  CHECK(duplicates.load() == 0);
  std::sort(seqs.begin(), seqs.end());
  CHECK(seqs == seq_range(1, threads_n * each));
  auto st = state_of(t, sc.name);
  CHECK(st.messages == static_cast<std::uint64_t>(threads_n * each));
  CHECK(st.last_seq == static_cast<std::uint64_t>(threads_n * each));
}

TEST_CASE("racing publishes of one msg_id store it once", "[concurrency][publish][dedup]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "raceid");
  auto s = create_stream(t, sc);
  std::vector<publish_ack> acks(threads_n);
  std::atomic<int> errors{0};
  race(threads_n, [&](int i) {
    auto r =
        t.publish({.subject = subject_in(sc, "a"), .data = std::to_string(i), .msg_id = "one"});
    if (r) {
      acks[static_cast<std::size_t>(i)] = *r;
    } else {
      ++errors;
    }
  });
  CHECK(errors.load() == 0);
  int stored = 0;
  for (const auto& a : acks) {
    CHECK(a.seq == 1);
    if (!a.duplicate) ++stored;
  }
  CHECK(stored == 1);
  CHECK(state_of(t, sc.name).messages == 1);
}

TEST_CASE("concurrent fetches from one work-queue consumer never share a message",
          "[concurrency][consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "racefetch", retention_policy::work_queue);
  sc.storage = storage_type::memory;
  auto s = create_stream(t, sc);
  constexpr std::uint64_t total = 200;
  for (std::uint64_t i = 0; i < total; ++i) publish_ok(t, subject_in(sc, "job"));
  auto c = consumer_cfg(*fx, sc);  // ack_wait 30 s: nothing is redelivered during the case
  must(t.ensure_consumer(c));

  std::mutex m;
  std::vector<std::uint64_t> got;
  std::atomic<std::uint64_t> acked{0};
  std::atomic<int> errors{0};
  const auto deadline = std::chrono::steady_clock::now() + prompt_timeout;
  race(4, [&](int) {
    while (acked.load() < total && std::chrono::steady_clock::now() < deadline) {
      auto r = t.fetch(sc.name, c.durable, {.batch = 3, .max_wait = 0s});
      if (!r) {
        ++errors;
        return;
      }
      for (const auto& msg : *r) {
        {
          std::lock_guard lock(m);
          got.push_back(msg.seq);
        }
        if (t.ack(msg)) {
          ++acked;
        } else {
          ++errors;
        }
      }
      if (r->empty()) std::this_thread::yield();
    }
  });
  CHECK(errors.load() == 0);
  std::sort(got.begin(), got.end());
  CHECK(got == seq_range(1, total));  // each once: no message went to two fetches
  CHECK(state_of(t, sc.name).messages == 0);
  CHECK(info_of(t, c).num_ack_pending == 0);
}

TEST_CASE("two work-queue consumers with disjoint filters split a concurrent stream",
          "[concurrency][consumers]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "racesplit", retention_policy::work_queue);
  sc.storage = storage_type::memory;
  auto s = create_stream(t, sc);
  auto ca = consumer_cfg(*fx, sc, subject_in(sc, "a"));
  auto cb = consumer_cfg(*fx, sc, subject_in(sc, "b"));
  must(t.ensure_consumer(ca));
  must(t.ensure_consumer(cb));
  constexpr int each = 50;

  std::mutex m;
  std::vector<std::string> seen_a, seen_b;
  std::atomic<int> errors{0};
  std::atomic<int> published{0};
  const auto deadline = std::chrono::steady_clock::now() + prompt_timeout;
  race(4, [&](int i) {
    if (i < 2) {  // publishers: thread 0 to a, thread 1 to b
      const std::string which = i == 0 ? "a" : "b";
      for (int k = 0; k < each; ++k) {
        if (t.publish({.subject = subject_in(sc, which), .data = which + std::to_string(k)})) {
          ++published;
        } else {
          ++errors;
        }
      }
      return;
    }
    const auto& c = i == 2 ? ca : cb;
    auto& seen = i == 2 ? seen_a : seen_b;
    int received = 0;
    while (received < each && std::chrono::steady_clock::now() < deadline) {
      auto r = t.fetch(c.stream, c.durable, {.batch = 10, .max_wait = 0s});
      if (!r) {
        ++errors;
        return;
      }
      for (const auto& msg : *r) {
        ++received;
        {
          std::lock_guard lock(m);
          seen.push_back(msg.data);
        }
        if (!t.ack(msg)) ++errors;
      }
      if (r->empty()) std::this_thread::yield();
    }
  });
  CHECK(errors.load() == 0);
  CHECK(published.load() == 2 * each);
  REQUIRE(seen_a.size() == static_cast<std::size_t>(each));
  REQUIRE(seen_b.size() == static_cast<std::size_t>(each));
  for (int k = 0; k < each; ++k) {
    CHECK(seen_a[static_cast<std::size_t>(k)] == "a" + std::to_string(k));
    CHECK(seen_b[static_cast<std::size_t>(k)] == "b" + std::to_string(k));
  }
  CHECK(state_of(t, sc.name).messages == 0);
}

TEST_CASE("concurrent acks, naks and in_progress on one consumer keep its counts right",
          "[concurrency][acks]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "raceacks", retention_policy::work_queue);
  auto s = create_stream(t, sc);
  constexpr std::uint64_t total = 40;
  for (std::uint64_t i = 0; i < total; ++i) publish_ok(t, subject_in(sc, "job"));
  auto c = consumer_cfg(*fx, sc);
  c.max_ack_pending = -1;
  must(t.ensure_consumer(c));
  auto ms = fetch_now(t, c, total);
  REQUIRE(ms.size() == total);

  std::atomic<int> errors{0};
  race(threads_n, [&](int i) {
    for (std::size_t k = static_cast<std::size_t>(i); k < ms.size(); k += threads_n) {
      if (!t.in_progress(ms[k])) ++errors;
      // Every other message is nak'd first, then acked in its redelivery below.
      if (k % 2 == 0) {
        if (!t.ack(ms[k])) ++errors;
      } else if (!t.nak(ms[k])) {
        ++errors;
      }
    }
  });
  CHECK(errors.load() == 0);
  CHECK(state_of(t, sc.name).messages == total / 2);
  auto redelivered = fetch_now(t, c, total);
  REQUIRE(redelivered.size() == total / 2);
  for (const auto& m : redelivered) {
    CHECK(m.seq % 2 == 0);  // the odd positions: seq = index + 1
    CHECK(m.delivery_count == 2);
    must(t.ack(m));
  }
  CHECK(state_of(t, sc.name).messages == 0);
  CHECK(info_of(t, c).num_ack_pending == 0);
}

TEST_CASE("watch callbacks run one at a time, in revision order, under concurrent writes",
          "[concurrency][kv][watch]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  // History large enough that no revision is gone before the watcher sees it: a watcher
  // that falls behind may miss revisions the bucket no longer keeps.
  auto c = bucket_cfg(*fx, "racewatch", 64);
  auto b = create_bucket(t, c);
  constexpr int each = 25;
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  collector<kv_entry> log;
  auto w = must(t.kv_watch(c.bucket, {.updates_only = true},
                           {.on_entry =
                                [&](const kv_entry& e) {
                                  if (inside.fetch_add(1) != 0) overlapped = true;
                                  log.add(e);
                                  std::this_thread::yield();
                                  inside.fetch_sub(1);
                                },
                            .on_caught_up = [] {}}));
  std::atomic<int> errors{0};
  race(threads_n, [&](int i) {
    for (int k = 0; k < each; ++k) {
      if (!t.kv_put(c.bucket, "k" + std::to_string(i), std::to_string(k))) ++errors;
    }
  });
  CHECK(errors.load() == 0);
  bool all = log.wait_for(threads_n * each);
  if (!all) {
    std::string got;
    for (const auto& e : log.items()) got += std::to_string(e.revision) + " ";
    UNSCOPED_INFO("revisions seen: " << got);
  }
  REQUIRE(all);
  w->stop();
  CHECK_FALSE(overlapped.load());
  auto es = log.items();
  std::vector<std::uint64_t> revs;
  for (const auto& e : es) revs.push_back(e.revision);
  CHECK(revs == seq_range(1, threads_n * each));
}

TEST_CASE("replay callbacks run one at a time under concurrent publishing",
          "[concurrency][replay]") {
  auto fx = make_fixture();
  auto& t = fx->transport();
  auto sc = stream_cfg(*fx, "racereplay");
  sc.storage = storage_type::memory;
  auto s = create_stream(t, sc);
  constexpr int each = 25;
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  replay_log log;
  auto sub = must(
      t.subscribe_ordered({.stream = sc.name, .start = deliver_policy::all}, [&](const message& m) {
        if (inside.fetch_add(1) != 0) overlapped = true;
        log.add(m);
        std::this_thread::yield();
        inside.fetch_sub(1);
      }));
  std::atomic<int> errors{0};
  race(threads_n, [&](int i) {
    for (int k = 0; k < each; ++k) {
      if (!t.publish({.subject = subject_in(sc, "p" + std::to_string(i)), .data = "x"})) ++errors;
    }
  });
  CHECK(errors.load() == 0);
  REQUIRE(log.wait_for(threads_n * each));
  sub->stop();
  CHECK_FALSE(overlapped.load());
  CHECK(log.seqs() == seq_range(1, threads_n * each));
}

}  // namespace
}  // namespace amp::conformance::cases
