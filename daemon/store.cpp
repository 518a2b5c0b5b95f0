// The store's writes (see store.hpp): batches written in parts, restarts, a job's record and its
// transitions, specs rewritten by `update`, jobs removed by `clean`, a batch's limit, and what a
// restart left unfinished. The reads of jobs are in store_read.cpp. Statements are prepared once and cached
// (Store::prepare, store_open.cpp).
#include "daemon/store.hpp"

#include "common/json_input.hpp"
#include "daemon/launcher.hpp"
#include "daemon/store_sql.hpp"

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>

namespace gpuq::daemon {

using namespace sql;

std::int64_t Store::next_id(const char* table) {
  // max(id) of a rowid table is one index probe; the removed high-water mark keeps ids unreused.
  auto* st = std::strcmp(table, "jobs") == 0
                 ? prepare("SELECT max(coalesce((SELECT max(id) FROM jobs), 0), "
                           "coalesce((SELECT max_id FROM removed_ids WHERE tbl='jobs'), 0)) + 1")
                 : prepare("SELECT max(coalesce((SELECT max(id) FROM batches), 0), "
                           "coalesce((SELECT max_id FROM removed_ids WHERE tbl='batches'), 0)) + 1");
  std::int64_t id = 0;
  if (sqlite3_step(st) == SQLITE_ROW) id = sqlite3_column_int64(st, 0);
  sqlite3_reset(st);
  if (id <= 0) fail(m_db, std::string("read the next id of ") + table);
  return id;
}

std::int64_t Store::insert_batch(std::vector<JobRecord>& jobs, const std::vector<std::vector<std::size_t>>& local_deps,
                                 const std::string& cwd, const json& env, double now, int max_running) {
  BatchWrite w;
  insert_batch_part(w, jobs, local_deps, cwd, env, now, max_running, std::chrono::steady_clock::time_point::max());
  return w.batch;
}

bool Store::insert_batch_part(BatchWrite& w, std::vector<JobRecord>& jobs,
                              const std::vector<std::vector<std::size_t>>& local_deps, const std::string& cwd,
                              const json& env, double now, int max_running,
                              std::chrono::steady_clock::time_point deadline) {
  if (w.batch == 0 && m_unfinished) discard_batch();  // one a failed part left: it goes first
  Txn txn(m_db, m_faults);
  const bool first_part = w.batch == 0;
  if (first_part) {
    // Ids are given explicitly: SQLite's own choice (max + 1) would hand out a removed job's id
    // again. They are consecutive from the next free one, so in-batch names resolve before any
    // row is written and each job is one INSERT (an INSERT, then an UPDATE of every column, cost
    // 1.70 s for a 100,000-job matrix; this, 1.21 s). Writing is one batch at a time (gpuqd's
    // submissions queue), so the ids after this batch's first part stay its own.
    w.batch = next_id("batches");
    const std::int64_t first = next_id("jobs");
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      jobs[i].id = first + static_cast<std::int64_t>(i);
      jobs[i].batch = w.batch;
      jobs[i].submitted_at = now;
    }
    auto* b = prepare("INSERT INTO batches(id, submitted_at, cwd, env, max_running, complete) VALUES(?, ?, ?, ?, ?, 0)");
    sqlite3_bind_int64(b, 1, w.batch);
    sqlite3_bind_double(b, 2, now);
    bind_text(b, 3, cwd);
    bind_text(b, 4, env.dump());
    sqlite3_bind_int(b, 5, max_running);
    run(m_db, b, "insert batch");
  }
  // A new job's other columns are the schema's defaults, which are what a submitted JobRecord holds.
  auto* ins = prepare(
      "INSERT INTO jobs(id, batch, name, spec, state, submitted_at, after, held, uid) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)");
  std::size_t i = w.written;
  for (; i < jobs.size(); ++i) {
    if (i > w.written && i % 64 == 0 && std::chrono::steady_clock::now() >= deadline) break;
    auto& j = jobs[i];
    for (std::size_t d : local_deps[i]) j.after.push_back(jobs[d].id);
    for (auto& dep : j.spec.after)
      if (dep.name.empty()) j.after.push_back(dep.id);
    sqlite3_bind_int64(ins, 1, j.id);
    sqlite3_bind_int64(ins, 2, w.batch);
    bind_text(ins, 3, j.spec.name);
    bind_text(ins, 4, common::to_json(j.spec).dump());
    bind_text(ins, 5, std::string(to_string(j.state)));
    sqlite3_bind_double(ins, 6, now);
    bind_text(ins, 7, json(j.after).dump());
    sqlite3_bind_int(ins, 8, j.held ? 1 : 0);
    sqlite3_bind_int64(ins, 9, j.uid);
    run(m_db, ins, "insert job");
    write_transition(j, now);
  }
  const bool complete = i == jobs.size();
  if (complete) {
    auto* done = prepare("UPDATE batches SET complete=1 WHERE id=?");
    sqlite3_bind_int64(done, 1, w.batch);
    run(m_db, done, "complete a batch");
  }
  try {
    txn.commit();
  } catch (const RequestError&) {
    if (first_part) w.batch = 0;  // nothing of it was written
    throw;
  }
  if (m_job_rows) *m_job_rows += static_cast<std::int64_t>(i - w.written);
  w.written = i;
  if (complete)
    m_unfinished.reset();
  else
    m_unfinished = Unfinished{w.batch, jobs.front().id, jobs.back().id, i};
  return complete;
}

