#include "amp/gateway/policy.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "amp/subjects.hpp"
#include "amp/timestamp.hpp"
#include "detail/wait_for.hpp"

namespace amp {
namespace {

using namespace std::chrono_literals;

// How often (transport clock) the maps are swept of what is no longer needed.
constexpr duration k_sweep_period = 1s;
// A budget counter's cached revision is dropped after this long unused.
constexpr duration k_counter_idle = 1min;
// Compare-and-set attempts of one batch before it gives up with `unavailable`.
constexpr int k_cas_attempts = 64;
// A request passes when its tokens would be there within this long; `retry_after` is
// rounded up from the wait less this, so waiting exactly `retry_after` is always enough.
constexpr double k_slack_s = 1e-9;
// Age limit of the budget bucket: past days go on their own.
constexpr duration k_budget_age = 48h;

// The UTC day of `t`: its first instant and `yyyymmdd`.
struct utc_day {
  time_point start;
  std::string name;
};

utc_day day_of(time_point t) {
  auto d = std::chrono::floor<std::chrono::days>(t);
  std::chrono::year_month_day ymd{d};
  return {
      .start = time_point(d),
      .name = fmt::format("{:04}{:02}{:02}", static_cast<int>(ymd.year()),
                          static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()))};
}

// `yyyymmdd` back to the day's first instant, if it is one.
std::optional<time_point> day_start(std::string_view name) {
  if (name.size() != 8) return std::nullopt;
  int y = 0;
  unsigned m = 0, d = 0;
  auto parse = [&](std::string_view s, auto& out) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc{} && p == s.data() + s.size();
  };
  if (!parse(name.substr(0, 4), y) || !parse(name.substr(4, 2), m) ||
      !parse(name.substr(6, 2), d)) {
    return std::nullopt;
  }
  std::chrono::year_month_day ymd{std::chrono::year(y), std::chrono::month(m), std::chrono::day(d)};
  if (!ymd.ok()) return std::nullopt;
  return time_point(std::chrono::sys_days(ymd));
}

bool finite_at_least(double v, double low, bool inclusive) {
  return std::isfinite(v) && (inclusive ? v >= low : v > low);
}

result<void> check_policy(const participant_policy& p, std::string_view where) {
  auto bad = [&](std::string_view field, std::string_view rule) {
    return unexpected(errc::bad_request,
                      fmt::format("{}.{} must be a finite number {}", where, field, rule));
  };
  if (!finite_at_least(p.rate.per_s, 0, false)) return bad("rate.per_s", "above 0");
  if (!finite_at_least(p.rate.burst, 1, true)) return bad("rate.burst", "of at least 1");
  if (!finite_at_least(p.rate.bytes_per_s, 0, false)) return bad("rate.bytes_per_s", "above 0");
  if (p.rate.bytes_burst && !finite_at_least(*p.rate.bytes_burst, 1, true)) {
    return bad("rate.bytes_burst", "of at least 1");
  }
  if (!finite_at_least(p.ops.per_s, 0, false)) return bad("ops.per_s", "above 0");
  if (!finite_at_least(p.ops.burst, registry_op_cost, true)) {
    return bad("ops.burst", fmt::format("of at least {}", registry_op_cost));
  }
  if (p.budget.per_day && *p.budget.per_day < 0) {
    return unexpected(errc::bad_request,
                      fmt::format("{}.budget.per_day must be null or at least 0, not {}", where,
                                  *p.budget.per_day));
  }
  return {};
}

// The stored count; nullopt when the value is not one.
std::optional<std::int64_t> parse_count(std::string_view s) {
  std::int64_t n = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc{} || p != s.data() + s.size() || n < 0) return std::nullopt;
  return n;
}

struct rate_bucket {
  const participant_policy* policy = nullptr;
  double messages = 0;
  double bytes = 0;
  time_point at{};
};

// A participant's bucket of `ops_policy` tokens.
struct ops_bucket {
  const ops_policy* policy = nullptr;
  double tokens = 0;
  time_point at{};

