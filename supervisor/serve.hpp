// gpuq-shim --serve: one long-lived process that starts each attempt's supervisor with a fork
// instead of an exec of gpuq-shim per attempt (the exec and glibc's start-up were most of what an
// attempt's start cost after gpuqd's own work).
//
// gpuqd starts it once, in a session of its own, with the small environment a supervisor gets
// (common::supervisor_environment) and one end of a SOCK_SEQPACKET socket pair as a descriptor.
// Each message gpuqd sends is one start request, a JSON object
//   {"launch": "/abs/.../launch.json", "cgroups": [["/abs/cgroup/dir", per_rank], ...]}
// (the arguments `gpuq-shim LAUNCH_JSON [--cgroup DIR | --cgroup-whole DIR]...` takes). The server
// forks; the child takes a session of its own, names itself `gpuq-shim LAUNCH_JSON` in its command
// line (where gpuqd looks when it adopts a supervisor after a restart: local_executor.cpp's
// supervises()), and runs run_supervisor() as an exec'd shim would. The answer is one message,
// {"pid": N, "start_time": T} with a pidfd of the child attached (SCM_RIGHTS; none where the kernel
// has no pidfd_open), or {"error": "..."}.
//
// A forked supervisor owes the server nothing once it runs: the server reaps it while the server
// lives; it ends when gpuqd closes its end (gpuqd stopped, died or gave up on it), and what it
// started goes on (re-parented, then reaped by init or the nearest subreaper), so jobs outlive
// gpuqd and the server alike, and one attempt's supervisor failing touches no other.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <vector>

namespace gpuq::supervisor {

// Where a process's command line lives: the bytes its argv strings took at exec, which it may
// overwrite (what /proc/PID/cmdline shows, as ps does). gpuqd leaves room for a long path by
// starting the server with a padding argument.
struct CommandLine {
  char* begin = nullptr;
  std::size_t room = 0;
  // From main's argv; empty when its strings do not lie one after another.
  static CommandLine of(int argc, char** argv);
  // Writes `parts`, each followed by a NUL, and NULs to the end. False, and nothing written, when
  // they do not fit.
  bool set(std::initializer_list<const char*> parts) const;
};

// One message of the server's socket as recvmsg(2) gives it, with `flags` (close-on-exec added):
// `size` as recvmsg returned (<= 0: ended, or an error), its text, whether it or its descriptors
// were cut (longer than 8 KiB, more than two), and the descriptors passed with it (SCM_RIGHTS),
// now the receiver's to close: an answer's go-ahead, then its pidfd where the server had one.
struct Received {
  ssize_t size = 0;
  std::string text;
  bool cut = false;
  std::vector<int> fds;
};
Received receive(int sock, int flags = 0);

// Serves start requests on `sock` until gpuqd closes its end; returns the process's exit status.
int serve(int sock, CommandLine title);

}  // namespace gpuq::supervisor
