#pragma once

// Runs an asynchronous operation and waits for its completion handler: the blocking
// wrappers of the transport and of the gateway's policy. Never call it from a handler of
// the operation it waits for.

#include <condition_variable>
#include <cstddef>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "amp/result.hpp"
#include "detail/write_batch.hpp"

namespace amp::detail {

template <class T, class Start>
result<T> wait_for(Start&& start) {
  auto promise = std::make_shared<std::promise<result<T>>>();
  auto future = promise->get_future();
  start([promise](result<T> r) { promise->set_value(std::move(r)); });
  write_batch::flush();
  return future.get();
}

// Starts `n` asynchronous operations at once (`start(i, handler)` for i in 0..n) and waits
// until every handler ran: one round trip's wait for n requests sent back to back.
template <class T, class Start>
std::vector<result<T>> wait_for_all(std::size_t n, Start&& start) {
  struct state {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::optional<result<T>>> results;
    std::size_t left = 0;
  };
  auto s = std::make_shared<state>();
  s->results.resize(n);
  s->left = n;
  for (std::size_t i = 0; i < n; ++i) {
    start(i, [s, i](result<T> r) {
      std::lock_guard lock(s->mu);
      s->results[i].emplace(std::move(r));
      if (--s->left == 0) s->cv.notify_all();
    });
  }
  write_batch::flush();
  std::unique_lock lock(s->mu);
  s->cv.wait(lock, [&] { return s->left == 0; });
  std::vector<result<T>> out;
  out.reserve(n);
  for (auto& r : s->results) out.push_back(std::move(*r));
  return out;
}

}  // namespace amp::detail
