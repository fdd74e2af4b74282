#!/usr/bin/env bash
# A two-node Slurm on this machine for the tests (tests/test_slurm_cluster.py, tests/test_slurm_nodes.py):
#   tests/slurm/cluster.sh up        # install what is missing (Debian, as root), start munged, slurmctld and
#                                    # one slurmd per node (n1, n2)
#   tests/slurm/cluster.sh down      # stop what up started (the scratch folder stays, with the logs)
#   tests/slurm/cluster.sh env       # print the export line that points Slurm's commands at it
#   tests/slurm/cluster.sh crash N   # node N dies: its slurmd, its slurmstepds and their tasks get SIGKILL
#   tests/slurm/cluster.sh freeze N  # node N goes silent, as a crashed machine does (SIGSTOP to the same)
#   tests/slurm/cluster.sh revive N  # node N reboots: what is left of it is killed, its slurmd started
#                                    # again (drained until the controller has sent what it kept for
#                                    # the dead node), and the node is usable once this returns
# As root, without systemd. Configuration, state, spool and logs live in $FEDMPI_SLURM_DIR
# (default /tmp/fedmpi-slurm); the commands find it through SLURM_CONF, so a system's own
# /etc/slurm is never touched. Settings fedmpi needs: MpiDefault=pmix (Open MPI's ranks meet
# through PMIx) and JobRequeue=1; the rest keeps the cluster simple (no cgroups, no accounting).
# Two nodes on one machine: each slurmd (slurmd -N NODE) has its own port, spool folder, pid
# file, log and TmpFS (PMIx makes its spmix_appdir_<uid>_<step> folder in the node's TmpFS, and
# two nodes' steps collide in one); SlurmdTimeout=10 makes a silent node DOWN within seconds.
# A TaskProlog gives every task a node-local TMPDIR ($DIR/tmp-NODE/job-JOBID, removed by the
# Epilog), as many clusters do: the folder that one node sees and the other does not.
set -euo pipefail
DIR=${FEDMPI_SLURM_DIR:-/tmp/fedmpi-slurm}
CONF=$DIR/etc/slurm.conf
PACKAGES=(slurmctld slurmd slurm-client munge libpmix2)
PMIX_LIB=/usr/lib/x86_64-linux-gnu/pmix2/lib
NODES=(n1 n2)
PORT=${FEDMPI_SLURM_PORT:-6817}  # slurmctld's; n1 and n2 listen on the next two (another cluster: another base)
PORTS=($((PORT + 1)) $((PORT + 2)))

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
  mem=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) / 1024 * 3 / 8 ))  # per node
  mkdir -p "$DIR"/etc "$DIR"/state
  for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/$n" "$DIR/tmp-$n"; done
  # stdout "export NAME=VALUE" lines set the task's environment: a node-local TMPDIR per job. Stop
  # signals are ignored at once: a signal sent to a job in its first moments must reach the job.
  cat > "$DIR/etc/task_prolog.sh" <<PROLOG
#!/bin/sh
trap '' USR1 TERM INT HUP
mkdir -p "$DIR/tmp-\$SLURMD_NODENAME/job-\$SLURM_JOB_ID" && echo "export TMPDIR=$DIR/tmp-\$SLURMD_NODENAME/job-\$SLURM_JOB_ID"
PROLOG
  cat > "$DIR/etc/epilog.sh" <<EPILOG
#!/bin/sh
rm -rf "$DIR/tmp-\$SLURMD_NODENAME/job-\$SLURM_JOB_ID"
EPILOG
  chmod +x "$DIR/etc/task_prolog.sh" "$DIR/etc/epilog.sh"
  cat > "$CONF" <<CONF
ClusterName=fedmpi-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
TmpFS=$DIR/tmp-%n
TaskProlog=$DIR/etc/task_prolog.sh
Epilog=$DIR/etc/epilog.sh
SlurmdTimeout=10
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
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=${PORTS[0]} CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=${PORTS[1]} CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  # the PyPI Open MPI prints a help box per rank unless PMIx's security module is native
  echo "PMIxEnv=PMIX_MCA_psec=native" > "$DIR/etc/mpi.conf"
  [[ -e $DIR/etc/plugstack.conf ]] || : > "$DIR/etc/plugstack.conf"
}

