#include "amp/broker/inbox.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "amp/json.hpp"
#include "amp/subjects.hpp"
#include "broker/common.hpp"

namespace amp {
namespace detail {

namespace {

// How long a waiting fetch waits before it is re-issued.
constexpr duration k_fetch_wait = std::chrono::seconds(5);
// A parked participant (nothing in flight, its last fetch found nothing) has no fetch out;
// it looks once in this long all the same, and at least twice per inactive_threshold.
constexpr duration k_parked_look = std::chrono::minutes(2);
// A fetch made this long after a message could come back unannounced (a nak's delay ran
// out, or the ack wait of an ack that may have been lost) has seen it come back, if it did:
// the server's redelivery timer may be late.
constexpr duration k_due_margin = std::chrono::seconds(1);
// How long the subscription that hears stored messages stays once no mailbox is parked.
constexpr duration k_wake_linger = std::chrono::seconds(30);
// Backoff between fetches that fail (backend unavailable, consumer missing).
constexpr duration k_min_backoff = std::chrono::milliseconds(100);
constexpr duration k_max_backoff = std::chrono::seconds(5);

void ignore(result<void>) {}

// The headers of what the inboxes of one namespace on several gateways tell each other
// (core messages on `subjects::inbox_control_subject`), beside `detail::k_peer_header` and
// `detail::k_event_header`.
using detail::k_event_header;
using detail::k_peer_header;
constexpr std::string_view k_seq_header = "Amp-Seq";
constexpr std::string_view k_delivery_header = "Amp-Delivery";
constexpr std::string_view k_ack_header = "Amp-Ack";
// On a `settled` event of a nak: in how many milliseconds the consumer redelivers it.
constexpr std::string_view k_nak_header = "Amp-Nak-Ms";
constexpr std::string_view k_delivered_event = "delivered";
constexpr std::string_view k_settled_event = "settled";
// A mailbox got its first reader (the others answer `present` when they have readers too),
// has readers, or lost its last one: deliveries and settles are told only while another
// gateway is known to have readers of the participant.
constexpr std::string_view k_attached_event = "attached";
constexpr std::string_view k_present_event = "present";
constexpr std::string_view k_detached_event = "detached";

std::optional<std::uint64_t> number_header(const header_list& h, std::string_view name) {
  auto v = find_header(h, name);
  std::uint64_t n = 0;
  if (!v || v->empty()) return std::nullopt;
  auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
  if (ec != std::errc() || end != v->data() + v->size() || n == 0) return std::nullopt;
  return n;
}

// A name for this process's inbox object among its peers.
std::string new_peer_id() {
  static std::atomic<std::uint64_t> counter{0};
  std::random_device rd;
  return fmt::format("{:08x}{:08x}.{}", rd(), rd(), ++counter);
}

}  // namespace

// What an `inbox` object and its mailboxes share, and never change.
struct inbox_settings {
  namespace_name ns;
  std::string stream;
  stream_config stream_settings;
  duration ack_wait;
  std::size_t window;
  duration idle;         // the consumer's inactive_threshold
  duration parked_look;  // how often a parked mailbox fetches all the same
};

// Hears the messages stored for the participants of one `inbox` object (a core
// subscription on `amp.<ns>.inbox.*`): what wakes a parked mailbox. Subscribed when a mailbox
// asks (its fetch found nothing), dropped `k_wake_linger` after the last parked mailbox woke,
// so a gateway whose participants all read pays nothing per message stored.
class wake_hub : public std::enable_shared_from_this<wake_hub> {
 public:
  wake_hub(std::weak_ptr<transport> backend, std::shared_ptr<amp::clock> clock, executor run,
           std::string subject, std::function<void(std::string_view subject)> on_heard)
      : backend_(std::move(backend)),
        clock_(std::move(clock)),
        run_(std::move(run)),
        subject_(std::move(subject)),
        on_heard_(std::move(on_heard)) {}

  // Odd while the subscription is in place; one higher at each change. Non-blocking.
  std::uint64_t epoch() const noexcept { return epoch_.load(); }

  // A mailbox whose fetch, made at `epoch_at_fetch`, found nothing: true (it is counted as
  // parked) when the subscription was in place all along, so a message stored after that
  // fetch looked was heard.
  bool try_park(std::uint64_t epoch_at_fetch) {
    std::lock_guard lock(mu_);
    if (deaf_ || (epoch_at_fetch & 1U) == 0 || epoch_at_fetch != epoch_.load()) return false;
    ++parked_;
    return true;
  }

  // A parked mailbox woke (or went).
  void unparked() {
    std::lock_guard lock(mu_);
    if (parked_ > 0 && --parked_ == 0) drop_later();
  }

  // Subscribes, on the executor, unless subscribed or deaf. Never blocks.
  void want() {
    {
      std::lock_guard lock(mu_);
      if (sub_ || opening_ || deaf_) return;
      opening_ = true;
    }
    std::weak_ptr<wake_hub> weak = weak_from_this();
    run_([weak] {
      if (auto self = weak.lock()) self->open();
    });
  }

  // The `inbox` object is gone: no more subscription, no mailbox parks.
  void go_deaf() {
    std::unique_ptr<subscription> sub;
    {
      std::lock_guard lock(mu_);
      deaf_ = true;
      sub = std::move(sub_);
      if (sub) epoch_.fetch_add(1);
    }
    if (sub) sub->stop();
  }

