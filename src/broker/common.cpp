#include "broker/common.hpp"

#include <atomic>
#include <chrono>
#include <random>

#include <fmt/format.h>

#include "amp/json.hpp"
#include "amp/timestamp.hpp"

namespace amp {

executor inline_executor() {
  return [](std::function<void()> work) { work(); };
}

namespace detail {

worker_pool::worker_pool(std::size_t threads) {
  if (threads == 0) threads = 1;
  for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([c = core_] { run(c); });
}

worker_pool::~worker_pool() {
  {
    std::lock_guard lock(core_->mu);
    core_->stopping = true;
  }
  core_->cv.notify_all();
  for (auto& t : threads_) {
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();  // destroyed by one of its own jobs: this thread ends on its own
    } else {
      t.join();
    }
  }
}

void worker_pool::post(std::function<void()> work) {
  {
    std::lock_guard lock(core_->mu);
    core_->queue.push_back(std::move(work));
  }
  core_->cv.notify_one();
}

void worker_pool::run(const std::shared_ptr<core>& c) {
  while (true) {
    std::function<void()> work;
    {
      std::unique_lock lock(c->mu);
      c->cv.wait(lock, [&] { return c->stopping || !c->queue.empty(); });
      if (c->queue.empty()) return;
      work = std::move(c->queue.front());
      c->queue.pop_front();
    }
    work();
  }
}

result<stream_info> ensure_limits(transport& t, const stream_config& config) {
  auto r = t.ensure_stream(config);
  if (r || r.error().code() != errc::conflict) return r;
  return t.update_stream(config);
}

executor executor_for(const broker_config& config, std::shared_ptr<worker_pool>& pool) {
  if (config.run) return config.run;
  pool = std::make_shared<worker_pool>(config.workers);
  std::weak_ptr<worker_pool> weak = pool;
  return [weak](std::function<void()> work) {
    if (auto p = weak.lock()) p->post(std::move(work));
  };
}

namespace {

void append_base36(std::string& out, std::uint64_t v, int digits) {
  constexpr std::string_view k_digits = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string tmp(static_cast<std::size_t>(digits), '0');
  for (int i = digits - 1; i >= 0 && v > 0; --i) {
    tmp[static_cast<std::size_t>(i)] = k_digits[v % 36];
    v /= 36;
  }
  out += tmp;
}

}  // namespace

std::string unique_id(std::string_view prefix, time_point now) {
  static std::mutex mu;
  static std::uint64_t last_ms = 0;
  static std::uint64_t counter = 0;
  static std::mt19937_64 rng{std::random_device{}()};
  auto ms = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count());
  std::uint64_t seq = 0;
  std::uint64_t random = 0;
  {
    std::lock_guard lock(mu);
    if (ms <= last_ms) {
      ms = last_ms;  // never go back, so ids stay in creation order
      if (++counter >= 36 * 36 * 36) {
        ++ms;
        counter = 0;
      }
    } else {
      counter = 0;
    }
    last_ms = ms;
    seq = counter;
    random = rng();
  }
  std::string out(prefix);
  append_base36(out, ms, 9);
  append_base36(out, seq, 3);
  append_base36(out, random % 2821109907456ULL, 8);  // 36^8
  return out;
}

std::string dedup_id(std::string_view from, std::string_view to, std::string_view msg_id) {
  return fmt::format("{}:{}:{}", from, to, msg_id);
}

result<void> check_sealed_for(const sealed_envelope& env, const namespace_name& ns) {
  if (env.json().empty()) {
    return unexpected(errc::bad_request, "the sealed envelope is empty (its text was taken)");
  }
  if (env.get().ns == ns.view()) return {};
  return unexpected(errc::bad_request,
                    fmt::format("the envelope was sealed for namespace {}, not {}",
                                quoted(env.get().ns), quoted(ns.view())));
}

void write_task_error(json_writer& w, const std::optional<task_error>& e) {
  if (!e) {
    w.null();
    return;
  }
  w.begin_object();
  w.key("code").string(e->code);
  w.key("message").string(e->message);
  w.end_object();
}

void write_time_or_null(json_writer& w, std::string_view key, time_point t) {
  w.key(key);
  if (t == time_point{}) {
    w.null();
  } else {
    w.string(format_timestamp_chars(t).view());
  }
}

namespace {

// The checks that come before the envelope schema, in the spec's order.
result<void> check_parts(std::string_view body, std::string_view from, std::string_view reply_to) {
  if (body.empty()) return unexpected(errc::bad_request, "body is missing");
  // One JSON value and nothing else, so the body cannot add members to the envelope.
  if (auto r = json_check(body); !r) {
    return unexpected(errc::bad_request, "body: " + r.error().message());
  }
  if (from != broker_sender) {
    if (auto r = participant_name::make(from); !r) {
      return unexpected(errc::invalid_name, "from: " + r.error().message());
    }
  }
  if (!reply_to.empty()) {
    if (auto r = participant_name::make(reply_to); !r) {
      return unexpected(errc::invalid_name, "reply_to: " + r.error().message());
    }
  }
  return {};
}

}  // namespace

}  // namespace detail

result<sealed_envelope> sealed_envelope::seal(envelope_parts parts, std::string_view ns,
                                              time_point now) {
  envelope e;
  e.id = parts.msg_id.empty() ? detail::unique_id("m_", now) : std::move(parts.msg_id);
  e.from = std::move(parts.from);
  e.to = std::move(parts.to);
  e.ns = std::string(ns);
  e.type = std::move(parts.type);
  e.ts = std::chrono::time_point_cast<std::chrono::milliseconds>(now);
  e.body = std::move(parts.body);
  e.headers = std::move(parts.headers);
  e.reply_to = std::move(parts.reply_to);
  e.correlation = std::move(parts.correlation);
  e.operation = std::move(parts.operation);
  if (auto r = detail::check_parts(e.body, e.from, e.reply_to); !r) return r.error();
  auto json = to_json(e);
  auto parsed = parse_envelope(json);
  if (!parsed) return parsed.error();
  // Parsing minifies the body: the text is written again only when that changed it.
  if (*parsed != e) json = to_json(*parsed);
  return sealed_envelope(std::move(*parsed), std::move(json));
}

}  // namespace amp