running() {  # the pid in file $1 is a live process (a killed one may stay a zombie a while here)
  [[ -s $1 ]] || return 1
  local pid; pid=$(cat "$1")
  kill -0 "$pid" 2>/dev/null && [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]]
}

node_state() { sinfo -h -n "$1" -o %T 2>/dev/null | head -n1; }

wait_usable() {  # wait until every node named is idle (or running jobs)
  for _ in $(seq 120); do
    local ok=1
    for n in "$@"; do node_state "$n" | grep -qx "idle\|mixed\|allocated\|completing" || ok=""; done
    [[ -z $ok ]] || return 0
    sleep 0.5
  done
  return 1
}

start_slurmd() {
  running "$DIR/slurmd-$1.pid" || slurmd -f "$CONF" -N "$1" || fail "slurmd -N $1 did not start: $DIR/slurmd-$1.log"
}

up() {
  [[ $(id -u) -eq 0 ]] || fail "needs root (it starts munged, slurmctld and slurmd)"
  export SLURM_CONF=$CONF
  if running "$DIR/slurmctld.pid" && running "$DIR/slurmd-n1.pid" && running "$DIR/slurmd-n2.pid" \
     && scontrol ping >/dev/null 2>&1; then
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
  for n in "${NODES[@]}"; do start_slurmd "$n"; done
  for n in "${NODES[@]}"; do  # a node left DOWN by a crash of an earlier session's tests
    if node_state "$n" | grep -q "down\|drain"; then scontrol update NodeName="$n" State=RESUME 2>/dev/null || true; fi
  done
  wait_usable "${NODES[@]}" && { say "up ($CONF)"; return; }
  fail "the nodes did not become idle; see $DIR/slurmctld.log and $DIR/slurmd-n*.log"
}

node_pids() {  # node N's daemons and what runs on it: its slurmd, its slurmstepds (they have the node's
  local n=$1 pid  # log open) and their children (the tasks)
  [[ -s "$DIR/slurmd-$n.pid" ]] && kill -0 "$(cat "$DIR/slurmd-$n.pid")" 2>/dev/null && cat "$DIR/slurmd-$n.pid"
  for pid in $(pgrep -x slurmstepd); do
    if [[ "$(readlink -f /proc/"$pid"/fd/* 2>/dev/null)" == *"$DIR/slurmd-$n.log"* ]]; then
      echo "$pid"; pgrep -P "$pid" || true
    fi
  done
}

# A crashed machine, two ways. crash: everything on the node gets SIGKILL at once (this machine's
# kernel, which lives on, then resets the tasks' TCP connections, as after an OOM kill). freeze:
# everything on it stops (SIGSTOP) and says nothing more, not even a reset: what the other
# nodes see of a real crash, a kernel panic or a cut cable. revive ends what is left of it.
stop_node() {
  local pids
  pids=$(node_pids "$2" | tr '\n' ' ')
  [[ -n "$pids" ]] || fail "$1: nothing runs on node $2"
  kill "-$3" $pids 2>/dev/null || true
  say "$1 $2 (pids $pids)"
}

node_flags() { scontrol show node -o "$1" 2>/dev/null | grep -o 'State=[^ ]*' | cut -d= -f2; }  # e.g. IDLE+DRAIN

pending_rpcs() {  # the controller's queued messages (sdiag's "Pending RPCs") that name node $1, one a line
  local line type hosts
  sdiag 2>/dev/null | sed -n '/^Pending RPCs$/,/^$/p' | while read -r line; do
    [[ $line =~ ^[0-9]+:\ +([A-Z_]+)\ +(.+)$ ]] || continue
    type=${BASH_REMATCH[1]} hosts=${BASH_REMATCH[2]}
    if scontrol show hostnames "$hosts" 2>/dev/null | grep -qx "$1"; then echo "$type $hosts"; fi
  done
}

wait_for() {  # wait_for SECONDS COMMAND...: until COMMAND succeeds (polled every half second)
  local end=$(( SECONDS + $1 )); shift
  until "$@"; do (( SECONDS < end )) || return 1; sleep 0.5; done
}

