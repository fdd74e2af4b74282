"""Asynchronous client updates per second on CPU (issue #33 item 8): FedBuff's tasks dispatched
from one model version trained together on the batched engine (what fedmpi does) against one
engine call per client (what a loop over arrivals would do), in one process, alternating.

    python benchmarks/async_batching.py [--steps 40] [--concurrency 50] [--buffer 10] [--model logreg|cnn]

Fashion-MNIST-shaped random images (benchmarks/common.py), 500 clients x 60 images, 5 local steps of
batch 10, lognormal device speeds (sigma 1). Both ways give the same bits (checked); the ratio is
client updates per second, batched over one at a time, each side's best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import image_task, machine  # noqa: E402

from fedmpi import config  # noqa: E402
from fedmpi.algorithms.fedbuff import FedBuff  # noqa: E402
from fedmpi.build import build_components  # noqa: E402
from fedmpi.runtime import World  # noqa: E402


class OneAtATime(FedBuff):
    """FedBuff whose tasks of a version are trained one engine call each (the same bits)."""

    def _train(self, t, work):
        rows = [super(OneAtATime, self)._train(t, [w]) for w in work]
        return torch.cat(rows) if rows else super()._train(t, [])


def run(cfg, task, steps: int, one: bool) -> tuple[float, int, torch.Tensor]:
    run_ = build_components(cfg, World(), task=task)
    algo = run_.algorithm
    if one:
        algo.__class__ = OneAtATime
    t0, n = time.perf_counter(), 0
    for t in range(steps):
        algo.round(t)
        n += int(algo.flight.events.take()["round"].size)
    return time.perf_counter() - t0, n, algo.x.clone()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--buffer", type=int, default=10)
    ap.add_argument("--model", default="logreg")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    m = 500
    cfg = config.from_dict({
        "seed": 0, "rounds": args.steps,
        "task": {"dataset": "synthetic", "clients": m, "model": args.model},
        "train": {"local_steps": 5, "batch_size": 10, "lr": 0.05},
        "algorithm": {"name": "fedbuff", "concurrency": args.concurrency, "buffer": args.buffer},
        "clock": {"kind": "lognormal", "step_time": 1.0, "comm_time": 5.0, "sigma": 1.0},
        "runtime": {"progress": False, "threads": args.threads}})
    task = image_task(args.model, (1, 28, 28), m, 60, torch.device("cpu"))
    print(f"# {machine()}; load {os.getloadavg()[0]:.1f}; {args.model}, M = {args.concurrency}, "
          f"K = {args.buffer}, {args.steps} server steps")
    best = {False: np.inf, True: np.inf}
    finals, counts = {}, {}
    for _ in range(args.repeat):
        for one in (False, True):
            wall, n, x = run(cfg, task, args.steps, one)
            best[one] = min(best[one], wall)
            finals[one], counts[one] = x, n
    assert torch.equal(finals[False], finals[True]), "batched and one-at-a-time runs differ"
    rate = {k: counts[k] / best[k] for k in best}
    print(f"batched by version: {rate[False]:.0f} updates/s; one at a time: {rate[True]:.0f} updates/s; "
          f"ratio {rate[False] / rate[True]:.2f} (same bits; {counts[False]} arrivals; load "
          f"{os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
