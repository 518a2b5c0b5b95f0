// Dependencies (`after`): whether a dependency lets a queued job go, failing the jobs whose
// dependency ended without success, and taking back from an executor that places work itself the
// jobs handed over after a dependency that will no longer succeed. Functions of a Reads (the job
// table and the store say a dependency's state), the executor and the daemon's commit; they keep
// no state of their own. Unit tests call them over a store in memory (test_dependencies).
#pragma once

#include <cstdint>

#include "daemon/executor.hpp"
#include "daemon/job_table.hpp"
#include "daemon/reads.hpp"

namespace gpuq::daemon::dependencies {

// Whether a queued job's dependency lets it go: it succeeded, or it runs under an executor that
// follows it (Executor::follows: the job waits in that system until the dependency has succeeded).
bool met(const Reads& r, std::int64_t dep);
// Takes back each job handed over after a dependency that will no longer succeed as it was
// handed over (it failed or was taken back itself): it waits in gpuqd's queue again. The
// executor is asked for each running job whose dependency is not met; one that follows nothing
// ignores it.
void withdraw_orphans(const Reads& r, Executor& executor);
// Fails queued jobs whose dependencies ended without success, through `commit`, a part of a
// failed chain at a time. Returns true when some are left for the next pass.
bool fail_blocked(const Reads& r, const Commit& commit, double now);

}  // namespace gpuq::daemon::dependencies
