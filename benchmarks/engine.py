"""Client-steps/s of the batched engine vs the sequential per-client loop, measured in one run.

    python benchmarks/engine.py [--device cpu|cuda] [--quick] [--models logreg mlp svhn_cnn ...]

Cases: logreg and mlp on FMNIST-shaped data with 100 and 1000 clients per rank; the FedSWE
paper's CNNs (svhn_cnn, cifar_cnn, cinic_cnn) on SVHN-shaped data with 10 and 50 clients.
Every variant of a case is timed in alternating rounds (best of ``--repeat``), so a change of
machine load hits all of them alike. Each line prints the throughput of the batched engine through the stacked layers
(``engine.layers``), of the batched engine through ``vmap(grad)`` (the path the stacked layers
replace), of the sequential loop, the ratios, and the clients per batched call (``block``;
on CUDA every call has that many, the last padded: ``fedmpi/engine/shapes.py``). Conv nets get one line per stacked
convolution (``loop``: a conv call per client; ``grouped``: one grouped convolution;
``unfold``: im2col + batched matmul); the default on the device is marked with ``*``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import image_task, interleaved, machine  # noqa: E402

from fedmpi import config  # noqa: E402
from fedmpi.engine.layers import CONV_IMPLS, conv_impl  # noqa: E402
from fedmpi.engine.local import LocalTrainer  # noqa: E402
from fedmpi.runtime.world import set_cuda_math  # noqa: E402

FMNIST, SVHN = (1, 28, 28), (3, 32, 32)
CASES = [("logreg", FMNIST, 100), ("logreg", FMNIST, 1000), ("mlp", FMNIST, 100), ("mlp", FMNIST, 1000),
         ("svhn_cnn", SVHN, 10), ("svhn_cnn", SVHN, 50), ("cifar_cnn", SVHN, 10), ("cinic_cnn", SVHN, 10)]
CONV_MODELS = ("svhn_cnn", "cifar_cnn", "cinic_cnn")


def trainer_run(task, train, n: int, **trainer_args):
    tr = LocalTrainer(task, train, seed=0, **trainer_args)
    x0 = tr.spec.flatten(task.model).to(task.train_x.device).expand(n, -1)
    clients = np.arange(n)
    return lambda: tr.train(x0, clients, t=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=5, help="local steps s per round")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--models", nargs="+", help="only these models (default: every case)")
    ap.add_argument("--quick", action="store_true", help="smaller cases (smoke test)")
    ap.add_argument("--repeat", type=int, default=3, help="alternating timed rounds (best of)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda":
        set_cuda_math(False)  # what a run does (runtime.tf32: false)
    train = config.from_dict({"train": {"local_steps": args.steps, "batch_size": args.batch, "lr": 0.01}}).train
    print(f"# engine benchmark on {machine()}, device {dev}, s={args.steps}, batch={args.batch}, "
          f"load {os.getloadavg()[0]:.1f}; client steps/s")
    print(f"{'model':<18} {'clients':>7} {'stacked':>9} {'vmap':>9} {'sequential':>10} {'stacked/seq':>11} "
          f"{'stacked/vmap':>12} {'block':>6}")
    for model, shape, n in CASES:
        if args.models and model not in args.models:
            continue
        if args.quick:
            n = max(2, n // 10)
        task = image_task(model, shape, n, 64, dev)
        convs = CONV_IMPLS if model in CONV_MODELS else (conv_impl(dev),)
        fns = {"sequential": trainer_run(task, train, n, path="sequential"),
               "vmap": trainer_run(task, train, n, path="batched", stacked=False)}
        fns.update({conv: trainer_run(task, train, n, path="batched", conv=conv) for conv in convs})
        rate = {k: n * args.steps / sec for k, sec in interleaved(fns, args.repeat).items()}
        seq, vm = rate["sequential"], rate["vmap"]
        block = LocalTrainer(task, train, seed=0, path="batched").chunk_size()
        for conv in convs:
            label = f"{model} ({conv}{'*' if conv == conv_impl(dev) else ''})" if model in CONV_MODELS else model
            print(f"{label:<18} {n:>7} {rate[conv]:>9.0f} {vm:>9.0f} {seq:>10.0f} {rate[conv] / seq:>10.2f}x "
                  f"{rate[conv] / vm:>11.2f}x {block:>6}", flush=True)


if __name__ == "__main__":
    main()