void Store::discard_batch() {
  if (!m_unfinished) return;
  Txn txn(m_db, m_faults);
  auto* del_transitions = prepare("DELETE FROM transitions WHERE job_id BETWEEN ? AND ?");
  auto* del_jobs = prepare("DELETE FROM jobs WHERE id BETWEEN ? AND ?");
  std::int64_t deleted = 0;
  for (auto* st : {del_transitions, del_jobs}) {
    sqlite3_bind_int64(st, 1, m_unfinished->first);
    sqlite3_bind_int64(st, 2, m_unfinished->last);
    run(m_db, st, "discard an unfinished batch");
    deleted = sqlite3_changes(m_db);  // the jobs', the last
  }
  auto* del_batch = prepare("DELETE FROM batches WHERE id=?");
  sqlite3_bind_int64(del_batch, 1, m_unfinished->batch);
  run(m_db, del_batch, "discard an unfinished batch");
  txn.commit();
  if (m_job_rows) *m_job_rows -= deleted;
  m_unfinished.reset();
}

void Store::write_restart_part(RestartPlan& plan, const std::vector<const JobRecord*>& rows,
                               const std::vector<std::string>& why, std::size_t count) {
  const std::size_t done = plan.done + count;
  const bool last = done >= plan.jobs.size();
  Txn txn(m_db, m_faults);
  write_transitions(rows, why);
  std::int64_t id = plan.id;
  if (id == 0 && !last) {  // the first part of several: the plan goes in with it
    auto* ins = prepare("INSERT INTO restarts(jobs, done) VALUES(?, ?)");
    bind_text(ins, 1, json(plan.jobs).dump());
    sqlite3_bind_int64(ins, 2, static_cast<std::int64_t>(done));
    run(m_db, ins, "store a restart's plan");
    id = sqlite3_last_insert_rowid(m_db);
  } else if (id != 0) {
    auto* st = last ? prepare("DELETE FROM restarts WHERE id=?") : prepare("UPDATE restarts SET done=? WHERE id=?");
    int k = 1;
    if (!last) sqlite3_bind_int64(st, k++, static_cast<std::int64_t>(done));
    sqlite3_bind_int64(st, k, id);
    run(m_db, st, "record a restart's progress");
  }
  txn.commit();
  plan.id = last ? 0 : id;
  plan.done = done;
}

std::vector<Store::RestartPlan> Store::unfinished_restarts() {
  auto* st = prepare("SELECT id, jobs, done FROM restarts ORDER BY id");
  std::vector<RestartPlan> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    RestartPlan p;
    p.id = sqlite3_column_int64(st, 0);
    json jobs = json_col(st, 1);
    if (jobs.is_array())
      for (const auto& j : jobs)
        if (j.is_array() && j.size() == 2 && j[0].is_number_integer() && j[1].is_number_integer())
          p.jobs.emplace_back(j[0].get<std::int64_t>(), j[1].get<std::int64_t>());
    p.done = static_cast<std::size_t>(std::max<std::int64_t>(0, sqlite3_column_int64(st, 2)));
    out.push_back(std::move(p));
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) fail(m_db, "read unfinished restarts");
  return out;
}

