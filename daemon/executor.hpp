// Where a job's attempts run. gpuqd decides which job starts, when and on what (scheduler.hpp),
// and records every change of state (lifecycle.hpp); an executor turns a launch gpuqd decided
// into processes, stops them when asked, tells gpuqd when they are gone, and finds them again
// after gpuqd restarts. gpuqd touches a job's processes through this interface only.
//
// The local executor (local_executor.cpp) runs each attempt under gpuq-shim on this machine. The
// interface is drawn for a second kind whose processes run on other machines under a system of
// their own (a Slurm executor: sbatch, squeue/sacct, scancel):
//   - start() returns once the attempt is handed over, not once it runs: sbatch returns at once
//     and the job may wait in Slurm's queue. Before returning it leaves in the attempt directory
//     what it needs to find the attempt again (the shim's pid file; a Slurm job id).
//   - Liveness is the executor's alone: gpuqd learns that an attempt's processes are gone only
//     through `Ended`, posted on gpuqd's io_context (a pidfd here; polling squeue there).
//   - How an attempt ended is read in one shape, the shim's exit record (outcome()), whatever ran
//     it: an executor whose supervisor could not write one builds it (from sacct, say).
//   - adopt() at start-up says whether an attempt gpuqd had started is alive (and watched again),
//     has ended (its outcome is to be read), or never started (gpuqd stopped before handing it
//     over), without waiting on anything.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/slurm_script.hpp"
#include "common/spec.hpp"
#include "daemon/cgroups.hpp"
#include "daemon/scheduler.hpp"

namespace boost::asio {
class io_context;
}

namespace gpuq::daemon {

// How an attempt ended, read once from its exit record (read_exit_record's shape, whatever
// executor ran it): what gpuqd's core decides the job's next state from.
struct Outcome {
  bool all_ok = false;                  // ranks were recorded, and every one exited 0
  nlohmann::json first_failure;         // the record's first failure (an object), or null
  std::optional<int> exit_code;         // the first failure's, or 0 when all_ok
  std::optional<int> exit_signal;       // the first failure's signal
  bool cancelled = false;               // stopped as asked (by gpuq, or in the other system)
  bool timed_out = false;               // stopped at its timeout
  bool withdrawn = false;               // taken back before it started (Executor::withdraw)
  bool final = false;                   // the executor's word: another attempt would fare the same
  std::optional<std::string> error;     // no record, why; or the executor's word on the end
  std::string external_id;              // the executor's id for it ("slurm:42"), never the job's
  std::optional<double> ended_at;       // as its supervisor saw it
  // Where the attempt waited in the other system after it was handed over (pending in Slurm):
  // when its processes began, from which the job's runtime counts. Unset where they began when
  // gpuqd launched them.
  std::optional<double> began_at;
  // How many of its processes an OOM killer killed (its cgroup's count; its memory limit's killer
  // or the machine's), where the executor can tell.
  std::optional<std::int64_t> oom_kills;
  // The other system preempted it ("Slurm"), by the executor's own word (never the record's, which
  // the job may write): it goes back in line as preempted, no retry spent. "" otherwise.
  std::string preempted_by;

  // The record as read_exit_record (or merge_task_records) gives it: fields of the wrong type
  // count as absent. Its `started_at` is left for the executor to give as began_at.
  static Outcome from_record(const nlohmann::json& record);
  static Outcome failed(std::string why);  // an attempt that could not start, or whose end is lost
};

class Executor {
 public:
  struct Attempt {
    std::int64_t id = 0;  // the job
    std::string dir;      // its attempt directory, with launch.json written (launcher.hpp)
    const common::JobSpec* spec = nullptr;  // the job's spec, valid during the call
    // Its dependencies still running: where the executor follows() them, the attempt is to wait
    // in the other system until each of them has succeeded (elsewhere there are none at a start).
    std::vector<std::int64_t> after;
    uid_t owner = 0;  // the user it runs as: what it writes in its directory belongs to them
    // What the kernel is to hold it to, where the executor has controllers for it (at start).
    AttemptLimits limits;
    // Seconds it has spent suspended so far (frozen: its timeout's clock stood still), and whether
    // it is suspended now (at adoption: gpuqd freezes it again, suspend()).
    double suspended_s = 0;
    bool suspended = false;
  };
  // Called on gpuqd's thread once the attempt's processes are gone (or known never to come).
  using Ended = std::function<void(std::int64_t id)>;
  enum class Found { alive, ended, never_started };

