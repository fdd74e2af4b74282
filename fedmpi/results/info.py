"""``fedmpi info RUN.h5 [MORE.h5 ...]``: status, rounds, last metrics and config of runs.

With several files the output is one column per file: status and rounds first, then the
config keys whose values differ between the files, then the last metrics, then (unless
``--no-config``) the keys they share.
"""

from __future__ import annotations

import numpy as np

from .reader import Result, load


def _num(k: str, val) -> str:
    if k == "round":
        return str(int(val))
    return f"{val:.6g}" if np.isfinite(val) else str(val)


def describe(path: str, show_config: bool = True) -> str:
    r = load(path)
    attrs, metrics = r.attrs, r.metrics
    lines = [f"file:       {path}",
             f"status:     {attrs.get('status')}",
             f"rounds:     {attrs.get('rounds_done')}",
             f"world size: {attrs.get('world_size')}   seed: {attrs.get('seed')}   "
             f"fedmpi {attrs.get('fedmpi_version')}"]
    n = len(metrics.get("round", []))
    lines.append(f"evaluations: {n}")
    if n:
        lines.append("last metrics:")
        for k, v in metrics.items():
            lines.append(f"  {k:<22} {_num(k, v[-1])}")
    if show_config:
        lines.append("config:")
        lines += ["  " + ln for ln in str(attrs.get("config", "")).rstrip().splitlines()]
    return "\n".join(lines)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def compare(paths: list[str], show_config: bool = True) -> str:
    """Several result files side by side, the config keys that differ first."""
    runs: list[Result] = [load(p) for p in paths]
    flats = [r.flat_config() for r in runs]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    differ = [k for k in keys if len({repr(f.get(k, "-")) for f in flats}) > 1]
    blank = [""] * len(runs)
    rows = [["file", *paths],
            ["status", *(r.status for r in runs)],
            ["rounds", *(str(r.rounds_done) for r in runs)],
            ["world size", *(str(r.attrs.get("world_size")) for r in runs)],
            ["differing config keys:", *blank]]
    rows += [[f"  {k}", *(str(f.get(k, "-")) for f in flats)] for k in differ] or [["  (none)", *blank]]
    rows.append(["last metrics:", *blank])
    for k in dict.fromkeys(["round", *(k for r in runs for k in r.metrics)]):
        rows.append([f"  {k}", *(_num(k, r.metrics[k][-1]) if len(r.metrics.get(k, ())) else "-" for r in runs)])
    lines = _table(rows)
    if show_config:
        lines.append("same in all files:")
        lines += [f"  {k}: {flats[0].get(k)}" for k in keys if k not in differ]
    return "\n".join(lines)
