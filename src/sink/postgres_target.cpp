// The PostgreSQL target (libpq): one transaction per batch. The rows go in one multi-row
// INSERT … ON CONFLICT DO NOTHING RETURNING key; only the keys it did not write (stored
// already) are read back (their stream and seq) and resolved as the duplicate mode says
// (`replace`: one more INSERT … ON CONFLICT DO UPDATE). A row PostgreSQL refuses (a body
// jsonb cannot hold, such as "\u0000") fails the statement: the batch is then written again
// row by row under savepoints, so only the refused rows stay out.

#include <fmt/format.h>
#include <libpq-fe.h>

#include <map>
#include <set>
#include <utility>

#include "sink/targets.hpp"

namespace amp::sink::detail {
namespace {

constexpr std::string_view k_columns[] = {"key",    "stream", "seq", "subject", "topic",  "msg_id",
                                          "sender", "type",   "ts",  "body",    "headers"};
constexpr std::string_view k_casts[] = {"", "", "::bigint",      "",        "",       "",
                                        "", "", "::timestamptz", "::jsonb", "::jsonb"};
constexpr std::size_t k_params = std::size(k_columns);

struct conn_closer {
  void operator()(PGconn* c) const noexcept { PQfinish(c); }
};
struct result_closer {
  void operator()(PGresult* r) const noexcept { PQclear(r); }
};
using conn_ptr = std::unique_ptr<PGconn, conn_closer>;
using pg_result = std::unique_ptr<PGresult, result_closer>;

// What PostgreSQL says of a row, which the row itself causes: a data exception (22, such as
// 22P05 for a "\u0000" that jsonb cannot hold) or an integrity violation (23). Everything
// else (the connection, resources such as a full disk, a shutdown, a read-only standby, a
// table dropped or a permission revoked) is about the target, not the row: it may pass.
bool row_state(std::string_view state) {
  const auto cls = state.substr(0, 2);
  return cls == "22" || cls == "23";
}

// What an INSERT does where a key is stored already.
enum class on_conflict {
  fail,     // nothing: the statement fails with 23505 (the batch's first try: no key is
            // expected to be there, and a plain INSERT is the cheapest)
  nothing,  // the row is left out (RETURNING says which were written)
  update,   // the stored row is overwritten
};

// At most this many batch sizes have a prepared INSERT per connection (a backlog makes
// full batches, so few sizes recur).
constexpr std::size_t k_max_prepared = 16;

// At most this many rows per statement: 11 parameters each, and a statement takes 65,535.
constexpr std::size_t k_rows_per_statement = 4096;

std::string first_line(const char* message) {
  std::string_view m = message ? message : "";
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.remove_suffix(1);
  if (auto nl = m.find('\n'); nl != std::string_view::npos) m = m.substr(0, nl);
  return std::string(m);
}

// The DSN without its password (`password=…` or a URI's `user:…@`), for messages.
std::string redacted(std::string_view dsn) {
  std::string out(dsn);
  if (auto scheme = out.find("://"); scheme != std::string::npos) {
    const auto at = out.find('@', scheme);
    const auto colon = out.find(':', scheme + 3);
    if (at != std::string::npos && colon != std::string::npos && colon < at) {
      out.replace(colon + 1, at - colon - 1, "***");
    }
  }
  for (auto pos = out.find("password="); pos != std::string::npos;
       pos = out.find("password=", pos + 1)) {
    const auto start = pos + 9;
    auto end = start;
    if (end < out.size() && out[end] == '\'') {
      end = out.find('\'', end + 1);
      end = end == std::string::npos ? out.size() : end + 1;
    } else {
      end = out.find(' ', start);
      if (end == std::string::npos) end = out.size();
    }
    out.replace(start, end - start, "***");
  }
  return out;
}

class postgres_target final : public target {
 public:
  explicit postgres_target(target_config c) : config_(std::move(c)) {}

  std::string describe() const override {
    return fmt::format("postgres {}:{}", redacted(config_.dsn), config_.table);
  }