 private:
  void open() {
    auto backend = backend_.lock();
    result<std::unique_ptr<subscription>> made =
        backend ? backend->subscribe_core(subject_,
                                          [weak = weak_from_this()](const message& m) {
                                            if (auto self = weak.lock()) self->on_heard_(m.subject);
                                          })
                : result<std::unique_ptr<subscription>>(
                      unexpected(errc::unavailable, "the transport is closed"));
    backend.reset();
    std::unique_ptr<subscription> unused;
    {
      std::lock_guard lock(mu_);
      opening_ = false;
      if (!made) return;  // the next mailbox that parks asks again
      if (deaf_) {
        unused = std::move(*made);
      } else {
        sub_ = std::move(*made);
        epoch_.fetch_add(1);
        if (parked_ == 0) drop_later();
      }
    }
    if (unused) unused->stop();
  }

  // Called with mu_ held.
  void drop_later() {
    auto gen = ++drop_gen_;
    std::weak_ptr<wake_hub> weak = weak_from_this();
    clock_->call_at(clock_->now() + k_wake_linger, [weak, gen] {
      if (auto self = weak.lock()) self->drop(gen);
    });
  }

  void drop(std::uint64_t gen) {
    std::unique_ptr<subscription> sub;
    {
      std::lock_guard lock(mu_);
      if (gen != drop_gen_ || parked_ > 0 || !sub_) return;
      sub = std::move(sub_);
      epoch_.fetch_add(1);
    }
    sub->stop();
  }

  std::weak_ptr<transport> backend_;
  std::shared_ptr<amp::clock> clock_;
  executor run_;
  std::string subject_;
  std::function<void(std::string_view)> on_heard_;
  std::atomic<std::uint64_t> epoch_{0};
  std::mutex mu_;
  std::unique_ptr<subscription> sub_;
  bool opening_ = false;
  bool deaf_ = false;
  std::size_t parked_ = 0;
  std::uint64_t drop_gen_ = 0;  // a drop scheduled before the last change does nothing
};

// The state of one `inbox` object. Readers keep it (and so the transport) alive.
struct inbox_core {
  std::shared_ptr<transport> backend;
  std::shared_ptr<const inbox_settings> settings;
  std::shared_ptr<worker_pool> pool;
  executor run;
  std::string peer_id;  // how this object signs what it tells the others (`Amp-Peer`)
  std::shared_ptr<wake_hub> wakes;
  std::mutex mu;
  std::unordered_map<std::string, std::weak_ptr<inbox_mailbox>> mailboxes;
};

// The delivery loop of one participant in one `inbox` object, shared by its readers.
//
// It lives while a reader or an outstanding fetch holds it: a reader attaching while a
// fetch is out joins the same loop, so a consumer never has two fetches from one inbox.
// It refers to the transport and the core weakly: a fetch the transport holds must not
// keep the transport alive (a memory transport's waiting fetch never ends by itself).
class inbox_mailbox : public std::enable_shared_from_this<inbox_mailbox> {
 public:
  inbox_mailbox(const std::shared_ptr<inbox_core>& core, participant_name who)
      : core_(core),
        backend_(core->backend),
        clock_(core->backend->clock()),
        settings_(core->settings),
        run_(core->run),
        who_(std::move(who)),
        consumer_(subjects::inbox_consumer(who_)),
        filter_(subjects::inbox_subject(settings_->ns, who_)),
        peers_subject_(subjects::inbox_control_subject(settings_->ns, who_)),
        peer_id_(core->peer_id),
        wakes_hub_(core->wakes) {}

  ~inbox_mailbox() {
    if (parked_) wakes_hub_->unparked();
    auto core = core_.lock();
    if (!core) return;
    std::lock_guard lock(core->mu);
    auto it = core->mailboxes.find(who_.str());
    if (it != core->mailboxes.end() && it->second.expired()) core->mailboxes.erase(it);
  }

  inbox_mailbox(const inbox_mailbox&) = delete;
  inbox_mailbox& operator=(const inbox_mailbox&) = delete;

  const participant_name& participant() const noexcept { return who_; }

  // Creates the consumer unless this mailbox has already done so (blocks).
  result<void> ensure_consumer() {
    auto backend = backend_.lock();
    if (!backend) return unexpected(errc::unavailable, "the transport is closed");
    std::lock_guard lock(ensure_mu_);
    if (ensured_) return {};
    consumer_config config{.stream = settings_->stream,
                           .durable = consumer_,
                           .filter_subject = filter_,
                           .ack_wait = settings_->ack_wait,
                           .max_ack_pending = static_cast<std::int64_t>(settings_->window),
                           .max_deliver = -1,
                           .deliver = deliver_policy::all,
                           .inactive_threshold = settings_->idle};
    auto r = backend->ensure_consumer(config);
    if (!r && r.error().code() == errc::conflict) {
      // Made by a configuration with another AckWait or window: this one applies now.
      auto u = backend->update_consumer(config);
      if (!u) return u.error();
    } else if (!r) {
      return r.error();
    }
    ensured_ = true;
    return {};
  }

  std::uint64_t add_reader(std::function<void(const inbox_message&)> fn) {
    std::vector<message> handed_back;
    std::uint64_t id = 0;
    bool first = false;
    {
      std::lock_guard lock(mu_);
      first = readers_.empty();
      auto slot = std::make_shared<reader_slot>();
      slot->id = ++last_reader_;
      slot->fn = std::move(fn);
      readers_.push_back(std::move(slot));
      id = last_reader_;
      // Waiting for the fetch that is out: now that a reader is back, that fetch may take
      // them, and it delivers them to this reader.
      handed_back = std::exchange(handing_back_, {});
    }
    settle_all(handed_back, ack_kind::nak);
    if (first) announce(k_attached_event);
    return id;
  }