  double level_at(time_point now) const {
    if (now <= at) return tokens;
    const double s = std::chrono::duration<double>(now - at).count();
    return std::min(policy->burst, tokens + s * policy->per_s);
  }
};

// The levels of `b` at `now` (no refill when the clock went back).
std::pair<double, double> levels_at(const rate_bucket& b, time_point now) {
  const auto& r = b.policy->rate;
  if (now <= b.at) return {b.messages, b.bytes};
  double s = std::chrono::duration<double>(now - b.at).count();
  return {std::min(r.burst, b.messages + s * r.per_s),
          std::min(r.bytes_capacity(), b.bytes + s * r.bytes_per_s)};
}

bool full_at(const rate_bucket& b, time_point now) {
  auto [m, by] = levels_at(b, now);
  return m >= b.policy->rate.burst && by >= b.policy->rate.bytes_capacity();
}

// One (ns, participant, day) budget counter as this gateway sees it, with the requests
// waiting for it. A batch is the requests taken together into one compare-and-set.
struct counter {
  std::string key;
  namespace_name ns;
  participant_name participant;
  std::string day;
  time_point renews_at;
  std::int64_t limit = 0;

  bool busy = false;  // a caller is driving the counter (an operation may be in flight)
  time_point last_used{};

  // The stored counter as last read or written; revision 0: no live key.
  bool known = false;
  bool fresh = false;  // read or written during the current batch
  std::int64_t count = 0;
  std::uint64_t revision = 0;

  std::vector<completion<budget_spend>> spends{};
  std::vector<completion<void>> refunds{};
  std::vector<completion<budget_spend>> batch_spends{};
  std::vector<completion<void>> batch_refunds{};
  int conflicts = 0;

  // The write in flight: the new count, the count it builds on, the spends it grants.
  std::int64_t planned = 0;
  std::int64_t planned_base = 0;
  std::size_t planned_grant = 0;
};

enum class op_kind { get, create, update };

struct planned_op {
  op_kind kind = op_kind::get;
  std::string value{};
  std::uint64_t revision = 0;
};

using op_outcome = std::variant<result<kv_entry>, result<std::uint64_t>>;

}  // namespace

result<void> rate_verdict::as_result() const {
  if (allowed) return {};
  return unexpected(errc::rate_limited, message);
}

struct policy::impl : std::enable_shared_from_this<policy::impl> {
  std::shared_ptr<transport> t;
  std::shared_ptr<amp::clock> clock;
  policy_config config;
  std::string bucket = subjects::budget_bucket();

  mutable std::mutex rate_mu;
  std::unordered_map<std::string, rate_bucket> buckets;
  std::unordered_map<std::string, ops_bucket> ops_buckets;
  time_point rate_swept{};

  std::mutex budget_mu;
  std::unordered_map<std::string, std::shared_ptr<counter>> counters;
  time_point budget_swept{};

  const participant_policy& policy_of(const participant_name& p) const {
    auto it = config.participants.find(p.view());
    return it == config.participants.end() ? config.default_policy : it->second;
  }

  // ----- rate ---------------------------------------------------------------------

