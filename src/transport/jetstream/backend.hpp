#pragma once

// The JetStream backend of `amp::transport`. Its members are defined by concern:
// streams.cpp (streams, consumers, publishing, acknowledgements, replays), fetch.cpp
// (pulls taking turns on a consumer) and kv.cpp (buckets). Internal to the transport.

#include <nats/nats.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "amp/transport/jetstream.hpp"
#include "transport/jetstream/codec.hpp"
#include "transport/jetstream/connection.hpp"

namespace amp::jetstream_detail {

// ----- the transport ------------------------------------------------------------------

class jetstream_backend final : public transport,
                                public std::enable_shared_from_this<jetstream_backend> {
 public:
  explicit jetstream_backend(std::shared_ptr<connection> conn)
      : conn_(std::move(conn)), sink_(conn_->sink()) {}

  result<void> detect_capabilities();

  void handler_threw(std::string_view where) noexcept override;

  capabilities caps() const override;

  std::shared_ptr<amp::clock> clock() const override;

  result<void> ping() override;
  std::uint64_t connection_epoch() const noexcept override;

  // ----- streams ----------------------------------------------------------------------

  result<stream_info> do_ensure_stream(const stream_config& config) override;

  result<stream_info> do_update_stream(const stream_config& config) override;

  // What a stream may have that `stream_config` does not say (a KV bucket's stream has the
  // first three): an update keeps them.
  struct stream_flags {
    bool allow_rollup = false;
    bool allow_direct = false;
    bool deny_delete = false;
    bool deny_purge = false;
  };
  // Creates the stream, or updates it keeping `flags`, and reads it back.
  result<stream_info> write_stream(const stream_config& config, bool update, stream_flags flags);

  result<stream_info> do_stream_info_of(std::string_view stream) override;

  result<void> do_delete_stream(std::string_view stream) override;

  result<std::map<std::string, std::uint64_t>> do_stream_subjects(std::string_view stream,
                                                                  std::string_view filter) override;

  result<std::vector<std::string>> do_consumer_names(std::string_view stream) override;

  result<message> do_get_message(std::string_view stream, std::uint64_t seq) override;

  result<message> do_get_last_message(std::string_view stream,
                                      std::string_view subject_filter) override;

  void do_async_delete_message(std::string_view stream, std::uint64_t seq,
                               completion<void> done) override;

  void do_async_publish(outgoing_message msg, completion<publish_ack> done) override;

  // ----- consumers --------------------------------------------------------------------

  result<consumer_info> do_ensure_consumer(const consumer_config& config) override;

  result<consumer_info> do_update_consumer(const consumer_config& config) override;

  result<consumer_info> do_consumer_info_of(std::string_view stream,
                                            std::string_view durable) override;

  result<void> do_delete_consumer(std::string_view stream, std::string_view durable) override;

  void do_async_fetch(std::string_view stream, std::string_view durable, fetch_request request,
                      completion<std::vector<message>> done) override;

  void do_async_acknowledge(const message& msg, ack_kind kind, duration nak_delay,
                            completion<void> done) override;

  // A publish to the ack subject without a reply subject: the server confirms nothing.
  // While the connection is down, the confirmed form instead, its outcome dropped.
  void do_acknowledge(const message& msg, ack_kind kind, duration nak_delay) override;

  result<std::unique_ptr<subscription>> do_subscribe_ordered(
      const replay_request& request, std::function<void(const message&)> on_message) override;

  // ----- core messages ------------------------------------------------------------------

  result<void> do_publish_core(outgoing_message msg) override;
  // A plain NATS subscription whose cnats delivery thread hands each message to a queue.
  result<std::unique_ptr<subscription>> do_subscribe_core(
      std::string_view subject_filter, std::function<void(const message&)> on_message) override;

  // ----- KV ---------------------------------------------------------------------------

  result<void> do_ensure_bucket(const kv_config& config) override;

  // The stream of a bucket as cnats lays it out (js_CreateKeyValue), except that it allows
  // message deletes: a purge then deletes the key's old revisions one by one instead of
  // rolling them up (see async_kv_purge).
  result<void> create_bucket(const kv_config& config);

  // How a bucket's stream is set up, for reads (direct gets cost the server less than
  // STREAM.MSG.GET) and purges (deletes of single revisions, where the stream allows them).
  struct bucket_traits {
    bool direct = false;
    bool deletes = false;
  };

  void note_bucket(const std::string& bucket);

  // Remembers the traits a STREAM.INFO answer shows; nothing when it shows none (an error).
  std::optional<bucket_traits> learn_traits(const std::string& bucket, const std::string& info);

  std::optional<bucket_traits> traits_of(const std::string& bucket);

  // The traits, asked of the server the first time; nothing when it cannot tell (the
  // bucket is missing, the server does not answer).
  void async_traits_of(const std::string& bucket,
                       std::function<void(std::optional<bucket_traits>)> done);

  bool direct_get(const std::string& bucket);

  void forget_bucket(const std::string& bucket);

  result<void> do_delete_bucket(std::string_view bucket) override;

  void do_async_kv_get(std::string_view bucket, std::string_view key,
                       completion<kv_entry> done) override;

  void do_async_kv_create(std::string_view bucket, std::string_view key, std::string value,
                          std::optional<duration> ttl, completion<std::uint64_t> done) override;

  void do_async_kv_update(std::string_view bucket, std::string_view key, std::string value,
                          std::uint64_t expected_revision, std::optional<duration> ttl,
                          completion<std::uint64_t> done) override;

  void do_async_kv_put(std::string_view bucket, std::string_view key, std::string value,
                       std::optional<duration> ttl, completion<std::uint64_t> done) override;

  void do_async_kv_delete(std::string_view bucket, std::string_view key,
                          completion<void> done) override;

  // A stream purge filtered on the key's subject: every revision goes, no marker is left.
  void do_async_kv_erase(std::string_view bucket, std::string_view key,
                         completion<void> done) override;

  // The marker, then each earlier revision deleted by its sequence; a rollup where the
  // bucket denies deletes. nats-server 2.9.10 moves every consumer of a stream that takes in
  // a rolled-up subject to the rollup's marker, past what it had not yet sent of other
  // subjects, so a watch would lose other keys' changes.
  void do_async_kv_purge(std::string_view bucket, std::string_view key,
                         completion<void> done) override;

  result<std::vector<std::string>> do_kv_keys(std::string_view bucket) override;

  result<std::vector<kv_entry>> do_kv_history(std::string_view bucket,
                                              std::string_view key) override;

  result<std::unique_ptr<subscription>> do_kv_watch(std::string_view bucket,
                                                    const kv_watch_options& options,
                                                    kv_watch_handlers handlers) override;

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

  static result<stream_info> compare(stream_info have, const stream_config& want);

  static result<void> compare_bucket(const stream_config& have, const kv_config& want);

  // The rules JetStream enforces only in part: the filter must lie in the stream, a
  // work-queue consumer delivers everything, and work-queue filters never overlap
  // (nats-server 2.9 accepts an overlapping update, and some overlapping creates).
  //
  // Creating a consumer whose filter is one concrete subject needs no listing: the server
  // refuses it when an existing filter matches it (and so scales to thousands of
  // per-participant consumers). Wildcard filters and updates are checked here.
  result<void> check_fits(const consumer_config& c, bool create);

  result<consumer_info> write_consumer(const consumer_config& config, bool update);

  static consumer_info info_of(const std::string& stream, const jsConsumerInfo& ci);

  result<message> get_stored(std::string_view stream, std::string payload, const std::string& what);

  static result<message> parse_stored(std::string stream, const std::string& body,
                                      const std::string& what);

  void publish_to(std::string subject, std::string data, header_list headers,
                  completion<publish_ack> done);

  static result<publish_ack> parse_pub_ack(const std::string& body, const std::string& subject);

  // "No responders" on a publish: either no stream captures the subject (not_found) or
  // the stream has no leader right now (retry). Asks JetStream which.
  void check_stream_captures(const std::string& subject,
                             std::function<void(std::optional<error>)> verdict);

  // One pull request. `n` messages at most; `expires` absent means no_wait.
  void pull(const std::shared_ptr<fetch_state>& f, std::size_t n, std::optional<duration> expires);

  void after_pull(const std::shared_ptr<fetch_state>& f, std::size_t,
                  std::optional<duration> expires, std::size_t received);

  void explain_silent_pull(const std::shared_ptr<fetch_state>& f);

  // Asks whether a consumer exists: an error to report, or nothing when it does.
  void check_consumer(const std::string& stream, const std::string& durable,
                      std::function<void(std::optional<error>)> verdict);

  // Whether the consumer is known to exist, and the exact start time of a by-time one.
  std::optional<time_point> known_consumer(const std::string& stream, const std::string& durable);

  void remember_consumer(const std::string& stream, const std::string& durable, bool exists,
                         time_point not_before = {});

  void finish_fetch(const std::shared_ptr<fetch_state>& f);

  void fail_fetch(const std::shared_ptr<fetch_state>& f, error e);

  // ----- fetches taking turns on a consumer -------------------------------------------

  // Whether `f` may start now; otherwise it waits behind the fetches of its consumer.
  bool enter_line(const std::shared_ptr<fetch_state>& f);

  // With lines_mu_ held.
  void arm_queue_timer(const std::shared_ptr<fetch_state>& f, time_point at, bool last);

  // A queued fetch's max_wait has passed (`last`: and op_timeout after it). If the fetch
  // ahead waits for a message, there is none for this one either: it answers empty. If
  // the one ahead is in a pull that answers at once, this one waits for its outcome (see
  // answer_overdue) or its own turn, then takes what is there without waiting, but waits
  // no longer than op_timeout.
  void queued_fetch_due(const std::shared_ptr<fetch_state>& f, bool last);

  // Completes a fetch that never started: nothing was available for it.
  static void answer_queued(const std::shared_ptr<fetch_state>& f);

  // Records whether the fetch being served is in a waiting pull.
  void set_waiting(const std::shared_ptr<fetch_state>& f, bool waiting);

  // A pull of `f` found nothing: the queued fetches whose max_wait has passed answer empty.
  void answer_overdue(const std::shared_ptr<fetch_state>& f);

  // `f` is done: the next queued fetch of its consumer starts.
  void leave_line(const std::shared_ptr<fetch_state>& f);

  void start_fetch(const std::shared_ptr<fetch_state>& f);

  result<std::unique_ptr<subscription>> subscribe_push(const std::string& filter, jsSubOptions& so,
                                                       push_state* st,
                                                       std::shared_ptr<serial_queue> queue,
                                                       const std::string& what);

  result<std::uint64_t> count_matching(const std::string& stream, const std::string& filter);

  // ----- KV internals -----------------------------------------------------------------

  void kv_write(const std::string& bucket, const std::string& key, std::string value,
                std::string expected, std::optional<duration> ttl, completion<std::uint64_t> done);

  void kv_publish(const std::string& bucket, const std::string& key, std::string value,
                  header_list headers, completion<std::uint64_t> done);

  void kv_marker(std::string_view bucket, std::string_view key, header_list headers,
                 completion<void> done);

  // Deletes the key's revisions from `from` up to, not including, `before`: each found with
  // STREAM.MSG.GET next_by_subj, then removed by delete_revision.
  void delete_revisions(std::string bucket, std::string key, std::uint64_t from,
                        std::uint64_t before, completion<void> done);

  // Deletes revision `seq`, then goes on with the next ones below `before`.
  void delete_revision(std::string bucket, std::string key, std::uint64_t seq, std::uint64_t before,
                       completion<void> done);

  // A compare-and-set on the key was refused: for a while its reads go to the stream's
  // leader. A direct get may be answered by any replica, and nats-server 2.9.10 can bring a
  // restarted node back with a replica whose sequences differ from the leader's: read there,
  // the key's revision never matches, and every compare-and-set on it would be refused.
  void read_from_leader(const std::string& bucket, const std::string& key);

  bool reads_from_leader(const std::string& bucket, const std::string& key);

  // The key's last revision, markers included.
  void last_entry(const std::string& bucket, const std::string& key, completion<kv_entry> done);

  void last_entry_direct(const std::string& bucket, const std::string& key,
                         completion<kv_entry> done);

  struct kv_handle_deleter {
    void operator()(kvStore* kv) const { kvStore_Destroy(kv); }
  };
  using kv_handle = std::unique_ptr<kvStore, kv_handle_deleter>;

  result<kv_handle> open_bucket(std::string_view bucket);

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

}  // namespace amp::jetstream_detail
