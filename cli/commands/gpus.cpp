// The GPUs: gpus, drain, undrain, and usage (who uses them: lab mode's users).

#include <algorithm>
#include <climits>
#include <iostream>

#include "cli/commands/register.hpp"
#include "cli/format.hpp"
#include "cli/rpc.hpp"
#include "common/client.hpp"
#include "common/protocol.hpp"

namespace gpuq::cli {

using json = nlohmann::json;

namespace {

int print_gpus(const Options& o, const Result<common::GpusReply>& reply);

int cmd_drain(const Options& o, const std::vector<std::string>& names, bool drain, const std::string& reason) {
  common::DrainRequest req;
  req.reason = reason;
  for (const auto& name : names) {
    if (const auto index = parse_int(name, 0, INT_MAX)) req.gpus.push_back(*index);
    else if (name.rfind("GPU-", 0) == 0 || name.rfind("MIG-", 0) == 0) req.uuids.push_back(name);
    else {
      std::cerr << "gpuq " << (drain ? "drain" : "undrain") << ": " << name
                << " is neither a GPU index nor a UUID (GPU-…)\n";
      return k_exit_usage;
    }
  }
  return print_gpus(o, call(o, drain ? common::cmd::drain : common::cmd::undrain, req));
}

// Prints the reply of a request answered with the GPUs (gpus, drain, undrain).
int print_gpus(const Options& o, const Result<common::GpusReply>& reply) {
  if (!reply) return report(reply.error());
  if (o.json) {
    print_json(*reply);
    return k_exit_ok;
  }
  const auto& g = *reply;
  std::cout << g.gpus.size() << " GPU(s) from " << g.source << "; CPU slots " << g.cpu_slots_used << " of "
            << g.cpu_slots << " in use (cores " << g.cores << ")\n";
  // Last, after the tables: what holds each job's processes together.
  const auto held_by = [&] {
    if (!g.containment.empty()) std::cout << "\neach job's processes held by " << g.containment << "\n";
    return k_exit_ok;
  };
  if (g.gpus.empty()) return held_by();
  // The NUMA column only where some GPU's node is known (machines with several sockets).
  const bool numa = std::any_of(g.gpus.begin(), g.gpus.end(), [](const auto& x) { return x.numa_node.is_number(); });
  std::vector<std::string> header{"GPU", "NAME", "MEMORY", "USED", "UTIL", "GPUQ", "JOBS"};
  if (numa) header.insert(header.begin() + 2, "NUMA");
  Table t(header);
  for (const auto& x : g.gpus) {
    std::string jobs;
    for (auto id : x.jobs) jobs += (jobs.empty() ? "" : ",") + std::to_string(id);
    std::string held = x.jobs.empty() ? "free" : x.exclusive ? "exclusive" : std::to_string(x.allocated_mb) + " MiB shared";
    if (x.drained) held = "drained" + (x.jobs.empty() ? std::string() : ", " + held) + ": " + x.drain_reason;
    std::vector<std::string> row{std::to_string(x.index), x.name, std::to_string(x.memory_total_mb) + " MiB",
                                 x.memory_used_mb.is_number() ? x.memory_used_mb.dump() + " MiB" : "-",
                                 x.utilization.is_number() ? x.utilization.dump() + "%" : "-", held,
                                 jobs.empty() ? "-" : jobs};
    if (numa) row.insert(row.begin() + 2, x.numa_node.is_number() ? x.numa_node.dump() : "-");
    t.add(row);
  }
  t.print(std::cout);
  // The processes NVML lists, where there are any: a job's, or outside gpuq (whose memory is
  // counted as used when packing shared jobs).
  Table procs({"GPU", "PID", "USER", "COMMAND", "MEMORY", "JOB"});
  std::int64_t outside = 0;
  std::size_t listed = 0;
  for (const auto& x : g.gpus) {
    if (!x.processes.is_array()) continue;
    outside += x.foreign_mb;
    for (const auto& p : x.processes.get<std::vector<common::GpuProcessInfo>>()) {
      procs.add({std::to_string(x.index), std::to_string(p.pid), p.user.empty() ? "-" : p.user,
                 p.command.empty() ? "-" : p.command, p.used_mb.is_number() ? p.used_mb.dump() + " MiB" : "-",
                 p.job.is_number() ? p.job.dump() : "outside gpuq"});
      ++listed;
    }
  }
  if (listed > 0) {
    std::cout << "\nprocesses on the GPUs";
    if (outside > 0) std::cout << " (" << outside << " MiB held outside gpuq, counted as used)";
    std::cout << ":\n";
    procs.print(std::cout);
  }
  return held_by();
}

}  // namespace

namespace {

std::string limit_text(std::int64_t n) { return n > 0 ? std::to_string(n) : "-"; }

int cmd_usage(const Options& o) {
  auto reply = call(o, common::cmd::usage);
  if (!reply) return report(reply.error());
  if (o.json) {
    print_json(*reply);
    return k_exit_ok;
  }
  const auto& u = *reply;
  if (!u.multi_user) std::cout << "(one user's gpuqd: lab mode shares one among many, docs/lab.md)\n";
  if (u.users.empty()) {
    std::cout << "no jobs and no recent GPU use\n";
    return k_exit_ok;
  }
  char half[32];
  std::snprintf(half, sizeof(half), "%g", u.half_life_s / 86400);
  std::cout << "recent GPU use in GPU-hours, halved every " << half << " days; the least used start first\n";
  Table t({"USER", "GPU-HOURS", "RUNNING", "GPUS", "QUEUED", "MAX RUNNING", "MAX GPUS", "MAX QUEUED"});
  for (const auto& x : u.users) {
    char hours[32];
    std::snprintf(hours, sizeof(hours), "%.2f", x.gpu_hours);
    t.add({x.user, hours, std::to_string(x.running), std::to_string(x.gpus), std::to_string(x.queued),
           limit_text(x.max_running), limit_text(x.max_gpus), limit_text(x.max_queued)});
  }
  t.print(std::cout);
  return k_exit_ok;
}

}  // namespace

void add_usage(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("usage", "Each user's recent GPU use, running and queued jobs, and limits (lab mode)");
  add_json_flag(sub, ctx);
  sub->callback([&ctx] { ctx.run = [&ctx] { return cmd_usage(ctx.opt); }; });
}

void add_gpus(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("gpus", "GPUs, their memory and which jobs hold them");
  add_json_flag(sub, ctx);
  sub->callback([&ctx] { ctx.run = [&ctx] { return print_gpus(ctx.opt, call(ctx.opt, common::cmd::gpus)); }; });
}

void add_drain(CLI::App& app, Context& ctx) {
  for (const bool draining : {true, false}) {
    struct Args {
      std::vector<std::string> gpus;
      std::string reason;
    };
    auto a = args<Args>();
    auto* sub = draining ? app.add_subcommand("drain", "Take GPUs out of service: no job is given them (jobs on them run on)")
                         : app.add_subcommand("undrain", "Put drained GPUs back in service");
    sub->add_option("gpus", a->gpus, "GPU indices as gpuq gpus shows them, or UUIDs (or a prefix: GPU-1a2b)")->required();
    if (draining) sub->add_option("--reason,-r", a->reason, "Why (shown by gpuq gpus)");
    add_json_flag(sub, ctx);
    sub->callback([&ctx, a, draining] { ctx.run = [&ctx, a, draining] { return cmd_drain(ctx.opt, a->gpus, draining, a->reason); }; });
  }
}

}  // namespace gpuq::cli
