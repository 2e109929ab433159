#include "amp/client.hpp"

#include <simdjson.h>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <atomic>
#include <cctype>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "amp/json.hpp"
#include "amp/timestamp.hpp"
#include "ws_link.hpp"

namespace amp {

namespace dom = simdjson::dom;

// ---------------------------------------------------------------------------------------
// client_frame

struct client_frame::impl {
  std::string text;
  std::string op;
  dom::document doc;
  bool is_object = false;  // doc holds the parsed frame
  std::string parse_error;
};

struct detail::client_frame_access {
  using impl = client_frame::impl;

  /// Parses `text` into a frame; text that is not a JSON object gives a frame that reads
  /// nothing, with the reason in `parse_error`.
  static std::shared_ptr<impl> parse(std::string text) {
    auto p = std::make_shared<impl>();
    p->text = std::move(text);
    // simdjson reads up to SIMDJSON_PADDING bytes past the end; with the capacity there it
    // parses in place instead of copying.
    p->text.reserve(p->text.size() + simdjson::SIMDJSON_PADDING);
    thread_local dom::parser parser;
    dom::element root;
    if (auto err = parser.parse_into_document(p->doc, p->text).get(root)) {
      p->parse_error = std::string("not valid JSON: ") + simdjson::error_message(err);
      return p;
    }
    if (!root.is_object()) {
      p->parse_error = "not a JSON object";
      return p;
    }
    p->is_object = true;
    std::string_view op;
    if (!root["op"].get(op)) p->op = op;
    return p;
  }

  static client_frame make(std::shared_ptr<const impl> p) { return client_frame(std::move(p)); }

  static std::optional<dom::element> at(const client_frame& f, std::string_view pointer) {
    const impl* p = f.impl_.get();
    if (p == nullptr || !p->is_object) return std::nullopt;
    dom::element e;
    if (p->doc.root().at_pointer(pointer).get(e)) return std::nullopt;
    return e;
  }
};

namespace {

using access = detail::client_frame_access;

const std::string& empty_string() {
  static const std::string empty;
  return empty;
}

}  // namespace

client_frame::client_frame() = default;

client_frame::client_frame(std::shared_ptr<const impl> p) noexcept : impl_(std::move(p)) {}

result<client_frame> client_frame::parse(std::string text) {
  auto p = access::parse(std::move(text));
  if (!p->is_object) return unexpected(errc::bad_request, p->parse_error);
  return client_frame(std::move(p));
}

const std::string& client_frame::text() const noexcept {
  return impl_ ? impl_->text : empty_string();
}

const std::string& client_frame::op() const noexcept {
  return impl_ ? impl_->op : empty_string();
}

bool client_frame::has(std::string_view pointer) const {
  return access::at(*this, pointer).has_value();
}

std::optional<std::string> client_frame::string_at(std::string_view pointer) const {
  auto e = access::at(*this, pointer);
  std::string_view s;
  if (!e || e->get(s)) return std::nullopt;
  return std::string(s);
}

std::optional<std::int64_t> client_frame::int_at(std::string_view pointer) const {
  auto e = access::at(*this, pointer);
  std::int64_t v = 0;
  if (!e || e->get(v)) return std::nullopt;
  return v;
}

std::optional<double> client_frame::number_at(std::string_view pointer) const {
  auto e = access::at(*this, pointer);
  double v = 0;
  if (!e || !e->is_number() || e->get(v)) return std::nullopt;
  return v;
}

std::optional<bool> client_frame::bool_at(std::string_view pointer) const {
  auto e = access::at(*this, pointer);
  bool v = false;
  if (!e || e->get(v)) return std::nullopt;
  return v;
}

std::optional<std::string> client_frame::raw_at(std::string_view pointer) const {
  auto e = access::at(*this, pointer);
  if (!e) return std::nullopt;
  return simdjson::minify(*e);
}

std::optional<std::size_t> client_frame::size_at(std::string_view pointer) const {
  auto e = access::at(*this, pointer);
  if (!e) return std::nullopt;
  dom::array a;
  if (!e->get(a)) return a.size();
  dom::object o;
  if (!e->get(o)) return o.size();
  return std::nullopt;
}

std::string client_frame::result_json() const {
  json_writer w;
  w.begin_object();
  if (auto root = access::at(*this, "")) {
    for (auto field : dom::object(*root)) {
      if (field.key == "op" || field.key == "id") continue;
      w.key(field.key).raw(simdjson::minify(field.value));
    }
  }
  w.end_object();
  return w.take();
}

// ---------------------------------------------------------------------------------------
// subscribe_from

result<subscribe_from> subscribe_from::parse(std::string_view text) {
  if (text == "new") return subscribe_from{};
  if (text == "all") return subscribe_from{kind::all, 0, {}};
  if (text == "last") return subscribe_from{kind::last, 0, {}};
  if (text.starts_with("seq:")) {
    const auto digits = text.substr(4);
    std::int64_t n = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size() || n < 1) {
      return unexpected(errc::bad_request, "seq:N needs a sequence number N >= 1, not \"" +
                                               std::string(digits) + "\"");
    }
    return at_seq(n);
  }
  if (text.starts_with("time:")) {
    const auto stamp = text.substr(5);
    if (auto t = parse_timestamp(stamp); !t) return t.error();
    return at_time(std::string(stamp));
  }
  return unexpected(errc::bad_request, "expected new, all, last, seq:N or time:RFC3339, not \"" +
                                           std::string(text) + "\"");
}

