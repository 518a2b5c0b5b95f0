// The GPUs: `gpus`, taking GPUs out of service and back (`drain`, `undrain`), and the periodic
// NVML health checks that drain a failing one.
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
  out.scheduling_passes = m_pass;
  out.health_checks = m_health_checks;
  out.events_reads = m_events_reads.reads;
  out.events_read_max_bytes = m_events_reads.max_bytes;
  auto readings = m_inventory.read();
  const auto processes = gpu_processes();
  for (std::size_t i = 0; i < m_inventory.gpus().size(); ++i) {
    const auto& g = m_inventory.gpus()[i];
    common::GpuInfo info;
    info.index = g.index;
    info.uuid = g.uuid;
    info.name = g.name;
    info.memory_total_mb = g.memory_total_mb;
    if (g.numa_node >= 0) info.numa_node = g.numa_node;
    if (auto d = m_drained.find(g.uuid); d != m_drained.end()) {
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
    for (std::int64_t id : m_running) {
      const Active& a = m_active.at(id);
      if (std::find(a.rec.run.gpus.begin(), a.rec.run.gpus.end(), g.index) == a.rec.run.gpus.end()) continue;
      info.jobs.push_back(id);
      info.allocated_mb += a.rec.spec.shared ? a.rec.spec.gpu_memory_mb : g.memory_total_mb;
      info.exclusive = info.exclusive || !a.rec.spec.shared;
    }
    out.gpus.push_back(std::move(info));
  }
  const CpuSlots cpu = cpu_pool();
  out.cpu_slots = cpu.total;
  for (int slot : cpu.taken) out.cpu_slots_used += slot < cpu.total;
  out.cores = common::format_cpu_list(m_cores);
  return out;
}

json Daemon::cmd_drain(const Caller& caller, const common::DrainRequest& q) {
  authorize_admin(caller, "drain GPUs");
  return set_drained(q, true);
}
json Daemon::cmd_undrain(const Caller& caller, const common::DrainRequest& q) {
  authorize_admin(caller, "undrain GPUs");
  return set_drained(q, false);
}

// Takes GPUs out of service (as Slurm's drain) or back: a drained GPU is given to no job, while
// the jobs already on it run on. Kept by UUID in the store, so it stays drained across restarts
// even if indices change. Answers with the GPUs as `gpus` does.
json Daemon::set_drained(const common::DrainRequest& q, bool drain) {
  std::vector<const Gpu*> targets;
  for (int index : q.gpus) {
    const Gpu* g = m_inventory.find(index);
    if (!g) {
      std::string have;
      for (const auto& x : m_inventory.gpus()) have += (have.empty() ? "" : ", ") + std::to_string(x.index);
      throw RequestError(ErrorCode::not_found, "no GPU " + std::to_string(index) + "; this machine has " +
                                                   (have.empty() ? "none" : "GPUs " + have) + " (" +
                                                   m_inventory.source() + ")");
    }
    targets.push_back(g);
  }
  for (const auto& prefix : q.uuids) {
    std::vector<const Gpu*> found;
    for (const auto& g : m_inventory.gpus())
      if (g.uuid.rfind(prefix, 0) == 0) found.push_back(&g);
    if (found.size() != 1)
      throw RequestError(found.empty() ? ErrorCode::not_found : ErrorCode::bad_request,
                         found.empty() ? "no GPU with UUID " + prefix + " (" + m_inventory.source() + ")"
                                       : "UUID prefix " + prefix + " names GPUs " + std::to_string(found[0]->index) +
                                             " and " + std::to_string(found[1]->index) + "; give more of it");
    targets.push_back(found[0]);
  }
  const std::string reason = q.reason.empty() ? "drained with gpuq drain" : q.reason;
  // Back in service, a GPU's ECC errors so far are forgiven: its health baseline is what it has now.
  const auto health = !drain && !m_ecc_base.empty() ? m_inventory.health() : std::vector<GpuHealth>{};
  for (const Gpu* g : targets) {
    const auto it = m_drained.find(g->uuid);
    if (drain ? it != m_drained.end() && it->second == reason : it == m_drained.end()) continue;  // as asked already
    mark_drained(*g, drain, reason);
    if (!health.empty())  // in gpus() order, which `g` points into
      m_ecc_base[g->uuid] = health[static_cast<std::size_t>(g - m_inventory.gpus().data())].ecc_uncorrected;
  }
  schedule_soon();  // jobs may start on a GPU back in service, and reasons change either way
  return cmd_gpus();
}

void Daemon::mark_drained(const Gpu& g, bool drain, const std::string& reason) {
  m_store->set_drained(g.uuid, drain, reason);
  if (drain) m_drained[g.uuid] = reason;
  else m_drained.erase(g.uuid);
  std::cerr << "gpuqd: GPU " << g.index << (drain ? " drained: " + reason : " back in service") << "\n";
}

void Daemon::start_health_checks() {
  if (m_config.health_interval_s <= 0 || m_inventory.source().rfind("nvml", 0) != 0) return;
  if (!m_inventory.gpus().empty())
    std::cerr << "gpuqd: " << m_inventory.watch_xids() << " of " << m_inventory.gpus().size()
              << " GPU(s) report critical Xid events to the health checks\n";
  // Errors counted before gpuqd started are not held against a GPU: only new ones drain it.
  const auto health = m_inventory.health();
  for (std::size_t i = 0; i < health.size(); ++i) m_ecc_base[m_inventory.gpus()[i].uuid] = health[i].ecc_uncorrected;
  check_health();
}

void Daemon::check_health() {
  read_health();
  m_health_timer.expires_after(std::chrono::milliseconds(static_cast<long long>(m_config.health_interval_s * 1000)));
  m_health_timer.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) check_health();
  });
}

void Daemon::read_health() {
  const auto health = m_inventory.health();
  ++m_health_checks;
  const double now = wall_now();
  bool drained = false;
  for (std::size_t i = 0; i < health.size(); ++i) {
    const Gpu& g = m_inventory.gpus()[i];
    auto& seen = m_xids_seen[g.index];
    for (auto xid : health[i].xids) {
      seen.emplace_back(now, xid);
      if (seen.size() > k_max_xids_kept) seen.pop_front();
    }
    if (m_drained.count(g.uuid)) continue;
    const std::string problem = health_problem(health[i], m_ecc_base[g.uuid]);
    if (problem.empty()) {
      m_ecc_base[g.uuid] = health[i].ecc_uncorrected;  // follows a count reset by a driver reload
      continue;
    }
    try {
      mark_drained(g, true, "health check: " + problem);
      drained = true;
    } catch (const RequestError& e) {
      std::cerr << "gpuqd: GPU " << g.index << " is unhealthy (" << problem << ") but cannot be drained: " << e.what()
                << "\n";
    }
  }
  if (drained) schedule_soon();
}

// A job needing more GPUs than are in service waits with the scheduler's "needs 4 GPUs; this
// machine has 3" (it is given only the GPUs in service); this adds why there are 3.
std::string Daemon::with_drain_note(int gpus_needed, std::string reason) const {
  if (m_drained.empty()) return reason;  // the usual case, and a pass's hot path
  std::string drained;
  int in_service = 0;
  for (const auto& g : m_inventory.gpus()) {
    if (!m_drained.count(g.uuid)) ++in_service;
    else drained += (drained.empty() ? "" : ", ") + std::to_string(g.index);
  }
  return drained.empty() || gpus_needed <= in_service ? reason : reason + " in service (GPU " + drained + " drained)";
}

}  // namespace gpuq::daemon