  result<void> open() override {
    conn_.reset();
    prepared_.clear();
    // Settings in the DSN win over these (later settings override earlier).
    // A connection whose peer vanished is noticed within half a minute, not the minutes of
    // TCP's retransmissions.
    const char* keys[] = {"connect_timeout",
                          "keepalives_idle",
                          "keepalives_interval",
                          "keepalives_count",
                          "tcp_user_timeout",
                          "dbname",
                          nullptr};
    const char* values[] = {"5", "10", "5", "3", "30000", config_.dsn.c_str(), nullptr};
    conn_ptr made(PQconnectdbParams(keys, values, 1));
    if (!made || PQstatus(made.get()) != CONNECTION_OK) {
      return away(fmt::format("{}: cannot connect: {}", describe(),
                              first_line(made ? PQerrorMessage(made.get()) : "out of memory")));
    }
    conn_ = std::move(made);
    // Notices ("relation … already exists, skipping") are not for the sink's log.
    PQsetNoticeProcessor(
        conn_.get(), [](void*, const char*) {}, nullptr);
    const auto create = fmt::format(
        "CREATE TABLE IF NOT EXISTS \"{}\" (key text PRIMARY KEY, stream text NOT NULL, "
        "seq bigint NOT NULL, subject text NOT NULL, topic text, msg_id text NOT NULL, "
        "sender text NOT NULL, type text, ts timestamptz NOT NULL, body jsonb NOT NULL, "
        "headers jsonb NOT NULL, committed_at timestamptz NOT NULL DEFAULT now())",
        config_.table);
    // Two sinks creating one table at once: one of them sees a unique violation (23505) on
    // the catalog, and the table exists afterwards.
    if (auto r = run(create, {}); !r && r.error().code() != errc::conflict) return fail_open(r);
    auto cols =
        run("SELECT column_name FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = $1",
            {config_.table});
    if (!cols) return fail_open(cols);
    for (auto c : k_columns) {
      if (!has_value(cols->get(), c)) return no_column(c);
    }
    if (!has_value(cols->get(), "committed_at")) return no_column("committed_at");
    return {};
  }

  result<void> probe() override {
    if (!conn_ || PQstatus(conn_.get()) != CONNECTION_OK) return open();
    if (auto r = run("SELECT 1", {}); !r) {
      conn_.reset();
      return away(r.error().message());
    }
    return {};
  }

  result<batch_result> write(std::span<const row> rows, duplicate_mode mode) override {
    if (!conn_ || PQstatus(conn_.get()) != CONNECTION_OK) {
      if (auto r = open(); !r) return r.error();
    }
    // Most batches hold only new keys: one plain INSERT. A key stored already (a redelivery,
    // or another message's key) makes it fail as a whole, and the batch is written again
    // resolving each key.
    auto fresh = write_new(rows);
    if (fresh ||
        (fresh.error().code() != errc::conflict && fresh.error().code() != errc::bad_request)) {
      return fresh;
    }
    if (fresh.error().code() == errc::conflict) {
      auto whole = write_batch(rows, mode, false);
      if (whole || whole.error().code() != errc::bad_request) return whole;
    }
    // A row was refused: find which, keep the rest.
    return write_batch(rows, mode, true);
  }

 private:
  // One transaction: every row inserted, none of their keys stored before; `conflict` when
  // one was.
  result<batch_result> write_new(std::span<const row> rows) {
    if (auto r = run("BEGIN", {}); !r) return abandon(r.error());
    std::vector<std::size_t> all(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) all[i] = i;
    std::set<std::string, std::less<>> unused;
    if (auto r = insert(rows, all, on_conflict::fail, unused); !r) return abandon(r.error());
    if (auto r = run("COMMIT", {}); !r) return abandon(r.error());
    batch_result out;
    out.outcomes.assign(rows.size(), row_outcome::written);
    out.reasons.resize(rows.size());
    return out;
  }

  // One transaction: the rows inserted where their keys are new (one statement, or one per
  // row under a savepoint to find a refused one), then, only for keys that were stored
  // already, their stored origin read and `mode` applied.
  result<batch_result> write_batch(std::span<const row> rows, duplicate_mode mode,
                                   bool one_by_one) {
    batch_result out;
    out.outcomes.assign(rows.size(), row_outcome::written);
    out.reasons.resize(rows.size());
    if (auto r = run("BEGIN", {}); !r) return abandon(r.error());
    std::vector<std::size_t> all(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) all[i] = i;
    std::set<std::string, std::less<>> inserted;
    if (!one_by_one) {
      auto r = insert(rows, all, on_conflict::nothing, inserted);
      if (!r) return abandon(r.error());
    } else {
      for (auto i : all) {
        if (auto r = run("SAVEPOINT amp_row", {}); !r) return abandon(r.error());
        auto r = insert(rows, {&i, 1}, on_conflict::nothing, inserted);
        if (r) {
          if (auto s = run("RELEASE SAVEPOINT amp_row", {}); !s) return abandon(s.error());
          continue;
        }
        if (r.error().code() != errc::bad_request) return abandon(r.error());
        if (auto s = run("ROLLBACK TO SAVEPOINT amp_row", {}); !s) return abandon(s.error());
        out.outcomes[i] = row_outcome::refused;
        out.reasons[i] = r.error().message();
      }
    }
    std::vector<std::size_t> stored_before;
    for (auto i : all) {
      if (out.outcomes[i] == row_outcome::written && !inserted.contains(rows[i].key)) {
        stored_before.push_back(i);
      }
    }
    if (!stored_before.empty()) {
      auto stored = stored_origins(rows, stored_before);
      if (!stored) return abandon(stored.error());
      std::vector<std::size_t> to_replace;
      for (auto i : stored_before) {
        auto it = stored->find(rows[i].key);
        if (it != stored->end() && it->second.first == rows[i].stream &&
            it->second.second == rows[i].seq) {
          out.outcomes[i] = row_outcome::same;
        } else if (mode == duplicate_mode::skip) {
          out.outcomes[i] = row_outcome::skipped;
        } else if (mode == duplicate_mode::fail) {
          out.outcomes[i] = row_outcome::duplicate;
        } else {
          out.outcomes[i] = row_outcome::replaced;
          to_replace.push_back(i);
        }
      }
      if (!to_replace.empty()) {
        if (auto r = insert(rows, to_replace, on_conflict::update, inserted); !r) {
          return abandon(r.error());
        }
      }
    }
    if (auto r = run("COMMIT", {}); !r) return abandon(r.error());
    return out;
  }