std::string subscribe_from::to_json() const {
  json_writer w;
  switch (from) {
    case kind::new_events: w.string("new"); break;
    case kind::all: w.string("all"); break;
    case kind::last: w.string("last"); break;
    case kind::seq: w.begin_object().key("seq").integer(seq).end_object(); break;
    case kind::time: w.begin_object().key("time").string(time).end_object(); break;
  }
  return w.take();
}

// ---------------------------------------------------------------------------------------
// client

namespace {

using steady = std::chrono::steady_clock;

/// "10 s", "0.25 s": a duration for messages.
std::string seconds_text(duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", std::chrono::duration<double>(d).count());
  return buf;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool starts_with_nocase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  }
  return true;
}

/// The error an `error` reply carries.
error error_from_reply(const client_frame& f) {
  const auto code_text = f.string_at("/code").value_or("");
  auto message = f.string_at("/message").value_or("");
  auto code = errc_from_string(code_text);
  if (!code) {
    message = "the server answered with the unknown error code \"" + code_text + "\": " + message;
  }
  if (auto retry = f.int_at("/retry_after_ms")) {
    message += " (retry after " + std::to_string(*retry) + " ms)";
  }
  return error(code.value_or(errc::internal), std::move(message),
               f.string_at("/path").value_or(""));
}

/// `json` unless it is not one JSON value: `bad_request` naming `what`.
result<void> check_json(std::string_view what, std::string_view json) {
  if (auto r = json_check(json); !r) {
    return unexpected(errc::bad_request, std::string(what) + ": " + r.error().message());
  }
  return {};
}

result<void> check_object(std::string_view what, std::string_view json) {
  if (auto r = check_json(what, json); !r) return r;
  if (trim(json).front() != '{') {
    return unexpected(errc::bad_request, std::string(what) + ": not a JSON object");
  }
  return {};
}

/// A reply slot that a blocking request waits on.
struct waiter {
  std::mutex mutex;
  std::condition_variable cv;
  std::optional<result<client_frame>> value;

  void set(result<client_frame> r) {
    {
      std::lock_guard lock(mutex);
      if (value) return;
      value.emplace(std::move(r));
    }
    cv.notify_all();
  }
  /// True when a value came by `deadline`.
  bool wait_until(steady::time_point deadline) {
    std::unique_lock lock(mutex);
    return cv.wait_until(lock, deadline, [&] { return value.has_value(); });
  }
  void wait() {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return value.has_value(); });
  }
};

// How long close() and the destructor wait for the closing handshake.
constexpr auto k_close_wait = std::chrono::milliseconds(1500);

}  // namespace

struct client::impl {
  explicit impl(client_options o) : options(std::move(o)), work(asio::make_work_guard(io)) {}

  ~impl() { shutdown(); }

  struct pending_request {
    std::string op;
    reply_handler done;
    std::shared_ptr<asio::steady_timer> timer;  // set once the frame is sent
  };
  enum class link_state { connecting, open, closed };

  client_options options;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  std::unique_ptr<client_detail::link> link;  // after io: destroyed before it
  std::thread thread;
  std::atomic<std::thread::id> io_thread_id{};

  // Written by connect() before the client is handed out; read-only afterwards.
  client_frame welcome;
  std::string participant, ns, session, server;
  int heartbeat_s = 0;
  int registry_ttl_s = 0;
  std::atomic<std::size_t> max_frame_bytes{0};  // 0: unknown, not checked
  steady::time_point connect_deadline;
  std::shared_ptr<waiter> hello;

  std::atomic<std::int64_t> next_id{1};

