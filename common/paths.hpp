// Where gpuq keeps its socket and state, shared by daemon and CLI so both agree on defaults.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/error.hpp"

namespace gpuq::common {

// $XDG_RUNTIME_DIR/gpuq/gpuqd.sock, else /tmp/gpuq-$UID/gpuqd.sock.
std::string default_socket_path();
// $XDG_STATE_HOME/gpuq, else $HOME/.local/state/gpuq, else /tmp/gpuq-$UID/state.
std::string default_state_dir();

// Creates `dir` and its parents; the last component gets mode 0700. Refuses a directory owned by
// another user or open to group/others (someone else could then reach our socket or jobs).
Result<bool> ensure_private_dir(const std::string& dir);

std::string parent_dir(const std::string& path);

// Creates `dir` and its missing parents with mode 0777 less the umask (`mkdir -p`); an existing
// directory is fine. The error names the component that could not be made.
Result<bool> make_dirs(const std::string& dir);

// The folder of the running executable: gpuq's programs find each other there (gpuq finds gpuqd
// and gpuq-plot-png, gpuqd finds gpuq-shim and gpuq-worker).
std::string self_dir();
// The working directory ("/" if it cannot be read: removed, or too long).
std::string current_dir();

// Whether something is at `path` (following symlinks).
bool path_exists(const std::string& path);

// Whether `path` is a directory (following symlinks).
bool is_directory(const std::string& path);

// Deletes `path` and everything under it, never following a symlink: each directory is opened
// through its parent's descriptor with O_NOFOLLOW, so a job that swaps one of its directories for
// a link to /etc while a root gpuqd deletes its files deletes the link, not /etc. Returns the
// bytes of the regular files deleted; `error` gets the first problem ("" when none). Trees deeper
// than 256 directories are left below that depth, and said so.
std::int64_t remove_tree(const std::string& path, std::string& error);

// This process's environment as name -> value.
std::map<std::string, std::string> current_environment();

}  // namespace gpuq::common
