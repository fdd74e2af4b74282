"""Metrics for any algorithm: per-client numbers, their summaries, and registered metrics.

**Per-client metrics** (``evaluation.clients``). At an evaluation, the main model (label ``""``
of ``evaluation_snapshot``; without one, the first model it offers, e.g. the decentralized
average) is evaluated on each client's own data: its local test split when
``task.partition.local_test`` > 0, else its training samples. Each rank evaluates the clients
of its shard one by one (the same batches whatever the number of ranks, so the same bits) and
rank 0 gathers the values in client order: ``loss`` and, for classification, ``acc`` (a client
without local test samples is NaN and left out of the summaries). The summaries are metrics of
the row: ``client_<name>_p10``, ``_p50``, ``_p90``, ``_std`` (ddof 0) and ``_worst``, the mean
over the worst ``evaluation.clients.worst`` fraction of clients (highest losses, lowest
accuracies); with ``evaluation.clients.arrays`` (which implies the evaluation) every value is
also stored, one row per evaluation, in ``/clients/<name>`` of the result file.

**Registered metrics** (``register_metric``, plug-ins too): a function of a ``MetricInput``
(the row so far, the per-client values) returning one number, added to every run's row after
the built-in metrics, in registration order. One registered with ``clients=True`` turns the
per-client evaluation on::

    @fedmpi.metrics.register_metric("acc_gap", clients=True)
    def acc_gap(m: MetricInput) -> float:
        return float(np.nanmax(m.clients["acc"]) - np.nanmin(m.clients["acc"]))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Optional

import numpy as np
import torch

from .engine.evaluate import evaluate
from .registry import METRICS
from .schema import opt

if TYPE_CHECKING:
    from .build import Components

SUMMARIES = ("p10", "p50", "p90", "std", "worst")


@dataclass
class ClientMetricsConfig:
    """The ``evaluation.clients`` block."""

    enabled: bool = opt(False, "evaluate the main model on each client's own data (its local test split, "
                               "else its training samples) and log p10/p50/p90/std/worst of client loss and acc")
    worst: float = opt(0.1, "fraction of clients averaged in the client_*_worst summaries", gt=0, le=1)
    arrays: bool = opt(False, "also store every client's values in /clients/<name> (one row per evaluation; "
                              "implies enabled)")


@dataclass(frozen=True)
class MetricInput:
    """What a registered metric sees, on rank 0."""

    rounds_done: int
    row: Mapping[str, float]  # the metrics computed so far at this evaluation
    clients: Mapping[str, np.ndarray]  # 'loss', 'acc' (classification): (m,) float64; empty when off
    sizes: np.ndarray  # (m,) samples the per-client values were computed on
    cfg: Any  # the run's Config


MetricFn = Callable[[MetricInput], float]


def register_metric(name: str, fn: MetricFn | None = None, *, clients: bool = False) -> Any:
    """Register ``fn`` (or decorate it) as metric ``name`` of every run; ``clients``: it reads
    ``MetricInput.clients``, so the per-client evaluation runs."""
    return METRICS.register(name, fn, clients=clients)


def wants_clients(cfg: Any) -> bool:
    """Whether a run of ``cfg`` evaluates every client (asked for, arrays asked for, or a
    registered metric needs it)."""
    c = cfg.evaluation.clients
    return c.enabled or c.arrays or any(e.options.get("clients") for e in METRICS)


def client_names(classes: int) -> list[str]:
    """The per-client arrays of a task: ``loss``, and ``acc`` for classification."""
    return ["loss", "acc"] if classes else ["loss"]


def summary_names(classes: int) -> list[str]:
    return [f"client_{a}_{s}" for a in client_names(classes) for s in SUMMARIES]


def summarize(name: str, values: np.ndarray, worst: float) -> dict[str, float]:
    """The summaries of one per-client array (NaN entries left out; all NaN -> NaN)."""
    v = np.sort(values[np.isfinite(values)])
    if v.size == 0:
        return {f"client_{name}_{s}": math.nan for s in SUMMARIES}
    k = max(1, math.ceil(worst * v.size))
    low_is_bad = name != "loss"
    out = {f"client_{name}_p{q}": float(np.quantile(v, q / 100)) for q in (10, 50, 90)}
    out[f"client_{name}_std"] = float(np.std(v))
    out[f"client_{name}_worst"] = float(np.mean(v[:k] if low_is_bad else v[-k:]))
    return out


def client_samples(run: Components, i: int) -> torch.Tensor:
    """Indices (into ``task.train_x``) of client ``i``'s evaluation samples."""
    task = run.task
    if task.local_test_order is not None:
        off = task.local_test_offsets
        return task.local_test_order[int(off[i]):int(off[i + 1])]
    return task.order[int(task.offsets[i]):int(task.offsets[i + 1])]


