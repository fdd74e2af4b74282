"""Rounds/s of whole federated rounds on the quadratic task with many clients, one process.

    python benchmarks/rounds.py [--clients 10000 1000000] [--algorithms fedavg_active fedswe mifa]

Stationary availability with p = 0.01 (10^6 clients: about 10^4 active per round); every
round samples availability, trains the active clients (s = 1 exact gradient step), reduces
and updates the server, exactly as `fedmpi run` does (evaluation excluded).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine  # noqa: E402

from fedmpi import config  # noqa: E402
from fedmpi.build import build_components  # noqa: E402
from fedmpi.runtime import World  # noqa: E402


def rounds_per_s(algo_name: str, m: int, p: float, rounds: int) -> float:
    u = np.random.default_rng(0).normal(size=m).round(3).tolist()
    cfg = config.from_dict({"task": {"dataset": "quadratic", "model": "scalar", "clients": m, "u": u},
                            "train": {"local_steps": 1, "lr": 0.5, "batch_size": 1},
                            "algorithm": {"name": algo_name},
                            "availability": {"kind": "stationary", "base": {"kind": "fixed", "values": [p]}}})
    algo = build_components(cfg, World()).algorithm
    algo.round(0)  # warm-up
    t = time.perf_counter()
    for r in range(1, rounds + 1):
        algo.round(r)
    return rounds / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, nargs="+", default=[10_000, 1_000_000])
    ap.add_argument("--algorithms", nargs="+", default=["fedavg_active"])
    ap.add_argument("--p", type=float, default=0.01)
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args()
    print(f"# rounds benchmark on {machine()}, threads={torch.get_num_threads()}, stationary p={args.p}")
    print(f"{'algorithm':<15} {'clients':>9} {'rounds/s':>9}")
    for name in args.algorithms:
        for m in args.clients:
            print(f"{name:<15} {m:>9} {rounds_per_s(name, m, args.p, args.rounds):>9.1f}", flush=True)


if __name__ == "__main__":
    main()