  virtual ~Executor() = default;
  // Hands the attempt over to run; an Error (nothing was started) is the attempt's failure.
  virtual Result<bool> start(const Attempt& attempt) = 0;
  // After gpuqd restarted: what became of an attempt it had recorded as running. An alive one is
  // watched as if start() had started it.
  virtual Found adopt(const Attempt& attempt) = 0;
  // Asks a running attempt to end (its supervisor stops the ranks, SIGTERM then SIGKILL after the
  // grace period); `Ended` follows. Nothing when it is not running.
  virtual void stop(std::int64_t id) = 0;
  // Asks a running attempt to checkpoint and end, for a preemption: its supervisor writes the
  // attempt's $GPUQ_PREEMPT_FILE, sends the ranks the spec's preempt_signal, and SIGKILLs what is
  // left `grace_s` later; `Ended` follows. An executor that cannot (Slurm) stops it as stop() does.
  virtual void preempt(std::int64_t id, double grace_s) {
    (void)grace_s;
    stop(id);
  }
  // Whether suspend() can freeze attempts here (the local executor with a cgroup freezer).
  virtual bool can_suspend() const { return false; }
  // Freezes (`frozen`) or thaws a running attempt's processes in place, its memory and GPUs kept;
  // its timeout's clock stands still meanwhile (its supervisor, outside the freezer, sees it).
  // False when it cannot. stop() and preempt() thaw a frozen attempt first.
  virtual bool suspend(std::int64_t /*id*/, bool /*frozen*/) { return false; }
  // How an ended attempt ended: its supervisor's exit record (untrusted: bounded and type-checked),
  // read once; an error saying why when there is none.
  virtual Outcome outcome(const Attempt& attempt) = 0;

  // Whether another system decides where and when attempts run (Slurm): then place() says which
  // jobs go, with no GPUs or cores of gpuqd's choosing, and this machine's GPUs are not theirs
  // (a submit's GPUs are the other system's to count; gpuqd does not watch GPU processes here).
  virtual bool places_work() const { return false; }
  // Where another system places work: which ready jobs of `queue` (in line, within `limits`) go to
  // it now, alone or together as one unit (Handover, scheduler.hpp; an executor without units
  // sends each alone). `first(job)` is a job's attempt when it is the first since the job was
  // submitted or restarted (one that may join a unit), else nothing (a retry goes alone).
  // Nothing: gpuqd's scheduler places them on this machine's GPUs and cores.
  using FirstAttempt = std::function<std::optional<Attempt>(const PendingJob& job)>;
  virtual std::optional<Handover> place(const std::vector<PendingJob>& /*queue*/, const BatchLimits& /*limits*/,
                                        const FirstAttempt& /*first*/) const {
    return std::nullopt;
  }
  // Whether a queued job may be handed over now after `dep`, an attempt of this executor's still
  // running, to wait in the other system until `dep` has succeeded (Slurm's afterok, once `dep`
  // has its Slurm id); false: it waits in gpuqd's queue until `dep` has succeeded.
  virtual bool follows(std::int64_t /*dep*/) const { return false; }
  // Whether ranks start from the environment of the machine they run on (the user's login
  // environment on a cluster node) with the job's own variables over it, rather than from the
  // submitter's; GPUs are then the other system's to make visible (CUDA_VISIBLE_DEVICES).
  virtual bool inherits_environment() const { return false; }
  // Whether an attempt adopt() found never started keeps its number (its directory holds the
  // claim that stops a supervisor late for it), so that the job starts again as its next attempt.
  virtual bool withdraws_numbers() const { return false; }
  // Where a running attempt stands in the other system, for `status` ("Slurm job 42 pending:
  // Resources"); "" when there is nothing to add.
  virtual std::string detail(std::int64_t /*id*/) const { return {}; }
  // A running attempt's id in the other system ("slurm:42"), once it has one; "" for none. The
  // outcome of an attempt that had one carries it too, as "external_id", for the job's record.
  virtual std::string external_id(std::int64_t /*id*/) const { return {}; }
  // Hands attempts that place() put in one unit over together, running at most `limit` (0: any
  // number) at once (a Slurm job array, one sbatch for a thousand jobs, whose limit Slurm
  // enforces). From then on each is as if start() had started it (stop, withdraw, outcome and
  // adopt take it alone); an Error: none was started.
  virtual Result<bool> start_array(const std::vector<Attempt>& /*attempts*/, int /*limit*/) {
    return Error{ErrorCode::internal, "this executor hands over no arrays"};
  }
  // A batch's new limit on jobs at once (0: none), for `handed`, its attempts running: the arrays
  // among them run at most the limit less those handed over alone, shared between them. Nothing
  // where no units are handed over.
  virtual void set_array_limit(const std::vector<std::int64_t>& /*handed*/, int /*limit*/) {}
  // Takes back an attempt handed over with `after` whose dependency will not succeed as it was
  // handed over (it failed, and may be retried as a new attempt): if the other system has not
  // started it, it is removed there and `Ended` follows with an outcome of {"withdrawn": true},
  // which puts the job back in line as the same attempt. An attempt already running is left
  // alone. Asked of any executor for such an attempt; one that follows() nothing ignores it.
  virtual void withdraw(std::int64_t /*id*/) {}
  // Called on gpuqd's thread when an attempt gets its id in the other system (sbatch answered), so
  // that jobs waiting for it can be handed over after it.
  void on_handed(std::function<void(std::int64_t id)> f) { m_handed = std::move(f); }

