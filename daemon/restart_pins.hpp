// The jobs restarts under way hold: those chosen and not yet requeued (pinned: no other restart
// takes them, no clean touches them, and they count against their owner's max_queued), and the
// jobs outside a restart that its jobs will wait for (kept from clean --forget). A restart runs
// in parts over several turns of gpuqd's loop; this is what the other requests see of it
// meanwhile (tests/unit/test_restart_pins.cpp).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>

namespace gpuq::daemon {

class RestartPins {
 public:
  // Pins job `id` of `owner`; false when a restart has it already.
  bool pin(std::int64_t id, uid_t owner);
  void unpin(std::int64_t id);  // requeued, or its restart gave up
  bool pinned(std::int64_t id) const { return m_pinned.count(id) > 0; }
  std::int64_t pinned_of(uid_t owner) const;  // how many of `owner`'s jobs are pinned
  // A job outside the restart that one of its jobs will wait for; `release` once per `need`.
  void need(std::int64_t id) { m_needed.insert(id); }
  void release(std::int64_t id);
  // Every pinned job, then every needed one (each needed once however many need it).
  void for_each_pinned(const std::function<void(std::int64_t)>& f) const;
  void for_each_needed(const std::function<void(std::int64_t)>& f) const;

 private:
  std::map<std::int64_t, uid_t> m_pinned;       // by id: its owner
  std::map<uid_t, std::int64_t> m_by_owner;     // how many of m_pinned each owner has
  std::multiset<std::int64_t> m_needed;
};

}  // namespace gpuq::daemon
