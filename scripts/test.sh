#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs unit and integration tests; the CUDA
# build against PyPI's PyTorch (scripts/cuda-build.sh, build-cuda/) with its worker tests
# on the CPU and the GPU check's dry run (docs/cuda.md); builds and runs the Debian package
# (packaging/test-deb.sh); the same tests under AddressSanitizer + UndefinedBehaviorSanitizer
# (build-asan/, without the LibTorch worker); then the libFuzzer targets over the committed corpus
# for a bounded time ($GPUQ_FUZZ_SECONDS per target, default 60). GPUQ_QUICK=1 stops after the
# first stage; GPUQ_SKIP_CUDA=1 skips the CUDA stage (it needs the CUDA toolkit and PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/install-deps.sh
export GPUQ_REQUIRE_PROMETHEUS=1  # installed just now: the metrics tests may not skip promtool or Prometheus
scripts/build.sh
ctest --test-dir "${GPUQ_BUILD_DIR:-build}" --output-on-failure --parallel 2
[ "${GPUQ_QUICK:-0}" = 1 ] && exit 0
if [ "${GPUQ_SKIP_CUDA:-0}" = 1 ]; then
  echo "== CUDA build SKIPPED (GPUQ_SKIP_CUDA=1): no CUDA path was compiled"
else
  echo "== CUDA build (PyTorch's LibTorch from PyPI), its tests on the CPU"
  # The daemon, CLI and shim hold no LibTorch: the plain build's, copied (scripts/cuda-build.sh).
  export GPUQ_PREBUILT_TOOLS=$(realpath "${GPUQ_BUILD_DIR:-build}/bin")
  scripts/cuda-build.sh
  ctest --test-dir build-cuda --output-on-failure --parallel 2 -R '^integration\.(test_worker|test_ddp)$'
  python3 scripts/gpu-check.py --device cpu --python build-cuda/python --build build-cuda --out build-cuda/gpu-check
fi
echo "== Debian package"
packaging/test-deb.sh
echo "== sanitizers (ASan + UBSan)"
scripts/sanitize.sh
echo "== fuzzing"
scripts/fuzz.sh
