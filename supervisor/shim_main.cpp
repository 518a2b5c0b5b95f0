// gpuq-shim: the per-attempt job supervisor that gpuqd spawns (see supervisor/supervisor.hpp); with
// --slurm-task, one rank of a job whose ranks srun starts across a Slurm allocation.
#include <cstring>
#include <iostream>

#include "supervisor/supervisor.hpp"

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[2], "--slurm-task") == 0) return gpuq::supervisor::run_slurm_task(argv[1]);
  if (argc != 2) {
    std::cerr << "usage: gpuq-shim LAUNCH_JSON [--slurm-task]\n(started by gpuqd, one per job attempt; with "
                 "--slurm-task by srun, one per rank)\n";
    return 2;
  }
  return gpuq::supervisor::run_supervisor(argv[1]);
}
