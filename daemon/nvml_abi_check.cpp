// Compile-time proof that the NVML types gpuq declares by hand (daemon/nvml.hpp) match the real
// ones in the CUDA toolkit's nvml.h: every function pointer against its prototype (as many
// parameters, each of the same size and kind, the pointed-to structures of the same size), every
// structure field at the same offset, every constant the same value. Built only where nvml.h is
// found (the CUDA build, scripts/cuda-build.sh, requires it); it has no code.
// Every symbol under its own name: nvml.h would otherwise #define nvmlEventSetWait to its _v2.
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <cstddef>
#include <type_traits>

#include "daemon/nvml.hpp"

namespace gpuq::daemon {
namespace {

template <class T>
constexpr bool is_complete(...) { return false; }
template <class T, std::size_t = sizeof(T)>
constexpr bool is_complete(int) { return true; }

// Ours and theirs pass the same way: integers and enums of one size, or pointers to the same
// kind of thing. A pointer to void (our opaque handles) matches one to an incomplete struct
// (nvmlDevice_t, nvmlEventSet_t).
template <class Ours, class Theirs>
constexpr bool same_kind() {
  if constexpr (std::is_pointer_v<Ours> != std::is_pointer_v<Theirs>) {
    return false;
  } else if constexpr (std::is_pointer_v<Ours>) {
    using O = std::remove_cv_t<std::remove_pointer_t<Ours>>;
    using T = std::remove_cv_t<std::remove_pointer_t<Theirs>>;
    if constexpr (std::is_void_v<O>)
      return std::is_void_v<T> || !is_complete<T>(0);
    else if constexpr (std::is_pointer_v<O> || std::is_pointer_v<T>)
      return same_kind<O, T>();
    else if constexpr (std::is_class_v<O>)
      return std::is_class_v<T> && sizeof(O) == sizeof(T);
    else
      return std::is_same_v<O, T>;
  } else {
    return (std::is_integral_v<Ours> || std::is_enum_v<Ours>) && (std::is_integral_v<Theirs> || std::is_enum_v<Theirs>) &&
           sizeof(Ours) == sizeof(Theirs);
  }
}

template <class R1, class... A1, class R2, class... A2>
constexpr bool same_signature(R1 (*)(A1...), R2 (*)(A2...)) {
  if constexpr (sizeof...(A1) != sizeof...(A2))
    return false;
  else
    return same_kind<R1, R2>() && (same_kind<A1, A2>() && ...);
}

template <class F>
constexpr F pointer_of(F Nvml::*) { return nullptr; }

#define GPUQ_NVML_SAME(member, function) \
  static_assert(same_signature(pointer_of(&Nvml::member), &function), "Nvml::" #member " does not match " #function)

GPUQ_NVML_SAME(init, nvmlInit_v2);
GPUQ_NVML_SAME(shutdown, nvmlShutdown);
GPUQ_NVML_SAME(count, nvmlDeviceGetCount_v2);
GPUQ_NVML_SAME(handle, nvmlDeviceGetHandleByIndex_v2);
GPUQ_NVML_SAME(uuid, nvmlDeviceGetUUID);
GPUQ_NVML_SAME(name, nvmlDeviceGetName);
GPUQ_NVML_SAME(memory, nvmlDeviceGetMemoryInfo);
GPUQ_NVML_SAME(utilization, nvmlDeviceGetUtilizationRates);
GPUQ_NVML_SAME(pci_info, nvmlDeviceGetPciInfo_v3);
GPUQ_NVML_SAME(pci_info, nvmlDeviceGetPciInfo_v2);
GPUQ_NVML_SAME(minor_number, nvmlDeviceGetMinorNumber);
GPUQ_NVML_SAME(ecc_errors, nvmlDeviceGetTotalEccErrors);
GPUQ_NVML_SAME(remapped_rows, nvmlDeviceGetRemappedRows);
GPUQ_NVML_SAME(event_set_create, nvmlEventSetCreate);
GPUQ_NVML_SAME(register_events, nvmlDeviceRegisterEvents);
GPUQ_NVML_SAME(event_set_wait, nvmlEventSetWait_v2);
GPUQ_NVML_SAME(event_set_wait, nvmlEventSetWait);
GPUQ_NVML_SAME(event_set_free, nvmlEventSetFree);
GPUQ_NVML_SAME(processes, nvmlDeviceGetComputeRunningProcesses_v3);
GPUQ_NVML_SAME(processes, nvmlDeviceGetComputeRunningProcesses_v2);

#define GPUQ_NVML_FIELD(ours, theirs, a, b)                                                               \
  static_assert(offsetof(Nvml::ours, a) == offsetof(theirs, b) && sizeof(Nvml::ours::a) == sizeof(theirs::b), \
                "Nvml::" #ours "::" #a " is not " #theirs "::" #b)

static_assert(sizeof(Nvml::Memory) == sizeof(nvmlMemory_t));
GPUQ_NVML_FIELD(Memory, nvmlMemory_t, total, total);
GPUQ_NVML_FIELD(Memory, nvmlMemory_t, free, free);
GPUQ_NVML_FIELD(Memory, nvmlMemory_t, used, used);
static_assert(sizeof(Nvml::Utilization) == sizeof(nvmlUtilization_t));
GPUQ_NVML_FIELD(Utilization, nvmlUtilization_t, gpu, gpu);
GPUQ_NVML_FIELD(Utilization, nvmlUtilization_t, memory, memory);
static_assert(sizeof(Nvml::PciInfo) == sizeof(nvmlPciInfo_t));
GPUQ_NVML_FIELD(PciInfo, nvmlPciInfo_t, bus_id_legacy, busIdLegacy);
GPUQ_NVML_FIELD(PciInfo, nvmlPciInfo_t, domain, domain);
GPUQ_NVML_FIELD(PciInfo, nvmlPciInfo_t, bus, bus);
GPUQ_NVML_FIELD(PciInfo, nvmlPciInfo_t, device, device);
GPUQ_NVML_FIELD(PciInfo, nvmlPciInfo_t, pci_device_id, pciDeviceId);
GPUQ_NVML_FIELD(PciInfo, nvmlPciInfo_t, pci_subsystem_id, pciSubSystemId);
GPUQ_NVML_FIELD(PciInfo, nvmlPciInfo_t, bus_id, busId);
static_assert(sizeof(Nvml::EventData) == sizeof(nvmlEventData_t));
GPUQ_NVML_FIELD(EventData, nvmlEventData_t, device, device);
GPUQ_NVML_FIELD(EventData, nvmlEventData_t, type, eventType);
GPUQ_NVML_FIELD(EventData, nvmlEventData_t, data, eventData);
GPUQ_NVML_FIELD(EventData, nvmlEventData_t, gpu_instance, gpuInstanceId);
GPUQ_NVML_FIELD(EventData, nvmlEventData_t, compute_instance, computeInstanceId);
static_assert(sizeof(Nvml::ProcessInfo) == sizeof(nvmlProcessInfo_t));
static_assert(sizeof(Nvml::ProcessInfo) == sizeof(nvmlProcessInfo_v2_t));
GPUQ_NVML_FIELD(ProcessInfo, nvmlProcessInfo_t, pid, pid);
GPUQ_NVML_FIELD(ProcessInfo, nvmlProcessInfo_t, used_memory, usedGpuMemory);
GPUQ_NVML_FIELD(ProcessInfo, nvmlProcessInfo_t, gpu_instance, gpuInstanceId);
GPUQ_NVML_FIELD(ProcessInfo, nvmlProcessInfo_t, compute_instance, computeInstanceId);

static_assert(Nvml::k_insufficient_size == NVML_ERROR_INSUFFICIENT_SIZE);
static_assert(Nvml::k_value_not_available == static_cast<unsigned long long>(NVML_VALUE_NOT_AVAILABLE));
static_assert(Nvml::k_xid_critical_error == nvmlEventTypeXidCriticalError);
static_assert(Nvml::k_gpu_is_lost == NVML_ERROR_GPU_IS_LOST);
static_assert(Nvml::k_uncorrected == NVML_MEMORY_ERROR_TYPE_UNCORRECTED);
static_assert(Nvml::k_volatile == NVML_VOLATILE_ECC);
static_assert(NVML_SUCCESS == 0);  // gpuq reads 0 as success

}  // namespace
}  // namespace gpuq::daemon
