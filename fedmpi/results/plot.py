"""``fedmpi plot``: metrics against rounds (or emulated delay) for runs, sized for a paper.

    fedmpi plot SWEEP.yaml --metric test_acc,test_loss --size column --out fig.pdf
    fedmpi plot runs/ --label FedAvg --label FedSWE --legend right --logy --out fig.svg

Inputs are result files, folders (every ``.h5`` below) and sweep files (their cells), gathered
as ``fedmpi table`` gathers them. Runs of the same experiment (the same result-defining keys,
``reader.RESULT_SECTIONS``, and the same sweep variant: they may differ in seed, rounds,
evaluation, runtime or output) form one curve: their mean with a +/- one standard deviation
band, on a common x grid (interpolated when the x values differ, as ``sim_delay`` does between
seeds). A curve is named by its sweep variant, else by ``name (algorithm)`` and the dotted keys
that tell the curves apart; ``--label`` names them in order instead. The legend goes below
the axes (or to their right, or inside at a matplotlib location, or nowhere) and the figure
grows to hold it, so it never covers a curve; several metrics are subplots sharing one legend.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import yaml

from ..errors import InputError
from .outfiles import check_figure, save_figure
from .reader import Result

_MAX_LABEL_KEYS = 4
SIZES = {"column": (3.4, 2.6), "page": (7.0, 3.0), "default": (6.4, 4.2)}  # inches: a paper column, a page
LEGENDS = ("below", "right", "none", "best", "upper left", "upper right", "lower left", "lower right",
           "center left", "center right", "upper center", "lower center", "center")


@dataclass
class Curve:
    """One experiment: its label, x grid, mean and std over its runs, and how many runs."""

    label: str
    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    runs: int


def _labels(experiments: list[dict]) -> list[str]:
    """The variant, else 'name (algorithm)', plus the dotted keys whose values tell apart the
    curves of the same variant."""
    keys = sorted({k for e in experiments for k in e})
    labels = []
    for e in experiments:
        same = [o for o in experiments if o.get("variant") == e.get("variant")]
        differ = [k for k in keys if k not in ("name", "algorithm.name", "variant")
                  and len({repr(o.get(k)) for o in same}) > 1]
        base = e.get("variant") or f"{e.get('name', 'run')} ({e.get('algorithm.name', '?')})"
        extra = ", ".join(f"{k}={e.get(k)}" for k in differ[:_MAX_LABEL_KEYS])
        more = f", +{len(differ) - _MAX_LABEL_KEYS} keys" if len(differ) > _MAX_LABEL_KEYS else ""
        labels.append(base + (f" {extra}{more}" if extra else ""))
    return labels


def _mean_std(runs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if all(len(r[0]) == len(runs[0][0]) and np.array_equal(r[0], runs[0][0]) for r in runs):
        grid = runs[0][0]
        ys = np.stack([r[1] for r in runs])
    else:
        grid = np.linspace(max(r[0].min() for r in runs), min(r[0].max() for r in runs), 200)
        ys = np.stack([np.interp(grid, r[0], r[1]) for r in runs])
    with np.errstate(invalid="ignore"):
        return grid, np.nanmean(ys, 0), np.nanstd(ys, 0)


def curves_of(runs: list[tuple[Result, str]], metric: str, x: str) -> list[Curve]:
    """One Curve per experiment among ``(result, sweep variant or "")`` pairs, in first-seen order."""
    groups: dict[str, tuple[dict, list]] = {}
    for r, variant in runs:
        for name in (metric, x):
            if name not in r.metrics:
                raise InputError(f"{r.path}: has no metric {name!r} (has: {', '.join(sorted(r.metrics))})")
        exp = r.experiment()
        key = yaml.safe_dump({"variant": variant, **exp}, sort_keys=True)
        label_keys = {"name": r.config.get("name", "run"), "variant": variant, **exp}
        groups.setdefault(key, (label_keys, []))[1].append((r.metrics[x].astype(float),
                                                            r.metrics[metric].astype(float)))
    curves = []
    for label, (_, rs) in zip(_labels([g[0] for g in groups.values()]), groups.values()):
        rs = [rn for rn in rs if len(rn[0])]
        if rs:
            curves.append(Curve(label, *_mean_std(rs), len(rs)))
    return curves


def gather_runs(inputs: list[str]) -> list[tuple[Result, str]]:
    """(result, sweep variant) of files, folders and sweep files; unfinished runs included."""
    from .table import gather

    found = gather(inputs, partial=True)
    if not found.runs:
        raise InputError(f"no evaluations to plot: no result files ({found.where})")
    return [(r.result, str(r.keys.get("variant") or "")) for r in found.runs]


def load_curves(paths: list[str], metric: str, x: str) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, int]]:
    """(label, x grid, mean, std, number of runs) per experiment of ``paths``."""
    return [(c.label, c.x, c.mean, c.std, c.runs) for c in curves_of(gather_runs(paths), metric, x)]


def parse_size(text: str) -> tuple[float, float]:
    """``column``, ``page``, ``default`` or ``W,H`` in inches."""
    if text in SIZES:
        return SIZES[text]
    try:
        w, h = (float(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"--size: column, page, default or WIDTH,HEIGHT in inches, got {text!r}") from None
    if not (0.5 <= w <= 40 and 0.5 <= h <= 40):
        raise InputError(f"--size: width and height must be within 0.5-40 inches, got {text!r}")
    return w, h


def figure(curves_per_metric: list[tuple[str, list[Curve]]], x: str, *, size: tuple[float, float] = SIZES["default"],
           legend: str = "below", title: str | None = None, logx: bool = False, logy: bool = False):
    """A matplotlib Figure: one subplot per metric, one legend for all (not saved, not closed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(curves_per_metric)
    small = size[0] / n < 4.5
    with plt.rc_context({"font.size": 8 if small else 10, "legend.fontsize": 7 if small else 9}):
        fig, axes = plt.subplots(1, n, figsize=size, squeeze=False, layout="constrained")
        handles: dict[str, object] = {}
        for ax, (metric, curves) in zip(axes[0], curves_per_metric):
            colors = plt.get_cmap("tab10" if len(curves) <= 10 else "tab20")
            for i, c in enumerate(curves):
                line, = ax.plot(c.x, c.mean, color=colors(i % colors.N),
                                label=c.label + (f" ({c.runs} runs)" if c.runs > 1 else ""))
                if c.runs > 1:
                    ax.fill_between(c.x, c.mean - c.std, c.mean + c.std, color=line.get_color(), alpha=0.2,
                                    linewidth=0)
                handles.setdefault(line.get_label(), line)
            ax.set_xlabel({"round": "round", "sim_delay": "emulated delay", "wall_time": "wall time (s)"}.get(x, x))
            ax.set_ylabel(metric)
            ax.set_xscale("log" if logx else "linear")
            ax.set_yscale("log" if logy else "linear")
            ax.grid(alpha=0.3)
        if title:
            fig.suptitle(title)
        if legend == "below":
            fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                       ncol=max(1, min(len(handles), int(size[0] // 2.2))), frameon=False)
        elif legend == "right":
            fig.legend(list(handles.values()), list(handles), loc="outside right upper", frameon=False)
        elif legend != "none":
            axes[0][0].legend(list(handles.values()), list(handles), loc=legend)
    return fig


def plot(paths: list[str], metric: str | list[str], out: str, x: str = "round", title: str | None = None, *,
         labels: list[str] | None = None, legend: str = "below", size: tuple[float, float] = SIZES["default"],
         logx: bool = False, logy: bool = False) -> str:
    """Draw each metric against ``x`` for the runs of ``paths`` (files, folders, sweep files) into
    ``out`` (.png, .pdf, .svg); returns ``out``. Rank 0 / a single process only."""
    import matplotlib.pyplot as plt

    check_figure(out, "--out", paths)  # before any work: never over an input or a file that is not a figure
    if legend not in LEGENDS:
        raise InputError(f"--legend: one of {', '.join(LEGENDS)}, got {legend!r}")
    metrics = [metric] if isinstance(metric, str) else list(metric)
    runs = gather_runs(paths)
    per_metric = [(m, curves_of(runs, m, x)) for m in metrics]
    if not any(c for _, c in per_metric):
        raise InputError(f"{', '.join(paths)}: no evaluations to plot (the runs have not evaluated yet)")
    if labels:
        for m, curves in per_metric:
            if len(labels) != len(curves):
                raise InputError(f"--label: {len(labels)} given for {len(curves)} curves of {m} "
                                 f"({'; '.join(c.label for c in curves)})")
            for c, name in zip(curves, labels):
                c.label = name
    fig = figure(per_metric, x, size=size, legend=legend, title=title, logx=logx, logy=logy)
    try:
        return save_figure(fig, out, "--out", paths)
    finally:
        plt.close(fig)


# ----------------------------------------------------------------------------- command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", help="result files, folders (every .h5 below) or sweep files")
    parser.add_argument("--metric", default="test_acc", help="metric, or several comma-separated (one subplot each)")
    parser.add_argument("--x", default="round", help="x axis: round, sim_delay or wall_time")
    parser.add_argument("--out", required=True, help="figure file (.png, .pdf, .svg)")
    parser.add_argument("--title")
    parser.add_argument("--label", dest="labels", action="append", metavar="NAME",
                        help="name of the next curve, in the order of the default legend; repeat for each curve")
    parser.add_argument("--legend", default="below",
                        help="below (default) or right of the axes, none, or inside at a matplotlib location "
                             "(best, upper left, ...)")
    parser.add_argument("--size", default="default", help="column (3.4x2.6 in), page (7x3 in), default "
                                                          "(6.4x4.2 in) or WIDTH,HEIGHT in inches")
    parser.add_argument("--logx", action="store_true", help="logarithmic x axis")
    parser.add_argument("--logy", action="store_true", help="logarithmic y axis")


def run_cli(args: argparse.Namespace) -> int:
    if args.x not in ("round", "sim_delay", "wall_time"):
        raise InputError(f"--x: must be round, sim_delay or wall_time, got {args.x!r}")
    metrics = [m.strip() for m in args.metric.split(",") if m.strip()]
    if not metrics:
        raise InputError("--metric: empty")
    print(plot(args.inputs, metrics, args.out, x=args.x, title=args.title, labels=args.labels, legend=args.legend,
               size=parse_size(args.size), logx=args.logx, logy=args.logy))
    return 0