def evaluate_clients(run: Components, model: torch.Tensor | None) -> dict[str, np.ndarray] | None:
    """Collective: rank 0's flat ``model`` (ignored elsewhere) on each client's own data.
    The (m,) arrays on rank 0, None elsewhere."""
    task, spec, world = run.task, run.spec, run.world
    if world.rank == 0:
        flat = model.detach().reshape(-1).clone()
    else:
        flat = torch.empty(spec.dim, dtype=torch.float32, device=task.train_x.device)
    world.broadcast_(flat)
    lo, hi = world.shard(task.m)
    names = client_names(task.classes)
    mine = np.full((len(names), hi - lo), np.nan)
    for i in range(lo, hi):
        idx = client_samples(run, i)
        if idx.numel() == 0:
            continue
        loss, acc = evaluate(task, spec, flat, task.train_x[idx], task.train_y[idx],
                             run.cfg.evaluation.batch_size)
        mine[0, i - lo] = float(loss[0])
        if acc is not None:
            mine[1, i - lo] = float(acc[0])
    parts = world.allgather_obj(mine)
    if world.rank != 0:
        return None
    values = np.concatenate(parts, axis=1)
    return {n: values[j] for j, n in enumerate(names)}


def client_sizes(run: Components) -> np.ndarray:
    """(m,) samples of each client's evaluation data."""
    task = run.task
    return np.diff(task.local_test_offsets if task.local_test_order is not None else task.offsets)


def registered_names() -> list[str]:
    return METRICS.names()


def registered(inp: MetricInput) -> dict[str, float]:
    """Every registered metric's value (rank 0), in registration order."""
    return {e.name: float(e.obj(inp)) for e in METRICS}


# ----------------------------------------------------------------------------- stopping at a value

@dataclass
class StopAtConfig:
    """``runtime.stop_at``: end the run at the first evaluation where a metric reaches a value."""

    metric: Optional[str] = opt(None, "metric watched at every evaluation (e.g. test_acc); null = never stop early")
    value: float = opt(0.0, "the value to reach")
    goal: Literal["at_least", "at_most"] = opt("at_least", "reached when the metric is >= value (at_least) "
                                                          "or <= value (at_most, for losses)")


@dataclass
class StopAtParams:
    """The ``runtime`` key of ``stop_at`` (the runner adds its callback when a metric is named)."""

    stop_at: StopAtConfig = opt(StopAtConfig(), "stop early once a metric reaches a value (recorded in the file)")


def stop_at(spec: StopAtConfig) -> Callable[[Any, int, dict], str | None]:
    """The ``evaluated`` callback of ``runtime.stop_at``: a reason once the metric reaches the value."""
    at_least = spec.goal == "at_least"

    def stop_at(run: Any, rounds_done: int, row: dict) -> str | None:
        v = row.get(spec.metric)
        if v is not None and (v >= spec.value if at_least else v <= spec.value):
            return f"{spec.metric} {'>=' if at_least else '<='} {spec.value:g} ({v:.6g}) after round {rounds_done}"
        return None

    stop_at.__qualname__ = "runtime.stop_at"
    return stop_at
