// The GPUs' handlers: `gpus`, `drain` and `undrain` (admins'), and what the GPUs say of a failed
// attempt. What they are made of: gpu_service.hpp (in and out of service, health checks) and
// gpu_processes.hpp (what runs on them).
#include "daemon/daemon.hpp"

#include <algorithm>
#include <fstream>
#include <iostream>

#include "daemon/lifecycle.hpp"

namespace gpuq::daemon {

json Daemon::cmd_gpus() { return gpus_reply(); }

common::GpusReply Daemon::gpus_reply() {
  common::GpusReply out;
  out.source = m_inventory.source();
  out.scheduling_passes = m_last_pass.number();
  out.health_checks = m_health.checks();
  out.events_reads = m_events.reads().reads;
  out.events_read_max_bytes = m_events.reads().max_bytes;
  auto readings = m_inventory.read();
  const auto processes = m_gpu_processes.list();
  for (std::size_t i = 0; i < m_inventory.gpus().size(); ++i) {
    const auto& g = m_inventory.gpus()[i];
    common::GpuInfo info;
    info.index = g.index;
    info.uuid = g.uuid;
    info.name = g.name;
    info.memory_total_mb = g.memory_total_mb;
    if (g.numa_node >= 0) info.numa_node = g.numa_node;
    if (auto d = m_health.drained().find(g.uuid); d != m_health.drained().end()) {
      info.drained = true;
      info.drain_reason = d->second;
    }
    if (readings[i].memory_used_mb) info.memory_used_mb = *readings[i].memory_used_mb;
    if (readings[i].utilization) info.utilization = *readings[i].utilization;
    if (processes[i]) {
      info.processes = json::array();
      for (const auto& p : *processes[i]) {
        common::GpuProcessInfo pi;
        pi.pid = p.pid;
        if (p.used_mb) pi.used_mb = *p.used_mb;
        if (p.job) pi.job = p.job;
        else info.foreign_mb += p.used_mb.value_or(0);
        if (const auto owner = common::process_owner(p.pid)) pi.user = m_users.name_of(*owner);
        std::ifstream comm("/proc/" + std::to_string(p.pid) + "/comm");  // at most 16 bytes: the kernel's
        std::getline(comm, pi.command);
        for (char& c : pi.command)  // any process names itself: nothing for a terminal to act on
          if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
        info.processes.push_back(pi);
      }
    }
    for (const Active& a : m_jobs.running()) {
      if (std::find(a.rec.run.gpus.begin(), a.rec.run.gpus.end(), g.index) == a.rec.run.gpus.end()) continue;
      info.jobs.push_back(a.rec.id);
      info.allocated_mb += a.rec.spec.shared ? a.rec.spec.gpu_memory_mb : g.memory_total_mb;
      info.exclusive = info.exclusive || !a.rec.spec.shared;
    }
    out.gpus.push_back(std::move(info));
  }
  const CpuSlots cpu = cpu_pool();
  out.cpu_slots = cpu.total;
  for (int slot : cpu.taken) out.cpu_slots_used += slot < cpu.total;
  out.cores = common::format_cpu_list(m_cores.cores);
  return out;
}

json Daemon::set_drained(const Caller& caller, const common::DrainRequest& q, bool drained) {
  reads().authorize_admin(caller, drained ? "drain GPUs" : "undrain GPUs");
  m_health.set_drained(q, drained);
  return cmd_gpus();
}

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