  // Detaches a reader; the last one hands back what is in flight.
  void remove_reader(std::uint64_t id) {
    std::vector<message> released;
    {
      std::unique_lock lock(mu_);
      auto it = std::find_if(readers_.begin(), readers_.end(),
                             [id](const auto& r) { return r->id == id; });
      if (it == readers_.end()) return;
      (*it)->stopped = true;
      readers_.erase(it);
      if (delivering_to_ == id && delivering_on_ != std::this_thread::get_id()) {
        delivered_.wait(lock, [&] { return delivering_to_ != id; });
      }
      if (!readers_.empty()) return;
      peers_.clear();
      cancel_timer();
      set_parked(false);
      backing_off_ = false;
      // What another gateway fetched is its to hand back.
      for (auto& [seq, f] : in_flight_) {
        if (!f.forwarded) released.push_back(std::move(f.msg));
      }
      in_flight_.clear();
      if (fetching_) {
        // The fetch still out would take what is handed back now, as one more delivery
        // that reaches nobody: hand it back once that fetch has come back.
        for (auto& m : released) handing_back_.push_back(std::move(m));
        released.clear();
      }
    }
    announce(k_detached_event);
    settle_all(released, ack_kind::nak);
  }

  struct flight {
    message msg;
    time_point deadline;     // when the consumer may redeliver it
    bool forwarded = false;  // fetched by another gateway, which told this one
  };

  // Takes `seq` out of flight for an ack or nack by reader `id`.
  result<flight> take(std::uint64_t id, std::uint64_t seq) {
    std::lock_guard lock(mu_);
    if (std::none_of(readers_.begin(), readers_.end(),
                     [id](const auto& r) { return r->id == id; })) {
      return unexpected(errc::not_found, "the inbox reader is stopped");
    }
    auto it = in_flight_.find(seq);
    if (it == in_flight_.end()) {
      return unexpected(errc::not_found, fmt::format("message {} is not in flight to \"{}\" "
                                                     "(unknown, already acked or nacked)",
                                                     seq, who_.str()));
    }
    auto f = std::move(it->second);
    in_flight_.erase(it);
    return f;
  }

  // Acks or naks what `take` returned, confirmed when there is `done` to tell; kicks the
  // loop (a place in the window is free).
  void settle(flight f, ack_kind kind, duration delay, completion<void> done) {
    auto backend = backend_.lock();
    if (!backend) {
      if (done) done(error(errc::unavailable, "the transport is closed"));
      return;
    }
    {
      // Should the ack be lost, the message comes back at its deadline; a nak brings it back
      // after its delay. Neither is announced by a stored message.
      std::lock_guard lock(mu_);
      if (kind == ack_kind::nak) note_due(clock_->now() + delay);
      if (kind == ack_kind::ack) note_due(f.deadline);
    }
    if (has_peers()) {
      tell_peers(*backend, k_settled_event, f.msg, false,
                 kind == ack_kind::nak ? std::optional<duration>(delay) : std::nullopt);
    }
    if (!done) {
      backend->acknowledge(f.msg, kind, delay);
      return kick();
    }
    auto msg = f.msg;
    backend->async_acknowledge(msg, kind, delay,
                               [self = shared_from_this(), f = std::move(f),
                                done = std::move(done)](result<void> r) mutable {
                                 if (!r && r.error().code() == errc::not_found) {
                                   // The consumer is gone (idle too long): its successor
                                   // delivers the message again.
                                   self->consumer_gone();
                                 } else if (!r) {
                                   self->restore(std::move(f));
                                 }
                                 if (done) done(std::move(r));
                               });
    kick();
  }

  // Starts a fetch if the loop is idle, has readers and room in the window; otherwise
  // makes sure something starts one later. A call made while another runs (a fetch that
  // completes on the calling thread, or another thread) is folded into that one, so the
  // stack stays flat and no request to look again is lost.
  void kick() {
    std::unique_lock lock(mu_);
    if (kicking_) {
      rekick_ = true;
      return;
    }
    kicking_ = true;
    do {
      rekick_ = false;
      if (fetching_ || backing_off_ || parked_ || readers_.empty()) continue;
      auto backend = backend_.lock();
      if (!backend) break;
      auto now = clock_->now();
      std::size_t live = 0;
      auto next_due = time_point::max();
      for (const auto& [seq, f] : in_flight_) {
        if (f.deadline > now) {
          ++live;
          next_due = std::min(next_due, f.deadline);
        }
      }
      if (live >= settings_->window) {
        // Full: wait for an ack or nack, or for the first message to fall due.
        if (!timer_ || timer_at_ != next_due) arm_timer(next_due, timer_kind::window);
        continue;
      }
      cancel_timer();
      fetching_ = true;
      wakes_at_fetch_ = wakes_;
      epoch_at_fetch_ = wakes_hub_->epoch();
      fetch_made_at_ = now;
      lock.unlock();
      backend->async_fetch(
          settings_->stream, consumer_,
          fetch_request{.batch = settings_->window - live, .max_wait = k_fetch_wait},
          [self = shared_from_this()](result<std::vector<message>> r) {
            self->on_fetched(std::move(r));
          });
      backend.reset();
      lock.lock();
    } while (rekick_);
    kicking_ = false;
  }

  // A message was stored for the participant (heard on its inbox subject): a parked
  // mailbox fetches again, and one whose fetch is out does not park when it comes back
  // empty (the message may have been stored after that fetch looked).
  void wake() {
    {
      std::lock_guard lock(mu_);
      ++wakes_;
      if (!parked_) return;
      set_parked(false);
    }
    kick();
  }

