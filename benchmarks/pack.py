"""Packed sweeps (issue 36): a sweep end to end, packed against unpacked, alternating, in one run.

    python benchmarks/pack.py [--sweep anchor|sine|periodic|all] [--repeat 2] [--jobs 2] [--pack 4,8]
                              [--rounds R] [--device cpu|cuda] [--model cifar_cnn]
    python benchmarks/pack.py --in-process [--cells 8] [--blocks 25,50,100,354]

- ``anchor``: the anchor task of ``at1.py`` (Fashion-MNIST, 1000 IID clients, cohorts of 50, 6 steps
  of batch 10, logreg, FedAvg, 200 rounds) as an 8-seed sweep;
- ``sine``: the FedSWE Fashion-MNIST table of docs/REPRODUCTION.md
  (``configs/unavailability/fmnist_sine.sweep.yaml``: 16 algorithms x 3 seeds, 200 rounds);
- ``periodic``: its periodic-groups table (``fmnist_periodic.sweep.yaml``: 5 x 3, 200 rounds).

Each cycle runs the sweep into a fresh folder with ``fedmpi sweep -j J`` (unpacked: J worker
processes, one cell at a time each) and then with ``--pack N -j J`` for each N (``--jobs 1``:
``fedmpi sweep --pack N`` in one process), through the real CLI, and prints the wall times of
the whole command (process starts, set-ups, rounds, evaluations, files), the throughput ratio
unpacked / packed of that cycle, and /proc/loadavg beside each number. The result files of
every packed run are compared with the unpacked ones bit for bit (final models and metrics);
a difference is printed as an error. ``--rounds`` shortens every cell (a quick look; the
issue's numbers use the sweeps' own rounds); ``--model`` trains another model in every cell
(e.g. a FedSWE paper CNN, ``cifar_cnn``, on a GPU: ``benchmarks/device_check.sh``).

``--in-process``: the rounds alone, in one process: ``--cells`` anchor cells (seeds 0..) round by
round, each alone (``algorithm.round``) and all packed (``begin_round``, one ``PackedTrainer``
call, ``finish_round``), alternating every 10 rounds, ms per cell and round both ways (start-up,
set-up and evaluation excluded); with ``--blocks``, the packed training alone for each CPU block
size (rows), alternating.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), ROOT]  # this checkout's fedmpi, as the CLI runs get
from at1 import FMNIST, anchor  # noqa: E402
from common import machine  # noqa: E402

SWEEPS = {"sine": "configs/unavailability/fmnist_sine.sweep.yaml",
          "periodic": "configs/unavailability/fmnist_periodic.sweep.yaml"}


def loadavg() -> str:
    with open("/proc/loadavg") as fh:
        return "load " + " ".join(fh.read().split()[:3])


def sweep_file(name: str, tmp: str, rounds: int | None, device: str, model: str | None) -> str:
    """A sweep file in ``tmp``: the anchor's 8 seeds, or a shipped sweep with its base made absolute."""
    path = os.path.join(tmp, f"{name}.sweep.yaml")
    if name == "anchor":
        base = os.path.join(tmp, "anchor.yaml")
        with open(base, "w") as fh:
            yaml.safe_dump(anchor(rounds or 200, device), fh)
        data = {"base": base, "grid": {"seed": list(range(8))}, "set": {"task.model": model} if model else {}}
    else:
        src = os.path.join(ROOT, SWEEPS[name])
        with open(src) as fh:
            data = yaml.safe_load(fh)
        data["base"] = os.path.join(os.path.dirname(src), data["base"])
        data["set"] = {**data.get("set", {}), "runtime.progress": False, "runtime.device": device,
                       **({"rounds": rounds} if rounds else {}), **({"task.model": model} if model else {})}
    data["out"] = os.path.join(tmp, "unset")  # every run gives --out
    data.pop("pack", None)
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)
    return path


def run_sweep(path: str, out: str, jobs: int, pack: int) -> float:
    """Seconds of ``fedmpi sweep PATH --out OUT -j JOBS [--pack PACK]``, a fresh folder."""
    cmd = [sys.executable, "-m", "fedmpi", "sweep", path, "--out", out, "--quiet", "-j", str(jobs)]
    cmd += ["--pack", str(pack)] if pack > 1 else []
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    return time.perf_counter() - start


def differences(a: str, b: str) -> list[str]:
    """Result files under ``a`` whose final model or metrics (but time and memory) differ under ``b``."""
    bad = []
    for folder, _, files in os.walk(a):
        for f in files:
            if not f.endswith(".h5"):
                continue
            pa = os.path.join(folder, f)
            pb = os.path.join(b, os.path.relpath(pa, a))
            with h5py.File(pa, "r") as fa, h5py.File(pb, "r") as fb:
                same = np.array_equal(fa["final/params"][:], fb["final/params"][:]) and all(
                    np.array_equal(fa["metrics"][k][:], fb["metrics"][k][:], equal_nan=True)
                    for k in fa["metrics"] if k not in ("wall_time", "peak_rss_mb"))
            if not same:
                bad.append(os.path.relpath(pa, a))
    return bad


