// What a job spec becomes on a Slurm cluster: the sbatch options and the batch script, shared by
// `gpuq export --slurm` (run without gpuqd) and, next, gpuqd's Slurm executor. The mapping is
// written out in docs/slurm.md; in short: a job is one Slurm job, `gpus` and `nodes` become
// --nodes, --ntasks-per-node and --gpus-per-node, every rank is started by srun with the
// torchrun environment made from Slurm's (RANK = SLURM_PROCID, LOCAL_RANK = SLURM_LOCALID,
// GROUP_RANK = SLURM_NODEID, MASTER_ADDR = the first host of the allocation), and the job's
// environment is its spec's `env` over the user's login environment, never the submitting shell's.
#pragma once

#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/spec.hpp"

namespace gpuq::common {

struct SlurmOptions {
  std::string partition, account, qos;  // empty: the cluster's defaults
  std::vector<std::string> extra_args;  // more sbatch options, as written (e.g. "--constraint=a100")
};

// Where the exported script and gpuqd's differ: gpuqd's supervisor enforces the timeout itself
// (Slurm's limit only backs it up, with no warning signal) and writes into the attempt directory.
// A preemptible job (docs/slurm.md#preemption) exported is requeued by Slurm (--requeue, its log
// appended to) and gets its preempt_signal as Slurm's --signal; under gpuqd (`supervised`) Slurm
// ends it (--no-requeue: gpuqd puts it back in line as a new attempt) and its supervisor gets
// SIGUSR1 (--signal=B:USR1), which it takes as a preemption, as from gpuqd.
struct SbatchLayout {
  std::string output;      // --output; empty: "<name>-%j.log" in the working directory
  long time_minutes = -1;  // --time; -1: the timeout plus a minute, with SIGTERM a minute before
  bool supervised = false;  // gpuqd's executor: the batch script is (or starts) gpuq-shim
};

// The sbatch options of one job, in order, e.g. "--job-name=train", "--nodes=2", their values as
// they are: for sbatch's command line (gpuqd's executor passes them there), or for #SBATCH lines
// where fits_directive() says they can be one.
std::vector<std::string> sbatch_options(const JobSpec& spec, const SlurmOptions& o, const SbatchLayout& layout = {});

// Whether `option` can be an #SBATCH line as it is: sbatch splits a directive at whitespace, reads
// '#' as the start of a comment, and parses quotes differently from one version to the next, so an
// option holding any of them (or a control character) must go on sbatch's command line instead:
// `--chdir=/tmp/my project` would run in /tmp/my, and `/tmp/x --partition=other` would pick a
// partition.
bool fits_directive(const std::string& option);

// The bash lines that export MASTER_ADDR (the address Slurm itself reaches the allocation's first
// node at: its NodeAddr, which is its name unless the cluster set another) and MASTER_PORT (from
// the job id, 10000-29999, so that two jobs sharing a node do not pick the same one).
std::string rendezvous_exports();

// The whole batch script, for `sbatch FILE`: a bash script with the options above as #SBATCH
// lines, the job's environment and one srun that starts its ranks. What does not map (the jobs it
// waits for, retries, a raised priority) is said in comments. A working directory that cannot be
// a directive becomes a `cd` in the script; another such option (a configured partition, say) is
// refused, naming it.
Result<std::string> sbatch_script(const JobSpec& spec, const SlurmOptions& o);

// `s` quoted for bash: 'it'\''s'.
std::string shell_quote(const std::string& s);

}  // namespace gpuq::common
