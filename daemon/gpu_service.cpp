// GPUs in and out of service, and their health checks (gpu_service.hpp).
#include "daemon/gpu_service.hpp"

#include <iostream>

#include "common/error.hpp"
#include "common/process.hpp"

namespace gpuq::daemon {

GpuService::GpuService(boost::asio::io_context& io, Inventory& inventory, Store& store, double interval_s,
                       std::function<void()> changed)
    : m_inventory(inventory),
      m_store(store),
      m_interval_s(interval_s),
      m_changed(std::move(changed)),
      m_timer(io),
      m_drained(store.drained_gpus()) {}

void GpuService::start() {
  if (m_interval_s <= 0 || m_inventory.source().rfind("nvml", 0) != 0) return;
  m_on = true;
  if (!m_inventory.gpus().empty())
    std::cerr << "gpuqd: " << m_inventory.watch_xids() << " of " << m_inventory.gpus().size()
              << " GPU(s) report critical Xid events to the health checks\n";
  // Errors counted before gpuqd started are not held against a GPU: only new ones drain it.
  const auto health = m_inventory.health();
  for (std::size_t i = 0; i < health.size(); ++i) m_ecc_base[m_inventory.gpus()[i].uuid] = health[i].ecc_uncorrected;
  tick();
}

void GpuService::tick() {
  read();
  m_timer.expires_after(std::chrono::milliseconds(static_cast<long long>(m_interval_s * 1000)));
  m_timer.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) tick();
  });
}

void GpuService::read() {
  const auto health = m_inventory.health();
  ++m_checks;
  const double now = common::wall_now();
  bool drained = false;
  for (std::size_t i = 0; i < health.size(); ++i) {
    const Gpu& g = m_inventory.gpus()[i];
    auto& seen = m_xids[g.index];
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
      mark(g, true, "health check: " + problem);
      drained = true;
    } catch (const RequestError& e) {
      std::cerr << "gpuqd: GPU " << g.index << " is unhealthy (" << problem << ") but cannot be drained: " << e.what()
                << "\n";
    }
  }
  if (drained) m_changed();
}

void GpuService::set_drained(const common::DrainRequest& q, bool drain) {
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
    mark(*g, drain, reason);
    if (!health.empty())  // in gpus() order, which `g` points into
      m_ecc_base[g->uuid] = health[static_cast<std::size_t>(g - m_inventory.gpus().data())].ecc_uncorrected;
  }
  m_changed();  // jobs may start on a GPU back in service, and reasons change either way
}

void GpuService::release(const std::vector<int>& gpus, const std::string& reason) {
  bool any = false;
  for (int index : gpus)
    if (const Gpu* g = m_inventory.find(index); g && m_drained.count(g->uuid) && m_drained.at(g->uuid) == reason) {
      mark(*g, false, reason);
      any = true;
    }
  if (any) m_changed();
}

void GpuService::mark(const Gpu& g, bool drain, const std::string& reason) {
  m_store.set_drained(g.uuid, drain, reason);
  if (drain) m_drained[g.uuid] = reason;
  else m_drained.erase(g.uuid);
  std::cerr << "gpuqd: GPU " << g.index << (drain ? " drained: " + reason : " back in service") << "\n";
}

std::string GpuService::with_drain_note(int gpus_needed, std::string reason) const {
  if (m_drained.empty()) return reason;  // the usual case, and a pass's hot path
  std::string drained;
  int in_service = 0;
  for (const auto& g : m_inventory.gpus()) {
    if (!m_drained.count(g.uuid)) ++in_service;
    else drained += (drained.empty() ? "" : ", ") + std::to_string(g.index);
  }
  return drained.empty() || gpus_needed <= in_service ? reason : reason + " in service (GPU " + drained + " drained)";
}

std::vector<std::string> GpuService::xids_since(const std::vector<int>& gpus, double since) {
  std::vector<std::string> notes;
  if (m_interval_s <= 0) return notes;
  read();  // Xids not yet read
  for (int gpu : gpus)
    for (const auto& [at, xid] : m_xids[gpu])
      if (at >= since) notes.push_back("GPU " + std::to_string(gpu) + " reported " + xid_words(xid));
  return notes;
}

}  // namespace gpuq::daemon
