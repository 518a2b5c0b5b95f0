#!/usr/bin/env bash
# The integration tests the way a loaded CI machine runs them: every module at once, beside a CPU
# hog on each core, several rounds. A test that synchronises on a sleep instead of an event, or
# that passes only on an idle machine, fails here; every failure it finds is a bug (in the test
# or in gpuq). A few minutes a round on 2 cores; run it before a change lands.
#
# Usage: scripts/stress-tests.sh [-r ROUNDS] [MODULE ...]
#   ROUNDS   rounds (default 2); MODULE: test_queue, test_slurm, ... (default: all but the slow
#            LibTorch ones, test_worker, test_ddp and test_cookbook, which ctest runs)
# Needs a build (scripts/build.sh; $GPUQ_BUILD_DIR, default build/). Logs: $build/stress/.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GPUQ_BUILD_DIR:-build}
rounds=2
if [ "${1:-}" = "-r" ]; then rounds=${2:?-r needs a number}; shift 2; fi
modules=("$@")
if [ ${#modules[@]} -eq 0 ]; then
  modules=(test_queue test_placement test_control test_lifecycle test_errors test_reliability test_load test_ux
           test_config test_hostile test_store_faults test_slurm test_lab test_metrics)
fi
[ -x "$build/bin/gpuqd" ] || { echo "stress-tests: no gpuqd in $build/bin (run scripts/build.sh)" >&2; exit 2; }
bin=$(cd "$build/bin" && pwd)
python=$(sed -n 's/^GPUQ_TEST_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
python=${python:-/usr/bin/python3}

hogs=()
stop_hogs() { [ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null || true; }
trap stop_hogs EXIT
for _ in $(seq "$(nproc)"); do
  sh -c 'while :; do :; done' &
  hogs+=($!)
done

failed=()
for round in $(seq "$rounds"); do
  logs="$build/stress/round-$round"
  rm -rf "$logs"
  mkdir -p "$logs"
  started=$(date +%s)
  pids=()
  for m in "${modules[@]}"; do
    (cd tests/integration && GPUQ_BIN_DIR="$bin" GPUQ_TEST_PYTHON="$python" PYTHONDONTWRITEBYTECODE=1 \
       timeout 1800 "$python" -m unittest -v "$m" >"../../$logs/$m.log" 2>&1) &
    pids+=($!)
  done
  for i in "${!modules[@]}"; do
    if wait "${pids[$i]}"; then
      echo "round $round: ${modules[$i]} passed"
    else
      echo "round $round: ${modules[$i]} FAILED (see $logs/${modules[$i]}.log)"
      failed+=("round $round: ${modules[$i]}")
    fi
  done
  echo "round $round took $(( $(date +%s) - started )) s beside $(nproc) CPU hog(s)"
done
if [ ${#failed[@]} -gt 0 ]; then
  printf 'stress-tests: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "stress-tests: ${#modules[@]} modules x $rounds rounds passed beside a CPU hog on each core"
