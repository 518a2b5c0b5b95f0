// The Slurm executor (executor.hpp): each attempt is one Slurm job. start() writes a batch script
// into the attempt directory that runs gpuq-shim inside the allocation (so the exit record, logs
// and events are written as locally, whether or not Slurm keeps accounting), and hands it to
// sbatch. One squeue for all of gpuqd's jobs, every poll_s, is how gpuqd learns that they left
// Slurm's queue; a job that left without an exit record (cancelled while pending, killed by Slurm)
// gets one built from `scontrol show job`. Slurm's client commands can block for seconds when the
// controller is busy, so they run on a thread of the executor's own and their answers are posted
// back to gpuqd's loop: gpuqd's thread never waits on Slurm.
//
// The state dir must be on a filesystem the compute nodes see (the attempt directories are read
// and written on both sides), and gpuq-shim at a path they share.
//
// Longer than the ~600 lines a file is held to: it is one class behind executor.hpp's seam, whose
// parts (start and arrays, the squeue poll, adopt, stop, outcomes built from scontrol) share the
// table of handed-over jobs and the command thread; the batch script itself is common's
// (slurm_script.cpp). Array planning, which gpuqd's core still does, moves here next.
#include <sys/vfs.h>
#include <unistd.h>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "common/command.hpp"
#include "common/json_input.hpp"
#include "common/paths.hpp"
#include "common/process.hpp"
#include "common/slurm_script.hpp"
#include "daemon/executor.hpp"
#include "daemon/launcher.hpp"

