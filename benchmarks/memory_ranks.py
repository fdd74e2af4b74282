"""Memory per rank of the O(m d) algorithms (MIFA, FedVARP, SCAFFOLD): 1 rank against 2.

    python benchmarks/memory_ranks.py [--clients 20000] [--algorithms mifa fedvarp scaffold]

Each algorithm keeps one model-sized row per client (MIFA's and FedVARP's last updates,
SCAFFOLD's client controls), sharded over the ranks (``ClientTable``): a rank holds the rows of
its own clients only, so the table's share of a rank's memory should halve on 2 ranks. The task
is logistic regression on synthetic 784-feature data (d = 7,850, Fashion-MNIST's shape), m
clients with 2 samples each, 2 rounds; every run is the real CLI, and its peak RSS is the
result file's ``peak_rss_mb`` (the largest over the ranks). The same run with ``fedavg_active``
(no per-client rows) is the baseline each process pays anyway; what is left is the table.
Memory is a count, not a time: the machine's load does not change these numbers.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import h5py
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine, mpiexec  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIM = 784 * 10 + 10


def peak_rss(folder: str, algorithm: str, m: int, ranks: int) -> float:
    """The peak RSS (MB, largest rank) of a 2-round run of ``algorithm`` on ``ranks`` ranks."""
    out = os.path.join(folder, f"{algorithm}-{ranks}.h5")
    cfg = {"name": "mem", "seed": 0, "rounds": 2, "eval_every": 2, "output": out,
           "task": {"dataset": "synthetic", "clients": m, "model": "logreg", "partition": {"kind": "iid"},
                    "synthetic": {"samples": 2 * m, "test_samples": 200, "features": 784, "classes": 10}},
           "train": {"local_steps": 1, "batch_size": 2, "lr": 0.1},
           "algorithm": {"name": algorithm},
           "availability": {"kind": "stationary", "base": {"kind": "fixed", "values": [0.1]}},
           "evaluation": {"train": False}, "runtime": {"progress": False, "threads": 1}}
    path = os.path.join(folder, f"{algorithm}-{ranks}.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(cfg, fh)
    cmd = (mpiexec(ranks) if ranks > 1 else []) + [sys.executable, "-m", "fedmpi", "run", path, "--quiet"]
    subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=ROOT), cwd=folder)
    with h5py.File(out, "r") as f:
        return float(f["metrics/peak_rss_mb"][-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=20000)
    ap.add_argument("--algorithms", nargs="+", default=["mifa", "fedvarp", "scaffold"])
    args = ap.parse_args()
    m = args.clients
    print(f"{machine()}; m = {m} clients, d = {DIM}: one m x d float32 table = {m * DIM * 4 / 2**20:.0f} MB")
    print(f"{'algorithm':<14}{'1 rank MB':>11}{'2 ranks MB/rank':>17}{'table 1 rank':>14}{'table/rank 2':>14}"
          f"{'ratio':>7}")
    with tempfile.TemporaryDirectory() as folder:
        base = {r: peak_rss(folder, "fedavg_active", m, r) for r in (1, 2)}
        print(f"{'fedavg_active':<14}{base[1]:>11.0f}{base[2]:>17.0f}{'(baseline)':>14}")
        for algo in args.algorithms:
            rss = {r: peak_rss(folder, algo, m, r) for r in (1, 2)}
            t1, t2 = rss[1] - base[1], rss[2] - base[2]
            ratio = t2 / t1 if t1 > 0 else float("nan")
            print(f"{algo:<14}{rss[1]:>11.0f}{rss[2]:>17.0f}{t1:>14.0f}{t2:>14.0f}{ratio:>7.2f}")


if __name__ == "__main__":
    main()
