"""``fedmpi table``: one number per run, mean +/- std over seeds, rows and columns by config keys.

    fedmpi table configs/unavailability/fmnist_sine.sweep.yaml          # the sweep's own table spec
    fedmpi table runs/x/ --rows algorithm.name --metric test_acc --last 5 --scale 100 --format latex

Per run a metric is reduced to one number: the mean of its last K evaluations (``last``), the
value in force at an x (``at``: the last evaluation with x <= that value, x = round by default,
or ``sim_delay``...), the mean over a window of x (``window: [lo, hi]``), the best value
(``best: max|min``), or the rounds to reach a target (``rounds_to: V``, ``--rounds-to test_acc=0.8``:
the first x whose value is >= V, or <= V with ``goal: at_most`` / ``test_loss<=0.3``; NaN
when never reached, so such runs are left out of the cell's mean and its n counts those that
reached); ``time_to: V`` (``--time-to test_acc=0.8``) is the same with x = ``time``, the virtual
seconds of a run with a clock (``fedmpi.clock``). ``scale`` multiplies metric values, never such
counts of x (V is in the metric's own units). A sweep's ``table:`` and the command line share these
names (docs/SWEEPS.md, "Tables"); a column's header carries its unit (``time to test_acc >= 0.8 (s)``).
Runs are grouped by the row and column keys; a group's cell is the mean +/- standard deviation
(numpy's, ddof = 0) of its runs' numbers, one run per seed. Runs of one group must not differ in
any other result-defining key (``reader.is_result_key``): such a table would silently average
different experiments, so it is refused, naming the key. A run whose config cannot be read cannot
be grouped at all: refused, naming the file.

Markdown and LaTeX head the key columns with readable names and show values by their labels
(``results/names.py``: a sweep's ``labels:``, else the key's shortest distinct tail); CSV keeps
the dotted keys and the values as they are, for scripts.

A sweep's ``table:`` section holds the same settings (rows, cols, metrics with per-metric
last/at/window/best, scale, digits, label, bold); command-line options replace them.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import stat
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from . import names
from .hdf5 import is_locked
from .reader import Result, is_result_key, load

FORMATS = ("md", "csv", "latex")
_METRIC_KEYS = ("metric", "last", "at", "window", "best", "rounds_to", "time_to", "goal", "x", "scale", "digits",
                "label", "bold")
#: units of the metrics and x axes that have one, shown in column headers
UNITS = {"time": "s", "wall_time": "s", "peak_rss_mb": "MB"}
_TABLE_KEYS = ("rows", "cols", "metrics", "format")
MAX_DIGITS = 17  # a float64 has at most 17 significant decimals


@dataclass
class MetricSpec:
    """How one column's number is taken from a run."""

    metric: str
    last: int | None = None
    at: float | None = None
    window: tuple[float, float] | None = None
    best: str | None = None
    rounds_to: float | None = None
    goal: str = "at_least"
    x: str = "round"
    scale: float = 1.0
    digits: int = 4
    label: str | None = None
    bold: str | None = None

    @property
    def title(self) -> str:
        """The column's header: its label, else what it is, with its unit (``(s)``: seconds)."""
        if self.label:
            return self.label
        if self.rounds_to is not None:  # a count of x: x's unit (virtual seconds for time)
            x = self.x if self.x in UNITS else f"{self.x}s"
            return _with_unit(f"{x} to {self.metric} {'>=' if self.goal == 'at_least' else '<='} "
                              f"{self.rounds_to:g}", UNITS.get(self.x))
        how = (f"at {self.x} {self.at:g}" if self.at is not None else f"{self.best}" if self.best
               else f"last {self.last}" if self.last and self.last > 1 else "")
        if self.window is not None:
            how = f"{how or 'mean'} of {self.x} {self.window[0]:g}..{self.window[1]:g}"
        unit = UNITS.get(self.metric) if self.scale == 1 else None  # a scaled value's unit is the user's
        return _with_unit(f"{self.metric} ({how})" if how else self.metric, unit)

    def value(self, r: Result) -> float | None:
        """This run's number (None when the run has no such metric)."""
        if self.metric not in r.metrics:
            return None
        if self.x not in r.metrics:
            raise InputError(f"{r.path}: has no metric {self.x!r} for the x axis (has: {', '.join(sorted(r.metrics))})")
        with np.errstate(all="ignore"), warnings.catch_warnings():  # NaN/inf runs are numbers too
            warnings.simplefilter("ignore", RuntimeWarning)
            return self._value(r)

    def _value(self, r: Result) -> float:
        y, x = r.metrics[self.metric].astype(float), r.metrics[self.x].astype(float)
        if self.window is not None:
            keep = (x >= self.window[0]) & (x <= self.window[1])
            y, x = y[keep], x[keep]
        if y.size == 0:
            return math.nan
        if self.at is not None:
            before = np.flatnonzero(x <= self.at)
            return float(y[before[-1]]) * self.scale if before.size else math.nan
        if self.best is not None:
            return float(np.nanmax(y) if self.best == "max" else np.nanmin(y)) * self.scale
        if self.rounds_to is not None:  # a count of x: not scaled like the metric's values
            hit = np.flatnonzero(y >= self.rounds_to if self.goal == "at_least" else y <= self.rounds_to)
            return float(x[hit[0]]) if hit.size else math.nan
        k = self.last if self.last is not None else (y.size if self.window is not None else 1)
        return float(np.mean(y[-k:])) * self.scale


