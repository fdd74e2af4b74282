"""The anchor task: fedmpi against a hand-written per-client PyTorch loop, in one run.

    python benchmarks/at1.py [--rounds 200] [--repeat 1] [--device cpu|cuda] [--loop-threads 1]

Anchor task: Fashion-MNIST (``/usr/share/datasets/fashion-mnist``), 1000 IID clients x 60
images, a cohort of 50 clients drawn uniformly per round, 6 local SGD steps of batch 10,
lr 0.1, logistic regression, FedAvg, 200 rounds.

- fedmpi: the real CLI, ``fedmpi run`` on 1 rank and ``mpiexec -n 2 fedmpi run`` on 2 ranks
  (subprocesses); ms/round from the result file's ``wall_time`` between the evaluation
  before round 1 and the one after the last round (start-up excluded, one evaluation included).
- the loop: the same data, partition and initial model (fedmpi's ``build_task``); every round
  draws the cohort with numpy, and each client copies the global model, makes its own
  ``torch.optim.SGD``, runs 6 steps on its own pre-normalised tensors, and the server averages
  the client models (FedAvg with equal weights: IID shards of equal size).
- the quadratic task with ``eval_every: 1`` (6 clients, stationary p = 0.5, 5 local steps):
  rounds/s of ``fedmpi run``, and in one process the share of the evaluation and the result
  file in a round.

Each cycle runs fedmpi 1 rank, fedmpi 2 ranks, then the loop, and prints the ratios of that
cycle, so both sides of a ratio saw about the same machine load (printed with each line).
On one GPU the 2 ranks share it (gloo, tensors staged through host memory; docs/GPUS.md).
Both final test accuracies are printed; they should agree within 0.01.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine, mpiexec  # noqa: E402

_RUNS = itertools.count()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMNIST = "/usr/share/datasets/fashion-mnist"


def anchor(rounds: int, device: str, cuda_graphs: bool = False) -> dict:
    return {"name": "at1", "seed": 0, "rounds": rounds, "eval_every": rounds,
            "task": {"dataset": "fmnist", "root": FMNIST, "clients": 1000, "partition": {"kind": "iid"},
                     "model": "logreg"},
            "train": {"local_steps": 6, "batch_size": 10, "lr": 0.1, "cuda_graphs": cuda_graphs},
            "algorithm": {"name": "fedavg_active"},
            "availability": {"kind": "cohort", "size": 50},
            "evaluation": {"train": False},
            "runtime": {"progress": False, "device": device}}


def quadratic(rounds: int, device: str) -> dict:
    return {"name": "at1-quadratic", "seed": 0, "rounds": rounds, "eval_every": 1,
            "task": {"dataset": "quadratic", "model": "scalar", "clients": 6, "u": [0, 20, 40, 60, 80, 100]},
            "train": {"local_steps": 5, "batch_size": 1, "lr": 0.1},
            "algorithm": {"name": "fedavg_active"},
            "availability": {"kind": "stationary", "base": {"kind": "fixed", "values": [0.5]}},
            "runtime": {"progress": False, "device": device}}


def load() -> str:
    return "load %.1f" % os.getloadavg()[0]


def run_fedmpi(cfg: dict, ranks: int, tmp: str) -> tuple[float, float | None, float]:
    """(ms/round, final test accuracy, CPU seconds of all its processes) of ``fedmpi run`` on
    ``ranks`` ranks (a fresh result file)."""
    path = os.path.join(tmp, f"{cfg['name']}.yaml")
    out = os.path.join(tmp, f"{cfg['name']}-{ranks}-{next(_RUNS)}.h5")
    with open(path, "w") as fh:
        yaml.safe_dump(cfg, fh)
    cmd = (mpiexec(ranks) if ranks > 1 else []) + [sys.executable, "-m", "fedmpi", "run", path, "--out", out, "--quiet"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    before = children_cpu()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    cpu = children_cpu() - before
    with h5py.File(out, "r") as f:
        wall, rounds = f["metrics/wall_time"][:], f["metrics/round"][:]
        acc = float(f["metrics/test_acc"][-1]) if "test_acc" in f["metrics"] else None
    ms = 1000 * (wall[-1] - wall[0]) / (rounds[-1] - rounds[0]) if rounds[-1] > rounds[0] else float("nan")
    return ms, acc, cpu


def children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes and their descendants."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu_per_round(cfg: dict, ranks: int, tmp: str, full_cpu: float) -> float:
    """CPU ms per round and rank: a run's CPU minus that of the same run with 0 rounds (start-up,
    data, evaluation), over rounds and ranks. What one rank would take with a core of its own."""
    _, _, startup = run_fedmpi({**cfg, "rounds": 0}, ranks, tmp)
    return 1000 * (full_cpu - startup) / cfg["rounds"] / ranks


def per_client_loop(cfg_dict: dict, threads: int) -> tuple[float, float, float]:
    """(ms/round, final test accuracy, CPU ms/round) of the hand-written loop on the anchor task."""
    from fedmpi import config
    from fedmpi.build import build_task

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    cfg = config.from_dict(cfg_dict)
    dev = torch.device(cfg.runtime.device if cfg.runtime.device != "auto" else "cpu")
    task = build_task(cfg, dev)
    xs, ys = [], []  # each client's samples, normalised once (the usual per-client dataset)
    for c in range(task.m):
        ids = task.order[task.offsets[c]:task.offsets[c + 1]]
        xs.append(task.inputs(task.train_x[ids]).contiguous())
        ys.append(task.train_y[ids])
    server = copy.deepcopy(task.model)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)
    tr = cfg.train
    sync()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(cfg.rounds):
        cohort = rng.choice(task.m, cfg.availability.size, replace=False)
        total = [torch.zeros_like(p) for p in server.parameters()]
        for c in cohort:
            model = copy.deepcopy(server)
            opt = torch.optim.SGD(model.parameters(), lr=tr.lr)
            for _ in range(tr.local_steps):
                idx = torch.randint(0, len(ys[c]), (tr.batch_size,), generator=gen, device=dev)
                opt.zero_grad()
                F.cross_entropy(model(xs[c][idx]), ys[c][idx]).backward()
                opt.step()
            with torch.no_grad():
                for s, p in zip(total, model.parameters()):
                    s += p
        with torch.no_grad():
            for p, s in zip(server.parameters(), total):
                p.copy_(s / len(cohort))
    sync()
    ms = 1000 * (time.perf_counter() - start) / cfg.rounds
    cpu_ms = 1000 * (time.process_time() - cpu) / cfg.rounds
    with torch.no_grad():
        acc = float((server(task.inputs(task.test_x)).argmax(1) == task.test_y).float().mean())
    torch.set_num_threads(before)
    return ms, acc, cpu_ms


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def quadratic_breakdown(cfg_dict: dict, tmp: str) -> dict[str, float]:
    """ms per round, in one process, of each part of a ``fedmpi run`` round with ``eval_every: 1``:
    the round itself, the model evaluation, the result-file row (HDF5 append + flush), the
    peak-memory probe, and the rest of the runner's evaluation step."""
    from fedmpi import config
    from fedmpi import evaluator as evaluator_mod
    from fedmpi.runner import Runner
    from fedmpi.runtime import World

    cfg = config.from_dict(cfg_dict)
    world = World.create(cfg.runtime.device)
    runner = Runner(cfg, world, os.path.join(tmp, "breakdown.h5"), quiet=True)
    spent = {"round": 0.0, "evaluation": 0.0, "file row": 0.0, "peak memory": 0.0}

    def clocked(name, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t
        return wrapper

    runner.writer.append = clocked("file row", runner.writer.append)
    evaluator_mod.peak_rss_mb = clocked("peak memory", evaluator_mod.peak_rss_mb)
    evaluator_mod.evaluate = clocked("evaluation", evaluator_mod.evaluate)
    n = cfg.rounds
    t0 = runner._t0 = time.perf_counter()  # run() sets _t0; this breakdown calls _evaluate itself
    for r in range(n):
        t = time.perf_counter()
        runner.components.algorithm.round(r)
        spent["round"] += time.perf_counter() - t
        runner._evaluate(r + 1, 0)
    total = time.perf_counter() - t0
    runner.writer.finish("completed")
    spent["rest of the evaluation step"] = total - sum(spent.values())
    return {k: 1000 * v / n for k, v in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1, help="cycles of (1 rank, 2 ranks, loop)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--loop-threads", type=int, default=1,
                    help="torch threads of the loop (1: its fastest on a small shared CPU)")
    ap.add_argument("--quadratic-rounds", type=int, default=2000, help="0: skip the quadratic task")
    ap.add_argument("--skip-anchor", action="store_true")
    ap.add_argument("--cuda-graphs", action="store_true", help="fedmpi with train.cuda_graphs (CUDA only)")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")) and not args.skip_anchor:
        sys.exit(f"at1.py: Fashion-MNIST not found under {FMNIST} (Debian: apt install dataset-fashion-mnist)")
    shared = args.device == "cuda" and torch.cuda.device_count() < 2
    print(f"# at1 on {machine()}, device {args.device}, {load()}"
          + (", train.cuda_graphs" if args.cuda_graphs else "")
          + (" (2 ranks share the GPU: gloo, staged through host memory)" if shared else ""), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_anchor:
            cfg = anchor(args.rounds, args.device, args.cuda_graphs)
            print(f"{'cycle':>5} {'fedmpi 1 rank':>14} {'fedmpi 2 ranks':>15} {'loop':>9} {'loop/1 rank':>12} "
                  f"{'loop/2 ranks':>13} {'2 vs 1':>7}   acc 1 / 2 / loop   load", flush=True)
            ratios1, ratios2, cpu_lines = [], [], []
            for cycle in range(args.repeat):
                one, acc1, cpu1 = run_fedmpi(cfg, 1, tmp)
                two, acc2, cpu2 = run_fedmpi(cfg, 2, tmp)
                loop, acc_loop, cpu_loop = per_client_loop(cfg, args.loop_threads)
                ratios1.append(loop / one)
                ratios2.append(loop / two)
                accs = " / ".join("-" if a is None else f"{a:.4f}" for a in (acc1, acc2, acc_loop))
                print(f"{cycle:>5} {one:>11.1f} ms {two:>12.1f} ms {loop:>6.1f} ms {loop / one:>11.1f}x "
                      f"{loop / two:>12.1f}x {one / two:>6.2f}x   {accs}   {load()}", flush=True)
                if abs(acc1 - acc_loop) > 0.01:
                    print(f"      WARNING: accuracies differ by {abs(acc1 - acc_loop):.4f} (> 0.01)")
                c1 = cpu_per_round(cfg, 1, tmp, cpu1)
                c2 = cpu_per_round(cfg, 2, tmp, cpu2)
                cpu_lines.append(f"{cycle:>5} {c1:>11.1f} ms {c2:>12.1f} ms {cpu_loop:>6.1f} ms "
                                 f"{cpu_loop / c1:>11.1f}x {cpu_loop / c2:>12.1f}x {c1 / c2:>6.2f}x")
            if args.repeat > 1:
                print(f"median loop/1 rank {statistics.median(ratios1):.1f}x, "
                      f"loop/2 ranks {statistics.median(ratios2):.1f}x")
            print("CPU ms per round and rank (a core of its own each; start-up subtracted):")
            print("\n".join(cpu_lines), flush=True)
        if args.quadratic_rounds < 1:
            return
        q = quadratic(args.quadratic_rounds, args.device)
        ms, _, _ = run_fedmpi(q, 1, tmp)
        print(f"quadratic, 6 clients, eval_every 1: fedmpi run {1000 / ms:.0f} rounds/s ({ms:.2f} ms/round), {load()}")
        parts = quadratic_breakdown(quadratic(min(args.quadratic_rounds, 1000), args.device), tmp)
        total = sum(parts.values())
        print(f"  in one process: {1000 / total:.0f} rounds/s = " +
              " + ".join(f"{k} {v:.2f} ms ({100 * v / total:.0f}%)" for k, v in parts.items()), flush=True)


if __name__ == "__main__":
    main()
