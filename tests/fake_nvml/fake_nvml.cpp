// A stand-in libnvidia-ml.so.1 for tests on machines without NVIDIA GPUs: it implements the NVML
// entry points gpuqd loads, for the GPUs listed in the file named by $GPUQ_FAKE_NVML. The file is
// read again on every call, so a test changes a GPU's readings or health while gpuqd runs. One
// line per GPU, fields separated by spaces:
//
//   UUID NAME TOTAL_MIB USED_MIB UTIL_PERCENT PCI_BUS ECC_UNCORRECTED REMAP_FAILED LOST [XIDS [PROCS]]
//
// NAME has no spaces; PCI_BUS is hexadecimal (domain 0, device 0); LOST=1 makes every call about
// that GPU return NVML_ERROR_GPU_IS_LOST, as NVML does for a GPU that fell off the bus; an ECC
// count of -1 answers NVML_ERROR_NOT_SUPPORTED. XIDS (default "-": none) is the GPU's critical
// Xid events so far, comma-separated; an event set registered for it delivers each once, in
// order, so a test appends one to raise it. "x" makes registering for its events NOT_SUPPORTED.
// PROCS (default "-": none) is the compute processes on the GPU, comma-separated PID:MIB ("PID:?"
// for a process whose memory the driver cannot report), as nvmlDeviceGetComputeRunningProcesses
// lists them; "x" makes that call NOT_SUPPORTED.
// Not installed; built only for the tests.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

enum : int {
  NVML_SUCCESS = 0,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_TIMEOUT = 10,
  NVML_ERROR_GPU_IS_LOST = 15
};
enum { MAX_GPUS = 64 };

struct Gpu {
  char uuid[96], name[96];
  unsigned long long total_mib, used_mib;
  unsigned util, bus;
  long long ecc;
  unsigned remap_failed, lost;
  char xids[256];
  char procs[1024];
};

struct ProcessInfo {  // nvmlProcessInfo_t (v2)
  unsigned pid;
  unsigned long long used_memory;
  unsigned gpu_instance, compute_instance;
};

struct EventData {  // nvmlEventData_t
  void* device;
  unsigned long long type, data;
  unsigned gpu_instance, compute_instance;
};

int g_event_set;                       // the one event set; its address is the handle
bool g_registered[MAX_GPUS];           // GPUs registered in it
unsigned g_delivered[MAX_GPUS];        // Xids of each already delivered

struct Memory {
  unsigned long long total, free, used;
};
struct Utilization {
  unsigned gpu, memory;
};
struct PciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};

int load(Gpu* gpus) {
  const char* path = getenv("GPUQ_FAKE_NVML");
  FILE* f = path ? std::fopen(path, "r") : nullptr;
  if (!f) return 0;
  int n = 0;
  char line[2048];
  while (n < MAX_GPUS && fgets(line, sizeof line, f)) {
    Gpu* g = &gpus[n];
    std::strcpy(g->xids, "-");
    std::strcpy(g->procs, "-");
    if (sscanf(line, "%95s %95s %llu %llu %u %x %lld %u %u %255s %1023s", g->uuid, g->name, &g->total_mib,
               &g->used_mib, &g->util, &g->bus, &g->ecc, &g->remap_failed, &g->lost, g->xids, g->procs) >= 9)
      ++n;
  }
  fclose(f);
  return n;
}

// The GPU a handle names, or null (with *rc set) when there is none or it is lost.
Gpu* gpu_of(void* device, Gpu* gpus, int* rc) {
  const int n = load(gpus);
  const std::uintptr_t i = reinterpret_cast<std::uintptr_t>(device);
  if (i == 0 || i > static_cast<std::uintptr_t>(n)) {
    *rc = NVML_ERROR_INVALID_ARGUMENT;
    return nullptr;
  }
  if (gpus[i - 1].lost) {
    *rc = NVML_ERROR_GPU_IS_LOST;
    return nullptr;
  }
  *rc = NVML_SUCCESS;
  return &gpus[i - 1];
}

// Calls f(gpu) for the GPU a handle names; returns what NVML would.
template <class F>
int with_gpu(void* device, F f) {
  Gpu gpus[MAX_GPUS];
  int rc;
  if (Gpu* g = gpu_of(device, gpus, &rc)) rc = f(*g);
  return rc;
}

}  // namespace

