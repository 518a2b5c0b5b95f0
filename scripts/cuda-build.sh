#!/usr/bin/env bash
# The CUDA build of gpuq, on any machine, GPU or not: every translation unit behind GPUQ_HAVE_CUDA
# and GPUQ_HAVE_NCCL compiled and linked against PyPI's CUDA build of PyTorch (its LibTorch, CMake
# config and c10d NCCL headers), with the CUDA toolkit at $CUDA_HOME (/usr/local/cuda), and the
# NVML types checked against the real nvml.h (daemon/nvml_abi_check.cpp).
#
# The PyTorch wheel, pinned below, lives in a virtual environment in a cache directory
# ($GPUQ_CACHE_DIR, else ~/.cache/gpuq): the first run downloads ~3 GB and installs ~5 GB, in
# about 3 minutes; later runs reuse it. The build goes to build-cuda/ ($GPUQ_CUDA_BUILD_DIR).
# Configure fails unless CUDA, NCCL and nvml.h are all found (GPUQ_REQUIRE_CUDA). With
# $GPUQ_PREBUILT_TOOLS (a plain build's bin/, as scripts/test.sh sets it) gpuqd, gpuq, gpuq-shim and
# gpuq-plot-png are copied from there, not compiled; without it they are compiled here. The last line
# printed is `GPUQ_HAVE_CUDA=ON GPUQ_HAVE_NCCL=ON`; the venv's python is in
# $GPUQ_CUDA_BUILD_DIR/python (scripts/test.sh runs the worker's tests and gpu-check.py with it).
# docs/cuda.md says why this way and what it costs.
set -euo pipefail
cd "$(dirname "$0")/.."
torch_version=2.15.0          # CUDA 13 build; NCCL 2.30 and cuDNN 9 come as its dependencies
nvml_version=13.5.37          # nvidia-nvml-dev: nvml.h, which the toolkit here lacks
numpy_version=2.4.6           # jobs/examples/train.py, which gpu-check.py runs as a job
cache=${GPUQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuq}
venv=$cache/torch-$torch_version
build=${GPUQ_CUDA_BUILD_DIR:-build-cuda}
cuda=${CUDA_HOME:-/usr/local/cuda}

[ -x "$cuda/bin/nvcc" ] || {
  echo "cuda-build: no CUDA toolkit at $cuda (set CUDA_HOME; scripts/test.sh skips this stage with GPUQ_SKIP_CUDA=1)" >&2
  exit 1
}
if [ ! -f "$venv/.installed" ]; then
  echo "cuda-build: installing torch==$torch_version (CUDA) into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --no-input --disable-pip-version-check \
    "torch==$torch_version" "nvidia-nvml-dev==$nvml_version" "numpy==$numpy_version"
  touch "$venv/.installed"
fi
python=$venv/bin/python
prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)

mkdir -p "$build"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# Release, as scripts/gpu-check.py configures, so that it reuses this build.
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCUDAToolkit_ROOT="$cuda" -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DGPUQ_REQUIRE_CUDA=ON \
  -DGPUQ_PREBUILT_TOOLS="${GPUQ_PREBUILT_TOOLS:-}" >"$build/gpuq-configure.log" 2>&1 \
  || { cat "$build/gpuq-configure.log" >&2; exit 1; }
grep -E "gpuq-worker:|NVML ABI check" "$build/gpuq-configure.log"
# What differs from a plain build (the worker, the NVML check) and what runs it. The daemon, CLI,
# shim and unit tests hold no LibTorch, CUDA or NCCL code: the plain build compiles and tests them,
# and with $GPUQ_PREBUILT_TOOLS this one copies its binaries.
plot=gpuq-plot-png
grep -q "cairo not found" "$build/gpuq-configure.log" && plot=
cmake --build "$build" --parallel "$(nproc)" --target gpuq-worker gpuq_nvml_abi_check gpuqd gpuq gpuq-shim $plot fake_nvml
# A script, not a link (a link would lose the venv); written beside and renamed, never through
# whatever is at that path.
printf '#!/bin/sh\nexec "%s" "$@"\n' "$python" >"$build/python.new"
chmod +x "$build/python.new"
mv -f "$build/python.new" "$build/python"
defs=$(grep -o "collectives: .*" "$build/gpuq-configure.log")
on() { [[ $defs == *"$1"* ]] && echo ON || echo OFF; }
echo "GPUQ_HAVE_CUDA=$(on GPUQ_HAVE_CUDA) GPUQ_HAVE_NCCL=$(on GPUQ_HAVE_NCCL)"
