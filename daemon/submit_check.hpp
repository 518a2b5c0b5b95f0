// A submitted batch checked against this machine, on a helper thread. Expanding a 100,000-job
// matrix, parsing each spec and looking up each job's directory and executable take about a
// second, which gpuqd's own thread must not spend while other clients wait behind it
// (docs/reliability.md, "No client waits behind another"). check_batch reads the file system and
// what it is given, never the daemon's state: that a dependency named by id exists is for gpuqd's
// thread to say (CheckedBatch::outside_deps).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/protocol.hpp"
#include "common/users.hpp"
#include "daemon/launcher.hpp"
#include "daemon/store.hpp"

namespace gpuq::daemon {

// What check_batch needs to know of this machine, copied from gpuqd's state before it runs.
struct MachineFacts {
  int gpus = 0;
  std::int64_t largest_gpu_mb = 0;
  std::string gpu_source;     // how the GPUs were found ("nvml", "fake: …"), for the errors
  bool have_worker = false;   // gpuq-worker was built, so `train` jobs can run
  int default_retries = 0;    // for specs that name no `retries`
  int max_nodes = 1;          // machines the executor can spread one job over (1: this one)
  std::string placement = "pack";  // for specs that name none
  bool preemptible = false;        // likewise
  double preempt_grace_max_s = 86400;  // the most a spec's preempt_grace_s may ask
};

struct CheckedBatch {
  std::vector<JobRecord> jobs;  // their specs parsed, ids not given yet
  std::vector<std::vector<std::size_t>> local_deps;  // per job, the batch's jobs it waits for
  Env env;  // the jobs' base environment: the submitter's, else gpuqd's (lab mode: a minimal one)
  // Each job's `after` ids from outside the batch, as (job index, id), for gpuqd to look up.
  std::vector<std::pair<std::size_t, std::int64_t>> outside_deps;
  std::vector<std::string> problems;  // "job[3] (name): …", each a reason the batch cannot run here
  bool spec_problems = false;         // some are the specs' own (they come first)
  // The `invalid_spec` error that lists the problems (at most 50 of them), given any.
  Error refusal() const;
};

// A batch with no jobs to look at (not JSON's shape of one, empty, too large, a bad matrix) is an
// error. Otherwise every problem goes into `problems`, so the submitter sees them all at once: the
// specs' own (a field's type or range, `after` names), then those only this machine makes (GPUs,
// memory, directories, executables, exec's size limit, patterns RE2 refuses) for each job whose
// spec read whole.
// With `owner` (a root gpuqd's job for another user), directories and executables are looked up as
// that user would (common::ScopedFsIdentity), and the jobs are theirs (JobRecord::uid).
Result<CheckedBatch> check_batch(common::SubmitRequest request, const MachineFacts& facts,
                                 const common::Account* owner = nullptr);

}  // namespace gpuq::daemon
