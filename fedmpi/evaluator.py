"""The evaluator: which metrics a run logs, and computing them at an evaluation.

Metric names follow from the task and the algorithm's declarations: for each label of
<<<<<<< HEAD
``algorithm.evaluated_models`` (``""`` -> no suffix) ``test_loss``, ``test_acc`` (classification;
a language model's next-token accuracy), ``test_ppl`` (a language model's perplexity, exp of the
token-level loss), ``x`` (a scalar model), and ``train_loss`` (and ``train_acc``, ``train_ppl``)
for the main model when ``evaluation.train``; then the algorithm's own ``metrics``; ``epsilon`` under ``privacy``; the
=======
``algorithm.evaluated_models`` (``""`` -> no suffix) ``test_loss``, ``test_acc`` (classification),
``x`` (a scalar model), and ``train_loss`` (and ``train_acc`` for classification) for the main
model when ``evaluation.train``; then the algorithm's own ``metrics``; ``epsilon`` under ``privacy`` (and
``epsilon_production`` under ``privacy.noise_cohort_size``); the
>>>>>>> main
per-client summaries (``evaluation.clients``) and the registered metrics the config names
(``evaluation.metrics``; ``fedmpi.metrics``); then ``n_active``, ``wall_time`` and
``peak_rss_mb``. The result-file contract is in docs/INTERFACES.md.
"""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import numpy as np
import psutil
import torch

from . import metrics, rng
from .engine.evaluate import evaluate
from .errors import InputError
from .registry import METRICS
from .schema import opt

if TYPE_CHECKING:
    from .build import Components


@dataclass
class EvaluationConfig:
    train: bool = opt(True, "also evaluate on the training set", result=False)  # adds or leaves out metrics
    train_samples: Optional[int] = opt(None, "evaluate train metrics on a fixed subsample of this size", ge=1)
    batch_size: int = opt(2000, "evaluation batch size", ge=1, result=False)
    clients: metrics.ClientMetricsConfig = opt(metrics.ClientMetricsConfig(), "per-client metrics (fedmpi.metrics)")
    metrics: list = opt([], "registered metrics (plug-ins: fedmpi.metrics.register_metric) computed at every "
                            "evaluation, in this order; a loaded metric not named here is not computed and costs "
                            "nothing; naming one that reads the clients' values turns evaluation.clients on")


RUN_METRICS = ("n_active", "wall_time", "peak_rss_mb")

log = logging.getLogger(__name__)


_process: psutil.Process | None = None  # this process's handle, made once (not at every evaluation)


def peak_rss_mb() -> float:
    """Largest resident memory of this process so far (MB)."""
    global _process
    if _process is None or _process.pid != os.getpid():  # a forked child gets its own
        _process = psutil.Process()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max(peak_kb / 1024.0, _process.memory_info().rss / 2**20)


