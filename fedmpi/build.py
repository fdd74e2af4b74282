"""``build_run(cfg, world)``: the components of one run, built the same way by the runner, the
tests and the benchmarks -- task (data + model), local trainer, participation model, algorithm.

Every rank builds the same components for its shard of clients; nothing here communicates
except what the algorithm's constructor does. Bad input raises ``InputError`` (the runner
makes every rank agree on it).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import guards
from .algorithms.base import Algorithm, Context
from .config import Config
from .data.task import Task, build_task
from .engine.local import LocalTrainer
from .errors import InputError
from .participation import Participation
from .participation import build as build_participation
from .registry import ALGORITHMS
from .runtime import World


@dataclass
class Run(Context):
    """The algorithm's ``Context`` and the algorithm itself."""

    algorithm: Algorithm | None = None


def build_run(cfg: Config, world: World, participation: Participation | None = None,
              task: Task | None = None) -> Run:
    """Build every component of ``cfg`` on this rank; ``participation`` and ``task`` replace the
    configured ones (tests script who is available, benchmarks bring synthetic tasks)."""
    task = task if task is not None else build_task(cfg, world.device)
    trainer = LocalTrainer(task, cfg.train, cfg.seed)
    cls = ALGORITHMS.get(cfg.algorithm.name).obj
    if participation is None and cls.needs_participation:
        participation = build_participation(cfg.availability, task.client_info(cfg.seed))
    check_memory(cfg, world, task.m, trainer.spec.dim, task, trainer.path)
    run = Run(cfg, world, task, trainer, participation)
    run.algorithm = cls(Context(cfg, world, task, trainer, participation))
    return run


def check_memory(cfg: Config, world: World, m: int, d: int, task: Task | None = None,
                 path: str = "batched") -> None:
    """Refuse up front, with the estimate, an O(m d) algorithm state that cannot fit, and (with
    ``task``) a local step (batch x model, ``guards.step_bytes``) that cannot fit beside it."""
    lo, hi = world.shard(m)
    need = int(ALGORITHMS.get(cfg.algorithm.name).obj.client_rows) * (hi - lo) * d * 4
    free, where = world.free_memory()  # a GPU shared by several ranks: its share
    if need > 0.9 * free:
        raise InputError(f"algorithm.name: {cfg.algorithm.name} keeps {need / 2**30:.1f} GiB of per-client state "
                         f"per rank ({hi - lo} clients x {d} parameters), more than the {free / 2**30:.1f} GiB "
                         f"{where} available; use more ranks or fewer clients")
    if task is None:
        return
    batch = int(task.sizes.max()) if cfg.train.full_gradient else cfg.train.batch_size
    step = guards.step_bytes(task, batch, hi - lo, path)
    if need + step > 0.9 * free:
        key = "train.full_gradient" if cfg.train.full_gradient else "train.batch_size"
        raise InputError(f"{key}: a local step of {min(guards.MIN_CHUNK, hi - lo)} clients x {batch} samples needs "
                         f"{step / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB {where} available"
                         + (f" besides {need / 2**30:.1f} GiB of per-client state" if need else ""))
