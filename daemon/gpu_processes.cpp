// The processes on the GPUs, as NVML lists them: which are a running job's (descendants of its
// supervisor, a subreaper, so a job's daemonised helpers stay its own) and which gpuq did not
// start (a notebook, an inference server, another user's script). Memory held outside gpuq
// counts as used when packing shared jobs; a job's peak and what others did on its GPUs go into
// the reason of a job that ran out of GPU memory; `gpuq gpus` names them all.
#include "daemon/daemon.hpp"

#include <algorithm>
#include <iostream>

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

std::vector<std::optional<std::vector<Daemon::SeenProcess>>> Daemon::gpu_processes() const {
  const auto listed = m_inventory.processes();
  std::vector<std::optional<std::vector<SeenProcess>>> out(listed.size());
  std::map<int, std::int64_t> supervisors;
  for (std::int64_t id : m_running)
    if (const int pid = m_executor->supervisor_pid(id); pid > 0) supervisors[pid] = id;
  for (std::size_t i = 0; i < listed.size(); ++i) {
    if (!listed[i]) continue;
    auto& list = out[i].emplace();
    for (const auto& p : *listed[i]) list.push_back({p.pid, p.used_mb, job_of(p.pid, supervisors)});
  }
  return out;
}

void Daemon::watch_gpu_processes() {
  if (m_config.gpu_process_interval_s <= 0 || m_inventory.source().rfind("nvml", 0) != 0 ||
      m_executor->places_work())
    return;
  look_at_gpu_processes();
  m_process_timer.expires_after(
      std::chrono::milliseconds(static_cast<long long>(m_config.gpu_process_interval_s * 1000)));
  m_process_timer.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) watch_gpu_processes();
  });
}

void Daemon::look_at_gpu_processes() {
  const auto seen = gpu_processes();
  std::map<int, std::int64_t> foreign;
  std::map<std::int64_t, std::map<int, std::int64_t>> own;  // job -> GPU -> its processes' memory now
  for (std::size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) continue;
    const int gpu = m_inventory.gpus()[i].index;
    for (const auto& p : *seen[i]) {
      const std::int64_t mb = p.used_mb.value_or(0);
      if (p.job) own[p.job][gpu] += mb;
      else foreign[gpu] += mb;
    }
  }
  // Each running job's watch: its peak, and the others on its GPUs.
  for (auto it = m_gpu_watch.begin(); it != m_gpu_watch.end();)
    it = m_active.count(it->first) && m_active.at(it->first).rec.state == JobState::running ? std::next(it)
                                                                                           : m_gpu_watch.erase(it);
  for (std::int64_t id : m_running) {
    const JobRecord& r = m_active.at(id).rec;
    if (r.run.gpus.empty()) continue;
    GpuWatch& w = m_gpu_watch[id];
    for (const auto& [gpu, mb] : own[id]) w.peak_mb[gpu] = std::max(w.peak_mb[gpu], mb);
    for (std::size_t i = 0; i < seen.size(); ++i) {
      const int gpu = m_inventory.gpus()[i].index;
      if (!seen[i] || std::find(r.run.gpus.begin(), r.run.gpus.end(), gpu) == r.run.gpus.end()) continue;
      for (const auto& p : *seen[i]) {
        if (p.job) continue;
        const std::int64_t mb = p.used_mb.value_or(0);
        auto o = w.others.find(p.pid);
        if (o == w.others.end()) {
          if (w.others.size() >= k_max_watched_others) continue;
          o = w.others.emplace(p.pid, OtherProcess{gpu, mb, mb, !w.looked}).first;
        }
        o->second.peak_mb = std::max(o->second.peak_mb, mb);
      }
    }
    w.looked = true;
  }
  if (foreign != m_foreign_mb) {  // room on a GPU came or went: jobs may start, reasons change
    m_foreign_mb = std::move(foreign);
    schedule_soon();
  }
}

std::string Daemon::with_foreign_note(std::int64_t memory_mb, std::string reason) const {
  if (m_foreign_mb.empty() || memory_mb <= 0) return reason;  // the usual case, and a pass's hot path
  std::string held;
  for (const auto& [gpu, mb] : m_foreign_mb)
    if (mb > 0) held += (held.empty() ? "" : ", ") + std::to_string(mb) + " MiB on GPU " + std::to_string(gpu);
  return held.empty() ? reason : reason + " (held outside gpuq: " + held + ")";
}

std::string Daemon::gpu_failure_notes(const JobRecord& r, const json& failure) {
  if (r.run.gpus.empty() || m_inventory.source().rfind("nvml", 0) != 0) return "";
  std::vector<std::string> notes;
  const auto cls = failure.is_object() ? failure.find("class") : failure.end();
  if (failure.is_object() && cls != failure.end() && *cls == "cuda_oom") {
    if (m_config.gpu_process_interval_s > 0 && !m_executor->places_work()) look_at_gpu_processes();  // the latest
    if (auto w = m_gpu_watch.find(r.id); w != m_gpu_watch.end()) {
      for (const auto& [gpu, mb] : w->second.peak_mb) {
        const Gpu* g = m_inventory.find(gpu);
        notes.push_back("its processes held up to " + std::to_string(mb) + " MiB of GPU " + std::to_string(gpu) +
                        (g ? "'s " + std::to_string(g->memory_total_mb) + " MiB" : ""));
      }
      for (const auto& [pid, o] : w->second.others) {
        if (o.at_start && o.peak_mb <= o.first_mb) continue;  // there all along, and no bigger
        const auto owner = common::process_owner(pid);
        const std::string who = "pid " + std::to_string(pid) + (owner ? " of " + m_users.name_of(*owner) : "") + " outside gpuq";
        notes.push_back(o.at_start ? who + " grew from " + std::to_string(o.first_mb) + " to " +
                                         std::to_string(o.peak_mb) + " MiB on GPU " + std::to_string(o.gpu)
                                   : who + " came to hold " + std::to_string(o.peak_mb) + " MiB on GPU " +
                                         std::to_string(o.gpu));
      }
    }
  }
  if (m_config.health_interval_s > 0) {
    read_health();  // Xids not yet read
    for (int gpu : r.run.gpus)
      for (const auto& [at, xid] : m_xids_seen[gpu])
        if (at >= r.run.started_at) notes.push_back("GPU " + std::to_string(gpu) + " reported " + xid_words(xid));
  }
  std::string out;
  for (const auto& n : notes) out += (out.empty() ? "" : "; ") + n;
  return out;
}

}  // namespace gpuq::daemon