  rate_verdict take_rate(const namespace_name& ns, const participant_name& p,
                         std::size_t body_bytes) {
    auto now = clock->now();
    std::lock_guard lock(rate_mu);
    if (now - rate_swept >= k_sweep_period || now < rate_swept) {
      sweep(now);
    }
    std::string key = fmt::format("{}.{}", ns.view(), p.view());
    auto it = buckets.find(key);
    if (it == buckets.end()) {
      const auto& pol = policy_of(p);
      it = buckets
               .emplace(std::move(key), rate_bucket{.policy = &pol,
                                                    .messages = pol.rate.burst,
                                                    .bytes = pol.rate.bytes_capacity(),
                                                    .at = now})
               .first;
    }
    auto& b = it->second;
    const auto& r = b.policy->rate;
    std::tie(b.messages, b.bytes) = levels_at(b, now);
    b.at = now;

    double cost = static_cast<double>(body_bytes);
    double need = std::min(cost, r.bytes_capacity());
    double wait_messages = std::max(0.0, (1.0 - b.messages) / r.per_s);
    double wait_bytes = std::max(0.0, (need - b.bytes) / r.bytes_per_s);
    if (wait_messages <= k_slack_s && wait_bytes <= k_slack_s) {
      b.messages -= 1;
      b.bytes -= cost;
      return {};
    }
    double wait = std::max(wait_messages, wait_bytes);
    auto ms = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(std::ceil((wait - k_slack_s) * 1000.0)));
    rate_verdict v{.allowed = false, .retry_after = std::chrono::milliseconds(ms)};
    if (wait_messages >= wait_bytes) {
      v.message = fmt::format(
          "participant {} is over its rate of {} messages per second (burst {}); retry after {} "
          "ms",
          amp::quoted(p.view()), r.per_s, r.burst, ms);
    } else {
      v.message = fmt::format(
          "participant {} is over its rate of {} body bytes per second ({} bytes now); retry "
          "after {} ms",
          amp::quoted(p.view()), r.bytes_per_s, body_bytes, ms);
    }
    return v;
  }

  // Full buckets hold nothing a new one would not: dropped (under rate_mu).
  void sweep(time_point now) {
    std::erase_if(buckets, [&](const auto& kv) { return full_at(kv.second, now); });
    std::erase_if(ops_buckets, [&](const auto& kv) {
      return kv.second.level_at(now) >= kv.second.policy->burst;
    });
    rate_swept = now;
  }

  rate_verdict take_ops(const namespace_name& ns, const participant_name& p, double tokens) {
    auto now = clock->now();
    std::lock_guard lock(rate_mu);
    if (now - rate_swept >= k_sweep_period || now < rate_swept) sweep(now);
    std::string key = fmt::format("{}.{}", ns.view(), p.view());
    auto it = ops_buckets.find(key);
    if (it == ops_buckets.end()) {
      const auto& pol = policy_of(p).ops;
      it = ops_buckets.emplace(std::move(key), ops_bucket{&pol, pol.burst, now}).first;
    }
    auto& b = it->second;
    b.tokens = b.level_at(now);
    b.at = now;
    const double wait = std::max(0.0, (tokens - b.tokens) / b.policy->per_s);
    if (wait <= k_slack_s) {
      b.tokens -= tokens;
      return {};
    }
    auto ms = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(std::ceil((wait - k_slack_s) * 1000.0)));
    return {.allowed = false,
            .retry_after = std::chrono::milliseconds(ms),
            .message = fmt::format(
                "participant {} is over its rate of {} op tokens per second (burst {}; this op "
                "takes {}); retry after {} ms",
                amp::quoted(p.view()), b.policy->per_s, b.policy->burst, tokens, ms)};
  }

  std::size_t held_rate_buckets() const {
    std::lock_guard lock(rate_mu);
    return buckets.size() + ops_buckets.size();
  }

  // ----- budget -------------------------------------------------------------------

  static std::string exhausted_message(const namespace_name& ns, const participant_name& p,
                                       std::int64_t limit, std::string_view day,
                                       time_point renews_at) {
    return fmt::format(
        "participant {} in namespace {} has spent its budget of {} requests for {}; it renews "
        "at {}",
        amp::quoted(p.view()), amp::quoted(ns.view()), limit, day, format_timestamp(renews_at));
  }
  static std::string exhausted_message(const counter& c) {
    return exhausted_message(c.ns, c.participant, c.limit, c.day, c.renews_at);
  }

  // The counter of `key`, made when missing (caller holds budget_mu).
  std::shared_ptr<counter> counter_for(const namespace_name& ns, const participant_name& p,
                                       std::string_view day, time_point renews_at,
                                       std::int64_t limit, time_point now) {
    if (now - budget_swept >= k_sweep_period || now < budget_swept) {
      auto today = day_of(now).name;
      std::erase_if(counters, [&](const auto& kv) {
        const auto& c = *kv.second;
        return !c.busy && (c.day != today || now - c.last_used >= k_counter_idle);
      });
      budget_swept = now;
    }
    auto key = subjects::budget_key(ns, p, day);
    auto& slot = counters[key];
    if (!slot) {
      slot = std::make_shared<counter>(counter{.key = key,
                                               .ns = ns,
                                               .participant = p,
                                               .day = std::string(day),
                                               .renews_at = renews_at,
                                               .limit = limit});
    }
    slot->last_used = now;
    return slot;
  }

  void async_spend(const namespace_name& ns, const participant_name& p,
                   completion<budget_spend> done) {
    const auto& pol = policy_of(p);
    if (!pol.budget.per_day) return done(budget_spend{.ns = ns, .participant = p});
    auto now = clock->now();
    auto day = day_of(now);
    auto renews_at = day.start + std::chrono::days(1);
    if (*pol.budget.per_day == 0) {
      // Nothing can ever be granted: no need to ask the backend.
      return done(
          unexpected(errc::budget_exhausted, exhausted_message(ns, p, 0, day.name, renews_at)));
    }
    std::shared_ptr<counter> c;
    {
      std::lock_guard lock(budget_mu);
      c = counter_for(ns, p, day.name, renews_at, *pol.budget.per_day, now);
      c->spends.push_back(std::move(done));
      if (c->busy) return;
      c->busy = true;
    }
    drive(c);
  }

  void async_refund(const budget_spend& spend, completion<void> done) {
    if (!spend.counted()) return done({});
    auto start = day_start(spend.day);
    if (!start) {
      return done(unexpected(errc::bad_request,
                             fmt::format("not a day of a budget: {}", amp::quoted(spend.day))));
    }
    const auto& pol = policy_of(spend.participant);
    std::shared_ptr<counter> c;
    {
      std::lock_guard lock(budget_mu);
      c = counter_for(spend.ns, spend.participant, spend.day, *start + std::chrono::days(1),
                      pol.budget.per_day.value_or(0), clock->now());
      c->refunds.push_back(std::move(done));
      if (c->busy) return;
      c->busy = true;
    }
    drive(c);
  }

  // Runs the counter's batches until none is waiting. The caller set `busy`; whoever
  // drives is the only one to change the stored counter from this gateway. Operations
  // that complete before they return are handled in this loop, not by recursion.
  void drive(const std::shared_ptr<counter>& c) {
    struct early_catch {
      std::mutex mu;
      bool returned = false;
      std::optional<op_outcome> outcome;
    };
    auto op = plan(c);
    while (op) {
      auto catcher = std::make_shared<early_catch>();
      auto on_done = [self = shared_from_this(), c, catcher](op_outcome o) {
        {
          std::lock_guard lock(catcher->mu);
          if (!catcher->returned) {
            catcher->outcome = std::move(o);
            return;
          }
        }
        self->finish(c, std::move(o));
        self->drive(c);
      };
      issue(c, std::move(*op), std::move(on_done));
      std::optional<op_outcome> early;
      {
        std::lock_guard lock(catcher->mu);
        catcher->returned = true;
        early = std::move(catcher->outcome);
      }
      if (!early) return;  // the completion drives on
      finish(c, std::move(*early));
      op = plan(c);
    }
  }

  void issue(const std::shared_ptr<counter>& c, planned_op op,
             std::function<void(op_outcome)> on_done) {
    switch (op.kind) {
      case op_kind::get:
        return t->async_kv_get(bucket, c->key, [on_done](result<kv_entry> r) {
          on_done(op_outcome(std::in_place_index<0>, std::move(r)));
        });
      case op_kind::create:
        return t->async_kv_create(bucket, c->key, std::move(op.value), std::nullopt,
                                  [on_done](result<std::uint64_t> r) {
                                    on_done(op_outcome(std::in_place_index<1>, std::move(r)));
                                  });
      case op_kind::update:
        return t->async_kv_update(bucket, c->key, std::move(op.value), op.revision, std::nullopt,
                                  [on_done](result<std::uint64_t> r) {
                                    on_done(op_outcome(std::in_place_index<1>, std::move(r)));
                                  });
    }
  }

  // Ends the current batch: the first `granted` spends get their unit (the count after
  // them built on `base`), the other spends `budget_exhausted`, every refund succeeds.
  // With `failure`, every request of the batch gets it instead. Caller holds budget_mu;
  // the completions are returned to be run without it.
  std::vector<std::function<void()>> end_batch(counter& c, std::size_t granted, std::int64_t base,
                                               const std::optional<error>& failure) {
    std::vector<std::function<void()>> calls;
    calls.reserve(c.batch_spends.size() + c.batch_refunds.size());
    for (std::size_t i = 0; i < c.batch_spends.size(); ++i) {
      auto& done = c.batch_spends[i];
      if (failure) {
        calls.emplace_back([done = std::move(done), e = *failure] { done(e); });
      } else if (i < granted) {
        budget_spend s{.ns = c.ns,
                       .participant = c.participant,
                       .day = c.day,
                       .remaining = std::max<std::int64_t>(
                           0, c.limit - (base + static_cast<std::int64_t>(i) + 1))};
        calls.emplace_back(
            [done = std::move(done), s = std::move(s)]() mutable { done(std::move(s)); });
      } else {
        calls.emplace_back([done = std::move(done), m = exhausted_message(c)] {
          done(unexpected(errc::budget_exhausted, m));
        });
      }
    }
    for (auto& done : c.batch_refunds) {
      if (failure) {
        calls.emplace_back([done = std::move(done), e = *failure] { done(e); });
      } else {
        calls.emplace_back([done = std::move(done)] { done({}); });
      }
    }
    c.batch_spends.clear();
    c.batch_refunds.clear();
    return calls;
  }

  // The next operation of the counter, taking the next batch when the current one is
  // done; nullopt (and `busy` cleared) when nothing is waiting.
  std::optional<planned_op> plan(const std::shared_ptr<counter>& cp) {
    auto& c = *cp;
    for (;;) {
      std::vector<std::function<void()>> calls;
      std::optional<planned_op> op;
      {
        std::lock_guard lock(budget_mu);
        if (c.batch_spends.empty() && c.batch_refunds.empty()) {
          if (c.spends.empty() && c.refunds.empty()) {
            c.busy = false;
            c.last_used = clock->now();
            return std::nullopt;
          }
          std::swap(c.batch_spends, c.spends);
          std::swap(c.batch_refunds, c.refunds);
          c.conflicts = 0;
          c.fresh = false;
        }
        if (!c.known) {
          op = planned_op{.kind = op_kind::get};
        } else {
          auto refunds = static_cast<std::int64_t>(c.batch_refunds.size());
          auto base = std::max<std::int64_t>(0, c.count - refunds);
          auto room = std::max<std::int64_t>(0, c.limit - base);
          auto grant = std::min<std::size_t>(c.batch_spends.size(), static_cast<std::size_t>(room));
          auto next = base + static_cast<std::int64_t>(grant);
          if (next == c.count) {
            if (!c.fresh && !c.batch_spends.empty()) {
              // Spent by what we saw last; read again, another gateway may have refunded.
              op = planned_op{.kind = op_kind::get};
            } else {
              calls = end_batch(c, grant, base, std::nullopt);
            }
          } else {
            c.planned = next;
            c.planned_base = base;
            c.planned_grant = grant;
            op = planned_op{.kind = c.revision == 0 ? op_kind::create : op_kind::update,
                            .value = std::to_string(next),
                            .revision = c.revision};
          }
        }
      }
      for (auto& call : calls) call();
      if (op) return op;
    }
  }

  // Applies the outcome of the operation in flight.
  void finish(const std::shared_ptr<counter>& cp, op_outcome o) {
    auto& c = *cp;
    std::vector<std::function<void()>> calls;
    {
      std::lock_guard lock(budget_mu);
      auto fail = [&](error e) {
        c.known = false;
        calls = end_batch(c, 0, 0, std::move(e));
      };
      if (o.index() == 0) {
        auto& got = std::get<0>(o);
        if (got) {
          auto n = parse_count(got->value);
          if (!n) {
            fail(error(errc::internal, fmt::format("budget counter {} holds {}, not a count",
                                                   amp::quoted(c.key), amp::quoted(got->value))));
          } else {
            c.known = c.fresh = true;
            c.count = *n;
            c.revision = got->revision;
          }
        } else if (got.error().code() == errc::not_found) {
          c.known = c.fresh = true;
          c.count = 0;
          c.revision = 0;
        } else {
          fail(std::move(got).error());
        }
      } else {
        auto& wrote = std::get<1>(o);
        if (wrote) {
          c.known = c.fresh = true;
          c.count = c.planned;
          c.revision = *wrote;
          calls = end_batch(c, c.planned_grant, c.planned_base, std::nullopt);
        } else if (wrote.error().code() == errc::conflict) {
          c.known = false;
          if (++c.conflicts >= k_cas_attempts) {
            fail(error(errc::unavailable,
                       fmt::format("budget counter {} kept changing under other gateways; "
                                   "nothing was counted",
                                   amp::quoted(c.key))));
          }
        } else {
          fail(std::move(wrote).error());
        }
      }
    }
    for (auto& call : calls) call();
  }
};

