#include "transport/jetstream/codec.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <mutex>

#include "amp/json.hpp"
#include "amp/timestamp.hpp"
#include "transport/stream_rules.hpp"

namespace amp::jetstream_detail {

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
  // A message delete that finds nothing fails as "message delete failed" (10057) saying so:
  // "no message found" below the last sequence, "stream store EOF" past it.
  if (err_code == k_message_delete_failed &&
      (description.find("no message found") != std::string_view::npos ||
       description.find("EOF") != std::string_view::npos)) {
    return errc::not_found;
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

std::optional<std::vector<std::string_view>> ack_fields(std::string_view reply) {
  if (reply.substr(0, k_ack_prefix.size()) != k_ack_prefix) return std::nullopt;
  auto t = split(reply.substr(k_ack_prefix.size()), '.');
  if (t.size() == 7) return t;
  if (t.size() >= 9) return std::vector<std::string_view>(t.begin() + 2, t.end());
  return std::nullopt;
}

std::string pull_key(std::string_view stream, std::string_view consumer) {
  std::string key;
  key.reserve(stream.size() + 1 + consumer.size());
  key.append(stream).append(".").append(consumer);
  return key;
}

std::optional<std::string> pull_key_of(std::string_view reply) {
  auto t = ack_fields(reply);
  if (!t) return std::nullopt;
  return pull_key((*t)[0], (*t)[1]);
}

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

std::int64_t limit(std::int64_t v) {
  return v > 0 ? v : -1;
}

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
  return kv_stream_name(bucket);
}

std::string kv_subject(std::string_view bucket, std::string_view key) {
  return kv_subject_of(bucket, key);
}

kv_op op_from_header(std::string_view v) {
  if (v == "DEL") return kv_op::del;
  if (v == "PURGE") return kv_op::purge;
  return kv_op::put;
}

}  // namespace amp::jetstream_detail
