// The SQLite target: WAL mode, synchronous=FULL (a commit is on disk when it returns), one
// transaction per batch; a key already stored is looked at and resolved row by row.

#include <fmt/format.h>
#include <sqlite3.h>

#include <utility>

#include "sink/targets.hpp"

namespace amp::sink::detail {
namespace {

constexpr std::string_view k_columns[] = {"key",   "stream", "seq",     "subject",
                                          "topic", "msg_id", "sender",  "type",
                                          "ts",    "body",   "headers", "committed_at"};

struct db_closer {
  void operator()(sqlite3* db) const noexcept { sqlite3_close_v2(db); }
};
struct stmt_closer {
  void operator()(sqlite3_stmt* s) const noexcept { sqlite3_finalize(s); }
};
using db_ptr = std::unique_ptr<sqlite3, db_closer>;
using stmt_ptr = std::unique_ptr<sqlite3_stmt, stmt_closer>;

// Errors that may pass (busy, full, I/O, no memory…); the others are about the row.
bool transient(int code) {
  switch (code & 0xff) {
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
    case SQLITE_TOOBIG:
    case SQLITE_RANGE: return false;
    default: return true;
  }
}

class sqlite_target final : public target {
 public:
  explicit sqlite_target(target_config c) : config_(std::move(c)) {}

  std::string describe() const override {
    return fmt::format("sqlite {}:{}", config_.path, config_.table);
  }

  result<void> open() override {
    close();
    sqlite3* raw = nullptr;
    const int rc =
        sqlite3_open_v2(config_.path.c_str(), &raw,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
    db_ptr db(raw);
    if (rc != SQLITE_OK) {
      return away(fmt::format("{}: cannot open: {}", describe(),
                              raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
    }
    db_ = std::move(db);
    sqlite3_busy_timeout(db_.get(), 5000);
    const auto t = config_.table;
    const auto setup = fmt::format(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
        "CREATE TABLE IF NOT EXISTS \"{}\" (key TEXT PRIMARY KEY NOT NULL, stream TEXT NOT NULL, "
        "seq INTEGER NOT NULL, subject TEXT NOT NULL, topic TEXT, msg_id TEXT NOT NULL, "
        "sender TEXT NOT NULL, type TEXT, ts TEXT NOT NULL, body TEXT NOT NULL, "
        "headers TEXT NOT NULL, committed_at TEXT NOT NULL)",
        t);
    if (auto r = exec(setup); !r) return fail_open(r.error().message());
    if (auto r = check_columns(); !r) {
      close();
      return r.error();
    }
    const auto names = fmt::format("{}", fmt::join(k_columns, ", "));
    insert_ = prepare(fmt::format(
        "INSERT INTO \"{}\" ({}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) "
        "ON CONFLICT(key) DO NOTHING",
        t, names));
    replace_ = prepare(fmt::format(
        "UPDATE \"{}\" SET stream = ?2, seq = ?3, subject = ?4, topic = ?5, msg_id = ?6, "
        "sender = ?7, type = ?8, ts = ?9, body = ?10, headers = ?11, committed_at = ?12 "
        "WHERE key = ?1",
        t));
    origin_ = prepare(fmt::format("SELECT stream, seq FROM \"{}\" WHERE key = ?1", t));
    if (!insert_ || !replace_ || !origin_) return fail_open(sqlite3_errmsg(db_.get()));
    return {};
  }

  result<batch_result> write(std::span<const row> rows, duplicate_mode mode) override {
    if (!db_) {
      if (auto r = open(); !r) return r.error();
    }
    batch_result out;
    out.outcomes.reserve(rows.size());
    out.reasons.resize(rows.size());
    if (auto r = exec("BEGIN IMMEDIATE"); !r) return failed(r.error().message());
    const auto committed_at = committed_now();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      bind(insert_.get(), r, committed_at);
      int rc = step(insert_.get());
      if (rc != SQLITE_DONE) {
        if (transient(rc)) return rolled_back();
        out.outcomes.push_back(row_outcome::refused);
        out.reasons[i] = sqlite3_errmsg(db_.get());
        continue;
      }
      if (sqlite3_changes(db_.get()) == 1) {
        out.outcomes.push_back(row_outcome::written);
        continue;
      }
      sqlite3_bind_text(origin_.get(), 1, r.key.data(), static_cast<int>(r.key.size()),
                        SQLITE_STATIC);
      rc = sqlite3_step(origin_.get());
      bool same = false;
      if (rc == SQLITE_ROW) {
        const auto* stream = reinterpret_cast<const char*>(sqlite3_column_text(origin_.get(), 0));
        same = stream && r.stream == stream &&
               static_cast<std::uint64_t>(sqlite3_column_int64(origin_.get(), 1)) == r.seq;
      }
      sqlite3_reset(origin_.get());
      if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rolled_back();
      if (same) {
        out.outcomes.push_back(row_outcome::same);
      } else if (mode == duplicate_mode::skip) {
        out.outcomes.push_back(row_outcome::skipped);
      } else if (mode == duplicate_mode::fail) {
        out.outcomes.push_back(row_outcome::duplicate);
      } else {
        bind(replace_.get(), r, committed_at);
        rc = step(replace_.get());
        if (rc != SQLITE_DONE) {
          if (transient(rc)) return rolled_back();
          out.outcomes.push_back(row_outcome::refused);
          out.reasons[i] = sqlite3_errmsg(db_.get());
          continue;
        }
        out.outcomes.push_back(row_outcome::replaced);
      }
    }
    if (auto r = exec("COMMIT"); !r) {
      (void)exec("ROLLBACK");
      return failed(r.error().message());
    }
    return out;
  }

 private:
  result<void> check_columns() {
    auto info = prepare(fmt::format("PRAGMA table_info(\"{}\")", config_.table));
    if (!info) return away(sqlite3_errmsg(db_.get()));
    std::vector<std::string> have;
    while (sqlite3_step(info.get()) == SQLITE_ROW) {
      have.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(info.get(), 1)));
    }
    for (auto c : k_columns) {
      if (std::find(have.begin(), have.end(), c) == have.end()) {
        return unexpected(errc::bad_request,
                          fmt::format("{}: the table has no column \"{}\" (a table of another "
                                      "program? name another table)",
                                      describe(), c));
      }
    }
    return {};
  }

