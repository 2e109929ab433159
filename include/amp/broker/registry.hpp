#pragma once

/// \file
/// The presence registry of one namespace (spec §4): one KV key per participant in
/// bucket `AMP_REGISTRY_<ns>` (`subjects::registry_bucket`, `subjects::registry_key`).
/// A participant registers the jobs it works on, its slots and free-form metadata;
/// heartbeats refresh the entry; an entry not refreshed within `registry_ttl` expires.
/// Watchers see a participant go `up` when it registers (again) and `down` exactly once
/// when it expires or leaves; a refresh is not an event.
///
/// Every change is a compare-and-set on the revision that was read (or, for a heartbeat,
/// the one this registry object last wrote or saw), so a heartbeat never revives an entry
/// that expired or left meanwhile, and an expiry is recorded exactly once however many
/// registries (gateways) share the bucket:
/// - with per-key TTL (`transport::caps().per_key_ttl`, unless
///   `broker_config::registry_force_sweeper`), each write carries the TTL and the backend
///   removes the entry when it runs out;
/// - otherwise each registry runs a sweeper (timers on the transport's clock, the work on
///   the configured executor) that replaces an entry whose `expires_at` has passed by a
///   tombstone marked expired, on the entry's revision: of several sweepers exactly one
///   succeeds. Tombstones carry the last entry (so a down event shows it) and are removed
///   by the bucket's age limit (`registry_tombstone_age`).
///
/// Whichever registry call meets an entry past its `expires_at` first (a sweeper, a
/// heartbeat, a registration or a leave) records the expiry the same way; reads (`get`,
/// `live`, `eligible`, `watch`) never report such an entry as live.
///
/// Expiry compares `expires_at` (written by the registering process's clock) with the
/// clock of the process that checks: gateways are expected to keep their clocks in sync
/// (NTP) to well within `registry_ttl`.

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "amp/broker/config.hpp"
#include "amp/clock.hpp"
#include "amp/names.hpp"
#include "amp/result.hpp"
#include "amp/transport/transport.hpp"

namespace amp {

/// The most slots a participant may register (spec §4).
inline constexpr int max_registry_slots = 1024;

/// The longest `broker_config::registry_ttl` a registry accepts.
inline constexpr duration max_registry_ttl = std::chrono::hours(12);

/// How long the sweeper's tombstones are kept: the registry bucket's age limit. A live
/// entry is rewritten at least once per `registry_ttl`, so only tombstones (and entries
/// that expired while no registry was running) ever reach it.
inline constexpr duration registry_tombstone_age = std::chrono::hours(24);

/// A participant's registry entry, as `who` and `presence` show it (spec §4).
struct registry_entry {
  participant_name participant;
  std::vector<job_name> jobs{};  ///< the jobs it works on, without duplicates, in given order
  int slots = 1;                 ///< 0..1024; 0: registered, but gets no offers
  /// The leases it holds, as last reported: the sum of what each registry object (each
  /// gateway, through which some of them are held) last said.
  int load = 0;
  std::string meta = "{}";  ///< a JSON object, serialized (minified)
  time_point updated_at{};  ///< last registration or refresh (millisecond precision)
  time_point expires_at{};  ///< `updated_at + registry_ttl`

  friend bool operator==(const registry_entry&, const registry_entry&) = default;
};

/// The entry as the spec's JSON object: `{"participant","jobs","slots","load","meta",
/// "updated_at","expires_at"}`, timestamps in RFC 3339 with milliseconds.
std::string to_json(const registry_entry& e);

/// Whether a participant is present.
enum class presence_state { up, down };

/// Why it changed: `registered` (up), `expired` or `left` (down).
enum class presence_reason { registered, expired, left };

/// `up`, `down` (the wire names).
std::string_view to_string(presence_state s) noexcept;
/// `registered`, `expired`, `left` (the wire names).
std::string_view to_string(presence_reason r) noexcept;

/// A change a watcher sees (spec §4 `presence`).
struct presence_event {
  participant_name participant;
  presence_state state = presence_state::up;
  presence_reason reason = presence_reason::registered;
  /// The entry as registered (up), or as it was last before it went (down).
  registry_entry entry;
};

/// The registry of one namespace. Create it with `open`; share it freely.
///
/// Threads: every member function is thread-safe and blocks on the backend; do not call
/// one from a transport callback or a `watch` callback (on JetStream the answer could be
/// due on the very thread that waits). Several registries, in one process or in several,
/// may share a namespace.
///
/// Errors common to all calls: `unavailable` when the backend cannot be reached (nothing
/// was changed, or the change is safe to repeat), `internal` for an unexpected answer.
class registry {
 public:
  /// Ensures the bucket (history 1, age limit `registry_tombstone_age`,
  /// `config.storage`, `config.replicas`) and, where the sweeper is used, starts it: an
  /// internal watch of the bucket and a timer on the transport's clock, whose work runs
  /// on `config.run` (or on a pool of `config.workers` threads).
  /// Errors: `bad_request` when `config.registry_ttl` is not within (0, 12 h]; `conflict`
  /// when the bucket exists with another configuration; `unavailable`.
  static result<std::shared_ptr<registry>> open(std::shared_ptr<transport> t,
                                                const broker_config& config);

