#include "transport/jetstream/connection.hpp"

#include <fmt/format.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <thread>

#include "amp/names.hpp"
#include "detail/wait_for.hpp"

namespace amp::jetstream_detail {

bool collector_callback_known() {
  static const bool known = [] {
    void* free_fn = dlsym(RTLD_DEFAULT, "natsMsg_free");
    natsMsg* m = nullptr;
    if (free_fn == nullptr || natsMsg_Create(&m, "amp.probe", nullptr, "", 0) != NATS_OK) {
      return false;
    }
    std::array<void*, 2> gc{};
    std::memcpy(gc.data(), m, sizeof gc);
    natsMsg_Destroy(m);
    return gc[0] == nullptr && gc[1] == free_fn;
  }();
  return known;
}

void destroy_here(natsMsg* m) {
  if (collector_callback_known()) {
    void* none = nullptr;
    std::memcpy(reinterpret_cast<char*>(m) + sizeof(void*), &none, sizeof none);
  }
  natsMsg_Destroy(m);
}

connection::~connection() {
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
    // What is buffered (acks, say) goes out before the socket closes.
    flush_writes();
    natsConnection_Close(nc_);
    // No call into cnats is left on the loop's thread once it is joined; only then may the
    // connection be freed.
    loop_.reset();
    natsConnection_Destroy(nc_);
  }
}

