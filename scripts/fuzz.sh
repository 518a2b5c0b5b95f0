#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) into build-fuzz/ and runs each over the
# committed corpus for a bounded time: $GPUQ_FUZZ_SECONDS (default 60) per target, one per core at
# a time. New inputs go to a scratch directory, crashing inputs into build-fuzz/ (crash-*): add
# them to tests/corpus once fixed. Any crash, leak or sanitizer report fails.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GPUQ_FUZZ_BUILD_DIR:-build-fuzz}
seconds=${GPUQ_FUZZ_SECONDS:-60}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
[ -f "$build/CMakeCache.txt" ] || CC=clang CXX=clang++ cmake -S . -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUQ_BUILD_FUZZERS=ON -DGPUQ_WITH_TORCH=OFF -DGPUQ_BUILD_TESTS=OFF
cmake --build "$build" --parallel "$(nproc)" --target fuzz_request fuzz_job_spec fuzz_events fuzz_dataset

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
mkdir -p "$scratch/request" "$scratch/job_spec" "$scratch/events" "$scratch/dataset"
# One target per core at a time: a target's wall time is its own, whatever runs beside it.
jobs=$(nproc)
run() {
  local target=$1 seeds
  case $target in
    request) seeds=(tests/corpus/requests) ;;
    job_spec) seeds=(tests/corpus/specs jobs) ;;
    events) seeds=(tests/corpus/events) ;;
    dataset) seeds=(tests/corpus/datasets) ;;
  esac
  "$build/bin/fuzz_$target" "$scratch/$target" "${seeds[@]}" -max_total_time="$seconds" \
    -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/" \
    >"$scratch/$target.log" 2>&1
}
# Waits for the oldest target still running, says how it ended and prints its log's tail.
pids=() targets=() failed=0
finish_oldest() {
  wait "${pids[0]}" && echo "fuzz: ${targets[0]} done" || { echo "fuzz: ${targets[0]} FAILED"; failed=1; }
  tail -n 12 "$scratch/${targets[0]}.log"
  pids=("${pids[@]:1}") targets=("${targets[@]:1}")
}
for target in request job_spec events dataset; do
  echo "fuzz: $target for ${seconds}s"
  run "$target" &
  pids+=($!) targets+=("$target")
  [ "${#pids[@]}" -lt "$jobs" ] || finish_oldest
done
while [ "${#pids[@]}" -gt 0 ]; do finish_oldest; done
exit "$failed"
