"""Metrics for any algorithm: per-client numbers, their summaries, and registered metrics.

**Per-client metrics** (``evaluation.clients``). At an evaluation, the main model (label ``""``
of ``evaluation_snapshot``; without one, the first model it offers, e.g. the decentralized
average) is evaluated on each client's own data: its local test split when there is one
(``task.partition.local_test``: a fraction held out of its training samples, or ``dataset``: its
own test samples, e.g. a LEAF user's), else its training samples. Each rank evaluates the
clients of its shard one by one (the same batches whatever the number of ranks, so the same
bits) and rank 0 gathers the values in client order: ``loss`` and, for classification, ``acc``
(for a language model, trained with a token loss: the mean over the client's target tokens, the
next-token accuracy and ``ppl``, the perplexity exp(loss)); a client without evaluation samples
(or target tokens) is NaN and left out of the summaries. The summaries named
by ``evaluation.clients.summaries`` are metrics of the row, ``client_<name>_<summary>``: by
default ``p10``, ``p50``, ``p90``, ``std`` (ddof 0) and ``worst``, the mean over the worst
``evaluation.clients.worst`` fraction of clients (highest losses, lowest accuracies); the
fairness summaries of the literature (``SUMMARY_DOCS``, docs/PLUGINS.md) on request. With
``evaluation.clients.arrays`` (which implies the evaluation) every value is also stored, one row
per evaluation, in ``/clients/<name>`` of the result file.

**Registered metrics** (``register_metric``, plug-ins too): a function of a ``MetricInput``
(the row so far, the per-client values) returning one number. A run computes those its config
names in ``evaluation.metrics``, in that order, after the built-in metrics; a loaded metric the
config does not name costs nothing. Naming one registered with ``clients=True`` turns the
per-client evaluation on::

    @fedmpi.metrics.register_metric("acc_gap", clients=True)
    def acc_gap(m: MetricInput) -> float:
        return float(np.nanmax(m.clients["acc"]) - np.nanmin(m.clients["acc"]))

    # config: evaluation: {metrics: [acc_gap]}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Optional

import numpy as np
import torch

from .engine.evaluate import evaluate
from .engine.threads import one_thread
from .errors import InputError
from .registry import METRICS, PLUGIN_HINT
from .schema import opt

if TYPE_CHECKING:
    from .build import Components
    from .task import Task

#: What each summary of a per-client array is (``v``: the finite values, ``n``: their clients'
#: evaluation samples; "worst"/"best": highest/lowest losses, lowest/highest accuracies).
SUMMARY_DOCS = {
    "p10": "10th percentile (LEAF)", "p50": "median (LEAF)", "p90": "90th percentile (LEAF)",
    "std": "standard deviation over clients (ddof 0)",
    "worst": "mean over the worst evaluation.clients.worst fraction of clients (q-FFL's worst 10%)",
    "mean": "unweighted mean over clients (q-FFL's average)",
    "weighted": "mean weighted by the clients' evaluation samples, sum n_i v_i / sum n_i (LEAF's weighted mean)",
    "var": "variance over clients, ddof 0 (q-FFL's fairness measure)",
    "best": "mean over the best evaluation.clients.worst fraction of clients (q-FFL's best 10%)",
    "min": "smallest value (for acc: the worst client, AFL's measure)",
    "max": "largest value (for loss: the worst client)",
}
SUMMARIES = ("p10", "p50", "p90", "std", "worst")  # the default (the summaries before issue 35)


@dataclass
class ClientMetricsConfig:
    """The ``evaluation.clients`` block."""

    enabled: bool = opt(False, "evaluate the main model on each client's own data (its local test split, "
                               "else its training samples) and log p10/p50/p90/std/worst of client loss and acc",
                        result=False)  # adds metrics, changes none
    worst: float = opt(0.1, "fraction of clients averaged in the client_*_worst summaries", gt=0, le=1)
    arrays: bool = opt(False, "also store every client's values in /clients/<name> (one row per evaluation; "
                              "implies enabled)", result=False)
    summaries: list = opt(list(SUMMARIES), "which summaries S of the clients' values are logged (metrics "
                                           f"client_loss_S, client_acc_S), of: {', '.join(SUMMARY_DOCS)} "
                                           "(docs/PLUGINS.md)")


@dataclass(frozen=True)
class MetricInput:
    """What a registered metric sees, on rank 0."""

    rounds_done: int  # rounds completed at this evaluation (0 = before training)
    row: Mapping[str, float]  # the metrics computed so far at this evaluation
    clients: Mapping[str, np.ndarray]  # 'loss', 'acc' (classification), 'ppl' (token loss): (m,) float64; or empty
    sizes: np.ndarray  # (m,) samples the per-client values were computed on
    cfg: Any  # the run's Config


MetricFn = Callable[[MetricInput], float]


def register_metric(name: str, fn: MetricFn | None = None, *, clients: bool = False) -> Any:
    """Register ``fn`` (or decorate it) as metric ``name``, computed by the runs whose config
    names it (``evaluation.metrics``); ``clients``: it reads ``MetricInput.clients``, so naming it
    turns the per-client evaluation on."""
    return METRICS.register(name, fn, clients=clients)


def check(cfg: Any) -> None:
    """The ``evaluation`` keys that name things: registered metrics (known once plug-ins are
    loaded) and summaries, each once (InputError naming the key)."""
    ev = cfg.evaluation
    for key, names, known in (("evaluation.metrics", ev.metrics, METRICS.names()),
                              ("evaluation.clients.summaries", ev.clients.summaries, list(SUMMARY_DOCS))):
        for n in names:
            if not isinstance(n, str) or n not in known:
                if key == "evaluation.metrics":
                    raise InputError(f"{key}: no registered metric {n!r} (registered: {', '.join(known) or 'none'}; "
                                     f"the built-in metrics are always logged; {PLUGIN_HINT})")
                raise InputError(f"{key}: unknown summary {n!r} (allowed: {', '.join(known)})")
        dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if dup is not None:
            raise InputError(f"{key}: {dup!r} is named twice")


def wants_clients(cfg: Any) -> bool:
    """Whether a run of ``cfg`` evaluates every client (asked for, arrays asked for, or a metric
    named in ``evaluation.metrics`` reads the per-client values)."""
    c = cfg.evaluation.clients
    return c.enabled or c.arrays or any(METRICS.get(n).options.get("clients") for n in cfg.evaluation.metrics)


def client_names(classes: int, perplexity: bool = False) -> list[str]:
    """The per-client arrays of a task: ``loss``, ``acc`` for classification (a language model's
    next-token accuracy), ``ppl`` for a language model (``perplexity``)."""
    return ["loss"] + (["acc"] if classes else []) + (["ppl"] if perplexity else [])


def summary_names(classes: int, summaries: list[str] | tuple[str, ...] = SUMMARIES,
                  perplexity: bool = False) -> list[str]:
    return [f"client_{a}_{s}" for a in client_names(classes, perplexity) for s in summaries]


def perplexity(task: Task) -> bool:
    """Whether ``task``'s loss is a mean negative log-likelihood per token (``Loss.perplexity``):
    its exp, the perplexity, is then a metric too (``test_ppl``, ``client_ppl_*``)."""
    return bool(getattr(task.loss, "perplexity", False))


def exp(loss: float) -> float:
    """The perplexity of a mean token loss: exp(loss), inf beyond float64 (NaN stays NaN)."""
    return math.exp(loss) if not loss > 709.0 else math.inf


def summarize(name: str, values: np.ndarray, worst: float, summaries: list[str] | tuple[str, ...] = SUMMARIES,
              sizes: np.ndarray | None = None) -> dict[str, float]:
    """The ``summaries`` of one per-client array (NaN entries left out; all NaN -> NaN);
    ``sizes``: each client's evaluation samples (the ``weighted`` summary's weights)."""
    ok = np.isfinite(values)
    if not ok.any():
        return {f"client_{name}_{s}": math.nan for s in summaries}
    by_value = np.argsort(values[ok], kind="stable")
    v = values[ok][by_value]
    k = max(1, math.ceil(worst * v.size))
    low, high = float(np.mean(v[:k])), float(np.mean(v[-k:]))
    low_is_bad = name not in ("loss", "ppl")
    stats: dict[str, Callable[[], float]] = {
        "p10": lambda: np.quantile(v, 0.1), "p50": lambda: np.quantile(v, 0.5), "p90": lambda: np.quantile(v, 0.9),
        "std": lambda: np.std(v), "worst": lambda: low if low_is_bad else high,
        "mean": lambda: np.mean(v), "var": lambda: np.var(v), "best": lambda: high if low_is_bad else low,
        "min": lambda: v[0], "max": lambda: v[-1],
        "weighted": lambda: _weighted(v, (np.ones(values.size) if sizes is None else sizes)[ok][by_value]),
    }
    return {f"client_{name}_{s}": float(stats[s]()) for s in summaries}


def _weighted(v: np.ndarray, n: np.ndarray) -> float:
    n = n.astype(np.float64)
    return float(np.sum(v * n) / np.sum(n))


def client_data(task: Task, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``i``'s evaluation samples (x, y): its local test split, else its training samples."""
    if task.local_test_order is not None:
        off = task.local_test_offsets
        idx = task.local_test_order[int(off[i]):int(off[i + 1])]
        return (task.test_x[idx], task.test_y[idx]) if task.local_test_source == "test" else \
            (task.train_x[idx], task.train_y[idx])
    idx = task.order[int(task.offsets[i]):int(task.offsets[i + 1])]
    return task.train_x[idx], task.train_y[idx]


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
    names = client_names(task.classes, perplexity(task))
    mine = np.full((len(names), hi - lo), np.nan)
    sizes = client_sizes(task)
    with one_thread(flat.device):  # the gathers too: threads that wait for each other cost more than they give
        for i in range(lo, hi):
            if sizes[i] == 0:
                continue
            x, y = client_data(task, i)
            loss, acc = evaluate(task, spec, flat, x, y, run.cfg.evaluation.batch_size)
            mine[0, i - lo] = float(loss[0])
            if acc is not None:
                mine[1, i - lo] = float(acc[0])
            if names[-1] == "ppl":
                mine[-1, i - lo] = exp(float(loss[0]))
    parts = world.allgather_obj(mine)
    if world.rank != 0:
        return None
    values = np.concatenate(parts, axis=1)
    return {n: values[j] for j, n in enumerate(names)}


def client_sizes(task: Task) -> np.ndarray:
    """(m,) samples of each client's evaluation data."""
    return np.diff(task.local_test_offsets if task.local_test_order is not None else task.offsets)


def registered(inp: MetricInput, names: list[str]) -> dict[str, float]:
    """The value of each registered metric of ``names`` (rank 0), in that order."""
    return {n: float(METRICS.get(n).obj(inp)) for n in names}


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