def _with_unit(title: str, unit: str | None) -> str:
    return f"{title} ({unit})" if unit else title


def _finite(value: Any) -> float:
    """A finite number from a table setting (ValueError otherwise: nan and inf are no targets)."""
    if isinstance(value, bool):
        raise ValueError
    x = float(value)
    if not math.isfinite(x):
        raise ValueError
    return x


def metric_spec(data: Any, where: str, options: dict[str, str] | None = None) -> MetricSpec:
    """A MetricSpec from a sweep's table entry (a metric name or a mapping); ``options`` names the
    keys that came from the command line as written there (``{"last": "--last"}``) for messages."""
    if isinstance(data, str):
        data = {"metric": data}
    if not isinstance(data, dict) or not isinstance(data.get("metric"), str):
        raise InputError(f"{where}: must be a metric name or a mapping with 'metric', got {data!r}")
    for k in data:
        if k not in _METRIC_KEYS:
            raise InputError(f"{where}.{k}: unknown key (allowed: {', '.join(_METRIC_KEYS)})")
    if data.get("time_to") is not None:  # rounds_to on the clock's x axis, the command line's --time-to
        if data.get("rounds_to") is not None:
            raise InputError(f"{where}: give one of rounds_to, time_to (time_to is rounds_to with x: time)")
        if data.get("x", "time") != "time":
            raise InputError(f"{where}.x: time_to counts virtual seconds (x: time), got x: {data['x']!r}; "
                             f"use rounds_to with x: {data['x']}")
        data = {**{k: v for k, v in data.items() if k != "time_to"}, "rounds_to": data["time_to"], "x": "time"}
        said = {"rounds_to": f"{where}.time_to"}  # messages name the key the user wrote
    else:
        said = {}
    said = {**{k: f"{where}.{k}" for k in data}, **said, **(options or {})}
    s = MetricSpec(data["metric"])
    for k, what in (("last", "an integer >= 1"), ("at", "a finite number"), ("rounds_to", "a finite number"),
                    ("window", "[LOW, HIGH], finite numbers with LOW <= HIGH"), ("scale", "a finite number"),
                    ("digits", f"an integer in 0..{MAX_DIGITS}")):
        if data.get(k) is None:
            continue
        try:
            v = data[k]
            if k == "last":
                s.last = int(v)
                if s.last < 1 or isinstance(v, bool) or s.last != v:
                    raise ValueError
            elif k == "window":
                lo, hi = (_finite(x) for x in v)
                if lo > hi:
                    raise ValueError
                s.window = (lo, hi)
            elif k == "digits":
                s.digits = int(v)
                if not 0 <= s.digits <= MAX_DIGITS or isinstance(v, bool) or s.digits != v:
                    raise ValueError
            else:
                setattr(s, k, _finite(v))
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"{said[k]}: must be {what}, got {data[k]!r}") from None
    if data.get("digits") is None:
        s.digits = 1 if s.rounds_to is not None else 4
    for k, allowed in (("best", ("max", "min")), ("bold", ("max", "min")), ("goal", ("at_least", "at_most"))):
        v = data.get(k)
        if v is not None and v not in allowed:
            raise InputError(f"{said[k]}: must be {' or '.join(allowed)}, got {v!r}")
    s.best, s.bold, s.goal = data.get("best"), data.get("bold"), data.get("goal", "at_least")
    if sum(v is not None for v in (s.last, s.at, s.best, s.rounds_to)) > 1:
        raise InputError(f"{where}: give one of last, at, best, rounds_to")
    s.x = str(data.get("x", "round"))
    s.label = None if data.get("label") is None else str(data["label"])
    return s


