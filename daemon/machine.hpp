// The machine gpuqd places work on, one owner of its four parts: the GPUs (inventory.hpp), which
// of them are in service and how healthy they are (gpu_service.hpp), what runs on them
// (gpu_processes.hpp), and the CPU cores in slot order (cpu_topology.hpp). Built once at start;
// the daemon hands the parts to the owners that read them (Reads, Attempts).
#pragma once

#include <functional>
#include <vector>

// clang-format off
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>
// clang-format on

#include "daemon/cpu_topology.hpp"
#include "daemon/gpu_processes.hpp"
#include "daemon/gpu_service.hpp"
#include "daemon/inventory.hpp"
#include "daemon/store.hpp"

namespace gpuq::daemon {

struct Machine {
  struct Watch {
    double health_interval_s = 0;       // GPU health checks; 0: none
    double gpu_process_interval_s = 0;  // looks at the processes on the GPUs; 0: none
  };
  // `running`: the running jobs, with their supervisors and GPUs (whose processes are ours);
  // `changed`: GPUs came into or went out of service, or memory outside gpuq came or went.
  Machine(boost::asio::io_context& io, Inventory gpus, SlotCores slot_cores, Store& store, Watch watch,
          std::function<std::vector<GpuProcesses::Running>()> running, std::function<void()> changed)
      : inventory(std::move(gpus)),
        health(io, inventory, store, watch.health_interval_s, changed),
        gpu_processes(io, inventory, watch.gpu_process_interval_s, std::move(running), changed),
        cores(std::move(slot_cores)) {}
  Machine(const Machine&) = delete;  // the parts hold the inventory by reference
  Machine& operator=(const Machine&) = delete;

  // Starts the health checks, and the looks at GPU processes where NVML reports and no other
  // system places the work.
  void start(bool places_work) {
    health.start();
    gpu_processes.start(inventory.source().rfind("nvml", 0) == 0 && !places_work);
  }

  Inventory inventory;
  GpuService health;
  GpuProcesses gpu_processes;
  SlotCores cores;  // usable cores in slot order, with their NUMA nodes: slot s is core cores.cores[s % size]
};

}  // namespace gpuq::daemon
