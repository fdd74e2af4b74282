"""Input pipeline + local training: fedmpi's on-device indexing vs a DataLoader per client.

    python benchmarks/pipeline.py [--clients 50] [--steps 5] [--batch 32]

The papers' own code gives every client a torch DataLoader over its shard, with per-sample
Python transforms (random crop 32 / pad 4, horizontal flip, normalisation), and trains one
model object per client. fedmpi keeps all images on the device as one uint8 tensor, draws
every client's minibatch indices from counter-based streams, augments all clients' batches
at once on the device, and trains through ``LocalTrainer``. Both do the same work here: the
SVHN CNN of ALGORITHMS.md, ``--clients`` clients, s steps of batch b. Prints samples/s of each
and their ratio (one run, same machine, same moment).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import image_task, machine  # noqa: E402

from fedmpi import config  # noqa: E402
from fedmpi.engine.local import LocalTrainer  # noqa: E402


class ClientImages(Dataset):
    """One client's uint8 images with per-sample crop/flip/normalise, as in the papers' code."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, seed: int):
        self.x, self.y, self.mean, self.std = x, y, mean.view(-1, 1, 1), std.view(-1, 1, 1)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        img = torch.nn.functional.pad(self.x[i].float() / 255.0, (4, 4, 4, 4))
        dx, dy = self.rng.integers(0, 9, size=2)
        img = img[:, dy:dy + 32, dx:dx + 32]
        if self.rng.random() < 0.5:
            img = img.flip(-1)
        return (img - self.mean) / self.std, self.y[i]


def dataloader_reference(task, clients: int, steps: int, batch: int) -> float:
    """Seconds for every client: own DataLoader + own model copy + s SGD steps."""
    t = time.perf_counter()
    for c in range(clients):
        ids = task.order[task.offsets[c]:task.offsets[c + 1]]
        loader = DataLoader(ClientImages(task.train_x[ids], task.train_y[ids], task.mean, task.std, c),
                            batch_size=batch, shuffle=True, drop_last=True)
        model = copy.deepcopy(task.model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        it = iter(loader)
        for _ in range(steps):
            try:
                xb, yb = next(it)
            except StopIteration:
                it = iter(loader)
                xb, yb = next(it)
            opt.zero_grad()
            task.loss(model(xb), yb).backward()
            opt.step()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    dev = torch.device("cpu")
    task = image_task("svhn_cnn", (3, 32, 32), args.clients, 4 * args.batch, dev)
    train = config.from_dict({"train": {"local_steps": args.steps, "batch_size": args.batch, "lr": 0.01,
                                        "augment": ["crop", "flip"]}}).train
    samples = args.clients * args.steps * args.batch
    print(f"# input pipeline + training on {machine()}: svhn_cnn, {args.clients} clients, s={args.steps}, "
          f"batch={args.batch}, crop+flip, threads={torch.get_num_threads()}")
    ref = min(dataloader_reference(task, args.clients, args.steps, args.batch) for _ in range(2))
    print(f"{'DataLoader per client':<28} {samples / ref:>10.0f} samples/s")
    clients = np.arange(args.clients)
    for path in ("sequential", "batched"):
        tr = LocalTrainer(task, train, seed=0, path=path)
        x0 = tr.spec.flatten(task.model).expand(args.clients, -1)
        tr.train(x0[:2], clients[:2], t=0)  # warm-up
        sec = min(_timed(lambda: tr.train(x0, clients, t=1)) for _ in range(2))
        print(f"{'fedmpi engine (' + path + ')':<28} {samples / sec:>10.0f} samples/s   {ref / sec:5.2f}x")


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