# ----------------------------------------------------------------------------- inputs

@dataclass
class Run:
    result: Result
    keys: dict[str, Any]     # flat config plus 'variant' (sweep cells)


def _is_sweep(path: str) -> bool:
    return path.endswith((".yaml", ".yml")) and os.path.isfile(path)


def _started(path: str) -> bool:
    """Whether a sweep cell's or a folder's file is a run (an empty one no run holds was left by
    a run killed in set-up: not completed)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return not stat.S_ISREG(st.st_mode) or st.st_size > 0 or is_locked(path)  # (load refuses a non-file)


@dataclass
class Gathered:
    """What ``gather`` found: the runs, the table spec of a single sweep, whether runs came from a
    sweep (keeps the cells' order), where it looked (for the messages that found nothing), and
    the sweeps' labels of keys and values."""

    runs: list[Run]
    spec: dict
    from_sweep: bool
    looked: list[str]
    labels: dict[str, names.KeyLabel] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return "looked in " + "; ".join(self.looked)


def gather(inputs: list[str], partial: bool = False, folder: str | None = None) -> Gathered:
    """The runs of files, folders (every .h5 below) and sweep files (their cells' files). A run's
    ``variant`` is its sweep cell's variant, else the label its file records (``runtime.label``)."""
    runs: list[Run] = []
    spec: dict = {}
    labels: dict[str, names.KeyLabel] = {}
    from_sweep = False
    skipped = 0
    looked: list[str] = []
    for inp in inputs:
        if _is_sweep(inp):
            from .sweepfile import cell_state, load as load_sweep, why_outdated

            sweep = load_sweep(inp, folder, validate=False)  # only completed cells' configs are compared
            spec = sweep.table if len(inputs) == 1 else {}
            labels = {**sweep.labels, **labels}
            from_sweep = True
            looked.append(f"{sweep.folder} ({len(sweep.cells)} cell files of {inp})")
            for c in sweep.cells:
                if cell_state(c)[0] == "outdated":
                    print(f"fedmpi table: left out {c.path}: {why_outdated(c)}", file=sys.stderr)
                elif _started(c.path):
                    runs.append(Run(load(c.path), {"variant": c.title if c.title is not None else c.variant}))
        elif os.path.isdir(inp):
            looked.append(inp)
            files = sorted(glob.glob(os.path.join(inp, "**", "*.h5"), recursive=True))
            if not files:
                raise InputError(f"{inp}: no .h5 result files in this folder")
            runs += [Run(load(f), {}) for f in files if _started(f)]
            skipped += sum(not _started(f) for f in files)
        else:
            looked.append(inp)
            runs.append(Run(load(inp), {}))
    kept = []
    for r in runs:
        if r.result.status != "completed" and not (partial and r.result.status != "starting"):
            skipped += 1
            continue
        r.result.require_config()
        r.keys = {**r.result.flat_config(), "variant": r.result.label or None, **r.keys}
        kept.append(r)
    found = Gathered(kept, spec, from_sweep, looked, labels)
    if skipped and not kept:
        raise InputError(f"table: no completed runs to tabulate ({skipped} not completed; --partial includes them; "
                         f"{found.where})")
    if skipped:
        print(f"fedmpi table: left out {skipped} runs that are not completed (--partial includes them)",
              file=sys.stderr)
    return found


# ----------------------------------------------------------------------------- the table

def _order(values: list[tuple], keep_order: bool) -> list[tuple]:
    uniq = list(dict.fromkeys(values))
    if keep_order:
        return uniq
    return sorted(uniq, key=lambda t: tuple((0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool)
                                            else (1, 0, str(v)) for v in t))


class _List(tuple):
    """A list-valued key (availability.base.values, train.augment) as a group key: hashable,
    printed as the list it is."""

    def __str__(self) -> str:
        return "[" + ", ".join(map(str, self)) + "]"


def _frozen(v: Any) -> Any:
    if isinstance(v, list):
        return _List(_frozen(x) for x in v)
    if isinstance(v, dict):
        return _List((k, _frozen(x)) for k, x in sorted(v.items(), key=lambda kv: str(kv[0])))
    return v


def _fmt(v: Any) -> str:
    return "-" if v is None else str(v)


@dataclass
class Table:
    row_keys: list[str]
    headers: list[str]                        # one per (metric, column group)
    rows: list[tuple]                         # row key values
    cells: list[list[list[float]]]            # [row][column] -> the runs' numbers
    specs: list[MetricSpec]                   # per column
    titles: list[str] = field(default_factory=list)  # headers with readable key names and value labels
    labels: dict[str, names.KeyLabel] = field(default_factory=dict)

    def stats(self, i: int, j: int) -> tuple[float, float, int] | None:
        xs = [x for x in self.cells[i][j] if x is not None and not math.isnan(x)]
        if not xs:
            return None
        a = np.asarray(xs, dtype=float)
        with np.errstate(all="ignore"):  # inf - inf in the std is NaN, without a warning
            return float(a.mean()), float(a.std()), len(xs)

    def key_headers(self) -> list[str]:
        """The row keys' readable names (a sweep's labels first)."""
        shown = names.key_names(self.row_keys, self.labels)
        return [shown[k] for k in self.row_keys]

    def row_texts(self, i: int) -> list[str]:
        """Row ``i``'s key values by their labels."""
        return [names.value_text(k, v, self.labels) for k, v in zip(self.row_keys, self.rows[i])]


def build(runs: list[Run], rows: list[str], cols: list[str], specs: list[MetricSpec], keep_order: bool,
          labels: dict[str, names.KeyLabel] | None = None) -> Table:
    """Group ``runs`` by ``rows`` x ``cols`` and reduce each run with every spec."""
    if not runs:
        raise InputError("table: no completed runs to tabulate")
    for key in rows + cols:
        if key == "variant" and not any(r.keys.get(key) for r in runs):
            raise InputError("--rows/--cols: variant: these runs have none (a sweep's variants, or runtime.label)")
        if not any(key in r.keys for r in runs):
            raise InputError(f"--rows/--cols: {key}: not a config key of these runs")
    groups: dict[tuple[tuple, tuple], list[Run]] = {}
    for r in runs:
        rk = tuple(_frozen(r.keys.get(k)) for k in rows)
        ck = tuple(_frozen(r.keys.get(k)) for k in cols)
        groups.setdefault((rk, ck), []).append(r)
    grouped = set(rows) | set(cols) | {"seed"}
    for (rk, ck), members in groups.items():
        _check_same_experiment(members, grouped, rk + ck)
    row_vals = _order([g[0] for g in groups], keep_order)
    col_vals = _order([g[1] for g in groups], keep_order)
    shown = names.key_names(rows + cols, labels)
    headers, titles, col_specs, col_of = [], [], [], []
    for s in specs:
        for cv in col_vals:
            where = ", ".join(f"{k}={_fmt(v)}" for k, v in zip(cols, cv))
            readable = ", ".join(names.assignment(k, v, shown, labels) for k, v in zip(cols, cv))
            headers.append(f"{s.title} [{where}]" if where else s.title)
            titles.append(f"{s.title} [{readable}]" if readable else s.title)
            col_specs.append(s)
            col_of.append(cv)
    cells = [[[s.value(r.result) for r in groups.get((rv, cv), [])] for s, cv in zip(col_specs, col_of)]
             for rv in row_vals]
    return Table(rows, headers, row_vals, cells, col_specs, titles, dict(labels or {}))


def _check_same_experiment(members: list[Run], grouped: set[str], where: tuple) -> None:
    ref = members[0].result.experiment()
    seeds: dict[Any, str] = {}
    for r in members:
        exp = r.result.experiment()
        for k in sorted(set(ref) | set(exp)):
            if k not in grouped and repr(ref.get(k)) != repr(exp.get(k)):
                raise InputError(f"table: {members[0].result.path} and {r.result.path} fall into one cell "
                                 f"({', '.join(map(_fmt, where)) or 'all runs'}) but differ in {k} "
                                 f"({ref.get(k)!r} vs {exp.get(k)!r}); add it to --rows or --cols")
        if r.result.seed in seeds:
            raise InputError(f"table: {seeds[r.result.seed]} and {r.result.path} are the same experiment "
                             f"and seed ({r.result.seed}); give each run once")
        seeds[r.result.seed] = r.result.path


# ----------------------------------------------------------------------------- output

def _number(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def _best_cells(t: Table) -> set[tuple[int, int]]:
    out = set()
    for j, s in enumerate(t.specs):
        if s.bold is None:
            continue
        vals = [(st[0], i) for i in range(len(t.rows)) if (st := t.stats(i, j)) is not None]
        if vals:
            best = (max if s.bold == "max" else min)(vals)[0]
            out |= {(i, j) for v, i in vals if v == best}
    return out


def _text_cells(t: Table, pm: str, math_: str, bold) -> list[list[str]]:
    """Cell texts: 'mean<pm>std' (just the mean for one run) inside ``math_`` ('$' for LaTeX),
    ``bold`` around the best of a column with ``bold:``, ' (n=K)' where fewer runs than elsewhere."""
    full = max((len(t.cells[i][j]) for i in range(len(t.rows)) for j in range(len(t.headers))), default=0)
    best = _best_cells(t)
    out = []
    for i in range(len(t.rows)):
        line = []
        for j, s in enumerate(t.specs):
            st = t.stats(i, j)
            if st is None:
                line.append("-")
                continue
            mean, std, n = st
            text = _number(mean, s.digits) + (f"{pm}{_number(std, s.digits)}" if n > 1 else "")
            text = math_ + (bold(text) if (i, j) in best else text) + math_
            line.append(text + (f" (n={n})" if n < full else ""))
        out.append(line)
    return out


def markdown(t: Table) -> str:
    head = [*t.key_headers(), *t.titles]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, cells in enumerate(_text_cells(t, " +/- ", "", lambda s: f"**{s}**")):
        lines.append("| " + " | ".join([*t.row_texts(i), *cells]) + " |")
    return "\n".join(lines)


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "$": r"\$",
        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _tex(s: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in s)


def latex(t: Table) -> str:
    head = [*t.key_headers(), *t.titles]
    lines = [r"\begin{tabular}{" + "l" * len(t.row_keys) + "c" * len(t.headers) + "}", r"\hline",
             " & ".join(_tex(h) for h in head) + r" \\", r"\hline"]
    for i, cells in enumerate(_text_cells(t, r" \pm ", "$", lambda s: r"\mathbf{" + s + "}")):
        lines.append(" & ".join([*(_tex(v) for v in t.row_texts(i)), *cells]) + r" \\")
    lines += [r"\hline", r"\end{tabular}"]
    return "\n".join(lines)


def csv_text(t: Table) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*t.row_keys, *(f"{h} {part}" for h in t.headers for part in ("mean", "std", "n"))])
    for i, rv in enumerate(t.rows):
        vals: list[Any] = []
        for j in range(len(t.headers)):
            st = t.stats(i, j)
            vals += ["", "", 0] if st is None else [repr(st[0]), repr(st[1]), st[2]]
        w.writerow([*map(_fmt, rv), *vals])
    return buf.getvalue().rstrip("\n")


