#!/usr/bin/env bash
# Writes gzipped man pages for gpuq, gpuqd and gpuq-worker from their --help (help2man), with a
# COMMANDS section that holds every gpuq subcommand's own --help.
# Usage: packaging/make-man.sh BIN_DIR OUT_DIR
set -euo pipefail
bin=$1 out=$2
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Defaults in --help depend on the environment: show them as a reader would write them.
export GPUQ_CONFIG='~/.config/gpuq/config.json' HOME='~' XDG_RUNTIME_DIR='$XDG_RUNTIME_DIR' XDG_CONFIG_HOME='' XDG_STATE_HOME=''
unset GPUQ_SOCKET GPUQ_STATE_DIR GPUQ_GPUS GPUQ_LOG_LIMIT_MB GPUQ_RETRIES

# gpuq: one subsection per subcommand (and per `daemon` subcommand)
{
  echo "[COMMANDS]"
  subcommands() { "$@" --help | sed -n '/^Subcommands:/,$p' | awk 'NR > 1 && /^  [a-z]/ {print $1}'; }
  commands=$(for sub in $(subcommands "$bin/gpuq"); do
    if [ "$sub" = daemon ]; then subcommands "$bin/gpuq" daemon | sed 's/^/daemon /'; else echo "$sub"; fi
  done)
  while read -r cmd; do
    echo ".SS gpuq $cmd"
    echo ".nf"
    # shellcheck disable=SC2086  # "daemon start" is two words
    "$bin/gpuq" $cmd --help | sed -e 's/\\/\\e/g' -e 's/^\./\\\&./' -e "s|$bin/||g"
    echo ".fi"
  done <<<"$commands"
  echo "[FILES]"
  echo "~/.config/gpuq/config.json (or \$GPUQ_CONFIG): defaults for gpuq and gpuqd; see /usr/share/doc/gpuq/docs/cli.md."
  echo "[SEE ALSO]"
  echo "gpuqd(1), gpuq-worker(1); /usr/share/doc/gpuq/docs/ for the job spec, protocol and cookbook."
} >"$work/gpuq.h2m"
{
  echo "[FILES]"
  echo "~/.local/state/gpuq: the queue (gpuq.db), gpuqd.log and each job's directory."
  echo "[SEE ALSO]"
  echo "gpuq(1); systemctl --user start gpuqd (the systemd user unit)."
} >"$work/gpuqd.h2m"

render() {  # name description [include]
  local name=$1 desc=$2 include=${3:-}
  [ -x "$bin/$name" ] || return 0
  help2man --no-info --section 1 --name "$desc" ${include:+--include "$include"} \
    --version-string "$("$bin/$name" --version | head -1)" --output "$work/$name.1" "$bin/$name"
  gzip -9n -c "$work/$name.1" >"$out/$name.1.gz"
}
render gpuq "a multi-GPU job queue: submit, watch and collect jobs" "$work/gpuq.h2m"
render gpuqd "the gpuq daemon: durable queue, GPU scheduling and job supervision" "$work/gpuqd.h2m"
render gpuq-worker "the gpuq LibTorch trainer (independent, DDP or model-parallel)"
