#!/usr/bin/env bash
# Builds gpuq and runs its test suite inside a chroot of another Debian release, where Debian 12
# has LibTorch 1.13: `trixie` (Debian 13: LibTorch 2.6, Boost 1.83, CLI11 2.4, as on Ubuntu 24.04)
# or `sid` (unstable: LibTorch 2.14, Boost 1.92, CLI11 2.6, CMake 4, GCC 16). It catches what the
# LibTorch 2.x code paths (autocast, c10d Backend, TCPStore on libuv, multi-tensor kernels,
# TorchScript) and newer libraries break, without a GPU. Needs root, debootstrap and the Debian
# archive; ~2.5 GB per chroot; 15-25 min on 2 cores the first time.
#
# Usage: scripts/chroot-check.sh [SUITE [CHROOT]]   (default sid, /srv/gpuq-SUITE; the chroot is
#        kept, and a rerun copies the working tree in again and rebuilds what changed)
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${1:-sid}
root=${2:-/srv/gpuq-$suite}

if [ ! -x "$root/usr/bin/apt-get" ]; then
  debootstrap --variant=minbase --include=ca-certificates "$suite" "$root" http://deb.debian.org/debian
fi
mounted=()
cleanup() { for m in "${mounted[@]}"; do umount -l "$m" || true; done; }
trap cleanup EXIT
for m in proc sys dev dev/pts dev/shm; do
  mountpoint -q "$root/$m" && continue
  case $m in
    proc) mount -t proc proc "$root/proc" ;;
    sys) mount -t sysfs sys "$root/sys" ;;
    dev) mount --bind /dev "$root/dev" ;;
    dev/pts) mount -t devpts devpts "$root/dev/pts" ;;
    dev/shm) mount -t tmpfs tmpfs "$root/dev/shm" ;;
  esac
  mounted=("$root/$m" "${mounted[@]}")
done

# An archive mirror may serve an unstable Release past its Valid-Until date.
echo 'Acquire::Check-Valid-Until "false";' > "$root/etc/apt/apt.conf.d/99gpuq"
# packaging/install-deps.sh's list, less the sanitizer toolchain pinned to Debian 12's clang 14.
packages=$(sed -n '/^packages=(/,/^)/p' packaging/install-deps.sh | grep -v '^ *#' | tr -d '()' |
           sed 's/packages=//' | tr -s ' \n' ' ' | sed 's/clang libclang-rt-14-dev//')
chroot "$root" bash -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $packages" |
  grep -v '^\(Get\|Unpacking\|Setting up\|Selecting\|Preparing\|Processing\)' || true

rm -rf "$root/src/gpuq"
mkdir -p "$root/src/gpuq"
git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C "$root/src/gpuq"
chroot "$root" python3 -c 'import torch; print("python3-torch", torch.__version__)'
# USE_LIBUV=0: Debian's python3-torch lacks libuv, which the torchrun-style example script's
# init_process_group asks for (docs/job-spec.md). gpuq-worker copes without it, which the last
# step checks.
chroot "$root" bash -c 'cd /src/gpuq && export USE_LIBUV=0 &&
  cmake -S . -B /src/build -G Ninja -Wno-dev >/dev/null && cmake --build /src/build --parallel "$(nproc)" &&
  ctest --test-dir /src/build --output-on-failure --parallel 2 &&
  cd tests/integration && unset USE_LIBUV && GPUQ_BIN_DIR=/src/build/bin python3 -m unittest \
    test_worker.Worker.test_ddp_on_gloo_gives_identical_ranks_equal_to_single_process_training'
