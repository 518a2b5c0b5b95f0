// The processes on the GPUs (gpu_processes.hpp).
#include "daemon/gpu_processes.hpp"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "common/process.hpp"

namespace gpuq::daemon {

namespace {

// The running job whose supervisor `pid` descends from (supervisors: pid -> job), or 0. A bounded
// walk up /proc's parent links.
std::int64_t job_of(int pid, const std::map<int, std::int64_t>& supervisors) {
  for (int depth = 0; depth < 64 && pid > 1; ++depth) {
    if (auto it = supervisors.find(pid); it != supervisors.end()) return it->second;
    const auto fields = common::proc_stat_fields(pid);
    if (!fields || fields->size() < 2) return 0;
    pid = std::atoi((*fields)[1].c_str());  // field 4: ppid
  }
  return 0;
}

}  // namespace

GpuProcesses::GpuProcesses(boost::asio::io_context& io, const Inventory& inventory, double interval_s,
                           std::function<std::vector<Running>()> running, std::function<void()> changed)
    : m_inventory(inventory),
      m_interval_s(interval_s),
      m_running(std::move(running)),
      m_changed(std::move(changed)),
      m_timer(io) {}

GpuProcesses::Lists GpuProcesses::list() const {
  const auto listed = m_inventory.processes();
  Lists out(listed.size());
  std::map<int, std::int64_t> supervisors;
  for (const auto& r : m_running())
    if (r.supervisor_pid > 0) supervisors[r.supervisor_pid] = r.id;
  for (std::size_t i = 0; i < listed.size(); ++i) {
    if (!listed[i]) continue;
    auto& list = out[i].emplace();
    for (const auto& p : *listed[i]) list.push_back({p.pid, p.used_mb, job_of(p.pid, supervisors)});
  }
  return out;
}

void GpuProcesses::start(bool enabled) {
  m_enabled = enabled;
  if (on()) tick();
}

void GpuProcesses::tick() {
  look();
  if (m_looked) m_looked();
  m_timer.expires_after(std::chrono::milliseconds(static_cast<long long>(m_interval_s * 1000)));
  m_timer.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) tick();
  });
}

void GpuProcesses::look() { observe(list(), m_running()); }

void GpuProcesses::observe(const Lists& seen, const std::vector<Running>& running) {
  std::map<int, std::int64_t> foreign;
  std::map<std::int64_t, std::map<int, std::int64_t>> own;  // job -> GPU -> its processes' memory now
  m_listed.clear();
  for (std::size_t i = 0; i < seen.size() && i < m_inventory.gpus().size(); ++i) {
    if (!seen[i]) continue;
    const int gpu = m_inventory.gpus()[i].index;
    m_listed.insert(gpu);
    for (const auto& p : *seen[i]) {
      const std::int64_t mb = p.used_mb.value_or(0);
      if (p.job) own[p.job][gpu] += mb;
      else foreign[gpu] += mb;
    }
  }
  // Each running job's watch: its peak, and the others on its GPUs. Those no longer running go.
  std::set<std::int64_t> ids;
  for (const auto& r : running) ids.insert(r.id);
  for (auto it = m_watch.begin(); it != m_watch.end();) it = ids.count(it->first) ? std::next(it) : m_watch.erase(it);
  for (const auto& r : running) {
    if (r.gpus.empty()) continue;
    Watch& w = m_watch[r.id];
    for (const auto& [gpu, mb] : own[r.id]) w.peak_mb[gpu] = std::max(w.peak_mb[gpu], mb);
    for (std::size_t i = 0; i < seen.size() && i < m_inventory.gpus().size(); ++i) {
      const int gpu = m_inventory.gpus()[i].index;
      if (!seen[i] || std::find(r.gpus.begin(), r.gpus.end(), gpu) == r.gpus.end()) continue;
      for (const auto& p : *seen[i]) {
        if (p.job) continue;
        const std::int64_t mb = p.used_mb.value_or(0);
        auto o = w.others.find(p.pid);
        if (o == w.others.end()) {
          if (w.others.size() >= k_max_watched_others) continue;
          o = w.others.emplace(p.pid, Other{gpu, mb, mb, !w.looked}).first;
        }
        o->second.peak_mb = std::max(o->second.peak_mb, mb);
      }
    }
    w.looked = true;
  }
  m_now_mb = std::move(own);
  if (foreign != m_foreign_mb) {  // room on a GPU came or went: jobs may start, reasons change
    m_foreign_mb = std::move(foreign);
    m_changed();
  }
}

std::string GpuProcesses::with_foreign_note(std::int64_t memory_mb, std::string reason) const {
  if (m_foreign_mb.empty() || memory_mb <= 0) return reason;  // the usual case, and a pass's hot path
  std::string held;
  for (const auto& [gpu, mb] : m_foreign_mb)
    if (mb > 0) held += (held.empty() ? "" : ", ") + std::to_string(mb) + " MiB on GPU " + std::to_string(gpu);
  return held.empty() ? reason : reason + " (held outside gpuq: " + held + ")";
}

std::optional<std::int64_t> GpuProcesses::peak_mb(std::int64_t id) const {
  const auto w = m_watch.find(id);
  if (w == m_watch.end() || w->second.peak_mb.empty()) return std::nullopt;
  std::int64_t peak = 0;
  for (const auto& [gpu, mb] : w->second.peak_mb) peak = std::max(peak, mb);
  return peak;
}

bool GpuProcesses::crowded_within(std::int64_t id, std::int64_t budget_mb) const {
  const auto w = m_watch.find(id);
  if (w == m_watch.end() || !w->second.looked) return false;
  for (const auto& [gpu, mb] : w->second.peak_mb)
    if (mb > budget_mb) return false;
  for (const auto& [pid, o] : w->second.others)
    if (!o.at_start || o.peak_mb > o.first_mb) return true;
  return false;
}

std::vector<std::string> GpuProcesses::oom_notes(std::int64_t id, const std::map<int, std::int64_t>& memory_total,
                                                 const std::function<std::string(int pid)>& owner) const {
  std::vector<std::string> notes;
  const auto w = m_watch.find(id);
  if (w == m_watch.end()) return notes;
  for (const auto& [gpu, mb] : w->second.peak_mb) {
    const auto total = memory_total.find(gpu);
    notes.push_back("its processes held up to " + std::to_string(mb) + " MiB of GPU " + std::to_string(gpu) +
                    (total != memory_total.end() ? "'s " + std::to_string(total->second) + " MiB" : ""));
  }
  for (const auto& [pid, o] : w->second.others) {
    if (o.at_start && o.peak_mb <= o.first_mb) continue;  // there all along, and no bigger
    const std::string user = owner(pid);
    const std::string who = "pid " + std::to_string(pid) + (user.empty() ? "" : " of " + user) + " outside gpuq";
    notes.push_back(o.at_start ? who + " grew from " + std::to_string(o.first_mb) + " to " + std::to_string(o.peak_mb) +
                                     " MiB on GPU " + std::to_string(o.gpu)
                               : who + " came to hold " + std::to_string(o.peak_mb) + " MiB on GPU " + std::to_string(o.gpu));
  }
  return notes;
}

}  // namespace gpuq::daemon
