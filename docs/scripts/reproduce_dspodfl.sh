#!/usr/bin/env bash
# Reproduce the "Decentralized sporadic FL (DSpodFL paper)" section of docs/REPRODUCTION.md:
# FMNIST non-IID (configs/dspodfl/fmnist_svm.yaml: m = 10, rgg radius 0.4, Beta(0.5, 0.5),
# linear SVM, 1 class per client, lr 0.01, batch 16, stop at emulated delay 500), the five
# methods x 3 seeds, CPU. Then a table (stdout and $OUT/table.md) and figures.
#
#   bash docs/scripts/reproduce_dspodfl.sh
#
# The runs are the cells of configs/dspodfl/fmnist_svm.sweep.yaml (each method's eval_every keeps every
# run evaluated about every 10 delay units or more often; it does not change the trajectory:
# indicators and minibatches come from counter-based streams, so final parameters are bitwise
# identical for any eval_every). Finished cells are skipped (restartable).
# Environment: OUT (results folder, default runs/dspodfl_fmnist), JOBS (runs at once, default 2),
# NICE (default 10). `fedmpi table configs/dspodfl/fmnist_svm.sweep.yaml` gives the accuracy columns alone.
set -euo pipefail
cd "$(dirname "$0")/../.."

SWEEP=configs/dspodfl/fmnist_svm.sweep.yaml
OUT=${OUT:-runs/dspodfl_fmnist}
JOBS=${JOBS:-2}
NICE=${NICE:-10}
MAX_DELAY=500
SEEDS="0 1 2"
mkdir -p docs/figures
nice -n "$NICE" fedmpi sweep "$SWEEP" --out "$OUT" -j "$JOBS"

# Figures: accuracy of the clients' own models (test_acc, the paper's metric) and of the averaged model.
files=()
for a in dspodfl dgd rg sporadic_sgd dfedavg; do for seed in $SEEDS; do files+=("$OUT/$a/seed=$seed.h5"); done; done
fedmpi plot "${files[@]}" --metric test_acc --x sim_delay --out docs/figures/dspodfl_fmnist_acc_delay.png \
  --title "FMNIST non-IID, linear SVM, m=10: mean client accuracy"
fedmpi plot "${files[@]}" --metric test_acc_avg_model --x sim_delay --out docs/figures/dspodfl_fmnist_avgacc_delay.png \
  --title "FMNIST non-IID, linear SVM, m=10: averaged-model accuracy"

# Table.
OUT="$OUT" MAX_DELAY="$MAX_DELAY" SEEDS="$SEEDS" python - <<'EOF' | tee "$OUT/table.md"
import os
import h5py
import numpy as np

out, T = os.environ["OUT"], float(os.environ["MAX_DELAY"])
seeds = [int(s) for s in os.environ["SEEDS"].split()]
methods = ["dspodfl", "dgd", "rg", "sporadic_sgd", "dfedavg"]
grid = np.linspace(0.0, T, 1001)


def load(a, s):
    with h5py.File(f"{out}/{a}/seed={s}.h5", "r") as f:
        m = f["metrics"]
        return (m["sim_delay"][:], m["test_acc"][:], m["test_acc_avg_model"][:], m["round"][:],
                int(f.attrs["rounds_done"]))


def at(x, y, t):
    """Step function: the value of the model in force at delay t (last evaluation at delay <= t)."""
    return y[np.searchsorted(x, t, side="right") - 1]


def first(x, y, thr):
    """Delay of the first evaluation with y >= thr (None if never within the run)."""
    hit = np.flatnonzero(y >= thr)
    return None if hit.size == 0 else float(x[hit[0]])


def fmt(v, sd=None):
    return "—" if v is None else (f"{v:.3f}" if sd is None else f"{v:.3f} ± {sd:.3f}")


def fdel(vals):
    got = [v for v in vals if v is not None]
    if not got:
        return f"not reached by {T:.0f}"
    txt = f"{np.mean(got):.0f} ± {np.std(got):.0f}" if len(got) == len(vals) else \
        f"{len(got)}/{len(vals)} seeds: " + ", ".join(f"{v:.0f}" for v in got)
    return txt


print(f"Final accuracy at delay {T:.0f} (mean ± std over seeds {seeds}, step value of the last evaluation at "
      f"delay <= {T:.0f}); delay to reach 40% / 60% mean client accuracy (a) per seed, mean ± std over the seeds "
      f"that reached it, (b) on the seed-mean curve (step functions on a common grid of {len(grid)} points).\n")
print("| method | iterations (per seed) | test_acc at 500 | avg-model acc at 500 | delay to 40% (per seed) "
      "| delay to 40% (seed-mean curve) | delay to 60% (per seed) | delay to 60% (seed-mean curve) |")
print("|---|---|---|---|---|---|---|---|")
for a in methods:
    runs = [load(a, s) for s in seeds]
    fin = np.array([at(x, y, T) for x, y, *_ in runs])
    fin_avg = np.array([at(x, z, T) for x, _, z, *_ in runs])
    curve = np.mean([[at(x, y, t) for t in grid] for x, y, *_ in runs], axis=0)
    row = [a, ", ".join(str(r[4]) for r in runs), fmt(fin.mean(), fin.std()), fmt(fin_avg.mean(), fin_avg.std())]
    for thr in (0.4, 0.6):
        row.append(fdel([first(x, y, thr) for x, y, *_ in runs]))
        c = first(grid, curve, thr)
        row.append(f"not reached by {T:.0f}" if c is None else f"{c:.0f}")
    print("| " + " | ".join(row) + " |")

print("\nPer seed: test_acc at delay 100 / 250 / 500")
print("| method | " + " | ".join(f"seed {s}" for s in seeds) + " |")
print("|---|" + "---|" * len(seeds))
for a in methods:
    cells = []
    for s in seeds:
        x, y, *_ = load(a, s)
        cells.append(" / ".join(f"{at(x, y, t):.3f}" for t in (100, 250, T)))
    print(f"| {a} | " + " | ".join(cells) + " |")
EOF
