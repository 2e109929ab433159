#pragma once

// Runs an asynchronous operation and waits for its completion handler: the blocking
// wrappers of the transport and of the gateway's policy. Never call it from a handler of
// the operation it waits for.

#include <future>
#include <memory>
#include <utility>

#include "amp/result.hpp"

namespace amp::detail {

template <class T, class Start>
result<T> wait_for(Start&& start) {
  auto promise = std::make_shared<std::promise<result<T>>>();
  auto future = promise->get_future();
  start([promise](result<T> r) { promise->set_value(std::move(r)); });
  return future.get();
}

}  // namespace amp::detail
