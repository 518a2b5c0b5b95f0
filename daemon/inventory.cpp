// GPU discovery: NVML through dlopen, or fake GPUs (see inventory.hpp).
#include "daemon/inventory.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <sstream>

namespace gpuq::daemon {

// The few NVML entry points gpuq needs, declared here so no NVML header is required to build.
class Nvml {
 public:
  using Device = void*;
  struct Memory {
    unsigned long long total, free, used;
  };
  struct Utilization {
    unsigned int gpu, memory;
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
    if (int rc = n->init(); rc != 0) {
      error = "nvmlInit failed with NVML error " + std::to_string(rc);
      return nullptr;
    }
    n->m_initialised = true;
    return n;
  }

  ~Nvml() {
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

std::vector<Gpu> filter_visible(const std::vector<Gpu>& all, const std::string& visible) {
  std::vector<Gpu> out;
  std::stringstream in(visible);
  for (std::string item; std::getline(in, item, ',');) {
    const Gpu* match = nullptr;
    if (!item.empty() && item.find_first_not_of("0123456789") == std::string::npos) {
      int idx = std::stoi(item);
      for (const auto& g : all)
        if (g.index == idx) match = &g;
    } else if (item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0) {
      for (const auto& g : all)
        if (g.uuid.rfind(item, 0) == 0) match = &g;
    }
    if (!match) break;  // CUDA ignores everything after the first invalid entry
    bool dup = false;
    for (const auto& g : out) dup |= g.index == match->index;
    if (!dup) out.push_back(*match);
  }
  return out;
}

Inventory::Inventory(Inventory&&) noexcept = default;
Inventory& Inventory::operator=(Inventory&&) noexcept = default;
Inventory::~Inventory() = default;

Result<Inventory> Inventory::create(const std::string& spec, const std::optional<std::string>& visible) {
  Inventory inv;
  std::vector<Gpu> all;
  if (spec.rfind("fake:", 0) == 0) {
    int n = 0;
    long long mib = 81920;
    char extra = 0;
    int got = std::sscanf(spec.c_str(), "fake:%d:%lld%c", &n, &mib, &extra);
    if (got < 1 || got > 2 || n < 0 || n > 1024 || mib <= 0)
      return Error{ErrorCode::bad_request, "--gpus " + spec + ": expected fake:N or fake:N:MiB, e.g. fake:4:81920"};
    for (int i = 0; i < n; ++i) {
      char uuid[64];
      std::snprintf(uuid, sizeof(uuid), "GPU-fake0000-0000-0000-0000-%012d", i);
      all.push_back({i, uuid, "Fake GPU", mib});
    }
    inv.m_source = "fake:" + std::to_string(n) + ":" + std::to_string(mib);
  } else if (spec == "none") {
    inv.m_source = "none";
  } else if (spec == "auto" || spec == "nvml") {
    std::string error;
    inv.m_nvml = Nvml::load(error);
    if (!inv.m_nvml) {
      if (spec == "nvml") return Error{ErrorCode::unavailable, "--gpus nvml: " + error};
      inv.m_source = "none (" + error + ")";
    } else {
      unsigned int count = 0;
      inv.m_nvml->count(&count);
      for (unsigned int i = 0; i < count; ++i) {
        Nvml::Device d = nullptr;
        if (inv.m_nvml->handle(i, &d) != 0) continue;
        char uuid[96] = {0}, name[96] = {0};
        Nvml::Memory mem{};
        inv.m_nvml->uuid(d, uuid, sizeof(uuid));
        inv.m_nvml->name(d, name, sizeof(name));
        inv.m_nvml->memory(d, &mem);
        all.push_back({static_cast<int>(i), uuid, name, static_cast<std::int64_t>(mem.total >> 20)});
      }
      inv.m_source = "nvml";
    }
  } else {
    return Error{ErrorCode::bad_request, "--gpus " + spec + ": expected auto, nvml, none or fake:N[:MiB]"};
  }
  inv.m_gpus = visible ? filter_visible(all, *visible) : all;
  if (visible) inv.m_source += " (CUDA_VISIBLE_DEVICES=" + *visible + ")";
  return inv;
}

const Gpu* Inventory::find(int index) const {
  for (const auto& g : m_gpus)
    if (g.index == index) return &g;
  return nullptr;
}

std::vector<GpuReading> Inventory::read() const {
  std::vector<GpuReading> out(m_gpus.size());
  if (!m_nvml) return out;
  for (std::size_t i = 0; i < m_gpus.size(); ++i) {
    Nvml::Device d = nullptr;
    if (m_nvml->handle(static_cast<unsigned int>(m_gpus[i].index), &d) != 0) continue;
    Nvml::Memory mem{};
    if (m_nvml->memory(d, &mem) == 0) out[i].memory_used_mb = static_cast<std::int64_t>(mem.used >> 20);
    Nvml::Utilization u{};
    if (m_nvml->utilization(d, &u) == 0) out[i].utilization = static_cast<int>(u.gpu);
  }
  return out;
}

}  // namespace gpuq::daemon
