// Opening the store (see store.hpp): the schema and its migrations, which refuse a file gpuq did
// not make, fault injection for tests, and the checkpoints of the write-ahead log on a thread of
// their own.
#include "daemon/store.hpp"

#include "common/json_input.hpp"
#include "daemon/store_sql.hpp"

#include <dirent.h>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>
#include <utility>

namespace gpuq::daemon {

using namespace sql;

namespace {

constexpr int k_application_id = 0x67707571;  // "gpuq": marks the file as ours
constexpr int k_schema_version = 17;          // 2: jobs.cpu_slots; 3: jobs.cores; 4: restarts, blocked_by; 5: held;
                                              // 6: drained_gpus; 7: batches.max_running; 8: removed_ids;
                                              // 9: batches.complete; 10: restarts (plans of restarts under way);
                                              // 11: jobs.external_id (the Slurm job of the last attempt)
                                              // 12: jobs.uid (its owner); 13: hooks (on_finish hooks due)
                                              // 14: jobs.first_bad_event; 15: jobs.preemption
                                              // 16: hook_runs (hooks due by job and event) for hooks
                                              // 17: jobs.gpu_budget (a shared job's raised budget)

constexpr const char* k_schema = R"sql(
CREATE TABLE IF NOT EXISTS batches(
  id INTEGER PRIMARY KEY, submitted_at REAL NOT NULL, cwd TEXT NOT NULL, env TEXT NOT NULL,
  max_running INTEGER NOT NULL DEFAULT 0, complete INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS jobs(
  id INTEGER PRIMARY KEY, batch INTEGER NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL,
  state TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, reason TEXT NOT NULL DEFAULT '',
  submitted_at REAL NOT NULL, started_at REAL NOT NULL DEFAULT 0, ended_at REAL NOT NULL DEFAULT 0,
  exit_code INTEGER, exit_signal INTEGER, gpus TEXT NOT NULL DEFAULT '[]',
  master_port INTEGER NOT NULL DEFAULT 0, not_before REAL NOT NULL DEFAULT 0,
  cancel_requested INTEGER NOT NULL DEFAULT 0, progress TEXT, result TEXT,
  after TEXT NOT NULL DEFAULT '[]', bad_event_lines INTEGER NOT NULL DEFAULT 0, first_failure TEXT,
  cpu_slots TEXT NOT NULL DEFAULT '[]', cores TEXT NOT NULL DEFAULT '[]',
  attempt_base INTEGER NOT NULL DEFAULT 0, restarts INTEGER NOT NULL DEFAULT 0,
  blocked_by INTEGER NOT NULL DEFAULT 0, held INTEGER NOT NULL DEFAULT 0, external_id TEXT NOT NULL DEFAULT '',
  uid INTEGER NOT NULL DEFAULT 0, first_bad_event TEXT NOT NULL DEFAULT '', preemption TEXT NOT NULL DEFAULT '{}',
  gpu_budget TEXT NOT NULL DEFAULT '{}');
CREATE INDEX IF NOT EXISTS jobs_active ON jobs(state) WHERE state IN ('queued', 'running');
CREATE INDEX IF NOT EXISTS jobs_batch ON jobs(batch);
CREATE TABLE IF NOT EXISTS transitions(
  job_id INTEGER NOT NULL, attempt INTEGER NOT NULL, state TEXT NOT NULL, at REAL NOT NULL,
  reason TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS transitions_job ON transitions(job_id);
CREATE TABLE IF NOT EXISTS events(
  job_id INTEGER NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL, type TEXT NOT NULL,
  at REAL NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id, attempt);
CREATE TABLE IF NOT EXISTS drained_gpus(uuid TEXT PRIMARY KEY, reason TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS removed_ids(tbl TEXT PRIMARY KEY, max_id INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS hook_runs(job_id INTEGER NOT NULL, event TEXT NOT NULL, started INTEGER NOT NULL DEFAULT 0,
                                     detail TEXT NOT NULL DEFAULT '', PRIMARY KEY(job_id, event));
CREATE TABLE IF NOT EXISTS event_offsets(
  job_id INTEGER NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL, offset INTEGER NOT NULL,
  PRIMARY KEY(job_id, attempt, rank));
CREATE TABLE IF NOT EXISTS restarts(id INTEGER PRIMARY KEY, jobs TEXT NOT NULL, done INTEGER NOT NULL);
)sql";

}  // namespace

StoreFaults StoreFaults::from_env() {
  StoreFaults f;
  const char* v = std::getenv("GPUQ_TEST_STORE_FAULTS");
  if (!v || !*v) return f;
  const std::string spec = v;
  if (spec.rfind("file:", 0) == 0) {
    f.while_exists = spec.substr(5);
  } else {
    f.fail_at = std::atoll(spec.c_str());
    f.from_on = spec.back() == '+';
  }
  std::cerr << "gpuqd: store fault injection on (GPUQ_TEST_STORE_FAULTS=" << spec << ")\n";
  return f;
}

bool StoreFaults::next_fails() {
  ++writes;
  const bool fail = !while_exists.empty() ? ::access(while_exists.c_str(), F_OK) == 0
                                          : fail_at > 0 && (writes == fail_at || (from_on && writes > fail_at));
  if (fail) std::cerr << "gpuqd: store: failed write " << writes << " (GPUQ_TEST_STORE_FAULTS)\n";
  return fail;
}

// Copies the write-ahead log into the database (and fsyncs it) on a thread and a connection of its
// own, once the log has grown by k_pages since the last time, or every few seconds. Done by the
// writing connection, as SQLite does by default, a checkpoint of ~1,000 pages made one commit in
// a few dozen take ~30 ms longer, on gpuqd's thread. A PASSIVE checkpoint waits for no one and
// holds no writer up; once it has copied the whole log, the next write starts the log over (and
// cuts the file back to journal_size_limit). But under a steady stream of commits the log is never
// wholly copied at the moment a writer starts, so it would only grow: once it holds k_restart
// pages after a passive checkpoint, a RESTART checkpoint waits for the writer's current commit,
// copies the rest and makes the next write start the log over (gpuqd's next commit waits for it,
// a few milliseconds for 8 MiB). Idle (no commit for k_idle), the log is checkpointed with
// TRUNCATE, which empties the file: an idle gpuqd leaves no big log behind.
//
// The connection reads the database before each checkpoint: on one that has never read it,
// sqlite3_wal_checkpoint_v2 returns SQLITE_OK with a log of -1 and copies nothing (SQLite 3.40),
// and with this hook in place of wal_autocheckpoint nothing else would ever checkpoint. The log
// grew by ~39 KB a job, 790 MB at 1,000,000 jobs, until a restart.
class Store::Checkpointer {
 public:
  static constexpr int k_pages = 1000;  // SQLite's own default for wal_autocheckpoint
  static constexpr int k_restart = 2000;  // pages (8 MiB) the log may hold before a RESTART
  static constexpr auto k_idle = std::chrono::seconds(5);

  explicit Checkpointer(sqlite3* db) : m_db(db), m_thread([this] { loop(); }) {
    sqlite3_busy_timeout(m_db, 2000);  // RESTART and TRUNCATE wait this long for the writer
  }
  ~Checkpointer() {
    {
      std::lock_guard<std::mutex> l(m_mu);
      m_stop = true;
    }
    m_cv.notify_one();
    m_thread.join();
    sqlite3_close(m_db);
  }
  // sqlite3_wal_hook's callback, after each commit of the writing connection.
  static int on_commit(void* self, sqlite3*, const char*, int pages) {
    auto* c = static_cast<Checkpointer*>(self);
    c->m_commits.fetch_add(1, std::memory_order_relaxed);
    if (pages - c->m_pages_at_last >= k_pages) {
      c->m_pages_at_last = pages;
      {
        std::lock_guard<std::mutex> l(c->m_mu);
        c->m_due = true;
      }
      c->m_cv.notify_one();
    } else if (pages < c->m_pages_at_last) {
      c->m_pages_at_last = 0;  // the log started over
    }
    return SQLITE_OK;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> l(m_mu);
    std::string last_error;
    std::uint64_t commits_seen = 0;
    int frames = -1;  // in the log at the last checkpoint; -1: unknown
    while (!m_stop) {
      m_cv.wait_for(l, k_idle, [this] { return m_stop || m_due; });
      if (m_stop) break;
      const bool due = std::exchange(m_due, false);
      l.unlock();
      const std::uint64_t commits = m_commits.load(std::memory_order_relaxed);
      const bool idle = !due && commits == commits_seen;
      commits_seen = commits;
      if (idle && frames == 0) {  // nothing written since the log was emptied
        l.lock();
        continue;
      }
      sqlite3_exec(m_db, "SELECT count(*) FROM sqlite_master", nullptr, nullptr, nullptr);  // see above
      int log = -1, copied = -1;
      int rc = sqlite3_wal_checkpoint_v2(m_db, nullptr, idle ? SQLITE_CHECKPOINT_TRUNCATE : SQLITE_CHECKPOINT_PASSIVE,
                                               &log, &copied);
      if (rc == SQLITE_OK && !idle && log >= k_restart)
        rc = sqlite3_wal_checkpoint_v2(m_db, nullptr, SQLITE_CHECKPOINT_RESTART, &log, &copied);
      frames = rc == SQLITE_OK ? log : -1;
      const std::string error = rc == SQLITE_OK || rc == SQLITE_BUSY ? "" : sqlite3_errmsg(m_db);
      if (!error.empty() && error != last_error) std::cerr << "gpuqd: state store: checkpoint failed: " << error << "\n";
      last_error = error;
      l.lock();
    }
  }

  sqlite3* m_db;
  int m_pages_at_last = 0;  // the writer's thread only
  std::atomic<std::uint64_t> m_commits{0};
  std::mutex m_mu;
  std::condition_variable m_cv;
  bool m_due = false, m_stop = false;
  std::thread m_thread;  // last: it starts once the rest is ready
};

void Store::mark_job_ids_removed(std::int64_t up_to) {
  Txn txn(m_db, m_faults);
  auto* mark = prepare("INSERT INTO removed_ids(tbl, max_id) VALUES('jobs', ?) "
                       "ON CONFLICT(tbl) DO UPDATE SET max_id=max(max_id, excluded.max_id)");
  sqlite3_bind_int64(mark, 1, up_to);
  run(m_db, mark, "record removed ids");
  txn.commit();
}

Result<std::string> account_for_job_dirs(const std::string& state_dir, Store& store, bool forget_unknown) {
  const std::string jobs = state_dir + "/jobs";
  DIR* dir = ::opendir(jobs.c_str());
  if (!dir) {
    if (errno == ENOENT) return std::string();
    return Error{ErrorCode::internal, "cannot list " + jobs + ": " + std::strerror(errno)};
  }
  const std::int64_t next = store.next_job_id();
  std::int64_t unknown = 0, lowest = 0, highest = 0;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name.empty() || name.size() > 18 || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::int64_t id = std::stoll(name);
    if (id < next) continue;  // one the store holds, or removed
    ++unknown;
    lowest = lowest ? std::min(lowest, id) : id;
    highest = std::max(highest, id);
  }
  ::closedir(dir);
  if (unknown == 0) return std::string();
  const std::string which = std::to_string(unknown) + " job director" + (unknown == 1 ? "y" : "ies") + " (jobs/" +
                            std::to_string(lowest) + (unknown == 1 ? "" : " to jobs/" + std::to_string(highest)) + ")";
  if (!forget_unknown)
    return Error{ErrorCode::internal,
                 "the state dir " + state_dir + " holds " + which + " that its store, gpuq.db, does not know: the store " +
                     "was lost, emptied or restored from an older copy, and new jobs would take those jobs' ids and " +
                     "directories. Put the newest gpuq.db back (with its gpuq.db-wal), or start gpuqd once with " +
                     "--forget-unknown-jobs to leave those directories as they are and give new jobs ids above them"};
  store.mark_job_ids_removed(highest);
  return "gpuqd: " + which + " unknown to the store: their ids are recorded as forgotten (--forget-unknown-jobs); " +
         "new jobs start at " + std::to_string(highest + 1) + ", and the directories are left as they are";
}

Result<std::unique_ptr<Store>> Store::open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Error{ErrorCode::store_error, "cannot open state store " + path + ": " + msg};
  }
  std::unique_ptr<Store> store(new Store(db));
  store->m_faults = StoreFaults::from_env();
  sqlite3_busy_timeout(db, 5000);