namespace gpuq::daemon {

namespace asio = boost::asio;
using json = nlohmann::json;
using common::CommandResult;
using common::run_command;

namespace {

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// What Slurm said, on one line and not too long, for a job's reason.
std::string said(const CommandResult& r) {
  std::string text = trim(r.err.empty() ? r.out : r.err);
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  if (text.size() > 500) text = text.substr(0, 500) + "...";
  if (!r.started) return text;
  if (r.timed_out) return "no answer within the time allowed";
  return text.empty() ? "exit code " + std::to_string(r.exit_code) : text;
}

// "42", or an array's task "42_7".
bool is_job_id(const std::string& s) {
  if (s.empty() || s.size() > 32 || s.front() == '_' || s.back() == '_') return false;
  int underscores = 0;
  for (char c : s)
    if (c == '_' ? ++underscores > 1 : !std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// `scontrol -o show job` prints one line of Key=Value fields.
std::map<std::string, std::string> fields_of(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  for (std::string word; in >> word;)
    if (auto eq = word.find('='); eq != std::string::npos && eq > 0) out.emplace(word.substr(0, eq), word.substr(eq + 1));
  return out;
}

// Whether the record names a failing rank.
bool has_failure(const json& record) {
  const auto f = record.find("first_failure");
  return f != record.end() && f->is_object();
}

// How many supervisors an attempt has under Slurm: 0 for one (exit.json), or one a rank of a
// ddp gang (exit-R.json each, made by gpuq-shim --slurm-task).
int tasks_of(const common::JobSpec* spec) { return spec && spec->mode == common::Mode::ddp ? spec->ranks : 0; }

std::string task_record(const std::string& dir, int rank) { return dir + "/exit-" + std::to_string(rank) + ".json"; }

bool has_exit_record(const std::string& dir, int tasks) {
  if (tasks == 0) return common::path_exists(dir + "/exit.json");
  for (int r = 0; r < tasks; ++r)
    if (common::path_exists(task_record(dir, r))) return true;
  return false;
}

class SlurmExecutor final : public Executor {
 public:
  SlurmExecutor(asio::io_context& io, SlurmSettings settings, Ended ended)
      : m_io(io), m_settings(std::move(settings)), m_ended(std::move(ended)), m_poll_timer(io) {
    // The compute nodes write the attempt directories: say so at once when they cannot see them.
    struct statfs fs {};
    if (::statfs(m_settings.state_dir.c_str(), &fs) == 0) {
      m_state_fs = filesystem_kind(static_cast<long>(fs.f_type));
      if (m_state_fs.local)
        std::cerr << "gpuqd: warning: the state dir " << m_settings.state_dir << " is on a local filesystem ("
                  << m_state_fs.name << "); Slurm's compute nodes write each attempt's files there, so unless "
                  << "every node is this machine, give a --state-dir on the cluster's shared filesystem\n";
    }
    m_max_array = max_array_size();
  }

  ~SlurmExecutor() override {
    *m_alive = false;  // answers still on their way find no executor
    m_pool.join();
  }

  bool places_work() const override { return true; }
  std::string containment() const override {
    return "Slurm (its proctrack and task plugins, as the cluster sets them; see docs/slurm.md)";
  }
  bool inherits_environment() const override { return true; }

  Result<bool> start(const Attempt& attempt) override { return start_array({attempt}, 0); }

  // Every ready job goes to Slurm now; first attempts of one batch whose batch scripts would differ
  // only in their directory go as one job array (array_key), at most max_array_size() to an array.
  std::optional<Handover> place(const std::vector<PendingJob>& queue, const BatchLimits& limits,
                                const FirstAttempt& first) const override {
    return hand_over(
        queue, limits,
        [&](const PendingJob& job) {
          const auto attempt = job.batch != 0 ? first(job) : std::nullopt;
          return attempt ? array_key(*attempt) : std::string();
        },
        m_max_array);
  }

  // A job may wait in Slurm for a dependency that Slurm knows (afterok:ID).
  bool follows(std::int64_t dep) const override { return !external_id(dep).empty(); }

  // One sbatch: a job, or an array of jobs whose index picks the attempt directory.
  Result<bool> start_array(const std::vector<Attempt>& attempts, int limit) override {
    if (attempts.empty()) return true;
    for (const auto& a : attempts)
      if (!a.spec) return Error{ErrorCode::internal, "the Slurm executor needs the job's spec"};
    const Attempt& first = attempts.front();
    const bool array = attempts.size() > 1;
    const std::string script = first.dir + (array ? "/slurm-array.sbatch" : "/slurm.sbatch");
    const std::vector<std::string> options = sbatch_argv(attempts, limit);
    if (auto w = common::write_file_atomic(script, batch_script(attempts, options)); !w) return w.error();
    const std::uint64_t key = m_next_handover++;
    Sbatch& h = m_handovers[key];
    h.script = script;
    h.options = options;
    h.comment_dir = first.dir;
    h.array = array;
    for (std::size_t i = 0; i < attempts.size(); ++i) {
      const Attempt& a = attempts[i];
      // An attempt taken back (withdraw()) starts again in the same directory: nothing of its
      // earlier hand-over may read as this one's end.
      const int tasks = tasks_of(a.spec);
      for (int r = 0; r < std::max(1, tasks); ++r)
        ::unlink((tasks == 0 ? a.dir + "/exit.json" : task_record(a.dir, r)).c_str());
      ::unlink((a.dir + "/slurm.id").c_str());
      ::unlink((a.dir + "/slurm.array").c_str());
      ::unlink((a.dir + "/" + common::k_stop_file).c_str());
      // How a restarted gpuqd finds its array task when it stopped before writing slurm.id.
      if (array) (void)common::write_file_atomic(a.dir + "/slurm.array", std::to_string(i) + "\n" + first.dir);
      Job& job = m_jobs[a.id];
      job = Job{};
      job.dir = a.dir;
      job.tasks = tasks;
      job.handover = key;
      job.index = i;
      h.members.push_back(a.id);
    }
    submit(key, false);
    return true;
  }

  Found adopt(const Attempt& attempt) override {
    // The job can write its attempt directory, slurm.id and slurm.array included: an id read there
    // is taken only if Slurm lists that job as gpuqd's user's, with this attempt's comment (else a
    // job could have gpuqd cancel another Slurm job, of any user where gpuqd runs as root).
    const std::string array = read_small(attempt.dir + "/slurm.array", 8192);  // "INDEX\nFIRST_DIR"
    const auto nl = array.find('\n');
    const bool in_array = nl != std::string::npos && is_job_id(array.substr(0, nl));
    const std::string comment_dir = in_array ? array.substr(nl + 1) : attempt.dir;
    std::string slurm_id = trim(read_small(attempt.dir + "/slurm.id"));
    if (!slurm_id.empty() && listed_as_ours(slurm_id, comment_dir) == false) {
      std::cerr << "gpuqd: job " << attempt.id << ": its slurm.id names Slurm job " << slurm_id.substr(0, 32)
                << ", which Slurm lists as another user's or another attempt's; ignored\n";
      slurm_id.clear();
    }
    if (slurm_id.empty()) {  // gpuqd stopped before writing it: the job whose comment names it
      if (in_array) {
        if (const std::string base = find_by_comment(comment_dir); !base.empty()) slurm_id = base + "_" + array.substr(0, nl);
      } else {
        slurm_id = find_by_comment(attempt.dir);
      }
    }
    if (is_job_id(slurm_id)) {
      Job& job = m_jobs[attempt.id];
      job = Job{};
      job.dir = attempt.dir;
      job.slurm_id = slurm_id;
      job.tasks = tasks_of(attempt.spec);
      job.state = "adopted";
      job.handles_preempt = launched_with_preempt(attempt.dir);
      std::cerr << "gpuqd: re-adopted job " << attempt.id << " (Slurm job " << slurm_id << ")\n";
      arm_poll();
      return Found::alive;
    }
    return has_exit_record(attempt.dir, tasks_of(attempt.spec)) ? Found::ended : Found::never_started;
  }

  void stop(std::int64_t id) override {
    auto it = m_jobs.find(id);
    if (it == m_jobs.end()) return;
    it->second.cancel = true;
    if (!it->second.slurm_id.empty()) {
      cancel_in_slurm(id, it->second);
    } else if (waiting(it->second)) {  // waiting to ask sbatch again: nothing of it is in Slurm
      end_unsubmitted(id, json{{"cancelled", true}, {"error", "cancelled before Slurm took it"}});
    }  // else once sbatch answers
  }

  // A preemption, as a cancel (cancel_in_slurm) with the preemption's signal: a single job's
  // supervisor gets SIGUSR1; a gang's get SIGURG with `preempt` in the stop file they read. A
  // supervisor without a `preempt` block (an earlier gpuqd's: SIGUSR1 would kill it) is stopped.
  void preempt(std::int64_t id, double grace_s) override {
    auto it = m_jobs.find(id);
    if (it == m_jobs.end()) return;
    Job& job = it->second;
    // A job squeue last saw pending may have started since (gpuqd preempts only jobs it counts as
    // running): signalled all the same, and scancel'd where Slurm refuses (pending after all).
    if (job.slurm_id.empty() || job.cancel || !job.handles_preempt) return stop(id);
    job.cancel = true;
    cancel_in_slurm(id, job, true, grace_s);
  }

  void set_array_limit(const std::vector<std::int64_t>& handed, int limit) override {
    std::set<std::string> arrays;
    int alone = 0;
    for (std::int64_t id : handed) {
      auto it = m_jobs.find(id);
      if (it == m_jobs.end() || it->second.slurm_id.empty()) continue;  // sbatch has yet to answer
      const auto bar = it->second.slurm_id.find('_');
      if (bar == std::string::npos) ++alone;
      else arrays.insert(it->second.slurm_id.substr(0, bar));
    }
    if (arrays.empty()) return;
    // Exact for one array beside jobs alone; several arrays get at least one task at once each.
    const int share = limit <= 0 ? 0 : std::max(1, (limit - alone) / static_cast<int>(arrays.size()));
    for (const auto& array : arrays)
      run_off_thread({"scontrol", "update", "JobId=" + array, "ArrayTaskThrottle=" + std::to_string(share)},
                     [array](CommandResult r) {
                       if (!r.started || r.exit_code != 0)
                         std::cerr << "gpuqd: Slurm array " << array << " keeps its limit: " << said(r) << "\n";
                     });
  }

  void withdraw(std::int64_t id) override {
    auto it = m_jobs.find(id);
    if (it == m_jobs.end() || it->second.cancel || it->second.withdraw) return;
    Job& job = it->second;
    if (waiting(job)) {  // waiting to ask sbatch again: nothing of it is in Slurm
      end_unsubmitted(id, json{{"withdrawn", true}});
      return;
    }
    if (!job.slurm_id.empty() && job.state != "PENDING" && job.state != "adopted") return;  // it runs
    job.withdraw = true;  // scancel now if pending, once sbatch or squeue says so otherwise
    pull_back(job);
  }

  Outcome outcome(const Attempt& attempt) override {
    json out;
    if (auto it = m_outcomes.find(attempt.id); it != m_outcomes.end()) {
      out = std::move(it->second);
      m_outcomes.erase(it);
    } else {
      out = exit_record(attempt.dir, tasks_of(attempt.spec));
    }
    // The Slurm job it ended as; one that ended while no gpuqd ran is named by its slurm.id.
    std::string slurm_id;
    if (auto it = m_ended_ids.find(attempt.id); it != m_ended_ids.end()) {
      slurm_id = it->second;
      m_ended_ids.erase(it);
    } else {
      slurm_id = trim(read_small(attempt.dir + "/slurm.id"));
    }
    if (is_job_id(slurm_id)) out["external_id"] = "slurm:" + slurm_id;
    Outcome o = Outcome::from_record(out);
    if (m_out_of_memory.erase(attempt.id)) o.oom_kills = 1;
    if (m_preempted.erase(attempt.id)) o.preempted_by = "Slurm";
    // It may have waited in Slurm's queue: the job ran from when its first rank's supervisor began.
    if (const auto s = out.find("started_at"); s != out.end() && s->is_number()) o.began_at = s->get<double>();
    return o;
  }

  bool started(std::int64_t id) const override {
    auto it = m_jobs.find(id);
    return it != m_jobs.end() && !it->second.slurm_id.empty() && it->second.state != "PENDING";
  }

  std::string external_id(std::int64_t id) const override {
    auto it = m_jobs.find(id);
    return it == m_jobs.end() || it->second.slurm_id.empty() ? std::string() : "slurm:" + it->second.slurm_id;
  }

  // The attempt's exit record: its supervisor's, or its `tasks` ranks' merged.
  static json exit_record(const std::string& dir, int tasks) {
    if (tasks == 0) return read_exit_record(dir + "/exit.json");
    std::vector<json> records;
    for (int r = 0; r < tasks; ++r) records.push_back(read_exit_record(task_record(dir, r), k_max_task_record));
    return merge_task_records(records);
  }

  std::string detail(std::int64_t id) const override {
    auto it = m_jobs.find(id);
    if (it == m_jobs.end()) return {};
    const Job& j = it->second;
    if (j.slurm_id.empty()) {
      auto h = m_handovers.find(j.handover);
      return h != m_handovers.end() && h->second.tries ? "handing it to Slurm (" + h->second.said + ")"
                                                       : "handing it to Slurm (sbatch)";
    }
    std::string out = "Slurm job " + j.slurm_id;
    if (j.state == "PENDING") out += " pending" + (j.reason.empty() || j.reason == "None" ? "" : ": " + j.reason);
    else if (!j.state.empty() && j.state != "RUNNING" && j.state != "adopted") out += " " + j.state;
    return out;
  }

 private:
  struct Job {
    std::string dir;
    int tasks = 0;         // tasks_of() its spec
    std::string slurm_id;  // empty until sbatch answers
    std::string state, reason;  // as squeue last said
    bool cancel = false;        // stop() asked before sbatch answered
    std::uint64_t handover = 0;  // its sbatch, until that answers
    std::size_t index = 0;       // ... and its index there
    bool withdraw = false;      // withdraw() asked, and it had not started
    bool withdrawn = false;     // ... and scancel went out while Slurm still held it pending
    std::unique_ptr<asio::steady_timer> end_after_grace;  // cancelled: scancel once the grace is over
    bool handles_preempt = true;  // its launch document has `preempt` (one an earlier gpuqd wrote may not)
  };

  // Attempts whose batch scripts differ only in their directory: the same sbatch options (but the
  // name and output), the same shape of gang, the same dependencies; they may go as one array.
  std::string array_key(const Attempt& a) const {
    if (!a.spec) return {};
    std::string key = a.spec->mode == common::Mode::ddp ? "ddp " + std::to_string(a.spec->ranks) : "one";
    for (const auto& opt : common::sbatch_options(*a.spec, m_settings.options, layout_of(a, "")))
      if (opt.rfind("--job-name=", 0) != 0 && opt.rfind("--output=", 0) != 0) key += "\n" + opt;
    return key + "\nafter" + slurm_after(a);
  }

  // How many jobs one array may hold here: Slurm's MaxArraySize less one (indices 0 to N-1),
  // at most 1,000 (one script names every task's directory); 1 where arrays are off (0). Asked
  // once, at start (bounded): a cluster whose controller does not answer keeps Slurm's default.
  static std::size_t max_array_size() {
    CommandResult r = run_command({"scontrol", "show", "config"}, 10, 1 << 20);
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("MaxArraySize", 0) != 0) continue;
      const auto eq = line.find('=');
      const std::string value = eq == std::string::npos ? std::string() : trim(line.substr(eq + 1));
      if (!is_job_id(value) || value.find('_') != std::string::npos) break;
      const long n = std::stol(value.substr(0, 9));
      return static_cast<std::size_t>(std::clamp(n - 1, 1L, 1000L));
    }
    std::cerr << "gpuqd: Slurm's MaxArraySize is unknown (" << (r.exit_code == 0 ? "not in scontrol show config" : said(r))
              << "); arrays of up to 1000 jobs, as Slurm's default allows\n";
    return 1000;
  }

  // One sbatch: a job, or an array of them (start_array). Its members have no Slurm id until
  // sbatch answers.
  struct Sbatch {
    std::string script, comment_dir;   // the batch script; the directory its --comment names
    std::vector<std::string> options;   // sbatch's options, on its command line (sbatch_argv)
    std::vector<std::int64_t> members;  // by array index; 0: ended before sbatch answered
    bool array = false;
    int tries = 0;                      // sbatch calls the controller did not answer
    std::string said;                   // the last one's answer, and when it is asked again
    std::unique_ptr<asio::steady_timer> retry;  // until then
    bool waiting = false;               // on that timer
  };

  bool waiting(const Job& job) const {
    auto h = m_handovers.find(job.handover);
    return h != m_handovers.end() && h->second.waiting;
  }

  // Ends a job whose sbatch waits to be asked again: nothing of it is in Slurm. Its index in an
  // array that is submitted later is cancelled as soon as Slurm has it.
  void end_unsubmitted(std::int64_t id, json outcome) {
    auto it = m_jobs.find(id);
    auto h = m_handovers.find(it->second.handover);
    h->second.members[it->second.index] = 0;
    if (std::all_of(h->second.members.begin(), h->second.members.end(), [](std::int64_t m) { return m == 0; }))
      m_handovers.erase(h);  // its timer, destroyed, calls back with operation_aborted
    m_jobs.erase(it);
    m_outcomes[id] = std::move(outcome);
    asio::post(m_io, [this, id] { m_ended(id); });
  }

  // A job to withdraw leaves Slurm while it is pending; one that started meanwhile is left to run.
  void pull_back(Job& job) {
    if (!job.withdraw || job.withdrawn || job.state == "adopted" || job.slurm_id.empty()) return;
    if (job.state != "PENDING") {
      job.withdraw = false;
      return;
    }
    job.withdrawn = true;
    scancel(job.slurm_id);
  }

  static constexpr int k_sbatch_tries = 9;  // 1 + 2 + 4 + ... + 60 + 60: about five minutes

  // sbatch's failure says the controller was not reached (or did not answer), not that it refused.
  static bool unreachable(const CommandResult& r) {
    if (r.timed_out) return true;
    if (!r.started) return false;  // sbatch itself is missing: asking again changes nothing
    for (const char* words : {"Unable to contact slurm controller", "Socket timed out", "temporarily unavailable",
                              "Zero Bytes were transmitted", "Connection refused"})
      if (r.err.find(words) != std::string::npos) return true;
    return false;
  }

  // The Slurm ids of the attempt's dependencies, as --dependency=afterok takes them: ":41:42".
  std::string slurm_after(const Attempt& a) const {
    std::string after;
    for (std::int64_t dep : a.after)
      if (auto d = m_jobs.find(dep); d != m_jobs.end() && !d->second.slurm_id.empty()) after += ":" + d->second.slurm_id;
    return after;
  }

  // gpuq-shim enforces the timeout and its grace period itself and records `timed_out`; Slurm's
  // limit, a minute past both, only backs it up.
  common::SbatchLayout layout_of(const Attempt& a, std::string output) const {
    common::SbatchLayout layout{std::move(output), -1, true};
    // A preemptible job's SIGUSR1 (--signal=B:USR1@30) comes 30 s before the limit, and up to a
    // minute earlier (Slurm's granularity): a minute more keeps it after gpuq-shim's own timeout.
    if (a.spec->timeout_s > 0)
      layout.time_minutes =
          static_cast<long>(std::ceil((a.spec->timeout_s + m_settings.grace_s) / 60.0)) + (a.spec->preemptible ? 2 : 1);
    return layout;
  }

  // The sbatch options of one job, or of an array (attempts of one array_key()), for sbatch's
  // command line, where a value holding spaces or '#' (a working directory, the state dir's path)
  // arrives as it is; as #SBATCH lines it would be split, or pick options of its own.
  std::vector<std::string> sbatch_argv(const std::vector<Attempt>& attempts, int limit) const {
    const Attempt& a = attempts.front();
    const bool array = attempts.size() > 1;
    // An array's task writes into its attempt directory, as a job does, once its script runs;
    // Slurm's own output file would be one pattern for all (and a directory `gpuq clean` may
    // remove while other tasks run), so slurmstepd's few words about a task are not kept: its
    // state and reason are, in the record (account_for).
    const auto layout = layout_of(a, array ? "/dev/null" : a.dir + "/slurm.out");
    auto out = common::sbatch_options(*a.spec, m_settings.options, layout);
    if (array) out.push_back("--array=0-" + std::to_string(attempts.size() - 1) + (limit > 0 ? "%" + std::to_string(limit) : ""));
    // How a restarted gpuqd finds this job when it stopped before writing slurm.id.
    out.push_back("--comment=gpuq:" + a.dir);
    if (const std::string after = slurm_after(a); !after.empty()) out.push_back("--dependency=afterok" + after);
    return out;
  }

  // One job's script, or an array's: each array task runs the attempt its SLURM_ARRAY_TASK_ID
  // picks. Its options go on sbatch's command line (`options`, named in a comment here).
  std::string batch_script(const std::vector<Attempt>& attempts, const std::vector<std::string>& options) const {
    const Attempt& a = attempts.front();
    const common::JobSpec& spec = *a.spec;
    const bool ddp = spec.mode == common::Mode::ddp, array = attempts.size() > 1;
    std::ostringstream s;
    // The user's login environment on the node (PATH, modules), which Slurm loads itself under
    // --export=NONE, with the job's own variables over it (launch.json); not the environment gpuqd
    // was started with. (`bash -l` would run the profile a second time: ~0.1 s a job, and more
    // where a profile initialises conda or pyenv.)
    s << "#!/bin/bash\n# gpuqd submits this with: sbatch --parsable";
    for (const auto& opt : options) {
      std::string shown = common::shell_quote(opt);
      for (char& c : shown)
        if (c == '\n' || c == '\r') c = ' ';  // a comment of one line
      s << " " << shown;
    }
    s << " FILE\n";
    std::string launch = common::shell_quote(a.dir + "/launch.json");
    if (array) {
      s << "dirs=(";
      for (const auto& m : attempts) s << "\n  " << common::shell_quote(m.dir);
      s << ")\ndir=${dirs[$SLURM_ARRAY_TASK_ID]}\nexec >>\"$dir/slurm.out\" 2>&1\n";
      launch = "\"$dir/launch.json\"";
    }
    const std::string shim = common::shell_quote(m_settings.shim_path) + " " + launch;
    if (!ddp) {
      s << "exec " << shim << "\n";
      return s.str();
    }
    // A gang: srun starts one supervisor per rank on the nodes Slurm gave, each with Slurm's
    // placement (--slurm-task); the first to fail ends the others, as locally. The job's exit
    // status (what --dependency=afterok reads) is then the ranks' records' word, not srun's: a
    // timed-out or cancelled rank's supervisor ends 0, so that srun leaves the others their
    // grace period.
    const int nodes = std::max(1, spec.nodes);
    s << common::rendezvous_exports();
    const std::string srun = "srun --export=ALL --kill-on-bad-exit=1 --ntasks=" + std::to_string(spec.ranks) +
                             " --ntasks-per-node=" + std::to_string(spec.ranks / nodes) + " " + shim + " --slurm-task";
    if (!spec.preemptible) {
      s << srun << "\n";
    } else {
      // Slurm's preemption comes to this shell alone (--signal=B:USR1): it passes it on to the
      // ranks' supervisors as gpuq's own preemption does (preempt() below), and waits on for srun.
      // srun runs in the background, so that the trap runs at once, not once srun has ended.
      if (!array) s << "dir=" << common::shell_quote(a.dir) << "\n";
      // The stop file appears whole (a supervisor looking at that moment reads `preempt` or nothing).
      const std::string stop = "\"$dir/" + std::string(common::k_stop_file) + "\"";
      s << "trap 'echo preempt >" << stop.substr(0, stop.size() - 1) << ".new\" && mv -f "
        << stop.substr(0, stop.size() - 1) << ".new\" " << stop << "; scancel --signal=URG \"$SLURM_JOB_ID\"' USR1\n";
      s << srun << " &\nsrun_pid=$!\n";
      s << "while ! wait \"$srun_pid\" && kill -0 \"$srun_pid\" 2>/dev/null; do :; done\n";
    }
    s << "exec " << shim << " --slurm-outcome\n";
    return s.str();
  }

  // Runs a Slurm command on the executor's thread; `then` runs on gpuqd's with the answer.
  void run_off_thread(std::vector<std::string> argv, std::function<void(CommandResult)> then) {
    asio::post(m_pool, [this, alive = m_alive, argv = std::move(argv), then = std::move(then)]() mutable {
      CommandResult r = run_command(argv);
      asio::post(m_io, [alive, r = std::move(r), then = std::move(then)]() mutable {
        if (*alive) then(std::move(r));
      });
    });
  }

  // sbatch for a hand-over, off gpuqd's thread. `again`: an earlier sbatch got no answer, and
  // may have submitted the job all the same: the job whose comment names it is taken first.
  void submit(std::uint64_t key, bool again) {
    const Sbatch& h = m_handovers.at(key);
    asio::post(m_pool, [this, alive = m_alive, key, script = h.script, options = h.options, dir = h.comment_dir, again] {
      CommandResult r;
      if (again) {
        const auto listed = jobs_by_comment();
        if (auto found = listed.find(dir); found != listed.end()) {
          r.started = true;
          r.exit_code = 0;
          r.out = found->second;
        }
      }
      if (!r.started) {
        std::vector<std::string> argv{"sbatch", "--parsable"};
        argv.insert(argv.end(), options.begin(), options.end());
        argv.push_back(script);
        r = run_command(argv);
      }
      asio::post(m_io, [this, alive, key, r = std::move(r)] {
        if (*alive) submitted(key, r);
      });
    });
  }

  void submitted(std::uint64_t key, const CommandResult& r) {
    auto hit = m_handovers.find(key);
    if (hit == m_handovers.end()) return;
    Sbatch& h = hit->second;
    const std::string slurm_id = trim(r.out.substr(0, r.out.find(';')));  // "42" or "42;cluster"
    if (!r.started || r.timed_out || r.exit_code != 0 || !is_job_id(slurm_id) || slurm_id.find('_') != std::string::npos) {
      const bool wanted = std::any_of(h.members.begin(), h.members.end(),
                                      [&](std::int64_t m) { return m != 0 && !m_jobs.at(m).cancel; });
      if (unreachable(r) && wanted && h.tries < k_sbatch_tries) {
        // The controller is down or busy (restarting, failing over): ask again, a little later
        // each time, for about five minutes, before the attempt fails.
        const int delay_s = std::min(60, 1 << h.tries++);
        h.said = "sbatch: " + said(r) + "; trying again in " + std::to_string(delay_s) + " s";
        h.retry = std::make_unique<asio::steady_timer>(m_io, std::chrono::seconds(delay_s));
        h.waiting = true;
        h.retry->async_wait([this, key](const boost::system::error_code& ec) {
          auto again = m_handovers.find(key);
          if (ec || again == m_handovers.end()) return;
          again->second.waiting = false;  // sbatch runs again: a cancel from now on waits for its answer
          submit(key, true);
        });
        return;
      }
      // Refused (an unknown partition, more GPUs than any node has...): the attempt fails now,
      // with Slurm's words, and nothing is left queued anywhere. Another attempt would be refused
      // the same way, so none is made; a controller that never answered fails it as retryable.
      json out{{"error", (unreachable(r) ? "Slurm did not take the job: " : "Slurm refused the job: ") + said(r)}};
      if (!unreachable(r)) out["final"] = true;
      const std::vector<std::int64_t> members = std::move(h.members);
      m_handovers.erase(hit);
      for (std::int64_t m : members)
        if (m != 0) {
          m_jobs.erase(m);
          m_outcomes[m] = out;
        }
      for (std::int64_t m : members)
        if (m != 0) m_ended(m);
      return;
    }
    const Sbatch done = std::move(h);
    m_handovers.erase(hit);
    std::vector<std::int64_t> handed;
    for (std::size_t i = 0; i < done.members.size(); ++i) {
      const std::string id = done.array ? slurm_id + "_" + std::to_string(i) : slurm_id;
      auto it = done.members[i] == 0 ? m_jobs.end() : m_jobs.find(done.members[i]);
      if (it == m_jobs.end()) {  // ended while sbatch was asked again
        scancel(id);
        continue;
      }
      Job& job = it->second;
      job.handover = 0;
      job.slurm_id = id;
      job.state = "PENDING";
      if (auto w = common::write_file_atomic(job.dir + "/slurm.id", id + "\n"); !w)
        std::cerr << "gpuqd: Slurm job " << id << ": " << w.error().message << "\n";
      if (job.cancel) cancel_in_slurm(it->first, job);
      pull_back(job);
      if (!job.cancel) handed.push_back(it->first);
    }
    if (m_handed)
      for (std::int64_t id : handed) m_handed(id);
    arm_poll();
  }

  // A cancel, as gpuq-shim gives one locally: a signal to the job's supervisors, which pass
  // SIGTERM to the ranks and SIGKILL them only after the grace period, then scancel for whatever
  // is left. A plain scancel would also reach the batch step, whose srun answers SIGTERM by
  // SIGKILLing every task at once ("srun: forcing job termination"): a rank's
  // checkpoint-on-SIGTERM lost. A single job's supervisor is the batch step itself (`exec
  // gpuq-shim`), which --batch signals alone: SIGTERM. A gang's are srun's tasks (the steps
  // scancel signals by default), and Slurm may signal every process of a step one at a time
  // (proctrack/linuxproc): SIGTERM could kill a rank's child first and end the rank before its
  // own handler ran. They get SIGURG, which the ranks ignore and their supervisors take as a stop.
  // `preempt`: a preemption (preempt()), the same way: SIGUSR1 to a single job's supervisor, and
  // `preempt` in a gang's stop file; its grace `grace_s` (a cancel's: gpuqd's grace_s).
  void cancel_in_slurm(std::int64_t id, Job& job, bool preempt = false, double grace_s = -1) {
    // Even a job squeue last saw pending may have started since: it is signalled all the same,
    // and where Slurm refuses the signal (pending after all, or already gone) scancel follows.
    const std::string slurm_id = job.slurm_id;
    std::vector<std::string> argv{"scancel"};
    if (job.tasks == 0) {
      argv.insert(argv.end(), {preempt ? "--signal=USR1" : "--signal=TERM", "--batch"});
    } else {
      // A supervisor not yet catching SIGURG (srun still starting it, or the step not made yet)
      // would lose it: the file, written first, tells it once it does.
      if (auto w =
              common::write_file_atomic(job.dir + "/" + common::k_stop_file, preempt ? "preempt\n" : "gpuq cancel\n");
          !w)
        std::cerr << "gpuqd: Slurm job " << slurm_id << ": " << w.error().message << "\n";
      argv.push_back("--signal=URG");
    }
    argv.push_back(slurm_id);
    run_off_thread(std::move(argv), [this, slurm_id](CommandResult r) {
      if (!r.started || r.exit_code != 0) scancel(slurm_id);  // pending after all, or gone: end it plainly
    });
    end_after_grace(id, job, grace_s >= 0 ? grace_s : m_settings.grace_s);
  }

  // Whatever is left of a job its supervisors were asked to stop goes once their grace is over.
  void end_after_grace(std::int64_t id, Job& job, double grace_s) {
    job.end_after_grace = std::make_unique<asio::steady_timer>(
        m_io, std::chrono::milliseconds(static_cast<long long>((grace_s + k_cancel_slack_s) * 1000)));
    job.end_after_grace->async_wait([this, id, slurm_id = job.slurm_id](const boost::system::error_code& ec) {
      auto it = m_jobs.find(id);
      if (!ec && it != m_jobs.end() && it->second.slurm_id == slurm_id) scancel(slurm_id);
    });
  }
  // Past the grace period, the time a supervisor takes to notice, kill and write its record.
  static constexpr double k_cancel_slack_s = 5;

  void scancel(const std::string& slurm_id) {
    run_off_thread({"scancel", slurm_id}, [slurm_id](CommandResult r) {
      if (!r.started || r.exit_code != 0)
        std::cerr << "gpuqd: scancel " << slurm_id << ": " << said(r) << "\n";
    });
  }

  void arm_poll() {
    if (m_poll_armed) return;
    m_poll_armed = true;
    m_poll_timer.expires_after(std::chrono::milliseconds(static_cast<long long>(m_settings.poll_s * 1000)));
    m_poll_timer.async_wait([this](const boost::system::error_code& ec) {
      m_poll_armed = false;
      if (!ec) poll();
    });
  }

  // One squeue for every job of this user; those of ours it no longer lists have ended.
  void poll() {
    if (m_polling) return;
    std::map<std::string, std::int64_t> asked;  // Slurm id -> gpuq job, known before squeue runs
    for (const auto& [id, job] : m_jobs)
      if (!job.slurm_id.empty()) asked.emplace(job.slurm_id, id);
    if (asked.empty()) return;
    m_polling = true;
    const std::string user = std::to_string(::getuid());
    asio::post(m_pool, [this, alive = m_alive, asked, user] {
      // -r: an array's tasks one a line ("42_7"), pending ones too
      CommandResult r = run_command({"squeue", "-h", "-r", "-u", user, "-o", "%i|%T|%r"});
      std::map<std::string, std::pair<std::string, std::string>> listed;  // id -> (state, reason)
      if (r.started && r.exit_code == 0) {
        std::istringstream in(r.out);
        for (std::string line; std::getline(in, line);) {
          auto a = line.find('|'), b = line.find('|', a == std::string::npos ? a : a + 1);
          if (a == std::string::npos || b == std::string::npos) continue;
          listed[line.substr(0, a)] = {line.substr(a + 1, b - a - 1), line.substr(b + 1)};
        }
      }
      std::set<std::string> ended;
      if (r.started && r.exit_code == 0)
        for (const auto& [slurm_id, id] : asked)
          if (!listed.count(slurm_id)) ended.insert(slurm_id);
      asio::post(m_io, [this, alive, r, asked, listed = std::move(listed), ended = std::move(ended)]() mutable {
        if (!*alive) return;
        m_polling = false;
        polled(r, asked, listed, ended);
      });
    });
  }

  void polled(const CommandResult& r, const std::map<std::string, std::int64_t>& asked,
              const std::map<std::string, std::pair<std::string, std::string>>& listed,
              const std::set<std::string>& ended) {
    if (!r.started || r.exit_code != 0) {
      if (!m_squeue_failing) std::cerr << "gpuqd: squeue failed (" << said(r) << "); asking again\n";
      m_squeue_failing = true;
    } else {
      m_squeue_failing = false;
    }
    for (const auto& [slurm_id, state] : listed) {
      auto a = asked.find(slurm_id);
      if (a == asked.end()) continue;
      auto it = m_jobs.find(a->second);
      if (it == m_jobs.end() || it->second.slurm_id != slurm_id) continue;
      it->second.state = state.first, it->second.reason = state.second;
      pull_back(it->second);
    }
    for (const auto& slurm_id : ended) {
      auto a = asked.find(slurm_id);
      auto it = m_jobs.find(a->second);
      if (it == m_jobs.end() || it->second.slurm_id != slurm_id) continue;
      const std::string dir = it->second.dir;
      const bool recorded = has_exit_record(dir, it->second.tasks), cancel = it->second.cancel;
      const int tasks = it->second.tasks;
      const bool withdrawn = it->second.withdrawn;
      m_ended_ids[a->second] = slurm_id;
      m_jobs.erase(it);
      if (withdrawn && !cancel) {  // scancel'd while pending (had it started meanwhile, it runs again)
        m_outcomes[a->second] = json{{"withdrawn", true}};
        m_ended(a->second);
        continue;
      }
      if (!recorded) {
        account_for(a->second, slurm_id, dir, false);
        continue;
      }
      json record = exit_record(dir, tasks);  // read once: outcome() hands this one over
      if (!cancel && record.value("cancelled", false)) {
        // Its supervisor was stopped, but not by gpuq: scancel by someone else, preemption, a
        // node going down, Slurm's time limit. Slurm's record says which.
        account_for(a->second, slurm_id, dir, true, nullptr, record.value("preempted", false));
      } else if (!cancel && has_failure(record)) {
        // A rank that failed: Slurm may have signalled the whole step (an scancel by someone
        // else, its time limit), and the rank's death (by the signal, or a shell's exit 143 after
        // its child's) reached the supervisor before its own SIGTERM did. Slurm's record says;
        // where it does not explain the end, the supervisor's record stands.
        account_for(a->second, slurm_id, dir, true, std::move(record));
      } else {
        m_outcomes[a->second] = std::move(record);
        m_ended(a->second);
      }
    }
    if (!m_jobs.empty()) arm_poll();
  }

  // A job that left Slurm's queue without an exit record, or whose supervisor gpuq did not stop
  // was stopped: ended by Slurm (cancelled while pending or by someone else, preempted, its node
  // lost, its time limit) before or without its supervisor. Slurm's record of it says how: a job
  // cancelled in Slurm ends cancelled, one that hit Slurm's time limit timed out, one Slurm
  // preempted goes back in line as preempted (no retry spent), and any other (node failure)
  // failed, so that it is retried.
  // `record`: the supervisor's own, kept unless Slurm's state is one it ended the job with.
  // `took_usr1`: its supervisor took SIGUSR1 as a preemption, which may have been the warning of
  // Slurm's time limit (--signal=B:USR1@30) rather than a preemption.
  void account_for(std::int64_t id, const std::string& slurm_id, const std::string& dir, bool recorded,
                   json record = nullptr, bool took_usr1 = false) {
    run_off_thread({"scontrol", "-o", "show", "job", slurm_id}, [this, id, slurm_id, dir, recorded, took_usr1,
                                                                 record = std::move(record)](CommandResult r) mutable {
      const auto f = fields_of(r.out);
      const auto field = [&](const char* key) { return f.count(key) ? f.at(key).substr(0, 200) : std::string(); };
      const auto state = f.count("JobState") ? field("JobState") : std::string("unknown (Slurm no longer knows it)");
      // Slurm's cgroup saw an OOM kill in the job (its memory limit's, or the node's): the job
      // ends out_of_memory as it would locally (how many processes, Slurm does not say: one).
      if (state == "OUT_OF_MEMORY") m_out_of_memory.insert(id);
      // Preempted by Slurm: back in line as preempted, not a failure. A job that ended within its
      // GraceTime, its supervisor having taken the preemption's signal (no record of a rank's own
      // failure, which stands), ends COMPLETED or FAILED to Slurm: its PreemptTime says it was
      // preempted all the same.
      const std::string preempt_time = field("PreemptTime");
      const bool preempt_timed = !preempt_time.empty() && preempt_time != "None" && preempt_time != "Unknown";
      const bool preempted =
          state == "PREEMPTED" || (preempt_timed && record.is_null() && (state == "COMPLETED" || state == "FAILED"));
      if (preempted) m_preempted.insert(id);
      // SIGUSR1 with no preemption: the warning before Slurm's time limit (a partition's default,
      // where the spec has no timeout). The job ends timed out, as Slurm would have ended it.
      if (took_usr1 && !preempted && !preempt_timed && (state == "COMPLETED" || state == "FAILED")) {
        m_outcomes[id] = json{{"timed_out", true},
                              {"error", "Slurm job " + slurm_id + " reached its time limit (" + field("TimeLimit") +
                                            ", its warning signal came 30 s before)"}};
        m_ended(id);
        return;
      }
      if (!record.is_null() && state != "CANCELLED" && state != "TIMEOUT" && !preempted && state != "NODE_FAIL") {
        m_outcomes[id] = std::move(record);
        m_ended(id);
        return;
      }
      const auto reason = f.count("Reason") && f.at("Reason") != "None" ? ", " + field("Reason") : std::string();
      std::string why = "Slurm job " + slurm_id + " ended " + state + reason;
      if (recorded) {
        why += state == "CANCELLED" ? " (scancel), not through gpuq" : "";
      } else {
        why += " without an exit record";
        // Slurm writes slurm.out from the node as the job starts: without it, the node likely
        // does not see the attempt directory.
        if (state != "CANCELLED" && !common::path_exists(dir + "/slurm.out"))
          why += " or output (" + dir + "/slurm.out): does the node see gpuqd's state dir" +
                 (m_state_fs.local ? " (on a local " + m_state_fs.name + ")" : std::string()) + "?";
      }
      json out{{"error", why}};
      // Slurm ended it itself because a dependency failed (SchedulerParameters=kill_invalid_depend):
      // gpuq decides what becomes of it, as for one it withdrew.
      if (!recorded && state == "CANCELLED" && reason.find("DependencyNeverSatisfied") != std::string::npos)
        out = json{{"withdrawn", true}};
      else if (state == "CANCELLED")
        out["cancelled"] = true;
      if (state == "TIMEOUT") out["timed_out"] = true;
      m_outcomes[id] = std::move(out);
      m_ended(id);
    });
  }

  // After a crash between sbatch and slurm.id: the job whose comment names this attempt. Read
  // once, at recovery, before gpuqd serves requests (bounded to 30 s).
  std::string find_by_comment(const std::string& dir) {
    if (!m_comments_read) {
      m_comments_read = true;
      m_by_comment = jobs_by_comment();
    }
    auto it = m_by_comment.find(dir);
    return it == m_by_comment.end() ? std::string() : it->second;
  }

  // Whether Slurm lists `slurm_id` as a job of gpuqd's user whose comment names `comment_dir`;
  // nothing when it does not list it at all (ended, or no such job). Asked at recovery, bounded.
  static std::optional<bool> listed_as_ours(const std::string& slurm_id, const std::string& comment_dir) {
    if (!is_job_id(slurm_id)) return false;
    CommandResult r = run_command({"squeue", "-h", "-j", slurm_id, "-o", "%U|%k"}, 10);
    const std::string line = trim(r.out.substr(0, r.out.find('\n')));
    const auto bar = line.find('|');
    if (r.exit_code != 0 || bar == std::string::npos) return std::nullopt;
    return line.substr(0, bar) == std::to_string(::getuid()) && line.substr(bar + 1) == "gpuq:" + comment_dir;
  }

  // This user's Slurm jobs by the attempt directory their `--comment=gpuq:DIR` names (an
  // array's: its id, without a task's index).
  static std::map<std::string, std::string> jobs_by_comment() {
    std::map<std::string, std::string> out;
    CommandResult r = run_command({"squeue", "-h", "-r", "-u", std::to_string(::getuid()), "-o", "%i|%k"}, 30);
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);)
      if (auto bar = line.find('|'); bar != std::string::npos && line.compare(bar + 1, 5, "gpuq:") == 0)
        out[line.substr(bar + 6)] = line.substr(0, std::min(bar, line.find('_')));
    return out;
  }