  // What the inbox of another gateway said of this participant's deliveries: one it
  // fetched (delivered here too, as one more delivery of the same message: an ack or nack
  // from here settles it) or one settled there (no longer in flight here).
  void on_peer(const message& m) {
    auto event = find_header(m.headers, k_event_header);
    auto peer = find_header(m.headers, k_peer_header);
    if (!event || !peer) return;
    if (*event == k_attached_event || *event == k_present_event) {
      // What this gateway fetched and is still in flight reaches the newly known one's
      // readers too: it may have been fetched before the word of them came.
      std::vector<message> ours;
      {
        std::lock_guard lock(mu_);
        if (readers_.empty()) return;  // it learns of readers here when they come
        if (peers_.emplace(*peer).second) {
          for (const auto& [seq, f] : in_flight_)
            if (!f.forwarded) ours.push_back(f.msg);
        }
      }
      if (*event == k_attached_event) announce(k_present_event);
      if (auto backend = backend_.lock(); backend) {
        for (const auto& msg : ours) tell_peers(*backend, k_delivered_event, msg, true);
      }
      return;
    }
    if (*event == k_detached_event) {
      std::lock_guard lock(mu_);
      peers_.erase(std::string(*peer));
      return;
    }
    auto seq = number_header(m.headers, k_seq_header);
    auto delivery = number_header(m.headers, k_delivery_header);
    if (!seq || !delivery) return;
    if (*event == k_settled_event) {
      // A nak there: the consumer delivers it again after its delay, which no stored
      // message announces.
      auto nak_ms = number_header(m.headers, k_nak_header);
      {
        std::lock_guard lock(mu_);
        if (nak_ms) {
          note_due(clock_->now() +
                   std::chrono::milliseconds(std::min<std::uint64_t>(*nak_ms, 1ULL << 40)));
        }
        auto it = in_flight_.find(*seq);
        if (it == in_flight_.end() || it->second.msg.delivery_count > *delivery) return;
        in_flight_.erase(it);
      }
      return kick();
    }
    auto token = find_header(m.headers, k_ack_header);
    if (*event != k_delivered_event || !token) return;
    auto env = parse_envelope(m.data);
    if (!env) return;
    message msg;
    msg.stream = settings_->stream;
    msg.subject = filter_;
    msg.data = m.data;
    msg.seq = *seq;
    msg.delivery_count = *delivery;
    msg.consumer = consumer_;
    msg.ack_token = std::string(*token);
    std::unique_lock lock(mu_);
    if (readers_.empty()) return;
    peers_.emplace(*peer);  // it fetches, so it has readers
    if (auto it = in_flight_.find(*seq);
        it != in_flight_.end() && it->second.msg.delivery_count >= *delivery) {
      return;  // known already (told twice, or fetched here too)
    }
    in_flight_.insert_or_assign(*seq, flight{.msg = std::move(msg),
                                             .deadline = clock_->now() + settings_->ack_wait,
                                             .forwarded = true});
    // In flight here now: if the gateway that fetched it hands it back, this one fetches it.
    const bool woke = parked_;
    set_parked(false);
    deliver(lock, {inbox_message{.seq = *seq, .delivery = *delivery, .env = std::move(*env)}});
    lock.unlock();
    if (woke) kick();
  }

 private:
  bool has_peers() {
    std::lock_guard lock(mu_);
    return !peers_.empty();
  }

  // Called with mu_ held. A message may come back at `due` with nothing stored to announce
  // it: a parked loop fetches then. Kept by the whole second, so a busy loop keeps about one
  // per second of ack wait; a fetch made after one (and the margin) drops it.
  void note_due(time_point due) {
    dues_.insert(time_point(std::chrono::ceil<std::chrono::seconds>(due.time_since_epoch())));
    if (parked_ && timer_at_ > *dues_.begin() + k_due_margin) {
      arm_timer(*dues_.begin() + k_due_margin, timer_kind::parked);
    }
  }

  // Called with mu_ held. Parked: no fetch is out until a wake, a delivery told by another
  // gateway, the first due (note_due), or `parked_look` (which also keeps an
  // inactive_threshold away).
  // Parking is counted by wakes_hub_->try_park; unparking is told to it here.
  void set_parked(bool on) {
    if (parked_ == on) return;
    parked_ = on;
    if (!on) wakes_hub_->unparked();
    if (on) {
      auto at = clock_->now() + settings_->parked_look;
      if (!dues_.empty()) at = std::min(at, *dues_.begin() + k_due_margin);
      arm_timer(at, timer_kind::parked);
    } else {
      cancel_timer();
    }
  }

  // Tells the inboxes of the other gateways whether this one has readers of the participant.
  void announce(std::string_view event) {
    auto backend = backend_.lock();
    if (!backend) return;
    static_cast<void>(
        backend->publish_core({.subject = peers_subject_,
                               .headers = {{std::string(k_peer_header), peer_id_},
                                           {std::string(k_event_header), std::string(event)}}}));
  }

