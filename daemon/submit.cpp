// `submit`: what this machine offers the checks, and what gpuqd accepts; Submissions
// (submissions.hpp) does the checking off gpuqd's thread and the writing in parts.
#include "daemon/daemon.hpp"

#include <algorithm>

namespace gpuq::daemon {

// ---- submit -------------------------------------------------------------------------------------

// A submit: what this machine offers its checks, then Submissions (submissions.hpp) checks it off
// gpuqd's thread, asks accept_submission, and writes it in parts.
void Daemon::cmd_submit(const Caller& caller, common::SubmitRequest sub, Later<common::SubmitReply>& reply) {
  MachineFacts facts;
  facts.gpus = static_cast<int>(m_machine.inventory.gpus().size());
  for (const auto& g : m_machine.inventory.gpus()) facts.largest_gpu_mb = std::max(facts.largest_gpu_mb, g.memory_total_mb);
  facts.gpu_source = m_machine.inventory.source();
  facts.have_worker = !m_config.worker_path.empty();
  facts.default_retries = m_config.default_retries;
  facts.placement = m_config.placement;
  facts.preemptible = m_config.preemptible;
  facts.preempt_grace_max_s = m_config.preempt_grace_max_s;
  if (m_executor->places_work()) {  // the cluster's GPUs are Slurm's to count: sbatch refuses what no node has
    facts.gpus = common::k_max_gpus;
    facts.largest_gpu_mb = std::int64_t{1} << 40;
    facts.gpu_source = "Slurm";
    facts.max_nodes = common::k_max_nodes;  // Slurm refuses more than the cluster has
  }
  // In lab mode the jobs are the caller's, checked and run as them; else gpuqd's own user's.
  const std::optional<uid_t> owner = m_config.multi_user ? std::optional<uid_t>(caller.uid) : std::nullopt;
  m_ops.submissions.submit(caller, std::move(sub), facts, owner, std::move(reply));
}

// A checked batch, on gpuqd's thread: refused if a job outside it that it names is gone, or its
// owner's limits (lab mode) do not let it in as they stand now.
Result<bool> Daemon::accept_submission(Submissions::Batch& s) {
  if (s.account) m_users.remember(*s.account);  // as of now, for the launches
  auto& batch = *s.checked;
  std::map<std::int64_t, bool> known;  // each id looked up once, however many jobs name it
  for (const auto& [i, id] : batch.outside_deps) {
    auto [it, fresh] = known.try_emplace(id, false);
    if (fresh) it->second = reads().lookup(id).has_value();
    if (!it->second) {
      const auto& spec = batch.jobs[i].spec;
      batch.problems.push_back("job[" + std::to_string(i) + "] (" + spec.name + "): `after` names " + reads().missing_job(id));
    }
  }
  if (!batch.problems.empty()) return batch.refusal();
  if (!batch.jobs.empty()) {
    try {
      m_users.check_submission(s.caller, batch.jobs.front().uid, batch.jobs, [this](uid_t u) { return queued_or_running(m_jobs, m_ops.pins, u); });
    } catch (const RequestError& e) {
      return Error{e.code(), e.what()};
    }
  }
  return true;
}

// Every job of a batch is written: they go live.
void Daemon::submission_written(Submissions::Batch& s) {
  s.epoch = m_watches.epoch(), s.cursor = m_watches.visible_head(s.caller);
  m_jobs.set_batch_limit(s.write.batch, s.max_running);
  for (const auto& [id, a] : s.staged)
    m_watches.changed({id, a.rec.batch, a.rec.uid, Watches::Kind::state});
  m_jobs.add(s.staged);
  m_pacer.soon();
}

}  // namespace gpuq::daemon