def render(t: Table, fmt: str) -> str:
    return {"md": markdown, "csv": csv_text, "latex": latex}[fmt](t)


# ----------------------------------------------------------------------------- CLI

def _keys(text: str | list | None) -> list[str] | None:
    if text is None:
        return None
    if isinstance(text, list):
        return [str(k) for k in text]
    return [k.strip() for k in str(text).split(",") if k.strip()]


def _default_rows(runs: list[Run], cols: list[str]) -> list[str]:
    """The variant (when runs have one) and the result keys that still differ between runs of
    one variant: what tells the experiments apart."""
    flat = [r.keys for r in runs]
    variants = {f.get("variant") for f in flat}
    keys = list(dict.fromkeys(k for f in flat for k in f))
    differ = [k for k in keys if is_result_key(k) and k not in cols and k != "variant"
              and any(len({repr(f.get(k)) for f in flat if f.get("variant") == v}) > 1 for v in variants)]
    return (["variant"] if variants - {None} and "variant" not in cols else []) + differ


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Mean +/- std over seeds of a metric, one row per value of the --rows keys. "
                          "Inputs: result files, folders (every .h5 below) or a sweep file (its cells and "
                          "its table: section).")
    parser.add_argument("inputs", nargs="+", help="result files, folders, or a sweep file")
    parser.add_argument("--rows", help="comma-separated config keys (or 'variant' for a sweep's variants, also "
                                       "of its files read alone); default: the variants and the result keys "
                                       "that differ within a variant")
    parser.add_argument("--cols", help="comma-separated config keys whose values make column groups")
    parser.add_argument("--metric", action="append", help="metric (repeatable; default test_acc, else test_loss)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--last", type=int, help="mean of the last K evaluations of each run (default 1)")
    how.add_argument("--at", type=float, help="value in force at this x (the last evaluation with x <= AT)")
    how.add_argument("--best", choices=("max", "min"), help="best value of each run")
    parser.add_argument("--rounds-to", action="append", metavar="METRIC=V",
                        help="rounds to reach a target (repeatable): METRIC=V or METRIC>=V (>= V), "
                             "METRIC<=V (<= V, for losses); NaN when never reached")
    parser.add_argument("--time-to", action="append", metavar="METRIC=V",
                        help="virtual seconds (the clock's metric time) to reach a target (repeatable), as "
                             "--rounds-to; NaN when never reached")
    parser.add_argument("--window", metavar="LOW,HIGH", help="only the evaluations with LOW <= x <= HIGH (the mean "
                                                             "of them, or with --last/--best of those)")
    parser.add_argument("--x", default=None, help="x axis of --at, --window and --rounds-to (round, time, "
                                                  "sim_delay, ...; default round)")
    parser.add_argument("--scale", type=float, help="multiply metric values (100 for percent; not --rounds-to "
                                                     "counts, whose targets stay in the metric's units)")
    parser.add_argument("--digits", type=int, help="decimals shown (default 4)")
    parser.add_argument("--format", choices=FORMATS, help="md (default), csv or latex")
    parser.add_argument("--partial", action="store_true", help="also use runs that are not completed")
    parser.add_argument("--folder", help="result folder of a sweep that was run with fedmpi sweep --out FOLDER")


