// The store's reads (see store.hpp): a job's record from its row (a stored spec that no longer
// parses is kept, and said why), the active jobs, pages of finished ones under a client's
// filters, a batch's jobs, and the lookups the daemon's owners ask for. The writes are in
// store.cpp. Statements are prepared once and cached (Store::prepare, store_open.cpp).
#include "daemon/store.hpp"

#include "common/json_input.hpp"
#include "daemon/store_sql.hpp"

#include <sqlite3.h>

#include <algorithm>

namespace gpuq::daemon {

using namespace sql;

namespace {

// A stored spec into `j.spec`; one that does not parse leaves a default spec with what can be
// read of the stored one (a valid name; mode, ranks, gpus, nodes, cpus), and says why in
// `j.spec_error`. The stored text
// is never rewritten from such a record (update and restart refuse it), so nothing is lost.
void read_spec(JobRecord& j, const std::string& stored) {
  json spec = json::parse(stored, nullptr, false);
  auto parsed = spec.is_discarded() ? Result<common::JobSpec>(Error{ErrorCode::invalid_spec, "not JSON"})
                                    : common::parse_job(spec, "/");
  if (parsed) {
    j.spec = std::move(*parsed);
    return;
  }
  constexpr std::size_t k_max_said = 512;  // the reason travels in replies and logs: a bounded one
  std::string why = parsed.error().message;
  if (why.size() > k_max_said) {
    std::size_t cut = k_max_said;
    while (cut > 0 && (static_cast<unsigned char>(why[cut]) & 0xC0) == 0x80)
      --cut;  // not inside a UTF-8 character
    why = why.substr(0, cut) + "...";
  }
  j.spec_error = std::move(why);
  if (!spec.is_object()) return;
  // What a running one needs to be adopted and to end as it ends: its ranks, and how they were
  // laid out (a ddp job's ranks each write their own exit record; its cores, for its CPU slots).
  const auto integer = [&](const char* key, std::int64_t lo, std::int64_t hi, int& out) {
    if (auto v = spec.find(key); v != spec.end() && v->is_number_integer())
      out = static_cast<int>(std::clamp<std::int64_t>(v->get<std::int64_t>(), lo, hi));
  };
  if (auto n = spec.find("name"); n != spec.end() && n->is_string() && common::valid_name(n->get<std::string>()))
    j.spec.name = n->get<std::string>();  // one a log line or a terminal may show as it is
  if (auto m = spec.find("mode"); m != spec.end() && *m == "ddp") j.spec.mode = common::Mode::ddp;
  integer("ranks", 1, common::k_max_cpus, j.spec.ranks);
  integer("gpus", 0, common::k_max_gpus, j.spec.gpus);
  integer("nodes", 1, common::k_max_nodes, j.spec.nodes);
  integer("cpus", 0, common::k_max_cpus, j.spec.cpus);
}

}  // namespace

std::vector<JobRecord> Store::query_jobs(sqlite3_stmt* st, const DetailsOf& details) {
  std::vector<JobRecord> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    JobRecord j;
    j.id = sqlite3_column_int64(st, 0);
    j.batch = sqlite3_column_int64(st, 1);
    read_spec(j, text(st, 2));
    j.state = job_state_from_string(text(st, 3)).value_or(JobState::failed);
    j.attempt = sqlite3_column_int(st, 4);
    j.reason = text(st, 5);
    j.submitted_at = sqlite3_column_double(st, 6);
    j.run.started_at = sqlite3_column_double(st, 7);
    j.run.ended_at = sqlite3_column_double(st, 8);
    if (sqlite3_column_type(st, 9) != SQLITE_NULL) j.run.exit_code = sqlite3_column_int(st, 9);
    if (sqlite3_column_type(st, 10) != SQLITE_NULL) j.run.exit_signal = sqlite3_column_int(st, 10);
    json gpus = json_col(st, 11);
    if (gpus.is_array()) j.run.gpus = gpus.get<std::vector<int>>();
    j.run.master_port = sqlite3_column_int(st, 12);
    j.not_before = sqlite3_column_double(st, 13);
    j.run.cancel_requested = sqlite3_column_int(st, 14) == 1;
    j.run.requeue_requested = sqlite3_column_int(st, 14) == 2;
    j.run.preempt_requested = sqlite3_column_int(st, 14) == 3;
    read_preemption(j, json_col(st, 29));
    read_gpu_budget(j, json_col(st, 30));
    j.uid = static_cast<uid_t>(sqlite3_column_int64(st, 27));
    const bool detailed = !details || details(j.uid);
    if (detailed) {
      j.run.progress = json_col(st, 15);
      j.run.result = json_col(st, 16);
      j.run.first_failure = json_col(st, 19);
      j.first_bad_event = text(st, 28);
    }
    json after = json_col(st, 17);
    if (after.is_array()) j.after = after.get<std::vector<std::int64_t>>();
    j.bad_event_lines = sqlite3_column_int64(st, 18);
    json cpu_slots = json_col(st, 20);
    if (cpu_slots.is_array()) j.run.cpu_slots = cpu_slots.get<std::vector<int>>();
    json cores = json_col(st, 21);
    if (cores.is_array()) j.run.cores = cores.get<std::vector<int>>();
    j.attempt_base = sqlite3_column_int(st, 22);
    j.restarts = sqlite3_column_int(st, 23);
    j.blocked_by = sqlite3_column_int64(st, 24);
    j.held = sqlite3_column_int(st, 25) != 0;
    j.run.external_id = text(st, 26);
    out.push_back(std::move(j));
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (rc != SQLITE_DONE) fail(m_db, "read jobs");
  return out;
}

#define GPUQ_SELECT_JOBS(where)                                                                                   \
  ("SELECT id, batch, spec, state, attempt, reason, submitted_at, started_at, ended_at, exit_code, exit_signal, " \
   "gpus, master_port, not_before, cancel_requested, progress, result, after, bad_event_lines, first_failure, "   \
   "cpu_slots, cores, attempt_base, restarts, blocked_by, held, external_id, uid, first_bad_event, preemption, "  \
   "gpu_budget FROM "                                                                                             \
   "jobs " where)

std::vector<JobRecord> Store::load_active() {
  return query_jobs(prepare(GPUQ_SELECT_JOBS("WHERE state IN ('queued', 'running') ORDER BY id")));
}

std::optional<JobRecord> Store::get(std::int64_t id) {
  if (hidden(id)) return std::nullopt;
  auto* st = prepare(GPUQ_SELECT_JOBS("WHERE id=?"));
  sqlite3_bind_int64(st, 1, id);
  auto rows = query_jobs(st);
  if (rows.empty()) return std::nullopt;
  return std::move(rows[0]);
}

// A JobFilter in SQL, its parameters numbered from 10: a batch (0: any), states as ",a,b," ("":
// any) and a GLOB pattern ("": any); SQLite's GLOB is the shell's, as fnmatch in `matches`. ?13
// and ?14 bound the ids of a batch still being written, which no read sees.
#define GPUQ_JOB_FILTER                                                                                            \
  "(?10 = 0 OR batch = ?10) AND (?11 = '' OR instr(?11, ',' || state || ',') > 0) AND (?12 = '' OR name GLOB ?12)" \
  " AND id NOT BETWEEN ?13 AND ?14"

void Store::bind_filter(sqlite3_stmt* st, const common::JobFilter& f) const {
  std::string states;
  for (const auto s : f.states)
    states += "," + name_of(s);
  if (!states.empty()) states += ",";
  sqlite3_bind_int64(st, 10, f.batch);
  bind_text(st, 11, states);
  bind_text(st, 12, f.name);
  sqlite3_bind_int64(st, 13, m_unfinished ? m_unfinished->first : 1);  // 1..0: an empty range
  sqlite3_bind_int64(st, 14, m_unfinished ? m_unfinished->last : 0);
}

std::vector<JobRecord> Store::recent_finished(int limit, const common::JobFilter& f, const DetailsOf& details) {
  auto* st = prepare(
      GPUQ_SELECT_JOBS("WHERE state NOT IN ('queued', 'running') AND " GPUQ_JOB_FILTER " ORDER BY id DESC LIMIT ?1"));
  sqlite3_bind_int(st, 1, limit);
  bind_filter(st, f);
  auto rows = query_jobs(st, details);
  std::reverse(rows.begin(), rows.end());
  return rows;
}

std::vector<JobRecord> Store::page_after(std::int64_t after, int limit, const common::JobFilter& f,
                                         const DetailsOf& details) {
  auto* st = prepare(GPUQ_SELECT_JOBS("WHERE id > ?1 AND " GPUQ_JOB_FILTER " ORDER BY id LIMIT ?2"));
  sqlite3_bind_int64(st, 1, after);
  sqlite3_bind_int(st, 2, limit);
  bind_filter(st, f);
  return query_jobs(st, details);
}

bool Store::exists(std::int64_t id) {
  if (hidden(id)) return false;
  auto* st = prepare("SELECT 1 FROM jobs WHERE id=?");
  sqlite3_bind_int64(st, 1, id);
  const bool found = sqlite3_step(st) == SQLITE_ROW;
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return found;
}

std::optional<JobState> Store::state_of(std::int64_t id) {
  if (hidden(id)) return std::nullopt;
  auto* st = prepare("SELECT state FROM jobs WHERE id=?");
  sqlite3_bind_int64(st, 1, id);
  std::optional<JobState> state;
  if (sqlite3_step(st) == SQLITE_ROW) state = job_state_from_string(text(st, 0));
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return state;
}

std::vector<std::tuple<uid_t, double, double>> Store::gpu_time_since(double since) {
  auto* st = prepare(
      "SELECT uid, json_array_length(gpus) * (ended_at - started_at), ended_at FROM jobs "
      "WHERE ended_at > ? AND started_at > 0 AND ended_at > started_at AND gpus != '[]' ORDER BY ended_at");
  sqlite3_bind_double(st, 1, since);
  std::vector<std::tuple<uid_t, double, double>> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    out.emplace_back(static_cast<uid_t>(sqlite3_column_int64(st, 0)), sqlite3_column_double(st, 1),
                     sqlite3_column_double(st, 2));
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (rc != SQLITE_DONE) fail(m_db, "read GPU time");
  return out;
}

std::optional<uid_t> Store::owner_of(std::int64_t id) {
  if (hidden(id)) return std::nullopt;
  auto* st = prepare("SELECT uid FROM jobs WHERE id=?");
  sqlite3_bind_int64(st, 1, id);
  std::optional<uid_t> uid;
  if (sqlite3_step(st) == SQLITE_ROW) uid = static_cast<uid_t>(sqlite3_column_int64(st, 0));
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return uid;
}

std::vector<JobRecord> Store::batch_page(std::int64_t batch, std::int64_t after, int limit) {
  if (hidden_batch(batch)) return {};
  auto* st = prepare(GPUQ_SELECT_JOBS("WHERE batch=? AND id>? ORDER BY id LIMIT ?"));
  sqlite3_bind_int64(st, 1, batch);
  sqlite3_bind_int64(st, 2, after);
  sqlite3_bind_int(st, 3, limit);
  return query_jobs(st);
}

bool Store::batch_exists(std::int64_t batch) {
  if (hidden_batch(batch)) return false;
  auto* st = prepare("SELECT 1 FROM jobs WHERE batch=? LIMIT 1");
  sqlite3_bind_int64(st, 1, batch);
  const bool found = sqlite3_step(st) == SQLITE_ROW;
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return found;
}

std::vector<std::pair<std::int64_t, double>> Store::ended_of_batch(std::int64_t batch) {
  std::vector<std::pair<std::int64_t, double>> out;
  if (hidden_batch(batch)) return out;
  auto* st = prepare("SELECT id, ended_at FROM jobs WHERE batch=? AND state NOT IN ('queued', 'running') ORDER BY id");
  sqlite3_bind_int64(st, 1, batch);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    out.emplace_back(sqlite3_column_int64(st, 0), sqlite3_column_double(st, 1));
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (rc != SQLITE_DONE) fail(m_db, "read jobs");
  return out;
}

std::vector<JobRecord> Store::batch_jobs(std::int64_t batch) {
  if (hidden_batch(batch)) return {};
  auto* st = prepare(GPUQ_SELECT_JOBS("WHERE batch=? ORDER BY id"));
  sqlite3_bind_int64(st, 1, batch);
  return query_jobs(st);
}

bool Store::was_removed(std::int64_t id, bool batch) {
  // gpuq hands out ids in order without gaps, so a missing id at or below the highest removed one was removed.
  auto* st = prepare("SELECT max_id FROM removed_ids WHERE tbl=?");
  bind_text(st, 1, batch ? "batches" : "jobs");
  std::int64_t top = 0;
  if (sqlite3_step(st) == SQLITE_ROW) top = sqlite3_column_int64(st, 0);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (id <= 0 || id > top) return false;
  return batch ? batch_jobs(id).empty() : !get(id);
}

std::vector<JobRecord> Store::failed_waiting_for(std::int64_t id) {
  // `blocked_by != 0` restates the partial index's condition: SQLite cannot use the index for a
  // bound `?` alone, and a restart of a long failed chain made one full scan per job.
  auto* st = prepare(GPUQ_SELECT_JOBS("WHERE blocked_by=? AND blocked_by != 0 AND state='failed' ORDER BY id"));
  sqlite3_bind_int64(st, 1, id);
  return query_jobs(st);
}

std::vector<std::int64_t> Store::ended_before(double t) {
  auto* st = prepare("SELECT id FROM jobs WHERE state NOT IN ('queued', 'running') AND ended_at < ? ORDER BY id");
  sqlite3_bind_double(st, 1, t);
  std::vector<std::int64_t> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    out.push_back(sqlite3_column_int64(st, 0));
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (rc != SQLITE_DONE) fail(m_db, "read jobs");
  return out;
}

std::int64_t Store::count_jobs(const common::JobFilter& f) {
  std::int64_t n = 0;
  if (!f.empty() || !m_job_rows) {
    auto* st =
        f.empty() ? prepare("SELECT count(*) FROM jobs") : prepare("SELECT count(*) FROM jobs WHERE " GPUQ_JOB_FILTER);
    if (!f.empty()) bind_filter(st, f);
    if (sqlite3_step(st) == SQLITE_ROW) n = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    if (!f.empty()) return n;
    m_job_rows = n;
  }
  n = *m_job_rows;
  if (m_unfinished) n -= static_cast<std::int64_t>(m_unfinished->written);
  return n;
}

json Store::batch_env(std::int64_t batch) {
  auto* st = prepare("SELECT env FROM batches WHERE id=?");
  sqlite3_bind_int64(st, 1, batch);
  json env = json::object();
  if (sqlite3_step(st) == SQLITE_ROW) env = json::parse(text(st, 0), nullptr, false);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return env.is_object() ? env : json::object();
}

std::map<std::int64_t, int> Store::batch_limits() {
  auto* st = prepare("SELECT id, max_running FROM batches WHERE max_running > 0");
  std::map<std::int64_t, int> out;
  while (sqlite3_step(st) == SQLITE_ROW)
    out[sqlite3_column_int64(st, 0)] = sqlite3_column_int(st, 1);
  sqlite3_reset(st);
  return out;
}

}  // namespace gpuq::daemon
