#pragma once

/// \file
/// Rate limits and daily budgets per participant (spec §8): what the gateway asks before
/// it carries out a `send`, `publish` or new `submit`.
///
/// Rate. Each participant (of a namespace) has two token buckets, held by this gateway
/// only: one of messages (`rate_policy::per_s`, capacity `burst`) and one of bytes of the
/// serialized `body` (`bytes_per_s`, capacity `rate_policy::bytes_capacity()`: by default
/// the bytes of the same burst window, `bytes_per_s * burst / per_s`). Both start full.
/// A request passes when the message bucket holds one token and the bytes bucket holds
/// the body's bytes (a body larger than the whole bytes capacity passes when that bucket
/// is full and leaves it in debt, so it is paced at `bytes_per_s` yet never refused
/// forever); then it takes both. A refused request takes nothing and learns how long to
/// wait (`retry_after`, rounded up to the millisecond: after exactly that long the same
/// request passes if nothing else took tokens meanwhile). Buckets that are full again
/// are forgotten (a forgotten bucket and a full one behave alike), so idle participants
/// cost no memory.
///
/// Budget. One counter per (ns, participant) and UTC day, over `send`, `publish` and new
/// `submit`s, kept in the backend so that every gateway on one NATS shares it exactly:
/// bucket `AMP_BUDGETS` (history 1, age limit 48 h, which removes past days), key
/// `<ns>.<participant>.<yyyymmdd>`, value the count in decimal, every change a
/// compare-and-set on the revision that was read. The day is the UTC day of the
/// transport's clock of the gateway that counts; gateways are expected to keep their
/// clocks in sync (NTP), or a request near midnight may count on the neighbouring day.
/// `budget_exhausted` lasts until that day turns. Within one gateway the spends and refunds
/// of a counter are batched: one compare-and-set at a time per counter, covering every
/// request that arrived meanwhile, so concurrent requests of one participant do not race
/// each other; several gateways race by compare-and-set and never grant more than the
/// budget between them. A participant without a budget (`per_day` null) is not counted
/// and never touches the backend; `per_day` 0 refuses everything without touching it.
///
/// What a request costs (the spec's order is `rate_limited` before `budget_exhausted`):
/// - refused by the rate limit: nothing (no tokens, no budget);
/// - refused by the budget: the rate tokens it took stay taken (it went through the rate
///   check; this also bounds how often an exhausted participant makes the gateway read
///   the counter);
/// - failed later in the operation (`unavailable`, `conflict` …) after spending budget:
///   the gateway should `refund_budget` the spend, since a failed request changes
///   nothing (spec §9). A refund is a compare-and-set of its own; when the backend is
///   away it fails too, and that unit stays spent (the budget errs on the side of
///   counting). Rate tokens are never refunded;
/// - a resubmission (`submit` answered with `"created":false`, spec §7) counts against the
///   rate, not the budget: refund it the same way.
///
/// Threads. Every member function is thread-safe. `take_rate` and the asynchronous
/// budget calls never block on the backend; `open`, `spend_budget` and `refund_budget`
/// do. All time is the transport's clock (`transport::clock()`), a `manual_clock` in tests.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "amp/clock.hpp"
#include "amp/names.hpp"
#include "amp/result.hpp"
#include "amp/transport/transport.hpp"

namespace amp {

/// A participant's rate limit (spec §11 `policy.*.rate`). Every value must be finite;
/// `per_s` and `bytes_per_s` positive, `burst` (and `bytes_burst`, when given) at least 1.
struct rate_policy {
  /// Messages per second, the refill of the message bucket.
  double per_s = 1000;
  /// Capacity of the message bucket: the most messages at once from a full bucket.
  double burst = 2000;
  /// Bytes of serialized `body` per second, the refill of the bytes bucket.
  double bytes_per_s = 10485760;
  /// Capacity of the bytes bucket; unset: `bytes_per_s * burst / per_s`, the bytes of the
  /// same burst window as the message bucket (20 MiB with the defaults).
  std::optional<double> bytes_burst{};

  /// The capacity of the bytes bucket.
  double bytes_capacity() const noexcept {
    return bytes_burst ? *bytes_burst : bytes_per_s * burst / per_s;
  }

  friend bool operator==(const rate_policy&, const rate_policy&) = default;
};

/// A participant's rate for every op other than `hello`, `bye`, `send`, `publish` and
/// `submit` (which the spec's `rate_policy` limits): amp's `policy.*.ops`. `register`,
/// `who` and `watch`, which write or read a namespace's whole registry, take
/// `registry_op_cost` tokens; the others one. Both values must be finite, `per_s` positive,
/// `burst` at least `registry_op_cost`.
struct ops_policy {
  /// Tokens per second, the refill of the bucket.
  double per_s = 10000;
  /// Capacity of the bucket (it starts full).
  double burst = 20000;

  friend bool operator==(const ops_policy&, const ops_policy&) = default;
};

/// The tokens a `register`, `who` or `watch` takes from the `ops_policy` bucket.
inline constexpr double registry_op_cost = 10;

/// A participant's daily budget (spec §11 `policy.*.budget`).
struct budget_policy {
  /// Requests per UTC day (at least 0); unset: unlimited and not counted.
  std::optional<std::int64_t> per_day{};

