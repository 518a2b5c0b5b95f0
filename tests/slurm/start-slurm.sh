#!/usr/bin/env bash
# Starts a real Slurm for the tests, in DIR, on free ports: auth/none, no accounting, slurmctld and
# NODES slurmd (default 1), each node with CPUS cores and GPUS fake GPUs (GRES backed by character
# devices, copies of /dev/null's). One node is "localhost"; several are emulated on this machine,
# "node1", "node2"..., each slurmd on a port of its own, all at address 127.0.0.1 (NodeAddr, which
# is where gpuq's ranks find rank 0). Needs root (slurmd) and Debian's slurm-wlm. Prints the path
# of its slurm.conf once every node is idle; stop it with `tests/slurm/start-slurm.sh --stop DIR`.
# PREEMPT=1: preemption by partition (preempt/partition_prio): jobs of partition "urgent" preempt
# those of "debug" (the default), which Slurm cancels (PREEMPTED) after sending them their
# --signal and a GraceTime of 60 s (SlurmctldParameters=preempt_send_user_signal).
# Tried with Debian 12's Slurm 22.05.
set -euo pipefail
if [[ ${1:-} == --stop ]]; then
  for pid in "$2"/slurmd*.pid "$2"/slurmctld.pid; do [[ -f $pid ]] && kill "$(cat "$pid")" 2>/dev/null || true; done
  exit 0
fi
dir=$(realpath "$1") gpus=${GPUS:-2} cpus=${CPUS:-2} nodes=${NODES:-1} preempt=${PREEMPT:-0}
command -v slurmctld >/dev/null || { echo "start-slurm: slurmctld missing (apt-get install slurm-wlm)" >&2; exit 2; }
mkdir -p "$dir"/{state,spool,log}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ctld_port=$(free_port) d_port=$(free_port)
names=() node_lines=""
gres=$( ((gpus > 0)) && echo "Gres=gpu:$gpus")
if ((nodes == 1)); then
  names=(localhost)
  node_lines="NodeName=localhost NodeHostname=localhost Port=$d_port CPUs=$cpus RealMemory=1000 $gres State=UNKNOWN"
else
  for ((i = 1; i <= nodes; i++)); do
    names+=("node$i")
    node_lines+="NodeName=node$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$( ((i == 1)) && echo "$d_port" || free_port)"
    node_lines+=" CPUs=$cpus RealMemory=1000 $gres State=UNKNOWN"$'\n'
  done
fi
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
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# The nodes have the CPUs this script gives them (CPUS), whatever this machine has.
SlurmdParameters=config_overrides
GresTypes=gpu
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=300
$node_lines
CONF
partition="Nodes=$(IFS=,; echo "${names[*]}") MaxTime=INFINITE State=UP"
if ((preempt)); then
  cat >>"$dir/slurm.conf" <<CONF
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
SlurmctldParameters=preempt_send_user_signal
PartitionName=debug $partition Default=YES PriorityTier=1 GraceTime=60
PartitionName=urgent $partition PriorityTier=2 PreemptMode=OFF
CONF
else
  echo "PartitionName=debug $partition Default=YES" >>"$dir/slurm.conf"
fi
export SLURM_CONF=$dir/slurm.conf
slurmctld -c -f "$SLURM_CONF"
for name in "${names[@]}"; do slurmd -f "$SLURM_CONF" -N "$name"; done
for ((i = 0; i < 300; i++)); do  # the nodes register within seconds; 30 s at most
  # a node in two partitions is listed twice
  [[ $(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | awk '{print $2}' | uniq -c | awk '{print $1, $2}') == "$nodes idle" ]] &&
    { echo "$SLURM_CONF"; exit 0; }
  sleep 0.1
done
echo "start-slurm: the nodes did not become idle; see $dir/log" >&2
exit 1
