#!/usr/bin/env bash
# Builds gpuq with AddressSanitizer + UndefinedBehaviorSanitizer into build-asan/ (daemon, shim,
# CLI and tests; gpuq-worker is left out: LibTorch is not built with ASan) and runs the unit and
# integration tests against it. Any sanitizer report, in a test binary or in a gpuqd, gpuq-shim
# or gpuq process an integration test started, fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GPUQ_ASAN_BUILD_DIR:-build-asan}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# -g1: line tables, all a sanitizer report's stack needs (file:line); a seventh off one file's
# compile, within the noise of the whole build (docs/benchmarks.md).
[ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DGPUQ_ENABLE_SANITIZERS=ON -DGPUQ_WITH_TORCH=OFF
cmake --build "$build" --parallel "$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export GPUQ_SANITIZED=1  # the integration harness then scans every log for sanitizer reports
ctest --test-dir "$build" --output-on-failure --parallel 2