result<void> connection::open(const jetstream_options& o) {
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
  if (natsOptions_SetServers(opts, url_ptrs.data(), static_cast<int>(url_ptrs.size())) != NATS_OK) {
    return unexpected(errc::bad_request,
                      fmt::format("bad nats url \"{}\"", redact_nats_url(o.url)));
  }
  natsOptions_SetName(opts, o.name.c_str());
  // SendAsap: a publish asks to be written at once instead of waking cnats's flusher thread,
  // which waits a millisecond before it writes; with the socket loop that request is served
  // by the publisher or its write batch (socket_loop.hpp).
  natsOptions_SetSendAsap(opts, true);
  try {
    loop_ = std::make_unique<socket_loop>();
  } catch (const std::exception& e) {
    return unexpected(errc::internal,
                      fmt::format("cannot start the NATS socket thread: {}", e.what()));
  }
  if (loop_->install(opts) != NATS_OK) {
    return unexpected(errc::internal, "cannot use the NATS socket thread");
  }
  natsOptions_SetTimeout(opts, std::max<std::int64_t>(1, to_ms(o.connect_timeout)));
  natsOptions_SetMaxReconnect(opts, -1);
  natsOptions_SetReconnectWait(opts, std::max<std::int64_t>(1, to_ms(o.reconnect_wait)));
  // No reconnect buffer worth the name: a request made while the server is away fails
  // at once instead of being sent after we have answered `unavailable`.
  natsOptions_SetReconnectBufSize(opts, 1);
  natsOptions_SetPingInterval(opts, 2000);
  natsOptions_SetMaxPingsOut(opts, 2);
  natsOptions_SetMaxPendingMsgs(opts, 1 << 20);
  if (!o.domain.empty()) {
    if (!valid_jetstream_domain(o.domain)) {
      return unexpected(errc::bad_request,
                        fmt::format("bad JetStream domain {}: letters, digits, - and _ only",
                                    amp::quoted(o.domain)));
    }
    api_prefix_ = fmt::format("$JS.{}.API.", o.domain);
    domain_ = o.domain;
  }
  if (!o.tls_ca.empty() || !o.tls_cert.empty() || !o.tls_key.empty()) {
    if (natsOptions_SetSecure(opts, true) != NATS_OK) {
      return unexpected(errc::bad_request, "TLS is not available in this cnats");
    }
    if (!o.tls_ca.empty() &&
        natsOptions_LoadCATrustedCertificates(opts, o.tls_ca.c_str()) != NATS_OK) {
      return unexpected(errc::bad_request, fmt::format("cannot use TLS CA file \"{}\": {}",
                                                       o.tls_ca, nats_GetLastError(nullptr)));
    }
    if (o.tls_cert.empty() != o.tls_key.empty()) {
      return unexpected(errc::bad_request,
                        "a TLS client certificate needs its key, and a key its certificate");
    }
    if (!o.tls_cert.empty() &&
        natsOptions_LoadCertificatesChain(opts, o.tls_cert.c_str(), o.tls_key.c_str()) != NATS_OK) {
      return unexpected(errc::bad_request,
                        fmt::format("cannot use TLS certificate \"{}\" with key \"{}\": {}",
                                    o.tls_cert, o.tls_key, nats_GetLastError(nullptr)));
    }
  }
  if (!o.creds_file.empty() &&
      natsOptions_SetUserCredentialsFromFiles(opts, o.creds_file.c_str(), nullptr) != NATS_OK) {
    return unexpected(errc::bad_request,
                      fmt::format("cannot use credentials file \"{}\"", o.creds_file));
  }
  auto s = natsConnection_Connect(&nc_, opts);
  if (s != NATS_OK) {
    // cnats's last error says more than the status (which certificate check failed, say).
    const char* detail = nats_GetLastError(nullptr);
    return unexpected(errc::unavailable,
                      fmt::format("cannot connect to {}: {}", redact_nats_url(o.url),
                                  detail && *detail ? detail : natsStatus_GetText(s)));
  }
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.Wait = std::max<std::int64_t>(1, to_ms(op_timeout_));
  if (!domain_.empty()) jo.Domain = domain_.c_str();
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

result<void> connection::send(const std::string& subject, std::string_view data,
                              const header_list* headers, time_point deadline,
                              std::function<bool(natsMsg*)> on_msg,
                              std::function<void()> on_timeout, const std::string* consumer) {
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
  auto s = api_prefix_.empty() ? publish_raw(subject, reply.c_str(), data, headers)
                               : publish_raw(routed(subject), reply.c_str(), data, headers);
  if (s != NATS_OK) {
    forget(token);
    return unexpected(status_error(s, 0, fmt::format("send to {}", subject)));
  }
  return {};
}

std::string connection::connected_url() const {
  std::array<char, 512> buffer{};
  if (natsConnection_GetConnectedUrl(nc_, buffer.data(), buffer.size()) != NATS_OK) return {};
  return buffer.data();
}

std::string connection::routed(const std::string& subject) const {
  if (api_prefix_.empty()) return subject;
  // JetStream API requests go to the domain's API. So do KV writes: nats-server denies
  // `$KV.>` across leaf connections between domains, and takes them in by the domain's
  // API prefix (`$JS.<domain>.API.$KV.<bucket>.<key>`).
  constexpr std::string_view k_api = "$JS.API.";
  if (subject.starts_with(k_api)) return api_prefix_ + subject.substr(k_api.size());
  if (subject.starts_with("$KV.")) return api_prefix_ + subject;
  return subject;
}

natsStatus connection::publish_raw(const std::string& subject, const char* reply,
                                   std::string_view data, const header_list* headers) {
  // cnats would still buffer the first message sent while it reconnects and deliver it
  // later, after we have answered `unavailable`.
  if (natsConnection_Status(nc_) != NATS_CONN_STATUS_CONNECTED) return NATS_CONNECTION_DISCONNECTED;
  natsStatus s = NATS_OK;
  socket_loop::publishing(true);
  if (!headers || headers->empty()) {
    // Without headers no natsMsg is needed (whose destruction wakes cnats's GC thread).
    auto len = static_cast<int>(data.size());
    s = reply ? natsConnection_PublishRequest(nc_, subject.c_str(), reply, data.data(), len)
              : natsConnection_Publish(nc_, subject.c_str(), data.data(), len);
  } else {
    natsMsg* m = nullptr;
    s = natsMsg_Create(&m, subject.c_str(), reply, data.data(), static_cast<int>(data.size()));
    if (s == NATS_OK) {
      for (const auto& [k, v] : *headers) natsMsgHeader_Add(m, k.c_str(), v.c_str());
      s = natsConnection_PublishMsg(nc_, m);
      destroy_here(m);
    }
  }
  socket_loop::publishing(false);
  // Even a failed publish may have left bytes in cnats's buffer.
  if (detail::write_batch::open()) {
    if (auto self = weak_from_this().lock(); self && detail::write_batch::defer(self)) return s;
  }
  flush_writes();
  return s;
}

void connection::flush_writes() noexcept {
  if (nc_ && loop_) loop_->write(nc_);
}

void connection::request(std::string subject, std::string data, header_list headers,
                         time_point deadline, completion<nats_reply> done,
                         responders_check on_no_responders) {
  auto state = std::make_shared<request_state>();
  state->subject = std::move(subject);
  state->data = std::move(data);
  state->headers = std::move(headers);
  state->deadline = deadline;
  state->done = std::move(done);
  state->on_no_responders = std::move(on_no_responders);
  attempt(state);
}

result<std::string> connection::api(const std::string& subject, std::string payload) {
  auto r = detail::wait_for<nats_reply>([&](completion<nats_reply> done) {
    request(subject, std::move(payload), {}, deadline(), std::move(done));
  });
  if (!r) return r.error();
  return std::move(r->data);
}

void connection::attempt(const std::shared_ptr<request_state>& st) {
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

void connection::retry_later(const std::shared_ptr<request_state>& st, bool no_responders) {
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
    st->done(unexpected(errc::unavailable,
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

void connection::on_reply(natsConnection*, natsSubscription* sub, natsMsg* m, void* closure) {
  in_callback_scope scope;
  // What the answers queued behind this one publish goes out with what this one publishes.
  detail::write_batch batch;
  if (int queued = 0; natsSubscription_GetPending(sub, &queued, nullptr) == NATS_OK && queued > 0) {
    batch.hold();
  }
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
  destroy_here(m);
}

void connection::hand_back(natsMsg* m) {
  const char* reply = natsMsg_GetReply(m);
  if (reply && std::string_view(reply).substr(0, k_ack_prefix.size()) == k_ack_prefix) {
    publish_raw(reply, nullptr, "-NAK", nullptr);
  }
}

void connection::dispatch(natsMsg* m) {
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

void connection::deliver(std::uint64_t token, natsMsg* m) {
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
    // Its deadline passed meanwhile: a pulled message goes back for redelivery at once
    // rather than after the consumer's AckWait.
    if (p->finished) return hand_back(m);
    finished = p->on_msg(m);
    p->finished = finished;
  }
  if (finished) forget(token);
}

std::shared_ptr<pending_request> connection::take(std::uint64_t token) {
  std::lock_guard lock(mu_);
  auto it = pending_.find(token);
  if (it == pending_.end()) return nullptr;
  auto p = std::move(it->second);
  pending_.erase(it);
  unlink_pull(*p, token);
  return p;
}

void connection::expire(std::uint64_t token) {
  auto p = take(token);
  if (!p) return;
  std::lock_guard plock(p->mu);
  if (p->finished) return;
  p->finished = true;
  p->on_timeout();
}

void connection::forget(std::uint64_t token) {
  auto p = take(token);
  if (!p) return;
  clock_->cancel(p->timer);
}

void connection::unlink_pull(const pending_request& p, std::uint64_t token) {
  if (p.pull.empty()) return;
  auto it = pulls_.find(p.pull);
  if (it != pulls_.end() && it->second == token) pulls_.erase(it);
}

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
  destroy_here(m);
}

void free_push_state(void* closure) {
  delete static_cast<push_state*>(closure);
}

}  // namespace amp::jetstream_detail
