// gpuq-shim: the per-attempt job supervisor that gpuqd spawns (see supervisor/supervisor.hpp); with
// --slurm-task, one rank of a job whose ranks srun starts across a Slurm allocation; with
// --slurm-outcome, whether every rank of such a job succeeded.
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "supervisor/supervisor.hpp"

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[2], "--slurm-task") == 0) return gpuq::supervisor::run_slurm_task(argv[1]);
  if (argc == 3 && std::strcmp(argv[2], "--slurm-outcome") == 0) return gpuq::supervisor::slurm_gang_outcome(argv[1]);
  // --cgroup DIR (each rank joins DIR/rank-R) or --cgroup-whole DIR (each joins DIR), once for
  // each hierarchy gpuqd uses.
  std::vector<std::string> cgroups;
  std::vector<bool> per_rank;
  bool usage = argc < 2 || argc % 2 != 0;
  for (int i = 2; !usage && i + 1 < argc; i += 2) {
    const bool ranks = std::strcmp(argv[i], "--cgroup") == 0;
    usage = (!ranks && std::strcmp(argv[i], "--cgroup-whole") != 0) || argv[i + 1][0] != '/';
    cgroups.emplace_back(argv[i + 1]);
    per_rank.push_back(ranks);
  }
  if (usage) {
    std::cerr
        << "usage: gpuq-shim LAUNCH_JSON [--cgroup DIR | --cgroup-whole DIR]... | --slurm-task | --slurm-outcome\n"
           "(started by gpuqd, one per job attempt; with --slurm-task by srun, one per rank; with "
           "--slurm-outcome by a gang's batch script, after srun)\n";
    return 2;
  }
  return gpuq::supervisor::run_supervisor(argv[1], cgroups, per_rank);
}
