#include "amp/transport/transport.hpp"

#include "amp/subjects.hpp"
#include "detail/guarded.hpp"
#include "detail/wait_for.hpp"
#include "transport/stream_rules.hpp"

namespace amp {

namespace {

result<void> names(std::string_view stream) {
  return subjects::check_stream_name(stream);
}

result<void> names(std::string_view stream, std::string_view durable) {
  if (auto r = subjects::check_stream_name(stream); !r) return r;
  return subjects::check_consumer_name(durable);
}

result<void> kv_names(std::string_view bucket, std::string_view key) {
  if (auto r = subjects::check_bucket_name(bucket); !r) return r;
  return subjects::check_kv_key(key);
}

// A write's key, and its per-key TTL: positive, and supported by `t`.
result<void> kv_write(const transport& t, std::string_view bucket, std::string_view key,
                      std::optional<duration> ttl) {
  if (auto r = kv_names(bucket, key); !r) return r;
  if (!ttl) return {};
  if (auto caps = t.caps(); !caps.per_key_ttl) {
    return unexpected(errc::bad_request,
                      caps.backend == "jetstream"
                          ? "per-key TTL is not supported by this NATS server (needs 2.11)"
                          : "per-key TTL is not supported by this transport");
  }
  if (*ttl <= duration::zero()) {
    return unexpected(errc::bad_request, "per-key ttl must be positive");
  }
  return {};
}

}  // namespace

void transport::handler_threw(std::string_view where) noexcept {
  detail::report_current_exception({}, where);
}

// Answers `done` with the check's error, reporting what the handler throws.
template <class T>
bool transport::refused(result<void> check, completion<T>& done, std::string_view where) {
  if (check) return false;
  try {
    done(std::move(check).error());
  } catch (...) {
    handler_threw(where);
  }
  return true;
}

result<stream_info> transport::ensure_stream(const stream_config& config) {
  if (auto r = detail::validate(config); !r) return r.error();
  return do_ensure_stream(config);
}

result<stream_info> transport::update_stream(const stream_config& config) {
  if (auto r = detail::validate(config); !r) return r.error();
  return do_update_stream(config);
}

result<stream_info> transport::stream_info_of(std::string_view stream) {
  if (auto r = names(stream); !r) return r.error();
  return do_stream_info_of(stream);
}

result<std::map<std::string, std::uint64_t>> transport::stream_subjects(std::string_view stream,
                                                                        std::string_view filter) {
  if (auto r = names(stream); !r) return r.error();
  if (auto r = subjects::check_filter(filter); !r) return r.error();
  return do_stream_subjects(stream, filter);
}

result<std::vector<std::string>> transport::consumer_names(std::string_view stream) {
  if (auto r = names(stream); !r) return r.error();
  return do_consumer_names(stream);
}

result<void> transport::delete_stream(std::string_view stream) {
  if (auto r = names(stream); !r) return r;
  return do_delete_stream(stream);
}

result<message> transport::get_message(std::string_view stream, std::uint64_t seq) {
  if (auto r = names(stream); !r) return r.error();
  return do_get_message(stream, seq);
}

result<message> transport::get_last_message(std::string_view stream,
                                            std::string_view subject_filter) {
  if (auto r = names(stream); !r) return r.error();
  if (auto r = subjects::check_filter(subject_filter); !r) return r.error();
  return do_get_last_message(stream, subject_filter);
}

void transport::async_delete_message(std::string_view stream, std::uint64_t seq,
                                     completion<void> done) {
  if (refused(names(stream), done, "delete_message")) return;
  do_async_delete_message(stream, seq, std::move(done));
}

result<void> transport::delete_message(std::string_view stream, std::uint64_t seq) {
  return detail::wait_for<void>([&](auto h) { async_delete_message(stream, seq, std::move(h)); });
}

void transport::async_publish(outgoing_message msg, completion<publish_ack> done) {
  if (refused(subjects::check_subject(msg.subject), done, "publish")) return;
  do_async_publish(std::move(msg), std::move(done));
}

result<consumer_info> transport::ensure_consumer(const consumer_config& config) {
  if (auto r = detail::validate(config); !r) return r.error();
  return do_ensure_consumer(config);
}

result<consumer_info> transport::update_consumer(const consumer_config& config) {
  if (auto r = detail::validate(config); !r) return r.error();
  return do_update_consumer(config);
}

result<consumer_info> transport::consumer_info_of(std::string_view stream,
                                                  std::string_view durable) {
  if (auto r = names(stream, durable); !r) return r.error();
  return do_consumer_info_of(stream, durable);
}

result<void> transport::delete_consumer(std::string_view stream, std::string_view durable) {
  if (auto r = names(stream, durable); !r) return r;
  return do_delete_consumer(stream, durable);
}

void transport::async_fetch(std::string_view stream, std::string_view durable,
                            fetch_request request, completion<std::vector<message>> done) {
  if (refused(names(stream, durable), done, "fetch")) return;
  if (refused(request.batch > 0 ? result<void>()
                                : unexpected(errc::bad_request, "fetch batch must be at least 1"),
              done, "fetch"))
    return;
  do_async_fetch(stream, durable, request, std::move(done));
}

void transport::async_acknowledge(const message& msg, ack_kind kind, duration nak_delay,
                                  completion<void> done) {
  do_async_acknowledge(msg, kind, nak_delay, std::move(done));
}

void transport::acknowledge(const message& msg, ack_kind kind, duration nak_delay) {
  do_acknowledge(msg, kind, nak_delay);
}

void transport::do_acknowledge(const message& msg, ack_kind kind, duration nak_delay) {
  do_async_acknowledge(msg, kind, nak_delay, [](result<void>) {});
}

result<std::unique_ptr<subscription>> transport::subscribe_ordered(
    const replay_request& request, std::function<void(const message&)> on_message) {
  if (auto r = names(request.stream); !r) return r.error();
  if (!request.filter_subject.empty()) {
    if (auto r = subjects::check_filter(request.filter_subject); !r) return r.error();
  }
  if (!on_message) return unexpected(errc::bad_request, "subscribe_ordered needs a callback");
  return do_subscribe_ordered(request, std::move(on_message));
}

result<void> transport::publish_core(outgoing_message msg) {
  if (auto r = subjects::check_subject(msg.subject); !r) return r;
  return do_publish_core(std::move(msg));
}

result<std::unique_ptr<subscription>> transport::subscribe_core(
    std::string_view subject_filter, std::function<void(const message&)> on_message) {
  if (auto r = subjects::check_filter(subject_filter); !r) return r.error();
  if (!on_message) return unexpected(errc::bad_request, "subscribe_core needs a callback");
  return do_subscribe_core(subject_filter, std::move(on_message));
}

result<void> transport::ensure_bucket(const kv_config& config) {
  if (auto r = detail::validate(config); !r) return r;
  return do_ensure_bucket(config);
}

result<void> transport::delete_bucket(std::string_view bucket) {
  if (auto r = subjects::check_bucket_name(bucket); !r) return r;
  return do_delete_bucket(bucket);
}

void transport::async_kv_get(std::string_view bucket, std::string_view key,
                             completion<kv_entry> done) {
  if (refused(kv_names(bucket, key), done, "kv_get")) return;
  do_async_kv_get(bucket, key, std::move(done));
}

void transport::async_kv_create(std::string_view bucket, std::string_view key, std::string value,
                                std::optional<duration> ttl, completion<std::uint64_t> done) {
  if (refused(kv_write(*this, bucket, key, ttl), done, "kv_create")) return;
  do_async_kv_create(bucket, key, std::move(value), ttl, std::move(done));
}

void transport::async_kv_update(std::string_view bucket, std::string_view key, std::string value,
                                std::uint64_t expected_revision, std::optional<duration> ttl,
                                completion<std::uint64_t> done) {
  if (refused(kv_write(*this, bucket, key, ttl), done, "kv_update")) return;
  if (refused(expected_revision > 0 ? result<void>()
                                    : unexpected(errc::bad_request,
                                                 "update needs an expected revision of at least 1"),
              done, "kv_update"))
    return;
  do_async_kv_update(bucket, key, std::move(value), expected_revision, ttl, std::move(done));
}

void transport::async_kv_put(std::string_view bucket, std::string_view key, std::string value,
                             std::optional<duration> ttl, completion<std::uint64_t> done) {
  if (refused(kv_write(*this, bucket, key, ttl), done, "kv_put")) return;
  do_async_kv_put(bucket, key, std::move(value), ttl, std::move(done));
}

void transport::async_kv_delete(std::string_view bucket, std::string_view key,
                                completion<void> done) {
  if (refused(kv_names(bucket, key), done, "kv_delete")) return;
  do_async_kv_delete(bucket, key, std::move(done));
}

void transport::async_kv_purge(std::string_view bucket, std::string_view key,
                               completion<void> done) {
  if (refused(kv_names(bucket, key), done, "kv_purge")) return;
  do_async_kv_purge(bucket, key, std::move(done));
}

void transport::async_kv_erase(std::string_view bucket, std::string_view key,
                               completion<void> done) {
  if (refused(kv_names(bucket, key), done, "kv_erase")) return;
  do_async_kv_erase(bucket, key, std::move(done));
}

result<std::vector<std::string>> transport::kv_keys(std::string_view bucket) {
  if (auto r = subjects::check_bucket_name(bucket); !r) return r.error();
  return do_kv_keys(bucket);
}

result<std::vector<kv_entry>> transport::kv_history(std::string_view bucket, std::string_view key) {
  if (auto r = kv_names(bucket, key); !r) return r.error();
  return do_kv_history(bucket, key);
}

result<std::unique_ptr<subscription>> transport::kv_watch(std::string_view bucket,
                                                          const kv_watch_options& options,
                                                          kv_watch_handlers handlers) {
  if (auto r = subjects::check_bucket_name(bucket); !r) return r.error();
  if (!options.key_filter.empty()) {
    if (auto r = subjects::check_filter(options.key_filter); !r) return r.error();
  }
  if (!handlers.on_entry) return unexpected(errc::bad_request, "kv_watch needs on_entry");
  return do_kv_watch(bucket, options, std::move(handlers));
}

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
