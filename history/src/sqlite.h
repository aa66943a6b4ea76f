#pragma once
// SQLite for the history: errors that say what to do, prepared statements, transactions. Private
// to history/.

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "lockstep/common/result.h"

namespace lockstep::history::detail {

inline Error sqliteError(sqlite3* db, std::string_view what) {
  const int code = db ? sqlite3_errcode(db) : SQLITE_ERROR;
  std::string message = std::string(what) + ": " + (db ? sqlite3_errmsg(db) : "out of memory");
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
    return Error{ErrorCode::kUnavailable, message + " (another process kept the history busy for 5 s; try again)"};
  }
  if (code == SQLITE_NOTADB || code == SQLITE_CORRUPT) {
    return Error{ErrorCode::kFailedPrecondition,
                 message + " (not a usable Lockstep history: move the file away, or set LOCKSTEP_HISTORY to another path)"};
  }
  return Error{ErrorCode::kIo, message};
}

// A prepared statement: bind by position (from 1) or by name (":name"), step, read columns by
// position (from 0) or by name.
class Statement {
 public:
  static Result<Statement> prepare(sqlite3* db, std::string_view sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr) != SQLITE_OK) {
      return sqliteError(db, "preparing a history query");
    }
    return Statement(db, stmt);
  }
  Statement(Statement&& other) noexcept : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)) {}
  Statement& operator=(Statement&&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  Statement& bind(int i, std::int64_t v) { return check(sqlite3_bind_int64(stmt_, i, v)); }
  Statement& bind(int i, std::uint64_t v) { return bind(i, static_cast<std::int64_t>(v)); }
  Statement& bind(int i, std::uint32_t v) { return bind(i, std::int64_t{v}); }
  Statement& bind(int i, std::int32_t v) { return bind(i, std::int64_t{v}); }
  Statement& bind(int i, double v) { return check(sqlite3_bind_double(stmt_, i, v)); }
  Statement& bind(int i, std::string_view v) {
    return check(sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  Statement& bind(int i, const std::string& v) { return bind(i, std::string_view(v)); }
  Statement& bind(int i, const char* v) { return bind(i, std::string_view(v)); }
  template <class T>
  Statement& bind(int i, const std::optional<T>& v) {
    return v ? bind(i, *v) : check(sqlite3_bind_null(stmt_, i));
  }
  Statement& bindNull(int i) { return check(sqlite3_bind_null(stmt_, i)); }
  // A named parameter (":world_size"); one the statement lacks is a bind failure, reported by step().
  template <class T>
  Statement& bind(const char* name, const T& v) {
    const int i = sqlite3_bind_parameter_index(stmt_, name);
    if (i == 0) return check(SQLITE_RANGE);
    return bind(i, v);
  }
  // The index of the result column called `name`; -1 if there is none.
  int column(std::string_view name) const {
    for (int c = 0; c < sqlite3_column_count(stmt_); ++c) {
      if (name == sqlite3_column_name(stmt_, c)) return c;
    }
    return -1;
  }

  // true: a row is ready; false: done.
  Result<bool> step() {
    if (bindFailed_) return sqliteError(db_, "binding a history query");
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return sqliteError(db_, "history query");
  }
  Result<void> run() {
    LOCKSTEP_TRY(step());
    return reset();
  }
  Result<void> reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    bindFailed_ = false;
    return {};
  }

  bool null(int c) const { return sqlite3_column_type(stmt_, c) == SQLITE_NULL; }
  std::int64_t i64(int c) const { return sqlite3_column_int64(stmt_, c); }
  double real(int c) const { return sqlite3_column_double(stmt_, c); }
  std::string text(int c) const {
    const auto* p = sqlite3_column_text(stmt_, c);
    return p ? std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(sqlite3_column_bytes(stmt_, c)))
             : std::string();
  }
  std::optional<double> maybeReal(int c) const { return null(c) ? std::nullopt : std::optional(real(c)); }
  template <class T>
  std::optional<T> maybeInt(int c) const {
    return null(c) ? std::nullopt : std::optional(static_cast<T>(i64(c)));
  }

 private:
  Statement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  Statement& check(int rc) {
    bindFailed_ |= rc != SQLITE_OK;
    return *this;
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_;
  bool bindFailed_ = false;
};

// A statement a part of the history prepares on its first use and keeps: each part owns its
// statements (recording, replay, clocks, the catalog of jobs). A use is reset when it ends, so none
// keeps a read open between calls; a use begun while another is open (a visitor that calls back
// into the history) gets a statement of its own. Neither copied nor moved: its uses point at it.
class Prepared {
 public:
  Prepared(sqlite3* db, std::string_view sql) : db_(db), sql_(sql) {}
  Prepared(const Prepared&) = delete;
  Prepared& operator=(const Prepared&) = delete;

  class Use {
   public:
    Use(Use&& other) noexcept : kept_(std::exchange(other.kept_, nullptr)), own_(std::move(other.own_)) {}
    Use& operator=(Use&&) = delete;
    ~Use() {
      if (!kept_) return;
      (void)kept_->stmt_->reset();
      kept_->busy_ = false;
    }
    Statement& operator*() { return kept_ ? *kept_->stmt_ : *own_; }
    Statement* operator->() { return &**this; }

   private:
    friend class Prepared;
    explicit Use(Prepared* kept) : kept_(kept) {}
    explicit Use(Statement own) : own_(std::move(own)) {}
    Prepared* kept_ = nullptr;
    std::optional<Statement> own_;
  };

  Result<Use> use() {
    if (busy_) {
      LOCKSTEP_ASSIGN_OR_RETURN(auto own, Statement::prepare(db_, sql_));
      return Use(std::move(own));
    }
    if (!stmt_) {
      LOCKSTEP_ASSIGN_OR_RETURN(auto kept, Statement::prepare(db_, sql_));
      stmt_.emplace(std::move(kept));
    }
    busy_ = true;
    return Use(this);
  }

 private:
  sqlite3* db_;
  std::string sql_;
  std::optional<Statement> stmt_;
  bool busy_ = false;
};

// Calls `row(stmt)` for each row the statement steps to.
template <class F>
Result<void> forEachRow(Statement& stmt, F&& row) {
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool more, stmt.step());
    if (!more) return {};
    row(stmt);
  }
}

inline Result<void> exec(sqlite3* db, const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    sqlite3_free(message);
    return sqliteError(db, "history");
  }
  return {};
}

inline Result<std::int64_t> pragmaInt(sqlite3* db, const char* sql) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db, sql));
  LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
  return row ? stmt.i64(0) : 0;
}

// BEGIN IMMEDIATE ... COMMIT; rolled back unless committed.
class Transaction {
 public:
  static Result<Transaction> begin(sqlite3* db) {
    LOCKSTEP_TRY(exec(db, "BEGIN IMMEDIATE"));
    return Transaction(db);
  }
  Transaction(Transaction&& other) noexcept : db_(std::exchange(other.db_, nullptr)) {}
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction() {
    if (db_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Result<void> commit() {
    LOCKSTEP_TRY(exec(std::exchange(db_, nullptr), "COMMIT"));
    return {};
  }

 private:
  explicit Transaction(sqlite3* db) : db_(db) {}
  sqlite3* db_;
};

}  // namespace lockstep::history::detail
