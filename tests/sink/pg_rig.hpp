#pragma once

// Reading a PostgreSQL table from a test (libpq).

#include <libpq-fe.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace amp::testing {

/// The rows of `sql` as text (NULL as "<null>"); throws when the query fails.
inline std::vector<std::vector<std::string>> pg_query(const std::string& dsn,
                                                      const std::string& sql) {
  PGconn* c = PQconnectdb(dsn.c_str());
  if (PQstatus(c) != CONNECTION_OK) {
    std::string why = PQerrorMessage(c);
    PQfinish(c);
    throw std::runtime_error("pg_query: " + why);
  }
  PGresult* r = PQexec(c, sql.c_str());
  const auto status = PQresultStatus(r);
  if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
    std::string why = PQresultErrorMessage(r);
    PQclear(r);
    PQfinish(c);
    throw std::runtime_error("pg_query: " + sql + ": " + why);
  }
  std::vector<std::vector<std::string>> out;
  for (int i = 0; i < PQntuples(r); ++i) {
    std::vector<std::string> row;
    for (int j = 0; j < PQnfields(r); ++j) {
      row.emplace_back(PQgetisnull(r, i, j) ? "<null>" : PQgetvalue(r, i, j));
    }
    out.push_back(std::move(row));
  }
  PQclear(r);
  PQfinish(c);
  return out;
}

/// The one value of a query that returns one.
inline std::string pg_value(const std::string& dsn, const std::string& sql) {
  auto rows = pg_query(dsn, sql);
  if (rows.size() != 1 || rows[0].size() != 1) {
    throw std::runtime_error("pg_value: not one value: " + sql);
  }
  return rows[0][0];
}

}  // namespace amp::testing
