#!/usr/bin/env bash
# Reproduce the "Client unavailability (FedSWE paper)" section of docs/REPRODUCTION.md:
# FMNIST-scaled versions of Sec. 7.1 (periodic groups) and Sec. 7.2 (sine), single process, CPU.
#
#   bash docs/scripts/reproduce_unavailability.sh            # everything (runs, tables, figures)
#   FULL_SEEDS=1 bash docs/scripts/reproduce_unavailability.sh   # 3 seeds for every sine algorithm too
#
#   LONG=1 bash docs/scripts/reproduce_unavailability.sh        # also the 400-round periodic check (seed 0)
#
# Environment: OUT (results folder, default /tmp/repro), P_ROUNDS (periodic rounds, default 200),
# S_ROUNDS (sine rounds, default 200), THREADS (torch threads, default 1), NICE (default 10).
# Runs whose result file is already complete are skipped, so the script can be restarted.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-/tmp/repro}
P_ROUNDS=${P_ROUNDS:-200}
S_ROUNDS=${S_ROUNDS:-200}
THREADS=${THREADS:-1}
NICE=${NICE:-10}
FULL_SEEDS=${FULL_SEEDS:-0}
LONG=${LONG:-0}
PER=configs/unavailability/fmnist_periodic.yaml
SIN=configs/unavailability/fmnist_sine.yaml
mkdir -p "$OUT/periodic" "$OUT/sine" "$OUT/periodic400" docs/figures

COMMON="--set evaluation.train=false --set eval_every=10 --set runtime.threads=$THREADS --quiet"

# "name|overrides": learning rates as in the configs' header comments (0.1 FedSWE/FedAWE/fedknown, 0.05 others).
PERIODIC_ALGS=(
  "fedswe_k100|--set algorithm.name=fedswe --set algorithm.k=100 --set train.lr=0.1"
  "fedswe_k0|--set algorithm.name=fedswe --set algorithm.k=0 --set train.lr=0.1"
  "fedavg_active|--set algorithm.name=fedavg_active --set train.lr=0.05"
  "mifa|--set algorithm.name=mifa --set train.lr=0.05"
  "fedknown|--set algorithm.name=fedknown --set train.lr=0.1"
)
SINE_MAIN=(
  "fedswe_k100|--set algorithm.name=fedswe --set algorithm.k=100 --set train.lr=0.1"
  "fedavg_active|--set algorithm.name=fedavg_active --set train.lr=0.05"
  "mifa|--set algorithm.name=mifa --set train.lr=0.05"
  "fedknown|--set algorithm.name=fedknown --set train.lr=0.1"
)
SINE_REST=(
  "fedswe_k0|--set algorithm.name=fedswe --set algorithm.k=0 --set train.lr=0.1"
  "fedavg_all|--set algorithm.name=fedavg_all --set train.lr=0.05"
  "gfedavg|--set algorithm.name=gfedavg --set train.lr=0.05"
  "fedau|--set algorithm.name=fedau --set train.lr=0.05"
  "f3ast|--set algorithm.name=f3ast --set train.lr=0.05"
  "fedvarp|--set algorithm.name=fedvarp --set train.lr=0.05"
  # the standard baselines: server lr 1 with momentum 0.9 (FedAvgM), 0.03 for the adaptive server optimizers
  "fedavgm|--set algorithm.name=fedavgm --set train.lr=0.05 --set train.global_lr=1.0"
  "fedadam|--set algorithm.name=fedadam --set train.lr=0.05 --set train.global_lr=0.03"
  "fedyogi|--set algorithm.name=fedyogi --set train.lr=0.05 --set train.global_lr=0.03"
  "fedadagrad|--set algorithm.name=fedadagrad --set train.lr=0.05 --set train.global_lr=0.03"
  "fedprox|--set algorithm.name=fedprox --set train.lr=0.05"
  "scaffold|--set algorithm.name=scaffold --set train.lr=0.05"
)
REST_SEEDS="0"; [ "$FULL_SEEDS" = 1 ] && REST_SEEDS="0 1 2"

