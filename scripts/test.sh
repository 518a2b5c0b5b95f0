#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs unit and integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/install-deps.sh
scripts/build.sh
ctest --test-dir "${GPUQ_BUILD_DIR:-build}" --output-on-failure --parallel 2
