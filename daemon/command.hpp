// Runs a program to its end and captures what it says, bounded in time and size: for the client
// commands of another system (Slurm's sbatch, squeue, scontrol, scancel), run off gpuqd's thread.
#pragma once

#include <string>
#include <vector>

namespace gpuq::daemon {

struct CommandResult {
  bool started = false;    // false: it could not be run at all (`err` says why)
  bool timed_out = false;  // killed (SIGKILL) after the time allowed
  int exit_code = -1;      // its exit status; -1 when it died of a signal or never ran
  std::string out, err;    // its output, each cut at the size allowed
};

// Runs argv[0] (looked up in PATH) with argv, stdin from /dev/null, in gpuqd's environment.
CommandResult run_command(const std::vector<std::string>& argv, double timeout_s = 60,
                          std::size_t max_bytes = 4 << 20);

}  // namespace gpuq::daemon
