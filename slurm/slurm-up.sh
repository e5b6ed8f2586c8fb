#!/usr/bin/env bash
# slurm-up.sh - bring up a REAL Slurm cluster on this one machine, for rankscope's tests, demos
# and CI: installs the Debian packages when missing (root, apt), writes every file (config,
# state, logs, PID files, munge socket) under one folder, starts the daemons, and waits until
# every node is idle. Nothing is written to /etc; no systemd and no cgroups are needed.
#
#   bash slurm/slurm-up.sh                 1 node named after this host, with accounting
#   bash slurm/slurm-up.sh --nodes 2       2 emulated nodes n1, n2 (two slurmd on 127.0.0.1)
#   bash slurm/slurm-up.sh --no-accounting no slurmdbd/mariadb (sacct fails: rankscope status
#                                          and submitit then cannot see how a job ended)
#   source /tmp/rankscope-slurm/env.sh     exports SLURM_CONF for sbatch, squeue, rankscope
#
# Options: --nodes N  --root DIR  --no-accounting  --no-install  -h|--help
# Environment (all optional; options win):
#   RANKSCOPE_SLURM_ROOT      folder of everything [/tmp/rankscope-slurm]
#   RANKSCOPE_SLURM_NODES     number of nodes [1]
#   RANKSCOPE_SLURM_PORT      slurmctld port; slurmd +1, slurmdbd +2, mariadb +3,
#                             emulated nodes' slurmd +11.. [6817]
#   RANKSCOPE_SLURM_CPUS      CPUs each node advertises [$(nproc)]
#   RANKSCOPE_SLURM_TIMEOUT   seconds to wait for each daemon and for idle nodes [90]
#
# Idempotent: packages are installed once; a daemon whose PID file names a live process of the
# expected executable is left running; a running cluster with a different configuration is an
# error (stop it first with slurm-down.sh). Stop with: bash slurm/slurm-down.sh
set -euo pipefail

ROOT=${RANKSCOPE_SLURM_ROOT:-/tmp/rankscope-slurm}
NODES=${RANKSCOPE_SLURM_NODES:-1}
PORT=${RANKSCOPE_SLURM_PORT:-6817}
# nproc honours OMP_NUM_THREADS, which dask's LocalCluster sets to 1 in its parent process:
# ignore it, or a pytest session that started a cluster first gets 1-CPU nodes.
CPUS=${RANKSCOPE_SLURM_CPUS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
TIMEOUT=${RANKSCOPE_SLURM_TIMEOUT:-90}
ACCOUNTING=1
INSTALL=1
PARTITION=debug

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=${2:?--nodes needs a value}; shift 2 ;;
    --nodes=*) NODES=${1#*=}; shift ;;
    --root) ROOT=${2:?--root needs a value}; shift 2 ;;
    --root=*) ROOT=${1#*=}; shift ;;
    --no-accounting) ACCOUNTING=0; shift ;;
    --no-install) INSTALL=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "slurm-up: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