extern "C" {

int nvmlInit_v2(void) { return NVML_SUCCESS; }
int nvmlShutdown(void) { return NVML_SUCCESS; }

int nvmlDeviceGetCount_v2(unsigned* count) {
  Gpu gpus[MAX_GPUS];
  *count = static_cast<unsigned>(load(gpus));
  return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  Gpu gpus[MAX_GPUS];
  const int n = load(gpus);
  if (index >= static_cast<unsigned>(n)) return NVML_ERROR_INVALID_ARGUMENT;
  if (gpus[index].lost) return NVML_ERROR_GPU_IS_LOST;
  *device = reinterpret_cast<void*>(static_cast<std::uintptr_t>(index) + 1);
  return NVML_SUCCESS;
}

int nvmlDeviceGetUUID(void* device, char* out, unsigned size) {
  return with_gpu(device, [&](Gpu& g) {
    std::snprintf(out, size, "%s", g.uuid);
    return NVML_SUCCESS;
  });
}

int nvmlDeviceGetName(void* device, char* out, unsigned size) {
  return with_gpu(device, [&](Gpu& g) {
    std::snprintf(out, size, "%s", g.name);
    return NVML_SUCCESS;
  });
}

int nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  return with_gpu(device, [&](Gpu& g) {
    m->total = g.total_mib << 20;
    m->used = g.used_mib << 20;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
  });
}

int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  return with_gpu(device, [&](Gpu& g) {
    u->gpu = u->memory = g.util;
    return NVML_SUCCESS;
  });
}

int nvmlDeviceGetPciInfo_v3(void* device, PciInfo* p) {
  return with_gpu(device, [&](Gpu& g) {
    std::memset(p, 0, sizeof *p);
    p->bus = g.bus;
    std::snprintf(p->bus_id, sizeof p->bus_id, "00000000:%02X:00.0", g.bus);
    return NVML_SUCCESS;
  });
}

// error_type 1: NVML_MEMORY_ERROR_TYPE_UNCORRECTED; counter_type 0: NVML_VOLATILE_ECC
int nvmlDeviceGetTotalEccErrors(void* device, int error_type, int counter_type, unsigned long long* count) {
  return with_gpu(device, [&](Gpu& g) {
    if (error_type != 1 || counter_type != 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (g.ecc < 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = static_cast<unsigned long long>(g.ecc);
    return NVML_SUCCESS;
  });
}

int nvmlDeviceGetRemappedRows(void* device, unsigned* corrected, unsigned* uncorrected, unsigned* pending,
                              unsigned* failed) {
  return with_gpu(device, [&](Gpu& g) {
    *corrected = *uncorrected = *pending = 0;
    *failed = g.remap_failed;
    return NVML_SUCCESS;
  });
}

// As the driver: *count in is the room in `infos`; out, how many there are (with
// NVML_ERROR_INSUFFICIENT_SIZE when they do not fit).
int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned* count, ProcessInfo* infos) {
  return with_gpu(device, [&](Gpu& g) {
    if (std::strcmp(g.procs, "x") == 0) return NVML_ERROR_NOT_SUPPORTED;
    unsigned n = 0;
    const unsigned room = *count;
    for (char* p = g.procs; *p && *p != '-';) {
      const unsigned pid = static_cast<unsigned>(std::strtoul(p, &p, 10));
      unsigned long long bytes = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE
      if (*p == ':') ++p;
      if (*p == '?') ++p;
      else bytes = std::strtoull(p, &p, 10) << 20;
      if (n < room && infos) infos[n] = {pid, bytes, 0xFFFFFFFFu, 0xFFFFFFFFu};
      ++n;
      if (*p != ',') break;
      ++p;
    }
    *count = n;
    return n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
  });
}

int nvmlEventSetCreate(void** set) {
  *set = &g_event_set;
  return NVML_SUCCESS;
}

int nvmlEventSetFree(void* set) { return set == &g_event_set ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT; }

int nvmlDeviceRegisterEvents(void* device, unsigned long long types, void* set) {
  if (set != &g_event_set || !(types & 0x8)) return NVML_ERROR_INVALID_ARGUMENT;
  const std::uintptr_t i = reinterpret_cast<std::uintptr_t>(device);
  return with_gpu(device, [&](Gpu& g) {
    if (std::strcmp(g.xids, "x") == 0) return NVML_ERROR_NOT_SUPPORTED;
    g_registered[i - 1] = true;
    return NVML_SUCCESS;
  });
}

// Delivers the next undelivered Xid of a registered GPU; never waits (the file is the driver).
int nvmlEventSetWait_v2(void* set, EventData* data, unsigned /*timeout_ms*/) {
  if (set != &g_event_set) return NVML_ERROR_INVALID_ARGUMENT;
  Gpu gpus[MAX_GPUS];
  const int n = load(gpus);
  for (int i = 0; i < n; ++i) {
    if (!g_registered[i] || gpus[i].xids[0] == '-' || gpus[i].xids[0] == 'x') continue;
    unsigned k = 0;
    for (char* p = gpus[i].xids; *p; ++k) {
      const unsigned long long xid = std::strtoull(p, &p, 10);
      if (k == g_delivered[i]) {
        ++g_delivered[i];
        std::memset(data, 0, sizeof *data);
        data->device = reinterpret_cast<void*>(static_cast<std::uintptr_t>(i) + 1);
        data->type = 0x8;  // nvmlEventTypeXidCriticalError
        data->data = xid;
        return NVML_SUCCESS;
      }
      if (*p == ',') ++p;
      else break;
    }
  }
  return NVML_ERROR_TIMEOUT;
}

}  // extern "C"