  // Whether a running attempt's processes may have started, so that its event files are worth
  // reading (false while Slurm holds the job pending: a thousand queued jobs are not read four
  // times a second). Its end is read regardless.
  virtual bool started(std::int64_t /*id*/) const { return true; }
  // The pid of the attempt's supervisor on this machine, whose descendants are the job's
  // processes (gpu_processes.cpp tells them from others on a GPU); 0 where it runs elsewhere.
  virtual int supervisor_pid(std::int64_t /*id*/) const { return 0; }

  // Once `Ended` has come for an attempt: why processes of it live on, "" when none does. The
  // executor could not kill them all within its bound (stuck in the kernel), and ended the attempt
  // regardless; gpuqd keeps its GPUs out of service until `on_released` says that no attempt of
  // the job lingers any more.
  virtual std::string lingering(const Attempt& /*attempt*/) const { return {}; }
  // At start, after every running attempt was adopted: the jobs whose ended attempts left
  // processes behind (a gpuqd before this one saw them linger), watched again from now on, each
  // released as above once none of it is left.
  virtual std::vector<std::int64_t> adopt_lingering() { return {}; }
  // What holds each attempt's processes together and kills them all (`gpuq gpus` says it).
  virtual std::string containment() const = 0;
  void on_released(std::function<void(std::int64_t id)> f) { m_released = std::move(f); }

 protected:
  std::function<void(std::int64_t id)> m_handed;
  std::function<void(std::int64_t id)> m_released;
};

// The supervisor's exit record at `path` (supervisor.cpp's write_outcome). It lies in the job's
// directory, which the job can write, so it is read as untrusted input: bounded, and each field
// kept only with the type gpuqd expects; {"error": why} when there is none.
// `max_bytes`: ~4,000 bytes a rank, for 1,000 ranks by default; one rank's record needs far less.
nlohmann::json read_exit_record(const std::string& path, std::size_t max_bytes = 4 << 20,
                                std::optional<uid_t> owner = std::nullopt);
constexpr std::size_t k_max_task_record = 64 << 10;  // one rank's (gpuq-shim --slurm-task)

// One exit record for a gang whose ranks each had a supervisor of their own (Slurm: one gpuq-shim
// --slurm-task a rank), from theirs as read_exit_record gives them, in rank order: every rank's
// exit, the earliest first failure (the others were torn down after it), then timed out, a rank
// that left no record, cancelled; as read_exit_record's {"error": why} when none left one.
nlohmann::json merge_task_records(const std::vector<nlohmann::json>& tasks);

// Runs attempts under `shim_path` (gpuq-shim) on this machine, each in a session of its own, so
// that they outlive gpuqd; watches each through a pidfd (or polls where there is none). With
// `cgroups`, each attempt's processes run in a cgroup of its own (cgroups.hpp), which is killed
// and found empty before `Ended`; without, they are tracked by the supervisor's tree.
struct LocalBounds {
  // The supervisors' SIGTERM -> SIGKILL; a supervisor that has not ended its attempt k_overdue_s
  // past that after a stop or the attempt's timeout is killed by gpuqd (a job that shares its
  // supervisor's uid may have stopped it).
  double grace_s = 10;
  // How long processes left in an attempt's cgroup get to die of SIGKILL before the attempt is
  // recorded as ended regardless, lingering (Executor::lingering) until they are gone.
  double unkillable_s = 30;
};
std::unique_ptr<Executor> make_local_executor(boost::asio::io_context& io, std::string shim_path, Executor::Ended ended,
                                              std::optional<Cgroups> cgroups = std::nullopt, LocalBounds bounds = {});
constexpr double k_overdue_s = 5;

// Hands each attempt to Slurm (slurm_executor.cpp): sbatch a script that runs gpuq-shim inside
// the allocation, squeue for liveness, scancel to stop.
struct SlurmSettings {
  common::SlurmOptions options;  // partition, account, qos, more sbatch options
  std::string shim_path;         // gpuq-shim, at a path the compute nodes share
  std::string state_dir;         // must be on a filesystem they share: checked at start
  double grace_s = 10;           // the shim's SIGTERM -> SIGKILL, within Slurm's time limit
  double poll_s = 2;             // one squeue for all jobs this often, never one per job
};
// A filesystem type as statfs(2) gives it (f_type): its name, and whether it is one that only
// this machine sees (ext4, xfs, tmpfs...). Network and cluster filesystems (NFS, Lustre, GPFS,
// CephFS, BeeGFS...) and unknown types are not called local: gpuqd warns only where it is sure.
struct FilesystemKind {
  std::string name;  // "ext4", "nfs", or "type 0x..." when unknown
  bool local = false;
};
FilesystemKind filesystem_kind(long f_type);

std::unique_ptr<Executor> make_slurm_executor(boost::asio::io_context& io, SlurmSettings settings,
                                              Executor::Ended ended);

}  // namespace gpuq::daemon