  mutable std::mutex mutex;
  mutable std::condition_variable closed_cv;
  link_state state = link_state::connecting;
  bool closed_by_us = false;
  std::optional<int> close_code;
  std::string close_reason;
  close_handler on_closed;
  std::unordered_map<std::int64_t, pending_request> pending;

  // I/O thread only.
  push_handler on_push;
  std::deque<client_frame> unhandled;

  bool on_io_thread() const noexcept { return std::this_thread::get_id() == io_thread_id.load(); }

  /// `{"op":…[,"id":…][,fields]}`, checked to be JSON and to fit the server's limit.
  result<std::string> make_frame(std::string_view op, std::optional<std::int64_t> id,
                                 std::string_view fields) const {
    fields = trim(fields);
    if (fields.size() >= 2 && fields.front() == '{' && fields.back() == '}') {
      fields = trim(fields.substr(1, fields.size() - 2));
    }
    std::string frame;
    frame.reserve(fields.size() + op.size() + 40);
    frame.append("{\"op\":").append(json_quote(op));
    if (id) frame.append(",\"id\":").append(std::to_string(*id));
    if (!fields.empty()) frame.append(",").append(fields);
    frame.append("}");
    if (auto r = json_check(frame); !r) {
      return unexpected(errc::bad_request, "the fields of " + std::string(op) +
                                               " do not make a JSON frame: " + r.error().message());
    }
    const auto limit = max_frame_bytes.load();
    if (limit != 0 && frame.size() > limit) {
      return unexpected(errc::payload_too_large,
                        "a frame of " + std::to_string(frame.size()) +
                            " bytes is over the server's max_frame_bytes (" +
                            std::to_string(limit) + ")");
    }
    return frame;
  }

  /// Why requests fail now that the connection is closed. Under `mutex`.
  std::string closed_message() const {
    if (!close_code) return "the connection is closed";
    std::string m = closed_by_us ? "the connection was closed (code "
                                 : "the server closed the connection (code ";
    m += std::to_string(*close_code);
    if (!close_reason.empty()) m += ": " + close_reason;
    return m + ")";
  }

  /// The error of a request that the close of the connection ended. Under `mutex`.
  error closed_error(const pending_request& p) const {
    if (p.op == "hello" && !closed_by_us && close_code) {
      if (*close_code == 4401) return error(errc::unauthenticated, closed_message());
      if (*close_code == 1013) return error(errc::limit_exceeded, closed_message());
    }
    return error(errc::unavailable, closed_message() + " before " + p.op + " was answered");
  }

  /// Registers a request and sends its frame from the I/O thread; `done` gets the reply,
  /// the timeout, or the close.
  void start_request(std::string op, std::int64_t id, std::string frame, duration timeout,
                     reply_handler done) {
    {
      std::unique_lock lock(mutex);
      if (state == link_state::closed) {
        error e(errc::unavailable, closed_message());
        lock.unlock();
        done(std::move(e));
        return;
      }
      pending.emplace(id, pending_request{std::move(op), std::move(done), nullptr});
    }
    asio::post(io, [this, id, frame = std::move(frame), timeout] {
      if (auto sent = link->send(frame, false); !sent) {
        std::unique_lock lock(mutex);
        error e(errc::unavailable,
                state == link_state::closed ? closed_message() : sent.error().message());
        lock.unlock();
        if (auto p = take(id)) p->done(std::move(e));
        return;
      }
      auto timer = std::make_shared<asio::steady_timer>(io, timeout);
      timer->async_wait([this, id, timeout](const asio::error_code& ec) {
        if (ec) return;
        if (auto p = take(id)) {
          p->done(error(errc::unavailable,
                        "no reply to " + p->op + " within " + seconds_text(timeout)));
        }
      });
      std::lock_guard lock(mutex);
      if (auto it = pending.find(id); it != pending.end()) {
        it->second.timer = std::move(timer);
      } else {
        timer->cancel();
      }
    });
  }

  /// Removes a pending request; `std::nullopt` when it was answered, timed out or failed.
  std::optional<pending_request> take(std::int64_t id) {
    std::optional<pending_request> p;
    {
      std::lock_guard lock(mutex);
      auto it = pending.find(id);
      if (it == pending.end()) return std::nullopt;
      p.emplace(std::move(it->second));
      pending.erase(it);
    }
    if (p->timer) {
      if (on_io_thread()) {
        p->timer->cancel();
      } else {
        asio::post(io, [t = p->timer] { t->cancel(); });
      }
    }
    return p;
  }

