// The NVML entry points gpuq uses, loaded with dlopen at run time, so that no NVML header or
// library is needed to build gpuq or to run it without NVIDIA GPUs. The types here are declared
// by hand; daemon/nvml_abi_check.cpp holds them against the real prototypes and structures of
// the CUDA toolkit's nvml.h wherever a build has it (scripts/cuda-build.sh).
#pragma once

#include <dlfcn.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/inventory.hpp"

namespace gpuq::daemon {

class Nvml {
 public:
  using Device = void*;
  struct Memory {
    unsigned long long total, free, used;
  };
  struct Utilization {
    unsigned int gpu, memory;
  };
  struct PciInfo {  // nvmlPciInfo_t (v2 and v3 share the layout)
    char bus_id_legacy[16];
    unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
  };
  struct EventData {  // nvmlEventData_t; nvmlEventSetWait (v1) fills the first three fields
    Device device;
    unsigned long long type, data;  // data: the Xid, for an Xid event
    unsigned int gpu_instance, compute_instance;
  };
  struct ProcessInfo {  // nvmlProcessInfo_t (v2; nvmlDeviceGetComputeRunningProcesses_v2 and _v3 take it)
    unsigned int pid;
    unsigned long long used_memory;  // bytes; k_value_not_available where the driver cannot say
    unsigned int gpu_instance, compute_instance;
  };

  static std::unique_ptr<Nvml> load(std::string& error) {
    void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      error = "cannot load libnvidia-ml.so.1 (no NVIDIA driver?)";
      return nullptr;
    }
    std::unique_ptr<Nvml> n(new Nvml(lib));
    bool ok = n->sym(n->init, "nvmlInit_v2") && n->sym(n->shutdown, "nvmlShutdown") &&
              n->sym(n->count, "nvmlDeviceGetCount_v2") && n->sym(n->handle, "nvmlDeviceGetHandleByIndex_v2") &&
              n->sym(n->uuid, "nvmlDeviceGetUUID") && n->sym(n->name, "nvmlDeviceGetName") &&
              n->sym(n->memory, "nvmlDeviceGetMemoryInfo") && n->sym(n->utilization, "nvmlDeviceGetUtilizationRates");
    if (!ok) {
      error = "libnvidia-ml.so.1 lacks the NVML functions gpuq needs";
      return nullptr;
    }
    if (!n->sym(n->pci_info, "nvmlDeviceGetPciInfo_v3")) n->sym(n->pci_info, "nvmlDeviceGetPciInfo_v2");  // optional
    n->sym(n->minor_number, "nvmlDeviceGetMinorNumber");   // optional: device limits
    n->sym(n->ecc_errors, "nvmlDeviceGetTotalEccErrors");  // optional: health checks
    n->sym(n->remapped_rows, "nvmlDeviceGetRemappedRows");
    if (!n->sym(n->event_set_wait, "nvmlEventSetWait_v2")) n->sym(n->event_set_wait, "nvmlEventSetWait");
    n->sym(n->event_set_create, "nvmlEventSetCreate");  // optional: Xid events
    n->sym(n->register_events, "nvmlDeviceRegisterEvents");
    n->sym(n->event_set_free, "nvmlEventSetFree");
    if (!n->sym(n->processes, "nvmlDeviceGetComputeRunningProcesses_v3"))  // optional: processes on the GPUs
      n->sym(n->processes, "nvmlDeviceGetComputeRunningProcesses_v2");
    if (int rc = n->init(); rc != 0) {
      error = "nvmlInit failed with NVML error " + std::to_string(rc);
      return nullptr;
    }
    n->m_initialised = true;
    return n;
  }

  ~Nvml() {
    if (events && event_set_free) event_set_free(events);
    if (m_initialised) shutdown();
    ::dlclose(m_lib);
  }

  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned int*) = nullptr;
  int (*handle)(unsigned int, Device*) = nullptr;
  int (*uuid)(Device, char*, unsigned int) = nullptr;
  int (*name)(Device, char*, unsigned int) = nullptr;
  int (*memory)(Device, Memory*) = nullptr;
  int (*utilization)(Device, Utilization*) = nullptr;
  int (*pci_info)(Device, PciInfo*) = nullptr;
  int (*minor_number)(Device, unsigned int*) = nullptr;                // of /dev/nvidiaN
  int (*ecc_errors)(Device, int, int, unsigned long long*) = nullptr;  // (error type, counter type)
  int (*remapped_rows)(Device, unsigned int*, unsigned int*, unsigned int*, unsigned int*) = nullptr;
  int (*event_set_create)(void**) = nullptr;
  int (*register_events)(Device, unsigned long long, void*) = nullptr;
  int (*event_set_wait)(void*, EventData*, unsigned int) = nullptr;  // timeout in ms
  int (*event_set_free)(void*) = nullptr;
  int (*processes)(Device, unsigned int*, ProcessInfo*) = nullptr;  // (in: room, out: count)
  void* events = nullptr;  // the set the GPUs' Xid events are registered in, when NVML has one

  // The handle of each of `gpus` into `devices`; returns each one's NVML status (0: found).
  std::vector<int> handles(const std::vector<Gpu>& gpus, std::vector<Device>& devices) const {
    std::vector<int> rcs(gpus.size());
    devices.assign(gpus.size(), nullptr);
    for (std::size_t i = 0; i < gpus.size(); ++i) rcs[i] = handle(static_cast<unsigned int>(gpus[i].index), &devices[i]);
    return rcs;
  }

  // Registers each of `gpus` for critical Xid events; returns how many are watched.
  int watch_xids(const std::vector<Gpu>& gpus) {
    if (!event_set_create || !register_events || !event_set_wait || !event_set_free) return 0;
    if (!events && event_set_create(&events) != 0) {
      events = nullptr;
      return 0;
    }
    std::vector<Device> devices;
    const auto rcs = handles(gpus, devices);
    int watched = 0;
    for (std::size_t i = 0; i < gpus.size(); ++i)
      watched += rcs[i] == 0 && register_events(devices[i], k_xid_critical_error, events) == 0;
    return watched;
  }

  static constexpr unsigned long long k_xid_critical_error = 0x8;  // nvmlEventTypeXidCriticalError
  static constexpr int k_gpu_is_lost = 15;                // NVML_ERROR_GPU_IS_LOST
  static constexpr int k_insufficient_size = 7;           // NVML_ERROR_INSUFFICIENT_SIZE
  static constexpr unsigned long long k_value_not_available = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE
  static constexpr int k_uncorrected = 1, k_volatile = 0;  // NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC

 private:
  explicit Nvml(void* lib) : m_lib(lib) {}
  template <class F>
  bool sym(F& f, const char* symbol) {
    f = reinterpret_cast<F>(::dlsym(m_lib, symbol));
    return f != nullptr;
  }
  void* m_lib;
  bool m_initialised = false;
};

}  // namespace gpuq::daemon
