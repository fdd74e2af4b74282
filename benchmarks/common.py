"""Shared set-up for the benchmarks: tasks with given shapes, built without data files."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time

import numpy as np
import torch

from fedmpi.task import Task
from fedmpi.models import build_model, loss_fn


def machine() -> str:
    cores = len(os.sched_getaffinity(0))
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.processor() or platform.machine()}, {cores} cores, torch {torch.__version__}, {dev}"


def image_task(model: str, shape: tuple[int, ...], clients: int, per_client: int,
               device: torch.device, classes: int = 10, seed: int = 0) -> Task:
    """A task of random uint8 images (FMNIST- or SVHN-shaped), ``per_client`` samples each."""
    g = torch.Generator().manual_seed(seed)
    n = clients * per_client
    x = torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8)
    y = torch.randint(0, classes, (n,), generator=g)
    c = shape[0]
    return Task(model=build_model(model, shape, classes, seed=seed).to(device), loss=loss_fn(model),
                train_x=x.to(device), train_y=y.to(device), test_x=x[:1000].to(device), test_y=y[:1000].to(device),
                order=torch.arange(n, device=device), offsets=np.arange(clients + 1) * per_client, classes=classes,
                label_hist=None, groups=None, mean=torch.full((c,), 0.5, device=device),
                std=torch.full((c,), 0.25, device=device), image=True)


def sync() -> None:
    """Wait for queued GPU work (CUDA kernels run asynchronously), so a clock reading is honest."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeat: int = 3) -> float:
    """Best wall time of ``repeat`` calls (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def interleaved(fns: dict, repeat: int, warmup: bool = True) -> dict[str, float]:
    """Best seconds of each function over ``repeat`` rounds that call them in turn (after one
    warm-up call each unless ``warmup`` is false), so that a change of machine load hits every side
    of a ratio alike."""
    if warmup:
        for fn in fns.values():
            fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            sync()
            t = time.perf_counter()
            fn()
            sync()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def mpiexec(n: int) -> list[str]:
    """The ``mpiexec -n N`` prefix (with Open MPI's --oversubscribe, and --allow-run-as-root as root)."""
    exe = shutil.which("mpiexec")
    if exe is None:
        raise SystemExit("mpiexec not found (install Open MPI or MPICH)")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    extra = []
    if "Open MPI" in version or "OpenRTE" in version:
        extra.append("--oversubscribe")
        if n <= (os.cpu_count() or 1) and len(os.sched_getaffinity(0)) >= n:  # as launch/fedmpi-launch
            extra += ["--bind-to", "core"]
        if os.geteuid() == 0:
            extra.append("--allow-run-as-root")
    return [exe, *extra, "-n", str(n)]
