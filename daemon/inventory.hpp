// The GPUs gpuqd may use. NVML is loaded with dlopen at run time, so gpuqd has no link-time
// dependency on the driver and runs on machines without one. `fake:N[:MiB]` stands in for GPUs
// in tests and on GPU-less machines (`fake:N:MiB:NODES` also puts them on NUMA nodes).
// CUDA_VISIBLE_DEVICES given to the daemon (indices or UUIDs) limits the set it may hand out, as
// it would for any CUDA program.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"

namespace gpuq::daemon {

struct Gpu {
  int index = 0;  // NVML index (PCI bus order); what gpuq exports in CUDA_VISIBLE_DEVICES
  std::string uuid;
  std::string name;
  std::int64_t memory_total_mb = 0;
  int numa_node = -1;  // the node of its PCI slot (sysfs), -1 when unknown
  // Its device node's minor number (/dev/nvidiaN, major 195), -1 when unknown; a fake GPU's is its index.
  int minor = -1;
};

// The character devices (major, minor) of the machine's GPUs that a job given `given` (indices)
// may not open: every GPU's of `gpus` but those, and every other /dev/nvidiaN node of `dev` (a GPU
// gpuqd does not serve is not the job's either). NVIDIA's control nodes (nvidiactl, nvidia-uvm)
// stay open: CUDA needs them.
std::vector<std::pair<unsigned, unsigned>> denied_gpu_devices(const std::vector<Gpu>& gpus,
                                                              const std::vector<int>& given,
                                                              const std::string& dev = "/dev");
constexpr unsigned k_nvidia_major = 195;

struct GpuReading {
  std::optional<std::int64_t> memory_used_mb;
  std::optional<int> utilization;
};

// A process NVML lists on a GPU (a CUDA context), with the GPU memory it holds where the driver
// says (not under Windows' WDDM, nor for some MIG set-ups).
struct GpuProcess {
  int pid = 0;
  std::optional<std::int64_t> used_mb;
};

// What NVML says of a GPU's health (see health_problem).
struct GpuHealth {
  bool lost = false;                             // NVML_ERROR_GPU_IS_LOST: fell off the bus
  std::optional<std::uint64_t> ecc_uncorrected;  // volatile uncorrectable ECC errors, where reported
  bool remap_failed = false;                     // row remapping failed (A100 and later)
  std::vector<std::uint64_t> xids;               // critical Xid events since the last reading
};

// Why a GPU should be taken out of service, or "" when it is fine: it is lost, it reported an Xid
// that needs a GPU reset (xid_problem), its row remapping failed, or it has more uncorrectable
// ECC errors than `ecc_base` (the count when it was last found healthy; nullopt: none known, so
// any error counts). Pure, for tests.
std::string health_problem(const GpuHealth& now, std::optional<std::uint64_t> ecc_base);
// "Xid 79: the GPU fell off the bus" for an Xid after which the GPU needs a reset; "" for the rest.
std::string xid_problem(std::uint64_t xid);
// Any Xid in words, for a failed job's reason: "Xid 31 (GPU memory page fault ...)", "Xid 999".
std::string xid_words(std::uint64_t xid);

class Nvml;

class Inventory {
 public:
  // spec: "auto" (NVML if it loads, else no GPUs), "nvml", "none", or "fake:N[:MiB[:NODES]]"
  // (NODES: one NUMA node per GPU, e.g. 0,0,1,1). `visible` is the daemon's CUDA_VISIBLE_DEVICES
  // (nullopt when unset). NVML GPUs' NUMA nodes are read from sysfs under `sys_root`.
  static Result<Inventory> create(const std::string& spec, const std::optional<std::string>& visible,
                                  const std::string& sys_root = "/sys");

  Inventory(Inventory&&) noexcept;
  Inventory& operator=(Inventory&&) noexcept;
  ~Inventory();

  const std::vector<Gpu>& gpus() const { return m_gpus; }
  const Gpu* find(int index) const;
  const std::string& source() const { return m_source; }
  // Live readings (NVML), one per GPU in gpus() order; empty values for fake GPUs.
  std::vector<GpuReading> read() const;
  // The compute processes on each GPU, in gpus() order; nullopt where no one can say (fake GPUs,
  // a driver without the call, an error). At most k_max_gpu_processes a GPU.
  std::vector<std::optional<std::vector<GpuProcess>>> processes() const;
  static constexpr unsigned k_max_gpu_processes = 1024;
  // Health, one per GPU in gpus() order; all healthy for fake GPUs. Reading it takes the Xid
  // events that arrived since the last reading.
  std::vector<GpuHealth> health() const;
  // Asks NVML for the GPUs' critical Xid events from now on, which health() then reads. Returns
  // how many GPUs have them (an NVML event set; some GPUs and drivers have none).
  int watch_xids();

 private:
  Inventory() = default;
  std::vector<Gpu> m_gpus;
  std::string m_source;
  std::unique_ptr<Nvml> m_nvml;
};

// Keeps the GPUs named by a CUDA_VISIBLE_DEVICES value (indices or UUID prefixes, in order;
// parsing stops at the first invalid entry, as CUDA does). Pure, for tests.
std::vector<Gpu> filter_visible(const std::vector<Gpu>& all, const std::string& visible);

// The NUMA node of the PCI device domain:bus:device.0 from sysfs under `sys_root`, -1 when the
// kernel does not know it (one-node machines) or there is no such device.
int pci_numa_node(const std::string& sys_root, unsigned domain, unsigned bus, unsigned device);

}  // namespace gpuq::daemon
