#!/usr/bin/env bash
# Starts a real Slurm (slurmctld + one slurmd) for the tests, in DIR, on free ports: auth/none, no
# accounting, one node "localhost" with CPUS cores and GPUS fake GPUs (GRES backed by character
# devices, copies of /dev/null's). Needs root (slurmd) and Debian's slurm-wlm. Prints the path of
# its slurm.conf once the node is idle; stop it with `tests/slurm/start-slurm.sh --stop DIR`.
# Tried with Debian 12's Slurm 22.05.
set -euo pipefail
if [[ ${1:-} == --stop ]]; then
  for pid in "$2"/slurmd.pid "$2"/slurmctld.pid; do [[ -f $pid ]] && kill "$(cat "$pid")" 2>/dev/null || true; done
  exit 0
fi
dir=$(realpath "$1") gpus=${GPUS:-2} cpus=${CPUS:-2}
command -v slurmctld >/dev/null || { echo "start-slurm: slurmctld missing (apt-get install slurm-wlm)" >&2; exit 2; }
mkdir -p "$dir"/{state,spool,log}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ctld_port=$(free_port) d_port=$(free_port)
for ((i = 0; i < gpus; i++)); do
  [[ -e $dir/gpu$i ]] || mknod "$dir/gpu$i" c 1 3
done
((gpus > 0)) && echo "Name=gpu File=$dir/gpu[0-$((gpus - 1))]" >"$dir/gres.conf" || : >"$dir/gres.conf"
cat >"$dir/slurm.conf" <<CONF
ClusterName=gpuqtest
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
GresTypes=gpu
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=300
NodeName=localhost NodeHostname=localhost Port=$d_port CPUs=$cpus RealMemory=1000 $( ((gpus > 0)) && echo "Gres=gpu:$gpus") State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$dir/slurm.conf
slurmctld -c -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N localhost
for ((i = 0; i < 300; i++)); do  # the node registers within seconds; 30 s at most
  [[ $(sinfo -h -N -o %t 2>/dev/null) == idle ]] && { echo "$SLURM_CONF"; exit 0; }
  sleep 0.1
done
echo "start-slurm: the node did not become idle; see $dir/log" >&2
exit 1
