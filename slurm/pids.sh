# pids.sh - sourced by slurm-up.sh and slurm-down.sh: the PID-file check both rely on.

# live_pid PIDFILE "EXE..." -> print the PID if it is alive and runs one of the executables
# (a PID file left by a dead daemon may name a reused PID of an unrelated process)
live_pid() {
  local pid exe
  [ -s "$1" ] || return 1
  pid=$(tr -dc '0-9' <"$1")
  [ -n "$pid" ] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  case " $2 " in *" ${exe##*/} "*) echo "$pid" ;; *) return 1 ;; esac
}
