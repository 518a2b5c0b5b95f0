// The durable state: every job, its spec, state transitions with timestamps, exit status,
// assigned GPUs, progress, result events and the event-file offsets already ingested, in one
// SQLite database (WAL) in the state dir. The daemon writes here before it acts, so a restart
// (or kill -9) loses nothing it acknowledged. Write failures throw RequestError(store_error); each
// multi-row change is one transaction, so the database is never half-updated.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/job_state.hpp"
#include "common/protocol.hpp"
#include "common/spec.hpp"

struct sqlite3;
struct sqlite3_stmt;

namespace gpuq::daemon {

using json = nlohmann::json;

// What a hook is run for: a job's end (on_finish) or its preemption (on_preempt).
enum class HookEvent : std::uint8_t { finish, preempt };
struct DueHook {
  std::int64_t id = 0;
  HookEvent event = HookEvent::finish;
  std::string by;  // a preemption's: who preempted it (its record says so only until it starts again)
  bool operator==(const DueHook&) const = default;
  bool operator<(const DueHook& o) const { return id != o.id ? id < o.id : event < o.event; }  // a job's event once
};

struct JobRecord {
  std::int64_t id = 0;
  std::int64_t batch = 0;
  uid_t uid = 0;  // its owner: who submitted it (in single-user mode, gpuqd's own user)
  common::JobSpec spec;
  JobState state = JobState::queued;
  int attempt = 0;
  std::string reason;
  double submitted_at = 0;
  // What the current (or last) attempt owns: set at its launch, filled in while it runs and when it
  // ends. A new attempt (a launch, a restart) starts from a default one: lifecycle.cpp's
  // clear_attempt.
  struct Attempt {
    double started_at = 0, ended_at = 0;
    std::optional<int> exit_code, exit_signal;
    std::vector<int> gpus;
    std::vector<int> cpu_slots;  // CPU-pool slots held; see scheduler.hpp
    // The cores its ranks were pinned to, ascending (empty: unpinned). Kept beside the slots
    // because the slot -> core mapping follows gpuqd's affinity mask, which a restart may change.
    std::vector<int> cores;
    int master_port = 0;
    bool cancel_requested = false;
    // Asked to stop and go back in line (gpuq requeue), no retry spent; stored as cancel_requested 2.
    // A cancel asked too wins.
    bool requeue_requested = false;
    // Asked to stop for a preemption (stored as cancel_requested 3; a cancel asked too wins): by
    // whom ("job 12 (urgent)", or "alice: gpuq preempt") and when. Both are kept in the queued
    // record the preemption makes, so that status and show say who preempted it until it starts.
    bool preempt_requested = false;
    std::string preempted_by;
    double preempted_at = 0;
    double checkpoint_at = 0;  // when it last reported a `checkpoint` event (0: never)
    // Suspended: frozen in place for job `suspended_for`'s attempt `suspended_for_attempt` (named
    // `suspended_by`), which runs on its CPU slots, since `suspended_at`; thawed once that attempt
    // has ended. 0: not suspended. `suspended_s`: seconds this attempt stood frozen before (its
    // timeout's clock stood still); `resumed_at`: when it was last thawed.
    std::int64_t suspended_for = 0;
    int suspended_for_attempt = 0;
    std::string suspended_by;
    double suspended_at = 0, suspended_s = 0, resumed_at = 0;
    json progress;       // last progress event
    json result;         // merged result events
    json first_failure;  // {rank, exit_code, signal} when it failed
    std::string external_id;  // the attempt's id in the system that ran it ("slurm:42"); "" here
    // Asked to stop and go back in line (requeue_requested) because it held more GPU memory than
    // its budget while its GPU's other jobs needed the room (gpu_budgets.hpp); why, for its reason.
    std::string over_budget;
  } run;
  // A shared job's GPU memory budget, where gpuq raised it from what its spec declares: the MiB
  // (0: the spec's `gpu_memory_mb`), why, and how many times. Kept from attempt to attempt, and
  // over a restart.
  struct GpuBudget {
    std::int64_t mb = 0;
    std::string why;
    int raises = 0;
    double at = 0;  // when it was last raised
    // The most GPU memory its processes held on one GPU in any attempt that ended, as NVML's
    // looks saw it (0: none seen): what its next attempts, and specs like it, may be sized by.
    std::int64_t peak_mb = 0;
    bool operator==(const GpuBudget&) const = default;
  } gpu_budget;
  double not_before = 0;  // retry backoff: not eligible before this time
  std::vector<std::int64_t> after;  // resolved dependency ids
  std::int64_t bad_event_lines = 0;
  std::string first_bad_event;  // the first of them, and why (events.hpp describe_bad_line); "" if none
  int attempt_base = 0;  // attempts before the latest restart; `retries` counts from there
  int restarts = 0;      // times it was restarted after it had ended
  int preemptions = 0;   // times it was preempted since it was submitted
  int suspensions = 0;   // times it was suspended (frozen in place for another job) since then
  std::int64_t blocked_by = 0;  // failed without running because this dependency ended unsuccessfully
  bool held = false;            // queued, kept from starting until released
  bool hook_due = false;        // not stored: it has just ended and has on_finish hooks to run (hooks.cpp)
  bool preempt_hook_due = false;  // not stored: it has just been preempted and has on_preempt hooks to run
  // Not stored: why its stored spec does not parse (a spec written by a later gpuq, or damaged);
  // "" when it does. Then `spec` is a default one holding only what could be read of the stored
  // one (its name and ranks, for status, logs and events), and the job can never run again:
  // lifecycle.cpp refuses it a launch, a retry and a restart, and recovery fails it if queued.
  std::string spec_error;
};

// The preemption fields of a record as stored (jobs.preemption), and back; a value that is not
// what preemption_json writes leaves the fields as they are.
json preemption_json(const JobRecord& j);
void read_preemption(JobRecord& j, const json& stored);
// The GPU memory budget fields (jobs.gpu_budget), likewise.
json gpu_budget_json(const JobRecord& j);
void read_gpu_budget(JobRecord& j, const json& stored);
// The GPU memory a shared job may hold on each of its GPUs: its raised budget, else its spec's
// `gpu_memory_mb` (0: none said).
inline std::int64_t gpu_budget_mb(const JobRecord& j) {
  return j.gpu_budget.mb > 0 ? j.gpu_budget.mb : j.spec.gpu_memory_mb;
}

struct EventRow {
  std::int64_t seq = 0;  // store order (rowid); 0 until stored
  int rank = 0;
  std::string type;
  double at = 0;
  json data;
};

// Test-only fault injection, so that every path's handling of a failed write can be walked
// (tests/integration/test_store_faults.py): write transactions fail as on a full disk.
// $GPUQ_TEST_STORE_FAULTS, read when the store opens: "N" fails the Nth write transaction, "N+"
// every one from the Nth on, "file:PATH" every one while PATH exists. Unset: no cost but a branch.
struct StoreFaults {
  std::int64_t writes = 0;   // write transactions begun so far
  std::int64_t fail_at = 0;  // 0: by count, none
  bool from_on = false;
  std::string while_exists;
  static StoreFaults from_env();
  bool next_fails();  // counts one write; true: it is to fail
};

class Store {
 public:
  // Opens or creates the database. Refuses a file that is not a gpuq database (never overwrites).
  static Result<std::unique_ptr<Store>> open(const std::string& path);
  ~Store();
  // The id the next job gets: past every job the store holds and every one it removed.
  std::int64_t next_job_id() { return next_id("jobs"); }
  // Records every job id up to `up_to` as removed, so that no new job takes one of them.
  void mark_job_ids_removed(std::int64_t up_to);
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Inserts a batch and its jobs in one transaction (insert_batch_part with no deadline); assigns batch and job ids (in order), never
  // one a removed job or batch had.
  // `resolve` maps batch-local dependency indices to ids once ids are known. `max_running`: how
  // many of its jobs may run at once (0: no limit).
  std::int64_t insert_batch(std::vector<JobRecord>& jobs, const std::vector<std::vector<std::size_t>>& local_deps,
                            const std::string& cwd, const json& env, double now, int max_running = 0);
  // A batch written in parts, one transaction each, so that a 100,000-job submit does not hold
  // gpuqd's thread for seconds. Each call writes jobs from w.written on until `deadline` passes
  // (one at least); the first part also writes the batch row and gives every job its id. Until
  // the last part commits, no read here sees the batch's jobs, and a batch that a crash left
  // unfinished is deleted when the store next opens. Returns true once the batch is complete.
  // One batch at a time: a new one (w.batch == 0) first discards one left unfinished.
  struct BatchWrite {
    std::int64_t batch = 0;    // 0 until the first part is written
    std::size_t written = 0;   // jobs written so far
  };
  bool insert_batch_part(BatchWrite& w, std::vector<JobRecord>& jobs,
                         const std::vector<std::vector<std::size_t>>& local_deps, const std::string& cwd,
                         const json& env, double now, int max_running, std::chrono::steady_clock::time_point deadline);
  // Deletes what was written of an unfinished batch (after one of its parts failed), if any.
  void discard_batch();
  // Writes the job's mutable columns; appends a transition row when `transition` is true.
  void update(const JobRecord& job, bool transition);
  // Several updates in one transaction, each with a transition whose reason is `why[i]` (the
  // job's own reason where `why` has none): restarting jobs with their dependents. `quiet`: more
  // rows written in the same transaction without a transition (a cancel's intent on running jobs).
  void update_many(const std::vector<const JobRecord*>& jobs, const std::vector<std::string>& why = {},
                   const std::vector<const JobRecord*>& quiet = {});

