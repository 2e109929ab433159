#include "amp/transport/jetstream.hpp"

#include <fmt/format.h>
#include <nats/nats.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "amp/timestamp.hpp"
#include "detail/serial_queue.hpp"
#include "transport/stream_rules.hpp"

namespace amp {
namespace {

using detail::serial_queue;
using namespace std::chrono_literals;

constexpr std::string_view k_ack_prefix = "$JS.ACK.";
constexpr std::string_view k_kv_op = "KV-Operation";
constexpr auto k_pull_quiet = std::chrono::milliseconds(100);

// ----- small helpers ------------------------------------------------------------------

// cnats spins on a contended mutex before it sleeps (2,000 tries by default). Its reader,
// timer and garbage-collector threads and the callers' threads contend all the time, and
// on a small machine the spinning takes the CPU the thread it waits for needs. An
// application that called nats_Open itself keeps its own setting (the call is then a
// no-op). AMP_NATS_LOCK_SPIN overrides the count, for measurements.
void open_library() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::int64_t spin = 0;
    if (const char* v = std::getenv("AMP_NATS_LOCK_SPIN")) spin = std::strtoll(v, nullptr, 10);
    (void)nats_Open(spin);
  });
}

std::int64_t to_ns(duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}
duration from_ns(std::int64_t ns) {
  return std::chrono::duration_cast<duration>(std::chrono::nanoseconds(ns));
}
time_point time_from_ns(std::int64_t ns) {
  return time_point(from_ns(ns));
}
std::int64_t to_ms(duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

bool is_connection_status(natsStatus s) {
  switch (s) {
    case NATS_TIMEOUT:
    case NATS_NO_SERVER:
    case NATS_CONNECTION_CLOSED:
    case NATS_CONNECTION_DISCONNECTED:
    case NATS_NO_RESPONDERS:
    case NATS_NOT_YET_CONNECTED:
    case NATS_INSUFFICIENT_BUFFER:
    case NATS_STALE_CONNECTION:
    case NATS_IO_ERROR: return true;
    default: return false;
  }
}

// JetStream API error codes (jsErrCode) that we translate.
constexpr int k_stream_not_found = 10059;
constexpr int k_consumer_not_found = 10014;
constexpr int k_no_message_found = 10037;
constexpr int k_sequence_not_found = 10043;
constexpr int k_wrong_last_sequence = 10071;
constexpr int k_stream_name_in_use = 10058;
constexpr int k_subjects_overlap = 10065;
constexpr int k_jetstream_not_enabled = 10076;  // what an election looks like to cnats
constexpr int k_jetstream_unavailable = 10008;  // "temporarily unavailable": no quorum yet
constexpr int k_wq_consumer_not_unique = 10100;
constexpr int k_message_too_large = 10054;
constexpr int k_stream_store_failed = 10077;
constexpr int k_stream_subjects_overlap_self = 10052;
constexpr int k_stream_create_failed = 10049;    // "{err}": any other failure to create
constexpr int k_consumer_create_failed = 10012;  // the same for consumers

errc code_for_js_error(int err_code, std::string_view description) {
  switch (err_code) {
    case k_stream_not_found:
    case k_consumer_not_found:
    case k_no_message_found:
    case k_sequence_not_found: return errc::not_found;
    case k_wrong_last_sequence:
    case k_stream_name_in_use:
    case k_subjects_overlap:
    case k_wq_consumer_not_unique: return errc::conflict;
    case k_message_too_large: return errc::payload_too_large;
    case k_stream_subjects_overlap_self: return errc::bad_request;
    case k_jetstream_not_enabled:
    case k_jetstream_unavailable: return errc::unavailable;
    default: break;
  }
  if (description.find("maximum messages") != std::string_view::npos ||
      description.find("maximum bytes") != std::string_view::npos ||
      err_code == k_stream_store_failed) {
    return errc::limit_exceeded;
  }
  if (description.find("message size exceeds") != std::string_view::npos) {
    return errc::payload_too_large;
  }
  return errc::internal;
}

error status_error(natsStatus s, int ec, std::string_view what) {
  if (ec != 0) {
    auto text = nats_GetLastError(nullptr);
    std::string description = text ? text : natsStatus_GetText(s);
    return error(
        code_for_js_error(ec, description),
        fmt::format("{}: {} (JetStream error {})", what, description, static_cast<int>(ec)));
  }
  if (is_connection_status(s)) {
    return error(errc::unavailable,
                 fmt::format("{}: NATS did not answer ({})", what, natsStatus_GetText(s)));
  }
  if (s == NATS_NOT_FOUND) return error(errc::not_found, fmt::format("{}: not found", what));
  return error(errc::internal, fmt::format("{}: {}", what, natsStatus_GetText(s)));
}

// nats-server 2.9.10 sometimes answers a create with "error creating store for stream" (or "for
// consumer") when several connections make their first objects at once on a new store; its
// log then says "could not create storage directory - mkdir .../streams: no such file or
// directory". It is transient: a second try succeeds, or finds what another process made.
bool store_creation_failed(jsErrCode ec) {
  if (ec != k_stream_create_failed && ec != k_consumer_create_failed) return false;
  const char* text = nats_GetLastError(nullptr);
  return text != nullptr &&
         std::string_view(text).find("error creating store") != std::string_view::npos;
}

bool retryable(natsStatus s, jsErrCode ec) {
  return ec == k_jetstream_not_enabled || s == NATS_NO_RESPONDERS || s == NATS_TIMEOUT ||
         store_creation_failed(ec);
}

std::string base64_decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() * 3 / 4);
  unsigned buffer = 0;
  int bits = 0;
  for (char c : in) {
    int v = value(c);
    if (v < 0) continue;  // padding and line breaks
    buffer = (buffer << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xFF));
    }
  }
  return out;
}

// Parses a NATS header block ("NATS/1.0\r\nName: value\r\n...\r\n\r\n"), keeping order.
header_list parse_header_block(std::string_view block) {
  header_list out;
  auto eol = block.find("\r\n");
  if (eol == std::string_view::npos) return out;
  block.remove_prefix(eol + 2);
  while (!block.empty()) {
    eol = block.find("\r\n");
    auto line = block.substr(0, eol);
    block.remove_prefix(eol == std::string_view::npos ? block.size() : eol + 2);
    if (line.empty()) break;
    auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    auto value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    out.emplace_back(std::string(line.substr(0, colon)), std::string(value));
  }
  return out;
}

header_list headers_of(natsMsg* m) {
  header_list out;
  const char** keys = nullptr;
  int count = 0;
  if (natsMsgHeader_Keys(m, &keys, &count) != NATS_OK) return out;
  for (int i = 0; i < count; ++i) {
    const char** values = nullptr;
    int n = 0;
    if (natsMsgHeader_Values(m, keys[i], &values, &n) == NATS_OK) {
      for (int j = 0; j < n; ++j) out.emplace_back(keys[i], values[j]);
      free(const_cast<char**>(values));  // NOLINT: cnats allocates the array with malloc
    }
  }
  free(const_cast<char**>(keys));  // NOLINT
  return out;
}

std::string header_value(natsMsg* m, const char* name) {
  const char* v = nullptr;
  if (natsMsgHeader_Get(m, name, &v) == NATS_OK && v) return v;
  return {};
}

std::string data_of(natsMsg* m) {
  auto len = natsMsg_GetDataLength(m);
  return len > 0 ? std::string(natsMsg_GetData(m), static_cast<std::size_t>(len)) : std::string();
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    auto i = s.find(sep);
    out.push_back(s.substr(0, i));
    if (i == std::string_view::npos) break;
    s.remove_prefix(i + 1);
  }
  return out;
}

bool has_wildcard(std::string_view filter) {
  for (auto token : split(filter, '.')) {
    if (token == "*" || token == ">") return true;
  }
  return false;
}

template <class T>
bool parse_number(std::string_view v, T& out) {
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc() && p == v.data() + v.size();
}

// The fields of an ack subject from the stream on: "$JS.ACK.<stream>.<consumer>.<delivered>.
// <sseq>.<cseq>.<ns>.<pending>" (nats-server 2.9), or the form with a domain and an account hash
// before the stream and a random token at the end.
std::optional<std::vector<std::string_view>> ack_fields(std::string_view reply) {
  if (reply.substr(0, k_ack_prefix.size()) != k_ack_prefix) return std::nullopt;
  auto t = split(reply.substr(k_ack_prefix.size()), '.');
  if (t.size() == 7) return t;
  if (t.size() >= 9) return std::vector<std::string_view>(t.begin() + 2, t.end());
  return std::nullopt;
}

// "<stream>.<consumer>": what pulls are told apart by.
std::string pull_key(std::string_view stream, std::string_view consumer) {
  std::string key;
  key.reserve(stream.size() + 1 + consumer.size());
  key.append(stream).append(".").append(consumer);
  return key;
}

// The pull key of the consumer that delivered a message, from its ack subject.
std::optional<std::string> pull_key_of(std::string_view reply) {
  auto t = ack_fields(reply);
  if (!t) return std::nullopt;
  return pull_key((*t)[0], (*t)[1]);
}

// Fills the delivery fields of a message from its ack subject.
bool fill_from_ack_subject(message& m, std::string_view reply) {
  auto t = ack_fields(reply);
  if (!t) return false;
  const auto& f = *t;
  std::int64_t ns = 0;
  if (!parse_number(f[2], m.delivery_count) || !parse_number(f[3], m.seq) ||
      !parse_number(f[4], m.consumer_seq) || !parse_number(f[5], ns)) {
    return false;
  }
  m.stream = std::string(f[0]);
  m.consumer = std::string(f[1]);
  m.time = time_from_ns(ns);
  m.ack_token = std::string(reply);
  return true;
}

// Reads an optional member; `out` keeps its value when the member is missing.
template <class T>
void read_field(simdjson::dom::element object, std::string_view key, T& out) {
  if (object[key].get(out) != simdjson::SUCCESS) return;
}

// Reads {"error":{"code":..,"err_code":..,"description":".."}} if present.
std::optional<error> api_error(simdjson::dom::element doc, std::string_view what) {
  simdjson::dom::element e;
  if (doc["error"].get(e) != simdjson::SUCCESS) return std::nullopt;
  std::int64_t err_code = 0;
  std::string_view description;
  read_field(e, "err_code", err_code);
  read_field(e, "description", description);
  return error(code_for_js_error(static_cast<int>(err_code), description),
               fmt::format("{}: {} (JetStream error {})", what, description, err_code));
}

simdjson::dom::parser& local_parser() {
  thread_local simdjson::dom::parser parser;
  return parser;
}

// ----- connection and request multiplexer --------------------------------------------

// Whether this thread is inside a cnats callback: a connection must not be closed there.
thread_local int callback_depth = 0;
struct in_callback_scope {
  in_callback_scope() { ++callback_depth; }
  ~in_callback_scope() { --callback_depth; }
  in_callback_scope(const in_callback_scope&) = delete;
  in_callback_scope& operator=(const in_callback_scope&) = delete;
};

struct nats_reply {
  std::string data;
  natsMsg* msg = nullptr;  // valid only during the callback
};

// One outstanding request: each response goes to on_msg until it returns true; a timeout
// calls on_timeout. Exactly one of the two finishes it.
struct pending_request {
  std::mutex mu;
  bool finished = false;
  std::function<bool(natsMsg*)> on_msg;
  std::function<void()> on_timeout;
  timer_id timer = 0;
  std::string pull;  // pulls: the pull key of their consumer
};

class connection : public std::enable_shared_from_this<connection> {
 public:
  connection(std::shared_ptr<amp::clock> clock, duration op_timeout,
             std::shared_ptr<const detail::handler_error_sink> sink)
      : clock_(std::move(clock)), op_timeout_(op_timeout), sink_(std::move(sink)) {}

  // Requests still outstanding are answered `unavailable` ("transport closed").
  ~connection() {
    std::unordered_map<std::uint64_t, std::shared_ptr<pending_request>> left;
    {
      std::lock_guard lock(mu_);
      left.swap(pending_);
    }
    for (auto& [token, p] : left) {
      clock_->cancel(p->timer);
      // A request being answered right now (perhaps by this very thread, whose handler
      // dropped the last reference) is finished by its answer.
      std::unique_lock plock(p->mu, std::try_to_lock);
      if (plock && !p->finished) {
        p->finished = true;
        p->on_timeout();
      }
    }
    if (mux_sub_) {
      natsSubscription_Unsubscribe(mux_sub_);
      natsSubscription_Destroy(mux_sub_);
    }
    if (js_) jsCtx_Destroy(js_);
    if (nc_) {
      natsConnection_Close(nc_);
      natsConnection_Destroy(nc_);
    }
  }

