// jetstream_backend: capabilities, streams, consumers, publishing, acknowledgements and
// ordered replays.

#include "transport/jetstream/backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "amp/timestamp.hpp"
#include "transport/stream_rules.hpp"

namespace amp::jetstream_detail {

result<void> jetstream_backend::detect_capabilities() {
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

void jetstream_backend::handler_threw(std::string_view where) noexcept {
  detail::report_current_exception(*sink_, where);
}

capabilities jetstream_backend::caps() const {
  return {.backend = "jetstream", .persistent = true, .per_key_ttl = per_key_ttl_};
}

std::shared_ptr<amp::clock> jetstream_backend::clock() const {
  return conn_->clock();
}

std::uint64_t jetstream_backend::connection_epoch() const noexcept {
  natsStatistics* stats = nullptr;
  if (natsStatistics_Create(&stats) != NATS_OK) return 0;
  std::uint64_t reconnects = 0;
  if (natsConnection_GetStats(conn_->nc(), stats) == NATS_OK) {
    natsStatistics_GetCounts(stats, nullptr, nullptr, nullptr, nullptr, &reconnects);
  }
  natsStatistics_Destroy(stats);
  return reconnects;
}

result<void> jetstream_backend::ping() {
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

result<stream_info> jetstream_backend::do_ensure_stream(const stream_config& config) {
  auto existing = stream_info_of(config.name);
  if (existing) return compare(*existing, config);
  if (existing.error().code() != errc::not_found) return existing.error();
  auto made = write_stream(config, false, stream_flags{});
  // Another process may have created it in the meantime: compare with what is there.
  if (!made && made.error().code() == errc::conflict) {
    if (auto now = stream_info_of(config.name)) return compare(*now, config);
  }
  return made;
}

result<stream_info> jetstream_backend::do_update_stream(const stream_config& config) {
  jsStreamInfo* current = nullptr;
  auto got = with_retry("stream " + config.name, [&](jsErrCode& ec) {
    return js_GetStreamInfo(&current, conn_->js(), config.name.c_str(), nullptr, &ec);
  });
  if (!got) return got.error();
  const auto existing = from_js(*current->Config);
  const stream_flags flags{.allow_rollup = current->Config->AllowRollup,
                           .allow_direct = current->Config->AllowDirect,
                           .deny_delete = current->Config->DenyDelete,
                           .deny_purge = current->Config->DenyPurge};
  jsStreamInfo_Destroy(current);
  if (auto fixed = detail::fixed_setting_change(existing, config); !fixed.empty()) {
    return unexpected(errc::conflict,
                      fmt::format("stream \"{}\": its {} cannot be changed", config.name, fixed));
  }
  return write_stream(config, true, flags);
}

result<stream_info> jetstream_backend::write_stream(const stream_config& config, bool update,
                                                    stream_flags flags) {
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
  sc.AllowRollup = flags.allow_rollup;
  sc.AllowDirect = flags.allow_direct;
  sc.DenyDelete = flags.deny_delete;
  sc.DenyPurge = flags.deny_purge;
  jsStreamInfo* si = nullptr;
  auto r =
      with_retry((update ? "update stream " : "create stream ") + config.name, [&](jsErrCode& ec) {
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

result<stream_info> jetstream_backend::do_stream_info_of(std::string_view stream) {
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

result<std::map<std::string, std::uint64_t>> jetstream_backend::do_stream_subjects(
    std::string_view stream, std::string_view filter) {
  std::string name(stream);
  std::string subjects_filter(filter);
  jsOptions o;
  jsOptions_Init(&o);
  o.Stream.Info.SubjectsFilter = subjects_filter.c_str();
  jsStreamInfo* si = nullptr;
  auto r = with_retry("subjects of stream " + name, [&](jsErrCode& ec) {
    return js_GetStreamInfo(&si, conn_->js(), name.c_str(), &o, &ec);
  });
  if (!r) return r.error();
  std::map<std::string, std::uint64_t> out;
  if (si->State.Subjects != nullptr) {
    for (int i = 0; i < si->State.Subjects->Count; ++i) {
      const auto& e = si->State.Subjects->List[i];
      if (e.Msgs > 0) out.emplace(e.Subject, e.Msgs);
    }
  }
  jsStreamInfo_Destroy(si);
  return out;
}

result<std::vector<std::string>> jetstream_backend::do_consumer_names(std::string_view stream) {
  std::string name(stream);
  jsConsumerNamesList* list = nullptr;
  auto r = with_retry("consumers of stream " + name, [&](jsErrCode& ec) {
    return js_ConsumerNames(&list, conn_->js(), name.c_str(), nullptr, &ec);
  });
  std::vector<std::string> out;
  if (!r) {
    // A stream without consumers answers with no list at all.
    if (r.error().code() == errc::not_found && list == nullptr) {
      if (auto exists = do_stream_info_of(stream); exists) return out;
    }
    return r.error();
  }
  if (list != nullptr) {
    for (int i = 0; i < list->Count; ++i) out.emplace_back(list->List[i]);
    jsConsumerNamesList_Destroy(list);
  }
  std::sort(out.begin(), out.end());
  return out;
}

result<void> jetstream_backend::do_delete_stream(std::string_view stream) {
  std::string name(stream);
  // A bucket's stream takes the bucket with it: what was learnt of it no longer holds.
  if (constexpr std::string_view k_kv = "KV_"; stream.starts_with(k_kv)) {
    forget_bucket(std::string(stream.substr(k_kv.size())));
  }
  return with_retry("delete stream " + name, [&](jsErrCode& ec) {
    return js_DeleteStream(conn_->js(), name.c_str(), nullptr, &ec);
  });
}

result<message> jetstream_backend::do_get_message(std::string_view stream, std::uint64_t seq) {
  return get_stored(stream, fmt::format(R"({{"seq":{}}})", seq),
                    fmt::format("message {} of stream \"{}\"", seq, stream));
}

result<message> jetstream_backend::do_get_last_message(std::string_view stream,
                                                       std::string_view subject_filter) {
  return get_stored(stream, fmt::format(R"({{"last_by_subj":{}}})", json_quote(subject_filter)),
                    fmt::format("last message on \"{}\" in stream \"{}\"", subject_filter, stream));
}

void jetstream_backend::do_async_delete_message(std::string_view stream, std::uint64_t seq,
                                                completion<void> done) {
  done = detail::guarded(std::move(done), sink_, "delete_message");
  auto what = fmt::format("message {} of stream \"{}\"", seq, stream);
  conn_->request(
      fmt::format("$JS.API.STREAM.MSG.DELETE.{}", stream),
      fmt::format(R"({{"seq":{},"no_erase":true}})", seq), {}, conn_->deadline(),
      [what = std::move(what), done = std::move(done)](result<nats_reply> r) {
        if (!r) return done(std::move(r).error());
        simdjson::dom::element doc;
        if (local_parser().parse(r->data).get(doc) != simdjson::SUCCESS) {
          return done(unexpected(
              errc::internal, fmt::format("delete of {}: JetStream answered with bad JSON", what)));
        }
        if (auto e = api_error(doc, fmt::format("delete of {}", what))) return done(std::move(*e));
        done({});
      });
}

void jetstream_backend::do_async_publish(outgoing_message msg, completion<publish_ack> done) {
  done = detail::guarded(std::move(done), sink_, "publish");
  if (!msg.msg_id.empty()) msg.headers.emplace_back(detail::k_msg_id_header, msg.msg_id);
  std::string subject = msg.subject;
  publish_to(std::move(subject), std::move(msg.data), std::move(msg.headers),
             [done = std::move(done)](result<publish_ack> r) { done(std::move(r)); });
}

result<consumer_info> jetstream_backend::do_ensure_consumer(const consumer_config& config) {
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

result<consumer_info> jetstream_backend::do_update_consumer(const consumer_config& config) {
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

result<consumer_info> jetstream_backend::do_consumer_info_of(std::string_view stream,
                                                             std::string_view durable) {
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

result<void> jetstream_backend::do_delete_consumer(std::string_view stream,
                                                   std::string_view durable) {
  std::string s(stream), d(durable);
  remember_consumer(s, d, false);
  return with_retry(fmt::format("delete consumer \"{}\"", d), [&](jsErrCode& ec) {
    return js_DeleteConsumer(conn_->js(), s.c_str(), d.c_str(), nullptr, &ec);
  });
}

namespace {

// Whether `msg` carries an ack token of this transport (the reply subject of a delivery).
bool ours(const message& msg) {
  return msg.ack_token.substr(0, k_ack_prefix.size()) == k_ack_prefix &&
         subjects::check_subject(msg.ack_token).has_value();
}

std::string ack_body(ack_kind kind, duration nak_delay) {
  switch (kind) {
    case ack_kind::ack: return "+ACK";
    case ack_kind::in_progress: return "+WPI";
    case ack_kind::term: return "+TERM";
    case ack_kind::nak: break;
  }
  return nak_delay > duration::zero() ? fmt::format(R"(-NAK {{"delay":{}}})", to_ns(nak_delay))
                                      : "-NAK";
}

}  // namespace

void jetstream_backend::do_acknowledge(const message& msg, ack_kind kind, duration nak_delay) {
  if (!ours(msg)) return;
  if (conn_->publish_raw(msg.ack_token, nullptr, ack_body(kind, nak_delay), nullptr) == NATS_OK) {
    return;
  }
  // Not connected now (a reconnect): the request form tries again until its deadline, so
  // an acknowledgement is not lost to a short outage (a late one only brings a re-judging).
  do_async_acknowledge(msg, kind, nak_delay, [](result<void>) {});
}

void jetstream_backend::do_async_acknowledge(const message& msg, ack_kind kind, duration nak_delay,
                                             completion<void> done) {
  done = detail::guarded(std::move(done), sink_, "acknowledge");
  if (!ours(msg)) return done(error(errc::bad_request, "not an ack token of this transport"));
  std::string body = ack_body(kind, nak_delay);
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

result<std::unique_ptr<subscription>> jetstream_backend::do_subscribe_ordered(
    const replay_request& request, std::function<void(const message&)> on_message) {
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
  std::uint64_t first_seq = start.start == deliver_policy::by_start_sequence ? start.start_seq : 0;
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

result<void> jetstream_backend::do_publish_core(outgoing_message msg) {
  if (!msg.msg_id.empty()) msg.headers.emplace_back(detail::k_msg_id_header, msg.msg_id);
  auto s = conn_->publish_raw(msg.subject, nullptr, msg.data, &msg.headers);
  if (s != NATS_OK)
    return unexpected(status_error(s, 0, fmt::format("publish to {}", msg.subject)));
  return {};
}

result<std::unique_ptr<subscription>> jetstream_backend::do_subscribe_core(
    std::string_view subject_filter, std::function<void(const message&)> on_message) {
  auto queue = std::make_shared<serial_queue>(*sink_);
  auto* st = new push_state{*sink_, queue, {}};
  st->handle = [queue, on_message = std::move(on_message)](natsMsg* m) {
    message out;
    out.subject = natsMsg_GetSubject(m);
    out.data = data_of(m);
    out.headers = headers_of(m);
    queue->push([on_message, out = std::move(out)] { on_message(out); });
  };
  auto sub = std::make_unique<js_subscription>(queue);
  natsSubscription* ns = nullptr;
  const std::string filter(subject_filter);
  auto s = natsConnection_Subscribe(&ns, conn_->nc(), filter.c_str(), &on_push, st);
  if (s != NATS_OK) {
    delete st;
    return unexpected(status_error(s, 0, fmt::format("subscribe to {}", filter)));
  }
  natsSubscription_SetOnCompleteCB(ns, &free_push_state, st);
  natsSubscription_SetPendingLimits(ns, -1, -1);
  sub->attach(ns);
  // The server reads a connection in order: once a request sent after the subscription is
  // answered, the subscription is in place, and what anyone publishes from then on reaches it.
  if (auto r = conn_->api("$JS.API.INFO", ""); !r) return r.error();
  return std::unique_ptr<subscription>(std::move(sub));
}

result<stream_info> jetstream_backend::compare(stream_info have, const stream_config& want) {
  if (auto diff = differing_setting(have.config, want); !diff.empty()) {
    return unexpected(errc::conflict,
                      fmt::format("stream \"{}\" exists with a different {}", want.name, diff));
  }
  have.config = want;
  return have;
}

result<void> jetstream_backend::check_fits(const consumer_config& c, bool create) {
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

result<consumer_info> jetstream_backend::write_consumer(const consumer_config& config,
                                                        bool update) {
  jsConsumerConfig cc;
  jsConsumerConfig_Init(&cc);
  cc.Durable = config.durable.c_str();
  cc.AckPolicy = js_AckExplicit;
  cc.AckWait = to_ns(config.ack_wait);
  cc.InactiveThreshold = to_ns(config.inactive_threshold);  // sent when > 0
  cc.MaxAckPending = config.max_ack_pending > 0 ? config.max_ack_pending : k_unlimited_ack_pending;
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

consumer_info jetstream_backend::info_of(const std::string& stream, const jsConsumerInfo& ci) {
  consumer_info out;
  out.config = from_js(stream, *ci.Config);
  out.num_pending = ci.NumPending;
  out.num_ack_pending = static_cast<std::uint64_t>(std::max<std::int64_t>(ci.NumAckPending, 0));
  out.num_redelivered = static_cast<std::uint64_t>(std::max<std::int64_t>(ci.NumRedelivered, 0));
  out.delivered_stream_seq = ci.Delivered.Stream;
  out.ack_floor_stream_seq = ci.AckFloor.Stream;
  return out;
}

result<message> jetstream_backend::get_stored(std::string_view stream, std::string payload,
                                              const std::string& what) {
  auto r = conn_->api(fmt::format("$JS.API.STREAM.MSG.GET.{}", stream), std::move(payload));
  if (!r) return r.error();
  return parse_stored(std::string(stream), *r, what);
}

result<message> jetstream_backend::parse_stored(std::string stream, const std::string& body,
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

void jetstream_backend::publish_to(std::string subject, std::string data, header_list headers,
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

result<publish_ack> jetstream_backend::parse_pub_ack(const std::string& body,
                                                     const std::string& subject) {
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

void jetstream_backend::check_stream_captures(const std::string& subject,
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

void jetstream_backend::check_consumer(const std::string& stream, const std::string& durable,
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

std::optional<time_point> jetstream_backend::known_consumer(const std::string& stream,
                                                            const std::string& durable) {
  std::lock_guard lock(known_mu_);
  auto it = known_.find(stream + "." + durable);
  if (it == known_.end()) return std::nullopt;
  return it->second;
}

void jetstream_backend::remember_consumer(const std::string& stream, const std::string& durable,
                                          bool exists, time_point not_before) {
  std::lock_guard lock(known_mu_);
  if (exists) {
    known_[stream + "." + durable] = not_before;
  } else {
    known_.erase(stream + "." + durable);
  }
}

result<std::unique_ptr<subscription>> jetstream_backend::subscribe_push(
    const std::string& filter, jsSubOptions& so, push_state* st,
    std::shared_ptr<serial_queue> queue, const std::string& what) {
  auto sub = std::make_unique<js_subscription>(queue);
  natsSubscription* ns = nullptr;
  jsErrCode ec = static_cast<jsErrCode>(0);
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.Wait = std::max<std::int64_t>(1, to_ms(conn_->op_timeout()));
  if (!conn_->domain().empty()) jo.Domain = conn_->domain().c_str();
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

result<std::uint64_t> jetstream_backend::count_matching(const std::string& stream,
                                                        const std::string& filter) {
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

}  // namespace amp::jetstream_detail