  // A restart written in parts, so that requeueing a failed 20,000-job chain does not hold gpuqd's
  // thread for half a second. `jobs`: the restart's jobs in the order they are requeued (each
  // after those it waits for), with the job each came along with (0: chosen itself); the first
  // `done` are written.
  struct RestartPlan {
    std::int64_t id = 0;  // its row while a restart of several parts is under way; 0: none stored
    std::vector<std::pair<std::int64_t, std::int64_t>> jobs;
    std::size_t done = 0;
  };
  // Writes the next part, plan.jobs[done, done + count): `rows` are their new records (fewer
  // where one is gone), each with a transition whose reason is `why[i]`, in one transaction that also records how far the plan is. The first
  // part of several stores the plan, a later one its progress, the last deletes it (a restart of
  // one part stores none): a restart that a crash cut short is finished at the next start
  // (unfinished_restarts). Throws store_error, having written nothing.
  void write_restart_part(RestartPlan& plan, const std::vector<const JobRecord*>& rows, const std::vector<std::string>& why,
                          std::size_t count);
  std::vector<RestartPlan> unfinished_restarts();

  // Rewrites the jobs' specs in one transaction, each with a transition whose reason is `why[i]`.
  // `why[i]`: the reason recorded with job i's transition (none past the end of `why`).
  void rewrite_specs(const std::vector<const JobRecord*>& jobs, const std::vector<std::string>& why);