  /// Sends `payload` from the I/O thread. Errors: `unavailable` when closed.
  result<void> post_send(std::string payload, bool binary) {
    {
      std::lock_guard lock(mutex);
      if (state == link_state::closed) return unexpected(errc::unavailable, closed_message());
    }
    asio::post(io,
               [this, payload = std::move(payload), binary] { (void)link->send(payload, binary); });
    return {};
  }

  void begin_close(int code, std::string reason) {
    {
      std::lock_guard lock(mutex);
      if (state == link_state::closed || closed_by_us) return;
      closed_by_us = true;
    }
    asio::post(io, [this, code, reason = std::move(reason)] { link->close(code, reason); });
  }

  bool wait_closed(duration timeout) const {
    std::unique_lock lock(mutex);
    return closed_cv.wait_for(lock, timeout, [&] { return state == link_state::closed; });
  }

  void shutdown() {
    if (thread.joinable()) {
      begin_close(1000, "");
      wait_closed(k_close_wait);
      work.reset();
      io.stop();
      thread.join();
    }
    fail_all(error(errc::unavailable, "the client was destroyed"));
  }

  void fail_all(const error& e) {
    std::unordered_map<std::int64_t, pending_request> failed;
    {
      std::lock_guard lock(mutex);
      failed.swap(pending);
    }
    for (auto& [id, p] : failed) p.done(e);
  }

  // Link events, on the I/O thread.

  void opened() {
    {
      std::lock_guard lock(mutex);
      state = link_state::open;
    }
    const auto id = next_id.fetch_add(1);
    json_writer fields;
    fields.begin_object().key("token").string(options.token).end_object();
    auto frame = make_frame("hello", id, fields.str());
    auto remaining = connect_deadline - steady::now();
    if (remaining < steady::duration::zero()) remaining = steady::duration::zero();
    auto w = hello;
    if (!frame) {
      w->set(frame.error());
      return;
    }
    start_request("hello", id, std::move(*frame), std::chrono::duration_cast<duration>(remaining),
                  [w](result<client_frame> r) { w->set(std::move(r)); });
  }

  void failed(std::string what) {
    {
      std::lock_guard lock(mutex);
      state = link_state::closed;
      close_code = 1006;
      close_reason = what;
    }
    closed_cv.notify_all();
    if (hello) {
      hello->set(error(errc::unavailable, "cannot connect to " + options.url + ": " + what));
    }
    fail_all(error(errc::unavailable, "the connection failed: " + what));
  }

  void closed(int code, std::string reason) {
    std::vector<std::pair<pending_request, error>> ended;
    close_handler handler;
    std::string why;
    {
      std::lock_guard lock(mutex);
      state = link_state::closed;
      close_code = code;
      close_reason = std::move(reason);
      why = close_reason;
      for (auto& [id, p] : pending) {
        auto e = closed_error(p);
        ended.emplace_back(std::move(p), std::move(e));
      }
      pending.clear();
      handler = std::move(on_closed);
      on_closed = nullptr;
    }
    closed_cv.notify_all();
    for (auto& [p, e] : ended) {
      if (p.timer) p.timer->cancel();
      p.done(std::move(e));
    }
    if (handler) handler(code, why);
  }

  void received(std::string payload) {
    auto frame = access::make(access::parse(std::move(payload)));
    const auto& op = frame.op();
    if (op == "ok" || op == "error") {
      if (auto id = frame.int_at("/id")) {
        if (auto p = take(*id)) {
          if (op == "ok") {
            p->done(std::move(frame));
          } else {
            p->done(error_from_reply(frame));
          }
          return;
        }
      }
    }
    deliver(std::move(frame));
  }

  void deliver(client_frame frame) {
    if (on_push && unhandled.empty()) {
      on_push(frame);
    } else {
      unhandled.push_back(std::move(frame));
      drain();
    }
  }

  void drain() {
    while (on_push && !unhandled.empty()) {
      auto next = std::move(unhandled.front());
      unhandled.pop_front();
      on_push(next);
    }
  }
};