class Evaluator:
    """Metric names (``names``), per-client array names (``client_arrays``, stored in the result
    file) and ``evaluate``, collective: every rank calls it."""

    def __init__(self, run: Components):
        self.run = run
        self.per_client = metrics.wants_clients(run.cfg)
        self.names = self._names()
        idle = [n for n in METRICS.names() if n not in run.cfg.evaluation.metrics]
        if idle:
            log.info("registered metric%s %s not computed: this config does not name %s in evaluation.metrics",
                     "s" if len(idle) > 1 else "", ", ".join(idle), "them" if len(idle) > 1 else "it")
        arrays = run.cfg.evaluation.clients.arrays
        self.client_arrays = metrics.client_names(run.task.classes, metrics.perplexity(run.task)) if arrays else []
        self._train_subset = self._train_eval_subset()
        self.last_models: dict[str, torch.Tensor] = {}  # the models of the last evaluation (rank 0)
        self.last_clients: dict[str, np.ndarray] = {}  # the per-client values of the last evaluation (rank 0)

    def _names(self) -> list[str]:
        task, cfg, algo = self.run.task, self.run.cfg, self.run.algorithm
        scalar = task.classes == 0 and self.run.spec.dim == 1
        ppl = metrics.perplexity(task)
        names = []
        for label in algo.evaluated_models:
            sfx = f"_{label}" if label else ""
            names += [f"test_loss{sfx}"] + ([f"test_acc{sfx}"] if task.classes else [])
            names += [f"test_ppl{sfx}"] if ppl else []
            if label == "" and cfg.evaluation.train:
                names += ["train_loss"] + (["train_acc"] if task.classes else []) + (["train_ppl"] if ppl else [])
            if scalar:
                names.append(f"x{sfx}")
        private = list(self.run.privacy.metric_names)  # privacy (#27): the accountant's epsilon(s)
        private += ["time"] if cfg.clock.on else []  # the clock: virtual seconds (fedmpi.clock)
        clients = (metrics.summary_names(task.classes, cfg.evaluation.clients.summaries, ppl)
                   if self.per_client else [])
        extra = clients + list(cfg.evaluation.metrics)
        taken = set(names) | set(algo.metrics) | set(private) | set(RUN_METRICS) | set(clients)
        clash = [n for n in cfg.evaluation.metrics if n in taken]
        if clash:
            raise InputError(f"evaluation.metrics: {clash[0]!r} is already a metric of this run (algorithm "
                             f"{cfg.algorithm.name}); register the plug-in's under another name")
        return list(dict.fromkeys(names + list(algo.metrics) + private + extra + list(RUN_METRICS)))

    def _train_eval_subset(self) -> torch.Tensor | None:
        k, x = self.run.cfg.evaluation.train_samples, self.run.task.train_x
        if k is None or k >= x.shape[0]:
            return None
        idx = np.sort(rng.generator(self.run.cfg.seed, "train_eval").choice(x.shape[0], size=k, replace=False))
        return torch.as_tensor(idx, device=x.device)

    def evaluate(self, rounds_done: int, n_active: int, wall_time: float) -> dict[str, float]:
        """The metrics row after ``rounds_done`` rounds (on rank 0; ``{}`` elsewhere)."""
        snap = self.run.algorithm.evaluation_snapshot()  # collective
        rss = self.run.world.max_float(peak_rss_mb())  # collective
        clients = None
        if self.per_client:  # collective
            main = snap.models.get("", next(iter(snap.models.values()), None)) if self.run.world.rank == 0 else None
            clients = metrics.evaluate_clients(self.run, main)
        if self.run.world.rank != 0:
            return {}
        self.last_models = snap.models
        self.last_clients = clients or {}
        task, spec, bs = self.run.task, self.run.spec, self.run.cfg.evaluation.batch_size
        row: dict[str, float] = {}
        for label, model in snap.models.items():
            sfx = f"_{label}" if label else ""
            loss, acc = evaluate(task, spec, model, task.test_x, task.test_y, bs)
            row[f"test_loss{sfx}"] = float(loss[0])
            if acc is not None:
                row[f"test_acc{sfx}"] = float(acc[0])
            if f"test_ppl{sfx}" in self.names:
                row[f"test_ppl{sfx}"] = metrics.exp(float(loss[0]))
            if f"x{sfx}" in self.names:
                row[f"x{sfx}"] = float(model.reshape(-1)[0])
            if label == "" and "train_loss" in self.names:
                x, y = task.train_x, task.train_y
                if self._train_subset is not None:
                    x, y = x[self._train_subset], y[self._train_subset]
                loss, acc = evaluate(task, spec, model, x, y, bs)
                row["train_loss"] = float(loss[0])
                if acc is not None:
                    row["train_acc"] = float(acc[0])
                if "train_ppl" in self.names:
                    row["train_ppl"] = metrics.exp(float(loss[0]))
        row.update(snap.metrics)
        if "time" in self.names:  # the clock: virtual seconds at this evaluation
            row["time"] = float(self.run.algorithm.virtual_time())
        if "epsilon" in self.names:  # privacy (#27): epsilon at privacy.delta after rounds_done rounds
            row.update(self.run.privacy.metrics(rounds_done))
        ev = self.run.cfg.evaluation
        sizes = metrics.client_sizes(task)
        for name, values in self.last_clients.items():
            row.update(metrics.summarize(name, values, ev.clients.worst, ev.clients.summaries, sizes))
        if ev.metrics:
            inp = metrics.MetricInput(rounds_done, dict(row), self.last_clients, sizes, self.run.cfg)
            row.update(metrics.registered(inp, ev.metrics))
        row.update(round=rounds_done, n_active=n_active, wall_time=wall_time, peak_rss_mb=rss)
        return row
