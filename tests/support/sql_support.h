#pragma once
// Reading a history file behind the history's back, as a test checks what is stored.

#include <sqlite3.h>

#include <cstdint>
#include <string>

namespace lockstep::test {

// The first column of the first row `sql` gives (a count, say), read-only; -1 when there is none.
inline std::int64_t sqlCount(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::int64_t n = -1;
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK &&
      sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK && sqlite3_step(stmt) == SQLITE_ROW) {
    n = sqlite3_column_int64(stmt, 0);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return n;
}

}  // namespace lockstep::test
