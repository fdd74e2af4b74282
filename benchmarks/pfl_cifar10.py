"""pfl-research's CIFAR-10 benchmark setup, run as a fedmpi config through the real CLI.

    python benchmarks/pfl_cifar10.py [--rounds 10] [--device cpu|cuda] [--ranks 1|2] [--pfl-minutes M]

The setup of pfl-research's framework comparison (Granqvist et al., "pfl-research: simulation
framework for accelerating research in Private Federated Learning", arXiv:2404.06430, NeurIPS 2024
Datasets & Benchmarks; code: github.com/apple/pfl-research, publications/pfl/ and
benchmarks/image_classification/configs/baseline.yaml): CIFAR-10, IID, 1000 clients x 50 images,
a cohort of 50 clients a round, 1500 rounds, 1 local epoch of batch 10 (5 local steps), local lr
0.1, server lr 1.0, FedAvg with equal weights, their small CNN (``task.model: pfl_cnn``), the
central test set (10,000 images) evaluated every 10 rounds. fedmpi draws each minibatch with
replacement (pfl shuffles the epoch): the same work per round.

Data: the CIFAR-10 python version under ``$FEDMPI_DATA/cifar10`` (docs/DATASETS.md) when present;
otherwise a seeded random stand-in of the same shape (50,000 + 10,000 uint8 images 3x32x32, 10
classes) written as CIFAR-10 pickles to a temporary folder and read by the same reader -- every
printed line then says SYNTHETIC (the timing holds; the accuracy means nothing).

Timing as benchmarks/at1.py: seconds per round from the result file's ``wall_time`` between the
evaluation before round 1 and the last one (start-up excluded; the evaluations every 10 rounds
included, as in pfl's runs), and the wall time projected to 1500 rounds. pfl-research's published
wall-clock numbers (one A100-40GB) are in Table 1 of the paper; they are not copied here (no
source available to this repository's authors could be checked); ``--pfl-minutes`` prints the
ratio to a number you take from there.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine, mpiexec  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from fedmpi.data.readers import standard_root  # noqa: E402

PFL_ROUNDS = 1500
PFL_SOURCE = ("pfl-research (Granqvist et al., arXiv:2404.06430, Table 1; setup in Section 4.1 and "
              "Appendix C.5/D.1; code in github.com/apple/pfl-research publications/pfl), one A100-40GB")
CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def real_cifar() -> str | None:
    """The CIFAR-10 folder fedmpi reads by default, when its files are there."""
    root = standard_root("cifar10")
    for folder in (root, os.path.join(root, "cifar-10-batches-py")):
        if all(os.path.exists(os.path.join(folder, f)) for f in CIFAR_FILES):
            return root
    return None


def synthetic_cifar(folder: str, seed: int = 0) -> str:
    """Random CIFAR-10-shaped pickles (5 x 10,000 train, 10,000 test) in ``folder``."""
    gen = np.random.default_rng(seed)
    out = os.path.join(folder, "cifar-10-batches-py")
    os.makedirs(out)
    for name in CIFAR_FILES:
        batch = {b"data": gen.integers(0, 256, (10_000, 3072), dtype=np.uint8),
                 b"labels": gen.integers(0, 10, 10_000).tolist()}
        with open(os.path.join(out, name), "wb") as fh:
            pickle.dump(batch, fh, protocol=2)
    return folder


def pfl_config(rounds: int, eval_every: int, device: str, root: str, cache_dir: str | None,
               cuda_graphs: bool = False) -> dict:
    return {"name": "pfl_cifar10", "seed": 0, "rounds": rounds, "eval_every": eval_every,
            "task": {"dataset": "cifar10", "root": root, "cache_dir": cache_dir, "clients": 1000,
                     "partition": {"kind": "iid"}, "model": "pfl_cnn"},
            "train": {"local_epochs": 1.0, "batch_size": 10, "lr": 0.1, "cuda_graphs": cuda_graphs},
            "algorithm": {"name": "fedavg_active", "global_lr": 1.0},
            "availability": {"kind": "cohort", "size": 50},
            "evaluation": {"train": False},
            "runtime": {"progress": False, "device": device}}


def run(cfg: dict, ranks: int, tmp: str) -> tuple[float, float, int]:
    """(seconds per round, last test accuracy, rounds timed) of ``fedmpi run`` on ``ranks`` ranks."""
    path, out = os.path.join(tmp, "pfl_cifar10.yaml"), os.path.join(tmp, f"pfl_cifar10-{ranks}.h5")
    with open(path, "w") as fh:
        yaml.safe_dump(cfg, fh)
    cmd = (mpiexec(ranks) if ranks > 1 else []) + [sys.executable, "-m", "fedmpi", "run", path, "--out", out,
                                                   "--quiet", "--overwrite"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run(cmd, check=True, env=env, cwd=tmp)
    with h5py.File(out, "r") as f:
        wall, rounds, acc = f["metrics/wall_time"][:], f["metrics/round"][:], float(f["metrics/test_acc"][-1])
    timed = int(rounds[-1] - rounds[0])
    return (wall[-1] - wall[0]) / timed, acc, timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="rounds to time (default 10: < 2 min on 2 CPU cores)")
    ap.add_argument("--eval-every", type=int, default=10, help="test-set evaluation period (pfl: 10)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--cuda-graphs", action="store_true", help="with train.cuda_graphs (CUDA only)")
    ap.add_argument("--ranks", type=int, default=1, help="MPI ranks (mpiexec -n RANKS when > 1)")
    ap.add_argument("--pfl-minutes", type=float, default=None,
                    help="pfl-research's published wall-clock minutes for this setup (from the paper's Table 1)")
    args = ap.parse_args()
    if args.rounds < 1 or args.eval_every < 1:
        ap.error("--rounds and --eval-every must be >= 1")

    with tempfile.TemporaryDirectory(prefix="pfl_cifar10_") as tmp:
        root = real_cifar()
        tag = "[CIFAR-10]"
        cache = None  # real data: the user's fedmpi cache
        if root is None:
            tag = "[SYNTHETIC CIFAR-10 stand-in, no files under $FEDMPI_DATA/cifar10]"
            root, cache = synthetic_cifar(os.path.join(tmp, "data")), os.path.join(tmp, "cache")
        load = os.getloadavg()[0]
        print(f"{tag} pfl-research setup: 1000 clients x 50 images (IID), cohort 50, 1 local epoch of batch 10, "
              f"pfl_cnn, eval every {args.eval_every}; {args.rounds} rounds on {args.device}, {args.ranks} rank(s); "
              f"{machine()}; load {load:.2f}", flush=True)
        cfg = pfl_config(args.rounds, args.eval_every, args.device, root, cache, args.cuda_graphs)
        per_round, acc, timed = run(cfg, args.ranks, tmp)
        projected = per_round * PFL_ROUNDS / 60
        print(f"{tag} fedmpi: {per_round:.3f} s/round over {timed} rounds -> {projected:.1f} min projected for "
              f"{PFL_ROUNDS} rounds (test acc after {args.rounds} rounds {acc:.3f}; load now "
              f"{os.getloadavg()[0]:.2f})")
        if args.pfl_minutes is None:
            print(f"{tag} published: {PFL_SOURCE}: not copied here (pass --pfl-minutes M from the paper's Table 1)")
        else:
            print(f"{tag} published: {args.pfl_minutes:g} min by {PFL_SOURCE}; fedmpi projected / pfl = "
                  f"{projected / args.pfl_minutes:.2f}")


if __name__ == "__main__":
    main()
