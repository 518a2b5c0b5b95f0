// Checks a submitted batch against this machine, off gpuqd's thread (see submit_check.hpp).
#include "daemon/submit_check.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <optional>

#include "common/paths.hpp"
#include "common/spec.hpp"
#include "supervisor/output_report.hpp"

namespace gpuq::daemon {

Error CheckedBatch::refusal() const {
  std::string msg = std::string(spec_problems ? "invalid job spec (" : "cannot run this batch here (") +
                    std::to_string(problems.size()) + " problem" + (problems.size() == 1 ? "" : "s") + "):";
  for (std::size_t i = 0; i < problems.size() && i < 50; ++i) msg += "\n  " + problems[i];
  if (problems.size() > 50) msg += "\n  ... and " + std::to_string(problems.size() - 50) + " more";
  return {ErrorCode::invalid_spec, msg};
}

namespace {
// 30 -> "30", 0.5 -> "0.5": a number of seconds as a spec would write it.
std::string seconds_text(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}
}  // namespace

Result<CheckedBatch> check_batch(common::SubmitRequest sub, const MachineFacts& facts, const common::Account* owner) {
  std::optional<common::ScopedFsIdentity> as_owner;
  if (owner && ::geteuid() == 0 && owner->uid != 0) {
    as_owner.emplace(*owner);
    if (!as_owner->ok())
      return Error{ErrorCode::internal, "cannot take on the file-system identity of " + owner->name +
                                            " to check the jobs' directories and commands"};
  }
  if (facts.default_retries > 0 || facts.placement != "pack" ||
      facts.preemptible) {  // the configured defaults, for specs that name none
    auto fill = [&](json& spec) {
      if (spec.is_object() && !spec.contains("retries") && facts.default_retries > 0)
        spec["retries"] = facts.default_retries;
      if (spec.is_object() && !spec.contains("placement") && facts.placement != "pack")
        spec["placement"] = facts.placement;
      if (spec.is_object() && !spec.contains("preemptible") && facts.preemptible) spec["preemptible"] = true;
    };
    if (sub.jobs.is_array())
      for (auto& spec : sub.jobs) fill(spec);
    else
      fill(sub.jobs);
  }
  auto all = common::parse_batch_all(sub.jobs, sub.cwd);
  if (!all) return all.error();
  CheckedBatch out;
  out.local_deps = std::move(all->local_deps);
  out.problems = std::move(all->problems);
  out.spec_problems = !out.problems.empty();
  auto* parsed = &all->specs;
  // The jobs' base environment: the submitter's, as sbatch and pueue do. A client that sent none
  // gets gpuqd's in single-user mode (the same user's); in lab mode a minimal one of its owner's,
  // never the root daemon's (docs/lab.md).
  if (!sub.env.empty()) out.env = std::move(sub.env);
  else if (owner) out.env = common::minimal_environment(*owner);
  else out.env = common::current_environment();

  // A job that would pass exec's size limit is refused now, not failed at every launch.
  const std::size_t base_bytes = common::exec_bytes(out.env);
  auto& problems = out.problems;
  std::map<std::pair<std::vector<std::string>, std::vector<std::string>>, std::vector<std::string>> pattern_checks;
  // What a job's fields say alone against this machine: its patterns (RE2's word, as the supervisor
  // compiles them; once a batch for each set of them: a matrix of 100,000 jobs has one), its GPUs.
  auto check_alone = [&](const common::JobSpec& s, const std::string& who) {
    if (!s.report.progress.empty() || !s.report.result.empty()) {
      auto key = std::make_pair(s.report.progress, s.report.result);
      auto it = pattern_checks.find(key);
      if (it == pattern_checks.end())
        it = pattern_checks.emplace(std::move(key), supervisor::pattern_problems(s.report)).first;
      for (const auto& p : it->second)
        if (problems.size() < 1000) problems.push_back(who + ": " + p);
    }
    if (s.nodes > facts.max_nodes)
      problems.push_back(who + ": `nodes` " + std::to_string(s.nodes) + " spreads the job over " +
                         std::to_string(s.nodes) + " machines, which needs the Slurm executor (gpuqd --executor " +
                         "slurm); this gpuqd runs jobs on this machine alone");
    if (s.gpus > facts.gpus)
      problems.push_back(who + ": asks for " + std::to_string(s.gpus) + " GPUs; this machine has " +
                         std::to_string(facts.gpus) + " (" + facts.gpu_source + ")");
    if (s.preempt_grace_s > facts.preempt_grace_max_s)
      problems.push_back(who + ": `preempt_grace_s` " + seconds_text(s.preempt_grace_s) +
                         " is more than this gpuqd gives a preempted job (preempt_grace_max_s " +
                         seconds_text(facts.preempt_grace_max_s) + ")");
    if (s.gpu_memory_mb > facts.largest_gpu_mb && facts.gpus > 0)
      problems.push_back(who + ": asks for " + std::to_string(s.gpu_memory_mb) + " MiB per GPU; the largest GPU here has " +
                         std::to_string(facts.largest_gpu_mb) + " MiB");
  };
  out.jobs.reserve(parsed->size());
  for (std::size_t i = 0; i < parsed->size(); ++i) {
    auto& s = (*parsed)[i];
    // A spec with problems of its own (said above) is still checked where a field stands alone
    // (its patterns, its GPUs), not where what was read of it may not be what was meant (its
    // command, its directory): the batch is refused either way.
    const bool whole = all->ok[i];
    std::string who = "job[" + std::to_string(i) + "]" + (s.name.empty() ? "" : " (" + s.name + ")");
    if (!whole) {
      check_alone(s, who);
      out.jobs.emplace_back();
      continue;
    }
    if (auto too_big = common::exec_size_problem(s, base_bytes); !too_big.empty())
      problems.push_back(who + ": " + too_big);
    check_alone(s, who);
    for (const auto& d : s.after)
      if (d.name.empty()) out.outside_deps.emplace_back(i, d.id);
    std::string cwd_problem;  // "" when the job can run there
    struct stat cwd_st {};
    if (::stat(s.cwd.c_str(), &cwd_st) != 0) cwd_problem = std::strerror(errno);
    else if (!S_ISDIR(cwd_st.st_mode)) cwd_problem = "not a directory";
    else if (::faccessat(AT_FDCWD, s.cwd.c_str(), X_OK, AT_EACCESS) != 0) cwd_problem = std::strerror(errno);
    const bool cwd_ok = cwd_problem.empty();
    if (!cwd_ok)
      problems.push_back(who + ": cwd " + s.cwd + " cannot be the job's working directory (" + cwd_problem +
                         (owner ? ", as " + owner->name : "") + ")");
    auto path = s.env.count("PATH") ? s.env.at("PATH") : (out.env.count("PATH") ? out.env.at("PATH") : "");
    if (!s.train.is_null()) {
      if (!facts.have_worker)
        problems.push_back(who + ": a `train` job needs gpuq-worker, which this gpuqd was built without (LibTorch "
                                 "missing at build time); install libtorch-dev and rebuild, or use `command`");
    } else if (cwd_ok && resolve_executable(s.command[0], path, s.cwd).empty())
      problems.push_back(who + ": command `" + s.command[0] + "` is not an executable file" +
                         (s.command[0].find('/') == std::string::npos ? " in PATH" : "") + " (cwd " + s.cwd + ")");
    if (s.name.empty()) s.name = "job";
    JobRecord rec;
    rec.spec = std::move(s);
    rec.held = sub.hold;
    rec.uid = owner ? owner->uid : ::getuid();
    out.jobs.push_back(std::move(rec));
  }
  return out;
}

}  // namespace gpuq::daemon