  // Identify the file before changing anything: a foreign database is refused, never converted.
  sqlite3_stmt* st = nullptr;
  int app_id = -1, tables = -1, version = -1;
  if (sqlite3_prepare_v2(db, "PRAGMA application_id", -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    app_id = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    version = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  if (sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master", -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    tables = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  if (app_id < 0 || tables < 0)
    return Error{ErrorCode::store_error, "state store " + path + " is not a readable SQLite database (" +
                                             sqlite3_errmsg(db) + "); refusing to start. Move it away or pick another --state-dir"};
  if (app_id != k_application_id && !(app_id == 0 && tables == 0))
    return Error{ErrorCode::store_error, "state store " + path +
                                             " is an SQLite database that gpuq did not create; refusing to use it. "
                                             "Move it away or pick another --state-dir"};
  if (app_id == k_application_id && version > k_schema_version)
    return Error{ErrorCode::store_error, "state store " + path + " has schema version " + std::to_string(version) +
                                             ", newer than this gpuqd's " + std::to_string(k_schema_version) +
                                             ": a newer gpuq wrote it. Run that gpuq, or pick another --state-dir"};
  try {
    store->exec("PRAGMA journal_mode=WAL");
    store->exec("PRAGMA synchronous=NORMAL");
    // When the log starts over after a full checkpoint, its file is cut back to this size.
    store->exec("PRAGMA journal_size_limit=16777216");
    store->exec("PRAGMA foreign_keys=ON");
    if (app_id == 0) {
      store->exec(("PRAGMA application_id=" + std::to_string(k_application_id)).c_str());
      store->exec(("PRAGMA user_version=" + std::to_string(k_schema_version)).c_str());
    }
    store->exec(k_schema);
    if (app_id == k_application_id && version < 2) {  // migrations, each in one transaction
      store->exec("BEGIN IMMEDIATE; ALTER TABLE jobs ADD COLUMN cpu_slots TEXT NOT NULL DEFAULT '[]'; "
                  "PRAGMA user_version=2; COMMIT");
    }
    if (app_id == k_application_id && version < 3) {
      store->exec("BEGIN IMMEDIATE; ALTER TABLE jobs ADD COLUMN cores TEXT NOT NULL DEFAULT '[]'; "
                  "PRAGMA user_version=3; COMMIT");
    }
    if (app_id == k_application_id && version < 4) {
      store->exec("BEGIN IMMEDIATE; ALTER TABLE jobs ADD COLUMN attempt_base INTEGER NOT NULL DEFAULT 0; "
                  "ALTER TABLE jobs ADD COLUMN restarts INTEGER NOT NULL DEFAULT 0; "
                  "ALTER TABLE jobs ADD COLUMN blocked_by INTEGER NOT NULL DEFAULT 0; PRAGMA user_version=4; COMMIT");
    }
    if (app_id == k_application_id && version < 5) {
      store->exec("BEGIN IMMEDIATE; ALTER TABLE jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0; "
                  "PRAGMA user_version=5; COMMIT");
    }
    if (app_id == k_application_id && version < 6) store->exec("PRAGMA user_version=6");  // k_schema made the table
    if (app_id == k_application_id && version < 7) {
      store->exec("BEGIN IMMEDIATE; ALTER TABLE batches ADD COLUMN max_running INTEGER NOT NULL DEFAULT 0; "
                  "PRAGMA user_version=7; COMMIT");
    }
    if (app_id == k_application_id && version < 8) store->exec("PRAGMA user_version=8");  // k_schema made the table
    if (app_id == k_application_id && version < 9) {
      store->exec("BEGIN IMMEDIATE; ALTER TABLE batches ADD COLUMN complete INTEGER NOT NULL DEFAULT 1; "
                  "PRAGMA user_version=9; COMMIT");
    }
    if (app_id == k_application_id && version < 10) store->exec("PRAGMA user_version=10");  // k_schema made the table
    if (app_id == k_application_id && version < 11) {
      store->exec("BEGIN IMMEDIATE; ALTER TABLE jobs ADD COLUMN external_id TEXT NOT NULL DEFAULT ''; "
                  "PRAGMA user_version=11; COMMIT");
    }
    if (app_id == k_application_id && version < 12) {  // jobs from before were the user's who ran gpuqd
      store->exec(("BEGIN IMMEDIATE; ALTER TABLE jobs ADD COLUMN uid INTEGER NOT NULL DEFAULT " +
                   std::to_string(::getuid()) + "; PRAGMA user_version=12; COMMIT")
                      .c_str());
    }
    if (app_id == k_application_id && version < 13) store->exec("PRAGMA user_version=13");  // k_schema made the table
    if (app_id == k_application_id && version < 14) {
      store->exec(
          "BEGIN IMMEDIATE; ALTER TABLE jobs ADD COLUMN first_bad_event TEXT NOT NULL DEFAULT ''; "
          "PRAGMA user_version=14; COMMIT");
    }
    if (app_id == k_application_id && version < 15) {
      store->exec(
          "BEGIN IMMEDIATE; ALTER TABLE jobs ADD COLUMN preemption TEXT NOT NULL DEFAULT '{}'; "
          "PRAGMA user_version=15; COMMIT");
    }
    if (app_id == k_application_id && version < 16) {  // hooks (13 to 15) held a job's on_finish hooks alone
      // The table is made first where it is missing: a store whose migrations stopped part way
      // (at 13 to 15, from an older version) never had it.
      store->exec(
          "BEGIN IMMEDIATE; CREATE TABLE IF NOT EXISTS hooks(job_id INTEGER PRIMARY KEY, started INTEGER NOT NULL "
          "DEFAULT 0); INSERT OR IGNORE INTO hook_runs(job_id, event, started) SELECT job_id, 'finish', started FROM "
          "hooks; DROP TABLE hooks; PRAGMA user_version=16; COMMIT");
    }
    if (app_id == k_application_id && version < 17) {
      store->exec(
          "BEGIN IMMEDIATE; ALTER TABLE jobs ADD COLUMN gpu_budget TEXT NOT NULL DEFAULT '{}'; "
          "PRAGMA user_version=17; COMMIT");
    }
    // A batch whose writing a crash cut short was never acknowledged: it goes (insert_batch_part).
    store->exec("BEGIN IMMEDIATE; "
                "DELETE FROM transitions WHERE job_id IN "
                "(SELECT id FROM jobs WHERE batch IN (SELECT id FROM batches WHERE complete=0)); "
                "DELETE FROM jobs WHERE batch IN (SELECT id FROM batches WHERE complete=0); "
                "DELETE FROM batches WHERE complete=0; COMMIT");
    // After the migrations: it needs a column that older schemas lack.
    store->exec("CREATE INDEX IF NOT EXISTS jobs_blocked ON jobs(blocked_by) WHERE blocked_by != 0");
    // The most recent ended jobs (status) without walking past a deep queue, whose ids are newer:
    // 11 ms with 100,000 queued before it.
    store->exec("CREATE INDEX IF NOT EXISTS jobs_ended ON jobs(id) WHERE state NOT IN ('queued', 'running')");
  } catch (const RequestError& e) {
    return Error{ErrorCode::store_error, e.what()};
  }
  sqlite3* checkpoints = nullptr;  // without it, SQLite checkpoints on this connection as usual
  if (path != ":memory:" &&  // (tests): no log to checkpoint, and another connection would be another database
      sqlite3_open_v2(path.c_str(), &checkpoints, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr) == SQLITE_OK) {
    store->m_checkpointer = std::make_unique<Checkpointer>(checkpoints);
    sqlite3_wal_hook(db, &Checkpointer::on_commit, store->m_checkpointer.get());  // in place of wal_autocheckpoint
  } else {
    sqlite3_close(checkpoints);
  }
  return store;
}

Store::Store(sqlite3* db) : m_db(db) {}

Store::~Store() {
  for (auto& [_, st] : m_stmts) sqlite3_finalize(st);
  sqlite3_wal_hook(m_db, nullptr, nullptr);
  m_checkpointer.reset();
  sqlite3_close(m_db);
}

void Store::release_memory() {
  ::sqlite3_db_release_memory(m_db);
}

void Store::exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(m_db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    throw RequestError(ErrorCode::store_error, "state store: " + msg);
  }
}

sqlite3_stmt* Store::prepare(const char* sql) {
  auto it = m_stmts.find(sql);
  if (it != m_stmts.end()) return it->second;
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v3(m_db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr) != SQLITE_OK)
    fail(m_db, std::string("prepare ") + sql);
  m_stmts[sql] = st;
  return st;
}

}  // namespace gpuq::daemon