  // slurm.id: a few digits, in a directory the job can write: read bounded, not through a symlink,
  // never waiting on a fifo (common::read_job_file); anything else reads as nothing.
  static std::string read_small(const std::string& path, std::size_t max_bytes = 64) {
    auto text = common::read_job_file(path, max_bytes, "Slurm job id");
    return text ? *text : std::string();
  }

  asio::io_context& m_io;
  SlurmSettings m_settings;
  Ended m_ended;
  asio::thread_pool m_pool{1};  // Slurm's commands, one at a time, in order
  std::shared_ptr<bool> m_alive = std::make_shared<bool>(true);
  std::map<std::int64_t, Job> m_jobs;           // attempts handed to Slurm and not yet ended
  std::map<std::uint64_t, Sbatch> m_handovers;  // sbatch calls not yet answered, or to be made again
  std::uint64_t m_next_handover = 1;
  std::size_t m_max_array = 1000;               // max_array_size()
  std::map<std::int64_t, json> m_outcomes;      // outcomes known when their job left Slurm, until read
  std::set<std::int64_t> m_out_of_memory;       // ended OUT_OF_MEMORY in Slurm, until their outcome is read
  std::set<std::int64_t> m_preempted;           // ended PREEMPTED in Slurm, likewise
  std::map<std::int64_t, std::string> m_ended_ids;  // the Slurm job of each attempt ended, until read
  asio::steady_timer m_poll_timer;
  bool m_poll_armed = false, m_polling = false, m_squeue_failing = false;
  FilesystemKind m_state_fs;                    // where the state dir lies
  bool m_comments_read = false;                 // at recovery: squeue's comments, read once
  std::map<std::string, std::string> m_by_comment;
};

}  // namespace

