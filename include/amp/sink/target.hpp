#pragma once

/// \file
/// Targets: where a sink commits its batches. A target writes a batch of rows in one
/// transaction (SQL) or one flushed directory (files), resolves duplicates by key as the
/// sink's `on_duplicate` asks, and reports per row what happened. Three are built in
/// (`make_target`: SQLite, PostgreSQL, files); a service may write its own by deriving from
/// `target`.
///
/// Threads: a target is used by one thread at a time (the sink's); distinct targets are
/// independent.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "amp/result.hpp"
#include "amp/sink/config.hpp"

namespace amp::sink {

/// One message as every target stores it (the spec's columns but `committed_at`, which
/// the target stamps).
struct row {
  std::string key;                   ///< the idempotency key (primary key)
  std::string stream;                ///< the consumed stream
  std::uint64_t seq = 0;             ///< its sequence there
  std::string subject;               ///< the NATS subject
  std::optional<std::string> topic;  ///< the topic; none for tasks
  std::string msg_id;                ///< the envelope's id (the task id for tasks)
  std::string sender;                ///< `from` (the submitter for tasks)
  std::string type;                  ///< the message type; empty: none (SQL NULL)
  std::string ts;                    ///< RFC 3339, milliseconds, UTC
  std::string body;                  ///< one JSON value
  std::string headers;               ///< a JSON object (`{}` when none)
  friend bool operator==(const row&, const row&) = default;
};

/// What a target did with one row of a batch.
enum class row_outcome {
  written,    ///< stored (new key)
  same,       ///< its key was already stored by this very message (same stream and seq):
              ///< a redelivery after a commit whose ack was lost; nothing changed
  skipped,    ///< another message held the key; `skip` left it
  replaced,   ///< another message held the key; `replace` overwrote it
  duplicate,  ///< another message held the key and `on_duplicate` is `fail`: refused
  refused,    ///< the target refused the row itself (see `batch_result::reasons`)
};

/// The outcome of a committed batch: one entry per row, in order. Only rows `written` and
/// `replaced` changed the target; a `duplicate` or `refused` row is left out of the commit,
/// the rest are committed together.
struct batch_result {
  std::vector<row_outcome> outcomes;
  std::vector<std::string> reasons;  ///< per row: why it was refused (empty otherwise)
};

/// A destination.
class target {
 public:
  virtual ~target() = default;
  target(const target&) = delete;
  target& operator=(const target&) = delete;

  /// "sqlite archive.db:events", "postgres host=…:events", "file archive/": for logs.
  virtual std::string describe() const = 0;

  /// Connects (when not connected) and creates what is missing (the table, the folder).
  /// Errors: `unavailable` when the destination cannot be reached or used now (transient);
  /// `bad_request` when it can never work as configured (a table with other columns).
  virtual result<void> open() = 0;

  /// Writes `rows` (their keys distinct) in one transaction and commits it, resolving keys
  /// already stored as `mode` says. Returns once the commit is durable. Errors:
  /// `unavailable` (nothing committed: the database is down, the disk full…): try again
  /// later. Then the next call reconnects.
  virtual result<batch_result> write(std::span<const row> rows, duplicate_mode mode) = 0;

  /// Checks that an opened destination can still be used (PostgreSQL: a `SELECT 1` round
  /// trip), for an idle sink that has nothing to write but must say when a target went
  /// away. Errors: `unavailable`; the sink then calls `open` again before the next write.
  /// The default finds nothing wrong (SQLite and files: a failure shows at the next write).
  virtual result<void> probe() { return {}; }

 protected:
  target() = default;
};

/// A built-in target for `config`. Nothing is opened yet. Errors: `bad_request` for a
/// configuration the kind cannot use.
result<std::unique_ptr<target>> make_target(const target_config& config);

/// `key` made safe as a file name, deterministically and without collisions: letters,
/// digits, `-`, `_` and `.` stay (a leading `.` does not), every other byte is `%XX`; a
/// name over 200 bytes keeps its first 120 and gains `~` and the SHA-256 of the key (upper-case
/// hex). The file target names a message's file `<safe key>.json`.
std::string safe_file_name(std::string_view key);

}  // namespace amp::sink
