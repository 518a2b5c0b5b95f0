// GPU discovery: NVML through dlopen, or fake GPUs (see inventory.hpp).
#include "daemon/inventory.hpp"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "daemon/nvml.hpp"

namespace gpuq::daemon {

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

int pci_numa_node(const std::string& sys_root, unsigned domain, unsigned bus, unsigned device) {
  char address[32];
  std::snprintf(address, sizeof(address), "%04x:%02x:%02x.0", domain, bus, device);
  std::ifstream in(sys_root + "/bus/pci/devices/" + address + "/numa_node");
  int node = -1;
  if (!(in >> node) || node < 0) return -1;
  return node;
}

namespace {

// "fake:N[:MiB[:NODES]]" -> N fake GPUs; `source` gets the spec with the defaults filled in.
Result<std::vector<Gpu>> fake_gpus(const std::string& spec, std::string& source) {
  const Error bad{ErrorCode::bad_request,
                  "--gpus " + spec + ": expected fake:N, fake:N:MiB or fake:N:MiB:NODES, e.g. fake:4:81920:0,0,1,1"};
  std::vector<std::string> parts;
  std::stringstream in(spec);
  for (std::string part; std::getline(in, part, ':');)
    parts.push_back(part);
  auto number = [](const std::string& text, long long lo, long long hi) -> std::optional<long long> {
    if (text.empty() || text.size() > 12 || text.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    const long long v = std::stoll(text);
    if (v < lo || v > hi) return std::nullopt;
    return v;
  };
  if (parts.size() < 2 || parts.size() > 4 || spec.back() == ':') return bad;
  const auto n = number(parts[1], 0, 1024);
  const auto mib = parts.size() > 2 ? number(parts[2], 1, 1LL << 40) : std::optional<long long>(81920);
  if (!n || !mib) return bad;
  std::vector<int> nodes;
  if (parts.size() == 4) {
    std::stringstream list(parts[3]);
    for (std::string item; std::getline(list, item, ',');) {
      const auto node = number(item, 0, 4095);
      if (!node) return bad;
      nodes.push_back(static_cast<int>(*node));
    }
    if (nodes.size() != static_cast<std::size_t>(*n) || parts[3].back() == ',')
      return Error{ErrorCode::bad_request, "--gpus " + spec + ": NODES names " + std::to_string(nodes.size()) +
                                               " NUMA node(s) for " + std::to_string(*n) + " GPU(s); give one per GPU"};
  }
  source = "fake:" + std::to_string(*n) + ":" + std::to_string(*mib) + (parts.size() == 4 ? ":" + parts[3] : "");
  std::vector<Gpu> out;
  for (int i = 0; i < *n; ++i) {
    char uuid[64];
    std::snprintf(uuid, sizeof(uuid), "GPU-fake0000-0000-0000-0000-%012d", i);
    out.push_back({i, uuid, "Fake GPU", *mib, nodes.empty() ? -1 : nodes[static_cast<std::size_t>(i)], i});
  }
  return out;
}

}  // namespace

Inventory::Inventory(Inventory&&) noexcept = default;
Inventory& Inventory::operator=(Inventory&&) noexcept = default;
Inventory::~Inventory() = default;

Result<Inventory> Inventory::create(const std::string& spec, const std::optional<std::string>& visible,
                                    const std::string& sys_root) {
  Inventory inv;
  std::vector<Gpu> all;
  if (spec.rfind("fake:", 0) == 0) {
    auto fake = fake_gpus(spec, inv.m_source);
    if (!fake) return fake.error();
    all = std::move(*fake);
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
        Nvml::PciInfo pci{};
        const int node = inv.m_nvml->pci_info && inv.m_nvml->pci_info(d, &pci) == 0
                             ? pci_numa_node(sys_root, pci.domain, pci.bus, pci.device)
                             : -1;
        unsigned int node_minor = 0;
        const bool has_minor = inv.m_nvml->minor_number && inv.m_nvml->minor_number(d, &node_minor) == 0;
        all.push_back({static_cast<int>(i), uuid, name, static_cast<std::int64_t>(mem.total >> 20), node,
                       has_minor ? static_cast<int>(node_minor) : -1});
      }
      inv.m_source = "nvml";
    }
  } else {
    return Error{ErrorCode::bad_request, "--gpus " + spec + ": expected auto, nvml, none or fake:N[:MiB[:NODES]]"};
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

std::vector<std::optional<std::vector<GpuProcess>>> Inventory::processes() const {
  std::vector<std::optional<std::vector<GpuProcess>>> out(m_gpus.size());
  if (!m_nvml || !m_nvml->processes) return out;
  std::vector<Nvml::Device> devices;
  const auto rcs = m_nvml->handles(m_gpus, devices);
  std::vector<Nvml::ProcessInfo> infos(64);
  for (std::size_t i = 0; i < m_gpus.size(); ++i) {
    if (rcs[i] != 0) continue;
    unsigned int n = static_cast<unsigned int>(infos.size());
    int rc = m_nvml->processes(devices[i], &n, infos.data());
    if (rc == Nvml::k_insufficient_size && n > infos.size()) {  // more than fit: once more with room for them
      infos.resize(std::min<unsigned>(n + 16, k_max_gpu_processes));
      n = static_cast<unsigned int>(infos.size());
      rc = m_nvml->processes(devices[i], &n, infos.data());
    }
    if (rc != 0) continue;
    auto& list = out[i].emplace();
    for (unsigned int k = 0; k < n && k < infos.size(); ++k) {
      GpuProcess p{static_cast<int>(infos[k].pid), std::nullopt};
      if (infos[k].used_memory != Nvml::k_value_not_available)
        p.used_mb = static_cast<std::int64_t>(infos[k].used_memory >> 20);
      list.push_back(p);
    }
  }
  return out;
}

int Inventory::watch_xids() { return m_nvml ? m_nvml->watch_xids(m_gpus) : 0; }

std::vector<GpuHealth> Inventory::health() const {
  std::vector<GpuHealth> out(m_gpus.size());
  if (!m_nvml) return out;
  std::vector<Nvml::Device> devices;
  const auto rcs = m_nvml->handles(m_gpus, devices);
  // The Xid events since the last call, without waiting; a bounded number, so a GPU flooding
  // them cannot hold gpuqd's thread (the rest are read at the next check).
  if (m_nvml->events) {
    Nvml::EventData ev{};
    for (int n = 0; n < 1024 && m_nvml->event_set_wait(m_nvml->events, &ev, 0) == 0; ++n, ev = {})
      for (std::size_t i = 0; i < devices.size(); ++i)
        if (rcs[i] == 0 && devices[i] == ev.device && (ev.type & Nvml::k_xid_critical_error))
          out[i].xids.push_back(ev.data);
  }
  for (std::size_t i = 0; i < m_gpus.size(); ++i) {
    Nvml::Device d = devices[i];
    const int rc = rcs[i];
    Nvml::Memory mem{};
    if (rc == Nvml::k_gpu_is_lost || (rc == 0 && m_nvml->memory(d, &mem) == Nvml::k_gpu_is_lost)) {
      out[i].lost = true;
      continue;
    }
    if (rc != 0) continue;
    unsigned long long ecc = 0;
    if (m_nvml->ecc_errors && m_nvml->ecc_errors(d, Nvml::k_uncorrected, Nvml::k_volatile, &ecc) == 0)
      out[i].ecc_uncorrected = ecc;
    unsigned int corrected = 0, uncorrected = 0, pending = 0, failed = 0;
    if (m_nvml->remapped_rows && m_nvml->remapped_rows(d, &corrected, &uncorrected, &pending, &failed) == 0)
      out[i].remap_failed = failed != 0;
  }
  return out;
}

std::string xid_words(std::uint64_t xid) {
  // The common ones an application meets, from NVIDIA's Xid catalog; those needing a reset as
  // xid_problem names them.
  static const std::map<std::uint64_t, const char*> k_known{
      {13, "graphics engine exception: often an out-of-range access by the application"},
      {31, "GPU memory page fault: often an illegal address in the application"},
      {43, "the GPU stopped processing: the application was torn down after an error"},
      {45, "preemptive cleanup after an earlier error"},
      {63, "ECC page retirement or row remapping recorded"},
      {92, "high single-bit ECC error rate"},
      {94, "contained ECC error: the GPU stays fit for new work"}};
  if (auto fatal = xid_problem(xid); !fatal.empty())  // "Xid 79: what" -> "Xid 79 (what)"
    return fatal.replace(fatal.find(": "), 2, " (") + ")";
  auto it = k_known.find(xid);
  return "Xid " + std::to_string(xid) + (it == k_known.end() ? "" : std::string(" (") + it->second + ")");
}

std::string xid_problem(std::uint64_t xid) {
  // The Xids whose immediate action in NVIDIA's Xid catalog is a GPU reset or a reboot. The rest
  // are left alone: most are the application's own (13, 31, 43, 45 …), and a contained ECC error
  // (94) ends only the job that touched the memory, the GPU staying fit for new work.
  static const std::map<std::uint64_t, const char*> k_fatal{
      {48, "double-bit ECC error"},       {62, "internal micro-controller halt"},
      {64, "ECC row remapping failed"},   {74, "NVLink error"},
      {79, "the GPU fell off the bus"},   {95, "uncontained ECC error"},
      {119, "GSP RPC timeout"},           {120, "GSP error"},
      {140, "unrecovered ECC error"}};
  auto it = k_fatal.find(xid);
  return it == k_fatal.end() ? "" : "Xid " + std::to_string(xid) + ": " + it->second;
}

std::string health_problem(const GpuHealth& now, std::optional<std::uint64_t> ecc_base) {
  if (now.lost) return "the GPU is lost (fell off the bus; NVML_ERROR_GPU_IS_LOST)";
  for (auto xid : now.xids)
    if (auto problem = xid_problem(xid); !problem.empty()) return problem;
  if (now.remap_failed) return "memory row remapping failed";
  if (now.ecc_uncorrected && *now.ecc_uncorrected > ecc_base.value_or(0)) {
    const auto n = *now.ecc_uncorrected - ecc_base.value_or(0);
    return std::to_string(n) + " new uncorrectable ECC error" + (n == 1 ? "" : "s");
  }
  return "";
}

namespace {
// The minors of `dev`'s /dev/nvidiaN character nodes (nvidiactl is 255, nvidia-modeset 254: not
// named so), listed again only when the directory changed (a node made or removed changes its
// mtime): an attempt's start reads no directory of a few hundred entries. A listing is kept only
// once the directory's mtime is two seconds old: a kernel stamps it from a coarse clock (a tick,
// before 6.13), so a node made in the tick of a listing would leave the mtime as it was.
std::vector<unsigned> nvidia_node_minors(const std::string& dev) {
  struct Seen {
    std::string dev;
    dev_t device = 0;
    ino_t inode = 0;
    timespec mtime{};
    std::vector<unsigned> minors;
  };
  thread_local std::optional<Seen> seen;
  struct stat d {};
  const bool known = ::stat(dev.c_str(), &d) == 0;
  if (known && seen && seen->dev == dev && seen->device == d.st_dev && seen->inode == d.st_ino &&
      seen->mtime.tv_sec == d.st_mtim.tv_sec && seen->mtime.tv_nsec == d.st_mtim.tv_nsec)
    return seen->minors;
  std::vector<unsigned> minors;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dev, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= 6 || name.compare(0, 6, "nvidia") != 0 ||
        name.find_first_not_of("0123456789", 6) != std::string::npos)
      continue;
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0 || !S_ISCHR(st.st_mode) || major(st.st_rdev) != k_nvidia_major) continue;
    minors.push_back(minor(st.st_rdev));
  }
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  if (known && now.tv_sec - d.st_mtim.tv_sec >= 2)
    seen = Seen{dev, d.st_dev, d.st_ino, d.st_mtim, minors};
  else
    seen.reset();
  return minors;
}
}  // namespace

std::vector<std::pair<unsigned, unsigned>> denied_gpu_devices(const std::vector<Gpu>& gpus,
                                                              const std::vector<int>& given, const std::string& dev) {
  std::set<unsigned> mine, denied;
  bool all_known = true;  // a GPU whose minor is unknown may be any /dev/nvidiaN: none is denied by the scan
  for (const auto& g : gpus) {
    all_known = all_known && g.minor >= 0;
    if (g.minor >= 0)
      (std::find(given.begin(), given.end(), g.index) != given.end() ? mine : denied)
          .insert(static_cast<unsigned>(g.minor));
  }
  // Every /dev/nvidiaN gpuqd does not serve too.
  if (all_known)
    for (unsigned m : nvidia_node_minors(dev))
      if (!mine.count(m)) denied.insert(m);
  std::vector<std::pair<unsigned, unsigned>> out;
  for (unsigned m : denied)
    if (!mine.count(m)) out.emplace_back(k_nvidia_major, m);
  return out;
}

}  // namespace gpuq::daemon