bool Store::hidden(std::int64_t id) const {
  return m_unfinished && id >= m_unfinished->first && id <= m_unfinished->last;
}

bool Store::hidden_batch(std::int64_t batch) const { return m_unfinished && m_unfinished->batch == batch; }

json preemption_json(const JobRecord& j) {
  json out = json::object();
  if (j.preemptions > 0) out["count"] = j.preemptions;
  if (!j.run.preempted_by.empty()) out["by"] = j.run.preempted_by;
  if (j.run.preempted_at > 0) out["at"] = j.run.preempted_at;
  if (j.run.checkpoint_at > 0) out["checkpoint_at"] = j.run.checkpoint_at;
  if (j.suspensions > 0) out["suspensions"] = j.suspensions;
  if (j.run.suspended_for > 0) {
    out["suspended_for"] = j.run.suspended_for;
    out["suspended_for_attempt"] = j.run.suspended_for_attempt;
    out["suspended_by"] = j.run.suspended_by;
    out["suspended_at"] = j.run.suspended_at;
  }
  if (j.run.suspended_s > 0) out["suspended_s"] = j.run.suspended_s;
  if (j.run.resumed_at > 0) out["resumed_at"] = j.run.resumed_at;
  return out;
}

json gpu_budget_json(const JobRecord& j) {
  json out = json::object();
  if (j.gpu_budget.mb > 0) out["mb"] = j.gpu_budget.mb;
  if (!j.gpu_budget.why.empty()) out["why"] = j.gpu_budget.why;
  if (j.gpu_budget.raises > 0) out["raises"] = j.gpu_budget.raises;
  if (j.gpu_budget.at > 0) out["at"] = j.gpu_budget.at;
  if (j.gpu_budget.peak_mb > 0) out["peak_mb"] = j.gpu_budget.peak_mb;
  if (!j.run.over_budget.empty()) out["over_budget"] = j.run.over_budget;
  return out;
}

