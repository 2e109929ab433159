#include "amp/transport/transport.hpp"

#include "detail/wait_for.hpp"

namespace amp {

std::optional<std::string_view> find_header(const header_list& headers, std::string_view name) {
  for (const auto& [k, v] : headers) {
    if (k == name) return std::string_view(v);
  }
  return std::nullopt;
}

result<publish_ack> transport::publish(outgoing_message msg) {
  return detail::wait_for<publish_ack>(
      [&](auto h) { async_publish(std::move(msg), std::move(h)); });
}

result<std::vector<message>> transport::fetch(std::string_view stream, std::string_view durable,
                                              fetch_request request) {
  return detail::wait_for<std::vector<message>>(
      [&](auto h) { async_fetch(stream, durable, request, std::move(h)); });
}

result<void> transport::ack(const message& msg) {
  return detail::wait_for<void>(
      [&](auto h) { async_acknowledge(msg, ack_kind::ack, duration::zero(), std::move(h)); });
}

result<void> transport::nak(const message& msg, duration delay) {
  return detail::wait_for<void>(
      [&](auto h) { async_acknowledge(msg, ack_kind::nak, delay, std::move(h)); });
}

result<void> transport::in_progress(const message& msg) {
  return detail::wait_for<void>([&](auto h) {
    async_acknowledge(msg, ack_kind::in_progress, duration::zero(), std::move(h));
  });
}

result<void> transport::term(const message& msg) {
  return detail::wait_for<void>(
      [&](auto h) { async_acknowledge(msg, ack_kind::term, duration::zero(), std::move(h)); });
}

result<kv_entry> transport::kv_get(std::string_view bucket, std::string_view key) {
  return detail::wait_for<kv_entry>([&](auto h) { async_kv_get(bucket, key, std::move(h)); });
}

result<std::uint64_t> transport::kv_create(std::string_view bucket, std::string_view key,
                                           std::string value, std::optional<duration> ttl) {
  return detail::wait_for<std::uint64_t>(
      [&](auto h) { async_kv_create(bucket, key, std::move(value), ttl, std::move(h)); });
}

result<std::uint64_t> transport::kv_update(std::string_view bucket, std::string_view key,
                                           std::string value, std::uint64_t expected_revision,
                                           std::optional<duration> ttl) {
  return detail::wait_for<std::uint64_t>([&](auto h) {
    async_kv_update(bucket, key, std::move(value), expected_revision, ttl, std::move(h));
  });
}

result<std::uint64_t> transport::kv_put(std::string_view bucket, std::string_view key,
                                        std::string value, std::optional<duration> ttl) {
  return detail::wait_for<std::uint64_t>(
      [&](auto h) { async_kv_put(bucket, key, std::move(value), ttl, std::move(h)); });
}

result<void> transport::kv_delete(std::string_view bucket, std::string_view key) {
  return detail::wait_for<void>([&](auto h) { async_kv_delete(bucket, key, std::move(h)); });
}

result<void> transport::kv_purge(std::string_view bucket, std::string_view key) {
  return detail::wait_for<void>([&](auto h) { async_kv_purge(bucket, key, std::move(h)); });
}

result<void> transport::kv_erase(std::string_view bucket, std::string_view key) {
  return detail::wait_for<void>([&](auto h) { async_kv_erase(bucket, key, std::move(h)); });
}

}  // namespace amp
