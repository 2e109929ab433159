// jetstream_backend: KV buckets on their streams (writes as publishes with expected-
// sequence headers, reads by direct get where the bucket allows, watches as ordered
// consumers).

#include "transport/jetstream/backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "amp/timestamp.hpp"
#include "transport/stream_rules.hpp"

namespace amp::jetstream_detail {

result<void> jetstream_backend::do_ensure_bucket(const kv_config& config) {
  auto r = create_bucket(config);
  if (r) note_bucket(config.bucket);
  return r;
}

result<void> jetstream_backend::create_bucket(const kv_config& config) {
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
  sc.Duplicates =
      to_ns(config.ttl > duration::zero() ? std::min<duration>(config.ttl, 2min) : duration(2min));
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

void jetstream_backend::note_bucket(const std::string& bucket) {
  if (auto info = conn_->api(fmt::format("$JS.API.STREAM.INFO.{}", kv_stream(bucket)), "")) {
    learn_traits(bucket, *info);
  }
}

std::optional<jetstream_backend::bucket_traits> jetstream_backend::learn_traits(
    const std::string& bucket, const std::string& info) {
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

std::optional<jetstream_backend::bucket_traits> jetstream_backend::traits_of(
    const std::string& bucket) {
  std::lock_guard lock(buckets_mu_);
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) return std::nullopt;
  return it->second;
}

void jetstream_backend::async_traits_of(const std::string& bucket,
                                        std::function<void(std::optional<bucket_traits>)> done) {
  if (auto known = traits_of(bucket)) return done(known);
  auto self = shared_from_this();
  conn_->request(fmt::format("$JS.API.STREAM.INFO.{}", kv_stream(bucket)), "", {},
                 conn_->deadline(), [self, bucket, done = std::move(done)](result<nats_reply> r) {
                   done(r ? self->learn_traits(bucket, r->data) : std::nullopt);
                 });
}

bool jetstream_backend::direct_get(const std::string& bucket) {
  auto traits = traits_of(bucket);
  return traits && traits->direct;
}

void jetstream_backend::forget_bucket(const std::string& bucket) {
  std::lock_guard lock(buckets_mu_);
  buckets_.erase(bucket);
}

result<void> jetstream_backend::do_delete_bucket(std::string_view bucket) {
  forget_bucket(std::string(bucket));
  auto r = delete_stream(kv_stream(bucket));
  if (!r && r.error().code() == errc::not_found) {
    return unexpected(errc::not_found, fmt::format("bucket \"{}\" not found", bucket));
  }
  return r;
}

void jetstream_backend::do_async_kv_get(std::string_view bucket, std::string_view key,
                                        completion<kv_entry> done) {
  done = detail::guarded(std::move(done), sink_, "kv_get");
  last_entry(std::string(bucket), std::string(key),
             [done = std::move(done), key = std::string(key)](result<kv_entry> r) {
               if (r && r->op != kv_op::put) {
                 return done(unexpected(errc::not_found, fmt::format("key \"{}\" not found", key)));
               }
               done(std::move(r));
             });
}

void jetstream_backend::do_async_kv_create(std::string_view bucket, std::string_view key,
                                           std::string value, std::optional<duration> ttl,
                                           completion<std::uint64_t> done) {
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

void jetstream_backend::do_async_kv_update(std::string_view bucket, std::string_view key,
                                           std::string value, std::uint64_t expected_revision,
                                           std::optional<duration> ttl,
                                           completion<std::uint64_t> done) {
  done = detail::guarded(std::move(done), sink_, "kv_update");
  kv_write(std::string(bucket), std::string(key), std::move(value),
           std::to_string(expected_revision), ttl, std::move(done));
}

void jetstream_backend::do_async_kv_put(std::string_view bucket, std::string_view key,
                                        std::string value, std::optional<duration> ttl,
                                        completion<std::uint64_t> done) {
  done = detail::guarded(std::move(done), sink_, "kv_put");
  kv_write(std::string(bucket), std::string(key), std::move(value), {}, ttl, std::move(done));
}

void jetstream_backend::do_async_kv_delete(std::string_view bucket, std::string_view key,
                                           completion<void> done) {
  done = detail::guarded(std::move(done), sink_, "kv_delete");
  kv_marker(bucket, key, {{std::string(k_kv_op), "DEL"}}, std::move(done));
}

void jetstream_backend::do_async_kv_erase(std::string_view bucket, std::string_view key,
                                          completion<void> done) {
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

void jetstream_backend::do_async_kv_purge(std::string_view bucket, std::string_view key,
                                          completion<void> done) {
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

result<std::vector<std::string>> jetstream_backend::do_kv_keys(std::string_view bucket) {
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

result<std::vector<kv_entry>> jetstream_backend::do_kv_history(std::string_view bucket,
                                                               std::string_view key) {
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
      entry.value.assign(static_cast<const char*>(kvEntry_Value(e)), static_cast<std::size_t>(len));
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

result<std::unique_ptr<subscription>> jetstream_backend::do_kv_watch(
    std::string_view bucket, const kv_watch_options& options, kv_watch_handlers handlers) {
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

result<void> jetstream_backend::compare_bucket(const stream_config& have, const kv_config& want) {
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

void jetstream_backend::kv_write(const std::string& bucket, const std::string& key,
                                 std::string value, std::string expected,
                                 std::optional<duration> ttl, completion<std::uint64_t> done) {
  header_list headers;
  if (!expected.empty()) headers.emplace_back("Nats-Expected-Last-Subject-Sequence", expected);
  if (ttl) {
    headers.emplace_back(
        "Nats-TTL",
        fmt::format("{}s", std::max<std::int64_t>(
                               1, std::chrono::duration_cast<std::chrono::seconds>(*ttl).count())));
  }
  kv_publish(bucket, key, std::move(value), std::move(headers), std::move(done));
}

void jetstream_backend::kv_publish(const std::string& bucket, const std::string& key,
                                   std::string value, header_list headers,
                                   completion<std::uint64_t> done) {
  auto self = shared_from_this();
  publish_to(kv_subject(bucket, key), std::move(value), std::move(headers),
             [self, bucket, key, done = std::move(done)](result<publish_ack> r) {
               if (!r) {
                 auto e = std::move(r).error();
                 if (e.code() == errc::not_found) {
                   return done(
                       unexpected(errc::not_found, fmt::format("bucket \"{}\" not found", bucket)));
                 }
                 if (e.code() == errc::conflict) {
                   self->read_from_leader(bucket, key);
                   return done(
                       unexpected(errc::conflict, fmt::format("key \"{}\": {}", key, e.message())));
                 }
                 return done(std::move(e));
               }
               done(r->seq);
             });
}

void jetstream_backend::kv_marker(std::string_view bucket, std::string_view key,
                                  header_list headers, completion<void> done) {
  kv_publish(std::string(bucket), std::string(key), {}, std::move(headers),
             [done = std::move(done)](result<std::uint64_t> r) {
               if (!r) return done(std::move(r).error());
               done({});
             });
}

void jetstream_backend::delete_revisions(std::string bucket, std::string key, std::uint64_t from,
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
        auto m = parse_stored(kv_stream(bucket), r->data, fmt::format("purge of key \"{}\"", key));
        if (!m) {
          if (m.error().code() == errc::not_found) return done({});
          return done(std::move(m).error());
        }
        if (m->seq >= before) return done({});
        self->delete_revision(std::move(bucket), std::move(key), m->seq, before, std::move(done));
      });
}

void jetstream_backend::delete_revision(std::string bucket, std::string key, std::uint64_t seq,
                                        std::uint64_t before, completion<void> done) {
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
        self->delete_revisions(std::move(bucket), std::move(key), seq + 1, before, std::move(done));
      });
}

void jetstream_backend::read_from_leader(const std::string& bucket, const std::string& key) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(leader_reads_mu_);
  if (leader_reads_.size() >= k_leader_reads_max) {
    std::erase_if(leader_reads_, [now](const auto& kv) { return kv.second <= now; });
    if (leader_reads_.size() >= k_leader_reads_max) leader_reads_.clear();
  }
  leader_reads_[bucket + '\0' + key] = now + k_leader_read_for;
}

bool jetstream_backend::reads_from_leader(const std::string& bucket, const std::string& key) {
  std::lock_guard lock(leader_reads_mu_);
  if (leader_reads_.empty()) return false;
  auto it = leader_reads_.find(bucket + '\0' + key);
  if (it == leader_reads_.end()) return false;
  if (it->second > std::chrono::steady_clock::now()) return true;
  leader_reads_.erase(it);
  return false;
}

void jetstream_backend::last_entry(const std::string& bucket, const std::string& key,
                                   completion<kv_entry> done) {
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

void jetstream_backend::last_entry_direct(const std::string& bucket, const std::string& key,
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

result<jetstream_backend::kv_handle> jetstream_backend::open_bucket(std::string_view bucket) {
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

}  // namespace amp::jetstream_detail