void read_gpu_budget(JobRecord& j, const json& stored) {
  if (!stored.is_object()) return;
  const auto number = [&](const char* key) {
    const auto it = stored.find(key);
    return it != stored.end() && it->is_number() ? it->get<double>() : 0.0;
  };
  const auto text = [&](const char* key) {
    const auto it = stored.find(key);
    return it != stored.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  j.gpu_budget.mb = static_cast<std::int64_t>(std::clamp(number("mb"), 0.0, 1e12));
  j.gpu_budget.why = text("why");
  j.gpu_budget.raises = static_cast<int>(std::clamp(number("raises"), 0.0, 1e9));
  j.gpu_budget.at = number("at");
  j.gpu_budget.peak_mb = static_cast<std::int64_t>(std::clamp(number("peak_mb"), 0.0, 1e12));
  j.run.over_budget = text("over_budget");
}

void read_preemption(JobRecord& j, const json& stored) {
  if (!stored.is_object()) return;
  const auto number = [&](const char* key) {
    const auto it = stored.find(key);
    return it != stored.end() && it->is_number() ? it->get<double>() : 0.0;
  };
  j.preemptions = static_cast<int>(std::clamp(number("count"), 0.0, 1e9));
  if (const auto by = stored.find("by"); by != stored.end() && by->is_string())
    j.run.preempted_by = by->get<std::string>();
  j.run.preempted_at = number("at");
  j.run.checkpoint_at = number("checkpoint_at");
  j.suspensions = static_cast<int>(std::clamp(number("suspensions"), 0.0, 1e9));
  j.run.suspended_for = static_cast<std::int64_t>(std::clamp(number("suspended_for"), 0.0, 9e15));
  j.run.suspended_for_attempt = static_cast<int>(std::clamp(number("suspended_for_attempt"), 0.0, 1e9));
  if (const auto by = stored.find("suspended_by"); by != stored.end() && by->is_string())
    j.run.suspended_by = by->get<std::string>();
  j.run.suspended_at = number("suspended_at");
  j.run.suspended_s = std::max(0.0, number("suspended_s"));
  j.run.resumed_at = number("resumed_at");
}

void Store::write_job(const JobRecord& j) {
  auto* st = prepare(
      "UPDATE jobs SET state=?, attempt=?, reason=?, started_at=?, ended_at=?, exit_code=?, exit_signal=?, "
      "gpus=?, master_port=?, not_before=?, cancel_requested=?, progress=?, result=?, after=?, "
      "bad_event_lines=?, first_failure=?, cpu_slots=?, cores=?, attempt_base=?, restarts=?, blocked_by=?, held=?, "
      "external_id=?, first_bad_event=?, preemption=?, gpu_budget=? WHERE id=?");
  bind_text(st, 1, std::string(to_string(j.state)));
  sqlite3_bind_int(st, 2, j.attempt);
  bind_text(st, 3, j.reason);
  sqlite3_bind_double(st, 4, j.run.started_at);
  sqlite3_bind_double(st, 5, j.run.ended_at);
  bind_opt(st, 6, j.run.exit_code);
  bind_opt(st, 7, j.run.exit_signal);
  bind_text(st, 8, json(j.run.gpus).dump());
  sqlite3_bind_int(st, 9, j.run.master_port);
  sqlite3_bind_double(st, 10, j.not_before);
  sqlite3_bind_int(st, 11, j.run.cancel_requested ? 1 : j.run.requeue_requested ? 2 : j.run.preempt_requested ? 3 : 0);
  bind_json(st, 12, j.run.progress);
  bind_json(st, 13, j.run.result);
  bind_text(st, 14, json(j.after).dump());
  sqlite3_bind_int64(st, 15, j.bad_event_lines);
  bind_json(st, 16, j.run.first_failure);
  bind_text(st, 17, json(j.run.cpu_slots).dump());
  bind_text(st, 18, json(j.run.cores).dump());
  sqlite3_bind_int(st, 19, j.attempt_base);
  sqlite3_bind_int(st, 20, j.restarts);
  sqlite3_bind_int64(st, 21, j.blocked_by);
  sqlite3_bind_int(st, 22, j.held ? 1 : 0);
  bind_text(st, 23, j.run.external_id);
  bind_text(st, 24, j.first_bad_event);
  bind_text(st, 25, preemption_json(j).dump());
  bind_text(st, 26, gpu_budget_json(j).dump());
  sqlite3_bind_int64(st, 27, j.id);
  run(m_db, st, "update job");
}

void Store::write_transition(const JobRecord& j, double at, const std::string* reason) {
  auto* st = prepare("INSERT INTO transitions(job_id, attempt, state, at, reason) VALUES(?, ?, ?, ?, ?)");
  sqlite3_bind_int64(st, 1, j.id);
  sqlite3_bind_int(st, 2, j.attempt);
  bind_text(st, 3, std::string(to_string(j.state)));
  sqlite3_bind_double(st, 4, at);
  bind_text(st, 5, reason ? *reason : j.reason);
  run(m_db, st, "insert transition");
}

// When a job entered its current state: its end or start where it has one, else now.
double Store::transition_time(const JobRecord& job) {
  double at = job.run.ended_at > 0 && is_terminal(job.state) ? job.run.ended_at
              : job.state == JobState::running           ? job.run.started_at
                                                          : 0;
  return at == 0 ? wall_now() : at;
}

void Store::update(const JobRecord& job, bool transition) {
  Txn txn(m_db, m_faults);
  write_job(job);
  if (transition) write_transition(job, transition_time(job));
  txn.commit();
}

void Store::update_many(const std::vector<const JobRecord*>& jobs, const std::vector<std::string>& why,
                        const std::vector<const JobRecord*>& quiet) {
  Txn txn(m_db, m_faults);
  write_transitions(jobs, why);
  for (const auto* job : quiet) write_job(*job);
  txn.commit();
}

void Store::write_transitions(const std::vector<const JobRecord*>& jobs, const std::vector<std::string>& why) {
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    write_job(*jobs[i]);
    for (const auto& [due, event] : {std::pair{jobs[i]->hook_due, "finish"}, {jobs[i]->preempt_hook_due, "preempt"}}) {
      if (!due) continue;
      auto* st = prepare("INSERT OR REPLACE INTO hook_runs(job_id, event, started, detail) VALUES(?, ?, 0, ?)");
      sqlite3_bind_int64(st, 1, jobs[i]->id);
      bind_text(st, 2, event);
      bind_text(st, 3, std::string(event) == "preempt" ? jobs[i]->run.preempted_by : std::string());
      run(m_db, st, "record a job's hooks as due");
    }
    write_transition(*jobs[i], transition_time(*jobs[i]), i < why.size() ? &why[i] : nullptr);
  }
}