  // Tells the inboxes of the other gateways (`on_peer`) that `m` was delivered here (with
  // its text and ack token) or settled here. A core message: nothing is kept for a gateway
  // that is away (its sessions get the message at its next delivery).
  void tell_peers(transport& backend, std::string_view event, const message& m, bool with_data,
                  std::optional<duration> nak_delay = std::nullopt) {
    outgoing_message out{
        .subject = peers_subject_,
        .headers = {{std::string(k_peer_header), peer_id_},
                    {std::string(k_event_header), std::string(event)},
                    {std::string(k_seq_header), std::to_string(m.seq)},
                    {std::string(k_delivery_header), std::to_string(m.delivery_count)}}};
    if (with_data) {
      out.data = m.data;
      out.headers.emplace_back(k_ack_header, m.ack_token);
    }
    if (nak_delay) {
      out.headers.emplace_back(
          k_nak_header,
          std::to_string(
              std::chrono::duration_cast<std::chrono::milliseconds>(*nak_delay).count()));
    }
    static_cast<void>(backend.publish_core(std::move(out)));
  }

  struct reader_slot {
    std::uint64_t id = 0;
    std::function<void(const inbox_message&)> fn;
    bool stopped = false;  // guarded by the mailbox's mu_
  };

  // Puts back what the backend did not settle, unless it moved on meanwhile.
  void restore(flight f) {
    {
      std::lock_guard lock(mu_);
      if (readers_.empty()) return;
      in_flight_.try_emplace(f.msg.seq, std::move(f));
      if (!parked_) return;
      set_parked(false);
    }
    kick();
  }

  void settle_all(const std::vector<message>& msgs, ack_kind kind) {
    if (msgs.empty()) return;
    auto backend = backend_.lock();
    if (!backend) return;
    for (const auto& m : msgs) backend->async_acknowledge(m, kind, duration::zero(), ignore);
  }

  void on_fetched(result<std::vector<message>> r) {
    if (!r) return on_fetch_error(std::move(r).error());
    const bool found_nothing = r->empty();
    std::vector<message> kept, bad;
    std::vector<inbox_message> batch;
    for (auto& m : *r) {
      auto env = parse_envelope(m.data);
      if (!env) {
        bad.push_back(std::move(m));
        continue;
      }
      batch.push_back(inbox_message{.seq = m.seq, .delivery = m.delivery_count, .env = *env});
      kept.push_back(std::move(m));
    }
    // Not an envelope (not sent through an inbox): it can never be delivered.
    settle_all(bad, ack_kind::term);
    std::unique_lock lock(mu_);
    backoff_ = duration::zero();
    auto handed_back = std::exchange(handing_back_, {});
    if (readers_.empty()) {
      fetching_ = false;
      lock.unlock();
      settle_all(handed_back, ack_kind::nak);
      settle_all(kept, ack_kind::nak);
      kick();  // a reader may have attached in the meantime
      return;
    }
    if (!handed_back.empty()) {
      lock.unlock();
      settle_all(handed_back, ack_kind::nak);
      lock.lock();
    }
    auto deadline = clock_->now() + settings_->ack_wait;
    // Kept for the other gateways only when one has readers of the participant.
    const bool tell = !peers_.empty();
    for (auto& m : kept) {
      in_flight_.insert_or_assign(m.seq,
                                  flight{.msg = tell ? m : std::move(m), .deadline = deadline});
    }
    if (!tell) kept.clear();
    deliver(lock, std::move(batch));
    fetching_ = false;
    // What a fetch made past its deadline did not bring again is no longer pending (acked
    // or settled elsewhere, a word of it lost; or removed from the stream).
    dues_.erase(dues_.begin(), dues_.upper_bound(fetch_made_at_ - k_due_margin));
    if (found_nothing) {
      std::erase_if(in_flight_, [&](const auto& e) {
        return e.second.deadline + k_due_margin <= fetch_made_at_;
      });
    }
    // Nothing came and nothing is in flight: no fetch until a message is stored for the
    // participant (heard on its subject) or may come back (dues_), rather than one every
    // k_fetch_wait.
    bool want_wakes = false;
    if (found_nothing && in_flight_.empty() && !readers_.empty() && wakes_ == wakes_at_fetch_) {
      if (wakes_hub_->try_park(epoch_at_fetch_)) {
        set_parked(true);
      } else {
        want_wakes = true;  // parks after a fetch made once stored messages are heard
      }
    }
    // The last reader left during the delivery: no fetch is out, so hand back now.
    auto left_behind = std::exchange(handing_back_, {});
    lock.unlock();
    if (want_wakes) wakes_hub_->want();
    settle_all(left_behind, ack_kind::nak);
    // The participant's sessions on other gateways get them too; after they are in flight
    // here, so that a settle from there finds them.
    if (auto backend = backend_.lock(); backend) {
      for (const auto& m : kept) tell_peers(*backend, k_delivered_event, m, true);
    }
    kick();
  }

  // Hands each message to every reader attached now, one call at a time, unlocked; a
  // message settled or handed back meanwhile goes no further.
  // Deliveries run one at a time (those of a fetch and those another gateway tells of may
  // come on two threads): a batch that comes while another is delivered is delivered by
  // that thread, after it.
  void deliver(std::unique_lock<std::mutex>& lock, std::vector<inbox_message> batch) {
    if (delivering_) {
      for (auto& m : batch) queued_.push_back(std::move(m));
      return;
    }
    delivering_ = true;
    deliver_now(lock, batch);
    while (!queued_.empty()) {
      auto more = std::exchange(queued_, {});
      deliver_now(lock, more);
    }
    delivering_ = false;
  }

  void deliver_now(std::unique_lock<std::mutex>& lock, const std::vector<inbox_message>& batch) {
    for (const auto& m : batch) {
      auto readers = readers_;
      for (const auto& slot : readers) {
        auto it = in_flight_.find(m.seq);
        if (it == in_flight_.end() || it->second.msg.delivery_count != m.delivery) break;
        if (slot->stopped) continue;
        delivering_to_ = slot->id;
        delivering_on_ = std::this_thread::get_id();
        lock.unlock();
        try {
          slot->fn(m);
        } catch (...) {  // NOLINT(bugprone-empty-catch): a callback cannot stop the loop
        }
        lock.lock();
        delivering_to_ = 0;
        delivered_.notify_all();
      }
    }
  }

