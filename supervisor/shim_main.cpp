// gpuq-shim: the per-attempt job supervisor that gpuqd spawns (see supervisor/supervisor.hpp); with
// --slurm-task, one rank of a job whose ranks srun starts across a Slurm allocation; with
// --slurm-outcome, whether every rank of such a job succeeded.
#include <cstring>
#include <iostream>

#include "supervisor/supervisor.hpp"

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[2], "--slurm-task") == 0) return gpuq::supervisor::run_slurm_task(argv[1]);
  if (argc == 3 && std::strcmp(argv[2], "--slurm-outcome") == 0) return gpuq::supervisor::slurm_gang_outcome(argv[1]);
  if (argc == 4 && std::strcmp(argv[2], "--cgroup") == 0) return gpuq::supervisor::run_supervisor(argv[1], argv[3]);
  if (argc != 2) {
    std::cerr << "usage: gpuq-shim LAUNCH_JSON [--cgroup DIR | --slurm-task | --slurm-outcome]\n(started by gpuqd, one "
                 "per job "
                 "attempt; with --slurm-task by srun, one per rank; with --slurm-outcome by a gang's batch script, "
                 "after srun)\n";
    return 2;
  }
  return gpuq::supervisor::run_supervisor(argv[1]);
}
