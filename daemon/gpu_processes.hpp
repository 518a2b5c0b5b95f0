// The processes on the GPUs, as NVML lists them: which are a running job's (descendants of its
// supervisor, a subreaper, so a job's daemonised helpers stay its own) and which gpuq did not
// start (a notebook, an inference server, another user's script). Memory held outside gpuq counts
// as used when packing shared jobs; a job's peak and what others did on its GPUs go into the
// reason of a job that ran out of GPU memory; `gpuq gpus` names them all. An owner of its own
// state: the running jobs are asked of the caller, and what one look makes of NVML's lists
// (observe) is pure, so tests/unit/test_gpu_processes.cpp drives it with lists of its own.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/inventory.hpp"

namespace gpuq::daemon {

class GpuProcesses {
 public:
  struct Running {  // a running job, as far as its GPUs go
    std::int64_t id = 0;
    int supervisor_pid = 0;  // 0: none known here (another system holds it)
    std::vector<int> gpus;   // GPU indices
  };
  struct Seen {
    int pid = 0;
    std::optional<std::int64_t> used_mb;
    std::int64_t job = 0;  // the running job it descends from; 0: outside gpuq
  };
  using Lists = std::vector<std::optional<std::vector<Seen>>>;  // per GPU in inventory order; nullopt: NVML cannot say

  // `interval_s` <= 0: no looks. `changed`: memory outside gpuq came or went, so a pass may place
  // differently.
  GpuProcesses(boost::asio::io_context& io, const Inventory& inventory, double interval_s,
               std::function<std::vector<Running>()> running, std::function<void()> changed);

  // What NVML lists on each GPU now, each told as a running job's or not.
  Lists list() const;
  // Looks every interval from now on, where `enabled` (NVML GPUs here, and no other system places
  // the work) and there is an interval.
  void start(bool enabled);
  bool on() const { return m_interval_s > 0 && m_enabled; }
  // One look: list(), then observe.
  void look();
  // What one look makes of `seen`: the memory outside gpuq on each GPU, and for each running job
  // its processes' peak and what others did on its GPUs (at most k_max_watched_others each).
  void observe(const Lists& seen, const std::vector<Running>& running);

  const std::map<int, std::int64_t>& foreign_mb() const { return m_foreign_mb; }  // GPU index -> MiB
  // At the last look: what each running job's processes held on each GPU (job -> GPU index ->
  // MiB), and the GPUs whose processes NVML could list.
  const std::map<std::int64_t, std::map<int, std::int64_t>>& now_mb() const { return m_now_mb; }
  const std::set<int>& listed() const { return m_listed; }
  // Called after each timed look (not after one asked for with look()): the budgets' watch.
  void after_each_look(std::function<void()> f) { m_looked = std::move(f); }
  // For a job that names its GPU memory: `reason` with the memory held outside gpuq, where there is some.
  std::string with_foreign_note(std::int64_t memory_mb, std::string reason) const;
  // A running job's processes' most GPU memory on one of its GPUs so far; nullopt before its first look.
  std::optional<std::int64_t> peak_mb(std::int64_t id) const;
  // For a job that ran out of GPU memory (after a last look): its peak per GPU of `memory_total`
  // (index -> MiB), and the processes outside gpuq that came or grew on its GPUs, `owner` naming
  // a pid's user where it can.
  std::vector<std::string> oom_notes(std::int64_t id, const std::map<int, std::int64_t>& memory_total,
                                     const std::function<std::string(int pid)>& owner) const;
  // Whether, as far as the looks went, a running job kept within `budget_mb` on each of its GPUs
  // while a process outside gpuq came or grew on one: out of GPU memory, it was crowded out.
  bool crowded_within(std::int64_t id, std::int64_t budget_mb) const;
  void forget(std::int64_t id) { m_watch.erase(id); }  // its attempt ended

  static constexpr std::size_t k_max_watched_others = 16;

 private:
  struct Other {  // a process outside gpuq on a running job's GPU
    int gpu = 0;
    std::int64_t first_mb = 0, peak_mb = 0;
    bool at_start = false;  // there at the job's first look
  };
  struct Watch {
    std::map<int, std::int64_t> peak_mb;  // GPU -> the job's processes' memory on it, at most
    std::map<int, Other> others;          // pid -> (at most k_max_watched_others)
    bool looked = false;
  };
  void tick();

  const Inventory& m_inventory;
  double m_interval_s;
  bool m_enabled = false;
  std::function<std::vector<Running>()> m_running;
  std::function<void()> m_changed;
  boost::asio::steady_timer m_timer;
  std::map<int, std::int64_t> m_foreign_mb;  // GPU index -> MiB held outside gpuq, at the last look
  std::map<std::int64_t, Watch> m_watch;     // running jobs -> what their GPUs showed
  std::map<std::int64_t, std::map<int, std::int64_t>> m_now_mb;
  std::set<int> m_listed;
  std::function<void()> m_looked;
};

}  // namespace gpuq::daemon
