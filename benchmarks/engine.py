"""Client-steps/s of the batched engine vs the sequential per-client loop, measured in one run.

    python benchmarks/engine.py [--device cpu|cuda] [--quick]

Cases: logreg and mlp on FMNIST-shaped data with 100 and 1000 clients per rank, the SVHN CNN
of ALGORITHMS.md with 10 and 50 clients. Each line prints both throughputs and their ratio.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import image_task, machine, timed  # noqa: E402

from fedmpi import config  # noqa: E402
from fedmpi.engine.local import LocalTrainer  # noqa: E402

CASES = [("logreg", (1, 28, 28), 100), ("logreg", (1, 28, 28), 1000),
         ("mlp", (1, 28, 28), 100), ("mlp", (1, 28, 28), 1000),
         ("svhn_cnn", (3, 32, 32), 10), ("svhn_cnn", (3, 32, 32), 50)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=5, help="local steps s per round")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="smaller cases (smoke test)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    train = config.from_dict({"train": {"local_steps": args.steps, "batch_size": args.batch, "lr": 0.01}}).train
    print(f"# engine benchmark on {machine()}, device {dev}, s={args.steps}, batch={args.batch}, "
          f"threads={torch.get_num_threads()}")
    print(f"{'model':<10} {'clients':>7} {'batched steps/s':>16} {'sequential steps/s':>19} {'ratio':>7}")
    for model, shape, n in CASES:
        if args.quick:
            n = max(2, n // 10)
        task = image_task(model, shape, n, 64, dev)
        clients = np.arange(n)
        rates = {}
        for path in ("batched", "sequential"):
            tr = LocalTrainer(task, train, seed=0, model_name=model, path=path)
            x0 = tr.spec.flatten(task.model).expand(n, -1)
            sec = timed(lambda: tr.train(x0, clients, t=0), repeat=2 if path == "sequential" else 3)
            rates[path] = n * args.steps / sec
        print(f"{model:<10} {n:>7} {rates['batched']:>16.0f} {rates['sequential']:>19.0f} "
              f"{rates['batched'] / rates['sequential']:>6.1f}x", flush=True)


if __name__ == "__main__":
    main()
