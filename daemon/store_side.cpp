// The store's side tables (see store.hpp), beside the jobs and their batches: each job's state
// history and events (with the file offset each rank's events were read to, written in the
// event's own transaction), the on_finish hooks due, and the GPUs out of service.
#include "daemon/store.hpp"

#include "common/json_input.hpp"
#include "daemon/launcher.hpp"
#include "daemon/store_sql.hpp"

#include <sqlite3.h>

namespace gpuq::daemon {

using namespace sql;

std::vector<common::Transition> Store::history(std::int64_t id) {
  auto* st = prepare("SELECT attempt, state, at, reason FROM transitions WHERE job_id=? ORDER BY rowid");
  sqlite3_bind_int64(st, 1, id);
  std::vector<common::Transition> out;
  while (sqlite3_step(st) == SQLITE_ROW)
    out.push_back({sqlite3_column_int(st, 0), job_state_from_string(text(st, 1)).value_or(JobState::failed),
                   sqlite3_column_double(st, 2), text(st, 3)});
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return out;
}

std::int64_t Store::event_offset(std::int64_t id, int attempt, int rank) {
  auto* st = prepare("SELECT offset FROM event_offsets WHERE job_id=? AND attempt=? AND rank=?");
  sqlite3_bind_int64(st, 1, id);
  sqlite3_bind_int(st, 2, attempt);
  sqlite3_bind_int(st, 3, rank);
  std::int64_t off = 0;
  if (sqlite3_step(st) == SQLITE_ROW) off = sqlite3_column_int64(st, 0);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return off;
}

void Store::add_events(const JobRecord& job, int rank, std::int64_t new_offset, const std::vector<EventRow>& events) {
  Txn txn(m_db, m_faults);
  auto* ins = prepare("INSERT INTO events(job_id, attempt, rank, type, at, data) VALUES(?, ?, ?, ?, ?, ?)");
  for (const auto& e : events) {
    sqlite3_bind_int64(ins, 1, job.id);
    sqlite3_bind_int(ins, 2, job.attempt);
    sqlite3_bind_int(ins, 3, e.rank);
    bind_text(ins, 4, e.type);
    sqlite3_bind_double(ins, 5, e.at);
    bind_text(ins, 6, e.data.dump());
    run(m_db, ins, "insert event");
  }
  auto* off = prepare("INSERT OR REPLACE INTO event_offsets(job_id, attempt, rank, offset) VALUES(?, ?, ?, ?)");
  sqlite3_bind_int64(off, 1, job.id);
  sqlite3_bind_int(off, 2, job.attempt);
  sqlite3_bind_int(off, 3, rank);
  sqlite3_bind_int64(off, 4, new_offset);
  run(m_db, off, "update event offset");
  write_job(job);
  txn.commit();
}

std::vector<EventRow> Store::events(std::int64_t id, int attempt, std::int64_t after, int limit, const std::string& type) {
  auto* st = prepare(
      "SELECT rowid, rank, type, at, data FROM events WHERE job_id=? AND attempt=? AND rowid>? AND (?='' OR type=?) "
      "ORDER BY rowid LIMIT ?");
  sqlite3_bind_int64(st, 1, id);
  sqlite3_bind_int(st, 2, attempt);
  sqlite3_bind_int64(st, 3, after);
  bind_text(st, 4, type);
  bind_text(st, 5, type);
  sqlite3_bind_int(st, 6, limit);
  std::vector<EventRow> out;
  while (sqlite3_step(st) == SQLITE_ROW)
    out.push_back({sqlite3_column_int64(st, 0), sqlite3_column_int(st, 1), text(st, 2), sqlite3_column_double(st, 3),
                   json_col(st, 4)});
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return out;
}

std::map<std::string, std::string> Store::drained_gpus() {
  auto* st = prepare("SELECT uuid, reason FROM drained_gpus");
  std::map<std::string, std::string> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) out[text(st, 0)] = text(st, 1);
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) fail(m_db, "read drained GPUs");
  return out;
}

namespace {
const char* hook_event_name(HookEvent e) {
  return e == HookEvent::preempt ? "preempt" : "finish";
}
}  // namespace

std::vector<DueHook> Store::due_hooks() {
  auto* st = prepare(
      "SELECT h.job_id, h.event, h.detail FROM hook_runs h JOIN jobs j ON j.id = h.job_id "
      "WHERE h.started = 0 ORDER BY h.job_id, h.event");
  std::vector<DueHook> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    out.push_back(
        {sqlite3_column_int64(st, 0), text(st, 1) == "preempt" ? HookEvent::preempt : HookEvent::finish, text(st, 2)});
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) fail(m_db, "read due hooks");
  return out;
}

void Store::hooks_started(const DueHook& h) {
  auto* st = prepare("UPDATE hook_runs SET started = 1 WHERE job_id = ? AND event = ?");
  Txn txn(m_db, m_faults);
  sqlite3_bind_int64(st, 1, h.id);
  bind_text(st, 2, hook_event_name(h.event));
  run(m_db, st, "mark hooks started");
  txn.commit();
}

void Store::hooks_done(const DueHook& h) {
  // Only a row marked started: one made due again meanwhile (preempted again while its hook ran)
  // stays due.
  auto* st = prepare("DELETE FROM hook_runs WHERE job_id = ? AND event = ? AND started != 0");
  Txn txn(m_db, m_faults);
  sqlite3_bind_int64(st, 1, h.id);
  bind_text(st, 2, hook_event_name(h.event));
  run(m_db, st, "forget ended hooks");
  txn.commit();
}

void Store::forget_started_hooks() {
  exec("DELETE FROM hook_runs WHERE started != 0 OR job_id NOT IN (SELECT id FROM jobs)");
}

void Store::set_drained(const std::string& uuid, bool drained, const std::string& reason) {
  auto* st = drained ? prepare("INSERT OR REPLACE INTO drained_gpus(uuid, reason, at) VALUES(?, ?, ?)")
                     : prepare("DELETE FROM drained_gpus WHERE uuid=?");
  Txn txn(m_db, m_faults);
  bind_text(st, 1, uuid);
  if (drained) {
    bind_text(st, 2, reason);
    sqlite3_bind_double(st, 3, wall_now());
  }
  run(m_db, st, "update drained GPUs");
  txn.commit();
}

}  // namespace gpuq::daemon
