#include "amp/transport/transport.hpp"

#include <future>

namespace amp {
namespace {

// Runs an asynchronous operation and waits for its handler.
template <class T, class Start>
result<T> wait_for(Start&& start) {
  auto promise = std::make_shared<std::promise<result<T>>>();
  auto future = promise->get_future();
  start([promise](result<T> r) { promise->set_value(std::move(r)); });
  return future.get();
}

}  // namespace

std::optional<std::string_view> find_header(const header_list& headers, std::string_view name) {
  for (const auto& [k, v] : headers) {
    if (k == name) return std::string_view(v);
  }
  return std::nullopt;
}

result<publish_ack> transport::publish(outgoing_message msg) {
  return wait_for<publish_ack>([&](auto h) { async_publish(std::move(msg), std::move(h)); });
}

result<std::vector<message>> transport::fetch(std::string_view stream, std::string_view durable,
                                              fetch_request request) {
  return wait_for<std::vector<message>>(
      [&](auto h) { async_fetch(stream, durable, request, std::move(h)); });
}

result<void> transport::ack(const message& msg) {
  return wait_for<void>(
      [&](auto h) { async_acknowledge(msg, ack_kind::ack, duration::zero(), std::move(h)); });
}

result<void> transport::nak(const message& msg, duration delay) {
  return wait_for<void>(
      [&](auto h) { async_acknowledge(msg, ack_kind::nak, delay, std::move(h)); });
}

result<void> transport::in_progress(const message& msg) {
  return wait_for<void>([&](auto h) {
    async_acknowledge(msg, ack_kind::in_progress, duration::zero(), std::move(h));
  });
}

result<void> transport::term(const message& msg) {
  return wait_for<void>(
      [&](auto h) { async_acknowledge(msg, ack_kind::term, duration::zero(), std::move(h)); });
}

result<kv_entry> transport::kv_get(std::string_view bucket, std::string_view key) {
  return wait_for<kv_entry>([&](auto h) { async_kv_get(bucket, key, std::move(h)); });
}

result<std::uint64_t> transport::kv_create(std::string_view bucket, std::string_view key,
                                           std::string value, std::optional<duration> ttl) {
  return wait_for<std::uint64_t>(
      [&](auto h) { async_kv_create(bucket, key, std::move(value), ttl, std::move(h)); });
}

result<std::uint64_t> transport::kv_update(std::string_view bucket, std::string_view key,
                                           std::string value, std::uint64_t expected_revision,
                                           std::optional<duration> ttl) {
  return wait_for<std::uint64_t>([&](auto h) {
    async_kv_update(bucket, key, std::move(value), expected_revision, ttl, std::move(h));
  });
}

result<std::uint64_t> transport::kv_put(std::string_view bucket, std::string_view key,
                                        std::string value, std::optional<duration> ttl) {
  return wait_for<std::uint64_t>(
      [&](auto h) { async_kv_put(bucket, key, std::move(value), ttl, std::move(h)); });
}

result<void> transport::kv_delete(std::string_view bucket, std::string_view key) {
  return wait_for<void>([&](auto h) { async_kv_delete(bucket, key, std::move(h)); });
}

result<void> transport::kv_purge(std::string_view bucket, std::string_view key) {
  return wait_for<void>([&](auto h) { async_kv_purge(bucket, key, std::move(h)); });
}

}  // namespace amp