  friend bool operator==(const budget_policy&, const budget_policy&) = default;
};

/// The policy of one participant.
struct participant_policy {
  rate_policy rate{};
  budget_policy budget{};
  ops_policy ops{};

  friend bool operator==(const participant_policy&, const participant_policy&) = default;
};

/// The configuration of `policy::open` (spec §11 `policy`, plus where the budgets live).
struct policy_config {
  /// The policy of every participant not named in `participants` (spec `policy.default`).
  participant_policy default_policy{};
  /// Policies by participant name, in every namespace (spec `policy.participants`).
  std::map<std::string, participant_policy, std::less<>> participants{};
  /// Storage and replicas of the budget bucket.
  storage_type storage = storage_type::file;
  int replicas = 1;

  friend bool operator==(const policy_config&, const policy_config&) = default;
};

/// The answer of `policy::take_rate`.
struct rate_verdict {
  /// True when the request passed (and took its tokens).
  bool allowed = true;
  /// When refused: how long until the same request would pass (at least 1 ms; the wire's
  /// `retry_after_ms`). Zero when allowed.
  std::chrono::milliseconds retry_after{0};
  /// When refused: says which limit, and the wait. Empty when allowed.
  std::string message{};

  /// Success, or `rate_limited` with `message`.
  result<void> as_result() const;
};

/// What `spend_budget` counted; give it back to `refund_budget` when the request fails
/// later.
struct budget_spend {
  namespace_name ns;
  participant_name participant;
  /// The UTC day counted on (`yyyymmdd`); empty when nothing was counted (no budget).
  std::string day{};
  /// What is left of the day's budget after this spend; unset when there is no budget.
  std::optional<std::int64_t> remaining{};

  /// True when a unit was counted (and a refund would give it back).
  bool counted() const noexcept { return !day.empty(); }
};

/// Rate limits and budgets of the participants served by one gateway. Create with
/// `open`; share freely. Several instances (gateways) on one backend share the budgets.
class policy {
 public:
  /// Checks the configuration and, when some participant has a budget, ensures the
  /// budget bucket (blocks on the backend).
  /// Errors: `bad_request` naming the first value out of range (e.g.
  /// "policy.participants.bob.rate.per_s must be a finite number above 0");
  /// `invalid_name` for a key of `participants` that is not a participant name; from the
  /// bucket: `conflict` (it exists with another configuration), `unavailable`.
  static result<std::shared_ptr<policy>> open(std::shared_ptr<transport> t, policy_config config);

  ~policy();
  policy(const policy&) = delete;
  policy& operator=(const policy&) = delete;

  /// The policy that applies to `participant`.
  const participant_policy& policy_of(const participant_name& participant) const;

  /// Checks and takes the rate of one request with a serialized body of `body_bytes`
  /// (local to this gateway; never touches the backend, never blocks for long). Refused:
  /// `allowed` false, `retry_after` and `message` set, nothing taken.
  rate_verdict take_rate(const namespace_name& ns, const participant_name& participant,
                         std::size_t body_bytes);

  /// Checks and takes `tokens` from the participant's `ops_policy` bucket, as `take_rate`
  /// does for its own (local, never blocks for long). Refused: `allowed` false,
  /// `retry_after` and `message` set, nothing taken.
  rate_verdict take_ops(const namespace_name& ns, const participant_name& participant,
                        double tokens);

  /// Counts one request against the participant's budget of today (UTC, transport clock).
  /// Errors: `budget_exhausted` when the day's budget is spent (the message says when it
  /// renews); `unavailable` when the backend cannot be reached or the counter kept
  /// changing under other gateways through every retry (nothing was counted);
  /// `internal` when the stored counter is not a count.
  ///
  /// `done` runs once: on the calling thread before this returns, on a transport callback
  /// thread, or on the thread of another caller of this policy whose call is driving the
  /// same counter. It must not block nor call the blocking functions of this policy.
  void async_spend_budget(const namespace_name& ns, const participant_name& participant,
                          completion<budget_spend> done);
  /// Blocking `async_spend_budget`; must not be called from a transport callback.
  result<budget_spend> spend_budget(const namespace_name& ns, const participant_name& participant);

  /// Gives back what `spend` counted (nothing to do when `!spend.counted()`), on the day it
  /// was counted on; never takes a counter below zero. Errors: `unavailable` (the unit
  /// stays spent), `internal`. `done` runs as for `async_spend_budget`.
  void async_refund_budget(const budget_spend& spend, completion<void> done);
  /// Blocking `async_refund_budget`; must not be called from a transport callback.
  result<void> refund_budget(const budget_spend& spend);

  /// How many participants' rate buckets this gateway holds now (full buckets are
  /// dropped at most every second, as calls come in). For monitoring and tests.
  std::size_t held_rate_buckets() const;

 private:
  struct impl;
  explicit policy(std::shared_ptr<impl> p);

  std::shared_ptr<impl> impl_;
};

}  // namespace amp
