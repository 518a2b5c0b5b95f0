// gpuq-shim: the per-attempt supervisor. One per job attempt, in a session of its own, forked by
// `gpuq-shim --serve` for gpuqd (serve.hpp; exec'd by gpuqd where that server cannot start it); it
// starts every rank (Boost.Process, each rank in its own process group), waits for them, and
// writes the attempt's outcome to exit.json atomically. Because the shim is the ranks' parent and
// not the daemon, a job keeps running while gpuqd is stopped, restarted or killed; a restarted
// daemon re-adopts the shim through its pid file and reads exit.json when it ends.
//
// The shim is also where the process-tree rules live, so they hold without a daemon:
// - it is a child subreaper: descendants that daemonise or lose their parent stay under it;
// - first failure tears down the gang: when one rank fails, every other rank gets SIGTERM, then
//   SIGKILL after the grace period (no survivor hangs in a collective); the first failing rank is
//   named in exit.json, as torchrun does;
// - SIGTERM to the shim (gpuq cancel) and the job's timeout tear everything down the same way;
// - when the ranks have exited, leftover descendants are terminated too, so no orphan keeps a
//   GPU's memory after the job ends;
// - ranks get PR_SET_PDEATHSIG=SIGKILL, so if the shim itself is killed its ranks die with it.
// In lab mode (gpuqd runs as root, the job as its owner) the shim stays root and only the ranks
// take the owner's identity, so the job can neither signal, stop, trace nor read its supervisor;
// the shim acts on files as the owner (its file-system identity), so that no path in the job's
// directory leads it anywhere the owner could not go.
#pragma once

#include <string>
#include <vector>

namespace gpuq::supervisor {

// Runs the attempt described by the launch document at `launch_path`. Returns the shim's exit
// status: 0 when the attempt succeeded, 1 when it did not (or exit.json could not be written), 2
// when the launch document is unusable. gpuqd reads exit.json, not this; a Slurm batch job ends
// with it, so that a job submitted --dependency=afterok on this one starts only after a success.
// With `cgroups` (the attempt's cgroup in each hierarchy gpuqd uses), rank R joins `rank-R` of
// each (the cgroup itself where `per_rank` says false for it) between fork and exec, before it takes the
// owner's identity, through descriptors of their cgroup.procs opened with gpuqd's; the shim stays
// outside. A rank that cannot join, or cannot become its owner, does not run (exit 126, its log
// says why).
int run_supervisor(const std::string& launch_path, const std::vector<std::string>& cgroups = {},
                   const std::vector<bool>& per_rank = {});

// One task of a job whose ranks Slurm's srun starts, one shim each, across nodes: runs only the
// rank SLURM_PROCID names, with RANK, LOCAL_RANK and GROUP_RANK as Slurm placed it, and writes
// its own pid file and exit record (shim-R.pid, exit-R.json). Returns 1 when its rank failed
// first, so that `srun --kill-on-bad-exit` ends the other ranks as the gang rule does locally; 0
// when the record is written otherwise (succeeded, timed out, stopped: each task keeps its own
// timeout, and a stop reaches every task, so none has to end the others); 2 when the document or
// Slurm's variables are unusable.
// SIGURG stops it as SIGTERM does: gpuq's cancel of a gang is `scancel --signal=URG`, which
// Slurm may deliver to every process of the step one by one (proctrack/linuxproc). SIGTERM sent
// that way can reach a rank's child first, whose death then ends the rank before its own SIGTERM
// handler runs; SIGURG is ignored by default, so the ranks go on until their supervisor passes
// SIGTERM to each rank's process group at once.
// A stop sent before a task's supervisor caught signals is not lost: gpuqd writes common::k_stop_file into
// the attempt directory (beside launch.json) before it signals, and the supervisor looks for it
// once it catches them.
int run_slurm_task(const std::string& launch_path);

// The Slurm batch script's last word on a gang, after srun: 0 when every rank's exit record says
// it succeeded, 1 otherwise (a Slurm job --dependency=afterok on this one starts only then), 2
// when the launch document is unusable.
int slurm_gang_outcome(const std::string& launch_path);

// `path` with "-R" before its extension: exit.json -> exit-1.json.
std::string task_path(const std::string& path, int rank);

}  // namespace gpuq::supervisor
