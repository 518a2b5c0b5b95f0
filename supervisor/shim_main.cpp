// gpuq-shim: the per-attempt job supervisor that gpuqd spawns (see supervisor/supervisor.hpp).
#include <iostream>

#include "supervisor/supervisor.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: gpuq-shim LAUNCH_JSON\n(started by gpuqd, one per job attempt)\n";
    return 2;
  }
  return gpuq::supervisor::run_supervisor(argv[1]);
}
