#!/usr/bin/env bash
# Installs what gpuq needs to build, test and run its examples from Debian 12 packages.
# Idempotent: packages already present are skipped, and apt is not touched when none are missing.
set -euo pipefail

packages=(
  # build
  g++ cmake ninja-build ccache pkg-config dpkg-dev
  # daemon and CLI
  libboost-dev libboost-filesystem-dev nlohmann-json3-dev libcli11-dev libsqlite3-dev
  # a job's report patterns over its output (RE2: linear time, bounded memory)
  libre2-dev
  # gpuq plot's PNGs, and man pages from --help
  libcairo2-dev fonts-dejavu-core help2man
  # tests and benchmarks
  doctest-dev python3 python3-pytest procps task-spooler sqlite3 tmux jq python3-jsonschema
  # promtool and a real Prometheus server for the metrics tests
  prometheus
  # a real Slurm (slurmctld and slurmd on this machine) for the Slurm tests
  slurm-wlm
  # sanitizer and fuzzing stages of the test suite
  clang libclang-rt-14-dev
  # LibTorch trainer, the example torchrun-style jobs and their data
  libtorch-dev libgloo-dev zlib1g-dev python3-torch dataset-fashion-mnist
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