result<std::shared_ptr<policy>> policy::open(std::shared_ptr<transport> t, policy_config config) {
  if (!t) return unexpected(errc::bad_request, "policy needs a transport");
  if (auto r = check_policy(config.default_policy, "policy.default"); !r) {
    return std::move(r).error();
  }
  bool budgets = config.default_policy.budget.per_day.has_value();
  for (const auto& [name, p] : config.participants) {
    if (auto n = participant_name::make(name); !n) {
      return unexpected(errc::invalid_name,
                        "policy.participants: " + std::move(n).error().message());
    }
    if (auto r = check_policy(p, "policy.participants." + name); !r) return std::move(r).error();
    budgets = budgets || p.budget.per_day.has_value();
  }
  if (config.replicas < 1) {
    return unexpected(errc::bad_request, "policy: replicas must be at least 1");
  }
  auto p = std::make_shared<impl>();
  if (budgets) {
    kv_config kc{.bucket = p->bucket,
                 .history = 1,
                 .ttl = k_budget_age,
                 .storage = config.storage,
                 .replicas = config.replicas};
    if (auto r = t->ensure_bucket(kc); !r) return std::move(r).error();
  }
  p->clock = t->clock();
  p->t = std::move(t);
  p->config = std::move(config);
  return std::shared_ptr<policy>(new policy(std::move(p)));
}

