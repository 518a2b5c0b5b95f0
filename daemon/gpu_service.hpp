// GPUs in and out of service: the drained set (by UUID, kept in the store so a GPU stays drained
// across restarts even if indices change), `drain`/`undrain` as an admin asks, and NVML health
// checks every health_interval_s that drain a GPU found lost, with failed row remapping or with
// new uncorrectable ECC errors (reason "health check: ..."), keeping recent Xids for the reasons
// of jobs that fail meanwhile. An owner of its own state; tests/unit/test_gpu_service.cpp.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/protocol.hpp"
#include "daemon/inventory.hpp"
#include "daemon/store.hpp"

namespace gpuq::daemon {

class GpuService {
 public:
  // `changed`: GPUs came into or went out of service (a pass may place jobs differently).
  GpuService(boost::asio::io_context& io, Inventory& inventory, Store& store, double interval_s,
            std::function<void()> changed);

  // With NVML GPUs and an interval: counts errors so far as the baseline (only new ones drain a
  // GPU), then reads health every interval.
  void start();
  // One reading now: Xids kept, a failing GPU drained.
  void read();
  bool on() const { return m_on; }
  std::uint64_t checks() const { return m_checks; }

  bool drained(const std::string& uuid) const { return m_drained.count(uuid) > 0; }
  const std::map<std::string, std::string>& drained() const { return m_drained; }  // UUID -> why
  // Takes the GPUs a request names (indices, UUIDs or a UUID prefix naming one GPU) out of service
  // or back; a GPU back in service has its ECC errors so far forgiven. Throws RequestError naming a
  // GPU not found or a prefix naming several, having changed nothing.
  void set_drained(const common::DrainRequest& q, bool drain);
  // Puts back in service those of `gpus` (indices) drained for `reason` and for nothing since (an
  // admin's drain of one meanwhile stays).
  void release(const std::vector<int>& gpus, const std::string& reason);
  // A job needing more GPUs than are in service waits with the scheduler's "needs 4 GPUs; this
  // machine has 3" (it is given only the GPUs in service); this adds why there are 3.
  std::string with_drain_note(int gpus_needed, std::string reason) const;
  // "GPU g reported <Xid in words>" for each Xid seen on `gpus` since `since`, reading health first.
  std::vector<std::string> xids_since(const std::vector<int>& gpus, double since);

 private:
  void mark(const Gpu& g, bool drain, const std::string& reason);  // the store, the set, the log
  void tick();

  Inventory& m_inventory;
  Store& m_store;
  double m_interval_s;
  std::function<void()> m_changed;
  bool m_on = false;  // health checks run (NVML GPUs, an interval)
  boost::asio::steady_timer m_timer;
  std::map<std::string, std::string> m_drained;                    // UUID -> reason
  std::map<std::string, std::optional<std::uint64_t>> m_ecc_base;  // UUID -> ECC errors when last found healthy
  std::map<int, std::deque<std::pair<double, std::uint64_t>>> m_xids;  // GPU index -> recent Xids (at, xid)
  static constexpr std::size_t k_max_xids_kept = 16;
  std::uint64_t m_checks = 0;
};

}  // namespace gpuq::daemon