  result<void> open(const jetstream_options& o) {
    open_library();
    natsOptions* opts = nullptr;
    if (natsOptions_Create(&opts) != NATS_OK) return unexpected(errc::internal, "no memory");
    std::unique_ptr<natsOptions, void (*)(natsOptions*)> guard(opts, natsOptions_Destroy);
    std::vector<std::string> urls;
    for (auto u : split(o.url, ',')) {
      while (!u.empty() && u.front() == ' ') u.remove_prefix(1);
      while (!u.empty() && u.back() == ' ') u.remove_suffix(1);
      if (!u.empty()) urls.emplace_back(u);
    }
    if (urls.empty()) return unexpected(errc::bad_request, "nats url is empty");
    std::vector<const char*> url_ptrs;
    for (const auto& u : urls) url_ptrs.push_back(u.c_str());
    if (natsOptions_SetServers(opts, url_ptrs.data(), static_cast<int>(url_ptrs.size())) !=
        NATS_OK) {
      return unexpected(errc::bad_request,
                        fmt::format("bad nats url \"{}\"", redact_nats_url(o.url)));
    }
    natsOptions_SetName(opts, o.name.c_str());
    natsOptions_SetSendAsap(opts, true);
    natsOptions_SetTimeout(opts, std::max<std::int64_t>(1, to_ms(o.connect_timeout)));
    natsOptions_SetMaxReconnect(opts, -1);
    natsOptions_SetReconnectWait(opts, std::max<std::int64_t>(1, to_ms(o.reconnect_wait)));
    // No reconnect buffer worth the name: a request made while the server is away fails
    // at once instead of being sent after we have answered `unavailable`.
    natsOptions_SetReconnectBufSize(opts, 1);
    natsOptions_SetPingInterval(opts, 2000);
    natsOptions_SetMaxPingsOut(opts, 2);
    natsOptions_SetMaxPendingMsgs(opts, 1 << 20);
    if (!o.creds_file.empty() &&
        natsOptions_SetUserCredentialsFromFiles(opts, o.creds_file.c_str(), nullptr) != NATS_OK) {
      return unexpected(errc::bad_request,
                        fmt::format("cannot use credentials file \"{}\"", o.creds_file));
    }
    auto s = natsConnection_Connect(&nc_, opts);
    if (s != NATS_OK) {
      return unexpected(
          errc::unavailable,
          fmt::format("cannot connect to {}: {}", redact_nats_url(o.url), natsStatus_GetText(s)));
    }
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = std::max<std::int64_t>(1, to_ms(op_timeout_));
    if (natsConnection_JetStream(&js_, nc_, &jo) != NATS_OK) {
      return unexpected(errc::internal, "cannot create a JetStream context");
    }
    natsInbox* inbox = nullptr;
    natsInbox_Create(&inbox);
    prefix_ = std::string(inbox) + ".";
    natsInbox_Destroy(inbox);
    std::string wildcard = prefix_ + "*";
    auto* anchor = new reply_anchor{weak_from_this()};
    s = natsConnection_Subscribe(&mux_sub_, nc_, wildcard.c_str(), &connection::on_reply, anchor);
    if (s != NATS_OK) {
      delete anchor;
      return unexpected(status_error(s, 0, "subscribe to replies"));
    }
    // On failure the anchor is left to a callback that may be running (a few bytes, once).
    s = natsSubscription_SetOnCompleteCB(mux_sub_, &connection::on_reply_complete, anchor);
    if (s != NATS_OK) return unexpected(status_error(s, 0, "subscribe to replies"));
    natsSubscription_SetPendingLimits(mux_sub_, -1, -1);
    return {};
  }

  natsConnection* nc() const { return nc_; }
  jsCtx* js() const { return js_; }
  const std::shared_ptr<amp::clock>& clock() const { return clock_; }
  duration op_timeout() const { return op_timeout_; }
  const std::shared_ptr<const detail::handler_error_sink>& sink() const { return sink_; }
  time_point deadline() const { return clock_->now() + op_timeout_; }

  // Sends one message expecting responses on a fresh reply subject. Returns an error when
  // it cannot be sent (then no callback runs).
  // A pull names its `consumer` (its pull_key): its status messages come to its reply subject,
  // but the messages it pulls keep their stream subject and are routed by the consumer named
  // in their ack subject, to the one pull in flight for that consumer (the caller sends a
  // consumer's pulls one at a time).
  result<void> send(const std::string& subject, std::string_view data, const header_list* headers,
                    time_point deadline, std::function<bool(natsMsg*)> on_msg,
                    std::function<void()> on_timeout, const std::string* consumer = nullptr) {
    auto p = std::make_shared<pending_request>();
    p->on_msg = std::move(on_msg);
    p->on_timeout = std::move(on_timeout);
    auto token = ++last_token_;
    std::string reply = fmt::format("{}{}{}", prefix_, consumer ? "p" : "", token);
    {
      std::lock_guard lock(mu_);
      pending_.emplace(token, p);
      if (consumer) {
        p->pull = *consumer;
        pulls_[p->pull] = token;
      }
    }
    std::weak_ptr<connection> weak = weak_from_this();
    {
      std::lock_guard plock(p->mu);
      p->timer = clock_->call_at(deadline, [weak, token] {
        if (auto self = weak.lock()) self->expire(token);
      });
    }
    auto s = publish_raw(subject, reply.c_str(), data, headers);
    if (s != NATS_OK) {
      forget(token);
      return unexpected(status_error(s, 0, fmt::format("send to {}", subject)));
    }
    return {};
  }

  natsStatus publish_raw(const std::string& subject, const char* reply, std::string_view data,
                         const header_list* headers) {
    // cnats would still buffer the first message sent while it reconnects and deliver it
    // later, after we have answered `unavailable`.
    if (natsConnection_Status(nc_) != NATS_CONN_STATUS_CONNECTED)
      return NATS_CONNECTION_DISCONNECTED;
    if (!headers || headers->empty()) {
      // Without headers no natsMsg is needed (whose destruction wakes cnats's GC thread).
      auto len = static_cast<int>(data.size());
      return reply ? natsConnection_PublishRequest(nc_, subject.c_str(), reply, data.data(), len)
                   : natsConnection_Publish(nc_, subject.c_str(), data.data(), len);
    }
    natsMsg* m = nullptr;
    auto s = natsMsg_Create(&m, subject.c_str(), reply, data.data(), static_cast<int>(data.size()));
    if (s != NATS_OK) return s;
    if (headers) {
      for (const auto& [k, v] : *headers) natsMsgHeader_Add(m, k.c_str(), v.c_str());
    }
    s = natsConnection_PublishMsg(nc_, m);
    natsMsg_Destroy(m);
    return s;
  }

  // A request with one answer. "No responders" (no stream leader, or nobody listening)
  // is retried with backoff until the deadline unless `on_no_responders` decides.
  // `on_no_responders`, if given, is asked once, at the first "no responders", whether
  // to keep trying: it answers with an error to finish with, or nothing to retry.
  using responders_check = std::function<void(std::function<void(std::optional<error>)>)>;
  void request(std::string subject, std::string data, header_list headers, time_point deadline,
               completion<nats_reply> done, responders_check on_no_responders = {}) {
    auto state = std::make_shared<request_state>();
    state->subject = std::move(subject);
    state->data = std::move(data);
    state->headers = std::move(headers);
    state->deadline = deadline;
    state->done = std::move(done);
    state->on_no_responders = std::move(on_no_responders);
    attempt(state);
  }

  // Blocking JetStream API request returning the parsed JSON.
  result<std::string> api(const std::string& subject, std::string payload) {
    auto promise = std::make_shared<std::promise<result<nats_reply>>>();
    auto future = promise->get_future();
    request(subject, std::move(payload), {}, deadline(),
            [promise](result<nats_reply> r) { promise->set_value(std::move(r)); });
    auto r = future.get();
    if (!r) return r.error();
    return std::move(r->data);
  }

 private:
  struct request_state {
    std::string subject;
    std::string data;
    header_list headers;
    time_point deadline;
    completion<nats_reply> done;
    responders_check on_no_responders;
    int attempts = 0;
  };

  void attempt(const std::shared_ptr<request_state>& st) {
    ++st->attempts;
    std::weak_ptr<connection> weak = weak_from_this();
    auto sent = send(
        st->subject, st->data, &st->headers, st->deadline,
        [weak, st](natsMsg* m) {
          auto self = weak.lock();
          if (!self) return true;
          if (natsMsg_IsNoResponders(m)) {
            self->retry_later(st, true);
            return true;
          }
          st->done(nats_reply{.data = data_of(m), .msg = m});
          return true;
        },
        [st] {
          st->done(unexpected(errc::unavailable,
                              fmt::format("no answer from NATS on {} in time", st->subject)));
        });
    if (!sent) {
      if (sent.error().code() == errc::unavailable && clock_->now() < st->deadline) {
        retry_later(st, false);
      } else {
        st->done(std::move(sent).error());
      }
    }
  }

  // `no_responders`: the server said nobody serves the subject (rather than: the request
  // could not be sent while the connection is down).
  void retry_later(const std::shared_ptr<request_state>& st, bool no_responders) {
    if (no_responders && st->on_no_responders) {
      auto check = std::move(st->on_no_responders);
      st->on_no_responders = nullptr;
      std::weak_ptr<connection> weak = weak_from_this();
      check([weak, st](std::optional<error> verdict) {
        auto self = weak.lock();
        if (verdict || !self) {
          return st->done(verdict ? std::move(*verdict)
                                  : error(errc::unavailable, "transport closed"));
        }
        self->retry_later(st, false);
      });
      return;
    }
    auto backoff = std::min<duration>(25ms * (1 << std::min(st->attempts, 5)), 500ms);
    auto at = clock_->now() + backoff;
    if (at >= st->deadline) {
      st->done(
          unexpected(errc::unavailable,
                     fmt::format("no responders on {} (no stream or no leader)", st->subject)));
      return;
    }
    std::weak_ptr<connection> weak = weak_from_this();
    clock_->call_at(at, [weak, st] {
      if (auto self = weak.lock()) {
        self->attempt(st);
      } else {
        st->done(unexpected(errc::unavailable, "transport closed"));
      }
    });
  }

  // What the reply subscription's callback holds instead of the connection: it lives until
  // cnats says that no callback runs any more (on_reply_complete), after the connection.
  struct reply_anchor {
    std::weak_ptr<connection> conn;
  };

  static void on_reply(natsConnection*, natsSubscription*, natsMsg* m, void* closure) {
    in_callback_scope scope;
    // A reference held while the message is dispatched: the caller its answer wakes may
    // drop every other one at once, and dispatch still touches the connection after the
    // answer. When this one is the last, the deleter closes the connection off this thread.
    if (auto self = static_cast<reply_anchor*>(closure)->conn.lock()) {
      try {
        self->dispatch(m);
      } catch (...) {  // handlers are guarded: this is the transport's own failure
        detail::report_current_exception(*self->sink_, "the NATS reply subscription");
      }
    }
    natsMsg_Destroy(m);
  }

  static void on_reply_complete(void* closure) { delete static_cast<reply_anchor*>(closure); }

  // A message delivered to a pull that already ended: back to the stream at once.
  void hand_back(natsMsg* m) {
    const char* reply = natsMsg_GetReply(m);
    if (reply && std::string_view(reply).substr(0, k_ack_prefix.size()) == k_ack_prefix) {
      publish_raw(reply, nullptr, "-NAK", nullptr);
    }
  }

  // Answers and pull statuses come to "<prefix><token>" or "<prefix>p<token>"; pulled
  // messages keep their stream subject and go to the pull in flight for their consumer.
  void dispatch(natsMsg* m) {
    std::string_view subject = natsMsg_GetSubject(m);
    std::uint64_t token = 0;
    if (subject.size() > prefix_.size() && subject.substr(0, prefix_.size()) == prefix_) {
      auto rest = subject.substr(prefix_.size());
      if (rest.front() == 'p') rest.remove_prefix(1);
      if (parse_number(rest, token)) deliver(token, m);
      return;
    }
    const char* reply = natsMsg_GetReply(m);
    auto key = reply ? pull_key_of(reply) : std::nullopt;
    if (!key) return;
    {
      std::lock_guard lock(mu_);
      auto it = pulls_.find(*key);
      if (it != pulls_.end()) token = it->second;
    }
    if (token == 0) return hand_back(m);
    deliver(token, m);
  }

