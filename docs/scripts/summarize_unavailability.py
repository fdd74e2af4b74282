#!/usr/bin/env python3
"""Tables for docs/REPRODUCTION.md from the result files of reproduce_unavailability.sh.

    python docs/scripts/summarize_unavailability.py /tmp/repro

Per run: the mean of the last LAST (=5) evaluations of test_acc (with eval_every = 10 that is the last 50 rounds,
as in the paper's Table 2); for FedSWE also test_acc_server and the consensus_error at the final round.
Per algorithm: mean +/- std (population std, numpy default) over the seeds found.
"""
import glob
import os
import re
import sys
from collections import defaultdict

import h5py
import numpy as np

LAST = 5
ORDER = ["fedswe_k100", "fedswe_k0", "fedavg_active", "fedavg_all", "gfedavg", "fedau", "f3ast",
         "mifa", "fedvarp", "fedknown", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedprox", "scaffold"]
LABEL = {"fedswe_k100": "FedSWE (k = m = 100)", "fedswe_k0": "FedSWE k = 0 (FedAWE)"}


def load(path):
    with h5py.File(path, "r") as f:
        m = f["metrics"]
        status = f.attrs.get("status")
        status = status.decode() if isinstance(status, bytes) else str(status)
        d = {k: np.asarray(m[k][:], dtype=float) for k in m}
    return d, status


def stat(xs, scale=100.0, digits=2):
    xs = np.asarray(xs, dtype=float) * scale
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f}"
    return f"{xs.mean():.{digits}f} +/- {xs.std():.{digits}f}"


def table(folder):
    runs = defaultdict(dict)
    for p in sorted(glob.glob(os.path.join(folder, "*-s*.h5"))):
        name, seed = re.match(r"(.+)-s(\d+)\.h5$", os.path.basename(p)).groups()
        try:
            d, status = load(p)
        except OSError as e:  # still being written (locked) or unreadable
            print(f"<!-- skipped {p}: {e.__class__.__name__} -->")
            continue
        if status != "completed":
            print(f"<!-- skipped {p}: status {status} -->")
            continue
        runs[name][int(seed)] = d
    if not runs:
        return
    any_run = next(iter(next(iter(runs.values())).values()))
    r = any_run["round"]
    print(f"rounds {int(r[-1])}, evaluations at rounds {', '.join(str(int(x)) for x in r[-LAST:])} averaged\n")
    print("| algorithm | seeds | test_acc (%) | test_acc_server (%) | final consensus_error |")
    print("|---|---|---|---|---|")
    for name in ORDER + sorted(set(runs) - set(ORDER)):
        if name not in runs:
            continue
        seeds = sorted(runs[name])
        ds = [runs[name][s] for s in seeds]
        acc = [d["test_acc"][-LAST:].mean() for d in ds]
        srv = cons = "-"
        if name.startswith("fedswe") and "test_acc_server" in ds[0]:
            srv = stat([d["test_acc_server"][-LAST:].mean() for d in ds])
            cons = stat([d["consensus_error"][-1] for d in ds], scale=1.0, digits=4)
        print(f"| {LABEL.get(name, name)} | {','.join(map(str, seeds))} | {stat(acc)} | {srv} | {cons} |")
    print()


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else "/tmp/repro"
    for setting in ("periodic", "sine", "periodic400"):
        folder = os.path.join(root, setting)
        if os.path.isdir(folder):
            print(f"### {setting}\n")
            table(folder)