  // The stream and seq stored under each key of the rows `which` that is stored.
  result<std::map<std::string, std::pair<std::string, std::uint64_t>, std::less<>>> stored_origins(
      std::span<const row> rows, std::span<const std::size_t> which) {
    std::map<std::string, std::pair<std::string, std::uint64_t>, std::less<>> out;
    for (std::size_t first = 0; first < which.size(); first += k_rows_per_statement) {
      const auto part = which.subspan(first, std::min(k_rows_per_statement, which.size() - first));
      std::string sql =
          fmt::format("SELECT key, stream, seq FROM \"{}\" WHERE key IN (", config_.table);
      std::vector<std::string_view> keys;
      for (std::size_t w = 0; w < part.size(); ++w) {
        sql += fmt::format("{}${}", w == 0 ? "" : ",", w + 1);
        keys.push_back(rows[part[w]].key);
      }
      sql += ")";
      auto r = run(sql, keys);
      if (!r) return r.error();
      for (int i = 0; i < PQntuples(r->get()); ++i) {
        out.emplace(PQgetvalue(r->get(), i, 0), std::pair(std::string(PQgetvalue(r->get(), i, 1)),
                                                          std::stoull(PQgetvalue(r->get(), i, 2))));
      }
    }
    return out;
  }

  // Inserts the rows `which`, a key stored already handled as `conflict` says. Adds the keys
  // written to `written` (but with on_conflict::fail, which writes all or fails).
  result<void> insert(std::span<const row> rows, std::span<const std::size_t> which,
                      on_conflict conflict, std::set<std::string, std::less<>>& written) {
    for (std::size_t first = 0; first < which.size(); first += k_rows_per_statement) {
      const auto part = which.subspan(first, std::min(k_rows_per_statement, which.size() - first));
      if (auto r = insert_part(rows, part, conflict, written); !r) return r;
    }
    return {};
  }

  result<void> insert_part(std::span<const row> rows, std::span<const std::size_t> which,
                           on_conflict conflict, std::set<std::string, std::less<>>& written) {
    std::vector<std::string> seqs;
    seqs.reserve(which.size());
    std::vector<const char*> values;
    values.reserve(which.size() * k_params);
    for (const auto w : which) {
      const auto& r = rows[w];
      seqs.push_back(std::to_string(r.seq));
      values.insert(values.end(),
                    {r.key.c_str(), r.stream.c_str(), seqs.back().c_str(), r.subject.c_str(),
                     r.topic ? r.topic->c_str() : nullptr, r.msg_id.c_str(), r.sender.c_str(),
                     r.type.empty() ? nullptr : r.type.c_str(), r.ts.c_str(), r.body.c_str(),
                     r.headers.c_str()});
    }
    if (conflict == on_conflict::fail) {
      auto name = prepared_insert(which.size());
      if (!name) return name.error();
      if (!name->empty()) {
        auto r = exec_prepared(*name, values);
        if (!r) return r.error();
        return {};
      }
    }
    const auto sql = insert_sql(which.size(), conflict);
    auto r = exec(sql, values);
    if (!r) return r.error();
    for (int i = 0; i < PQntuples(r->get()); ++i) written.emplace(PQgetvalue(r->get(), i, 0));
    return {};
  }

  // The name of the plain INSERT of `n` rows, prepared on this connection (once: PostgreSQL
  // then neither parses nor plans it again); empty when k_max_prepared sizes are already.
  result<std::string> prepared_insert(std::size_t n) {
    auto name = fmt::format("amp_insert_{}", n);
    if (prepared_.contains(n)) return name;
    if (prepared_.size() >= k_max_prepared) return std::string();
    if (!conn_) return away(describe() + ": not connected");
    const auto sql = insert_sql(n, on_conflict::fail);
    auto made = check(pg_result(PQprepare(conn_.get(), name.c_str(), sql.c_str(),
                                          static_cast<int>(n * k_params), nullptr)));
    if (!made) return made.error();
    prepared_.insert(n);
    return name;
  }

