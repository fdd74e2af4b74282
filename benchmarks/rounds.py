"""Rounds/s of whole federated rounds on the quadratic task with many clients, one process.

    python benchmarks/rounds.py [--clients 10000 1000000] [--algorithms fedavg_active fedswe mifa]
                                [--repeat 3] [--profile rounds.prof]

Stationary availability with p = 0.01 (10^6 clients: about 10^4 active per round); every
round samples availability, trains the active clients (s = 1 exact gradient step), reduces
and updates the server, exactly as `fedmpi run` does (evaluation excluded). ``--repeat``
times the rounds several times on the same components (one line each: on a shared machine
report the range); ``--profile`` writes a cProfile of the timed rounds only (a profile of the
whole script is mostly the config set-up of 10^6 client optima).
"""

from __future__ import annotations

import argparse
import cProfile
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


def build(algo_name: str, m: int, p: float):
    """The algorithm of the benchmark's config, built as ``fedmpi run`` builds it (one process)."""
    u = np.random.default_rng(0).normal(size=m).round(3).tolist()
    cfg = config.from_dict({"task": {"dataset": "quadratic", "model": "scalar", "clients": m, "u": u},
                            "train": {"local_steps": 1, "lr": 0.5, "batch_size": 1},
                            "algorithm": {"name": algo_name},
                            "availability": {"kind": "stationary", "base": {"kind": "fixed", "values": [p]}}})
    algo = build_components(cfg, World()).algorithm
    algo.round(0)  # warm-up
    return algo


def rounds_per_s(algo, first: int, rounds: int, profile: cProfile.Profile | None = None) -> float:
    """Rounds/s of rounds first .. first + rounds - 1."""
    if profile is not None:
        profile.enable()
    t = time.perf_counter()
    for r in range(first, first + rounds):
        algo.round(r)
    elapsed = time.perf_counter() - t
    if profile is not None:
        profile.disable()
    return rounds / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, nargs="+", default=[10_000, 1_000_000])
    ap.add_argument("--algorithms", nargs="+", default=["fedavg_active"])
    ap.add_argument("--p", type=float, default=0.01)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=1, help="timings of --rounds rounds each (one line each)")
    ap.add_argument("--profile", metavar="FILE", help="cProfile of the timed rounds (pstats file)")
    args = ap.parse_args()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# rounds benchmark on {machine()}, threads={torch.get_num_threads()}, stationary p={args.p}, "
          f"load {load}")
    print(f"{'algorithm':<15} {'clients':>9} {'rounds/s':>9}")
    profile = cProfile.Profile() if args.profile else None
    for name in args.algorithms:
        for m in args.clients:
            algo = build(name, m, args.p)
            for rep in range(args.repeat):
                speed = rounds_per_s(algo, 1 + rep * args.rounds, args.rounds, profile)
                print(f"{name:<15} {m:>9} {speed:>9.1f}", flush=True)
    if profile is not None:
        profile.dump_stats(args.profile)
        print(f"# profile of the timed rounds: {args.profile} (python -m pstats {args.profile})")


if __name__ == "__main__":
    main()
