// Processes and files, for gpuqd and gpuq-shim alike: the wall clock jobs are timed by, finding
// an executable as exec does, atomic file writes, descriptors kept from leaking into a job, and
// a process's identity (pid and start time) across daemon restarts.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace gpuq::common {

// Finds `name` the way execvp would: as a path when it contains '/', else in `path_env`.
// Returns the absolute path, or "" when there is no executable file.
std::string resolve_executable(const std::string& name, const std::string& path_env, const std::string& cwd);

// Writes `text` to `path` atomically (temporary file, rename): readers see the old file or the
// new one, whichever process crashes. No fsync: like the store (SQLite WAL, synchronous=NORMAL),
// job files are safe against crashes of gpuq or the job, not against power loss; after a reboot
// the jobs are gone anyway and are recorded as failed (supervisor lost) and retried. `mode`: the
// new file's (less the umask).
Result<bool> write_file_atomic(const std::string& path, const std::string& text, unsigned mode = 0600);
// Creates `path` with `text` if nothing is there: true; false where something is (a file, a
// link, anything), left as it was. Atomic like write_file_atomic (readers see all of `text` or no
// file), and of two processes creating `path` at once exactly one gets true.
Result<bool> create_file_once(const std::string& path, const std::string& text, unsigned mode = 0600);

// In a forked child before exec: marks every descriptor from 3 up close-on-exec, so nothing the
// parent holds (the daemon's listening socket, client connections, pipes) leaks into a job.
// Boost.Process v1 does not do this itself.
void mark_inherited_fds_cloexec();
// Its fallback for kernels without close_range(CLOSE_RANGE_CLOEXEC): the descriptors listed in
// /proc/self/fd (system calls only), else those below 65,536.
void mark_listed_fds_cloexec();

// The name (/proc/PID/comm, at most 15 bytes) gpuq-shim takes while it cannot write an attempt's
// exit record and keeps trying: gpuqd then says the job's outcome is unknown.
inline constexpr const char* k_shim_recording_name = "gpuq-shim-retry";

// The file gpuqd writes into a Slurm gang's attempt directory before it signals the ranks'
// supervisors to stop: one that starts after the signal went out finds it and stops too.
inline constexpr const char* k_stop_file = "stop";

// The environment gpuq-shim starts with, as NAME=value strings: a fixed PATH, and the sanitizer
// settings of a sanitizer build (ASAN_OPTIONS, LSAN_OPTIONS, UBSAN_OPTIONS) where gpuqd has them.
// Nothing else of gpuqd's: the supervisor runs as the job's owner in lab mode, and a job can read
// its supervisor's /proc/PID/environ. The ranks get their own environment from the launch document.
std::vector<std::string> supervisor_environment();

// Process identity across daemon restarts: a pid plus its start time (from /proc), so a reused
// pid is never mistaken for a job's supervisor.
struct ProcessId {
  int pid = 0;
  std::uint64_t start_time = 0;
};
std::optional<std::uint64_t> process_start_time(int pid);
// Fields 3 onwards of /proc/<pid>/stat (state, ppid, …; field n is at index n - 3), parsed after
// the command name, which may itself hold spaces and parentheses.
std::optional<std::vector<std::string>> proc_stat_fields(int pid);
// `owner`: as read_untrusted_file's.
std::optional<ProcessId> read_pid_file(const std::string& path, std::optional<uid_t> owner = std::nullopt);
// The user a live process runs as (its effective uid), or nothing once it is gone.
std::optional<uid_t> process_owner(int pid);
bool is_alive(const ProcessId& p);

// Seconds since the epoch (CLOCK_REALTIME), as stored in exit.json and the store.
double wall_now();

}  // namespace gpuq::common