  // GPUs out of service, by UUID (stable where indices are not): UUID -> reason.
  std::map<std::string, std::string> drained_gpus();
  void set_drained(const std::string& uuid, bool drained, const std::string& reason);

  std::vector<JobRecord> load_active();
  std::optional<JobRecord> get(std::int64_t id);
  bool exists(std::int64_t id);  // one index probe: no row is read
  std::optional<JobState> state_of(std::int64_t id);  // the state alone, without reading the row
  std::optional<uid_t> owner_of(std::int64_t id);     // its owner alone
  // Hooks (on_finish, on_preempt): a job whose record is written with hook_due (preempt_hook_due)
  // has those hooks due, in the same transaction; they are marked started before they run (so
  // that none runs twice, whatever crashes) and forgotten once they have ended.
  // `forget_started_hooks` at start: those a crash cut off run on by themselves (their supervisors
  // outlive gpuqd). One row a job and event: a job preempted twice before its hook's turn runs it
  // once.
  std::vector<DueHook> due_hooks();  // not started, of jobs still known; in job order
  void hooks_started(const DueHook& h);
  void hooks_done(const DueHook& h);  // forgets the row if started (one due again since stays)
  void forget_started_hooks();
  // (owner, GPU-seconds, ended at) of the last attempts of jobs that ran on GPUs and ended after
  // `since`, oldest end first: fair share's memory after a restart.
  std::vector<std::tuple<uid_t, double, double>> gpu_time_since(double since);
  // Whose jobs' details (progress, result, first failure) a read parses: a job's owner's. Each may
  // hold a MiB; another user's `status` has no use for them, and parsing 12 of them cost every
  // other user ~80 ms a status. Empty: everyone's.
  using DetailsOf = std::function<bool(uid_t owner)>;
  // The last `limit` ended jobs that `f` keeps, in id order.
  std::vector<JobRecord> recent_finished(int limit, const common::JobFilter& f = {}, const DetailsOf& details = {});
  // Up to `limit` jobs that `f` keeps with ids above `after`, in id order (keyset paging).
  std::vector<JobRecord> page_after(std::int64_t after, int limit, const common::JobFilter& f = {},
                                    const DetailsOf& details = {});
  std::vector<JobRecord> batch_jobs(std::int64_t batch);
  bool batch_exists(std::int64_t batch);  // it has jobs
  // The batch's ended jobs as (id, ended_at), in id order, without reading their records.
  std::vector<std::pair<std::int64_t, double>> ended_of_batch(std::int64_t batch);
  // Up to `limit` of the batch's jobs with ids above `after`, in id order (through its index).
  std::vector<JobRecord> batch_page(std::int64_t batch, std::int64_t after, int limit);
  // The ids of the jobs that ended before `t`, in id order.
  std::vector<std::int64_t> ended_before(double t);
  // Deletes ended jobs' records (job, history, events, event offsets) in one transaction, and
  // each batch left without jobs. Returns those batches. Ids not found are skipped.
  std::vector<std::int64_t> remove_jobs(const std::vector<std::int64_t>& ids);
  // Whether job (or batch) `id` existed and was removed, as against never having existed.
  bool was_removed(std::int64_t id, bool batch = false);
  // The jobs that failed without running because job `id` had ended without success.
  std::vector<JobRecord> failed_waiting_for(std::int64_t id);
  std::int64_t count_jobs(const common::JobFilter& f = {});
  // Gives back what SQLite caches that no statement is using (its page cache): before a heap trim.
  void release_memory();
  json batch_env(std::int64_t batch);
  // Batches' limits on running jobs: batch -> max_running, for those that have one.
  std::map<std::int64_t, int> batch_limits();
  void set_batch_limit(std::int64_t batch, int max_running);  // 0: no limit
  std::vector<common::Transition> history(std::int64_t id);