result<std::unique_ptr<client>> client::connect(client_options options) {
  const bool tls = starts_with_nocase(options.url, "wss://");
  if (!tls && !starts_with_nocase(options.url, "ws://")) {
    return unexpected(errc::bad_request,
                      "the URL must start with ws:// or wss://, not \"" + options.url + "\"");
  }
  auto p = std::make_unique<impl>(std::move(options));
  impl* self = p.get();
  self->connect_deadline = steady::now() + self->options.connect_timeout;
  self->hello = std::make_shared<waiter>();

  client_detail::link_events events{
      .opened = [self] { self->opened(); },
      .received = [self](std::string payload) { self->received(std::move(payload)); },
      .closed = [self](int code, std::string reason) { self->closed(code, std::move(reason)); },
      .failed = [self](std::string what) { self->failed(std::move(what)); },
  };
  client_detail::link_settings settings{.url = self->options.url,
                                        .open_timeout = self->options.connect_timeout,
                                        .verify_peer = self->options.verify_peer,
                                        .ca_file = self->options.ca_file};
  if (tls) {
    auto l = client_detail::make_tls_link(self->io, std::move(settings), std::move(events));
    if (!l) return std::move(l).error();
    self->link = std::move(*l);
  } else {
    self->link = client_detail::make_plain_link(self->io, std::move(settings), std::move(events));
  }
  if (auto started = self->link->start(); !started) return std::move(started).error();

  self->thread = std::thread([self] {
    self->io_thread_id = std::this_thread::get_id();
    self->io.run();
  });

  if (!self->hello->wait_until(self->connect_deadline)) {
    return unexpected(errc::unavailable, "no answer from " + self->options.url + " within " +
                                             seconds_text(self->options.connect_timeout));
  }
  auto answer = std::move(*self->hello->value);
  if (!answer) return std::move(answer).error();

  const auto& w = *answer;
  self->welcome = w;
  self->participant = w.string_at("/participant").value_or("");
  self->ns = w.string_at("/ns").value_or("");
  self->session = w.string_at("/session").value_or("");
  self->server = w.string_at("/server").value_or("");
  self->heartbeat_s = static_cast<int>(w.int_at("/heartbeat_s").value_or(0));
  self->registry_ttl_s = static_cast<int>(w.int_at("/registry_ttl_s").value_or(0));
  if (auto m = w.int_at("/max_frame_bytes"); m && *m > 0) {
    self->max_frame_bytes = static_cast<std::size_t>(*m);
  }
  return std::unique_ptr<client>(new client(std::move(p)));
}

client::client(std::unique_ptr<impl> p) noexcept : impl_(std::move(p)) {}

client::~client() = default;

const std::string& client::participant() const noexcept {
  return impl_->participant;
}
const std::string& client::ns() const noexcept {
  return impl_->ns;
}
const std::string& client::session() const noexcept {
  return impl_->session;
}
int client::heartbeat_s() const noexcept {
  return impl_->heartbeat_s;
}
int client::registry_ttl_s() const noexcept {
  return impl_->registry_ttl_s;
}
std::size_t client::max_frame_bytes() const noexcept {
  return impl_->max_frame_bytes.load();
}
const std::string& client::server() const noexcept {
  return impl_->server;
}
const client_frame& client::welcome() const noexcept {
  return impl_->welcome;
}
const client_options& client::options() const noexcept {
  return impl_->options;
}

void client::on_push(push_handler handler) {
  auto install = [self = impl_.get(), handler = std::move(handler)]() mutable {
    self->on_push = std::move(handler);
    self->drain();
  };
  if (impl_->on_io_thread()) {
    // Possibly from the push handler itself, which must not be destroyed while it runs.
    asio::post(impl_->io, std::move(install));
    return;
  }
  std::promise<void> installed;
  auto done = installed.get_future();
  asio::post(impl_->io, [&install, &installed] {
    install();
    installed.set_value();
  });
  done.wait();
}

void client::on_close(close_handler handler) {
  std::unique_lock lock(impl_->mutex);
  if (impl_->state == impl::link_state::closed) {
    const int code = impl_->close_code.value_or(1006);
    const std::string reason = impl_->close_reason;
    lock.unlock();
    if (handler) handler(code, reason);
    return;
  }
  impl_->on_closed = std::move(handler);
}

result<client_frame> client::request(std::string_view op, std::string_view fields_json) {
  if (impl_->on_io_thread()) {
    return unexpected(errc::bad_request,
                      "a blocking request on the client's I/O thread would wait for ever: use "
                      "async_request there");
  }
  const auto id = impl_->next_id.fetch_add(1);
  auto frame = impl_->make_frame(op, id, fields_json);
  if (!frame) return std::move(frame).error();
  auto w = std::make_shared<waiter>();
  const auto timeout = impl_->options.request_timeout;
  impl_->start_request(std::string(op), id, std::move(*frame), timeout,
                       [w](result<client_frame> r) { w->set(std::move(r)); });
  // The I/O thread times the request out; this is the safety net for an I/O thread held up
  // by a handler that blocks.
  if (!w->wait_until(steady::now() + timeout + std::chrono::seconds(1))) {
    if (impl_->take(id)) {
      return unexpected(errc::unavailable,
                        "no reply to " + std::string(op) + " within " + seconds_text(timeout));
    }
    w->wait();  // the reply is being delivered
  }
  return std::move(*w->value);
}

