#!/usr/bin/env bash
# The main job: installs what is missing, builds, starts gpuqd on its default socket (unless one
# is already running), submits the bundled example batch, waits, and prints the results.
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/install-deps.sh
scripts/build.sh
bin=${GPUQ_BUILD_DIR:-build}/bin
export PATH="$PWD/$bin:$PATH"

# The examples are PyTorch scripts: make sure `python3` on PATH can import torch.
if ! python3 -c 'import torch' 2>/dev/null; then
  if /usr/bin/python3 -c 'import torch' 2>/dev/null; then export PATH="/usr/bin:$PATH"
  else echo "demo: no python3 with PyTorch found (Debian: apt-get install python3-torch)" >&2; exit 1; fi
fi

# Start gpuqd on the default socket. Without NVIDIA GPUs it stands in two fake ones, so the
# example still shows GPU assignment and gang scheduling (the jobs then train on the CPU).
if ! gpuq daemon status >/dev/null 2>&1; then
  gpus=auto
  ldconfig -p 2>/dev/null | grep -q libnvidia-ml.so.1 || gpus=fake:2
  gpuq daemon start --gpus "$gpus"
fi
gpuq gpus

# Submit the example batch and follow it to the end.
batch=$(gpuq submit jobs/demo.json --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["batch"])')
ids=$(gpuq results --batch "$batch" --json | python3 -c 'import json,sys; print(" ".join(str(j["id"]) for j in json.load(sys.stdin)["jobs"]))')
echo "submitted batch $batch (jobs $ids); waiting - watch with: gpuq status"
status=0
gpuq wait $ids || status=$?
echo
echo "results of batch $batch:"
gpuq results --batch "$batch"
exit $status