FilesystemKind filesystem_kind(long f_type) {
  struct Known {
    unsigned long magic;
    const char* name;
    bool local;
  };
  static constexpr Known k_known[] = {  // <linux/magic.h> and the filesystems' own sources
      {0xEF53, "ext4", true},          {0x58465342, "xfs", true},      {0x9123683E, "btrfs", true},
      {0x01021994, "tmpfs", true},     {0x2FC12FC1, "zfs", true},      {0x794C7630, "overlayfs", true},
      {0xF2F52010, "f2fs", true},      {0x4D44, "vfat", true},         {0x858458F6, "ramfs", true},
      {0x6969, "nfs", false},          {0x0BD00BD0, "lustre", false},  {0x47504653, "gpfs", false},
      {0x00C36400, "cephfs", false},   {0x19830326, "beegfs", false},  {0xFF534D42, "cifs", false},
      {0xFE534D42, "smb2", false},     {0x20030528, "orangefs", false}, {0x65735546, "fuse", false},
      {0x5346414F, "afs", false},      {0x013111A8, "ibrix", false},   {0xAAD7AAEA, "panfs", false},
  };
  const auto magic = static_cast<unsigned long>(f_type) & 0xFFFFFFFFUL;
  for (const auto& k : k_known)
    if (k.magic == magic) return {k.name, k.local};
  char hex[32];
  std::snprintf(hex, sizeof hex, "type 0x%lx", magic);
  return {hex, false};
}

