// A job spec as a Slurm batch script (see slurm_script.hpp and docs/slurm.md).
#include "common/slurm_script.hpp"

#include <cctype>
#include <cmath>
#include <csignal>
#include <sstream>

namespace gpuq::common {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

namespace {

// A checked spec's name is letters, digits, '-', '_' and '.' (spec.cpp): safe on an #SBATCH line.
std::string job_name(const JobSpec& spec) { return spec.name.empty() ? std::string("job") : spec.name; }

}  // namespace

std::string rendezvous_exports() {
  return "first_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
         "MASTER_ADDR=$(scontrol -o show node \"$first_node\" | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')\n"
         "export MASTER_ADDR=${MASTER_ADDR:-$first_node}\n"
         "export MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000))\n";
}

std::vector<std::string> sbatch_options(const JobSpec& spec, const SlurmOptions& o, const SbatchLayout& layout) {
  std::vector<std::string> out;
  const int nodes = std::max(1, spec.nodes);
  const int ranks = spec.mode == Mode::ddp ? spec.ranks : 1;
  out.push_back("--job-name=" + job_name(spec));
  out.push_back("--nodes=" + std::to_string(nodes));
  out.push_back("--ntasks-per-node=" + std::to_string(ranks / nodes));
  if (spec.gpus > 0) out.push_back("--gpus-per-node=" + std::to_string(spec.gpus / nodes));
  if (spec.cpus > 0) out.push_back("--cpus-per-task=" + std::to_string(spec.cpus));
  // Slurm's memory limit is per node (its cgroup's, ConstrainRAMSpace): the ranks on one together.
  if (spec.memory_mb > 0) out.push_back("--mem=" + std::to_string(spec.memory_mb * (ranks / nodes)) + "M");
  // A preemptible job's signal: Slurm sends a job's --signal at its preemption too, where the
  // cluster says so (PreemptParameters=send_user_signal, with a GraceTime); otherwise SIGTERM.
  const std::string signal = std::to_string(spec.preemptible ? preempt_signal_number(spec.preempt_signal) : SIGTERM);
  if (layout.time_minutes > 0) {
    out.push_back("--time=" + std::to_string(layout.time_minutes));
  } else if (spec.timeout_s > 0) {
    // Slurm's limit is in whole minutes and its warning signal comes within a minute of the time
    // asked: one minute more than the timeout, with SIGTERM a minute before the end, gives the job
    // its SIGTERM at about its timeout and a minute to checkpoint, as gpuq's grace period does.
    const long minutes = static_cast<long>(std::ceil(spec.timeout_s / 60.0)) + 1;
    out.push_back("--time=" + std::to_string(minutes));
    out.push_back("--signal=" + (spec.preemptible ? signal : std::string("TERM")) + "@60");
  } else if (spec.preemptible && !layout.supervised) {
    out.push_back("--signal=" + signal + "@60");
  }
  if (spec.preemptible && layout.supervised) {
    // To the batch shell alone: gpuq-shim, or a gang's script, which passes it on to the ranks'
    // supervisors. Its time before the end of Slurm's limit (a backup, past the timeout and its
    // grace) comes after gpuq-shim's own timeout: a supervisor already ending takes no preemption.
    out.push_back("--signal=B:USR1@30");
    out.push_back("--no-requeue");
  } else if (spec.preemptible) {
    out.push_back("--requeue");
    out.push_back("--open-mode=append");  // a requeued job's run adds to the log of the one before
  }
  // gpuq's priority is "higher starts sooner"; Slurm lets users only lower their own jobs' (a
  // positive --nice), so only a negative priority maps.
  if (spec.priority < 0) out.push_back("--nice=" + std::to_string(-static_cast<long long>(spec.priority)));
  out.push_back("--chdir=" + spec.cwd);
  out.push_back("--output=" + (layout.output.empty() ? job_name(spec) + "-%j.log" : layout.output));
  out.push_back("--export=NONE");  // the job's environment is its spec's, not the submitting shell's
  if (!o.partition.empty()) out.push_back("--partition=" + o.partition);
  if (!o.account.empty()) out.push_back("--account=" + o.account);
  if (!o.qos.empty()) out.push_back("--qos=" + o.qos);
  for (const auto& a : o.extra_args) out.push_back(a);
  return out;
}

bool fits_directive(const std::string& option) {
  for (char ch : option) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c == 0x7f || c == '#' || c == '"' || c == '\'' || c == '\\') return false;
  }
  return !option.empty();
}

