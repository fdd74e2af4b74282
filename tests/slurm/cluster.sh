#!/usr/bin/env bash
# A one-node Slurm on this machine for the tests (tests/test_slurm_cluster.py):
#   tests/slurm/cluster.sh up     # install what is missing (Debian, as root), start munged, slurmctld, slurmd
#   tests/slurm/cluster.sh down   # stop what up started (the scratch folder stays, with the logs)
#   tests/slurm/cluster.sh env    # print the export line that points Slurm's commands at it
# As root, without systemd. Configuration, state, spool and logs live in $FEDMPI_SLURM_DIR
# (default /tmp/fedmpi-slurm); the commands find it through SLURM_CONF, so a system's own
# /etc/slurm is never touched. Settings fedmpi needs: MpiDefault=pmix (Open MPI's ranks meet
# through PMIx) and JobRequeue=1; the rest keeps one node simple (no cgroups, no accounting).
set -euo pipefail
DIR=${FEDMPI_SLURM_DIR:-/tmp/fedmpi-slurm}
CONF=$DIR/etc/slurm.conf
PACKAGES=(slurmctld slurmd slurm-client munge libpmix2)
PMIX_LIB=/usr/lib/x86_64-linux-gnu/pmix2/lib

say() { echo "cluster.sh: $*" >&2; }
fail() { say "$*"; exit 1; }

install_missing() {
  local missing=()
  for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [[ ${#missing[@]} -gt 0 ]]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # Slurm's PMIx plugin loads the unversioned library, which only the -dev package would provide
  [[ -e $PMIX_LIB/libpmix.so ]] || ln -s libpmix.so.2 "$PMIX_LIB/libpmix.so"
  [[ -s /etc/munge/munge.key ]] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; }
  chown munge: /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
}

write_config() {
  local host cpus mem
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))
  mkdir -p "$DIR"/etc "$DIR"/state "$DIR"/spool
  cat > "$CONF" <<CONF
ClusterName=fedmpi-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
JobRequeue=1
ReturnToService=2
KillWait=15
MinJobAge=3600
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  # the PyPI Open MPI prints a help box per rank unless PMIx's security module is native
  echo "PMIxEnv=PMIX_MCA_psec=native" > "$DIR/etc/mpi.conf"
  [[ -e $DIR/etc/plugstack.conf ]] || : > "$DIR/etc/plugstack.conf"
}

running() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

up() {
  [[ $(id -u) -eq 0 ]] || fail "needs root (it starts munged, slurmctld and slurmd)"
  export SLURM_CONF=$CONF
  if running "$DIR/slurmctld.pid" && running "$DIR/slurmd.pid" && scontrol ping >/dev/null 2>&1; then
    say "already up ($CONF)"; return
  fi
  install_missing
  write_config
  mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge: /run/munge /var/log/munge /var/lib/munge
  if ! [[ -S /run/munge/munge.socket.2 ]] || ! munge -n >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged || fail "munged did not start"
    touch "$DIR/munged.ours"  # stopped by down (a munged that was running already is left alone)
  fi
  running "$DIR/slurmctld.pid" || slurmctld -f "$CONF" || fail "slurmctld did not start: $DIR/slurmctld.log"
  running "$DIR/slurmd.pid" || slurmd -f "$CONF" || fail "slurmd did not start: $DIR/slurmd.log"
  for _ in $(seq 60); do
    if sinfo -h -o %T 2>/dev/null | grep -qx "idle\|mixed\|allocated"; then say "up ($CONF)"; return; fi
    sleep 0.5
  done
  fail "the node did not become idle; see $DIR/slurmctld.log and $DIR/slurmd.log"
}

down() {
  export SLURM_CONF=$CONF
  [[ -e $CONF ]] && scancel --full --quiet --state=RUNNING -u root 2>/dev/null || true
  for d in slurmd slurmctld; do
    if running "$DIR/$d.pid"; then
      local pid; pid=$(cat "$DIR/$d.pid"); kill "$pid"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
  done
  if [[ -e $DIR/munged.ours ]] && running /run/munge/munged.pid; then kill "$(cat /run/munge/munged.pid)"; fi
  rm -f "$DIR/munged.ours"
  say "down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) fail "usage: tests/slurm/cluster.sh up|down|env" ;;
esac
