"""``fedmpi plot``: a metric against rounds (or emulated delay) for one or several runs.

Runs whose configs differ only by ``seed`` (and output path) form one curve: their mean
with a +/- one standard deviation band, on a common x grid (interpolated when the x
values differ, as ``sim_delay`` does between seeds).
"""

from __future__ import annotations

import os

import numpy as np
import yaml

from ..errors import InputError
from .hdf5 import read_metrics


def _group_key(config_yaml: str) -> tuple[str, dict]:
    cfg = yaml.safe_load(config_yaml) or {}
    cfg.pop("seed", None)
    cfg.pop("output", None)
    return yaml.safe_dump(cfg, sort_keys=True), cfg


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _labels(configs: list[dict]) -> list[str]:
    """'name (algorithm)' plus the keys whose values tell the groups apart (at most 3)."""
    flats = [_flat(c) for c in configs]
    keys = sorted({k for f in flats for k in f})
    differ = [k for k in keys if k not in ("name", "algorithm.name", "rounds", "eval_every")
              and len({repr(f.get(k)) for f in flats}) > 1]
    labels = []
    for f in flats:
        base = f"{f.get('name', 'run')} ({f.get('algorithm.name', '?')})"
        extra = ", ".join(f"{k.rsplit('.', 1)[-1]}={f.get(k)}" for k in differ[:3])
        labels.append(base + (f" {extra}" if extra else ""))
    return labels


def load_curves(paths: list[str], metric: str, x: str) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, int]]:
    """(label, x grid, mean, std, number of seeds) per group of runs."""
    groups: dict[str, tuple[str, list]] = {}
    for p in paths:
        metrics, attrs = read_metrics(p)
        for name in (metric, x):
            if name not in metrics:
                have = ", ".join(sorted(metrics))
                raise InputError(f"{p}: has no metric {name!r} (has: {have})")
        key, cfg = _group_key(attrs.get("config", ""))
        groups.setdefault(key, (cfg, []))[1].append((metrics[x].astype(float), metrics[metric].astype(float)))
    curves = []
    for label, (_, runs) in zip(_labels([g[0] for g in groups.values()]), groups.values()):
        if all(len(r[0]) == len(runs[0][0]) and np.array_equal(r[0], runs[0][0]) for r in runs):
            grid = runs[0][0]
            ys = np.stack([r[1] for r in runs])
        else:
            hi = min(r[0].max() for r in runs if len(r[0]))
            lo = max(r[0].min() for r in runs if len(r[0]))
            grid = np.linspace(lo, hi, 200)
            ys = np.stack([np.interp(grid, r[0], r[1]) for r in runs])
        curves.append((label, grid, np.nanmean(ys, 0), np.nanstd(ys, 0), len(runs)))
    return curves


def plot(paths: list[str], metric: str, out: str, x: str = "round", title: str | None = None) -> str:
    """Draw ``metric`` against ``x`` for the runs in ``paths`` into ``out`` (PNG, PDF, SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = load_curves(paths, metric, x)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, grid, mean, std, n in curves:
        line, = ax.plot(grid, mean, label=label + (f", {n} seeds" if n > 1 else ""))
        if n > 1:
            ax.fill_between(grid, mean - std, mean + std, color=line.get_color(), alpha=0.25, linewidth=0)
    ax.set_xlabel({"round": "round", "sim_delay": "emulated delay"}.get(x, x))
    ax.set_ylabel(metric)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    folder = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(folder, exist_ok=True)
        fig.savefig(out, dpi=120)
    except (OSError, ValueError) as e:
        raise InputError(f"{out}: cannot write the figure ({e})") from None
    finally:
        plt.close(fig)
    return out
