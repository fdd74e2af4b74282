"""Iterations/s of DSpodFL (and DGD) with many linear-SVM clients, against a per-client loop.

    python benchmarks/decentralized.py [--clients 100 1000] [--algorithms dspodfl dgd]
    mpiexec -n 2 python benchmarks/decentralized.py          # the same, clients sharded over 2 ranks

On a CPU shared with other jobs, pass ``--threads 1``: intra-op threads that wait on busy cores
slow every tensor op down many times.

FMNIST-shaped random data (1x28x28 uint8 images, 10 classes, 60 samples per client),
Linear(784, 10) with the multi-class hinge loss, batch 16, lr 0.01, rgg with about 15
neighbours per client, d_i and b_ij ~ Beta(0.5, 0.5) (DGD: every client and link fires).
One iteration = indicators, mixing term, SGD step, delay (``Decentralized.round``; no evaluation).

The reference does what the authors' code does: one ``torch.nn.Module`` per client, an autograd
SGD step per active client, neighbour averaging by ``state_dict`` arithmetic in Python loops over
clients and edges. It runs on rank 0 alone, with the same graph, indicators and minibatches, and
its models are checked against ours after the same iterations (``max |diff|``). Each side's
speed is 1 / (median seconds per iteration), which a busy shared machine disturbs least.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import image_task, machine, sync  # noqa: E402

from fedmpi import config  # noqa: E402
from fedmpi.build import build_components  # noqa: E402
from fedmpi.runtime import World  # noqa: E402


def build(name: str, m: int, world: World):
    radius = math.sqrt(15 / (math.pi * m))  # about 15 neighbours each
    cfg = config.from_dict({"task": {"dataset": "synthetic", "clients": m, "model": "linear_svm"},
                            "train": {"batch_size": 16, "lr": 0.01}, "algorithm": {"name": name},
                            "topology": {"kind": "rgg", "radius": radius}}, world.size)
    return build_components(cfg, world, task=image_task("linear_svm", (1, 28, 28), m, 60, world.device)).algorithm


class Reference:
    """Per-client modules and Python loops (the authors' code structure)."""

    def __init__(self, algo) -> None:
        self.algo, self.task, self.lr = algo, algo.ctx.task, algo.cfg.train.lr
        x0 = algo.ctx.spec.flatten(self.task.model)
        self.models = [copy.deepcopy(self.task.model) for _ in range(algo.m)]
        for net in self.models:
            vector_to_parameters(x0.clone(), net.parameters())

    def round(self, k: int) -> None:
        v, v_edges = self.algo.indicators(k)
        old = [copy.deepcopy(net.state_dict()) for net in self.models]  # pre-aggregation x_i
        new = [copy.deepcopy(s) for s in old]
        graph = self.algo.graph
        for e in np.flatnonzero(v_edges):  # x_i += r_ij (x_j - x_i), both endpoints
            i, j, r = int(graph.edges[e, 0]), int(graph.edges[e, 1]), float(graph.weights[e])
            for key in new[i]:
                new[i][key] += r * (old[j][key] - old[i][key])
                new[j][key] += r * (old[i][key] - old[j][key])
        for i in np.flatnonzero(v):  # x_i -= alpha g_i(x_i), gradient at the pre-aggregation model
            net = self.models[i]
            net.zero_grad()
            xb, yb, _ = self.algo.ctx.trainer.batch(np.array([i]), k, 0)
            self.task.loss(net(self.task.inputs(xb[0])), yb[0]).backward()
            for key, p in net.named_parameters():
                new[i][key] -= self.lr * p.grad
        for net, state in zip(self.models, new):
            net.load_state_dict(state)

    def flat(self) -> torch.Tensor:
        return torch.stack([parameters_to_vector(net.parameters()).detach() for net in self.models])


def measure(name: str, m: int, iters: int, ref_iters: int, world: World) -> None:
    """One table row: median seconds per iteration of each side (robust to a busy machine)."""
    ref_iters = ref_iters or max(4, min(16, 1600 // m))  # the reference costs ~1.5 ms per client
    algo = build(name, m, world)
    for k in range(ref_iters):  # warm-up, and the state the reference is checked against
        algo.round(k)
    ours_after = algo.exchanger.gather_all(algo.table.rows.clone())
    world.barrier()
    times = []
    for k in range(ref_iters, ref_iters + iters):
        t = time.perf_counter()
        algo.round(k)  # every rank takes part in the exchange, so rank 0's clock sees the slowest
        sync()
        times.append(time.perf_counter() - t)
    world.barrier()
    ours = 1 / float(np.median(times))
    if world.rank != 0:
        idle_barrier(world)  # wait for rank 0's reference without taking a core from it
        return
    ref = Reference(algo)
    ref.round(0)  # warm-up
    times = []
    for k in range(1, ref_iters):
        t = time.perf_counter()
        ref.round(k)
        sync()
        times.append(time.perf_counter() - t)
    slow = 1 / float(np.median(times))
    diff = float((ref.flat() - ours_after).abs().max())
    print(f"{name:<9} {m:>6} {world.size:>5} {ours:>10.1f} {slow:>10.2f} {ours / slow:>7.1f}x {diff:>9.1e}", flush=True)
    idle_barrier(world)


def idle_barrier(world: World) -> None:
    """A barrier that sleeps while it waits (MPI_Barrier busy-polls a core)."""
    if world.comm is None:
        return
    req = world.comm.Ibarrier()
    while not req.Test():
        time.sleep(0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--algorithms", nargs="+", default=["dspodfl", "dgd"])
    ap.add_argument("--iters", type=int, default=30, help="timed iterations of fedmpi")
    ap.add_argument("--ref-iters", type=int, default=0,
                    help="iterations of the reference, the first one warm-up (default: 16 at m=100, 4 at m=1000)")
    ap.add_argument("--threads", type=int, help="torch threads per rank (default: cores / local ranks)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"], help="where the models live")
    args = ap.parse_args()
    if args.ref_iters < 0 or args.ref_iters == 1 or args.iters < 1:
        ap.error("--ref-iters needs 2 or more (the first is warm-up), --iters 1 or more")
    world = World.create(device=args.device, threads=args.threads)
    if world.rank == 0:
        print(f"# decentralized benchmark on {machine()}, ranks={world.size}, threads/rank={torch.get_num_threads()}")
        print(f"{'algorithm':<9} {'m':>6} {'ranks':>5} {'fedmpi/s':>10} {'loop/s':>10} {'ratio':>8} {'max|diff|':>9}")
    for name in args.algorithms:
        for m in args.clients:
            measure(name, m, args.iters, args.ref_iters, world)
    world.close()


if __name__ == "__main__":
    main()
