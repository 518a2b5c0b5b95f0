// The SQL helpers the store's files share (store_open.cpp, store.cpp, store_read.cpp, store_side.cpp): errors,
// bindings, column reads, and a transaction that rolls back unless committed. Internal to the store.
#pragma once

#include <sqlite3.h>

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/json_input.hpp"
#include "daemon/store.hpp"

namespace gpuq::daemon::sql {

using json = nlohmann::json;

[[noreturn]] inline void fail(sqlite3* db, const std::string& what) {
  throw RequestError(ErrorCode::store_error, "state store: " + what + ": " + sqlite3_errmsg(db));
}

inline std::string text(sqlite3_stmt* st, int col) {
  auto p = sqlite3_column_text(st, col);
  return p ? reinterpret_cast<const char*>(p) : "";
}

// A JSON column. What gpuqd stores went through json_input.hpp's limits, but a store written by
// an older gpuq may hold results and events nested without a limit (a 50,000-deep result made
// every `status --json` take gigabytes): those read back as a string saying so, never as a value
// whose printing recurses that deep.
inline json json_col(sqlite3_stmt* st, int col) {
  if (sqlite3_column_type(st, col) == SQLITE_NULL) return nullptr;
  bool too_deep = false;
  try {
    json v = common::parse_depth_limited(text(st, col), too_deep);
    if (too_deep) return "(dropped: nested deeper than " + std::to_string(common::k_max_json_depth) + " levels)";
    return v;
  } catch (const json::exception&) {
    return json::value_t::discarded;
  }
}

inline void bind_text(sqlite3_stmt* st, int i, const std::string& s) {
  sqlite3_bind_text(st, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
}

inline void bind_json(sqlite3_stmt* st, int i, const json& j) {
  if (j.is_null()) sqlite3_bind_null(st, i);
  else bind_text(st, i, j.dump());
}

inline void bind_opt(sqlite3_stmt* st, int i, const std::optional<int>& v) {
  if (v) sqlite3_bind_int(st, i, *v);
  else sqlite3_bind_null(st, i);
}

// Steps a statement that returns no rows, then resets it for reuse.
inline void run(sqlite3* db, sqlite3_stmt* st, const char* what) {
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (rc != SQLITE_DONE) fail(db, what);
}

// A transaction that rolls back unless committed (exceptions included).
class Txn {
 public:
  Txn(sqlite3* db, StoreFaults& faults) : m_db(db) {
    if (faults.next_fails())
      throw RequestError(ErrorCode::store_error, "state store: database or disk is full (injected: GPUQ_TEST_STORE_FAULTS)");
    if (sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) fail(db, "begin");
  }
  void commit() {
    if (sqlite3_exec(m_db, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) fail(m_db, "commit");
    m_done = true;
  }
  ~Txn() {
    if (!m_done) sqlite3_exec(m_db, "ROLLBACK", nullptr, nullptr, nullptr);
  }

 private:
  sqlite3* m_db;
  bool m_done = false;
};

}  // namespace gpuq::daemon::sql
