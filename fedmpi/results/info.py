"""``fedmpi info RUN.h5``: status, rounds done, last metrics and the config of a run."""

from __future__ import annotations

import numpy as np

from .hdf5 import read_metrics


def describe(path: str, show_config: bool = True) -> str:
    metrics, attrs = read_metrics(path)
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
            val = v[-1]
            lines.append(f"  {k:<22} {int(val) if k == 'round' else (f'{val:.6g}' if np.isfinite(val) else val)}")
    if show_config:
        lines.append("config:")
        lines += ["  " + ln for ln in str(attrs.get("config", "")).rstrip().splitlines()]
    return "\n".join(lines)
