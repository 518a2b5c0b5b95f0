// Runs a program to its end and captures what it says, bounded in time and size: gpuqd runs the
// client commands of another system this way (Slurm's sbatch, squeue, scontrol, scancel, off its
// own thread), and gpuq its PNG painter (the chart on the painter's standard input).
#pragma once

#include <sys/resource.h>

#include <optional>
#include <string>
#include <vector>

namespace gpuq::common {

struct CommandResult {
  bool started = false;    // false: it could not be run at all (`err` says why)
  bool timed_out = false;  // killed (SIGKILL) after the time allowed
  int exit_code = -1;      // its exit status; -1 when it died of a signal or never ran
  int signal = 0;          // the signal it died of, if it did
  std::string out, err;    // its output, each cut at the size allowed
};

// Runs argv[0] (looked up in PATH unless it holds a '/') with argv, in this process's environment
// and with no signal blocked; its standard input is `input` where given, else /dev/null. A
// program that stops reading its input early does not stop this one (no SIGPIPE).
CommandResult run_command(const std::vector<std::string>& argv, double timeout_s = 60, std::size_t max_bytes = 4 << 20,
                          const std::optional<std::string>& input = std::nullopt);

// The soft limit on open files this process's children get, where it raised its own (gpuqd does,
// for its clients): run_command's commands and gpuqd's supervisors get no more than `soft`. Slurm
// hands sbatch's limits on to the job it submits (PropagateResourceLimits=ALL, its default), so
// gpuqd's raised limit would otherwise reach every job. Set it before any child is started.
void set_children_descriptor_limit(rlim_t soft);

// In a child between fork and exec (system calls only, vfork-safe): lowers the soft limit on open
// files to the one set_children_descriptor_limit gave, where it is higher.
void restore_children_descriptor_limit() noexcept;

}  // namespace gpuq::common