policy::policy(std::shared_ptr<impl> p) : impl_(std::move(p)) {}
policy::~policy() = default;

const participant_policy& policy::policy_of(const participant_name& participant) const {
  return impl_->policy_of(participant);
}

rate_verdict policy::take_rate(const namespace_name& ns, const participant_name& participant,
                               std::size_t body_bytes) {
  return impl_->take_rate(ns, participant, body_bytes);
}

rate_verdict policy::take_ops(const namespace_name& ns, const participant_name& participant,
                              double tokens) {
  return impl_->take_ops(ns, participant, tokens);
}

void policy::async_spend_budget(const namespace_name& ns, const participant_name& participant,
                                completion<budget_spend> done) {
  impl_->async_spend(ns, participant, std::move(done));
}

result<budget_spend> policy::spend_budget(const namespace_name& ns,
                                          const participant_name& participant) {
  return detail::wait_for<budget_spend>(
      [&](auto h) { impl_->async_spend(ns, participant, std::move(h)); });
}

void policy::async_refund_budget(const budget_spend& spend, completion<void> done) {
  impl_->async_refund(spend, std::move(done));
}

result<void> policy::refund_budget(const budget_spend& spend) {
  return detail::wait_for<void>([&](auto h) { impl_->async_refund(spend, std::move(h)); });
}

std::size_t policy::held_rate_buckets() const {
  return impl_->held_rate_buckets();
}

}  // namespace amp