  void on_fetch_error(const error& e) {
    std::unique_lock lock(mu_);
    fetching_ = false;
    if (!handing_back_.empty()) {
      auto handed_back = std::exchange(handing_back_, {});
      lock.unlock();
      settle_all(handed_back, ack_kind::nak);
      lock.lock();
    }
    if (readers_.empty()) return;
    backoff_ = backoff_ == duration::zero() ? k_min_backoff : std::min(backoff_ * 2, k_max_backoff);
    backing_off_ = true;
    if (e.code() != errc::not_found) {
      arm_timer(clock_->now() + backoff_, timer_kind::backoff);
      return;
    }
    // The consumer (or the stream) was deleted: make it again, off the transport thread.
    lock.unlock();
    consumer_gone();
  }

  // The backend no longer has the consumer (deleted, or removed after `idle`): forgets it
  // was made and makes it again, off the transport thread, then carries on.
  void consumer_gone() {
    {
      std::lock_guard ensure(ensure_mu_);
      ensured_ = false;
    }
    {
      // The new consumer delivers again what the old one had out, unannounced.
      std::lock_guard lock(mu_);
      set_parked(false);
    }
    std::weak_ptr<inbox_mailbox> weak = weak_from_this();
    run_([weak] {
      if (auto self = weak.lock()) self->recreate();
    });
  }

  // Runs on the executor: makes the stream and the consumer again, then carries on.
  void recreate() {
    auto backend = backend_.lock();
    if (!backend) return;
    auto r = detail::ensure_limits(*backend, settings_->stream_settings);
    backend.reset();
    auto c = r ? ensure_consumer() : result<void>(r.error());
    {
      std::lock_guard lock(mu_);
      if (readers_.empty()) return;
      if (!c) {
        arm_timer(clock_->now() + backoff_, timer_kind::backoff);
        return;
      }
      backing_off_ = false;
    }
    kick();
  }

  // What a timer ends when it fires.
  enum class timer_kind { window, backoff, parked };

  // Called with mu_ held.
  void arm_timer(time_point at, timer_kind kind) {
    cancel_timer();
    auto gen = timer_gen_;
    std::weak_ptr<inbox_mailbox> weak = weak_from_this();
    timer_at_ = at;
    timer_ = clock_->call_at(at, [weak, gen, kind] {
      auto self = weak.lock();
      if (!self) return;
      {
        std::lock_guard lock(self->mu_);
        if (gen != self->timer_gen_) return;
        self->timer_ = 0;
        ++self->timer_gen_;
        if (kind == timer_kind::backoff) self->backing_off_ = false;
        if (kind == timer_kind::parked) self->set_parked(false);
      }
      self->kick();
    });
  }

  // Called with mu_ held.
  void cancel_timer() {
    if (timer_) clock_->cancel(timer_);
    timer_ = 0;
    ++timer_gen_;
  }

  std::weak_ptr<inbox_core> core_;
  std::weak_ptr<transport> backend_;
  std::shared_ptr<amp::clock> clock_;
  std::shared_ptr<const inbox_settings> settings_;
  executor run_;
  participant_name who_;
  std::string consumer_;
  std::string filter_;
  std::string peers_subject_;
  std::string peer_id_;
  std::shared_ptr<wake_hub> wakes_hub_;  // inbox_core::wakes

  std::mutex ensure_mu_;
  bool ensured_ = false;  // guarded by ensure_mu_