jobs() {  # one `fedmpi` argument line per run, in priority order
  for seed in 0 1 2; do for a in "${PERIODIC_ALGS[@]}"; do
    echo "run $PER ${a#*|} --set seed=$seed --set rounds=$P_ROUNDS $COMMON --out $OUT/periodic/${a%%|*}-s$seed.h5"
  done; done
  for a in "${SINE_MAIN[@]}" "${SINE_REST[@]}"; do
    echo "run $SIN ${a#*|} --set seed=0 --set rounds=$S_ROUNDS $COMMON --out $OUT/sine/${a%%|*}-s0.h5"
  done
  for seed in 1 2; do for a in "${SINE_MAIN[@]}"; do
    echo "run $SIN ${a#*|} --set seed=$seed --set rounds=$S_ROUNDS $COMMON --out $OUT/sine/${a%%|*}-s$seed.h5"
  done; done
  if [ "$FULL_SEEDS" = 1 ]; then for seed in 1 2; do for a in "${SINE_REST[@]}"; do
    echo "run $SIN ${a#*|} --set seed=$seed --set rounds=$S_ROUNDS $COMMON --out $OUT/sine/${a%%|*}-s$seed.h5"
  done; done; fi
  if [ "$LONG" = 1 ]; then for a in "${PERIODIC_ALGS[@]:0:4}"; do  # the config's own length, 400 rounds
    echo "run $PER ${a#*|} --set seed=0 --set rounds=400 $COMMON --out $OUT/periodic400/${a%%|*}-s0.h5"
  done; fi
}

# All runs in one Python process (each line is exactly `fedmpi <line>`; see fedmpi_batch.py).
jobs > "$OUT/jobs.txt"
time nice -n "$NICE" python docs/scripts/fedmpi_batch.py < "$OUT/jobs.txt" | tee -a "$OUT/batch.log"

# Tables (markdown) of the last-5-evaluation mean test accuracy, mean +/- std over seeds.
python docs/scripts/summarize_unavailability.py "$OUT" | tee "$OUT/tables.md"

# Figures.
P=$OUT/periodic; S=$OUT/sine
fedmpi plot $P/fedswe_k100-s{0,1,2}.h5 $P/fedswe_k0-s{0,1,2}.h5 $P/fedavg_active-s{0,1,2}.h5 \
  $P/mifa-s{0,1,2}.h5 $P/fedknown-s{0,1,2}.h5 --metric test_acc \
  --title "FMNIST periodic groups (P=40), test_acc" --out docs/figures/unavail_periodic_test_acc.png
fedmpi plot $P/fedswe_k100-s{0,1,2}.h5 $P/fedswe_k0-s{0,1,2}.h5 --metric consensus_error \
  --title "FMNIST periodic groups: consensus error, FedSWE k=100 vs k=0" \
  --out docs/figures/unavail_periodic_consensus.png
if [ "$LONG" = 1 ]; then
  fedmpi plot $OUT/periodic400/fedswe_k100-s0.h5 $OUT/periodic400/fedswe_k0-s0.h5 --metric consensus_error \
    --title "FMNIST periodic, 400 rounds, seed 0: consensus error" --out docs/figures/unavail_periodic400_consensus.png
  fedmpi plot $OUT/periodic400/fedswe_k100-s0.h5 $OUT/periodic400/fedswe_k0-s0.h5 $OUT/periodic400/fedavg_active-s0.h5 $OUT/periodic400/mifa-s0.h5 --metric test_acc \
    --title "FMNIST periodic, 400 rounds, seed 0: test_acc" --out docs/figures/unavail_periodic400_test_acc.png
fi
fedmpi plot $S/fedswe_k100-s{0,1,2}.h5 $S/fedavg_active-s{0,1,2}.h5 $S/mifa-s{0,1,2}.h5 \
  $S/fedknown-s{0,1,2}.h5 $S/fedswe_k0-s*.h5 --metric test_acc \
  --title "FMNIST sine (P=20, gamma=0.3), test_acc" --out docs/figures/unavail_sine_test_acc.png