def _specs(args: argparse.Namespace, spec: dict, runs: list[Run]) -> list[MetricSpec]:
    window = None if args.window is None else _window(args.window)
    cli = {k: v for k, v in (("last", args.last), ("at", args.at), ("best", args.best), ("x", args.x),
                             ("window", window), ("scale", args.scale), ("digits", args.digits)) if v is not None}
    options = {k: f"--{k}" for k in cli}  # a bad value names the option that gave it
    for k, v in cli.items():  # each checked, also where it does not apply (--last beside --rounds-to only)
        metric_spec({"metric": "", k: v}, options[k], options)
    targets = [_target(t, cli) for t in args.rounds_to or ()]  # columns after the others
    targets += [_target(t, {**cli, "x": "time"}, "--time-to") for t in args.time_to or ()]
    if args.metric:
        return [metric_spec({"metric": m, **cli}, f"--metric {m}", options) for m in args.metric] + targets
    if targets and spec.get("metrics") is None:
        return targets
    entries = spec.get("metrics")
    if entries is None:
        first = runs[0].result.metrics if runs else {}
        entries = ["test_acc" if "test_acc" in first else "test_loss"]
    if not isinstance(entries, list) or not entries:
        raise InputError("table.metrics: must be a non-empty list")
    out = []
    for i, e in enumerate(entries):
        e = {"metric": e} if isinstance(e, str) else dict(e) if isinstance(e, dict) else e
        if isinstance(e, dict) and cli:
            if {"last", "at", "best"} & set(cli):  # the command line's reduction replaces the entry's
                for k in ("last", "at", "best", "rounds_to", "time_to", "goal"):
                    e.pop(k, None)
            e.update({k: v for k, v in cli.items() if not (k == "x" and e.get("time_to") is not None)})
        out.append(metric_spec(e, f"table.metrics[{i}]", options))
    return out + targets


