"""FedSWE's client-model memory: deduplicated versions vs the naive m x d table.

    python benchmarks/fedswe_memory.py [--clients 10000] [--rounds 300] [--dim 273706]

Every FedSWE client holds a model, but an inactive client's model is always a past global
model, so fedmpi stores each distinct version once (``VersionStore``). The model has the
SVHN CNN's parameter count (a linear model of that size on 256 shared random samples, so that
the run is cheap on a CPU); availability is stationary with p_i ~ U(0.01, 0.2) as in the issue.
Prints the live versions, the store's bytes, the process's peak RSS and the naive m x d.
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
from fedmpi.task import Task  # noqa: E402
from fedmpi.evaluator import peak_rss_mb  # noqa: E402
from fedmpi.models import build_model, loss_fn  # noqa: E402
from fedmpi.runtime import World  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--dim", type=int, default=273_706, help="model parameters (SVHN CNN: 273,706)")
    args = ap.parse_args()
    classes = 2
    features = args.dim // classes - 1  # logreg: (features + 1) * classes parameters
    cfg = config.from_dict({
        "task": {"dataset": "synthetic", "clients": args.clients, "model": "logreg"},
        "train": {"local_steps": 1, "batch_size": 1, "lr": 0.01},
        "algorithm": {"name": "fedswe"},
        "availability": {"kind": "stationary", "base": {"kind": "uniform", "lo": 0.01, "hi": 0.2}}})
    world = World()
    # 256 distinct samples shared round-robin by the clients: the data stays small, the models are big
    n = 256
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g)
    order = torch.arange(args.clients) % n
    task = Task(model=build_model("logreg", (features,), classes), loss=loss_fn("logreg"), train_x=x, train_y=y,
                test_x=x, test_y=y, order=order, offsets=np.arange(args.clients + 1), classes=classes,
                label_hist=None, groups=None)
    run = build_components(cfg, world, task=task)
    d, algo = run.spec.dim, run.algorithm
    print(f"# FedSWE memory on {machine()}: m={args.clients}, d={d}, {args.rounds} rounds, p_i ~ U(0.01, 0.2)")
    print(f"# baseline RSS before the first round: {peak_rss_mb():.0f} MB")
    print(f"{'round':>6} {'versions':>9} {'store MB':>9} {'peak RSS MB':>12} {'naive m*d MB':>13} {'s/round':>8}")
    t0 = time.perf_counter()
    for t in range(args.rounds):
        algo.round(t)
        if (t + 1) % 5 == 0 or t + 1 == args.rounds:
            store = algo.store
            print(f"{t + 1:>6} {len(store.versions):>9} {store.nbytes() / 2**20:>9.0f} {peak_rss_mb():>12.0f} "
                  f"{args.clients * d * 4 / 2**20:>13.0f} {(time.perf_counter() - t0) / (t + 1):>8.2f}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
