// The job table: gpuqd's queued and running jobs in memory, each filed by its record's state in the
// indexes a scheduling pass and the event tick walk (running, in line by priority, held, waiting
// on `after`), so that neither walks the whole queue; the end states of jobs that have left it,
// for dependency lookups; and a counter of changes to what ended jobs are still needed for. Its
// one way to change a record's state is apply(), which keeps record and indexes together (the
// store was written first: Daemon::land). Unit-tested alone (tests/unit/test_job_table.cpp).
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <memory_resource>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "daemon/scheduler.hpp"
#include "daemon/store.hpp"

namespace gpuq::daemon {

// What the scheduler needs to know of a queued job.
PendingJob pending_of(const JobRecord& r);

// How records land (Daemon::land): `write` stores the rows in one transaction and throws before
// memory changes; then the job table, metrics and waiters take them. Owners that change records
// are handed one.
using WriteRows = std::function<void(const std::vector<const JobRecord*>&)>;
using Land = std::function<void(std::vector<JobRecord>, const WriteRows& write)>;
// Daemon::commit: changes of state (each a record lifecycle.hpp made, `why` its history row's
// reason where given) stored in one transaction with a transition each, with `also` (other jobs'
// records, no transition) in it, then landed.
using Commit = std::function<void(std::vector<JobRecord> changed, const std::vector<std::string>& why,
                                  std::vector<JobRecord> also)>;

// A queued or running job, in memory.
struct Active {
  JobRecord rec;  // its state, priority, held and `after` change only through JobTable::apply
  std::string wait_reason;  // queued: why it is not running yet, as of pass `reason_pass`
  std::uint64_t reason_pass = 0;
  std::map<int, std::int64_t> event_offsets;
  std::unique_ptr<boost::asio::steady_timer> retry;  // recording its end again, after the store refused it
  double queued_since = 0;  // when it last went in line (metrics' queue wait)
};

class JobTable {
 public:
  struct Queued {
    PendingJob job;
    double not_before = 0;  // retry backoff
    bool has_deps = false;
  };
  // Queued jobs in scheduling order, (-priority, id). Pooled nodes lie together in memory, so the
  // walk each pass makes over a deep queue stays in cache.
  using Queue = std::pmr::map<std::pair<int, std::int64_t>, Queued>;

  // Jobs named by an index, as Active&, in id order.
  template <class Table, class A>
  class View {
   public:
    struct iterator {
      std::set<std::int64_t>::const_iterator it;
      Table* table;
      A& operator*() const { return table->at(*it); }
      iterator& operator++() {
        ++it;
        return *this;
      }
      bool operator!=(const iterator& o) const { return it != o.it; }
    };
    View(const std::set<std::int64_t>& ids, Table* table) : m_ids(ids), m_table(table) {}
    iterator begin() const { return {m_ids.begin(), m_table}; }
    iterator end() const { return {m_ids.end(), m_table}; }

   private:
    const std::set<std::int64_t>& m_ids;
    Table* m_table;
  };

  JobTable() = default;
  JobTable(const JobTable&) = delete;
  JobTable& operator=(const JobTable&) = delete;

  Active* find(std::int64_t id);
  const Active* find(std::int64_t id) const;
  Active& at(std::int64_t id) { return m_active.at(id); }
  const Active& at(std::int64_t id) const { return m_active.at(id); }
  bool contains(std::int64_t id) const { return m_active.count(id) > 0; }
  std::size_t size() const { return m_active.size(); }
  const std::map<std::int64_t, Active>& all() const { return m_active; }  // by id

  // The running jobs. Walking them, a running job's record may change (apply keeps it filed).
  View<JobTable, Active> running() { return {m_running, this}; }
  View<const JobTable, const Active> running() const { return {m_running, this}; }
  const std::set<std::int64_t>& running_ids() const { return m_running; }
  bool is_running(std::int64_t id) const { return m_running.count(id) > 0; }
  std::size_t running_count() const { return m_running.size(); }
  const Queue& queue() const { return m_queue; }  // in line: queued, not held
  const std::set<std::int64_t>& held() const { return m_held; }
  View<const JobTable, const Active> with_deps() const { return {m_with_deps, this}; }  // queued (held too) with `after`
  bool any_with_deps() const { return !m_with_deps.empty(); }

  // A job's state: an active one's, or the end state it left with (or was looked up with).
  std::optional<JobState> known_state(std::int64_t id) const;
  void remember_state(std::int64_t id, JobState s) { m_ended[id] = s; }
  void forget_state(std::int64_t id) { m_ended.erase(id); }

  // Batches with a max_running (batch -> how many of its jobs may run at once); set_batch_limit
  // with 0 lifts one.
  const std::map<std::int64_t, int>& batch_limits() const { return m_batch_limits; }
  std::optional<int> batch_limit(std::int64_t batch) const;
  void set_batch_limit(std::int64_t batch, int max_running);

  // Counts changes to what ended jobs are still needed for (a queued job with `after` filed, a
  // new wait, a restart's outside jobs): a long clean rereads the needs when it moved.
  std::uint64_t needs_changed() const { return m_needs_changed; }
  void need_changed() { ++m_needs_changed; }

  // What apply did: the state the job had (nullopt: new to the table), and whether it came back
  // from having ended (restart) or left the table (it ended).
  struct Applied {
    std::optional<JobState> was;
    bool came_back = false;
    bool ended = false;
  };
  // `rec` becomes its job's record: filed by its state, or (ended) out of the table, its end
  // state remembered. `before` sees the job, its old state and the new record just before.
  Applied apply(JobRecord rec, const std::function<void(Active&, std::optional<JobState>, const JobRecord&)>& before = {});
  // A job loaded from the store at start, filed by its state.
  Active& load(JobRecord rec, double queued_since);
  // A submitted batch's jobs, new to the table (ids above every other), filed in one go.
  void add(std::map<std::int64_t, Active>& staged);

 private:
  void file(const Active& a);
  void unfile(const JobRecord& r);

  std::map<std::int64_t, Active> m_active;  // queued and running jobs
  std::set<std::int64_t> m_running;
  std::pmr::unsynchronized_pool_resource m_queue_pool;
  Queue m_queue{&m_queue_pool};
  std::set<std::int64_t> m_with_deps;  // queued jobs with `after`
  std::set<std::int64_t> m_held;       // queued jobs held out of line
  // Ended jobs' states for dependency lookups, while a queued job has dependencies (a cache: the
  // store has them all).
  std::unordered_map<std::int64_t, JobState> m_ended;
  std::uint64_t m_needs_changed = 0;
  std::map<std::int64_t, int> m_batch_limits;
};

}  // namespace gpuq::daemon
