// gpuq-shim: the per-attempt job supervisor that gpuqd spawns (see supervisor/supervisor.hpp); with
// --slurm-task, one rank of a job whose ranks srun starts across a Slurm allocation; with
// --slurm-outcome, whether every rank of such a job succeeded; with --serve FD, the long-lived process
// that forks each attempt's supervisor for gpuqd (supervisor/serve.hpp).
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "supervisor/serve.hpp"
#include "supervisor/supervisor.hpp"

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[2], "--slurm-task") == 0) return gpuq::supervisor::run_slurm_task(argv[1]);
  if (argc == 3 && std::strcmp(argv[2], "--slurm-outcome") == 0) return gpuq::supervisor::slurm_gang_outcome(argv[1]);
  // --serve FD [ROOM]: ROOM, any string, is only room for the supervisors' command lines.
  if ((argc == 3 || argc == 4) && std::strcmp(argv[1], "--serve") == 0) {
    char* end = nullptr;
    const long fd = std::strtol(argv[2], &end, 10);
    if (*end == '\0' && fd > 2 && fd < 1024)
      return gpuq::supervisor::serve(static_cast<int>(fd), gpuq::supervisor::CommandLine::of(argc, argv));
  }
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
           "       gpuq-shim --serve FD [ROOM]\n"
           "(started by gpuqd, one per job attempt; with --slurm-task by srun, one per rank; with "
           "--slurm-outcome by a gang's batch script, after srun; with --serve by gpuqd, once, to fork the "
           "supervisors)\n";
    return 2;
  }
  return gpuq::supervisor::run_supervisor(argv[1], cgroups, per_rank);
}
