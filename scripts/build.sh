#!/usr/bin/env bash
# Configures and builds gpuq into build/ (or $GPUQ_BUILD_DIR). Extra arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GPUQ_BUILD_DIR:-build}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
[ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" "${generator[@]}" "$@"
cmake --build "$build" --parallel "$(nproc)"