void Store::rewrite_specs(const std::vector<const JobRecord*>& jobs, const std::vector<std::string>& why) {
  Txn txn(m_db, m_faults);
  auto* st = prepare("UPDATE jobs SET spec=? WHERE id=?");
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    bind_text(st, 1, common::to_json(jobs[i]->spec).dump());
    sqlite3_bind_int64(st, 2, jobs[i]->id);
    run(m_db, st, "update job spec");
    write_job(*jobs[i]);
    write_transition(*jobs[i], wall_now(), i < why.size() ? &why[i] : nullptr);
  }
  txn.commit();
}

std::vector<std::int64_t> Store::remove_jobs(const std::vector<std::int64_t>& ids) {
  Txn txn(m_db, m_faults);
  std::set<std::int64_t> batches;
  std::int64_t max_id = 0, removed = 0;
  auto* batch_of = prepare("SELECT batch FROM jobs WHERE id=?");
  auto* del_job = prepare("DELETE FROM jobs WHERE id=?");
  auto* del_transitions = prepare("DELETE FROM transitions WHERE job_id=?");
  auto* del_events = prepare("DELETE FROM events WHERE job_id=?");
  auto* del_offsets = prepare("DELETE FROM event_offsets WHERE job_id=?");
  for (auto id : ids) {
    sqlite3_bind_int64(batch_of, 1, id);
    const bool found = sqlite3_step(batch_of) == SQLITE_ROW;
    if (found) batches.insert(sqlite3_column_int64(batch_of, 0));
    sqlite3_reset(batch_of);
    if (!found) continue;
    max_id = std::max(max_id, id);
    ++removed;
    for (auto* st : {del_job, del_transitions, del_events, del_offsets}) {
      sqlite3_bind_int64(st, 1, id);
      run(m_db, st, "remove a job");
    }
  }
  std::vector<std::int64_t> emptied;
  auto* left = prepare("SELECT 1 FROM jobs WHERE batch=? LIMIT 1");
  auto* del_batch = prepare("DELETE FROM batches WHERE id=?");
  for (auto b : batches) {
    sqlite3_bind_int64(left, 1, b);
    const bool any = sqlite3_step(left) == SQLITE_ROW;
    sqlite3_reset(left);
    if (any) continue;
    sqlite3_bind_int64(del_batch, 1, b);
    run(m_db, del_batch, "remove a batch");
    emptied.push_back(b);
  }
  auto* mark = prepare("INSERT INTO removed_ids(tbl, max_id) VALUES(?, ?) "
                       "ON CONFLICT(tbl) DO UPDATE SET max_id=max(max_id, excluded.max_id)");
  for (auto [tbl, top] : {std::pair<const char*, std::int64_t>{"jobs", max_id},
                          {"batches", emptied.empty() ? 0 : emptied.back()}}) {
    if (top == 0) continue;
    bind_text(mark, 1, tbl);
    sqlite3_bind_int64(mark, 2, top);
    run(m_db, mark, "record removed ids");
  }
  txn.commit();
  if (m_job_rows) *m_job_rows -= removed;
  return emptied;
}

void Store::set_batch_limit(std::int64_t batch, int max_running) {
  auto* st = prepare("UPDATE batches SET max_running=? WHERE id=?");
  Txn txn(m_db, m_faults);
  sqlite3_bind_int(st, 1, max_running);
  sqlite3_bind_int64(st, 2, batch);
  run(m_db, st, "set a batch's limit");
  txn.commit();
}

}  // namespace gpuq::daemon