  /// Stops the sweeper and the internal watch. Watches made by `watch` go on until their
  /// subscription is destroyed.
  ~registry();
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;

  /// Registers `participant`, replacing any entry it has (watchers see it `up`,
  /// `registered`, also when it was up already). Duplicate jobs are dropped. `meta_json`
  /// is stored minified. `load` is the leases held through this registry object (the
  /// other objects' counts are dropped with the entry it replaces). Returns the entry as
  /// stored (`expires_at = now + registry_ttl`).
  /// Errors: `bad_request` when `slots` is outside 0..1024, `load` is negative, or
  /// `meta_json` is not a JSON object (nothing is changed); `conflict` when the entry
  /// kept changing under concurrent writers through every retry.
  result<registry_entry> register_participant(const participant_name& participant,
                                              std::vector<job_name> jobs, int slots,
                                              std::string_view meta_json, int load = 0);

  /// Refreshes the participant's entry (`updated_at = now`, `expires_at = now +
  /// registry_ttl`), and, when `load` is given, sets the leases held through this registry
  /// object: the entry's load is then the sum of what every registry object (every gateway)
  /// last said. No event for watchers.
  /// Cost: one compare-and-set write when the entry is as this registry object last wrote
  /// it (or, with the sweeper, last saw it) and has not run out by the clock; otherwise,
  /// or when that write finds the entry changed, a read and a write.
  /// Returns the refreshed entry.
  /// Errors: `not_found` when it has no live entry (never registered, left, or expired:
  /// the caller registers again); `bad_request` for a negative `load`; `conflict` when
  /// the entry kept changing through every retry.
  result<registry_entry> heartbeat(const participant_name& participant,
                                   std::optional<int> load = std::nullopt);

  /// `heartbeat` without blocking the caller: when the entry is as this registry object
  /// last wrote or saw it and has not run out by the clock, its one compare-and-set is sent
  /// at once and `done` runs on the transport's thread that has the answer (on the memory
  /// transport, on this thread before the call returns); otherwise, or when that write finds
  /// the entry changed, `heartbeat` runs on the registry's executor (`broker_config::run`)
  /// and `done` there. Results and errors are `heartbeat`'s. `done` must not block.
  void async_heartbeat(const participant_name& participant, std::optional<int> load,
                       completion<registry_entry> done);

  /// Removes the participant's entry (spec `bye`): watchers see it `down`, `left` (or
  /// `expired` if it had run out before it left). Succeeds when there is no live entry
  /// (nothing to remove, no event).
  result<void> leave(const participant_name& participant);

  /// The participant's live entry, or `std::nullopt` when it has none.
  result<std::optional<registry_entry>> get(const participant_name& participant);

  /// Every live entry, sorted by participant; with `job`, only those that list it
  /// (spec `who`). Never includes an entry whose `expires_at` has passed. Reads the
  /// latest value of every key of the bucket (one short-lived watch); `unavailable` also
  /// when that does not complete within 10 s.
  result<std::vector<registry_entry>> live(const std::optional<job_name>& job = std::nullopt);

  /// The participants that may get an offer of `job`: live, listing `job`, with
  /// `load < slots` (so never one with 0 slots); the least loaded (`load / slots`) first,
  /// ties by participant name.
  result<std::vector<registry_entry>> eligible(const job_name& job);

  /// Watches presence. `*now` (when given) receives the live entries at the start,
  /// sorted by participant; `on_event` then gets every change after that: `up` per
  /// registration, one `down` per expiry or leave of an entry that was up. A watcher that
  /// falls behind on JetStream may miss an intermediate change; it always ends with the
  /// latest state (a missed registration shows as `up` at the next heartbeat).
  ///
  /// Thread: `on_event` runs on the transport's watch thread (the memory transport: the
  /// thread whose write or clock advance caused the change), one call at a time, in
  /// order; it may start before `watch` returns. It must not block for long nor call the
  /// registry's blocking functions; hand such work to another thread. Destroying or
  /// stopping the returned subscription stops the events (see `subscription::stop`).
  /// Errors: `bad_request` for an empty `on_event`; `unavailable` also when the initial
  /// entries did not arrive within 10 s.
  result<std::unique_ptr<subscription>> watch(std::function<void(const presence_event&)> on_event,
                                              std::vector<registry_entry>* now = nullptr);

  /// Whether this registry runs the sweeper (else the backend's per-key TTL expires
  /// entries).
  bool uses_sweeper() const noexcept;

 private:
  struct impl;
  explicit registry(std::shared_ptr<impl> p);

  std::shared_ptr<impl> impl_;
};

}  // namespace amp
