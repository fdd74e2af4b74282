"""The HDF5 result file (INTERFACES.md): written by rank 0 only, readable at any moment.

Layout: root attributes ``config`` (resolved YAML), ``fedmpi_version``, ``world_size``,
``seed``, ``status`` (running | completed | interrupted | failed), ``rounds_done``;
``/metrics/<name>`` 1-D chunked resizable datasets aligned with ``/metrics/round``;
``/availability/mask`` (rounds x m uint8) when requested; ``/final/params``; extra groups
(``/partition``, ``/topology``) written once. The file is flushed after every evaluation,
so a killed run leaves a file that opens, with ``status = running``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import h5py
import numpy as np

from .. import __version__
from ..errors import InputError

STATUSES = ("running", "completed", "interrupted", "failed", "diverged")


class ResultWriter:
    """Append-only writer of one run's result file."""

    def __init__(self, path: str, config_yaml: str, seed: int, world_size: int, metrics: list[str],
                 m: int, log_mask: bool, resume_at: int | None = None):
        folder = os.path.dirname(os.path.abspath(path))
        self.path = path
        if resume_at is not None:
            self._reopen(resume_at, world_size)
            return
        try:
            os.makedirs(folder, exist_ok=True)
            self.f = h5py.File(path, "w")
        except OSError as e:
            raise InputError(f"{path}: cannot write the result file ({e.strerror or e})") from None
        self.f.attrs["config"] = config_yaml
        self.f.attrs["fedmpi_version"] = __version__
        self.f.attrs["world_size"] = world_size
        self.f.attrs["seed"] = seed
        self.f.attrs["status"] = "running"
        self.f.attrs["rounds_done"] = 0
        g = self.f.create_group("metrics")
        self.names = ["round"] + [n for n in metrics if n != "round"]
        for n in self.names:
            g.create_dataset(n, shape=(0,), maxshape=(None,), chunks=(1024,),
                             dtype=np.int64 if n == "round" else np.float64)
        self.mask = None
        if log_mask:
            self.mask = self.f.create_dataset("availability/mask", shape=(0, m), maxshape=(None, m),
                                              chunks=(max(1, min(64, 2**20 // max(m, 1))), min(m, 2**20)),
                                              dtype=np.uint8, compression="gzip", compression_opts=1)
        self.f.flush()

    def _reopen(self, rounds_done: int, world_size: int) -> None:
        """Continue a file after a checkpoint: drop rows written after ``rounds_done``."""
        try:
            self.f = h5py.File(self.path, "a")
            g = self.f["metrics"]
            self.names = ["round"] + [n for n in g if n != "round"]
            keep = int(np.searchsorted(g["round"][:], rounds_done, side="right"))
        except (OSError, KeyError) as e:
            raise InputError(f"{self.path}: cannot continue this result file ({e})") from None
        for n in self.names:
            g[n].resize((keep,))
        self.mask = self.f.get("availability/mask")
        if self.mask is not None:
            if self.mask.shape[0] < rounds_done:
                raise InputError(f"{self.path}: holds {self.mask.shape[0]} rows of /availability/mask, "
                                 f"fewer than the checkpoint's {rounds_done} rounds")
            self.mask.resize((rounds_done, self.mask.shape[1]))
        if "final" in self.f:
            del self.f["final"]
        self.f.attrs["status"] = "running"
        self.f.attrs["rounds_done"] = rounds_done
        self.f.attrs["world_size"] = world_size
        self.f.flush()

    def append(self, row: dict[str, float], rounds_done: int) -> None:
        """Add one evaluation row (every declared metric must be present) and flush."""
        g = self.f["metrics"]
        n = g["round"].shape[0]
        for name in self.names:
            ds = g[name]
            ds.resize((n + 1,))
            ds[n] = row.get(name, np.nan)
        self.f.attrs["rounds_done"] = rounds_done
        self.f.flush()

    def flush(self) -> None:
        self.f.flush()

    def append_mask(self, ids: np.ndarray) -> None:
        if self.mask is None:
            return
        n = self.mask.shape[0]
        self.mask.resize((n + 1, self.mask.shape[1]))
        row = np.zeros(self.mask.shape[1], dtype=np.uint8)
        row[np.asarray(ids, dtype=np.int64)] = 1
        self.mask[n] = row

    def write_group(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        """A static group (e.g. /partition, /topology), written once."""
        g = self.f.require_group(name)
        for k, v in arrays.items():
            g.create_dataset(k, data=np.asarray(v))
        self.f.flush()

    def finish(self, status: str, final_params: np.ndarray | None = None, rounds_done: int | None = None) -> None:
        if final_params is not None:
            self.f.create_dataset("final/params", data=np.asarray(final_params, dtype=np.float32))
        if rounds_done is not None:
            self.f.attrs["rounds_done"] = rounds_done
        self.f.attrs["status"] = status
        self.f.flush()
        self.f.close()


def open_result(path: str) -> h5py.File:
    """Open a result file for reading, also while a run is writing it (no file lock)."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such result file")
    for attempt in range(3):  # a running writer may be mid-flush: look again shortly
        try:
            f = h5py.File(path, "r", locking=False)
            break
        except OSError:
            if attempt == 2:
                raise InputError(f"{path}: not a readable HDF5 result file") from None
            time.sleep(0.2)
    if "metrics" not in f or "status" not in f.attrs:
        f.close()
        raise InputError(f"{path}: not a fedmpi result file (no /metrics or status)")
    return f


def read_metrics(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """All metric arrays (cut to the length of ``round``) and the root attributes.

    A damaged file (unreadable blocks, a metric that is not a 1-D numeric dataset, odd
    attributes) is an ``InputError`` naming the file and the part, never a traceback."""
    with open_result(path) as f:
        try:
            g = f["metrics"]
            if not isinstance(g, h5py.Group) or not isinstance(g.get("round"), h5py.Dataset):
                raise InputError(f"{path}: damaged result file (/metrics/round is missing)")
            for k in g:
                ds = g[k]
                if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype.kind not in "iuf":
                    raise InputError(f"{path}: damaged result file (/metrics/{k} is not a 1-D numeric dataset)")
            n = g["round"].shape[0]
            metrics = {k: g[k][: n] for k in g if g[k].shape[0] >= n}
            attrs = {k: _attr(v) for k, v in f.attrs.items()}
        except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
            raise InputError(f"{path}: damaged result file ({e.__class__.__name__}: {str(e)[:80]})") from None
    return metrics, attrs


def _attr(v: Any) -> Any:
    """An attribute as text or a Python scalar (bytes decoded; odd values shown, not trusted)."""
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, np.generic):
        return v.item() if not isinstance(v, np.void) else repr(v)[:80]
    return v if isinstance(v, (str, int, float)) else repr(v)[:80]