Result<std::string> sbatch_script(const JobSpec& spec, const SlurmOptions& o) {
  std::ostringstream s;
  const bool ddp = spec.mode == Mode::ddp;
  const int nodes = std::max(1, spec.nodes);
  const int ranks = ddp ? spec.ranks : 1;
  const std::string name = job_name(spec);
  // Not a login shell: with --export=NONE, Slurm itself loads the user's login environment on the
  // node (PATH, modules), as --get-user-env does; `bash -l` would run the profile a second time.
  s << "#!/bin/bash\n";
  bool cd = false;  // the working directory cannot be a directive: the script goes there itself
  for (const auto& opt : sbatch_options(spec, o)) {
    if (fits_directive(opt)) {
      s << "#SBATCH " << opt << "\n";
    } else if (opt.rfind("--chdir=", 0) == 0) {
      cd = true;
    } else {
      std::string shown = opt;
      for (char& c : shown)
        if (static_cast<unsigned char>(c) < 0x20) c = ' ';
      return Error{ErrorCode::bad_request, "the sbatch option " + shell_quote(shown) + " cannot be an #SBATCH line (sbatch " +
                                               "splits those at spaces and reads '#' as a comment): give it to " +
                                               "sbatch on its command line instead"};
    }
  }
  s << "#\n# gpuq job " << shell_quote(name) << ", as `gpuq export --slurm` writes it: run it with `sbatch FILE`.\n";
  if (cd)
    s << "# Its working directory cannot be an #SBATCH line (sbatch splits those at spaces and reads '#' as\n"
         "# a comment), so the script changes to it; Slurm's output file is in the directory sbatch runs in.\n";
  if (!spec.after.empty()) {
    s << "# It waits for:";
    for (const auto& d : spec.after) s << " " << (d.name.empty() ? "job " + std::to_string(d.id) : d.name);
    s << " (submit with --dependency=afterok:<their Slurm ids>).\n";
  }
  if (spec.retries > 0)
    s << "# retries: " << spec.retries << " are gpuqd's to make (gpuqd --executor slurm); this script runs once.\n";
  if (spec.priority > 0)
    s << "# priority: " << spec.priority << " is not mapped: raising a job's priority (--nice < 0) is for Slurm's admins.\n";
  s << "set -e\n";
  if (cd) s << "cd -- " << shell_quote(spec.cwd) << "\n";
  for (const auto& [k, v] : spec.env) {
    bool name_ok = !k.empty() && !std::isdigit(static_cast<unsigned char>(k[0]));
    for (char c : k) name_ok = name_ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    // parse_job refuses such a name; a spec built another way is refused here, never written: a
    // newline in it would end a comment and start a command.
    if (!name_ok) return Error{ErrorCode::invalid_spec, "field `env` has an invalid variable name"};
    s << "export " << k << "=" << shell_quote(v) << "\n";
  }
  auto set_default = [&](const std::string& k, const std::string& v) {
    if (!spec.env.count(k)) s << "export " << k << "=" << v << "\n";
  };
  // What gpuq sets for every job; its files go to a folder of the job's in the working directory,
  // kept from one submission to the next so that a resubmitted job resumes from its checkpoints.
  // Slurm reruns a requeued job's script (a preemption, `scontrol requeue`), and counts the runs.
  s << "export GPUQ_JOB_NAME=" << shell_quote(name) << " GPUQ_JOB_ID=\"$SLURM_JOB_ID\""
    << " GPUQ_ATTEMPT=$((${SLURM_RESTART_COUNT:-0} + 1))\n";
  s << "export GPUQ_JOB_DIR=\"$PWD/gpuq-\"" << shell_quote(name) << "\n";
  s << "export GPUQ_CHECKPOINT_DIR=\"$GPUQ_JOB_DIR/checkpoints\"\n";
  s << "mkdir -p \"$GPUQ_CHECKPOINT_DIR\" \"$GPUQ_JOB_DIR/slurm-$SLURM_JOB_ID\"\n";
  s << "export CUDA_DEVICE_ORDER=PCI_BUS_ID\n";
  if (spec.cpus > 0) set_default("OMP_NUM_THREADS", std::to_string(spec.cpus));
  std::string per_rank = "export GPUQ_EVENTS=\"$GPUQ_JOB_DIR/slurm-$SLURM_JOB_ID/events-${SLURM_PROCID}.jsonl\"";
  if (ddp) {
    // torchrun's environment, from Slurm's: one rendezvous host (the allocation's first), and a
    // port from the job id (below Linux's ephemeral range).
    s << rendezvous_exports();
    s << "export WORLD_SIZE=" << ranks << " LOCAL_WORLD_SIZE=" << ranks / nodes << " GROUP_WORLD_SIZE=" << nodes
      << " ROLE_WORLD_SIZE=" << ranks << " ROLE_NAME=default\n";
    s << "export TORCHELASTIC_RUN_ID=\"gpuq-$SLURM_JOB_ID\" TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=0"
         " TORCHELASTIC_USE_AGENT_STORE=False\n";
    set_default("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
    set_default("NCCL_ASYNC_ERROR_HANDLING", "1");
    if (ranks > 1 && spec.cpus == 0) set_default("OMP_NUM_THREADS", "1");
    per_rank += "; export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID GROUP_RANK=$SLURM_NODEID ROLE_RANK=$SLURM_PROCID"
                " TORCHELASTIC_ERROR_FILE=\"$GPUQ_JOB_DIR/slurm-$SLURM_JOB_ID/error-${SLURM_PROCID}.json\"";
  }
  // One srun starts every rank (the first to fail ends the others, as gpuq's gang does); each
  // rank sets its own variables, then becomes the command.
  s << "srun --export=ALL --kill-on-bad-exit=1 --ntasks=" << ranks << " --ntasks-per-node=" << ranks / nodes
    << " bash -c " << shell_quote(per_rank + "; exec \"$@\"") << " gpuq-rank";
  for (const auto& a : spec.command) s << " " << shell_quote(a);
  s << "\n";
  return s.str();
}

}  // namespace gpuq::common