def _window(text: str) -> list[float]:
    """``--window LOW,HIGH`` -> [low, high] (finite, LOW <= HIGH)."""
    try:
        lo, hi = (_finite(v) for v in text.split(","))
        if lo > hi:
            raise ValueError
    except ValueError:
        raise InputError(f"--window: LOW,HIGH, finite numbers with LOW <= HIGH, got {text!r}") from None
    return [lo, hi]


def _target(text: str, cli: dict, option: str = "--rounds-to") -> MetricSpec:
    """A ``--rounds-to`` (``--time-to``) column: ``METRIC=V``, ``METRIC>=V`` or ``METRIC<=V``."""
    for op, goal in (("<=", "at_most"), (">=", "at_least"), ("=", "at_least")):
        name, sep, value = text.partition(op)
        if sep and name.strip():
            if not value.strip():
                raise InputError(f"{option} {text}: the target value is missing after {op!r} (e.g. {name.strip()}"
                                 f"{op}0.8)")
            try:
                target = _finite(value)
            except ValueError:
                raise InputError(f"{option} {text}: the target must be a finite number, got {value.strip()!r}") \
                    from None
            keep = {k: v for k, v in cli.items() if k not in ("last", "at", "best", "window")}
            entry = {"metric": name.strip(), "rounds_to": target, "goal": goal, **keep}
            return metric_spec(entry, f"{option} {text}", {k: f"--{k}" for k in keep})
    raise InputError(f"{option} {text}: must be METRIC=V, METRIC>=V or METRIC<=V (e.g. test_acc=0.8)")


def run_cli(args: argparse.Namespace) -> int:
    found = gather(args.inputs, args.partial, args.folder)
    if not found.runs:
        raise InputError(f"table: no completed runs to tabulate ({found.where})")
    runs, spec, from_sweep = found.runs, found.spec, found.from_sweep
    for k in spec:
        if k not in _TABLE_KEYS:
            raise InputError(f"table.{k}: unknown key (allowed: {', '.join(_TABLE_KEYS)})")
    cols = _keys(args.cols) if args.cols is not None else (_keys(spec.get("cols")) or [])
    rows = _keys(args.rows) if args.rows is not None else _keys(spec.get("rows"))
    if rows is None:
        rows = _default_rows(runs, cols)
    fmt = args.format or spec.get("format", "md")
    if fmt not in FORMATS:
        raise InputError(f"table.format: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    table = build(runs, rows, cols, _specs(args, spec, runs), keep_order=from_sweep, labels=found.labels)
    print(render(table, fmt))
    return 0