  std::mutex mu_;
  std::condition_variable delivered_;
  std::vector<std::shared_ptr<reader_slot>> readers_;
  std::uint64_t last_reader_ = 0;
  // The inbox objects elsewhere known to have readers of the participant (while this one
  // has readers): deliveries and settles are told to them.
  std::set<std::string, std::less<>> peers_;
  std::map<std::uint64_t, flight> in_flight_;  // by stream sequence
  bool fetching_ = false;  // a fetch is out, or its messages are being delivered
  // In flight when the last reader left while a fetch was out: handed back when it returns.
  std::vector<message> handing_back_;
  bool kicking_ = false;
  bool rekick_ = false;
  bool backing_off_ = false;
  bool parked_ = false;               // no fetch out on purpose: see set_parked
  std::uint64_t wakes_ = 0;           // messages heard stored for the participant
  std::uint64_t wakes_at_fetch_ = 0;  // wakes_ when the fetch that is out was made
  std::uint64_t epoch_at_fetch_ = 0;  // wakes_hub_->epoch() then
  std::set<time_point> dues_;         // when messages may come back unannounced (note_due)
  time_point fetch_made_at_{};        // when the fetch that is out (or came back) was made
  duration backoff_ = duration::zero();
  timer_id timer_ = 0;
  time_point timer_at_{};
  std::uint64_t timer_gen_ = 0;        // a timer callback of an older generation does nothing
  bool delivering_ = false;            // a thread is in `deliver`
  std::vector<inbox_message> queued_;  // for that thread to deliver next
  std::uint64_t delivering_to_ = 0;    // the reader whose callback runs now; 0: none
  std::thread::id delivering_on_{};
};

namespace {

std::shared_ptr<inbox_mailbox> mailbox_for(const std::shared_ptr<inbox_core>& core,
                                           const participant_name& who) {
  std::lock_guard lock(core->mu);
  auto& weak = core->mailboxes[who.str()];
  if (auto existing = weak.lock()) return existing;
  auto made = std::make_shared<inbox_mailbox>(core, who);
  weak = made;
  return made;
}

// Hands what another gateway's inbox said to the mailbox of the participant it names, if
// this object has one; what this object said itself is left alone.
// The mailbox of the participant named by the last token of `subject`, if this object has one.
std::shared_ptr<inbox_mailbox> mailbox_of(inbox_core& core, std::string_view subject) {
  auto name = participant_name::make(subject.substr(subject.rfind('.') + 1));
  if (!name) return nullptr;
  std::lock_guard lock(core.mu);
  auto it = core.mailboxes.find(name->str());
  return it == core.mailboxes.end() ? nullptr : it->second.lock();
}

void tell_mailbox(inbox_core& core, const message& m) {
  if (find_header(m.headers, k_peer_header) == core.peer_id) return;
  if (auto mailbox = mailbox_of(core, m.subject)) mailbox->on_peer(m);
}

// A message stored on `subject` (heard on the inbox subjects): wakes the mailbox of the
// participant it is for, if this object has one.
void wake_mailbox(inbox_core& core, std::string_view subject) {
  if (auto mailbox = mailbox_of(core, subject)) mailbox->wake();
}

// The message to publish for `msg`, checked in the spec's order.
struct prepared {
  outgoing_message out;
  std::string id;
};

result<prepared> prepare(sealed_envelope env, const inbox_core& core) {
  const auto& ns = core.settings->ns;
  if (auto r = check_sealed_for(env, ns); !r) return r.error();
  auto to = participant_name::make(env.get().to);
  if (!to) return unexpected(errc::invalid_name, "to: " + to.error().message());
  prepared p;
  p.id = env.get().id;
  p.out.subject = subjects::inbox_subject(ns, *to);
  p.out.msg_id = dedup_id(env.get().from, env.get().to, env.get().id);
  p.out.data = std::move(env).json();
  return p;
}

result<prepared> prepare(inbox_send msg, const inbox_core& core) {
  auto env = sealed_envelope::seal(envelope_parts{.from = std::move(msg.from),
                                                  .to = msg.to.str(),
                                                  .body = std::move(msg.body),
                                                  .type = std::move(msg.type),
                                                  .headers = std::move(msg.headers),
                                                  .msg_id = std::move(msg.msg_id),
                                                  .reply_to = std::move(msg.reply_to),
                                                  .correlation = std::move(msg.correlation)},
                                   core.settings->ns.view(), core.backend->clock()->now());
  if (!env) return env.error();
  return prepare(std::move(*env), core);
}

// Publishes what `prepare` made (or answers its error).
void store(result<prepared> p, const inbox_core& core, completion<send_result> done) {
  if (!p) return done(p.error());
  core.backend->async_publish(
      std::move(p->out), [id = std::move(p->id), done = std::move(done)](result<publish_ack> r) {
        if (!r) return done(std::move(r).error());
        done(send_result{.seq = r->seq, .msg_id = id, .duplicate = r->duplicate});
      });
}

}  // namespace
}  // namespace detail

// ----- inbox_reader -------------------------------------------------------------------

inbox_reader::inbox_reader(std::shared_ptr<detail::inbox_core> core,
                           std::shared_ptr<detail::inbox_mailbox> mailbox, std::uint64_t id)
    : core_(std::move(core)), mailbox_(std::move(mailbox)), id_(id) {}

inbox_reader::~inbox_reader() {
  stop();
}

const participant_name& inbox_reader::participant() const noexcept {
  return mailbox_->participant();
}

result<void> inbox_reader::ack(std::uint64_t seq) {
  return settle(seq, ack_kind::ack, duration::zero(), nullptr);
}

result<void> inbox_reader::nack(std::uint64_t seq, duration delay) {
  return settle(seq, ack_kind::nak, delay, nullptr);
}

void inbox_reader::async_ack(std::uint64_t seq, completion<void> done) {
  if (auto r = settle(seq, ack_kind::ack, duration::zero(), done); !r && done) done(r.error());
}

void inbox_reader::async_nack(std::uint64_t seq, duration delay, completion<void> done) {
  if (auto r = settle(seq, ack_kind::nak, delay, done); !r && done) done(r.error());
}

result<void> inbox_reader::settle(std::uint64_t seq, ack_kind kind, duration delay,
                                  completion<void> done) {
  if (delay < duration::zero()) {
    return unexpected(errc::bad_request, "nack delay must not be negative");
  }
  auto taken = mailbox_->take(id_, seq);
  if (!taken) return taken.error();
  mailbox_->settle(std::move(*taken), kind, delay, std::move(done));
  return {};
}

void inbox_reader::stop() noexcept {
  mailbox_->remove_reader(id_);
}

// ----- inbox --------------------------------------------------------------------------

inbox::inbox(std::shared_ptr<detail::inbox_core> core) : core_(std::move(core)) {}

inbox::~inbox() {
  if (peers_) peers_->stop();
  // Readers may outlive this object: nothing wakes their loops any more, so they stop
  // parking and fetch as they did before parking existed.
  core_->wakes->go_deaf();
  look_again();
}

void inbox::look_again() {
  std::vector<std::shared_ptr<detail::inbox_mailbox>> all;
  {
    std::lock_guard lock(core_->mu);
    for (auto& [name, weak] : core_->mailboxes) {
      if (auto m = weak.lock()) all.push_back(std::move(m));
    }
  }
  for (auto& m : all) m->wake();
}

result<std::shared_ptr<inbox>> inbox::open(std::shared_ptr<transport> t,
                                           const broker_config& config) {
  if (!t) return unexpected(errc::bad_request, "inbox needs a transport");
  if (config.inbox_window < 1) {
    return unexpected(errc::bad_request,
                      fmt::format("inbox_window must be at least 1, not {}", config.inbox_window));
  }
  if (config.inbox_ack_wait <= duration::zero()) {
    return unexpected(errc::bad_request, "inbox_ack_wait must be positive");
  }
  if (config.inbox_idle_consumer < duration::zero()) {
    return unexpected(errc::bad_request, "inbox_idle_consumer must not be negative");
  }
  auto stream = subjects::inbox_stream(config.ns);
  auto settings = std::make_shared<detail::inbox_settings>(detail::inbox_settings{
      .ns = config.ns,
      .stream = stream,
      .stream_settings =
          stream_config{.name = stream,
                        .subjects = {subjects::inbox_subjects(config.ns)},
                        .retention = retention_policy::work_queue,
                        .storage = config.storage,
                        .max_bytes = config.inbox_max_bytes > 0 ? config.inbox_max_bytes : -1,
                        .max_age = std::max(config.inbox_max_age, duration::zero()),
                        .discard = discard_policy::new_messages,
                        .duplicate_window = config.duplicate_window,
                        .replicas = config.replicas},
      .ack_wait = config.inbox_ack_wait,
      .window = static_cast<std::size_t>(config.inbox_window),
      .idle = config.inbox_idle_consumer,
      .parked_look = config.inbox_idle_consumer > duration::zero()
                         ? std::min(detail::k_parked_look, config.inbox_idle_consumer / 2)
                         : detail::k_parked_look});
  // JetStream refuses a duplicate window longer than the max age.
  auto& sc = settings->stream_settings;
  if (sc.max_age > duration::zero())
    sc.duplicate_window = std::min(sc.duplicate_window, sc.max_age);
  if (auto r = detail::ensure_limits(*t, sc); !r) return r.error();
  auto core = std::make_shared<detail::inbox_core>();
  core->backend = std::move(t);
  core->settings = std::move(settings);
  core->run = detail::executor_for(config, core->pool);
  core->peer_id = detail::new_peer_id();
  core->wakes = std::make_shared<detail::wake_hub>(
      core->backend, core->backend->clock(), core->run, subjects::inbox_subjects(config.ns),
      [weak = std::weak_ptr<detail::inbox_core>(core)](std::string_view subject) {
        if (auto c = weak.lock()) detail::wake_mailbox(*c, subject);
      });
  std::weak_ptr<detail::inbox_core> weak = core;
  auto peers = core->backend->subscribe_core(subjects::inbox_control_subjects(config.ns),
                                             [weak](const message& m) {
                                               if (auto c = weak.lock())
                                                 detail::tell_mailbox(*c, m);
                                             });
  if (!peers) return peers.error();
  auto made = std::make_shared<inbox>(std::move(core));
  made->peers_ = std::move(*peers);
  return made;
}

result<send_result> inbox::send(inbox_send msg) {
  auto p = detail::prepare(std::move(msg), *core_);
  if (!p) return p.error();
  auto ack = core_->backend->publish(std::move(p->out));
  if (!ack) return ack.error();
  return send_result{.seq = ack->seq, .msg_id = std::move(p->id), .duplicate = ack->duplicate};
}

void inbox::async_send(inbox_send msg, completion<send_result> done) {
  detail::store(detail::prepare(std::move(msg), *core_), *core_, std::move(done));
}

void inbox::async_send(sealed_envelope env, completion<send_result> done) {
  detail::store(detail::prepare(std::move(env), *core_), *core_, std::move(done));
}

result<std::unique_ptr<inbox_reader>> inbox::attach(
    const participant_name& participant, std::function<void(const inbox_message&)> on_message) {
  if (!on_message) return unexpected(errc::bad_request, "attach needs an on_message callback");
  auto mailbox = detail::mailbox_for(core_, participant);
  if (auto r = mailbox->ensure_consumer(); !r) return r.error();
  auto id = mailbox->add_reader(std::move(on_message));
  mailbox->kick();
  return std::unique_ptr<inbox_reader>(new inbox_reader(core_, std::move(mailbox), id));
}

result<std::vector<participant_name>> inbox::participants() {
  const auto& settings = *core_->settings;
  auto consumers = core_->backend->consumer_names(settings.stream);
  if (!consumers) return consumers.error();
  auto waiting =
      core_->backend->stream_subjects(settings.stream, subjects::inbox_subjects(settings.ns));
  if (!waiting) return waiting.error();
  std::set<std::string, std::less<>> names;
  const auto consumer_prefix = subjects::inbox_consumer(*participant_name::make("x"));
  const std::string_view prefix(consumer_prefix.data(), consumer_prefix.size() - 1);
  for (const auto& c : *consumers) {
    if (c.starts_with(prefix)) names.insert(c.substr(prefix.size()));
  }
  const auto subject_prefix = subjects::inbox_subject(settings.ns, *participant_name::make("x"));
  const std::string_view under(subject_prefix.data(), subject_prefix.size() - 1);
  for (const auto& [subject, count] : *waiting) {
    if (subject.starts_with(under)) names.insert(subject.substr(under.size()));
  }
  std::vector<participant_name> out;
  for (const auto& n : names) {
    if (auto p = participant_name::make(n)) out.push_back(std::move(*p));  // others: not ours
  }
  return out;
}

const namespace_name& inbox::ns() const noexcept {
  return core_->settings->ns;
}

}  // namespace amp