void client::async_request(std::string_view op, std::string_view fields_json,
                           reply_handler handler) {
  const auto id = impl_->next_id.fetch_add(1);
  auto frame = impl_->make_frame(op, id, fields_json);
  if (!frame) {
    handler(std::move(frame).error());
    return;
  }
  impl_->start_request(std::string(op), id, std::move(*frame), impl_->options.request_timeout,
                       std::move(handler));
}

result<void> client::notify(std::string_view op, std::string_view fields_json) {
  auto frame = impl_->make_frame(op, std::nullopt, fields_json);
  if (!frame) return std::move(frame).error();
  return impl_->post_send(std::move(*frame), false);
}

result<void> client::send_frame(std::string text) {
  return impl_->post_send(std::move(text), false);
}

result<void> client::send_binary(std::string bytes) {
  return impl_->post_send(std::move(bytes), true);
}

namespace {

/// Adds the optional string member `name` when `value` is not empty.
void optional_member(json_writer& w, std::string_view name, const std::string& value) {
  if (!value.empty()) w.key(name).string(value);
}

}  // namespace

result<send_receipt> client::send(std::string_view to, std::string_view body_json,
                                  const message_options& options) {
  if (auto r = check_json("body", body_json); !r) return std::move(r).error();
  if (!options.headers_json.empty()) {
    if (auto r = check_object("headers", options.headers_json); !r) return std::move(r).error();
  }
  json_writer w;
  w.begin_object().key("to").string(to).key("body").raw(trim(body_json));
  optional_member(w, "type", options.type);
  if (!options.headers_json.empty()) w.key("headers").raw(trim(options.headers_json));
  optional_member(w, "msg_id", options.msg_id);
  optional_member(w, "reply_to", options.reply_to);
  optional_member(w, "correlation", options.correlation);
  w.end_object();
  auto r = request("send", w.str());
  if (!r) return std::move(r).error();
  return send_receipt{r->int_at("/seq").value_or(0), r->string_at("/msg_id").value_or(""),
                      r->bool_at("/duplicate").value_or(false)};
}

result<void> client::ack(std::int64_t seq) {
  json_writer w;
  w.begin_object().key("seq").integer(seq).end_object();
  if (auto r = request("ack", w.str()); !r) return std::move(r).error();
  return {};
}

result<void> client::nack(std::int64_t seq, std::chrono::milliseconds delay) {
  json_writer w;
  w.begin_object().key("seq").integer(seq);
  if (delay.count() > 0) w.key("delay_ms").integer(delay.count());
  w.end_object();
  if (auto r = request("nack", w.str()); !r) return std::move(r).error();
  return {};
}

result<publish_receipt> client::publish(std::string_view topic, std::string_view body_json,
                                        const publish_options& options) {
  if (auto r = check_json("body", body_json); !r) return std::move(r).error();
  if (!options.headers_json.empty()) {
    if (auto r = check_object("headers", options.headers_json); !r) return std::move(r).error();
  }
  json_writer w;
  w.begin_object().key("topic").string(topic).key("body").raw(trim(body_json));
  optional_member(w, "type", options.type);
  if (!options.headers_json.empty()) w.key("headers").raw(trim(options.headers_json));
  optional_member(w, "msg_id", options.msg_id);
  w.end_object();
  auto r = request("publish", w.str());
  if (!r) return std::move(r).error();
  return publish_receipt{r->int_at("/seq").value_or(0), r->bool_at("/duplicate").value_or(false)};
}

result<std::string> client::subscribe(std::string_view pattern, const subscribe_from& from,
                                      std::string_view sub) {
  json_writer w;
  w.begin_object().key("topic").string(pattern).key("from").raw(from.to_json());
  if (!sub.empty()) w.key("sub").string(sub);
  w.end_object();
  auto r = request("subscribe", w.str());
  if (!r) return std::move(r).error();
  return r->string_at("/sub").value_or(std::string(sub));
}

result<void> client::unsubscribe(std::string_view sub) {
  json_writer w;
  w.begin_object().key("sub").string(sub).end_object();
  if (auto r = request("unsubscribe", w.str()); !r) return std::move(r).error();
  return {};
}

