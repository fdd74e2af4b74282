"""ms per round of the anchor task (benchmarks/at1.py's config) in one process, one rank, for
comparing two source trees back to back (e.g. before/after a change to the round):

    python benchmarks/round_cost.py TREE_A TREE_B [--rounds 100] [--cycles 3]

Each cycle runs TREE_A then TREE_B in fresh subprocesses (PYTHONPATH=TREE), each timing every
``algorithm.round(t)`` of ``--rounds`` rounds after 5 warm-up rounds (no evaluation, no result
file; wall clock), and prints the fastest round and the 10th percentile with the machine load:
on a machine shared with other jobs the fast rounds are the ones that ran undisturbed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

CHILD = r"""
import sys, time, os
sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks"))
from at1 import anchor
from fedmpi import config, plugins
from fedmpi.build import build_components
from fedmpi.runtime import World
import torch
torch.set_num_threads(1)
plugins.load([])
rounds = int(sys.argv[2])
algo = build_components(config.from_dict(anchor(rounds + 5, "cpu")), World()).algorithm
for t in range(5):
    algo.round(t)
times = []
for t in range(5, rounds + 5):
    t0 = time.perf_counter()
    algo.round(t)
    times.append(time.perf_counter() - t0)
times.sort()
print(1000 * times[0], 1000 * times[len(times) // 10])
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs=2)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--cycles", type=int, default=3)
    args = ap.parse_args()
    got: dict[str, list[float]] = {t: [] for t in args.trees}
    for c in range(args.cycles):
        for tree in args.trees:
            env = dict(os.environ, PYTHONPATH=tree)
            load = os.getloadavg()[0]
            out = subprocess.run([sys.executable, "-c", CHILD, tree, str(args.rounds)], env=env, cwd=tree,
                                 capture_output=True, text=True, check=True).stdout
            fastest, p10 = (float(v) for v in out.split()[-2:])
            got[tree].append(p10)
            print(f"cycle {c} {tree}: fastest round {fastest:.2f} ms, 10th percentile {p10:.2f} ms "
                  f"(load {load:.1f})", flush=True)
    a, b = (statistics.median(got[t]) for t in args.trees)
    print(f"median of the 10th percentiles: {a:.2f} vs {b:.2f} ms/round ({100 * (b - a) / a:+.1f}%)")


if __name__ == "__main__":
    main()