START=$(date +%s.%N)
say() { printf '[slurm-up %5.1fs] %s\n' "$(awk -v a="$START" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" "$*" >&2; }
fail() { say "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || fail "run as root: the daemons run as SlurmUser=root and packages come from apt-get"
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || fail "--nodes must be a positive integer, got '$NODES'"
[[ "$PORT" =~ ^[0-9]+$ ]] || fail "RANKSCOPE_SLURM_PORT must be a number, got '$PORT'"
mkdir -p "$ROOT"
ROOT=$(cd "$ROOT" && pwd -P)

ETC=$ROOT/etc RUNDIR=$ROOT/run LOGS=$ROOT/log STATE=$ROOT/state
CONF=$ETC/slurm.conf
DBD_CONF=$ETC/slurmdbd.conf
MUNGE_SOCKET=$RUNDIR/munge.socket
DB_SOCKET=$RUNDIR/mariadb.sock
CTLD_PORT=$PORT SLURMD_PORT=$((PORT + 1)) DBD_PORT=$((PORT + 2)) DB_PORT=$((PORT + 3))
export SLURM_CONF=$CONF
# AF_UNIX socket paths are limited to 108 bytes
[ ${#DB_SOCKET} -lt 100 ] || fail "--root path too long for unix sockets: $ROOT"

# live_pid PIDFILE "EXE...": shared with slurm-down.sh
# shellcheck source=slurm/pids.sh
. "$(dirname "${BASH_SOURCE[0]}")/pids.sh"
# until_ok SECONDS WHAT CMD... -> retry CMD every 0.25 s
until_ok() {
  local secs=$1 what=$2 deadline
  shift 2
  deadline=$(($(date +%s) + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.25
  done
  say "$what ready"
}
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
show_logs() {
  local f
  for f in "$LOGS"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done >&2
}

# ---- packages ------------------------------------------------------------------------------
PACKAGES=(munge slurmctld slurmd slurm-client)
[ "$ACCOUNTING" = 1 ] && PACKAGES+=(slurmdbd mariadb-server)
MISSING=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || MISSING+=("$p")
done
if [ ${#MISSING[@]} -gt 0 ]; then
  [ "$INSTALL" = 1 ] || fail "packages missing: ${MISSING[*]} (drop --no-install to install them)"
  command -v apt-get >/dev/null || fail "packages missing: ${MISSING[*]} and no apt-get to install them"
  mkdir -p "$LOGS"
  say "apt-get install ${MISSING[*]} (log: $LOGS/apt.log)"
  # Package scripts must not start system-wide daemons (no systemd here, no /etc/slurm config):
  # a policy-rc.d that denies every start, removed again afterwards.
  OWN_POLICY=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    OWN_POLICY=1
  fi
  rc=0
  {
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -q &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q \
        --no-install-recommends "${MISSING[@]}"
  } >"$LOGS/apt.log" 2>&1 || rc=$?
  [ "$OWN_POLICY" = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ "$rc" = 0 ] || { tail -n 25 "$LOGS/apt.log" >&2; fail "apt-get failed (see $LOGS/apt.log)"; }
  say "packages installed"
fi

# ---- configuration -------------------------------------------------------------------------
mkdir -p "$ETC" "$RUNDIR" "$LOGS" "$STATE/ctld"
chmod 700 "$ETC"
HOST=$(hostname -s 2>/dev/null || hostname)
HARDWARE=$(slurmd -C | head -n 1) # NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 ...
field() { sed -n "s/.*[[:space:]]$1=\([0-9]*\).*/\1/p" <<<"$HARDWARE"; }
MEMORY=$(($(field RealMemory) / NODES))
TOPOLOGY=""
if [ "$CPUS" = "$(field CPUs)" ]; then
  TOPOLOGY="Boards=$(field Boards) SocketsPerBoard=$(field SocketsPerBoard)"
  TOPOLOGY+=" CoresPerSocket=$(field CoresPerSocket) ThreadsPerCore=$(field ThreadsPerCore)"
fi
NAMES=()
if [ "$NODES" = 1 ]; then
  NAMES=("$HOST")
  NODE_LINE="NodeName=$HOST NodeAddr=127.0.0.1 Port=$SLURMD_PORT"
else
  for i in $(seq 1 "$NODES"); do NAMES+=("n$i"); done
  # several slurmd on one host: each listens on its own port, its files carry %n (node name)
  NODE_LINE="NodeName=n[1-$NODES] NodeHostname=$HOST NodeAddr=127.0.0.1"
  NODE_LINE+=" Port=$((PORT + 11))-$((PORT + 10 + NODES))"
fi
NODE_LINE+=" CPUs=$CPUS $TOPOLOGY RealMemory=$MEMORY State=UNKNOWN"
# More CPUs than the host has (RANKSCOPE_SLURM_CPUS): slurmd would report the real count and
# slurmctld would mark the node invalid; config_overrides makes Slurm take the configured one
# (jobs then share the cores: more of them run at once, each slower).
OVERRIDES=""
[ "$CPUS" -gt "$(field CPUs)" ] && OVERRIDES="SlurmdParameters=config_overrides"
for n in "${NAMES[@]}"; do mkdir -p "$STATE/slurmd-$n"; done

if [ "$ACCOUNTING" = 1 ]; then
  ACCOUNTING_LINES="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# slurmctld and sacct authenticate to slurmdbd through this munge socket (AuthInfo is ignored)
AccountingStoragePass=$MUNGE_SOCKET
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30"
else
  ACCOUNTING_LINES="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi

cat >"$CONF.new" <<EOF
# Written by rankscope slurm/slurm-up.sh for a local test cluster. Rerun the script to change it.
ClusterName=rankscope
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd-%n
SlurmctldPidFile=$RUNDIR/slurmctld.pid
SlurmdPidFile=$RUNDIR/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
# No cgroups (containers, VMs without a delegated cgroup tree): track processes by parentage.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Start batch jobs at once instead of batching them for up to 3 s, and look at every pending job
# each second, not each minute (sched_interval, default 60 s; backfill every 30 s): a job whose
# dependency was just met (the merge job after the run) or whose reason changed is seen at once.
# A tiny cluster makes these passes cheap.
SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1
MpiDefault=none
$ACCOUNTING_LINES
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
# Time limits: a job is ended as soon as slurmctld notices it ran past --time (it checks every
# 30 s, so a 1-minute job ends after 60-90 s): no grace minutes (OverTimeLimit=0), and 5 s
# between SIGTERM and SIGKILL (KillWait=5, default 30) so tests of cancel/timeout stay short.
OverTimeLimit=0
KillWait=5
# Finished jobs stay visible to squeue/scontrol for 5 minutes; sacct keeps them for good.
MinJobAge=300
$OVERRIDES
$NODE_LINE
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

cat >"$DBD_CONF.new" <<EOF
# Written by rankscope slurm/slurm-up.sh (slurmdbd reads it from the folder of SLURM_CONF).
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUNDIR/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF

RUNNING=0
live_pid "$RUNDIR/slurmctld.pid" "slurmctld slurmctld-wlm" >/dev/null && RUNNING=1
live_pid "$RUNDIR/slurmdbd.pid" "slurmdbd" >/dev/null && RUNNING=1
for n in "${NAMES[@]}"; do
  live_pid "$RUNDIR/slurmd-$n.pid" "slurmd slurmd-wlm" >/dev/null && RUNNING=1
done
for f in "$CONF" "$DBD_CONF"; do
  if [ -f "$f" ] && cmp -s "$f" "$f.new"; then
    rm -f "$f.new"
  elif [ "$RUNNING" = 1 ] && [ -f "$f" ]; then
    rm -f "$f.new"
    fail "the cluster in $ROOT runs with another $(basename "$f"); stop it first: bash $(dirname "$0")/slurm-down.sh"
  else
    mv -f "$f.new" "$f"
  fi
done
chmod 600 "$DBD_CONF" # slurmdbd refuses a config others can read
printf 'export SLURM_CONF=%q\n' "$CONF" >"$ROOT/env.sh"

# ---- munged --------------------------------------------------------------------------------
if [ ! -s "$ETC/munge.key" ]; then
  mungekey --create --keyfile="$ETC/munge.key"
  chmod 600 "$ETC/munge.key"
fi
if ! live_pid "$RUNDIR/munged.pid" "munged" >/dev/null; then
  munged --key-file="$ETC/munge.key" --socket="$MUNGE_SOCKET" --pid-file="$RUNDIR/munged.pid" \
    --log-file="$LOGS/munged.log" --seed-file="$STATE/munged.seed" ||
    { show_logs; fail "munged did not start"; }
fi
munge_works() { munge -S "$MUNGE_SOCKET" -n </dev/null | unmunge -S "$MUNGE_SOCKET"; }
until_ok "$TIMEOUT" munged munge_works || { show_logs; fail "munged does not answer on $MUNGE_SOCKET"; }

# ---- accounting: mariadb, then slurmdbd ----------------------------------------------------
if [ "$ACCOUNTING" = 1 ]; then
  SQL=(mariadb --no-defaults --socket="$DB_SOCKET" --user=root)
  if ! live_pid "$RUNDIR/mariadbd.pid" "mariadbd mysqld" >/dev/null; then
    if [ ! -d "$STATE/mariadb/mysql" ]; then
      mariadb-install-db --no-defaults --user=root --datadir="$STATE/mariadb" \
        --auth-root-authentication-method=socket --skip-test-db >"$LOGS/mariadb-install.log" 2>&1 ||
        { tail -n 20 "$LOGS/mariadb-install.log" >&2; fail "mariadb-install-db failed"; }
    fi
    port_in_use "$DB_PORT" && fail "port $DB_PORT (mariadb) is taken; set RANKSCOPE_SLURM_PORT"
    setsid mariadbd --no-defaults --user=root --datadir="$STATE/mariadb" --socket="$DB_SOCKET" \
      --pid-file="$RUNDIR/mariadbd.pid" --port="$DB_PORT" --bind-address=127.0.0.1 \
      --skip-name-resolve --skip-log-bin --innodb-buffer-pool-size=64M \
      --log-error="$LOGS/mariadbd.log" </dev/null >/dev/null 2>&1 &
  fi
  until_ok "$TIMEOUT" mariadb "${SQL[@]}" -e 'SELECT 1' || { show_logs; fail "mariadbd did not start"; }
  "${SQL[@]}" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
                  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  if ! live_pid "$RUNDIR/slurmdbd.pid" "slurmdbd" >/dev/null; then
    port_in_use "$DBD_PORT" && fail "port $DBD_PORT (slurmdbd) is taken; set RANKSCOPE_SLURM_PORT"
    slurmdbd || { show_logs; fail "slurmdbd did not start"; }
  fi
  until_ok "$TIMEOUT" slurmdbd sacctmgr -n -P list cluster || { show_logs; fail "slurmdbd does not answer"; }
  if [ -z "$(sacctmgr -n -P list cluster format=cluster where cluster=rankscope)" ]; then
    sacctmgr -i add cluster rankscope >/dev/null
  fi
fi

# ---- slurmctld -----------------------------------------------------------------------------
if ! live_pid "$RUNDIR/slurmctld.pid" "slurmctld slurmctld-wlm" >/dev/null; then
  port_in_use "$CTLD_PORT" && fail "port $CTLD_PORT (slurmctld) is taken; set RANKSCOPE_SLURM_PORT"
  slurmctld || { show_logs; fail "slurmctld did not start"; }
fi
controller_up() { scontrol ping | grep -q 'is UP'; }
until_ok "$TIMEOUT" slurmctld controller_up || { show_logs; fail "slurmctld does not answer"; }

# ---- slurmd, one per node ------------------------------------------------------------------
# Jobs use the first node's name as the rendezvous address (torchrun, submitit), so n1, n2, ...
# must resolve inside jobs. Names that do not resolve get a private /etc/hosts, bind-mounted in
# a mount namespace that only the slurmds (and so their jobs) see: the machine's /etc/hosts is
# never edited.
WRAP=()
UNKNOWN=()
for n in "${NAMES[@]}"; do getent hosts "$n" >/dev/null || UNKNOWN+=("$n"); done
if [ ${#UNKNOWN[@]} -gt 0 ]; then
  { cat /etc/hosts; echo "127.0.0.1 ${UNKNOWN[*]} # rankscope slurm-up.sh"; } >"$ETC/hosts"
  if unshare --mount --propagation private true 2>/dev/null; then
    # shellcheck disable=SC2016 # $0 and $@ belong to the inner shell
    WRAP=(unshare --mount --propagation private sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$ETC/hosts")
  else
    say "WARNING: no mount namespace here; add '127.0.0.1 ${UNKNOWN[*]}' to /etc/hosts for jobs to resolve them"
  fi
fi
for i in "${!NAMES[@]}"; do
  n=${NAMES[$i]}
  live_pid "$RUNDIR/slurmd-$n.pid" "slurmd slurmd-wlm" >/dev/null && continue
  if [ "$NODES" = 1 ]; then p=$SLURMD_PORT; else p=$((PORT + 11 + i)); fi
  port_in_use "$p" && fail "port $p (slurmd $n) is taken; set RANKSCOPE_SLURM_PORT"
  "${WRAP[@]}" slurmd -N "$n" || { show_logs; fail "slurmd $n did not start"; }
done

# ---- wait for idle nodes -------------------------------------------------------------------
nodes_idle() {
  local states
  states=$(sinfo --noheader --Node --format='%T' 2>/dev/null) || return 1
  [ "$(grep -c . <<<"$states")" -ge "$NODES" ] || return 1
  ! grep -qvE '^(idle|mixed|allocated|completing)$' <<<"$states"
}
if ! until_ok 10 "nodes" nodes_idle; then
  # nodes left DOWN by an unclean stop come back once resumed
  scontrol update NodeName=ALL State=RESUME >/dev/null 2>&1 || true
  until_ok "$TIMEOUT" "nodes (resumed)" nodes_idle || { sinfo -N -l >&2; show_logs; fail "nodes are not idle"; }
fi
sinfo >&2
say "cluster up. In your shell: source $ROOT/env.sh   (or: export SLURM_CONF=$CONF)"
