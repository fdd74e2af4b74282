"""Copies of the metric rows outside the HDF5 file: a CSV file and TensorBoard scalars.

Both are optional (``runtime.csv``, ``runtime.tensorboard``: ``fedmpi.outputs.SidecarParams``) and
written by rank 0 next to the result file, one row per evaluation as it happens; the HDF5 file stays
the reference. On resume the CSV is rewritten from the rows the result file kept, so it never holds rows of the rounds
that are run again. An existing ``RUN.csv`` is replaced only when it is a metric CSV and the run
continues or overwrites a result file at ``RUN.h5``; anything else there (a trace, a config, a
user's file) is refused before the run starts (outfiles.py).
"""

from __future__ import annotations

import csv
import importlib.util
import math
import os
from typing import Any

import numpy as np

from ..errors import InputError, WriteFailed
from .outfiles import AtomicFile, check_target, is_metric_csv


def csv_path(result_path: str) -> str:
    """``runs/x.h5`` -> ``runs/x.csv``."""
    stem = result_path[:-3] if result_path.endswith(".h5") else result_path
    return stem + ".csv"


def csv_value(name: str, v: Any) -> str:
    """One CSV field: rounds as integers, metrics in full precision, NaN as empty."""
    if name == "round":
        return str(int(v))
    v = float(v)
    return "" if math.isnan(v) else repr(v)


class CsvSidecar:
    """``RUN.csv``: a header of metric names, then one line per evaluation (flushed at once)."""

    def __init__(self, path: str, replace: bool = False):
        """Refuses a ``path`` that holds anything but a metric CSV this run may ``replace``."""
        check_target(path, "runtime.csv", replaceable=is_metric_csv if replace else None,
                     advice="move it away, or set runtime.csv: false" if replace else
                     "move it away, set runtime.csv: false, or --overwrite if it is this run's old CSV")
        self.path = path
        self.fh = None

    def start(self, names: list[str], rows: dict[str, np.ndarray]) -> None:
        out = AtomicFile(self.path, "runtime.csv")
        self.fh, self.names = out.fh, names
        self.w = csv.writer(self.fh)
        try:
            self.w.writerow(names)
            for i in range(len(rows.get("round", []))):
                self.w.writerow([csv_value(k, rows[k][i]) for k in names])
        except OSError as e:
            out.discard()
            raise out.error(e) from None
        out.commit()  # the rows so far are in place; later rows go to the same (renamed) file

    def row(self, row: dict[str, float]) -> None:
        try:
            self.w.writerow([csv_value(k, row.get(k, math.nan)) for k in self.names])
            self.fh.flush()
        except OSError as e:
            raise WriteFailed(f"runtime.csv: cannot write {self.path} ({e.strerror or e}); the result file "
                              f"keeps every row: fedmpi export rewrites the CSV") from None

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


class TensorBoardSidecar:
    """Scalars ``metrics/<name>`` at step = rounds done, under ``runtime.tensorboard``/<run>."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.w = None

    def start(self, names: list[str], rows: dict[str, np.ndarray]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(log_dir=self.log_dir)

    def row(self, row: dict[str, float]) -> None:
        step = int(row["round"])
        for k, v in row.items():
            if k != "round" and v is not None and not math.isnan(float(v)):
                self.w.add_scalar(f"metrics/{k}", float(v), step)
        self.w.flush()

    def close(self) -> None:
        if self.w is not None:
            self.w.close()


def tensorboard_dir(root: str, result_path: str) -> str:
    """One TensorBoard run per result file: ``ROOT/<result path without .h5>`` (relative part)."""
    rel = os.path.relpath(os.path.abspath(result_path))
    if rel.startswith(".."):
        rel = os.path.abspath(result_path).lstrip(os.sep)
    return os.path.join(root, rel[:-3] if rel.endswith(".h5") else rel)


def build(runtime: Any, result_path: str, replace: bool = False) -> list:
    """The sidecars ``runtime`` asks for (not started yet). ``replace``: the run continues or
    overwrites a result at ``result_path``, so its metric CSV may be rewritten. Refuses (exit 2,
    naming the key) a CSV path holding another file, and TensorBoard logging without the
    tensorboard package."""
    out: list = []
    if runtime.csv:
        out.append(CsvSidecar(csv_path(result_path), replace))
    if runtime.tensorboard:
        if importlib.util.find_spec("tensorboard") is None:
            raise InputError("runtime.tensorboard: needs the tensorboard package "
                             "(pip install 'fedmpi[tensorboard]'), or set it to null")
        out.append(TensorBoardSidecar(tensorboard_dir(runtime.tensorboard, result_path)))
    return out
