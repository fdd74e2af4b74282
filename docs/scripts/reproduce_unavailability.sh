#!/usr/bin/env bash
# Reproduce the "Client unavailability (FedSWE paper)" section of docs/REPRODUCTION.md:
# FMNIST-scaled versions of Sec. 7.1 (periodic groups) and Sec. 7.2 (sine), CPU, one thread per run.
#
#   bash docs/scripts/reproduce_unavailability.sh            # the sweeps, their tables and the figures
#   LONG=1 bash docs/scripts/reproduce_unavailability.sh     # also the 400-round periodic check (seed 0)
#
# The runs are the cells of configs/unavailability/fmnist_{periodic,sine,periodic400}.sweep.yaml, written
# to runs/fmnist_periodic/, runs/fmnist_sine/, runs/fmnist_periodic400/. Finished cells are skipped, so
# the script can be restarted. Environment: JOBS (runs at once, default 2), NICE (default 10), LONG.
set -euo pipefail
cd "$(dirname "$0")/../.."

JOBS=${JOBS:-2}
NICE=${NICE:-10}
LONG=${LONG:-0}
SW=configs/unavailability
sweeps=("$SW/fmnist_periodic.sweep.yaml" "$SW/fmnist_sine.sweep.yaml")
[ "$LONG" = 1 ] && sweeps+=("$SW/fmnist_periodic400.sweep.yaml")
mkdir -p docs/figures

for s in "${sweeps[@]}"; do
  time nice -n "$NICE" fedmpi sweep "$s" -j "$JOBS"
done
for s in "${sweeps[@]}"; do
  echo "### $s"; echo; fedmpi table "$s"; echo
done | tee runs/unavailability_tables.md

# Figures (one curve per algorithm: mean +/- std over the seeds).
P=runs/fmnist_periodic; S=runs/fmnist_sine; L=runs/fmnist_periodic400
fedmpi plot $P/{fedswe_k100,fedswe_k0,fedavg_active,mifa,fedknown}/seed=*.h5 --metric test_acc \
  --title "FMNIST periodic groups (P=40), test_acc" --out docs/figures/unavail_periodic_test_acc.png
fedmpi plot $P/{fedswe_k100,fedswe_k0}/seed=*.h5 --metric consensus_error \
  --title "FMNIST periodic groups: consensus error, FedSWE k=100 vs k=0" \
  --out docs/figures/unavail_periodic_consensus.png
fedmpi plot $S/{fedswe_k100,fedavg_active,mifa,fedknown,fedswe_k0}/seed=*.h5 --metric test_acc \
  --title "FMNIST sine (P=20, gamma=0.3), test_acc" --out docs/figures/unavail_sine_test_acc.png
if [ "$LONG" = 1 ]; then
  fedmpi plot $L/{fedswe_k100,fedswe_k0}/seed=0.h5 --metric consensus_error \
    --title "FMNIST periodic, 400 rounds, seed 0: consensus error" --out docs/figures/unavail_periodic400_consensus.png
  fedmpi plot $L/{fedswe_k100,fedswe_k0,fedavg_active,mifa}/seed=0.h5 --metric test_acc \
    --title "FMNIST periodic, 400 rounds, seed 0: test_acc" --out docs/figures/unavail_periodic400_test_acc.png
fi