  void deliver(std::uint64_t token, natsMsg* m) {
    std::shared_ptr<pending_request> p;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(token);
      if (it != pending_.end()) p = it->second;
    }
    if (!p) return hand_back(m);
    bool finished = false;
    {
      std::lock_guard plock(p->mu);
      if (p->finished) return;
      finished = p->on_msg(m);
      p->finished = finished;
    }
    if (finished) forget(token);
  }

  void expire(std::uint64_t token) {
    std::shared_ptr<pending_request> p;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(token);
      if (it == pending_.end()) return;
      p = it->second;
      pending_.erase(it);
      unlink_pull(*p, token);
    }
    std::lock_guard plock(p->mu);
    if (p->finished) return;
    p->finished = true;
    p->on_timeout();
  }

  void forget(std::uint64_t token) {
    std::shared_ptr<pending_request> p;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(token);
      if (it == pending_.end()) return;
      p = it->second;
      pending_.erase(it);
      unlink_pull(*p, token);
    }
    clock_->cancel(p->timer);
  }

  // With mu_ held. A message of the ended pull that arrives later is handed back, unless the
  // consumer's next pull is in flight already.
  void unlink_pull(const pending_request& p, std::uint64_t token) {
    if (p.pull.empty()) return;
    auto it = pulls_.find(p.pull);
    if (it != pulls_.end() && it->second == token) pulls_.erase(it);
  }

  std::shared_ptr<amp::clock> clock_;
  duration op_timeout_;
  std::shared_ptr<const detail::handler_error_sink> sink_;
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
  natsSubscription* mux_sub_ = nullptr;
  std::string prefix_;
  std::atomic<std::uint64_t> last_token_{0};
  std::mutex mu_;
  std::unordered_map<std::uint64_t, std::shared_ptr<pending_request>> pending_;
  std::unordered_map<std::string, std::uint64_t> pulls_;  // pull key -> the pull in flight
};

// ----- configuration translation ------------------------------------------------------

std::int64_t limit(std::int64_t v) {
  return v > 0 ? v : -1;
}

// nats-server 2.9 has no "unlimited" max_ack_pending for pull consumers (-1 becomes 1000):
// unlimited is this many.
constexpr std::int64_t k_unlimited_ack_pending = std::int64_t{1} << 30;

jsRetentionPolicy to_js(retention_policy r) {
  switch (r) {
    case retention_policy::limits: return js_LimitsPolicy;
    case retention_policy::work_queue: return js_WorkQueuePolicy;
    case retention_policy::interest: return js_InterestPolicy;
  }
  return js_LimitsPolicy;
}

retention_policy from_js(jsRetentionPolicy r) {
  switch (r) {
    case js_WorkQueuePolicy: return retention_policy::work_queue;
    case js_InterestPolicy: return retention_policy::interest;
    default: return retention_policy::limits;
  }
}

stream_config from_js(const jsStreamConfig& c) {
  stream_config out;
  out.name = c.Name ? c.Name : "";
  for (int i = 0; i < c.SubjectsLen; ++i) out.subjects.emplace_back(c.Subjects[i]);
  out.retention = from_js(c.Retention);
  out.storage = c.Storage == js_MemoryStorage ? storage_type::memory : storage_type::file;
  out.max_msgs = limit(c.MaxMsgs);
  out.max_bytes = limit(c.MaxBytes);
  out.max_msgs_per_subject = limit(c.MaxMsgsPerSubject);
  out.max_msg_size = c.MaxMsgSize > 0 ? c.MaxMsgSize : -1;
  out.max_age = from_ns(c.MaxAge);
  out.discard =
      c.Discard == js_DiscardNew ? discard_policy::new_messages : discard_policy::old_messages;
  out.duplicate_window = from_ns(c.Duplicates);
  out.replicas = static_cast<int>(c.Replicas);
  return out;
}

// The configuration as the server will report it, for comparison.
stream_config normalized(stream_config c) {
  c.max_msgs = limit(c.max_msgs);
  c.max_bytes = limit(c.max_bytes);
  c.max_msgs_per_subject = limit(c.max_msgs_per_subject);
  c.max_msg_size = c.max_msg_size > 0 ? c.max_msg_size : -1;
  if (c.duplicate_window <= duration::zero()) c.duplicate_window = 2min;
  if (c.max_age > duration::zero() && c.duplicate_window > c.max_age) {
    c.duplicate_window = c.max_age;
  }
  return c;
}

std::string differing_setting(const stream_config& have, const stream_config& want) {
  return detail::differing_setting(normalized(have), normalized(want));
}

jsDeliverPolicy to_js(deliver_policy p) {
  switch (p) {
    case deliver_policy::all: return js_DeliverAll;
    case deliver_policy::last: return js_DeliverLast;
    case deliver_policy::new_messages: return js_DeliverNew;
    case deliver_policy::by_start_sequence: return js_DeliverByStartSequence;
    case deliver_policy::by_start_time: return js_DeliverByStartTime;
  }
  return js_DeliverAll;
}

deliver_policy from_js(jsDeliverPolicy p) {
  switch (p) {
    case js_DeliverLast: return deliver_policy::last;
    case js_DeliverNew: return deliver_policy::new_messages;
    case js_DeliverByStartSequence: return deliver_policy::by_start_sequence;
    case js_DeliverByStartTime: return deliver_policy::by_start_time;
    default: return deliver_policy::all;
  }
}

// nats-server 2.9 finds the first sequence at or after a start time coarsely and can start
// a few messages late. A by-time consumer is therefore created a little early, with the
// exact time in its description, and fetch skips (acks) the messages before it.
constexpr auto k_start_time_margin = std::chrono::seconds(2);
constexpr std::string_view k_start_time_tag = "amp.start_time=";

std::optional<time_point> exact_start_time(std::string_view description) {
  if (description.substr(0, k_start_time_tag.size()) != k_start_time_tag) return std::nullopt;
  std::int64_t ns = 0;
  if (!parse_number(description.substr(k_start_time_tag.size()), ns)) return std::nullopt;
  return time_from_ns(ns);
}

consumer_config from_js(const std::string& stream, const jsConsumerConfig& c) {
  consumer_config out;
  out.stream = stream;
  out.durable = c.Durable ? c.Durable : (c.Name ? c.Name : "");
  out.filter_subject = c.FilterSubject ? c.FilterSubject : "";
  out.ack_wait = from_ns(c.AckWait);
  out.inactive_threshold = c.InactiveThreshold > 0 ? from_ns(c.InactiveThreshold) : duration{};
  out.max_ack_pending =
      c.MaxAckPending > 0 && c.MaxAckPending < k_unlimited_ack_pending ? c.MaxAckPending : -1;
  out.max_deliver = c.MaxDeliver > 0 ? c.MaxDeliver : -1;
  out.deliver = from_js(c.DeliverPolicy);
  out.start_seq = c.OptStartSeq;
  out.start_time = c.OptStartTime ? time_from_ns(c.OptStartTime) : time_point{};
  if (auto exact = exact_start_time(c.Description ? c.Description : "")) out.start_time = *exact;
  return out;
}

consumer_config normalized(consumer_config c) {
  c.max_ack_pending = c.max_ack_pending > 0 ? c.max_ack_pending : -1;
  c.max_deliver = c.max_deliver > 0 ? c.max_deliver : -1;
  if (c.deliver != deliver_policy::by_start_sequence) c.start_seq = 0;
  if (c.deliver != deliver_policy::by_start_time) c.start_time = {};
  // The start time comes back through cnats's time parsing, which is not exact below
  // the second.
  c.start_time =
      time_point(std::chrono::duration_cast<std::chrono::seconds>(c.start_time.time_since_epoch()));
  return c;
}

std::string differing_setting(const consumer_config& have, const consumer_config& want) {
  return detail::differing_setting(normalized(have), normalized(want));
}

std::string kv_stream(std::string_view bucket) {
  return fmt::format("KV_{}", bucket);
}
std::string kv_subject(std::string_view bucket, std::string_view key) {
  return fmt::format("$KV.{}.{}", bucket, key);
}

kv_op op_from_header(std::string_view v) {
  if (v == "DEL") return kv_op::del;
  if (v == "PURGE") return kv_op::purge;
  return kv_op::put;
}

// ----- subscriptions (ordered push consumers) ----------------------------------------

class js_subscription final : public subscription {
 public:
  explicit js_subscription(std::shared_ptr<serial_queue> q) : queue_(std::move(q)) {}
  ~js_subscription() override {
    stop();
    if (sub_) natsSubscription_Destroy(sub_);
  }
  void stop() noexcept override {
    std::call_once(stopped_, [this] {
      if (sub_) natsSubscription_Unsubscribe(sub_);
    });
    queue_->stop();
  }
  void attach(natsSubscription* sub) { sub_ = sub; }

 private:
  std::shared_ptr<serial_queue> queue_;
  natsSubscription* sub_ = nullptr;
  std::once_flag stopped_;
};

// What the cnats callback of an ordered consumer needs; owned by the callback closure.
struct push_state {
  detail::handler_error_sink sink;
  std::shared_ptr<serial_queue> queue;
  std::function<void(natsMsg*)> handle;  // runs on the cnats thread, pushes to the queue
};

void on_push(natsConnection*, natsSubscription*, natsMsg* m, void* closure) {
  in_callback_scope scope;
  auto* st = static_cast<push_state*>(closure);
  try {
    if (!st->queue->stopped()) {
      st->handle(m);
      st->queue->drain();
    }
  } catch (...) {  // handlers are guarded by the queue: this is the transport's own failure
    detail::report_current_exception(st->sink, "an ordered consumer");
  }
  natsMsg_Destroy(m);
}

void free_push_state(void* closure) {
  delete static_cast<push_state*>(closure);
}

// ----- the transport ------------------------------------------------------------------