responding() { local f; f=$(node_flags "$1"); [[ -n $f && $f != *DOWN* && $f != *NOT_RESPONDING* ]]; }
registered_since() {  # node $1's slurmd registered at or after epoch second $2, and responds
  local t; t=$(scontrol show node -o "$1" 2>/dev/null | grep -o 'SlurmdStartTime=[^ ]*' | cut -d= -f2)
  [[ -n $t ]] && (( $(date -d "$t" +%s 2>/dev/null || echo 0) >= $2 )) && responding "$1"
}
settled() { [[ -z "$(pending_rpcs "$1")" ]]; }

# A node that comes back from a crash must not be given a job before the controller is done with
# its previous life. The controller keeps the messages that the dead node did not take (the
# SIGKILL that srun asked for when the step lost its rank, the end of the job) and sends them again
# every 60 s (Slurm's RPC_RETRY_INTERVAL) until the node answers. A requeued job keeps its id and
# numbers its steps from 0 again, so a kill for step J.0 of the lost run, delivered after the job
# restarted on the revived node, kills the rerun's step J.0 there (seen: "srun: error: n2: task 1:
# Killed" 71 s after the loss, just as the rerun ended; slurmctld.log "Queue RPC msg_type=6004"
# [REQUEST_SIGNAL_TASKS] for n2). So the node boots drained, takes what the controller had left
# for it (the kills find no such step), and only then is resumed, responding.
revive() {  # as after a reboot: what the node's steps left (PMIx sockets, step files, tmp) is gone
  export SLURM_CONF=$CONF
  local n=$1 pids started
  scontrol update NodeName="$n" State=DRAIN Reason="cluster.sh revive: rebooting" \
    || fail "node $n: cannot drain it for its reboot"
  pids=$(node_pids "$n" | tr '\n' ' ')
  if [[ -n "$pids" ]]; then kill -KILL $pids 2>/dev/null || true; sleep 0.5; fi
  rm -rf "$DIR/spool/$n"/stepd.* "$DIR/spool/$n/$n"_* "$DIR/spool/$n"/pmix.* "$DIR/tmp-$n"/*
  started=$(( $(date +%s) - 1 ))  # (SlurmdStartTime has whole seconds)
  start_slurmd "$n"
  wait_for 60 registered_since "$n" "$started" || fail "node $n did not register after its reboot ($(node_flags "$n")); see $DIR/slurmd-$n.log"
  wait_for 150 settled "$n" \
    || fail "the controller still has messages for node $n: $(pending_rpcs "$n" | tr '\n' ';'); see $DIR/slurmctld.log"
  responding "$n" || fail "node $n stopped responding after its reboot ($(node_flags "$n")); see $DIR/slurmd-$n.log"
  scontrol update NodeName="$n" State=RESUME || fail "node $n: cannot resume it"
  wait_usable "$n" || fail "node $n did not come back ($(node_flags "$n")); see $DIR/slurmd-$n.log"
  say "revived $n"
}

down() {
  export SLURM_CONF=$CONF
  [[ -e $CONF ]] && scancel --full --quiet -u root 2>/dev/null || true
  local pids=()
  for d in slurmd-n1 slurmd-n2 slurmd slurmctld; do
    if running "$DIR/$d.pid"; then pids+=("$(cat "$DIR/$d.pid")"); fi
  done
  if [[ ${#pids[@]} -gt 0 ]]; then
    kill "${pids[@]}" 2>/dev/null || true
    for pid in "${pids[@]}"; do
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    done
  fi
  if [[ -e $DIR/munged.ours ]] && running /run/munge/munged.pid; then kill "$(cat /run/munge/munged.pid)"; fi
  rm -f "$DIR/munged.ours"
  say "down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  crash|freeze|revive)
    [[ " ${NODES[*]} " == *" ${2:-} "* ]] || fail "$1: name a node (${NODES[*]})"
    case $1 in crash) stop_node crashed "$2" KILL ;; freeze) stop_node froze "$2" STOP ;; revive) revive "$2" ;; esac ;;
  *) fail "usage: tests/slurm/cluster.sh up|down|env|crash NODE|freeze NODE|revive NODE" ;;
esac