result<submit_receipt> client::submit(std::string_view job, std::string_view body_json,
                                      const submit_options& options) {
  if (auto r = check_json("body", body_json); !r) return std::move(r).error();
  if (!options.headers_json.empty()) {
    if (auto r = check_object("headers", options.headers_json); !r) return std::move(r).error();
  }
  json_writer w;
  w.begin_object().key("job").string(job).key("body").raw(trim(body_json));
  optional_member(w, "type", options.type);
  if (!options.headers_json.empty()) w.key("headers").raw(trim(options.headers_json));
  if (options.max_attempts != 0) w.key("max_attempts").integer(options.max_attempts);
  optional_member(w, "idempotency_key", options.idempotency_key);
  w.end_object();
  auto r = request("submit", w.str());
  if (!r) return std::move(r).error();
  return submit_receipt{r->string_at("/task").value_or(""), r->bool_at("/created").value_or(false)};
}

result<std::int64_t> client::register_worker(const std::vector<std::string>& jobs, int slots,
                                             std::string_view meta_json) {
  if (!meta_json.empty()) {
    if (auto r = check_object("meta", meta_json); !r) return std::move(r).error();
  }
  json_writer w;
  w.begin_object().key("jobs").begin_array();
  for (const auto& job : jobs) w.string(job);
  w.end_array().key("slots").integer(slots);
  if (!meta_json.empty()) w.key("meta").raw(trim(meta_json));
  w.end_object();
  auto r = request("register", w.str());
  if (!r) return std::move(r).error();
  return r->int_at("/expires_in_s").value_or(0);
}

result<client_frame> client::heartbeat() {
  return request("heartbeat");
}

result<std::string> client::heartbeat(std::string_view task, std::optional<int> attempt) {
  json_writer w;
  w.begin_object().key("task").string(task);
  if (attempt) w.key("attempt").integer(*attempt);
  w.end_object();
  auto r = request("heartbeat", w.str());
  if (!r) return std::move(r).error();
  return r->string_at("/expires_at").value_or("");
}

result<claim_receipt> client::claim(std::string_view task) {
  json_writer w;
  w.begin_object().key("task").string(task).end_object();
  auto r = request("claim", w.str());
  if (!r) return std::move(r).error();
  return claim_receipt{r->string_at("/task").value_or(std::string(task)),
                       static_cast<int>(r->int_at("/attempt").value_or(0)),
                       r->string_at("/lease_expires_at").value_or("")};
}

result<void> client::decline(std::string_view task) {
  json_writer w;
  w.begin_object().key("task").string(task).end_object();
  if (auto r = request("decline", w.str()); !r) return std::move(r).error();
  return {};
}

result<complete_receipt> client::complete(std::string_view task, std::string_view result_json,
                                          std::optional<int> attempt) {
  if (auto r = check_json("result", result_json); !r) return std::move(r).error();
  json_writer w;
  w.begin_object().key("task").string(task).key("result").raw(trim(result_json));
  if (attempt) w.key("attempt").integer(*attempt);
  w.end_object();
  auto r = request("complete", w.str());
  if (!r) return std::move(r).error();
  return complete_receipt{r->string_at("/task").value_or(std::string(task)),
                          r->bool_at("/duplicate").value_or(false)};
}

result<fail_receipt> client::fail(std::string_view task, std::string_view code,
                                  std::string_view message, const fail_options& options) {
  json_writer w;
  w.begin_object().key("task").string(task);
  w.key("error").begin_object().key("code").string(code).key("message").string(message);
  w.end_object().key("retry").boolean(options.retry);
  if (options.retry_delay) w.key("retry_delay_ms").integer(options.retry_delay->count());
  if (options.attempt) w.key("attempt").integer(*options.attempt);
  w.end_object();
  auto r = request("fail", w.str());
  if (!r) return std::move(r).error();
  return fail_receipt{r->string_at("/task").value_or(std::string(task)),
                      r->string_at("/state").value_or(""),
                      static_cast<int>(r->int_at("/attempt").value_or(0))};
}

result<void> client::cancel(std::string_view task) {
  json_writer w;
  w.begin_object().key("task").string(task).end_object();
  if (auto r = request("cancel", w.str()); !r) return std::move(r).error();
  return {};
}

