#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs unit and integration tests, builds
# and runs the Debian package (packaging/test-deb.sh), then the same tests under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/, without the
# LibTorch worker), then the libFuzzer targets over the committed corpus for a bounded time
# ($GPUQ_FUZZ_SECONDS per target, default 60). GPUQ_QUICK=1 stops after the first stage.
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/install-deps.sh
scripts/build.sh
ctest --test-dir "${GPUQ_BUILD_DIR:-build}" --output-on-failure --parallel 2
[ "${GPUQ_QUICK:-0}" = 1 ] && exit 0
echo "== Debian package"
packaging/test-deb.sh
echo "== sanitizers (ASan + UBSan)"
scripts/sanitize.sh
echo "== fuzzing"
scripts/fuzz.sh
