// `submit`: a batch of jobs checked off gpuqd's thread, then written in parts.
#include "daemon/daemon.hpp"

#include <algorithm>

namespace gpuq::daemon {

// ---- submit -------------------------------------------------------------------------------------

// A submit is checked on a helper thread (check_batch: parsing, file-system lookups), then written
// in parts, one per turn of gpuqd's loop (Store::insert_batch_part), so that no client waits
// behind a 100,000-job matrix for more than a part's time. Submissions are written one at a time,
// in the order their checks end; the jobs exist for other requests only once all are written.
void Daemon::cmd_submit(const Caller& caller, common::SubmitRequest sub, Reply& reply) {
  if (sub.cwd.empty() || sub.cwd[0] != '/')
    throw RequestError(ErrorCode::bad_request, "field `cwd` must be the submitter's absolute working directory");
  MachineFacts facts;
  facts.gpus = static_cast<int>(m_inventory.gpus().size());
  for (const auto& g : m_inventory.gpus()) facts.largest_gpu_mb = std::max(facts.largest_gpu_mb, g.memory_total_mb);
  facts.gpu_source = m_inventory.source();
  facts.have_worker = !m_config.worker_path.empty();
  facts.default_retries = m_config.default_retries;
  if (m_executor->places_work()) {  // the cluster's GPUs are Slurm's to count: sbatch refuses what no node has
    facts.gpus = common::k_max_gpus;
    facts.largest_gpu_mb = std::int64_t{1} << 40;
    facts.gpu_source = "Slurm";
    facts.max_nodes = common::k_max_nodes;  // Slurm refuses more than the cluster has
  }
  auto s = std::make_shared<Submission>();
  s->reply = std::move(reply);
  s->max_running = sub.max_running;
  s->caller = caller;
  s->cwd = sub.cwd;
  // In lab mode the jobs are the caller's, checked and run as them; else gpuqd's own user's.
  const std::optional<uid_t> owner = m_config.multi_user ? std::optional<uid_t>(caller.uid) : std::nullopt;
  asio::post(m_check_thread, [this, s, sub = std::move(sub), facts, owner]() mutable {
    try {
      if (owner) {
        auto account = common::account_of(*owner);
        if (!account)
          s->checked = Error{ErrorCode::forbidden, account.error().message + "; gpuq runs each job as its owner"};
        else
          s->account = std::move(*account);
      }
      if (!owner || s->account) s->checked = check_batch(std::move(sub), facts, s->account ? &*s->account : nullptr);
    } catch (const std::exception& e) {  // out of memory, say: the submitter hears of it
      s->checked = Error{ErrorCode::internal, std::string("internal error: ") + e.what()};
    }
    asio::post(m_io, [this, s] { submit_checked(s); });
  });
}

void Daemon::submit_checked(const std::shared_ptr<Submission>& s) {
  if (!s->checked) return s->reply(common::error_reply(s->checked.error()));
  if (s->account) m_users.remember(*s->account);  // as of now, for the launches
  auto& batch = *s->checked;
  std::map<std::int64_t, bool> known;  // each id looked up once, however many jobs name it
  for (const auto& [i, id] : batch.outside_deps) {
    auto [it, fresh] = known.try_emplace(id, false);
    if (fresh) it->second = reads().lookup(id).has_value();
    if (!it->second) {
      const auto& spec = batch.jobs[i].spec;
      batch.problems.push_back("job[" + std::to_string(i) + "] (" + spec.name + "): `after` names " + reads().missing_job(id));
    }
  }
  if (!batch.problems.empty()) return s->reply(common::error_reply(batch.refusal()));
  if (!batch.jobs.empty()) {
    try {  // lab mode: the owner's limits, as they stand now
      m_users.check_submission(s->caller, batch.jobs.front().uid, batch.jobs, [this](uid_t u) { return queued_or_running(u); });
    } catch (const RequestError& e) {
      return s->reply(common::error_reply(e.code(), e.what()));
    }
  }
  s->at = wall_now();
  m_submissions.push_back(s);
  if (m_submissions.size() == 1) write_submission();
}

void Daemon::write_submission() {
  auto s = m_submissions.front();
  auto& batch = *s->checked;
  const std::size_t before = s->write.written;
  bool complete = false;
  try {
    if (s->write.batch != 0 && paused_between_parts([this] { write_submission(); })) return;
    complete = m_store->insert_batch_part(s->write, batch.jobs, batch.local_deps, s->cwd, json(batch.env), s->at,
                                          s->max_running, part_deadline());
  } catch (const std::exception& e) {
    try {
      m_store->discard_batch();
    } catch (const RequestError&) {  // left hidden; the next batch, or the next start, discards it
    }
    s->reply(common::error_reply(ErrorCode::store_error, std::string(e.what()) + "; nothing was submitted"));
    return next_submission();
  }
  // The part's jobs become records to go live, a part at a time too: for 100,000 jobs, making
  // them all at the end held gpuqd's thread for 110 ms. Their ids are above every other.
  for (std::size_t i = before; i < s->write.written; ++i) {
    Active a;
    a.rec = std::move(batch.jobs[i]);
    a.queued_since = a.rec.submitted_at;
    s->staged.emplace_hint(s->staged.end(), a.rec.id, std::move(a));
  }
  if (!complete) return asio::post(m_io, [this] { write_submission(); });

  if (s->max_running > 0) m_batch_limits[s->write.batch] = s->max_running;
  common::SubmitReply out{s->write.batch, {}};
  out.ids.reserve(s->staged.size());
  for (const auto& [id, _] : s->staged) out.ids.push_back(id);
  m_jobs.add(s->staged);
  schedule_soon();
  s->reply(common::ok_reply(out));
  next_submission();
}

void Daemon::next_submission() {
  m_submissions.pop_front();
  if (!m_submissions.empty()) asio::post(m_io, [this] { write_submission(); });
}

}  // namespace gpuq::daemon
