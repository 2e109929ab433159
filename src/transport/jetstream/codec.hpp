#pragma once

// What the JetStream transport's parts share: conversions between amp's vocabulary and
// cnats's (durations, configurations, errors, headers, ack subjects) and small parsing
// helpers. Internal to the transport.

#include <nats/nats.h>
#include <simdjson.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "amp/transport/transport.hpp"
#include "detail/serial_queue.hpp"

namespace amp::jetstream_detail {

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
void open_library();

std::int64_t to_ns(duration d);
duration from_ns(std::int64_t ns);
time_point time_from_ns(std::int64_t ns);
std::int64_t to_ms(duration d);

bool is_connection_status(natsStatus s);

// JetStream API error codes (jsErrCode) that we translate.
constexpr int k_stream_not_found = 10059;
constexpr int k_consumer_not_found = 10014;
constexpr int k_no_message_found = 10037;
constexpr int k_sequence_not_found = 10043;
constexpr int k_message_delete_failed = 10057;
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

errc code_for_js_error(int err_code, std::string_view description);

error status_error(natsStatus s, int ec, std::string_view what);

// nats-server 2.9.10 sometimes answers a create with "error creating store for stream" (or "for
// consumer") when several connections make their first objects at once on a new store; its
// log then says "could not create storage directory - mkdir .../streams: no such file or
// directory". It is transient: a second try succeeds, or finds what another process made.
bool store_creation_failed(jsErrCode ec);

bool retryable(natsStatus s, jsErrCode ec);

std::string base64_decode(std::string_view in);

// Parses a NATS header block ("NATS/1.0\r\nName: value\r\n...\r\n\r\n"), keeping order.
header_list parse_header_block(std::string_view block);

header_list headers_of(natsMsg* m);

std::string header_value(natsMsg* m, const char* name);

std::string data_of(natsMsg* m);

std::vector<std::string_view> split(std::string_view s, char sep);

bool has_wildcard(std::string_view filter);

template <class T>
bool parse_number(std::string_view v, T& out) {
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc() && p == v.data() + v.size();
}

// The fields of an ack subject from the stream on: "$JS.ACK.<stream>.<consumer>.<delivered>.
// <sseq>.<cseq>.<ns>.<pending>" (nats-server 2.9), or the form with a domain and an account hash
// before the stream and a random token at the end.
std::optional<std::vector<std::string_view>> ack_fields(std::string_view reply);

// "<stream>.<consumer>": what pulls are told apart by.
std::string pull_key(std::string_view stream, std::string_view consumer);

// The pull key of the consumer that delivered a message, from its ack subject.
std::optional<std::string> pull_key_of(std::string_view reply);

// Fills the delivery fields of a message from its ack subject.
bool fill_from_ack_subject(message& m, std::string_view reply);

// Reads an optional member; `out` keeps its value when the member is missing.
template <class T>
void read_field(simdjson::dom::element object, std::string_view key, T& out) {
  if (object[key].get(out) != simdjson::SUCCESS) return;
}

// Reads {"error":{"code":..,"err_code":..,"description":".."}} if present.
std::optional<error> api_error(simdjson::dom::element doc, std::string_view what);

simdjson::dom::parser& local_parser();

// ----- configuration translation ------------------------------------------------------

std::int64_t limit(std::int64_t v);

// nats-server 2.9 has no "unlimited" max_ack_pending for pull consumers (-1 becomes 1000):
// unlimited is this many.
constexpr std::int64_t k_unlimited_ack_pending = std::int64_t{1} << 30;

jsRetentionPolicy to_js(retention_policy r);

retention_policy from_js(jsRetentionPolicy r);

stream_config from_js(const jsStreamConfig& c);

// The configuration as the server will report it, for comparison.
stream_config normalized(stream_config c);

std::string differing_setting(const stream_config& have, const stream_config& want);

jsDeliverPolicy to_js(deliver_policy p);

deliver_policy from_js(jsDeliverPolicy p);

// nats-server 2.9 finds the first sequence at or after a start time coarsely and can start
// a few messages late. A by-time consumer is therefore created a little early, with the
// exact time in its description, and fetch skips (acks) the messages before it.
constexpr auto k_start_time_margin = std::chrono::seconds(2);
constexpr std::string_view k_start_time_tag = "amp.start_time=";

std::optional<time_point> exact_start_time(std::string_view description);

consumer_config from_js(const std::string& stream, const jsConsumerConfig& c);

consumer_config normalized(consumer_config c);

std::string differing_setting(const consumer_config& have, const consumer_config& want);

std::string kv_stream(std::string_view bucket);
std::string kv_subject(std::string_view bucket, std::string_view key);

kv_op op_from_header(std::string_view v);

}  // namespace amp::jetstream_detail
