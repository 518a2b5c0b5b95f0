// Reads (reads.hpp): jobs by id, the words for one missing, a job as clients see it, and who may
// act on which.
#include "daemon/reads.hpp"

#include <algorithm>

#include "common/paths.hpp"
#include "daemon/config.hpp"
#include "daemon/launcher.hpp"
#include "daemon/lifecycle.hpp"

namespace gpuq::daemon {

namespace {
const std::string k_forgotten = "was forgotten (`gpuq clean --forget`)";  // what became of a removed job or batch
}  // namespace

std::optional<JobRecord> Reads::lookup(std::int64_t id) const {
  if (const Active* a = jobs.find(id)) return a->rec;
  return store.get(id);
}

JobRecord Reads::existing_job(std::int64_t id) const {
  auto rec = lookup(id);
  if (!rec)
    throw RequestError(ErrorCode::not_found, store.was_removed(id) ? "job " + std::to_string(id) + " " + k_forgotten
                                                                      : "no job " + std::to_string(id));
  return std::move(*rec);
}

void Reads::require_job(std::int64_t id) const {
  if (!jobs.contains(id) && !store.exists(id)) existing_job(id);  // not_found, saying why
}

std::string Reads::missing_job(std::int64_t id) const {
  return "job " + std::to_string(id) + ", which " + (store.was_removed(id) ? k_forgotten : "does not exist");
}

RequestError Reads::missing_batch(std::int64_t batch) const {
  return RequestError(ErrorCode::not_found, store.was_removed(batch, true)
                                                ? "batch " + std::to_string(batch) + " " + k_forgotten
                                                : "no batch " + std::to_string(batch));
}

std::vector<JobRecord> Reads::jobs_of_batch(std::int64_t batch) const {
  auto rows = store.batch_jobs(batch);
  if (rows.empty()) throw missing_batch(batch);
  return rows;
}

std::vector<std::int64_t> Reads::with_queued_of_batch(std::vector<std::int64_t> ids, std::int64_t batch) const {
  if (batch != 0)
    for (const auto& rec : jobs_of_batch(batch))
      if (rec.state == JobState::queued) ids.push_back(rec.id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

static_assert(k_caller_minor_latest == common::k_protocol_minor, "Caller's latest minor is the protocol's");

common::JobInfo Reads::info_of(const JobRecord& stored, const Caller& viewer) const {
  const Active* active = jobs.find(stored.id);
  const JobRecord& r = active ? active->rec : stored;
  std::string wait_reason;
  if (active)
    wait_reason = last_pass.wait_reason(*active, users.name_of(r.uid), [this](int gpus, std::string reason) {
      return health.with_drain_note(gpus, std::move(reason));
    });
  common::JobInfo i;
  i.id = r.id;
  i.batch = r.batch;
  i.name = r.spec.name;
  // out_of_memory came with minor 1: a client of minor 0 cannot read it, and reads the failure it is.
  i.state = r.state == JobState::out_of_memory && viewer.protocol_minor < 1 ? JobState::failed : r.state;
  i.attempt = r.attempt;
  i.retries = r.spec.retries;
  i.restarts = r.restarts;
  i.attempt_base = r.attempt_base;
  i.held = r.held;
  i.priority = r.spec.priority;
  i.gpus_requested = r.spec.gpus;
  i.mode = std::string(common::to_string(r.spec.mode));
  i.ranks = r.spec.ranks;
  i.gpus = r.run.gpus;
  i.cpus_requested = r.spec.cpus;
  // The cores as launched; a store from before they were kept has the slots alone.
  i.cpus = !r.run.cores.empty() ? r.run.cores : job_cores(r, cores.cores);
  i.mem_bind = std::string(common::to_string(r.spec.mem_bind));
  if (r.spec.mem_bind != common::MemBind::none) i.mem_nodes = numa_nodes_of(i.cpus, cores.cores, cores.nodes);
  i.submitted_at = r.submitted_at;
  i.started_at = r.run.started_at;
  i.ended_at = r.run.ended_at;
  i.exit_code = r.run.exit_code ? json(*r.run.exit_code) : json();
  i.exit_signal = r.run.exit_signal ? json(*r.run.exit_signal) : json();
  i.reason = r.state == JobState::queued && !wait_reason.empty() && r.reason.empty() ? wait_reason : r.reason;
  if (r.state == JobState::running && i.reason.empty()) i.reason = executor.detail(r.id);
  if (r.state == JobState::running && events.hangs().hung(r.id)) {
    i.hung = true;
    i.reason = events.hangs().note(r, wall_now());
  }
  if (r.state == JobState::running) {
    if (const auto peak = gpu_processes.peak_mb(r.id)) i.gpu_memory_peak_mb = std::max(*peak, r.gpu_budget.peak_mb);
  } else if (r.gpu_budget.peak_mb > 0) {
    i.gpu_memory_peak_mb = r.gpu_budget.peak_mb;
  }
  if (r.held && r.state == JobState::queued)
    i.reason = "held until `gpuq release " + std::to_string(r.id) + "`" + (r.reason.empty() ? "" : "; " + r.reason);
  i.progress = r.run.progress;
  i.result = r.run.result;
  i.after = r.after;
  i.bad_event_lines = r.bad_event_lines;
  i.first_bad_event = r.first_bad_event;
  i.job_dir = job_dir(config.state_dir, r.id);
  i.labels = r.spec.labels;
  i.preemptible = r.spec.preemptible;
  i.preemptions = r.preemptions;
  i.preempting = r.state == JobState::running && r.run.preempt_requested;
  if (i.preempting || r.state == JobState::queued) {
    i.preempted_by = r.run.preempted_by;
    i.preempted_at = r.run.preempted_at;
  }
  i.suspensions = r.suspensions;
  if (r.spec.shared) {
    i.gpu_budget_mb = gpu_budget_mb(r);
    i.gpu_budget_why = r.gpu_budget.why;
    i.gpu_budget_at = r.gpu_budget.at;
  }
  if (r.state == JobState::running && r.run.suspended_for != 0) {
    i.suspended_for = r.run.suspended_by;
    i.suspended_at = r.run.suspended_at;
  }
  if (viewer.protocol_minor < 3)  // it reads labels as strings: 0.3 as "0.3"
    for (auto& [_, v] : i.labels)
      if (!v.is_string()) v = v.dump();
  i.external_id = r.state == JobState::running ? executor.external_id(r.id) : r.run.external_id;
  i.uid = r.uid;
  i.user = users.name_of(r.uid);
  if (!may_read_details(viewer, r)) {
    // Lab mode's one visibility rule (docs/lab.md): another user's job shows what squeue shows,
    // its id, name, owner, state, GPUs, cores, times, exit code and gpuq's own words on why it
    // waits; its result, progress, labels and any reason that may quote its output (a failure's
    // last log line, an earlier attempt's, a hang's progress) are its owner's and the admins'.
    i.result = i.progress = nullptr;
    i.labels.clear();
    i.bad_event_lines = 0;
    i.first_bad_event.clear();
    const bool own_words = r.state == JobState::queued && !r.held && r.reason.empty() && !wait_reason.empty();
    if (!own_words && !(r.state == JobState::running && !i.hung && r.reason.empty())) i.reason.clear();
    i.details_hidden = true;
  }
  return i;
}

bool Reads::add_to_reply(common::JobsReply& out, const JobRecord& r, std::size_t& bytes, const Caller& viewer) const {
  if (out.jobs.size() >= static_cast<std::size_t>(common::k_max_reply_jobs) || bytes >= common::k_max_reply_bytes) {
    out.more = true;
    return false;
  }
  out.jobs.push_back(info_of(r, viewer));
  auto& i = out.jobs.back();
  // What the record's fixed fields take is small; results, progress and what a matrix can make
  // long (labels, `after` naming a whole sweep, the reason, the name) are counted, so a reply
  // stays within what a client reads (common::k_max_reply_line).
  std::size_t labels = 0;
  for (const auto& [k, v] : i.labels)
    labels += k.size() + (v.is_string() ? v.get_ref<const std::string&>().size() : 24) + 8;
  bytes += 512 + (i.result.is_null() ? 0 : i.result.dump().size()) +
           (i.progress.is_null() ? 0 : i.progress.dump().size()) + labels +
           21 * (i.after.size() + i.gpus.size() + i.cpus.size()) + i.name.size() + 2 * i.reason.size() +
           i.first_bad_event.size();
  return true;
}

void Reads::authorize(const Caller& caller, const JobRecord& r, std::string_view act) const {
  if (caller.admin || caller.uid == r.uid) return;
  throw RequestError(ErrorCode::forbidden, job_label(r) + " belongs to " + users.name_of(r.uid) + "; only " + users.name_of(r.uid) +
                                               " or an admin may " + std::string(act) + " it");
}

void Reads::authorize(const Caller& caller, std::int64_t id, std::string_view act) const {
  if (caller.admin) return;
  if (const Active* a = jobs.find(id)) return authorize(caller, a->rec, act);
  authorize(caller, existing_job(id), act);
}

void Reads::authorize_batch(const Caller& caller, std::int64_t batch, std::string_view act) const {
  if (caller.admin || batch == 0) return;
  if (auto one = store.batch_page(batch, 0, 1); !one.empty()) authorize(caller, one.front(), act);
}

void Reads::authorize_admin(const Caller& caller, std::string_view act) const {
  if (caller.admin) return;
  throw RequestError(ErrorCode::forbidden, "only an admin may " + std::string(act) + " (root" +
                                               (config.admin_gid ? ", or a member of group " + config.admin_group : std::string()) +
                                               "); you are " + users.name_of(caller.uid));
}

JobRecord Reads::ended_job(std::int64_t id, const std::string& only) const {
  JobRecord rec = existing_job(id);
  if (!is_terminal(rec.state))
    throw RequestError(ErrorCode::wrong_state, job_label(rec) + " is " + std::string(to_string(rec.state)) + "; " + only);
  return rec;
}

std::optional<JobState> Reads::dependency_state(std::int64_t id) const {
  if (auto known = jobs.known_state(id)) return known;
  auto rec = store.get(id);
  if (!rec) return std::nullopt;
  jobs.remember_state(id, rec->state);
  return rec->state;
}

CpuSlots Reads::cpu_pool() const {
  CpuSlots cpu{config.cpu_slots, {}, cores.nodes};
  std::vector<int> unnumbered;  // running jobs started by a gpuqd whose CPU slots had no numbers yet
  for (const Active& a : jobs.running()) {
    cpu.taken.insert(a.rec.run.cpu_slots.begin(), a.rec.run.cpu_slots.end());
    if (a.rec.run.cpu_slots.empty() && a.rec.spec.gpus == 0) unnumbered.push_back(std::min(a.rec.spec.ranks, cpu.total));
  }
  for (int n : unnumbered)
    for (int slot = 0; n > 0 && slot < cpu.total; ++slot)
      if (cpu.taken.insert(slot).second) --n;
  return cpu;
}

}  // namespace gpuq::daemon