  // Event ingestion: offsets already read per (job, attempt, rank), and an atomic append of new
  // events with the job's updated progress/result and the new offset.
  std::int64_t event_offset(std::int64_t id, int attempt, int rank);
  void add_events(const JobRecord& job, int rank, std::int64_t new_offset, const std::vector<EventRow>& events);
  // One attempt's events in the order they were ingested: those with seq > `after`, at most
  // `limit`, only of `type` unless it is empty.
  std::vector<EventRow> events(std::int64_t id, int attempt, std::int64_t after = 0, int limit = -1,
                               const std::string& type = "");

 private:
  explicit Store(sqlite3* db);
  void exec(const char* sql);
  sqlite3_stmt* prepare(const char* sql);
  std::vector<JobRecord> query_jobs(sqlite3_stmt* st, const DetailsOf& details = {});
  std::int64_t next_id(const char* table);  // "jobs" or "batches": the id the next insert gets
  void write_job(const JobRecord& job);
  void write_transition(const JobRecord& job, double at, const std::string* reason = nullptr);
  static double transition_time(const JobRecord& job);
  // Each job's row and a transition whose reason is why[i] (its own reason where `why` has none),
  // inside the caller's transaction.
  void write_transitions(const std::vector<const JobRecord*>& jobs, const std::vector<std::string>& why);
  void bind_filter(sqlite3_stmt* st, const common::JobFilter& f) const;  // GPUQ_JOB_FILTER's parameters
  bool hidden(std::int64_t id) const;  // a job of the batch being written
  bool hidden_batch(std::int64_t batch) const;  // the batch being written

  struct Unfinished {  // the batch insert_batch_part is writing
    std::int64_t batch = 0, first = 0, last = 0;  // its id and its jobs' ids
    std::size_t written = 0;
  };
  std::optional<Unfinished> m_unfinished;
  // Rows in the jobs table, counted once (the first unfiltered count_jobs: a scan of the table)
  // and kept since by the writes that insert or delete jobs, each once its transaction committed:
  // `status` does not scan a long history for it.
  std::optional<std::int64_t> m_job_rows;

  sqlite3* m_db = nullptr;
  class Checkpointer;  // the log's checkpoints, off the writing thread (store.cpp)
  std::unique_ptr<Checkpointer> m_checkpointer;
  std::map<const char*, sqlite3_stmt*> m_stmts;  // keyed by the SQL literal's address
  StoreFaults m_faults;
};

// A job's id names its directory (jobs/<id>), so a store that does not know every directory there
// (gpuq.db lost, emptied, or restored from an older copy) would hand a new job an old job's id:
// its log appended to the old one, its checkpoints resumed from another job's. This refuses such
// a state dir, naming the directories and what to do; with `forget_unknown` it records their ids
// as removed instead (no new job takes them; the directories stay as they are) and says so.
// Returns what it did, for the log ("" when every directory is known).
Result<std::string> account_for_job_dirs(const std::string& state_dir, Store& store, bool forget_unknown);

}  // namespace gpuq::daemon
