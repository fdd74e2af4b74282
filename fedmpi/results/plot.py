"""``fedmpi plot``: metrics against rounds (or emulated delay) for runs, sized for a paper.

    fedmpi plot SWEEP.yaml --metric test_acc,test_loss --size column --out fig.pdf
    fedmpi plot runs/ --label FedAvg --label FedSWE --legend right --logy --ylim 0.5,1 --out fig.svg

Inputs are result files, folders (every ``.h5`` below) and sweep files (their cells), gathered
as ``fedmpi table`` gathers them. Runs of the same experiment (the same result-defining keys,
``reader.is_result_key``, and the same variant label: they may differ in seed, rounds,
evaluation schedule, runtime or output) form one curve: their mean with a +/- one standard
deviation band, on a common x grid (interpolated when the x values differ, as ``sim_delay``
does between seeds).

Range. On an x axis of time (every x but ``round``) an axis without limits shows where the curves
differ (``x_focus``, ``y_focus``): x to a quarter beyond the time the slowest curve settles, or to
the budget every run shares (``runtime.stop_at`` on that x: each curve is drawn to it, a run that
ended before holding its last value), y over what every curve holds for 90% of that x range.
``--range all`` draws every point (the default against rounds); ``--xlim``/``--ylim`` set an axis.

Names. A curve is named by its variant (a sweep cell's file records it as ``runtime.label``, so
any subset of a sweep's files keeps it), else by its algorithm, then by the keys that tell it
apart from the curves of its variant, with the sweep's ``labels:`` and readable key names
(``results/names.py``); a key a curve's algorithm does not have is left out, never shown as
None. ``--label`` names the curves in order instead. Axes are labelled in words (``test_acc`` ->
"test accuracy"; ``--xlabel``/``--ylabel`` replace them).

For print. Fonts are embedded as TrueType (Type 42) in PDF and PS, never Type 3. Each curve has
its own colour (Okabe-Ito's colour-blind-safe palette), line style and marker, so curves stay
apart in grayscale. When the curves are every combination of two things (variants x a grid key,
say), colour and marker name the first and the line style the second, and the legend has one
entry per value of each instead of one per curve. The legend goes below the axes (or to their
right, or inside at a matplotlib location, or nowhere) in as many columns as fit the width; the
figure keeps its size (``--size column`` is 3.4 x 2.6 in) and long names are wrapped, so no text
is cut and no curve covered. When every curve averages the same number of runs the legend's
title says so once; a curve with another count says its own.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import yaml

from ..errors import InputError
from . import names
from .outfiles import check_figure, save_figure
from .reader import Result

_MAX_LABEL_KEYS = 4
SIZES = {"column": (3.4, 2.6), "page": (7.0, 3.0), "default": (6.4, 4.2)}  # inches: a paper column, a page
LEGENDS = ("below", "right", "none", "best", "upper left", "upper right", "lower left", "lower right",
           "center left", "center right", "upper center", "lower center", "center")
XLABELS = {"round": "round", "sim_delay": "emulated delay", "wall_time": "wall time (s)", "time": "virtual time (s)"}
# Okabe & Ito's colour-blind-safe palette (yellow last: faint on white), line styles and markers
# that keep curves apart in grayscale.
COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
STYLES = ("-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_BARE = ("variant", "algorithm.name", "name")  # shown as their value alone
MAX_LIMIT = 1e200  # |axis limit|: matplotlib's tick arithmetic overflows near 1e300
MAX_TEXT = 1000  # characters of a title, axis label or legend entry
log = logging.getLogger(__name__)


@dataclass
class Curve:
    """One experiment: its label, x grid, mean and std over its runs, how many runs, and the
    parts its label is made of (what tells it apart: variant, keys)."""

    label: str
    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    runs: int
    parts: dict[str, str] = field(default_factory=dict)


def _describe(experiments: list[dict], labels: dict[str, names.KeyLabel] | None = None) -> list[dict[str, str]]:
    """Per experiment, the ordered parts of its name: the variant (by its label), else the
    algorithm; then each key whose value differs between curves of its variant that have the key
    (a key another algorithm lacks is not a difference), readable (``names``)."""
    has_variants = any(e.get("variant") for e in experiments)
    keys = sorted({k for e in experiments for k in e if k not in ("variant", "algorithm.name")})
    if not has_variants:
        keys = ["algorithm.name", *keys]

    def differs(k: str) -> bool:
        for v in {e.get("variant") for e in experiments}:
            present = {repr(e[k]) for e in experiments if e.get("variant") == v and e.get(k) is not None}
            if len(present) > 1:
                return True
        return False

    shown = [k for k in keys if k == "algorithm.name" or differs(k)]
    if has_variants:
        shown = ["variant", *shown]
    readable = names.key_names(shown, labels)
    out = []
    for e in experiments:
        parts: dict[str, str] = {}
        if has_variants and not e.get("variant") and e.get("algorithm.name") is not None:  # a run of no sweep
            parts["variant"] = names.value_text("algorithm.name", e["algorithm.name"], labels)
        for k in shown:
            if e.get(k) is None:
                continue
            if k in _BARE:
                parts[k] = names.value_text(k, e[k], labels)
            else:
                parts[k] = names.assignment(k, e[k], readable, labels)
        out.append(parts)
    return out


def _join(parts: dict[str, str]) -> str:
    values = list(parts.values())
    head, rest = values[:1], values[1:]
    more = f", +{len(rest) - _MAX_LABEL_KEYS} keys" if len(rest) > _MAX_LABEL_KEYS else ""
    return ", ".join(head + rest[:_MAX_LABEL_KEYS]) + more


def _labels(experiments: list[dict], labels: dict[str, names.KeyLabel] | None = None) -> list[str]:
    """The legend text of each experiment (``_describe``'s parts joined)."""
    return [_join(p) or "run" for p in _describe(experiments, labels)]


def _mean_std(runs: list[tuple[np.ndarray, np.ndarray]], end: float | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs' mean and std on one x grid: their own when they share it, else 200 points from
    the latest first x to the earliest last x, each run interpolated linearly. ``end``: the x
    budget the runs share; a run that ended before it (its rounds done) holds its last value to
    it, so that the curve reaches the common end."""
    if end is not None:
        runs = [(x, y) if not len(x) or x[-1] >= end else (np.append(x, end), np.append(y, y[-1]))
                for x, y in runs]
    if all(len(r[0]) == len(runs[0][0]) and np.array_equal(r[0], runs[0][0]) for r in runs):
        grid = runs[0][0]
        ys = np.stack([r[1] for r in runs])
    else:
        grid = np.linspace(max(r[0].min() for r in runs), min(r[0].max() for r in runs), 200)
        ys = np.stack([np.interp(grid, r[0], r[1]) for r in runs])
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a round where every run is NaN stays NaN (diverged)
        return grid, np.nanmean(ys, 0), np.nanstd(ys, 0)


def shared_budget(runs: list[tuple[Result, str]], x: str) -> float | None:
    """The x budget every run shares: ``runtime.stop_at`` on the metric ``x`` (``time``: the
    same virtual-time budget, docs/ALGORITHMS.md section 7), the same value everywhere; else None."""
    values = set()
    for r, _ in runs:
        if r.get("runtime.stop_at.metric") != x or r.get("runtime.stop_at.goal", "at_least") != "at_least":
            return None
        value = r.get("runtime.stop_at.value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            return None
        values.add(float(value))
    return values.pop() if len(values) == 1 else None


def curves_of(runs: list[tuple[Result, str]], metric: str, x: str,
              labels: dict[str, names.KeyLabel] | None = None, end: float | None = None) -> list[Curve]:
    """One Curve per experiment among ``(result, variant label or "")`` pairs, in first-seen order
    (``end``: the x budget the runs share, ``shared_budget``)."""
    groups: dict[str, tuple[dict, list]] = {}
    for r, variant in runs:
        for name in (metric, x):
            if name not in r.metrics:
                raise InputError(f"{r.path}: has no metric {name!r} (has: {', '.join(sorted(r.metrics))})")
        exp = r.experiment()
        key = yaml.safe_dump({"variant": variant, **exp}, sort_keys=True)
        described = {"name": r.config.get("name", "run"), "variant": variant or None, **exp}
        groups.setdefault(key, (described, []))[1].append((r.metrics[x].astype(float),
                                                           r.metrics[metric].astype(float)))
    curves = []
    for parts, (_, rs) in zip(_describe([g[0] for g in groups.values()], labels), groups.values()):
        rs = [rn for rn in rs if len(rn[0])]
        if rs:
            curves.append(Curve(_join(parts) or "run", *_mean_std(rs, end), len(rs), parts))
    return curves


def gather_runs(inputs: list[str]) -> list[tuple[Result, str]]:
    """(result, variant label) of files, folders and sweep files; unfinished runs included."""
    return _gather(inputs)[0]


def _gather(inputs: list[str]) -> tuple[list[tuple[Result, str]], dict[str, names.KeyLabel]]:
    from .table import gather

    found = gather(inputs, partial=True)
    if not found.runs:
        raise InputError(f"no evaluations to plot: no result files ({found.where})")
    return [(r.result, str(r.keys.get("variant") or "")) for r in found.runs], found.labels


def load_curves(paths: list[str], metric: str, x: str) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, int]]:
    """(label, x grid, mean, std, number of runs) per experiment of ``paths``."""
    runs, labels = _gather(paths)
    return [(c.label, c.x, c.mean, c.std, c.runs) for c in curves_of(runs, metric, x, labels)]


# ----------------------------------------------------------------------------- arguments

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


def parse_limits(text: str | None, key: str) -> tuple[float | None, float | None] | None:
    """``LO,HI`` (either may be empty: ``0.5,`` sets the lower limit only) -> (lo, hi)."""
    if text is None:
        return None
    parts = text.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        lo, hi = (float(p) if p.strip() else None for p in parts)
    except ValueError:
        raise InputError(f"{key}: LOW,HIGH (either may be left empty), got {text!r}") from None
    if any(v is not None and not abs(v) <= MAX_LIMIT for v in (lo, hi)) or (lo is not None and hi is not None
                                                                             and lo >= hi):
        raise InputError(f"{key}: finite limits (|limit| <= {MAX_LIMIT:g}) with LOW < HIGH, got {text!r}")
    return lo, hi


@dataclass
class Axes:
    """What the user sets on the axes: labels (one y label per subplot, or one for all), limits,
    log scales."""

    xlabel: str | None = None
    ylabels: list[str] | None = None
    xlim: tuple[float | None, float | None] | None = None
    ylim: tuple[float | None, float | None] | None = None
    logx: bool = False
    logy: bool = False
    focus: bool | None = None    # an axis without limits shows where the curves differ (True) or all data;
    #                              None: focus on x axes of time (every x but round)
    budget: float | None = None  # the x budget every run shares (runtime.stop_at on the x axis)


# ----------------------------------------------------------------------------- the range shown

SETTLED = 0.95   # a curve has settled once it has made this share of its climb from start to end
MARGIN = 0.25    # the x range goes this share beyond the last curve to settle
LOW_SHARE = 0.1  # the y range may leave out a curve's lowest (falling: highest) values of this share of its x


def _settled_at(c: Curve) -> float | None:
    """The first x at which the curve has made ``SETTLED`` of its change from its first value to
    its level at the end (the mean of its last tenth of x), or None when it has no change."""
    ok = np.isfinite(c.mean) & np.isfinite(c.x)
    x, y = c.x[ok], c.mean[ok]
    if len(x) < 2:
        return None
    end = float(np.mean(y[x >= x[-1] - 0.1 * (x[-1] - x[0])]))
    change = end - y[0]
    if not abs(change) > 1e-12 * max(abs(end), abs(y[0]), 1e-300):
        return None
    reached = np.flatnonzero((y - (y[0] + SETTLED * change)) * np.sign(change) >= 0)
    return float(x[reached[0]]) if reached.size else float(x[-1])


def _direction(curves: list[Curve]) -> int:
    """+1 when most curves end above where they start (an accuracy), -1 below (a loss), else 0."""
    votes = 0
    for c in curves:
        y = c.mean[np.isfinite(c.mean)]
        if len(y) >= 2:
            votes += int(np.sign(y[-1] - y[0]))
    return int(np.sign(votes))


def x_focus(curves: list[Curve], budget: float | None) -> tuple[float, float] | None:
    """The x range of a figure (all its subplots' curves): from the first x to the shared budget
    when the runs have one, else to ``MARGIN`` beyond the time the slowest curve settles (never
    past the data's end); None when that would leave out nothing worth it (keep all)."""
    xs = [c.x[np.isfinite(c.x)] for c in curves]
    xs = [x for x in xs if len(x)]
    if not xs:
        return None
    lo, last = min(float(x[0]) for x in xs), max(float(x[-1]) for x in xs)
    if budget is not None and lo < budget:
        return lo, float(budget)
    settled = [t for t in map(_settled_at, curves) if t is not None]
    if not settled or last <= lo:
        return None
    hi = max(settled) + MARGIN * (max(settled) - lo)
    return (lo, hi) if hi < lo + 0.9 * (last - lo) else None


def y_focus(curves: list[Curve], xlim: tuple[float | None, float | None] | None) -> tuple[float, float] | None:
    """The y range of a subplot: every curve shown over at least 1 - ``LOW_SHARE`` of its x
    inside ``xlim`` (each curve's values sampled evenly in x: the start of a climb from the initial
    model may lie below, or above for a falling metric), std bands on the other side included,
    with a margin; None without finite values."""
    lo, hi = (xlim or (None, None))
    side = _direction(curves)
    lows, highs = [], []
    for c in curves:
        ok = np.isfinite(c.mean) & np.isfinite(c.x)
        x, y, sd = c.x[ok], c.mean[ok], np.nan_to_num(c.std[ok])
        keep = (x >= (lo if lo is not None else -np.inf)) & (x <= (hi if hi is not None else np.inf))
        if not keep.any():
            continue
        x, y, sd = x[keep], y[keep], sd[keep]
        held = np.interp(np.linspace(x[0], x[-1], 200), x, y) if x[-1] > x[0] else y
        lows.append(float(np.quantile(held, LOW_SHARE)) if side > 0 else float(np.min(y - sd)))
        highs.append(float(np.quantile(held, 1 - LOW_SHARE)) if side < 0 else float(np.max(y + sd)))
    if not lows or not max(highs) > min(lows):
        return None
    low, high = min(lows), max(highs)
    pad = 0.05 * (high - low)
    return low - pad, high + pad


# ----------------------------------------------------------------------------- the figure

def _factors(curves: list[Curve]) -> tuple[str, str] | None:
    """The two parts that name every curve when the curves are (nearly) every combination of
    their values and a legend per value is shorter than one per curve; else None."""
    keys = list(dict.fromkeys(k for c in curves for k in c.parts))
    if len(keys) != 2 or any(len(c.parts) != 2 for c in curves):
        return None
    values = [len({c.parts[k] for c in curves}) for k in keys]
    if min(values) < 2 or sum(values) >= len(curves):
        return None
    return keys[0], keys[1]


def _styles(curves: list[Curve], factors: tuple[str, str] | None) -> list[dict]:
    """Colour, marker and line style per curve: its own, or by the value of each factor."""
    if factors is None:
        return [{"color": COLORS[i % len(COLORS)], "marker": MARKERS[i % len(MARKERS)],
                 "linestyle": STYLES[i % len(STYLES)]} for i in range(len(curves))]
    first = list(dict.fromkeys(c.parts[factors[0]] for c in curves))
    second = list(dict.fromkeys(c.parts[factors[1]] for c in curves))
    return [{"color": COLORS[first.index(c.parts[factors[0]]) % len(COLORS)],
             "marker": MARKERS[first.index(c.parts[factors[0]]) % len(MARKERS)],
             "linestyle": STYLES[second.index(c.parts[factors[1]]) % len(STYLES)]} for c in curves]


def _legend_entries(curves: list[Curve], styles: list[dict], factors: tuple[str, str] | None, lw: float,
                    ms: float) -> tuple[list[list], list[list[str]], str | None]:
    """(handles, texts, title) in groups: one group of one entry per curve, or one group per
    factor of one entry per value. The title names the number of runs when every curve has the
    same (> 1); otherwise each curve with more than one says its own."""
    from matplotlib.lines import Line2D

    counts = [c.runs for c in curves]
    title = f"mean \u00b1 std of {counts[0]} runs" if counts[0] > 1 and len(set(counts)) == 1 else None
    if factors is None:
        texts = [c.label + ("" if title or c.runs == 1 else f" ({c.runs} runs)") for c in curves]
        return [[Line2D([], [], lw=lw, ms=ms, **s) for s in styles]], [texts], title
    handles: list[list] = [[], []]
    texts: list[list[str]] = [[], []]
    for g, (k, which) in enumerate(((factors[0], ("color", "marker")), (factors[1], ("linestyle",)))):
        for c, s in zip(curves, styles):
            if c.parts[k] not in texts[g]:
                kw = {"color": "0.25", "linestyle": "-", "marker": None, **{w: s[w] for w in which}}
                handles[g].append(Line2D([], [], lw=lw, ms=ms, **kw))
                texts[g].append(c.parts[k])
    return handles, texts, title


def _layouts(handles: list[list], texts: list[list[str]], where: str):
    """(ncol, handles, texts) to try, widest first. One group: 6..1 columns below, one to the
    right. Several groups (factors): one row per group, else one column per group (matplotlib
    fills columns first: the entries are reordered, short groups padded with blanks)."""
    from matplotlib.lines import Line2D

    flat_h, flat_t = [h for g in handles for h in g], [t for g in texts for t in g]
    if len(handles) == 1:
        cols = range(min(len(flat_t), 6), 0, -1) if where == "below" else (1,)
        return [(n, flat_h, flat_t) for n in cols]
    width = max(len(g) for g in texts)
    pad = [(list(h) + [Line2D([], [], alpha=0)] * (width - len(h)), list(t) + [""] * (width - len(t)))
           for h, t in zip(handles, texts)]
    by_row = ([pad[r][0][c] for c in range(width) for r in range(len(pad))],
              [pad[r][1][c] for c in range(width) for r in range(len(pad))])
    by_col = ([h for ph, _ in pad for h in ph], [t for _, pt in pad for t in pt])
    out = [(width, *by_row)] if where == "below" else []
    return out + [(len(pad), *by_col), (1, flat_h, flat_t)]


def _fit_legend(fig, handles: list[list], texts: list[list[str]], title: str | None, where: str, renderer):
    """The figure legend below (in the widest layout that fits the width) or right of the axes
    (at most ~40% of the width), long texts wrapped, so that it lies inside the figure."""
    limit = fig.bbox.width * (0.98 if where == "below" else 0.42)
    loc = "outside lower center" if where == "below" else "outside right center"
    wrap = max(len(t) for g in texts for t in g)
    while True:
        for ncol, hs, ts in _layouts(handles, texts, where):
            shown = [textwrap.fill(t, wrap) if t else t for t in ts]
            leg = fig.legend(hs, shown, loc=loc, ncol=ncol, frameon=False, title=title, handlelength=2.6,
                             columnspacing=1.2, handletextpad=0.5, borderaxespad=0.2)
            if leg.get_window_extent(renderer).width <= limit or (ncol == 1 and wrap <= 12):
                return leg
            leg.remove()
        wrap = max(12, int(wrap * 0.8))


def _fit_text(text, limit: float, renderer, along: str = "width") -> None:
    """Wrap a title or axis label until its extent ``along`` (width; height for a rotated y
    label) is at most ``limit`` pixels."""
    content = text.get_text()
    chars = len(content)
    while chars > 8 and getattr(text.get_window_extent(renderer), along) > limit:
        chars = int(chars * 0.85)
        text.set_text(textwrap.fill(content, chars))


def figure(curves_per_metric: list[tuple[str, list[Curve]]], x: str, *, size: tuple[float, float] = SIZES["default"],
           legend: str = "below", title: str | None = None, logx: bool = False, logy: bool = False,
           axes: Axes | None = None):
    """A matplotlib Figure: one subplot per metric, one legend for all (not saved, not closed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = axes or Axes(logx=logx, logy=logy)
    n = len(curves_per_metric)
    small = size[0] / n < 4.5
    fs = 8 if small else 10
    lw, ms = (1.2, 3.5) if small else (1.5, 4.5)
    rc = {"font.size": fs, "axes.labelsize": fs, "axes.titlesize": fs, "legend.fontsize": fs - 1,
          "legend.title_fontsize": fs - 1, "xtick.labelsize": fs - 1, "ytick.labelsize": fs - 1,
          "pdf.fonttype": 42, "ps.fonttype": 42, "axes.linewidth": 0.6, "grid.linewidth": 0.4}
    with plt.rc_context(rc):
        fig, grid = plt.subplots(1, n, figsize=size, squeeze=False, layout="constrained")
        factors = _factors(curves_per_metric[0][1]) if n else None
        styles = _styles(curves_per_metric[0][1], factors) if n else []
        for i, (ax, (metric, curves)) in enumerate(zip(grid[0], curves_per_metric)):
            for j, (c, s) in enumerate(zip(curves, styles)):
                # ~8 markers a curve, staggered so that curves on top of each other show each one's
                every = max(1, len(c.x) // 8, min(len(curves), len(c.x) // 4))
                line, = ax.plot(c.x, c.mean, lw=lw, ms=ms, markevery=(j % every, every),
                                label=c.label, **s)
                if c.runs > 1:
                    ax.fill_between(c.x, c.mean - c.std, c.mean + c.std, color=line.get_color(), alpha=0.15,
                                    linewidth=0)
            ylabels = axes.ylabels or []
            ax.set_xlabel(axes.xlabel if axes.xlabel is not None else XLABELS.get(x, names.metric(x)))
            ax.set_ylabel(ylabels[i] if len(ylabels) == n else ylabels[0] if ylabels else names.metric(metric))
            ax.set_xscale("log" if axes.logx else "linear")
            ax.set_yscale("log" if axes.logy else "linear")
            focus = axes.focus if axes.focus is not None else x != "round"
            xlim = axes.xlim or (x_focus([c for _, cs in curves_per_metric for c in cs], axes.budget)
                                 if focus else None)
            if xlim:
                ax.set_xlim(*(None if axes.logx and v is not None and v <= 0 else v for v in xlim))
            ylim = axes.ylim or (y_focus(curves, xlim) if focus and not axes.logy else None)
            if ylim:
                ax.set_ylim(*ylim)
            ax.grid(alpha=0.3)
        # one subplot: the title is its axes' (a figure title would share the top row with a right legend)
        suptitle = (grid[0][0].set_title(title) if n == 1 else fig.suptitle(title)) if title else None
        renderer = fig.canvas.get_renderer()
        if legend != "none" and n and curves_per_metric[0][1]:
            handles, texts, legend_title = _legend_entries(curves_per_metric[0][1], styles, factors, lw, ms)
            if legend in ("below", "right"):
                _fit_legend(fig, handles, texts, legend_title, legend, renderer)
            else:
                grid[0][0].legend([h for g in handles for h in g], [t for g in texts for t in g], loc=legend,
                                  title=legend_title)
        for ax in grid[0]:
            _fit_text(ax.yaxis.label, fig.bbox.height * 0.6, renderer, "height")
            _fit_text(ax.xaxis.label, fig.bbox.width / n * 0.9, renderer)
        if suptitle is not None:
            _fit_text(suptitle, fig.bbox.width * 0.95, renderer)
    return fig


def plot(paths: list[str], metric: str | list[str], out: str, x: str = "round", title: str | None = None, *,
         labels: list[str] | None = None, legend: str = "below", size: tuple[float, float] = SIZES["default"],
         logx: bool = False, logy: bool = False, axes: Axes | None = None) -> str:
    """Draw each metric against ``x`` for the runs of ``paths`` (files, folders, sweep files) into
    ``out`` (.png, .pdf, .svg); returns ``out``. Rank 0 / a single process only."""
    import matplotlib.pyplot as plt

    check_figure(out, "--out", paths)  # before any work: never over an input or a file that is not a figure
    if legend not in LEGENDS:
        raise InputError(f"--legend: one of {', '.join(LEGENDS)}, got {legend!r}")
    metrics = [metric] if isinstance(metric, str) else list(metric)
    axes = axes or Axes(logx=logx, logy=logy)
    if axes.ylabels and len(axes.ylabels) not in (1, len(metrics)):
        raise InputError(f"--ylabel: {len(axes.ylabels)} given for {len(metrics)} subplots (give one for all, "
                         f"or one per --metric)")
    texts = {"--title": [title] if title else [], "--xlabel": [axes.xlabel] if axes.xlabel else [],
             "--ylabel": list(axes.ylabels or []), "--label": list(labels or [])}
    for option, values in texts.items():
        for text in values:
            check_text(text, option)
    runs, key_labels = _gather(paths)
    axes.budget = shared_budget(runs, x)
    per_metric = [(m, curves_of(runs, m, x, key_labels, axes.budget)) for m in metrics]
    if not any(c for _, c in per_metric):
        raise InputError(f"{', '.join(paths)}: no evaluations to plot (the runs have not evaluated yet)")
    if labels:
        for m, curves in per_metric:
            if len(labels) != len(curves):
                raise InputError(f"--label: {len(labels)} given for {len(curves)} curves of {m} "
                                 f"({'; '.join(c.label for c in curves)})")
            for c, name in zip(curves, labels):
                c.label, c.parts = name, {"label": name}
    else:
        texts["legend"] = [c.label for c in per_metric[0][1]]
        for text in texts["legend"]:
            check_text(text, "legend entry (a sweep's labels: or a config value)")
    _check_log_axes(per_metric, axes)
    fig, said = None, set()
    try:
        with _drawing(texts, size, said):  # matplotlib's warnings: a refusal in one line, or one notice each
            fig = figure(per_metric, x, size=size, legend=legend, title=title, axes=axes)
            fig.canvas.draw()  # every text rendered once, before anything is saved
        with _drawing(texts, size, said, drawn=True):
            return save_figure(fig, out, "--out", paths)
    finally:
        if fig is not None:
            plt.close(fig)


def check_text(text: str, where: str) -> None:
    """Refuse a text that matplotlib cannot typeset: a ``$...$`` that is not valid mathtext
    (matplotlib's subset of TeX) would fail only when the figure is saved, in several lines; a
    text longer than ``MAX_TEXT`` characters."""
    from matplotlib import cbook
    from matplotlib.mathtext import MathTextParser

    if len(text) > MAX_TEXT:  # matplotlib lays out 100,000 characters for minutes before finding no room
        raise InputError(f"{where}: a text of {len(text)} characters, more than the {MAX_TEXT} a figure has room "
                         f"for")
    if not cbook.is_math_text(text):
        return
    try:
        MathTextParser("path").parse(text)
    except ValueError as e:
        at = re.search(r"\(at char (\d+)\)", str(e))
        where_in = f" at character {at.group(1)}" if at else ""
        raise InputError(f"{where}: {_quoted(text)} is not valid mathtext (matplotlib's TeX between $ signs)"
                         f"{where_in}; write \\$ for a dollar sign") from None


def _quoted(text: str) -> str:
    """A text as typed, in quotes, on one line (a message quotes it)."""
    return "'" + text.replace("\n", "\\n") + "'"


def _check_log_axes(per_metric: list[tuple[str, list[Curve]]], axes: Axes) -> None:
    """A log axis needs positive values (matplotlib would warn and draw an empty axis) and limits."""
    for flag, option, lim, values in (
            ("logx", "--logx", axes.xlim, lambda c: c.x), ("logy", "--logy", axes.ylim, lambda c: c.mean)):
        if not getattr(axes, flag):
            continue
        if lim and any(v is not None and v <= 0 for v in lim):
            raise InputError(f"--{option[5]}lim: a log axis ({option}) needs positive limits, got {lim}")
        for metric, curves in per_metric:
            if curves and not any(np.any(values(c) > 0) for c in curves):
                what = "x values" if flag == "logx" else names.metric(metric)
                raise InputError(f"{option}: {what} has no positive values to draw on a log axis")


_GLYPH = re.compile(r"Glyph (\d+) .*missing from (?:current )?font")


@contextlib.contextmanager
def _drawing(texts: dict[str, list[str]], size: tuple[float, float], said: set[str],
             drawn: bool = False) -> Iterator[None]:
    """Draw (``drawn``: save) the figure with matplotlib's warnings caught: a text the font has no
    glyph for and texts that leave the axes no room are refused in one line (before the figure is
    saved: the drawing step renders the figure once); anything else is one notice each (``said``:
    the notices given already)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        message = str(w.message).strip().splitlines()[0] if str(w.message).strip() else type(w.message).__name__
        if message in said:
            continue
        said.add(message)
        glyph = _GLYPH.search(message)
        if glyph and not drawn:
            char = chr(int(glyph.group(1)))
            where = next((f"{k} {_quoted(t)}" for k, ts in texts.items() for t in ts if char in t), "a text")
            raise InputError(f"{where}: the font has no glyph for {char!r} (U+{ord(char):04X}); set a font that has "
                             f"it (matplotlibrc font.family) or leave the character out")
        if "constrained_layout not applied" in message and not drawn:
            raise InputError(f"--size: {size[0]:g} x {size[1]:g} in leaves the axes no room beside their texts "
                             f"(labels, title, legend): enlarge it or shorten the texts")
        if not glyph:
            log.warning("fedmpi plot: matplotlib: %s", message)
# ----------------------------------------------------------------------------- command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", help="result files, folders (every .h5 below) or sweep files")
    parser.add_argument("--metric", default="test_acc", help="metric, or several comma-separated (one subplot each)")
    parser.add_argument("--x", default="round", help="x axis: round, sim_delay, wall_time or time (the clock's "
                                                     "virtual seconds)")
    parser.add_argument("--out", required=True, help="figure file (.png, .pdf, .svg)")
    parser.add_argument("--title", help="the figure's title (none by default)")
    parser.add_argument("--xlabel", help="x axis label (default: the x axis in words, e.g. round)")
    parser.add_argument("--ylabel", dest="ylabels", action="append", metavar="TEXT",
                        help="y axis label (default: the metric in words, e.g. test accuracy); once for every "
                             "subplot, or repeated once per --metric")
    parser.add_argument("--xlim", metavar="LOW,HIGH", help="x axis limits (either may be empty: 10, or ,200)")
    parser.add_argument("--ylim", metavar="LOW,HIGH", help="y axis limits of every subplot (e.g. 0.5,1 or 0.5,)")
    parser.add_argument("--label", dest="labels", action="append", metavar="NAME",
                        help="name of the next curve, in the order of the default legend; repeat for each curve")
    parser.add_argument("--legend", default="below",
                        help="below (default) or right of the axes, none, or inside at a matplotlib location "
                             "(best, upper left, ...)")
    parser.add_argument("--size", default="default", help="column (3.4x2.6 in), page (7x3 in), default "
                                                          "(6.4x4.2 in) or WIDTH,HEIGHT in inches")
    parser.add_argument("--range", choices=("focus", "all"),
                        help="what an axis without --xlim/--ylim shows: focus = where the curves differ (x: to "
                             "the shared budget, else a quarter beyond the time the slowest curve settles; y: "
                             "the values held over 95%% of that time), all = every point; default focus for "
                             "--x time, wall_time and sim_delay, all for round")
    parser.add_argument("--logx", action="store_true", help="logarithmic x axis")
    parser.add_argument("--logy", action="store_true", help="logarithmic y axis")


def run_cli(args: argparse.Namespace) -> int:
    if args.x not in XLABELS:
        raise InputError(f"--x: must be round, sim_delay, wall_time or time, got {args.x!r}")
    metrics = [m.strip() for m in args.metric.split(",") if m.strip()]
    if not metrics:
        raise InputError("--metric: empty")
    axes = Axes(args.xlabel, args.ylabels, parse_limits(args.xlim, "--xlim"), parse_limits(args.ylim, "--ylim"),
                args.logx, args.logy, focus=None if args.range is None else args.range == "focus")
    print(plot(args.inputs, metrics, args.out, x=args.x, title=args.title, labels=args.labels, legend=args.legend,
               size=parse_size(args.size), axes=axes))
    return 0
