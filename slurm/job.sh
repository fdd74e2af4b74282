#!/usr/bin/env bash
# The body of every template (slurm/*.sbatch exec it, so it is the batch shell): runs
# launch/fedmpi-launch "$@" and decides what a stop signal means for the job.
# - USR1 (the templates' --signal=B:USR1@90 before the time limit, or scancel --signal=USR1 --batch):
#   a preemption warning. The run checkpoints and exits 3, and the job requeues itself; its next
#   start finds the checkpoint and continues to the same results.
# - TERM (or INT, HUP) with no USR1 before it: a user's plain scancel. The run checkpoints and exits
#   3, the job ends CANCELLED; submitting the same command again continues it.
# - Exit 3 with no signal here (scancel -s USR1 reaches the ranks only): requeued as a preemption.
# (scontrol requeue and Slurm's own preemption send TERM and requeue the job themselves.)
# - Exit 5: a rank was lost (its process or its node died; the result file says which, and that the
#   last checkpoint is kept): requeued, and the next start resumes from that checkpoint, on the
#   nodes it then gets (--nodes=1-2 runs on one if the other is gone). First a probe step asks
#   every node of the job: if one does not answer, Slurm has not yet noticed that it is down, and a
#   job requeued now could be given it again, so the script waits until Slurm declares it down
#   and requeues the job itself (NODE_FAIL; at most SlurmdTimeout + 60 s, then it requeues anyway).
#   fedmpi exits 1 instead of 5 when the run was lost again before any newer checkpoint: a loss
#   that repeats is not requeued forever.
set -euo pipefail
warned="" cancelled="" step=""
forward() { if [[ -n "$step" ]]; then kill -USR1 "$step" 2>/dev/null || true; fi; }
trap 'warned=1; forward' USR1
trap '[[ -n "$warned" ]] || cancelled=1; forward' TERM INT HUP
mkdir -p runs
# fedmpi-launch returns rank 0's code even when srun reports a task it ended (--kill-on-bad-exit),
# through this file on the shared file system:
export FEDMPI_EXIT_FILE="$PWD/runs/.fedmpi-exit-${SLURM_JOB_ID}"
"${SLURM_SUBMIT_DIR:-$PWD}/launch/fedmpi-launch" "$@" &   # = srun --mpi=pmix --kill-on-bad-exit=1 python3 -m fedmpi ...
step=$!
[[ -z "$warned$cancelled" ]] || forward    # a signal came before the step had started
while true; do
  code=0; wait "$step" || code=$?
  kill -0 "$step" 2>/dev/null || break      # wait returned because of the trap: keep waiting
done
job="job $SLURM_JOB_ID${SLURM_ARRAY_JOB_ID:+ (array task ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID})}"
if [[ $code -eq 3 && -z "$cancelled" ]]; then
  echo "fedmpi interrupted and checkpointed; requeueing $job"
  scontrol requeue "$SLURM_JOB_ID" || echo "requeue refused; submit the same command again to continue"
elif [[ $code -eq 3 ]]; then
  echo "fedmpi stopped by scancel and checkpointed: $job; submit the same command again to continue"
elif [[ $code -eq 5 && -z "$cancelled" ]]; then
  echo "fedmpi lost a rank; asking every node of $job whether it answers"
  if ! timeout 60 srun --mpi=none --overlap --nodes="${SLURM_JOB_NUM_NODES:-1}" --ntasks-per-node=1 \
       --kill-on-bad-exit=1 true >/dev/null 2>&1; then
    wait_s=$(( $(scontrol show config | awk '$1 == "SlurmdTimeout" {print $3 + 0}') + 60 ))
    echo "fedmpi lost a rank and a node of $job does not answer: waiting for Slurm to declare it down" \
         "and requeue the job (at most $wait_s s)"
    sleep "$wait_s" & wait $! || true   # Slurm ends this script when it requeues the job
    [[ -z "$cancelled" ]] || exit $code
  fi
  echo "fedmpi lost a rank and kept its last checkpoint; requeueing $job"
  scontrol requeue "$SLURM_JOB_ID" || echo "requeue refused; submit the same command again to continue"
fi
exit $code
