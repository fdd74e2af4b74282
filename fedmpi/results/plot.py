"""``fedmpi plot``: a metric against rounds (or emulated delay) for one or several runs.

Runs of the same experiment (the same result-defining keys, ``reader.RESULT_SECTIONS``: they may
differ in seed, rounds, evaluation, runtime or output) form one curve: their mean with a +/- one
standard deviation band, on a common x grid (interpolated when the x values differ, as
``sim_delay`` does between seeds). Labels name the keys that tell the curves apart by their
full dotted names.
"""

from __future__ import annotations

import numpy as np
import yaml

from ..errors import InputError
from .outfiles import check_figure, save_figure
from .reader import load

_MAX_LABEL_KEYS = 4


def _labels(experiments: list[dict]) -> list[str]:
    """'name (algorithm)' plus the dotted keys whose values tell the curves apart."""
    keys = sorted({k for e in experiments for k in e})
    differ = [k for k in keys if k not in ("name", "algorithm.name")
              and len({repr(e.get(k)) for e in experiments}) > 1]
    labels = []
    for e in experiments:
        base = f"{e.get('name', 'run')} ({e.get('algorithm.name', '?')})"
        extra = ", ".join(f"{k}={e.get(k)}" for k in differ[:_MAX_LABEL_KEYS])
        more = f", +{len(differ) - _MAX_LABEL_KEYS} keys" if len(differ) > _MAX_LABEL_KEYS else ""
        labels.append(base + (f" {extra}{more}" if extra else ""))
    return labels


def load_curves(paths: list[str], metric: str, x: str) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, int]]:
    """(label, x grid, mean, std, number of runs) per experiment."""
    groups: dict[str, tuple[dict, list]] = {}
    for p in paths:
        r = load(p)
        for name in (metric, x):
            if name not in r.metrics:
                have = ", ".join(sorted(r.metrics))
                raise InputError(f"{p}: has no metric {name!r} (has: {have})")
        exp = r.experiment()
        key = yaml.safe_dump(exp, sort_keys=True)
        label_keys = {"name": r.config.get("name", "run"), **exp}
        groups.setdefault(key, (label_keys, []))[1].append((r.metrics[x].astype(float),
                                                            r.metrics[metric].astype(float)))
    curves = []
    for label, (_, runs) in zip(_labels([g[0] for g in groups.values()]), groups.values()):
        runs = [rn for rn in runs if len(rn[0])]
        if not runs:
            continue
        if all(len(r[0]) == len(runs[0][0]) and np.array_equal(r[0], runs[0][0]) for r in runs):
            grid = runs[0][0]
            ys = np.stack([r[1] for r in runs])
        else:
            hi = min(r[0].max() for r in runs)
            lo = max(r[0].min() for r in runs)
            grid = np.linspace(lo, hi, 200)
            ys = np.stack([np.interp(grid, r[0], r[1]) for r in runs])
        curves.append((label, grid, np.nanmean(ys, 0), np.nanstd(ys, 0), len(runs)))
    return curves


def plot(paths: list[str], metric: str, out: str, x: str = "round", title: str | None = None) -> str:
    """Draw ``metric`` against ``x`` for the runs in ``paths`` into ``out`` (PNG, PDF, SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    check_figure(out, "--out", paths)
    curves = load_curves(paths, metric, x)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, grid, mean, std, n in curves:
        line, = ax.plot(grid, mean, label=label + (f", {n} runs" if n > 1 else ""))
        if n > 1:
            ax.fill_between(grid, mean - std, mean + std, color=line.get_color(), alpha=0.25, linewidth=0)
    ax.set_xlabel({"round": "round", "sim_delay": "emulated delay"}.get(x, x))
    ax.set_ylabel(metric)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        return save_figure(fig, out, "--out", paths)
    finally:
        plt.close(fig)
