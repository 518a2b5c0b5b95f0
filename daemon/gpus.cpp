// What the GPUs say of a failed attempt (their handlers: `gpus` is queries::gpus, `drain` and
// `undrain` control::set_drained). What they are made of: gpu_service.hpp (in and out of service, health checks) and
// gpu_processes.hpp (what runs on them).
#include "daemon/daemon.hpp"

#include <algorithm>
#include <iostream>

#include "daemon/lifecycle.hpp"

namespace gpuq::daemon {

std::string Daemon::gpu_failure_notes(const JobRecord& r, const json& failure) {
  if (r.run.gpus.empty() || m_inventory.source().rfind("nvml", 0) != 0) return "";
  std::vector<std::string> notes;
  const auto cls = failure.is_object() ? failure.find("class") : failure.end();
  if (failure.is_object() && cls != failure.end() && *cls == "cuda_oom") {
    if (m_gpu_processes.on()) m_gpu_processes.look();  // the latest
    std::map<int, std::int64_t> totals;
    for (const auto& g : m_inventory.gpus()) totals[g.index] = g.memory_total_mb;
    notes = m_gpu_processes.oom_notes(r.id, totals, [this](int pid) {
      const auto owner = common::process_owner(pid);
      return owner ? m_users.name_of(*owner) : std::string();
    });
  }
  for (auto& n : m_health.xids_since(r.run.gpus, r.run.started_at)) notes.push_back(std::move(n));
  std::string out;
  for (const auto& n : notes) out += (out.empty() ? "" : "; ") + n;
  return out;
}

}  // namespace gpuq::daemon