result<scatter_receipt> client::scatter_frame(std::string_view audience_member,
                                              std::string_view audience_json,
                                              std::string_view body_json,
                                              const scatter_options& options) {
  if (auto r = check_json("body", body_json); !r) return std::move(r).error();
  if (!options.bodies_json.empty()) {
    if (auto r = check_object("bodies", options.bodies_json); !r) return std::move(r).error();
  }
  if (!options.headers_json.empty()) {
    if (auto r = check_object("headers", options.headers_json); !r) return std::move(r).error();
  }
  json_writer w;
  w.begin_object().key(audience_member).raw(audience_json).key("body").raw(trim(body_json));
  if (!options.bodies_json.empty()) w.key("bodies").raw(trim(options.bodies_json));
  optional_member(w, "type", options.type);
  if (!options.headers_json.empty()) w.key("headers").raw(trim(options.headers_json));
  if (options.quorum != 0) {
    w.key("quorum").integer(options.quorum).key("timeout_ms").integer(options.timeout.count());
    if (options.partial_on_timeout) w.key("on_timeout").string("partial");
  }
  if (options.include_self) w.key("include_self").boolean(true);
  optional_member(w, "idempotency_key", options.idempotency_key);
  w.end_object();
  auto r = request("scatter", w.str());
  if (!r) return std::move(r).error();
  scatter_receipt out{
      r->string_at("/operation").value_or(""), r->bool_at("/created").value_or(false), {}};
  for (std::size_t i = 0;; ++i) {
    auto m = r->string_at("/members/" + std::to_string(i));
    if (!m) break;
    out.members.push_back(std::move(*m));
  }
  return out;
}

result<scatter_receipt> client::scatter(const std::vector<std::string>& to,
                                        std::string_view body_json,
                                        const scatter_options& options) {
  json_writer w;
  w.begin_array();
  for (const auto& m : to) w.string(m);
  w.end_array();
  return scatter_frame("to", w.str(), body_json, options);
}

result<scatter_receipt> client::scatter_to_audience(std::string_view audience,
                                                    std::string_view body_json,
                                                    const scatter_options& options) {
  json_writer w;
  w.string(audience);
  return scatter_frame("audience", w.str(), body_json, options);
}

result<reply_receipt> client::reply(std::string_view operation, int attempt, bool accept,
                                    std::string_view body_json) {
  if (auto r = check_json("body", body_json); !r) return std::move(r).error();
  json_writer w;
  w.begin_object().key("operation").string(operation).key("attempt").integer(attempt);
  w.key("accept").boolean(accept).key("body").raw(trim(body_json)).end_object();
  auto r = request("reply", w.str());
  if (!r) return std::move(r).error();
  return reply_receipt{r->string_at("/operation").value_or(""), r->string_at("/state").value_or(""),
                       r->bool_at("/duplicate").value_or(false)};
}

result<client_frame> client::operation(std::string_view operation) {
  json_writer w;
  w.begin_object().key("operation").string(operation).end_object();
  return request("operation", w.str());
}

result<int> client::retry(std::string_view operation, std::string_view member) {
  json_writer w;
  w.begin_object().key("operation").string(operation).key("member").string(member).end_object();
  auto r = request("retry", w.str());
  if (!r) return std::move(r).error();
  return static_cast<int>(r->int_at("/attempt").value_or(0));
}

result<client_frame> client::cancel_operation(std::string_view operation) {
  json_writer w;
  w.begin_object().key("operation").string(operation).end_object();
  return request("cancel", w.str());
}

result<client_frame> client::task(std::string_view task, bool history) {
  json_writer w;
  w.begin_object().key("task").string(task);
  if (history) w.key("history").boolean(true);
  w.end_object();
  return request("task", w.str());
}

result<client_frame> client::who(std::string_view job) {
  json_writer w;
  w.begin_object();
  if (!job.empty()) w.key("job").string(job);
  w.end_object();
  return request("who", w.str());
}

result<client_frame> client::watch() {
  return request("watch");
}

result<void> client::bye() {
  auto r = request("bye");
  if (!r) {
    // The server may close (1000) right behind its ok, or instead of it.
    if (close_code() == 1000) return {};
    return std::move(r).error();
  }
  if (!wait_closed(impl_->options.request_timeout)) close();
  return {};
}

void client::close(int code, std::string_view reason) {
  impl_->begin_close(code, std::string(reason));
  if (!impl_->on_io_thread()) impl_->wait_closed(k_close_wait);
}

bool client::is_open() const noexcept {
  std::lock_guard lock(impl_->mutex);
  return impl_->state == impl::link_state::open;
}

bool client::wait_closed(duration timeout) const {
  return impl_->wait_closed(timeout);
}

std::optional<int> client::close_code() const {
  std::lock_guard lock(impl_->mutex);
  if (impl_->state != impl::link_state::closed) return std::nullopt;
  return impl_->close_code;
}

std::string client::close_reason() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->close_reason;
}

}  // namespace amp
