#!/usr/bin/env bash
# slurm-down.sh - stop the local Slurm cluster started by slurm-up.sh (same --root).
#
#   bash slurm/slurm-down.sh           cancel the jobs, stop the daemons, keep the state
#                                      (job ids and the accounting database survive)
#   bash slurm/slurm-down.sh --purge   ... and delete the whole folder
#
# Options: --root DIR (or RANKSCOPE_SLURM_ROOT) [/tmp/rankscope-slurm]  --purge  -h|--help
#
# Only the processes named in the cluster's PID files are signalled, each checked against the
# executable it must run (a reused PID is never hit); job processes that outlive scancel are
# found by this cluster's SLURM_CONF in their environment. Nothing is killed by name.
# Safe to run again and again.
set -uo pipefail

ROOT=${RANKSCOPE_SLURM_ROOT:-/tmp/rankscope-slurm}
PURGE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --purge) PURGE=1; shift ;;
    --root) ROOT=${2:?--root needs a value}; shift 2 ;;
    --root=*) ROOT=${1#*=}; shift ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "slurm-down: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
say() { printf '[slurm-down] %s\n' "$*" >&2; }

if [ ! -d "$ROOT" ]; then
  say "no cluster folder at $ROOT: nothing to stop"
  exit 0
fi
ROOT=$(cd "$ROOT" && pwd -P)
RUNDIR=$ROOT/run
CONF=$ROOT/etc/slurm.conf
export SLURM_CONF=$CONF

# live_pid PIDFILE "EXE...": shared with slurm-up.sh
# shellcheck source=slurm/pids.sh
. "$(dirname "${BASH_SOURCE[0]}")/pids.sh"
terminate() { # terminate PID NAME SECONDS -> SIGTERM, wait up to SECONDS, then SIGKILL
  local pid=$1 name=$2 ticks=$(($3 * 10))
  kill -TERM "$pid" 2>/dev/null || return 0
  while [ "$ticks" -gt 0 ]; do
    readlink "/proc/$pid/exe" >/dev/null 2>&1 || { say "stopped $name (pid $pid)"; return 0; }
    sleep 0.1
    ticks=$((ticks - 1))
  done
  say "$name (pid $pid) still running after SIGTERM; SIGKILL"
  kill -KILL "$pid" 2>/dev/null
}
stop_daemon() { # stop_daemon PIDFILE "EXE..." SECONDS
  local pid
  if pid=$(live_pid "$1" "$2"); then terminate "$pid" "$(basename "$1" .pid)" "$3"; fi
  rm -f "$1"
}
# Job processes of THIS cluster that are still alive: slurmstepd, or anything carrying a job id,
# whose environment holds our SLURM_CONF. Never this script or its ancestors (a test run from
# inside a job would otherwise kill itself).
job_leftovers() {
  local mine=" " p=$$ f pid exe
  while [ "${p:-0}" -gt 1 ]; do
    mine+="$p "
    p=$(awk '{ sub(/.*\) /, ""); print $2 }' "/proc/$p/stat" 2>/dev/null)
  done
  for f in $(grep -lzxF "SLURM_CONF=$CONF" /proc/[0-9]*/environ 2>/dev/null); do
    pid=${f#/proc/}
    pid=${pid%/environ}
    case "$mine" in *" $pid "*) continue ;; esac
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
    case "${exe##*/}" in
      slurmstepd | slurmstepd-wlm) echo "$pid" ;;
      *) grep -qz '^SLURM_JOB_ID=' "/proc/$pid/environ" 2>/dev/null && echo "$pid" ;;
    esac
  done
}

# 1. cancel the jobs while the controller runs, and give their steps time to clean up
if live_pid "$RUNDIR/slurmctld.pid" "slurmctld slurmctld-wlm" >/dev/null; then
  jobs=$(timeout 10 squeue --noheader --format=%A 2>/dev/null | sort -u | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    say "cancelling jobs: $jobs"
    # shellcheck disable=SC2086 # one argument per job id
    timeout 10 scancel $jobs 2>/dev/null
    for _ in $(seq 150); do # up to 30 s until the queue is empty
      [ -z "$(timeout 10 squeue --noheader --format=%A 2>/dev/null)" ] && break
      sleep 0.2
    done
    for _ in $(seq 20); do # and up to 10 s until their processes are gone
      [ -z "$(job_leftovers)" ] && break
      sleep 0.5
    done
  fi
fi

# 2. the daemons: compute nodes first, the database last
for f in "$RUNDIR"/slurmd-*.pid; do
  [ -e "$f" ] && stop_daemon "$f" "slurmd slurmd-wlm" 15
done
stop_daemon "$RUNDIR/slurmctld.pid" "slurmctld slurmctld-wlm" 30
stop_daemon "$RUNDIR/slurmdbd.pid" "slurmdbd" 30
stop_daemon "$RUNDIR/mariadbd.pid" "mariadbd mysqld" 60
stop_daemon "$RUNDIR/munged.pid" "munged" 15

# 3. job processes scancel could not reach (e.g. the controller was already gone)
left=$(job_leftovers | tr '\n' ' ')
if [ -n "${left// /}" ]; then
  say "killing leftover job processes: $left"
  # shellcheck disable=SC2086 # one argument per PID
  kill -KILL $left 2>/dev/null
fi

rm -f "$RUNDIR/munge.socket" "$RUNDIR/munge.socket.lock" "$RUNDIR/mariadb.sock"
if [ "$PURGE" = 1 ]; then
  rm -rf "$ROOT"
  say "deleted $ROOT"
fi
say "cluster in $ROOT stopped"