  unexpected fail_open(std::string message) {
    close();
    return away(fmt::format("{}: {}", describe(), message));
  }

  unexpected rolled_back() {
    auto message = fmt::format("{}: {}", describe(), sqlite3_errmsg(db_.get()));
    (void)exec("ROLLBACK");
    return failed(std::move(message));
  }

  unexpected failed(std::string message) {
    close();
    return away(std::move(message));
  }

  void close() {
    insert_.reset();
    replace_.reset();
    origin_.reset();
    db_.reset();
  }

  result<void> exec(const std::string& sql) {
    char* error = nullptr;
    if (sqlite3_exec(db_.get(), sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
      std::string message = error ? error : sqlite3_errmsg(db_.get());
      sqlite3_free(error);
      return away(message);
    }
    return {};
  }

  stmt_ptr prepare(const std::string& sql) {
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(db_.get(), sql.c_str(), static_cast<int>(sql.size()), &s, nullptr);
    return stmt_ptr(s);
  }

  static void text(sqlite3_stmt* s, int i, std::string_view v) {
    sqlite3_bind_text(s, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
  }

  static void bind(sqlite3_stmt* s, const row& r, const std::string& committed_at) {
    text(s, 1, r.key);
    text(s, 2, r.stream);
    sqlite3_bind_int64(s, 3, static_cast<sqlite3_int64>(r.seq));
    text(s, 4, r.subject);
    r.topic ? text(s, 5, *r.topic) : (void)sqlite3_bind_null(s, 5);
    text(s, 6, r.msg_id);
    text(s, 7, r.sender);
    r.type.empty() ? (void)sqlite3_bind_null(s, 8) : text(s, 8, r.type);
    text(s, 9, r.ts);
    text(s, 10, r.body);
    text(s, 11, r.headers);
    text(s, 12, committed_at);
  }

  static int step(sqlite3_stmt* s) {
    const int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc;
  }

  target_config config_;
  db_ptr db_;
  stmt_ptr insert_;
  stmt_ptr replace_;
  stmt_ptr origin_;
};

}  // namespace

std::unique_ptr<target> make_sqlite_target(const target_config& config) {
  return std::make_unique<sqlite_target>(config);
}

}  // namespace amp::sink::detail
