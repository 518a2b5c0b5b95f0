// gpuq-shim: the per-attempt supervisor. gpuqd spawns one per job attempt in a new session; it
// starts every rank (Boost.Process, each rank in its own process group), waits for them, and
// writes the attempt's outcome to exit.json atomically. Because the shim is the ranks' parent and
// not the daemon, a job keeps running while gpuqd is stopped, restarted or killed; a restarted
// daemon re-adopts the shim through its pid file and reads exit.json when it ends.
//
// The shim is also where the process-tree rules live, so they hold without a daemon:
// - it is a child subreaper: descendants that daemonise or lose their parent stay under it;
// - first failure tears down the gang: when one rank fails, every other rank gets SIGTERM, then
//   SIGKILL after the grace period (no survivor hangs in a collective); the first failing rank is
//   named in exit.json, as torchrun does;
// - SIGTERM to the shim (gpuq cancel) and the job's timeout tear everything down the same way;
// - when the ranks have exited, leftover descendants are terminated too, so no orphan keeps a
//   GPU's memory after the job ends;
// - ranks get PR_SET_PDEATHSIG=SIGKILL, so if the shim itself is killed its ranks die with it.
#pragma once

#include <string>

namespace gpuq::supervisor {

// Runs the attempt described by the launch document at `launch_path`. Returns the shim's exit
// status: 0 once exit.json is written, 2 when the launch document is unusable.
int run_supervisor(const std::string& launch_path);

}  // namespace gpuq::supervisor
