#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "amp/error.hpp"
#include "amp/result.hpp"
#include "detail/wait_for.hpp"
#include "detail/write_batch.hpp"

namespace {

using amp::detail::write_batch;

// Counts its flushes; `on_flush` runs in each.
class counting_sink : public amp::detail::write_sink {
 public:
  void flush_writes() noexcept override {
    ++flushes;
    if (on_flush) on_flush();
  }
  int flushes = 0;
  std::function<void()> on_flush;
};

}  // namespace

TEST_CASE("without a write batch a sink is told to write now", "[write_batch]") {
  auto sink = std::make_shared<counting_sink>();
  CHECK_FALSE(write_batch::open());
  CHECK_FALSE(write_batch::defer(sink));
  CHECK(sink->flushes == 0);
}

TEST_CASE("a write batch flushes each deferred sink once, when the outermost batch ends",
          "[write_batch]") {
  auto a = std::make_shared<counting_sink>();
  auto b = std::make_shared<counting_sink>();
  {
    write_batch outer;
    CHECK(write_batch::open());
    CHECK(write_batch::defer(a));
    {
      write_batch inner;
      CHECK(write_batch::defer(a));
      CHECK(write_batch::defer(b));
    }
    CHECK(a->flushes == 0);
    CHECK(b->flushes == 0);
    CHECK(write_batch::defer(a));
  }
  CHECK_FALSE(write_batch::open());
  CHECK(a->flushes == 1);
  CHECK(b->flushes == 1);
  {
    write_batch next;  // a batch that defers nothing flushes nothing
  }
  CHECK(a->flushes == 1);
}

TEST_CASE("a held batch keeps its writes for the next one, at most k_max_held times in a row",
          "[write_batch]") {
  auto sink = std::make_shared<counting_sink>();
  {
    write_batch first;
    write_batch::defer(sink);
    first.hold();
  }
  CHECK(sink->flushes == 0);
  {
    write_batch second;  // not held: flushes what the first kept
  }
  CHECK(sink->flushes == 1);

  for (int i = 0; i < write_batch::k_max_held; ++i) {
    write_batch held;
    write_batch::defer(sink);
    held.hold();
  }
  CHECK(sink->flushes == 1);
  {
    write_batch one_more;
    one_more.hold();  // over the limit: flushed although held
  }
  CHECK(sink->flushes == 2);
}

TEST_CASE("write_batch::flush sends held writes at once, and a sink gone meanwhile is skipped",
          "[write_batch]") {
  auto kept = std::make_shared<counting_sink>();
  auto gone = std::make_shared<counting_sink>();
  write_batch batch;
  write_batch::defer(kept);
  write_batch::defer(gone);
  gone.reset();
  write_batch::flush();
  CHECK(kept->flushes == 1);
  write_batch::flush();
  CHECK(kept->flushes == 1);
}

TEST_CASE("writes held when a thread ends are flushed then", "[write_batch]") {
  auto sink = std::make_shared<counting_sink>();
  std::thread([&] {
    write_batch batch;
    write_batch::defer(sink);
    batch.hold();
  }).join();
  CHECK(sink->flushes == 1);
}

TEST_CASE("a blocking wait inside a write batch flushes before it waits", "[write_batch]") {
  // The answer comes only once the sink has written; without the flush the wait would last
  // until the fallback (10 s) answers with an error.
  struct answer {
    std::mutex mu;
    std::condition_variable cv;
    bool given = false;
  };
  auto once = std::make_shared<answer>();
  auto sink = std::make_shared<counting_sink>();
  write_batch batch;
  write_batch::defer(sink);
  std::thread fallback;
  auto r = amp::detail::wait_for<int>([&](std::function<void(amp::result<int>)> done) {
    auto give = [once, done](amp::result<int> v) {
      {
        std::lock_guard lock(once->mu);
        if (std::exchange(once->given, true)) return;
      }
      once->cv.notify_all();
      done(std::move(v));
    };
    sink->on_flush = [give] { give(42); };
    fallback = std::thread([once, give] {
      std::unique_lock lock(once->mu);
      if (once->cv.wait_for(lock, std::chrono::seconds(10), [&] { return once->given; })) return;
      lock.unlock();
      give(amp::unexpected(amp::errc::unavailable, "not flushed"));
    });
  });
  fallback.join();
  REQUIRE(r.has_value());
  CHECK(*r == 42);
  CHECK(sink->flushes == 1);
}

TEST_CASE("writes kept until later wait past their batches for the function, which flushes once",
          "[write_batch]") {
  auto a = std::make_shared<counting_sink>();
  auto b = std::make_shared<counting_sink>();
  auto write = write_batch::keep_until_later();
  REQUIRE(write);
  CHECK_FALSE(write_batch::keep_until_later());  // one at a time per thread
  {
    write_batch frame;
    write_batch::defer(a);
  }
  {
    write_batch frame;
    write_batch::defer(a);
    write_batch::defer(b);
  }
  CHECK(a->flushes == 0);
  CHECK(b->flushes == 0);
  std::thread(write).join();  // any thread may run it
  CHECK(a->flushes == 1);
  CHECK(b->flushes == 1);
  write();  // once only
  CHECK(a->flushes == 1);

  {
    write_batch after;  // the function ran: batches flush at their end again
    write_batch::defer(a);
  }
  CHECK(a->flushes == 2);
  auto next = write_batch::keep_until_later();
  REQUIRE(next);
  next();
}

TEST_CASE("a blocking wait flushes writes kept until later, and the function then does nothing",
          "[write_batch]") {
  auto sink = std::make_shared<counting_sink>();
  auto write = write_batch::keep_until_later();
  REQUIRE(write);
  {
    write_batch frame;
    write_batch::defer(sink);
  }
  CHECK(sink->flushes == 0);
  write_batch::flush();
  CHECK(sink->flushes == 1);
  write();
  CHECK(sink->flushes == 1);
  {
    write_batch after;
    write_batch::defer(sink);
  }
  CHECK(sink->flushes == 2);
}

TEST_CASE("writes kept until later are flushed when their thread ends before the function runs",
          "[write_batch]") {
  auto sink = std::make_shared<counting_sink>();
  std::function<void()> write;
  std::thread([&] {
    write = write_batch::keep_until_later();
    write_batch frame;
    write_batch::defer(sink);
  }).join();
  CHECK(sink->flushes == 1);
  REQUIRE(write);
  write();
  CHECK(sink->flushes == 1);
}