json merge_task_records(const std::vector<json>& tasks) {
  json ranks = json::array(), first_failure;
  bool recorded = false, cancelled = false, timed_out = false, preempted = false;
  double started_at = 0, ended_at = 0;
  std::string missing;  // the first rank whose supervisor left no record
  for (std::size_t r = 0; r < tasks.size(); ++r) {
    const json& t = tasks[r];
    const auto rs = t.find("ranks");
    if (rs == t.end()) {  // read_exit_record: only an "error"
      ranks.push_back(json::object());
      if (missing.empty()) missing = "rank " + std::to_string(r) + ": " + t.value("error", std::string("no exit record"));
      continue;
    }
    recorded = true;
    ranks.push_back(rs->is_array() && !rs->empty() ? rs->front() : json::object());
    cancelled = cancelled || t.value("cancelled", false);
    timed_out = timed_out || t.value("timed_out", false);
    preempted = preempted || t.value("preempted", false);
    ended_at = std::max(ended_at, t.value("ended_at", 0.0));
    if (const double s = t.value("started_at", 0.0); s > 0 && (started_at == 0 || s < started_at)) started_at = s;
    const auto f = t.find("first_failure");
    if (f == t.end() || !f->is_object() || f->empty()) continue;
    // The gang's first failure is the earliest of its ranks'; the others were torn down after it.
    if (first_failure.is_null() || f->value("at", 0.0) < first_failure.value("at", 0.0)) {
      first_failure = *f;
      first_failure["rank"] = static_cast<int>(r);
    }
  }
  if (!recorded) return tasks.empty() ? json{{"error", "the job has no ranks"}} : tasks.front();
  json out = {{"ranks", std::move(ranks)}};
  if (started_at > 0) out["started_at"] = started_at;  // the first rank's supervisor's start
  if (ended_at > 0) out["ended_at"] = ended_at;
  if (first_failure.is_object()) out["first_failure"] = std::move(first_failure);
  else if (timed_out) out["timed_out"] = true;
  else if (!missing.empty()) out["error"] = missing;
  else if (cancelled) out["cancelled"] = true;
  if (preempted) out["preempted"] = true;  // a supervisor took SIGUSR1 (or `preempt` in the stop file)
  return out;
}

std::unique_ptr<Executor> make_slurm_executor(asio::io_context& io, SlurmSettings settings, Executor::Ended ended) {
  return std::make_unique<SlurmExecutor>(io, std::move(settings), std::move(ended));
}

}  // namespace gpuq::daemon