class jetstream_backend final : public transport,
                                public std::enable_shared_from_this<jetstream_backend> {
 public:
  explicit jetstream_backend(std::shared_ptr<connection> conn)
      : conn_(std::move(conn)), sink_(conn_->sink()) {}

  result<void> detect_capabilities() {
    // Per-key TTL (nats-server 2.11) needs streams that accept `allow_msg_ttl`: older
    // servers drop the setting silently, so ask for it and read back what was kept.
    std::string name = fmt::format(
        "AMP_PROBE_{}", std::hash<std::thread::id>{}(std::this_thread::get_id()) % 1000000);
    auto created = conn_->api(fmt::format("$JS.API.STREAM.CREATE.{}", name),
                              fmt::format(R"({{"name":"{}","subjects":["$AMP.PROBE.{}"],)"
                                          R"("storage":"memory","allow_msg_ttl":true}})",
                                          name, name));
    if (!created) return created.error();
    per_key_ttl_ = created->find("\"allow_msg_ttl\":true") != std::string::npos;
    (void)conn_->api(fmt::format("$JS.API.STREAM.DELETE.{}", name), "");
    return {};
  }

  void handler_threw(std::string_view where) noexcept override {
    detail::report_current_exception(*sink_, where);
  }

  capabilities caps() const override {
    return {.backend = "jetstream", .persistent = true, .per_key_ttl = per_key_ttl_};
  }

  std::shared_ptr<amp::clock> clock() const override { return conn_->clock(); }

  result<void> ping() override {
    if (natsConnection_Status(conn_->nc()) != NATS_CONN_STATUS_CONNECTED) {
      return unexpected(errc::unavailable, "not connected to NATS");
    }
    auto r = conn_->api("$JS.API.INFO", "");
    if (!r) return r.error();
    simdjson::dom::element doc;
    if (local_parser().parse(*r).get(doc) != simdjson::SUCCESS) {
      return unexpected(errc::internal, "JetStream answered INFO with something other than JSON");
    }
    if (auto e = api_error(doc, "JetStream account info")) {
      return unexpected(errc::unavailable, e->message());
    }
    return {};
  }

  // ----- streams ----------------------------------------------------------------------

  result<stream_info> do_ensure_stream(const stream_config& config) override {
    auto existing = stream_info_of(config.name);
    if (existing) return compare(*existing, config);
    if (existing.error().code() != errc::not_found) return existing.error();
    auto made = write_stream(config, false);
    // Another process may have created it in the meantime: compare with what is there.
    if (!made && made.error().code() == errc::conflict) {
      if (auto now = stream_info_of(config.name)) return compare(*now, config);
    }
    return made;
  }

  result<stream_info> do_update_stream(const stream_config& config) override {
    auto existing = stream_info_of(config.name);
    if (!existing) return existing.error();
    if (auto fixed = detail::fixed_setting_change(existing->config, config); !fixed.empty()) {
      return unexpected(errc::conflict,
                        fmt::format("stream \"{}\": its {} cannot be changed", config.name, fixed));
    }
    return write_stream(config, true);
  }

  // Creates the stream, or updates it, and reads it back.
  result<stream_info> write_stream(const stream_config& config, bool update) {
    std::vector<const char*> subjects;
    for (const auto& s : config.subjects) subjects.push_back(s.c_str());
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = config.name.c_str();
    sc.Subjects = subjects.data();
    sc.SubjectsLen = static_cast<int>(subjects.size());
    sc.Retention = to_js(config.retention);
    sc.Storage = config.storage == storage_type::memory ? js_MemoryStorage : js_FileStorage;
    sc.MaxMsgs = limit(config.max_msgs);
    sc.MaxBytes = limit(config.max_bytes);
    sc.MaxMsgsPerSubject = limit(config.max_msgs_per_subject);
    sc.MaxMsgSize = config.max_msg_size > 0 ? config.max_msg_size : -1;
    sc.MaxAge = to_ns(config.max_age);
    sc.Discard = config.discard == discard_policy::new_messages ? js_DiscardNew : js_DiscardOld;
    sc.Duplicates = to_ns(normalized(config).duplicate_window);
    sc.Replicas = config.replicas;
    jsStreamInfo* si = nullptr;
    auto r = with_retry((update ? "update stream " : "create stream ") + config.name,
                        [&](jsErrCode& ec) {
                          return update ? js_UpdateStream(&si, conn_->js(), &sc, nullptr, &ec)
                                        : js_AddStream(&si, conn_->js(), &sc, nullptr, &ec);
                        });
    if (si) jsStreamInfo_Destroy(si);
    if (!r) return r.error();
    auto now = stream_info_of(config.name);
    if (!now) return now.error();
    now->config = config;
    return now;
  }

  result<stream_info> do_stream_info_of(std::string_view stream) override {
    std::string name(stream);
    jsStreamInfo* si = nullptr;
    auto r = with_retry("stream " + name, [&](jsErrCode& ec) {
      return js_GetStreamInfo(&si, conn_->js(), name.c_str(), nullptr, &ec);
    });
    if (!r) return r.error();
    stream_info out;
    out.config = from_js(*si->Config);
    out.state.messages = si->State.Msgs;
    out.state.bytes = si->State.Bytes;
    out.state.first_seq = si->State.FirstSeq;
    out.state.last_seq = si->State.LastSeq;
    out.state.consumers = static_cast<std::uint64_t>(si->State.Consumers);
    jsStreamInfo_Destroy(si);
    return out;
  }

  result<void> do_delete_stream(std::string_view stream) override {
    std::string name(stream);
    return with_retry("delete stream " + name, [&](jsErrCode& ec) {
      return js_DeleteStream(conn_->js(), name.c_str(), nullptr, &ec);
    });
  }

  result<message> do_get_message(std::string_view stream, std::uint64_t seq) override {
    return get_stored(stream, fmt::format(R"({{"seq":{}}})", seq),
                      fmt::format("message {} of stream \"{}\"", seq, stream));
  }

  result<message> do_get_last_message(std::string_view stream,
                                      std::string_view subject_filter) override {
    return get_stored(
        stream, fmt::format(R"({{"last_by_subj":{}}})", json_quote(subject_filter)),
        fmt::format("last message on \"{}\" in stream \"{}\"", subject_filter, stream));
  }

  void do_async_publish(outgoing_message msg, completion<publish_ack> done) override {
    done = detail::guarded(std::move(done), sink_, "publish");
    if (!msg.msg_id.empty()) msg.headers.emplace_back("Nats-Msg-Id", msg.msg_id);
    std::string subject = msg.subject;
    publish_to(std::move(subject), std::move(msg.data), std::move(msg.headers),
               [done = std::move(done)](result<publish_ack> r) { done(std::move(r)); });
  }

  // ----- consumers --------------------------------------------------------------------

  result<consumer_info> do_ensure_consumer(const consumer_config& config) override {
    auto existing = consumer_info_of(config.stream, config.durable);
    if (existing) {
      if (auto diff = differing_setting(existing->config, config); !diff.empty()) {
        return unexpected(errc::conflict, fmt::format("consumer \"{}\" exists with a different {}",
                                                      config.durable, diff));
      }
      existing->config = config;
      return existing;
    }
    if (existing.error().code() != errc::not_found) return existing.error();
    if (auto r = check_fits(config, true); !r) return r.error();
    return write_consumer(config, false);
  }

  result<consumer_info> do_update_consumer(const consumer_config& config) override {
    auto existing = consumer_info_of(config.stream, config.durable);
    if (!existing) return existing.error();
    auto a = normalized(existing->config);
    auto b = normalized(config);
    if (a.deliver != b.deliver || a.start_seq != b.start_seq || a.start_time != b.start_time) {
      return unexpected(
          errc::conflict,
          fmt::format("consumer \"{}\": the start position cannot be changed", config.durable));
    }
    if (auto r = check_fits(config, false); !r) return r.error();
    return write_consumer(config, true);
  }

  result<consumer_info> do_consumer_info_of(std::string_view stream,
                                            std::string_view durable) override {
    std::string s(stream), d(durable);
    jsConsumerInfo* ci = nullptr;
    auto r = with_retry(fmt::format("consumer \"{}\" of stream \"{}\"", d, s), [&](jsErrCode& ec) {
      return js_GetConsumerInfo(&ci, conn_->js(), s.c_str(), d.c_str(), nullptr, &ec);
    });
    if (!r) return r.error();
    auto out = info_of(s, *ci);
    jsConsumerInfo_Destroy(ci);
    return out;
  }

  result<void> do_delete_consumer(std::string_view stream, std::string_view durable) override {
    std::string s(stream), d(durable);
    remember_consumer(s, d, false);
    return with_retry(fmt::format("delete consumer \"{}\"", d), [&](jsErrCode& ec) {
      return js_DeleteConsumer(conn_->js(), s.c_str(), d.c_str(), nullptr, &ec);
    });
  }

  void do_async_fetch(std::string_view stream, std::string_view durable, fetch_request request,
                      completion<std::vector<message>> done) override {
    done = detail::guarded(std::move(done), sink_, "fetch");
    auto f = std::make_shared<fetch_state>();
    f->stream = std::string(stream);
    f->durable = std::string(durable);
    f->key = pull_key(stream, durable);
    f->batch = request.batch;
    f->max_wait = std::max(request.max_wait, duration::zero());
    f->deadline = conn_->clock()->now() + f->max_wait;
    f->done = std::move(done);
    if (enter_line(f)) start_fetch(f);
  }

  void do_async_acknowledge(const message& msg, ack_kind kind, duration nak_delay,
                            completion<void> done) override {
    done = detail::guarded(std::move(done), sink_, "acknowledge");
    if (msg.ack_token.substr(0, k_ack_prefix.size()) != k_ack_prefix ||
        subjects::check_subject(msg.ack_token).has_value() == false) {
      return done(error(errc::bad_request, "not an ack token of this transport"));
    }
    std::string body;
    switch (kind) {
      case ack_kind::ack: body = "+ACK"; break;
      case ack_kind::in_progress: body = "+WPI"; break;
      case ack_kind::term: body = "+TERM"; break;
      case ack_kind::nak:
        body = nak_delay > duration::zero()
                   ? fmt::format(R"(-NAK {{"delay":{}}})", to_ns(nak_delay))
                   : "-NAK";
        break;
    }
    // Nobody serves the ack subject of a consumer that is gone (deleted, or removed by
    // its inactive_threshold): that is `not_found`, not a retry until the deadline.
    connection::responders_check gone;
    if (auto fields = ack_fields(msg.ack_token)) {
      gone = [weak = weak_from_this(), stream = std::string((*fields)[0]),
              durable = std::string((*fields)[1])](auto verdict) {
        auto self = weak.lock();
        if (!self) return verdict(error(errc::unavailable, "transport closed"));
        self->check_consumer(stream, durable, std::move(verdict));
      };
    }
    conn_->request(
        msg.ack_token, std::move(body), {}, conn_->deadline(),
        [done = std::move(done)](result<nats_reply> r) {
          if (!r) return done(std::move(r).error());
          done({});
        },
        std::move(gone));
  }

  result<std::unique_ptr<subscription>> do_subscribe_ordered(
      const replay_request& request, std::function<void(const message&)> on_message) override {
    auto info = stream_info_of(request.stream);
    if (!info) return info.error();
    std::string filter = request.filter_subject;
    if (filter.empty() && info->config.subjects.size() == 1) filter = info->config.subjects[0];
    auto queue = std::make_shared<serial_queue>(*sink_);
    auto* st = new push_state{*sink_, queue, {}};
    std::optional<time_point> not_before;
    if (request.start == deliver_policy::by_start_time) not_before = request.start_time;
    // New messages are those after the stream's last one now, asked for by sequence: a
    // DeliverNew consumer that cnats recreates (missed heartbeats) before its first message
    // would start at the end again and skip what was published in between.
    replay_request start = request;
    if (start.start == deliver_policy::new_messages) {
      start.start = deliver_policy::by_start_sequence;
      start.start_seq = info->state.last_seq + 1;
    }
    // nats-server starts a replay from a sequence beyond the end at the end: skip up to it.
    std::uint64_t first_seq =
        start.start == deliver_policy::by_start_sequence ? start.start_seq : 0;
    st->handle = [queue, on_message = std::move(on_message), stream = request.stream, not_before,
                  first_seq](natsMsg* m) mutable {
      message out;
      out.stream = stream;
      out.subject = natsMsg_GetSubject(m);
      out.data = data_of(m);
      out.headers = headers_of(m);
      jsMsgMetaData* meta = nullptr;
      if (natsMsg_GetMetaData(&meta, m) == NATS_OK) {
        out.seq = meta->Sequence.Stream;
        out.time = time_from_ns(meta->Timestamp);
        jsMsgMetaData_Destroy(meta);
      }
      if (not_before) {
        if (out.time < *not_before) return;
        not_before.reset();  // in stream order from here on
      }
      if (out.seq < first_seq) return;
      queue->push([on_message, out = std::move(out)] { on_message(out); });
    };
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = request.stream.c_str();
    so.Ordered = true;
    so.Config.DeliverPolicy = to_js(start.start);
    so.Config.OptStartSeq = start.start_seq;
    // nats-server 2.9 can start a by-time replay a few messages late (its file store finds
    // the sequence for a time coarsely): start early and drop what is older.
    so.Config.OptStartTime = to_ns((request.start_time - 2s).time_since_epoch());
    return subscribe_push(filter, so, st, queue, "replay of stream " + request.stream);
  }

  // ----- KV ---------------------------------------------------------------------------

  result<void> do_ensure_bucket(const kv_config& config) override {
    auto r = create_bucket(config);
    if (r) note_bucket(config.bucket);
    return r;
  }

  // The stream of a bucket as cnats lays it out (js_CreateKeyValue), except that it allows
  // message deletes: a purge then deletes the key's old revisions one by one instead of
  // rolling them up (see async_kv_purge).
  result<void> create_bucket(const kv_config& config) {
    std::string name = kv_stream(config.bucket);
    auto existing = stream_info_of(name);
    if (existing) return compare_bucket(existing->config, config);
    if (existing.error().code() != errc::not_found) return existing.error();
    std::string subject = fmt::format("$KV.{}.>", config.bucket);
    const char* subjects[] = {subject.c_str()};
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = name.c_str();
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.MaxMsgsPerSubject = config.history;
    sc.MaxAge = to_ns(config.ttl);
    sc.MaxMsgSize = config.max_value_size > 0 ? config.max_value_size : -1;
    sc.Storage = config.storage == storage_type::memory ? js_MemoryStorage : js_FileStorage;
    sc.Replicas = config.replicas;
    sc.Discard = js_DiscardNew;
    sc.Duplicates = to_ns(config.ttl > duration::zero() ? std::min<duration>(config.ttl, 2min)
                                                        : duration(2min));
    sc.AllowRollup = true;
    sc.AllowDirect = true;
    sc.DenyDelete = false;
    jsStreamInfo* si = nullptr;
    auto r = with_retry(fmt::format("create bucket \"{}\"", config.bucket), [&](jsErrCode& ec) {
      return js_AddStream(&si, conn_->js(), &sc, nullptr, &ec);
    });
    if (si) jsStreamInfo_Destroy(si);
    if (!r) {
      // Another process may have created it in the meantime: compare with what is there.
      auto again = stream_info_of(name);
      if (again) return compare_bucket(again->config, config);
      return r.error();
    }
    return {};
  }

  // How a bucket's stream is set up, for reads (direct gets cost the server less than
  // STREAM.MSG.GET) and purges (deletes of single revisions, where the stream allows them).
  struct bucket_traits {
    bool direct = false;
    bool deletes = false;
  };

  void note_bucket(const std::string& bucket) {
    if (auto info = conn_->api(fmt::format("$JS.API.STREAM.INFO.{}", kv_stream(bucket)), "")) {
      learn_traits(bucket, *info);
    }
  }

  // Remembers the traits a STREAM.INFO answer shows; nothing when it shows none (an error).
  std::optional<bucket_traits> learn_traits(const std::string& bucket, const std::string& info) {
    simdjson::dom::element doc;
    simdjson::dom::element config;
    if (local_parser().parse(info).get(doc) != simdjson::SUCCESS ||
        doc["config"].get(config) != simdjson::SUCCESS) {
      return std::nullopt;
    }
    bool deny_delete = false;
    bucket_traits traits;
    read_field(config, "allow_direct", traits.direct);
    read_field(config, "deny_delete", deny_delete);
    traits.deletes = !deny_delete;
    std::lock_guard lock(buckets_mu_);
    buckets_[bucket] = traits;
    return traits;
  }

  std::optional<bucket_traits> traits_of(const std::string& bucket) {
    std::lock_guard lock(buckets_mu_);
    auto it = buckets_.find(bucket);
    if (it == buckets_.end()) return std::nullopt;
    return it->second;
  }

  // The traits, asked of the server the first time; nothing when it cannot tell (the
  // bucket is missing, the server does not answer).
  void async_traits_of(const std::string& bucket,
                       std::function<void(std::optional<bucket_traits>)> done) {
    if (auto known = traits_of(bucket)) return done(known);
    auto self = shared_from_this();
    conn_->request(fmt::format("$JS.API.STREAM.INFO.{}", kv_stream(bucket)), "", {},
                   conn_->deadline(), [self, bucket, done = std::move(done)](result<nats_reply> r) {
                     done(r ? self->learn_traits(bucket, r->data) : std::nullopt);
                   });
  }

  bool direct_get(const std::string& bucket) {
    auto traits = traits_of(bucket);
    return traits && traits->direct;
  }

  void forget_bucket(const std::string& bucket) {
    std::lock_guard lock(buckets_mu_);
    buckets_.erase(bucket);
  }

  result<void> do_delete_bucket(std::string_view bucket) override {
    forget_bucket(std::string(bucket));
    auto r = delete_stream(kv_stream(bucket));
    if (!r && r.error().code() == errc::not_found) {
      return unexpected(errc::not_found, fmt::format("bucket \"{}\" not found", bucket));
    }
    return r;
  }

  void do_async_kv_get(std::string_view bucket, std::string_view key,
                       completion<kv_entry> done) override {
    done = detail::guarded(std::move(done), sink_, "kv_get");
    last_entry(
        std::string(bucket), std::string(key),
        [done = std::move(done), key = std::string(key)](result<kv_entry> r) {
          if (r && r->op != kv_op::put) {
            return done(unexpected(errc::not_found, fmt::format("key \"{}\" not found", key)));
          }
          done(std::move(r));
        });
  }

  void do_async_kv_create(std::string_view bucket, std::string_view key, std::string value,
                          std::optional<duration> ttl, completion<std::uint64_t> done) override {
    done = detail::guarded(std::move(done), sink_, "kv_create");
    // Create is an update on "no revision"; where the key's last revision is a delete or
    // purge marker, it is an update on that marker.
    auto self = shared_from_this();
    std::string b(bucket), k(key);
    kv_write(b, k, value, "0", ttl,
             [self, b, k, value, ttl, done = std::move(done)](result<std::uint64_t> r) mutable {
               if (r || r.error().code() != errc::conflict) return done(std::move(r));
               self->last_entry(
                   b, k,
                   [self, b, k, value = std::move(value), ttl,
                    done = std::move(done)](result<kv_entry> last) mutable {
                     if (!last) {
                       return done(last.error().code() == errc::not_found
                                       ? unexpected(errc::conflict, "key changed during create")
                                       : unexpected(std::move(last).error()));
                     }
                     if (last->op == kv_op::put) {
                       return done(unexpected(
                           errc::conflict,
                           fmt::format("key \"{}\" exists (revision {})", k, last->revision)));
                     }
                     self->kv_write(b, k, std::move(value), std::to_string(last->revision), ttl,
                                    std::move(done));
                   });
             });
  }

  void do_async_kv_update(std::string_view bucket, std::string_view key, std::string value,
                          std::uint64_t expected_revision, std::optional<duration> ttl,
                          completion<std::uint64_t> done) override {
    done = detail::guarded(std::move(done), sink_, "kv_update");
    kv_write(std::string(bucket), std::string(key), std::move(value),
             std::to_string(expected_revision), ttl, std::move(done));
  }

  void do_async_kv_put(std::string_view bucket, std::string_view key, std::string value,
                       std::optional<duration> ttl, completion<std::uint64_t> done) override {
    done = detail::guarded(std::move(done), sink_, "kv_put");
    kv_write(std::string(bucket), std::string(key), std::move(value), {}, ttl, std::move(done));
  }

  void do_async_kv_delete(std::string_view bucket, std::string_view key,
                          completion<void> done) override {
    done = detail::guarded(std::move(done), sink_, "kv_delete");
    kv_marker(bucket, key, {{std::string(k_kv_op), "DEL"}}, std::move(done));
  }

  // A stream purge filtered on the key's subject: every revision goes, no marker is left.
  void do_async_kv_erase(std::string_view bucket, std::string_view key,
                         completion<void> done) override {
    done = detail::guarded(std::move(done), sink_, "kv_erase");
    auto self = shared_from_this();
    std::string b(bucket);
    std::string subject = fmt::format("$JS.API.STREAM.PURGE.{}", kv_stream(b));
    conn_->request(
        std::move(subject), fmt::format(R"({{"filter":{}}})", json_quote(kv_subject(b, key))), {},
        conn_->deadline(),
        [self, b, key = std::string(key), done = std::move(done)](result<nats_reply> r) {
          if (!r) return done(std::move(r).error());
          simdjson::dom::element doc;
          if (local_parser().parse(r->data).get(doc) != simdjson::SUCCESS) {
            return done(unexpected(
                errc::internal,
                fmt::format("erase of key \"{}\": JetStream answered with bad JSON", key)));
          }
          if (auto e = api_error(doc, fmt::format("erase of key \"{}\"", key))) {
            if (e->code() == errc::not_found) {
              self->forget_bucket(b);
              return done(unexpected(errc::not_found, fmt::format("bucket \"{}\" not found", b)));
            }
            return done(std::move(*e));
          }
          done({});
        });
  }

  // The marker, then each earlier revision deleted by its sequence; a rollup where the
  // bucket denies deletes. nats-server 2.9.10 moves every consumer of a stream that takes in
  // a rolled-up subject to the rollup's marker, past what it had not yet sent of other
  // subjects, so a watch would lose other keys' changes.
  void do_async_kv_purge(std::string_view bucket, std::string_view key,
                         completion<void> done) override {
    done = detail::guarded(std::move(done), sink_, "kv_purge");
    auto self = shared_from_this();
    std::string b(bucket);
    std::string k(key);
    async_traits_of(
        b, [self, b, k, done = std::move(done)](std::optional<bucket_traits> traits) mutable {
          bool deletes = traits && traits->deletes;
          header_list headers{{std::string(k_kv_op), "PURGE"}};
          if (!deletes) headers.emplace_back("Nats-Rollup", "sub");
          self->kv_publish(
              b, k, {}, std::move(headers),
              [self, b, k, deletes, done = std::move(done)](result<std::uint64_t> marker) mutable {
                if (!marker) return done(std::move(marker).error());
                if (!deletes) return done({});
                self->delete_revisions(b, k, 1, *marker, std::move(done));
              });
        });
  }

  result<std::vector<std::string>> do_kv_keys(std::string_view bucket) override {
    auto kv = open_bucket(bucket);
    if (!kv) return kv.error();
    kvKeysList list{};
    auto s = kvStore_Keys(&list, kv->get(), nullptr);
    std::vector<std::string> keys;
    if (s == NATS_NOT_FOUND) return keys;
    if (s != NATS_OK) return status_error(s, 0, fmt::format("keys of bucket \"{}\"", bucket));
    for (int i = 0; i < list.Count; ++i) keys.emplace_back(list.Keys[i]);
    kvKeysList_Destroy(&list);
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  result<std::vector<kv_entry>> do_kv_history(std::string_view bucket,
                                              std::string_view key) override {
    auto kv = open_bucket(bucket);
    if (!kv) return kv.error();
    kvEntryList list{};
    std::string k(key);
    auto s = kvStore_History(&list, kv->get(), k.c_str(), nullptr);
    if (s == NATS_NOT_FOUND)
      return unexpected(errc::not_found, fmt::format("key \"{}\" not found", key));
    if (s != NATS_OK) return status_error(s, 0, fmt::format("history of key \"{}\"", key));
    std::vector<kv_entry> out;
    for (int i = 0; i < list.Count; ++i) {
      auto* e = list.Entries[i];
      kv_entry entry;
      entry.bucket = std::string(bucket);
      entry.key = kvEntry_Key(e);
      auto len = kvEntry_ValueLen(e);
      if (len > 0) {
        entry.value.assign(static_cast<const char*>(kvEntry_Value(e)),
                           static_cast<std::size_t>(len));
      }
      entry.revision = kvEntry_Revision(e);
      entry.created = time_from_ns(kvEntry_Created(e));
      auto op = kvEntry_Operation(e);
      entry.op = op == kvOp_Delete ? kv_op::del : op == kvOp_Purge ? kv_op::purge : kv_op::put;
      out.push_back(std::move(entry));
    }
    kvEntryList_Destroy(&list);
    if (out.empty()) return unexpected(errc::not_found, fmt::format("key \"{}\" not found", key));
    return out;
  }

  result<std::unique_ptr<subscription>> do_kv_watch(std::string_view bucket,
                                                    const kv_watch_options& options,
                                                    kv_watch_handlers handlers) override {
    std::string key_filter = options.key_filter.empty() ? ">" : options.key_filter;
    std::string stream = kv_stream(bucket);
    auto info = stream_info_of(stream);
    if (!info) {
      if (info.error().code() == errc::not_found) {
        return unexpected(errc::not_found, fmt::format("bucket \"{}\" not found", bucket));
      }
      return info.error();
    }
    std::string prefix = fmt::format("$KV.{}.", bucket);
    auto queue = std::make_shared<serial_queue>(*sink_);
    struct watch_progress {
      std::atomic<bool> caught_up{false};
    };
    auto progress = std::make_shared<watch_progress>();
    auto on_caught_up = std::make_shared<std::function<void()>>(std::move(handlers.on_caught_up));
    auto on_entry = std::move(handlers.on_entry);
    auto mark_caught_up = [queue, progress, on_caught_up] {
      if (progress->caught_up.exchange(true)) return;
      if (*on_caught_up) queue->push(*on_caught_up);
    };
    bool updates_only = options.updates_only;
    bool include_history = options.include_history;
    // Updates are the revisions after the last one now, asked for by sequence (see
    // subscribe_ordered); older ones that the server may start with are skipped.
    const std::uint64_t first_update = info->state.last_seq + 1;
    auto* st = new push_state{*sink_, queue, {}};
    st->handle = [queue, progress, mark_caught_up, on_entry, prefix, b = std::string(bucket),
                  updates_only, include_history, first_update](natsMsg* m) {
      kv_entry e;
      e.bucket = b;
      std::string_view subject = natsMsg_GetSubject(m);
      e.key = std::string(subject.substr(prefix.size()));
      e.value = data_of(m);
      e.op = op_from_header(header_value(m, k_kv_op.data()));
      std::uint64_t pending = 0;
      jsMsgMetaData* meta = nullptr;
      if (natsMsg_GetMetaData(&meta, m) == NATS_OK) {
        e.revision = meta->Sequence.Stream;
        e.created = time_from_ns(meta->Timestamp);
        pending = meta->NumPending;
        jsMsgMetaData_Destroy(meta);
      }
      if (updates_only && e.revision < first_update) return;
      bool initial = !progress->caught_up && !updates_only;
      if (!(initial && !include_history && e.op != kv_op::put)) {
        queue->push([on_entry, e = std::move(e)] { on_entry(e); });
      }
      if (pending == 0) mark_caught_up();
    };
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream.c_str();
    so.Ordered = true;
    so.Config.DeliverPolicy = options.updates_only      ? js_DeliverByStartSequence
                              : options.include_history ? js_DeliverAll
                                                        : js_DeliverLastPerSubject;
    if (options.updates_only) so.Config.OptStartSeq = first_update;
    auto sub = subscribe_push(prefix + key_filter, so, st, queue,
                              fmt::format("watch of bucket \"{}\"", bucket));
    if (!sub) return sub;
    // Nothing to replay: report caught up now. Otherwise the last initial entry does.
    std::uint64_t matching = 0;
    if (!options.updates_only) {
      auto counted = count_matching(stream, prefix + key_filter);
      if (!counted) return counted.error();
      matching = *counted;
    }
    if (matching == 0) {
      // Pushed through the queue so that it is ordered with entries delivered meanwhile.
      mark_caught_up();
      queue->drain();
    }
    return sub;
  }

 private:
  struct fetch_state {
    std::string stream;
    std::string durable;
    std::string key;  // pull_key(stream, durable)
    std::size_t batch = 1;
    duration max_wait{};
    time_point deadline{};    // when max_wait runs out, counted from the call
    time_point not_before{};  // by-time consumers: older messages are skipped (acked)
    std::vector<message> got;
    completion<std::vector<message>> done;
    timer_id queue_timer = 0;  // while queued (guarded by lines_mu_)
  };

  // The fetches of one consumer take turns, so that it has one pull in flight at a time
  // (pulled messages are routed by consumer). The first is being served; the others wait.
  struct fetch_line {
    bool waiting = false;  // the fetch being served is in a waiting pull
    std::deque<std::shared_ptr<fetch_state>> queued;
  };

  // ----- helpers ----------------------------------------------------------------------

  template <class F>
  result<void> with_retry(const std::string& what, F&& call) {
    auto deadline = conn_->deadline();
    duration backoff = 50ms;
    while (true) {
      jsErrCode ec = static_cast<jsErrCode>(0);
      auto s = call(ec);
      if (s == NATS_OK) return {};
      if (retryable(s, ec) && conn_->clock()->now() + backoff < deadline &&
          natsConnection_Status(conn_->nc()) == NATS_CONN_STATUS_CONNECTED) {
        std::this_thread::sleep_for(backoff);
        backoff = std::min<duration>(backoff * 2, 500ms);
        continue;
      }
      return status_error(s, ec, what);
    }
  }

  static result<stream_info> compare(stream_info have, const stream_config& want) {
    if (auto diff = differing_setting(have.config, want); !diff.empty()) {
      return unexpected(errc::conflict,
                        fmt::format("stream \"{}\" exists with a different {}", want.name, diff));
    }
    have.config = want;
    return have;
  }

  static result<void> compare_bucket(const stream_config& have, const kv_config& want) {
    std::string diff;
    if (have.max_msgs_per_subject != want.history) {
      diff = fmt::format("history ({} vs {})", have.max_msgs_per_subject, want.history);
    } else if (have.max_age != want.ttl) {
      diff = "ttl";
    } else if (have.storage != want.storage) {
      diff = "storage";
    } else if (have.replicas != want.replicas) {
      diff = "replicas";
    } else if (have.max_msg_size != (want.max_value_size > 0 ? want.max_value_size : -1)) {
      diff = "max_value_size";
    }
    if (!diff.empty()) {
      return unexpected(errc::conflict,
                        fmt::format("bucket \"{}\" exists with a different {}", want.bucket, diff));
    }
    return {};
  }

  // The rules JetStream enforces only in part: the filter must lie in the stream, a
  // work-queue consumer delivers everything, and work-queue filters never overlap
  // (nats-server 2.9 accepts an overlapping update, and some overlapping creates).
  //
  // Creating a consumer whose filter is one concrete subject needs no listing: the server
  // refuses it when an existing filter matches it (and so scales to thousands of
  // per-participant consumers). Wildcard filters and updates are checked here.
  result<void> check_fits(const consumer_config& c, bool create) {
    auto info = stream_info_of(c.stream);
    if (!info) return info.error();
    if (auto r = detail::check_consumer_fits(info->config, c); !r) return r;
    if (info->config.retention != retention_policy::work_queue) return {};
    auto filter = detail::filter_or_all(c.filter_subject);
    if (create && !c.filter_subject.empty() && !has_wildcard(c.filter_subject)) return {};
    jsConsumerInfoList* list = nullptr;
    auto r = with_retry("consumers of stream " + c.stream, [&](jsErrCode& ec) {
      return js_Consumers(&list, conn_->js(), c.stream.c_str(), nullptr, &ec);
    });
    if (!r) {
      if (r.error().code() == errc::not_found) return {};
      return r.error();
    }
    result<void> verdict;
    for (int i = 0; list && i < list->Count; ++i) {
      auto other = from_js(c.stream, *list->List[i]->Config);
      if (other.durable == c.durable) continue;
      auto theirs = detail::filter_or_all(other.filter_subject);
      if (subjects::filters_overlap(filter, theirs)) {
        verdict = unexpected(errc::conflict,
                             fmt::format("consumer \"{}\": filter \"{}\" overlaps consumer \"{}\" "
                                         "(\"{}\") on work-queue stream \"{}\"",
                                         c.durable, filter, other.durable, theirs, c.stream));
        break;
      }
    }
    if (list) jsConsumerInfoList_Destroy(list);
    return verdict;
  }

  result<consumer_info> write_consumer(const consumer_config& config, bool update) {
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = config.durable.c_str();
    cc.AckPolicy = js_AckExplicit;
    cc.AckWait = to_ns(config.ack_wait);
    cc.InactiveThreshold = to_ns(config.inactive_threshold);  // sent when > 0
    cc.MaxAckPending =
        config.max_ack_pending > 0 ? config.max_ack_pending : k_unlimited_ack_pending;
    cc.MaxDeliver = config.max_deliver > 0 ? config.max_deliver : -1;
    cc.FilterSubject = config.filter_subject.empty() ? nullptr : config.filter_subject.c_str();
    cc.DeliverPolicy = to_js(config.deliver);
    if (config.deliver == deliver_policy::by_start_sequence) {
      cc.OptStartSeq = std::max<std::uint64_t>(config.start_seq, 1);
    }
    std::string description;
    if (config.deliver == deliver_policy::by_start_time) {
      // See exact_start_time: the server starts early, fetch skips what is older.
      cc.OptStartTime = to_ns((config.start_time - k_start_time_margin).time_since_epoch());
      description =
          fmt::format("{}{}", k_start_time_tag, to_ns(config.start_time.time_since_epoch()));
      cc.Description = description.c_str();
    }
    jsConsumerInfo* ci = nullptr;
    auto r = with_retry(
        fmt::format("{} consumer \"{}\"", update ? "update" : "create", config.durable),
        [&](jsErrCode& ec) {
          return update
                     ? js_UpdateConsumer(&ci, conn_->js(), config.stream.c_str(), &cc, nullptr, &ec)
                     : js_AddConsumer(&ci, conn_->js(), config.stream.c_str(), &cc, nullptr, &ec);
        });
    if (!r) return r.error();
    auto out = info_of(config.stream, *ci);
    jsConsumerInfo_Destroy(ci);
    if (auto diff = differing_setting(out.config, config); !diff.empty()) {
      return unexpected(errc::conflict, fmt::format("consumer \"{}\" exists with a different {}",
                                                    config.durable, diff));
    }
    out.config = config;
    return out;
  }

  static consumer_info info_of(const std::string& stream, const jsConsumerInfo& ci) {
    consumer_info out;
    out.config = from_js(stream, *ci.Config);
    out.num_pending = ci.NumPending;
    out.num_ack_pending = static_cast<std::uint64_t>(std::max<std::int64_t>(ci.NumAckPending, 0));
    out.num_redelivered = static_cast<std::uint64_t>(std::max<std::int64_t>(ci.NumRedelivered, 0));
    out.delivered_stream_seq = ci.Delivered.Stream;
    out.ack_floor_stream_seq = ci.AckFloor.Stream;
    return out;
  }

  result<message> get_stored(std::string_view stream, std::string payload,
                             const std::string& what) {
    auto r = conn_->api(fmt::format("$JS.API.STREAM.MSG.GET.{}", stream), std::move(payload));
    if (!r) return r.error();
    return parse_stored(std::string(stream), *r, what);
  }

  static result<message> parse_stored(std::string stream, const std::string& body,
                                      const std::string& what) {
    simdjson::dom::element doc;
    if (local_parser().parse(body).get(doc) != simdjson::SUCCESS) {
      return unexpected(errc::internal, fmt::format("{}: JetStream answered with bad JSON", what));
    }
    if (auto e = api_error(doc, what)) return *e;
    simdjson::dom::element m;
    if (doc["message"].get(m) != simdjson::SUCCESS) {
      return unexpected(errc::internal, fmt::format("{}: no message in the answer", what));
    }
    message out;
    out.stream = std::move(stream);
    std::string_view subject, data, hdrs, time;
    read_field(m, "subject", subject);
    read_field(m, "data", data);
    read_field(m, "hdrs", hdrs);
    read_field(m, "time", time);
    read_field(m, "seq", out.seq);
    out.subject = std::string(subject);
    out.data = base64_decode(data);
    if (!hdrs.empty()) out.headers = parse_header_block(base64_decode(hdrs));
    if (auto t = parse_timestamp(time)) out.time = *t;
    return out;
  }

  void publish_to(std::string subject, std::string data, header_list headers,
                  completion<publish_ack> done) {
    auto self = shared_from_this();
    std::string what = subject;
    conn_->request(
        std::move(subject), std::move(data), std::move(headers), conn_->deadline(),
        [what, done = std::move(done)](result<nats_reply> r) mutable {
          if (!r) return done(std::move(r).error());
          done(parse_pub_ack(r->data, what));
        },
        [self, what](std::function<void(std::optional<error>)> verdict) {
          self->check_stream_captures(what, std::move(verdict));
        });
  }

  static result<publish_ack> parse_pub_ack(const std::string& body, const std::string& subject) {
    simdjson::dom::element doc;
    auto what = fmt::format("publish to \"{}\"", subject);
    if (local_parser().parse(body).get(doc) != simdjson::SUCCESS) {
      return unexpected(errc::internal, fmt::format("{}: JetStream answered with bad JSON", what));
    }
    if (auto e = api_error(doc, what)) return *e;
    publish_ack ack;
    std::string_view stream;
    read_field(doc, "stream", stream);
    read_field(doc, "seq", ack.seq);
    read_field(doc, "duplicate", ack.duplicate);
    ack.stream = std::string(stream);
    return ack;
  }

  // "No responders" on a publish: either no stream captures the subject (not_found) or
  // the stream has no leader right now (retry). Asks JetStream which.
  void check_stream_captures(const std::string& subject,
                             std::function<void(std::optional<error>)> verdict) {
    conn_->request(
        "$JS.API.STREAM.NAMES", fmt::format(R"({{"subject":{}}})", json_quote(subject)), {},
        conn_->deadline(), [subject, verdict = std::move(verdict)](result<nats_reply> r) {
          simdjson::dom::element doc;
          std::int64_t total = 0;
          if (r && local_parser().parse(r->data).get(doc) == simdjson::SUCCESS &&
              doc["total"].get(total) == simdjson::SUCCESS && total == 0) {
            return verdict(
                error(errc::not_found, fmt::format("no stream captures subject \"{}\"", subject)));
          }
          verdict(std::nullopt);
        });
  }

  // One pull request. `n` messages at most; `expires` absent means no_wait.
  void pull(const std::shared_ptr<fetch_state>& f, std::size_t n, std::optional<duration> expires) {
    std::string body =
        expires
            ? fmt::format(R"({{"batch":{},"expires":{}}})", n, to_ns(*expires))
            // A no_wait pull that max_ack_pending holds back stays open on the server
            // (nats-server 2.9), to be served later to nobody: the expiry closes it.
            // The price: on an empty consumer the server answers only at the expiry.
            : fmt::format(R"({{"batch":{},"no_wait":true,"expires":{}}})", n, to_ns(k_pull_quiet));
    auto deadline = conn_->deadline() + (expires ? *expires : duration::zero());
    auto self = shared_from_this();
    auto received = std::make_shared<std::size_t>(0);
    set_waiting(f, expires.has_value());
    auto sent = conn_->send(
        fmt::format("$JS.API.CONSUMER.MSG.NEXT.{}.{}", f->stream, f->durable), body, nullptr,
        deadline,
        [self, f, n, expires, received](natsMsg* m) {
          auto status = header_value(m, "Status");
          if (natsMsg_IsNoResponders(m)) {
            // Nobody serves the consumer's pulls: it may be gone behind `known_`'s back
            // (removed by its inactive_threshold).
            self->check_consumer(f->stream, f->durable,
                                 [self, f, n, expires, received](std::optional<error> e) {
                                   if (e) return self->fail_fetch(f, std::move(*e));
                                   self->after_pull(f, n, expires, *received);
                                 });
            return true;
          }
          if (!status.empty()) {
            auto desc = header_value(m, "Description");
            if (status == "409" && desc.find("Deleted") != std::string::npos) {
              self->fail_fetch(f, error(errc::not_found,
                                        fmt::format("consumer \"{}\" was deleted", f->durable)));
              return true;
            }
            if (status == "100") return false;  // idle heartbeat
            self->after_pull(f, n, expires, *received);
            return true;
          }
          message msg;
          msg.subject = natsMsg_GetSubject(m);
          msg.data = data_of(m);
          msg.headers = headers_of(m);
          const char* reply = natsMsg_GetReply(m);
          if (!reply || !fill_from_ack_subject(msg, reply)) return false;
          msg.delivered_at = self->conn_->clock()->now();
          if (msg.time < f->not_before) {
            self->conn_->publish_raw(msg.ack_token, nullptr, "+ACK", nullptr);
          } else {
            f->got.push_back(std::move(msg));
          }
          if (++*received < n) return false;
          self->after_pull(f, n, expires, *received);
          return true;
        },
        [self, f, n, expires, received] {
          if (*received == 0 && !expires) {
            // A no_wait pull is always answered at once; silence means the consumer (or
            // the server) is not there.
            return self->explain_silent_pull(f);
          }
          self->after_pull(f, n, expires, *received);
        },
        &f->key);
    if (!sent) fail_fetch(f, std::move(sent).error());
  }

  void after_pull(const std::shared_ptr<fetch_state>& f, std::size_t,
                  std::optional<duration> expires, std::size_t received) {
    if (received == 0) answer_overdue(f);
    if (!expires) {
      if (!f->got.empty() || f->max_wait <= duration::zero()) return finish_fetch(f);
      if (f->got.size() >= f->batch) return finish_fetch(f);
      return pull(f, 1, f->max_wait);  // wait for the first message
    }
    // The waiting pull ended: with one message, take whatever else is there at once.
    if (received > 0 && f->got.size() < f->batch)
      return pull(f, f->batch - f->got.size(), std::nullopt);
    finish_fetch(f);
  }

  void explain_silent_pull(const std::shared_ptr<fetch_state>& f) {
    auto self = shared_from_this();
    // The consumer exists and the server answers: nothing could be delivered now
    // (max_ack_pending reached, or the server is slow).
    check_consumer(f->stream, f->durable, [self, f](std::optional<error> e) {
      if (e) return self->fail_fetch(f, std::move(*e));
      self->after_pull(f, f->batch, std::nullopt, 0);
    });
  }

  // Asks whether a consumer exists: an error to report, or nothing when it does.
  void check_consumer(const std::string& stream, const std::string& durable,
                      std::function<void(std::optional<error>)> verdict) {
    auto self = shared_from_this();
    conn_->request(fmt::format("$JS.API.CONSUMER.INFO.{}.{}", stream, durable), "", {},
                   conn_->deadline(),
                   [self, stream, durable, verdict = std::move(verdict)](result<nats_reply> r) {
                     if (!r) return verdict(std::move(r).error());
                     simdjson::dom::element doc;
                     if (local_parser().parse(r->data).get(doc) != simdjson::SUCCESS) {
                       return verdict(error(errc::internal, "consumer info: bad JSON"));
                     }
                     auto what = fmt::format("consumer \"{}\" of stream \"{}\"", durable, stream);
                     if (auto e = api_error(doc, what)) {
                       if (e->code() == errc::not_found) {
                         self->remember_consumer(stream, durable, false);
                       }
                       return verdict(std::move(*e));
                     }
                     std::string_view description;
                     simdjson::dom::element config;
                     if (doc["config"].get(config) == simdjson::SUCCESS) {
                       read_field(config, "description", description);
                     }
                     self->remember_consumer(stream, durable, true,
                                             exact_start_time(description).value_or(time_point{}));
                     verdict(std::nullopt);
                   });
  }

  // Whether the consumer is known to exist, and the exact start time of a by-time one.
  std::optional<time_point> known_consumer(const std::string& stream, const std::string& durable) {
    std::lock_guard lock(known_mu_);
    auto it = known_.find(stream + "." + durable);
    if (it == known_.end()) return std::nullopt;
    return it->second;
  }

  void remember_consumer(const std::string& stream, const std::string& durable, bool exists,
                         time_point not_before = {}) {
    std::lock_guard lock(known_mu_);
    if (exists) {
      known_[stream + "." + durable] = not_before;
    } else {
      known_.erase(stream + "." + durable);
    }
  }

  void finish_fetch(const std::shared_ptr<fetch_state>& f) {
    auto done = std::move(f->done);
    if (!done) return;
    leave_line(f);
    done(std::move(f->got));
  }

  void fail_fetch(const std::shared_ptr<fetch_state>& f, error e) {
    if (e.code() == errc::not_found) remember_consumer(f->stream, f->durable, false);
    // Messages already received are handed back for prompt redelivery.
    for (const auto& m : f->got) conn_->publish_raw(m.ack_token, nullptr, "-NAK", nullptr);
    f->got.clear();
    auto done = std::move(f->done);
    if (!done) return;
    leave_line(f);
    done(std::move(e));
  }

  // ----- fetches taking turns on a consumer -------------------------------------------

  // Whether `f` may start now; otherwise it waits behind the fetches of its consumer.
  bool enter_line(const std::shared_ptr<fetch_state>& f) {
    std::lock_guard lock(lines_mu_);
    auto [line, first] = lines_.try_emplace(f->key);
    if (first) return true;
    line->second.queued.push_back(f);
    arm_queue_timer(f, f->deadline, false);
    return false;
  }

  // With lines_mu_ held.
  void arm_queue_timer(const std::shared_ptr<fetch_state>& f, time_point at, bool last) {
    std::weak_ptr<jetstream_backend> weak = weak_from_this();
    f->queue_timer = conn_->clock()->call_at(at, [weak, f, last] {
      if (auto self = weak.lock()) return self->queued_fetch_due(f, last);
      auto done = std::move(f->done);
      if (done) done(error(errc::unavailable, "transport closed"));
    });
  }

  // A queued fetch's max_wait has passed (`last`: and op_timeout after it). If the fetch
  // ahead waits for a message, there is none for this one either: it answers empty. If
  // the one ahead is in a pull that answers at once, this one waits for its outcome (see
  // answer_overdue) or its own turn, then takes what is there without waiting, but waits
  // no longer than op_timeout.
  void queued_fetch_due(const std::shared_ptr<fetch_state>& f, bool last) {
    {
      std::lock_guard lock(lines_mu_);
      auto line = lines_.find(f->key);
      if (line == lines_.end()) return;
      auto& queued = line->second.queued;
      auto it = std::find(queued.begin(), queued.end(), f);
      if (it == queued.end()) return;  // started meanwhile
      if (!last && !line->second.waiting) {
        arm_queue_timer(f, f->deadline + conn_->op_timeout(), true);
        return;
      }
      queued.erase(it);
    }
    answer_queued(f);
  }

  // Completes a fetch that never started: nothing was available for it.
  static void answer_queued(const std::shared_ptr<fetch_state>& f) {
    auto done = std::move(f->done);
    if (done) done(std::vector<message>{});
  }

  // Records whether the fetch being served is in a waiting pull.
  void set_waiting(const std::shared_ptr<fetch_state>& f, bool waiting) {
    std::lock_guard lock(lines_mu_);
    auto line = lines_.find(f->key);
    if (line != lines_.end()) line->second.waiting = waiting;
  }

  // A pull of `f` found nothing: the queued fetches whose max_wait has passed answer empty.
  void answer_overdue(const std::shared_ptr<fetch_state>& f) {
    std::vector<std::shared_ptr<fetch_state>> overdue;
    {
      std::lock_guard lock(lines_mu_);
      auto line = lines_.find(f->key);
      if (line == lines_.end()) return;
      auto now = conn_->clock()->now();
      auto& queued = line->second.queued;
      for (auto it = queued.begin(); it != queued.end();) {
        if ((*it)->deadline <= now) {
          conn_->clock()->cancel((*it)->queue_timer);
          overdue.push_back(std::move(*it));
          it = queued.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const auto& q : overdue) answer_queued(q);
  }

  // `f` is done: the next queued fetch of its consumer starts.
  void leave_line(const std::shared_ptr<fetch_state>& f) {
    std::shared_ptr<fetch_state> next;
    {
      std::lock_guard lock(lines_mu_);
      auto line = lines_.find(f->key);
      if (line == lines_.end()) return;
      line->second.waiting = false;
      if (line->second.queued.empty()) {
        lines_.erase(line);
        return;
      }
      next = std::move(line->second.queued.front());
      line->second.queued.pop_front();
      conn_->clock()->cancel(next->queue_timer);
    }
    // With what is left of its max_wait (none left: it takes what is there, at once).
    auto left = next->deadline - conn_->clock()->now();
    next->max_wait = left >= 1ms ? left : duration::zero();
    // Started from the outermost call on this thread: a fetch that fails at once (the
    // connection is down) would otherwise start the next one from within, and so on.
    using start_list =
        std::deque<std::pair<std::shared_ptr<jetstream_backend>, std::shared_ptr<fetch_state>>>;
    thread_local start_list* starting = nullptr;
    if (starting) {
      starting->emplace_back(shared_from_this(), std::move(next));
      return;
    }
    start_list todo;
    todo.emplace_back(shared_from_this(), std::move(next));
    struct outermost {
      explicit outermost(start_list* list) { starting = list; }
      ~outermost() { starting = nullptr; }
      outermost(const outermost&) = delete;
      outermost& operator=(const outermost&) = delete;
    } scope(&todo);
    while (!todo.empty()) {
      auto [backend, g] = std::move(todo.front());
      todo.pop_front();
      backend->start_fetch(g);
    }
  }

  void start_fetch(const std::shared_ptr<fetch_state>& f) {
    if (auto known = known_consumer(f->stream, f->durable)) {
      f->not_before = *known;
      return pull(f, f->batch, std::nullopt);
    }
    // A pull on a missing consumer is never answered: check once before the first one.
    auto self = shared_from_this();
    check_consumer(f->stream, f->durable, [self, f](std::optional<error> e) {
      if (e) return self->fail_fetch(f, std::move(*e));
      f->not_before = self->known_consumer(f->stream, f->durable).value_or(time_point{});
      self->pull(f, f->batch, std::nullopt);
    });
  }

  result<std::unique_ptr<subscription>> subscribe_push(const std::string& filter, jsSubOptions& so,
                                                       push_state* st,
                                                       std::shared_ptr<serial_queue> queue,
                                                       const std::string& what) {
    auto sub = std::make_unique<js_subscription>(queue);
    natsSubscription* ns = nullptr;
    jsErrCode ec = static_cast<jsErrCode>(0);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = std::max<std::int64_t>(1, to_ms(conn_->op_timeout()));
    auto s = js_Subscribe(&ns, conn_->js(), filter.empty() ? nullptr : filter.c_str(), &on_push, st,
                          &jo, &so, &ec);
    if (s != NATS_OK) {
      delete st;
      return status_error(s, ec, what);
    }
    natsSubscription_SetOnCompleteCB(ns, &free_push_state, st);
    natsSubscription_SetPendingLimits(ns, -1, -1);
    sub->attach(ns);
    return std::unique_ptr<subscription>(std::move(sub));
  }

  result<std::uint64_t> count_matching(const std::string& stream, const std::string& filter) {
    auto r = conn_->api(fmt::format("$JS.API.STREAM.INFO.{}", stream),
                        fmt::format(R"({{"subjects_filter":{}}})", json_quote(filter)));
    if (!r) return r.error();
    simdjson::dom::element doc;
    if (local_parser().parse(*r).get(doc) != simdjson::SUCCESS) {
      return unexpected(errc::internal, "stream info: bad JSON");
    }
    if (auto e = api_error(doc, "stream info")) return *e;
    simdjson::dom::object subs;
    if (doc["state"]["subjects"].get(subs) != simdjson::SUCCESS) return std::uint64_t{0};
    std::uint64_t n = 0;
    for (auto field : subs) {
      std::uint64_t c = 0;
      if (field.value.get(c) == simdjson::SUCCESS) n += c;
    }
    return n;
  }

  // ----- KV internals -----------------------------------------------------------------

  void kv_write(const std::string& bucket, const std::string& key, std::string value,
                std::string expected, std::optional<duration> ttl, completion<std::uint64_t> done) {
    header_list headers;
    if (!expected.empty()) headers.emplace_back("Nats-Expected-Last-Subject-Sequence", expected);
    if (ttl) {
      headers.emplace_back(
          "Nats-TTL",
          fmt::format("{}s",
                      std::max<std::int64_t>(
                          1, std::chrono::duration_cast<std::chrono::seconds>(*ttl).count())));
    }
    kv_publish(bucket, key, std::move(value), std::move(headers), std::move(done));
  }

  void kv_publish(const std::string& bucket, const std::string& key, std::string value,
                  header_list headers, completion<std::uint64_t> done) {
    auto self = shared_from_this();
    publish_to(kv_subject(bucket, key), std::move(value), std::move(headers),
               [self, bucket, key, done = std::move(done)](result<publish_ack> r) {
                 if (!r) {
                   auto e = std::move(r).error();
                   if (e.code() == errc::not_found) {
                     return done(unexpected(errc::not_found,
                                            fmt::format("bucket \"{}\" not found", bucket)));
                   }
                   if (e.code() == errc::conflict) {
                     self->read_from_leader(bucket, key);
                     return done(unexpected(errc::conflict,
                                            fmt::format("key \"{}\": {}", key, e.message())));
                   }
                   return done(std::move(e));
                 }
                 done(r->seq);
               });
  }

  void kv_marker(std::string_view bucket, std::string_view key, header_list headers,
                 completion<void> done) {
    kv_publish(std::string(bucket), std::string(key), {}, std::move(headers),
               [done = std::move(done)](result<std::uint64_t> r) {
                 if (!r) return done(std::move(r).error());
                 done({});
               });
  }

  // Deletes the key's revisions from `from` up to, not including, `before`: each found with
  // STREAM.MSG.GET next_by_subj, then removed by delete_revision.
  void delete_revisions(std::string bucket, std::string key, std::uint64_t from,
                        std::uint64_t before, completion<void> done) {
    auto self = shared_from_this();
    std::string query =
        fmt::format(R"({{"seq":{},"next_by_subj":{}}})", from, json_quote(kv_subject(bucket, key)));
    // Both made before `bucket` moves into the callback.
    std::string subject = fmt::format("$JS.API.STREAM.MSG.GET.{}", kv_stream(bucket));
    conn_->request(
        std::move(subject), std::move(query), {}, conn_->deadline(),
        [self, bucket = std::move(bucket), key = std::move(key), before,
         done = std::move(done)](result<nats_reply> r) mutable {
          if (!r) return done(std::move(r).error());
          auto m =
              parse_stored(kv_stream(bucket), r->data, fmt::format("purge of key \"{}\"", key));
          if (!m) {
            if (m.error().code() == errc::not_found) return done({});
            return done(std::move(m).error());
          }
          if (m->seq >= before) return done({});
          self->delete_revision(std::move(bucket), std::move(key), m->seq, before, std::move(done));
        });
  }

  // Deletes revision `seq`, then goes on with the next ones below `before`.
  void delete_revision(std::string bucket, std::string key, std::uint64_t seq, std::uint64_t before,
                       completion<void> done) {
    auto self = shared_from_this();
    // Made before `bucket` moves into the callback.
    std::string subject = fmt::format("$JS.API.STREAM.MSG.DELETE.{}", kv_stream(bucket));
    conn_->request(
        std::move(subject), fmt::format(R"({{"seq":{},"no_erase":true}})", seq), {},
        conn_->deadline(),
        [self, bucket = std::move(bucket), key = std::move(key), seq, before,
         done = std::move(done)](result<nats_reply> r) mutable {
          if (!r) return done(std::move(r).error());
          auto what = fmt::format("purge of key \"{}\"", key);
          simdjson::dom::element doc;
          if (local_parser().parse(r->data).get(doc) != simdjson::SUCCESS) {
            return done(unexpected(errc::internal,
                                   fmt::format("{}: JetStream answered with bad JSON", what)));
          }
          // Gone already (the history limit, or another purge) is as good as deleted.
          if (auto e = api_error(doc, what); e && e->code() != errc::not_found) {
            self->forget_bucket(bucket);  // made again, denying deletes, perhaps
            return done(std::move(*e));
          }
          self->delete_revisions(std::move(bucket), std::move(key), seq + 1, before,
                                 std::move(done));
        });
  }

  // A compare-and-set on the key was refused: for a while its reads go to the stream's
  // leader. A direct get may be answered by any replica, and nats-server 2.9.10 can bring a
  // restarted node back with a replica whose sequences differ from the leader's: read there,
  // the key's revision never matches, and every compare-and-set on it would be refused.
  void read_from_leader(const std::string& bucket, const std::string& key) {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(leader_reads_mu_);
    if (leader_reads_.size() >= k_leader_reads_max) {
      std::erase_if(leader_reads_, [now](const auto& kv) { return kv.second <= now; });
      if (leader_reads_.size() >= k_leader_reads_max) leader_reads_.clear();
    }
    leader_reads_[bucket + '\0' + key] = now + k_leader_read_for;
  }

  bool reads_from_leader(const std::string& bucket, const std::string& key) {
    std::lock_guard lock(leader_reads_mu_);
    if (leader_reads_.empty()) return false;
    auto it = leader_reads_.find(bucket + '\0' + key);
    if (it == leader_reads_.end()) return false;
    if (it->second > std::chrono::steady_clock::now()) return true;
    leader_reads_.erase(it);
    return false;
  }

  // The key's last revision, markers included.
  void last_entry(const std::string& bucket, const std::string& key, completion<kv_entry> done) {
    std::string subject = kv_subject(bucket, key);
    if (direct_get(bucket) && !reads_from_leader(bucket, key)) {
      return last_entry_direct(bucket, key, std::move(done));
    }
    conn_->request(
        fmt::format("$JS.API.STREAM.MSG.GET.{}", kv_stream(bucket)),
        fmt::format(R"({{"last_by_subj":{}}})", json_quote(subject)), {}, conn_->deadline(),
        [bucket, key, done = std::move(done)](result<nats_reply> r) {
          if (!r) return done(std::move(r).error());
          auto m = parse_stored(kv_stream(bucket), r->data, fmt::format("key \"{}\"", key));
          if (!m) {
            auto e = std::move(m).error();
            if (e.code() == errc::not_found) {
              bool no_bucket = e.message().find("stream not found") != std::string::npos;
              return done(unexpected(errc::not_found,
                                     no_bucket ? fmt::format("bucket \"{}\" not found", bucket)
                                               : fmt::format("key \"{}\" not found", key)));
            }
            return done(std::move(e));
          }
          kv_entry e;
          e.bucket = bucket;
          e.key = key;
          e.revision = m->seq;
          e.created = m->time;
          e.op = op_from_header(find_header(m->headers, k_kv_op).value_or(""));
          if (e.op == kv_op::put) e.value = std::move(m->data);
          done(std::move(e));
        });
  }

  void last_entry_direct(const std::string& bucket, const std::string& key,
                         completion<kv_entry> done) {
    auto self = shared_from_this();
    conn_->request(
        fmt::format("$JS.API.DIRECT.GET.{}.{}", kv_stream(bucket), kv_subject(bucket, key)), "", {},
        conn_->deadline(),
        [bucket, key, done = std::move(done)](result<nats_reply> r) {
          if (!r) return done(std::move(r).error());
          auto* m = r->msg;
          auto status = header_value(m, "Status");
          if (status == "404") {
            return done(unexpected(errc::not_found, fmt::format("key \"{}\" not found", key)));
          }
          if (!status.empty()) {
            return done(
                unexpected(errc::internal, fmt::format("key \"{}\": JetStream answered {} {}", key,
                                                       status, header_value(m, "Description"))));
          }
          kv_entry e;
          e.bucket = bucket;
          e.key = key;
          parse_number(header_value(m, "Nats-Sequence"), e.revision);
          if (auto t = parse_timestamp(header_value(m, "Nats-Time-Stamp"))) e.created = *t;
          e.op = op_from_header(header_value(m, k_kv_op.data()));
          if (e.op == kv_op::put) e.value = std::move(r->data);
          done(std::move(e));
        },
        // Nobody serves direct gets for it: the bucket is gone.
        [self, bucket](std::function<void(std::optional<error>)> verdict) {
          self->forget_bucket(bucket);
          verdict(error(errc::not_found, fmt::format("bucket \"{}\" not found", bucket)));
        });
  }

  struct kv_handle_deleter {
    void operator()(kvStore* kv) const { kvStore_Destroy(kv); }
  };
  using kv_handle = std::unique_ptr<kvStore, kv_handle_deleter>;

  result<kv_handle> open_bucket(std::string_view bucket) {
    kvStore* kv = nullptr;
    std::string b(bucket);
    auto s = js_KeyValue(&kv, conn_->js(), b.c_str());
    if (s != NATS_OK) {
      if (s == NATS_NOT_FOUND) {
        return unexpected(errc::not_found, fmt::format("bucket \"{}\" not found", bucket));
      }
      auto e = status_error(s, 0, fmt::format("bucket \"{}\"", bucket));
      if (e.code() == errc::internal) {
        return unexpected(errc::not_found, fmt::format("bucket \"{}\" not found", bucket));
      }
      return e;
    }
    return kv_handle(kv);
  }

  std::shared_ptr<connection> conn_;
  std::shared_ptr<const detail::handler_error_sink> sink_;
  bool per_key_ttl_ = false;
  std::mutex buckets_mu_;
  std::map<std::string, bucket_traits> buckets_;  // buckets seen to exist
  std::mutex known_mu_;
  std::map<std::string, time_point> known_;  // "<stream>.<consumer>" seen to exist
  static constexpr std::size_t k_leader_reads_max = 65536;
  static constexpr auto k_leader_read_for = std::chrono::seconds(10);
  std::mutex leader_reads_mu_;
  // "<bucket>\0<key>" read from the leader until then (read_from_leader)
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> leader_reads_;
  std::mutex lines_mu_;
  std::unordered_map<std::string, fetch_line> lines_;  // consumers with a fetch being served
};

}  // namespace

std::string redact_nats_url(std::string_view url) {
  std::string out;
  bool first = true;
  for (auto u : split(url, ',')) {
    if (!std::exchange(first, false)) out += ',';
    const auto scheme = u.find("://");
    const auto start = scheme == std::string_view::npos ? 0 : scheme + 3;
    const auto end = u.find_first_of("/?#", start);
    const auto at = u.substr(0, end).rfind('@');
    if (at == std::string_view::npos || at < start) {
      out += u;
      continue;
    }
    const auto colon = u.substr(start, at - start).find(':');
    out += u.substr(0, colon == std::string_view::npos ? start : start + colon + 1);
    out += "***";
    out += u.substr(at);
  }
  return out;
}

result<std::shared_ptr<transport>> jetstream_transport::connect(jetstream_options options) {
  auto clock = options.clock ? options.clock : system_clock_source::shared();
  // The last reference may go away in a handler on a cnats thread, where closing the
  // connection would wait for that very thread: it is closed from another one then.
  auto sink = std::make_shared<const detail::handler_error_sink>(options.on_handler_error);
  auto conn = std::shared_ptr<connection>(new connection(clock, options.op_timeout, sink),
                                          [](connection* c) {
                                            if (callback_depth > 0) {
                                              std::thread([c] { delete c; }).detach();
                                            } else {
                                              delete c;
                                            }
                                          });
  if (auto r = conn->open(options); !r) return r.error();
  auto backend = std::make_shared<jetstream_backend>(conn);
  if (auto r = backend->ping(); !r) return r.error();
  if (auto r = backend->detect_capabilities(); !r) return r.error();
  return std::shared_ptr<transport>(backend);
}

}  // namespace amp
