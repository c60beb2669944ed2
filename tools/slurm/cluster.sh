#!/usr/bin/env bash
# A single-host SLURM cluster (munge, slurmctld, two slurmd) from Debian/Ubuntu's slurm-wlm and munge:
#   tools/slurm/cluster.sh up|down|status [STATE_DIR]      (make slurm-up / make slurm-down)
# Everything it writes (slurm.conf, the munge key, spool, logs, pid files) is under STATE_DIR (default
# .slurm/ in the repository; gitignored); nothing under /etc. Clients find it through SLURM_CONF, which `up`
# prints. Ports: SLURM_CTLD_PORT (default 6817) and the two after it for the nodes, so a test's cluster can
# run beside a user's. Runs as root: slurmd starts each job's processes as the submitting user.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
action="${1:-}"
state="$(realpath -m "${2:-$here/../../.slurm}")"
ctld_port="${SLURM_CTLD_PORT:-6817}"
conf="$state/slurm.conf"
export SLURM_CONF="$conf" PATH="$PATH:/usr/sbin:/sbin"  # the daemons live in sbin

die() { echo "tools/slurm/cluster.sh: $*" >&2; exit 1; }

alive() { local pid; for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }

stop_pidfiles() {  # the daemons whose pids the files hold: SIGTERM to all at once (each takes seconds to go),
  local file pid pids=()  # then wait for them; SIGKILL to any left after 10 s
  for file in "$@"; do
    [[ -f "$file" ]] || continue
    pid="$(cat "$file")"
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$file"
  done
  for _ in $(seq 50); do alive "${pids[@]}" || return 0; sleep 0.2; done
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"; done
  return 0
}

up() {
  local missing=()
  for exe in munged mungekey slurmctld slurmd sinfo sbatch; do
    command -v "$exe" >/dev/null || missing+=("$exe")
  done
  (( ${#missing[@]} == 0 )) || die "${missing[*]} not found: install the packages first, as root:
  apt-get install slurm-wlm munge"
  [[ "$(id -u)" == 0 ]] || die "slurmd must run as root (it starts jobs as their user): run it with sudo"
  [[ -f "$state/slurmctld.pid" ]] && kill -0 "$(cat "$state/slurmctld.pid")" 2>/dev/null \
    && die "a cluster is already up in $state (tools/slurm/cluster.sh down first)"
  mkdir -p "$state"/{munge,ctld,spool/n1,spool/n2,log}
  chmod 755 "$state" "$state/munge"  # other users reach the socket; the key itself is 0600
  [[ -f "$state/munge/munge.key" ]] || mungekey --create --keyfile="$state/munge/munge.key"
  munged --force --key-file="$state/munge/munge.key" --socket="$state/munge/munge.socket" \
    --pid-file="$state/munge/munged.pid" --log-file="$state/log/munged.log" \
    --seed-file="$state/munge/munged.seed"
  local mem_mb
  mem_mb=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 / 2 ))  # half the host's per node
  sed -e "s|@STATE@|$state|g" -e "s|@HOST@|$(hostname -s)|g" -e "s|@CTLD_PORT@|$ctld_port|g" \
    -e "s|@NODE1_PORT@|$((ctld_port + 1))|g" -e "s|@NODE2_PORT@|$((ctld_port + 2))|g" \
    -e "s|@MEM_MB@|$mem_mb|g" "$here/slurm.conf.in" > "$conf"
  slurmctld -f "$conf" -i   # -i: a fresh state, no jobs of an earlier cluster in this folder
  for node in n1 n2; do slurmd -f "$conf" -N "$node"; done
  for _ in $(seq 60); do  # both nodes idle: the cluster takes jobs
    [[ "$(sinfo -h -o '%T' -N 2>/dev/null | sort -u)" == idle ]] && break
    sleep 0.5
  done
  [[ "$(sinfo -h -o '%T' -N 2>/dev/null | sort -u)" == idle ]] \
    || { sinfo -N >&2 || true; die "the nodes did not come up: see $state/log/"; }
  sinfo -N
  echo "SLURM cluster up; its clients read: export SLURM_CONF=$conf"
}

down() {
  [[ -d "$state" ]] || { echo "no cluster in $state"; return 0; }
  squeue -h -o %A 2>/dev/null | xargs -r scancel 2>/dev/null || true  # every user's jobs, ended with the cluster
  stop_pidfiles "$state"/slurmd-n{1,2}.pid "$state/slurmctld.pid"
  stop_pidfiles "$state/munge/munged.pid"  # last: the others authenticate through it to the end
  echo "SLURM cluster in $state stopped"
}

case "$action" in
  up) up ;;
  down) down ;;
  status) sinfo -N && squeue ;;
  *) die "usage: $0 up|down|status [STATE_DIR]" ;;
esac
