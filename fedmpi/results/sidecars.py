"""Copies of the metric rows outside the HDF5 file: a CSV file and TensorBoard scalars.

Both are optional (``runtime.csv``, ``runtime.tensorboard``) and written by rank 0 next to the
result file, one row per evaluation as it happens; the HDF5 file stays the reference. On resume
the CSV is rewritten from the rows the result file kept, so it never holds rows of the rounds
that are run again.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import os
from typing import Any

import numpy as np

from ..errors import InputError


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

    def __init__(self, path: str):
        self.path = path
        self.fh = None

    def start(self, names: list[str], rows: dict[str, np.ndarray]) -> None:
        try:
            self.fh = open(self.path, "w", newline="", encoding="utf-8")
        except OSError as e:
            raise InputError(f"runtime.csv: cannot write {self.path} ({e.strerror or e})") from None
        self.names = names
        self.w = csv.writer(self.fh)
        self.w.writerow(names)
        for i in range(len(rows.get("round", []))):
            self.w.writerow([csv_value(k, rows[k][i]) for k in names])
        self.fh.flush()

    def row(self, row: dict[str, float]) -> None:
        self.w.writerow([csv_value(k, row.get(k, math.nan)) for k in self.names])
        self.fh.flush()

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


def build(runtime: Any, result_path: str) -> list:
    """The sidecars ``runtime`` asks for (not started yet). Refuses TensorBoard logging when the
    tensorboard package is missing (exit 2, naming the key)."""
    out: list = []
    if runtime.csv:
        out.append(CsvSidecar(csv_path(result_path)))
    if runtime.tensorboard:
        if importlib.util.find_spec("tensorboard") is None:
            raise InputError("runtime.tensorboard: needs the tensorboard package "
                             "(pip install 'fedmpi[tensorboard]'), or set it to null")
        out.append(TensorBoardSidecar(tensorboard_dir(runtime.tensorboard, result_path)))
    return out