def bench(name: str, args: argparse.Namespace, packs: list[int], tmp: str) -> None:
    path = sweep_file(name, tmp, args.rounds, args.device, args.model)
    size = subprocess.run([sys.executable, "-m", "fedmpi", "sweep", path, "--print-array-size"], check=True,
                          capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT)).stdout.strip()
    cells = int(size)
    print(f"\n## {name}: {cells} cells, -j {args.jobs}" + (f", {args.rounds} rounds" if args.rounds else "")
          + (f", model {args.model}" if args.model else ""), flush=True)
    print(f"{'cycle':>5}  {'unpacked':>20}  " + "  ".join(f"{'pack ' + str(n):>28}" for n in packs), flush=True)
    ratios: dict[int, list[float]] = {n: [] for n in packs}
    for cycle in range(args.repeat):
        order = [1] + packs if cycle % 2 == 0 else packs[::-1] + [1]  # alternate who goes first
        times, loads = {}, {}
        for n in order:
            out = os.path.join(tmp, f"{name}-{cycle}-{n}")
            times[n] = run_sweep(path, out, args.jobs, n)
            loads[n] = loadavg()
        cols = [f"{times[1]:7.1f} s ({loads[1]})"]
        for n in packs:
            ratios[n].append(times[1] / times[n])
            cols.append(f"{times[n]:7.1f} s {times[1] / times[n]:4.2f}x ({loads[n]})")
            bad = differences(os.path.join(tmp, f"{name}-{cycle}-1"), os.path.join(tmp, f"{name}-{cycle}-{n}"))
            if bad:
                print(f"ERROR: pack {n} differs from unpacked in {len(bad)} files, e.g. {bad[0]}", flush=True)
        print(f"{cycle:>5}  " + "  ".join(cols), flush=True)
    for n in packs:
        print(f"pack {n}: throughput {statistics.median(ratios[n]):.2f}x unpacked (median of {args.repeat}; "
              f"{', '.join(f'{r:.2f}' for r in ratios[n])})", flush=True)


def in_process(args: argparse.Namespace) -> None:
    """The rounds alone, unpacked against packed, and the packed training by block size."""
    import torch

    from fedmpi import config
    from fedmpi.build import build_components
    from fedmpi.engine.packed import PackedTrainer
    from fedmpi.runtime import World

    world = World()
    base = anchor(200, args.device)
    if args.model:
        base["task"]["model"] = args.model

    def cells() -> list:
        return [build_components(config.from_dict({**base, "seed": s}), world) for s in range(args.cells)]

    def packed_round(runs: list, packed: PackedTrainer, t: int) -> float:
        requests = [r.algorithm.begin_round(t) for r in runs]
        start = time.perf_counter()
        ends = packed.train(list(enumerate(requests)))
        took = time.perf_counter() - start
        for r, q, e in zip(runs, requests, ends):
            r.algorithm.finish_round(q, e)
        return took

    alone, together = cells(), cells()
    packed = PackedTrainer([r.trainer for r in together])
    print(f"\n## in one process: {args.cells} anchor cells, ms per cell and round (block {packed.block_rows()} rows)")
    spent = {"alone": 0.0, "packed": 0.0}
    t = 0
    for rep in range(args.repeat * 3 + 1):
        for _ in range(10):
            a = time.perf_counter()
            for r in alone:
                r.algorithm.round(t)
            b = time.perf_counter()
            packed_round(together, packed, t)
            if rep:  # the first 10 rounds warm up
                spent["alone"] += b - a
                spent["packed"] += time.perf_counter() - b
            t += 1
        if rep:
            n = 10 * rep * args.cells
            print(f"rounds {t:>4}: alone {1000 * spent['alone'] / n:6.2f} ms  packed {1000 * spent['packed'] / n:6.2f} "
                  f"ms  {spent['alone'] / spent['packed']:.2f}x  ({loadavg()})", flush=True)
    same = all(torch.equal(x.algorithm.x, y.algorithm.x) for x, y in zip(alone, together))
    print("the same bits" if same else "ERROR: packed and alone differ", flush=True)
    if not args.blocks:
        return
    sizes = [int(n) for n in args.blocks.split(",")]
    train = {n: 0.0 for n in sizes}
    print(f"\n## the packed training alone by block rows (CPU; {args.cells} cells), ms per cell and round")
    for rep in range(args.repeat * 2 + 1):
        for n in sizes:
            packed.block_rows = lambda n=n: n
            for _ in range(8):
                took = packed_round(together, packed, t)
                train[n] += took if rep else 0.0
                t += 1
        if rep:
            print("  ".join(f"{n}: {1000 * train[n] / (8 * rep * args.cells):6.2f}" for n in sizes)
                  + f"  ({loadavg()})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", default="anchor", choices=["anchor", "sine", "periodic", "all"])
    ap.add_argument("--repeat", type=int, default=2, help="cycles of (unpacked, packed...), alternating the order")
    ap.add_argument("--jobs", type=int, default=2, help="-j of every sweep (default 2: this machine's cores)")
    ap.add_argument("--pack", default="4,8", help="pack sizes to time, comma-separated")
    ap.add_argument("--rounds", type=int, help="override every cell's rounds (quick look)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model", help="task.model of every cell (default: the sweep's)")
    ap.add_argument("--in-process", action="store_true", help="the rounds alone, in one process (see above)")
    ap.add_argument("--cells", type=int, default=8, help="--in-process: anchor cells")
    ap.add_argument("--blocks", help="--in-process: CPU block sizes (rows) to time the packed training with")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")):
        sys.exit(f"pack.py: Fashion-MNIST not found under {FMNIST} (Debian: apt install dataset-fashion-mnist)")
    packs = [int(n) for n in args.pack.split(",")]
    print(f"# pack on {machine()}, device {args.device}, {loadavg()}", flush=True)
    if args.in_process:
        in_process(args)
        return
    names = ["anchor", "sine"] if args.sweep == "all" else [args.sweep]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            bench(name, args, packs, tmp)


if __name__ == "__main__":
    main()