  // An INSERT of `n` rows of parameters, a key stored already handled as `conflict` says.
  std::string insert_sql(std::size_t n, on_conflict conflict) const {
    std::string sql = fmt::format("INSERT INTO \"{}\" ({}, committed_at) VALUES ", config_.table,
                                  fmt::join(k_columns, ", "));
    int p = 0;
    for (std::size_t w = 0; w < n; ++w) {
      sql += w == 0 ? "(" : ",(";
      for (std::size_t c = 0; c < k_params; ++c) sql += fmt::format("${}{},", ++p, k_casts[c]);
      sql += "now())";
    }
    if (conflict == on_conflict::nothing) sql += " ON CONFLICT (key) DO NOTHING RETURNING key";
    if (conflict == on_conflict::update) {
      sql +=
          " ON CONFLICT (key) DO UPDATE SET stream = EXCLUDED.stream, seq = EXCLUDED.seq, "
          "subject = EXCLUDED.subject, topic = EXCLUDED.topic, msg_id = EXCLUDED.msg_id, "
          "sender = EXCLUDED.sender, type = EXCLUDED.type, ts = EXCLUDED.ts, body = "
          "EXCLUDED.body, headers = EXCLUDED.headers, committed_at = EXCLUDED.committed_at "
          "RETURNING key";
    }
    return sql;
  }

  static bool has_value(PGresult* r, std::string_view v) {
    for (int i = 0; i < PQntuples(r); ++i) {
      if (v == PQgetvalue(r, i, 0)) return true;
    }
    return false;
  }

  unexpected no_column(std::string_view c) {
    conn_.reset();
    return unexpected(errc::bad_request,
                      fmt::format("{}: the table has no column \"{}\" (a table of another "
                                  "program? name another table)",
                                  describe(), c));
  }

  template <class R>
  unexpected fail_open(const R& r) {
    conn_.reset();
    return away(r.error().message());
  }

  // Rolls back what the failed transaction did; the connection goes when it is broken.
  unexpected abandon(const error& e) {
    if (conn_ && PQstatus(conn_.get()) == CONNECTION_OK) {
      pg_result(PQexec(conn_.get(), "ROLLBACK"));
    }
    if (e.code() == errc::unavailable) conn_.reset();
    return unexpected(e.code(), e.message());
  }

  result<pg_result> run(const std::string& sql, const std::vector<std::string_view>& params) {
    std::vector<std::string> owned(params.begin(), params.end());
    std::vector<const char*> values;
    for (const auto& p : owned) values.push_back(p.c_str());
    return exec(sql, values);
  }

  result<pg_result> exec(const std::string& sql, const std::vector<const char*>& values) {
    if (!conn_) return away(describe() + ": not connected");
    return check(pg_result(PQexecParams(conn_.get(), sql.c_str(), static_cast<int>(values.size()),
                                        nullptr, values.data(), nullptr, nullptr, 0)));
  }

  result<pg_result> exec_prepared(const std::string& name, const std::vector<const char*>& values) {
    if (!conn_) return away(describe() + ": not connected");
    return check(
        pg_result(PQexecPrepared(conn_.get(), name.c_str(), static_cast<int>(values.size()),
                                 values.data(), nullptr, nullptr, 0)));
  }

  // `r` when it succeeded; otherwise `unavailable` for what may pass, `conflict` for a unique
  // violation, `bad_request` for a row or statement PostgreSQL refuses.
  result<pg_result> check(pg_result r) {
    const auto status = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
    if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return r;
    const char* state = r ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE) : nullptr;
    const std::string_view sqlstate = state ? state : "";
    auto message =
        fmt::format("{}: {}{}", describe(),
                    first_line(r ? PQresultErrorMessage(r.get()) : PQerrorMessage(conn_.get())),
                    sqlstate.empty() ? "" : fmt::format(" (SQLSTATE {})", sqlstate));
    if (sqlstate == "23505") return unexpected(errc::conflict, std::move(message));
    if (PQstatus(conn_.get()) != CONNECTION_OK || !row_state(sqlstate)) {
      return away(std::move(message));
    }
    return unexpected(errc::bad_request, std::move(message));
  }

  target_config config_;
  conn_ptr conn_;
  std::set<std::size_t> prepared_;  // batch sizes whose plain INSERT this connection prepared
};

}  // namespace

std::unique_ptr<target> make_postgres_target(const target_config& config) {
  return std::make_unique<postgres_target>(config);
}

}  // namespace amp::sink::detail
