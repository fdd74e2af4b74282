"""Result files as Python objects: ``fedmpi.results.load(path)`` for analysis scripts.

    from fedmpi import results
    r = results.load("runs/fmnist-sine-fedswe-s0.h5")
    r.status                    # 'completed' (or running, interrupted, failed)
    r.metrics["test_acc"]       # numpy float64 array, aligned with r.metrics["round"] (int64)
    r.config["train"]["lr"]     # the fully resolved config as a nested dict
    r.get("algorithm.k")        # the same by dotted key
    r.dataframe()               # pandas.DataFrame, one row per evaluation (needs pandas)
    results.dataframe(["a.h5", "b.h5"], keys=["algorithm.name", "seed"])   # long format, many runs

Which keys define an experiment's results is decided here once (``RESULT_SECTIONS``): runs that
differ only in ``seed`` or in rounds, evaluation, output or runtime keys are the same experiment
(``fedmpi plot`` and ``fedmpi table`` put them into one mean +/- std).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from .. import yamlio
from ..schema import current_spelling
from ..errors import InputError
from .hdf5 import is_locked, read_metrics

RESULT_SECTIONS = ("task", "train", "algorithm", "availability", "topology", "sporadicity")


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def is_result_key(dotted: str) -> bool:
    """Whether a config key can change a run's numbers (besides ``seed``)."""
    return dotted.split(".", 1)[0] in RESULT_SECTIONS


@dataclass
class Result:
    """One result file: ``status``, ``metrics`` (name -> numpy array), ``config`` (nested dict)."""

    path: str
    status: str
    config: dict
    metrics: dict[str, np.ndarray]
    attrs: dict[str, Any] = field(repr=False)

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", self.attrs.get("seed", 0)))

    @property
    def rounds_done(self) -> int:
        return int(self.attrs.get("rounds_done", 0))

    def get(self, dotted: str, default: Any = None) -> Any:
        """A config value by dotted key (``default`` when absent)."""
        return self.flat_config().get(dotted, default)

    def flat_config(self) -> dict[str, Any]:
        return flatten(self.config)

    def experiment(self) -> dict[str, Any]:
        """The result-defining config keys and values (no seed, rounds, evaluation, runtime, output)."""
        return {k: v for k, v in self.flat_config().items() if is_result_key(k)}

    def dataframe(self):
        """The metrics as a pandas DataFrame, one row per evaluation (pandas is optional)."""
        pd = _pandas()
        return pd.DataFrame({k: v for k, v in self.metrics.items()})


def load(path: str) -> Result:
    """Read a result file (also one a run is still writing). Bad files raise InputError. An
    empty file that a run holds is that run in set-up: status ``starting``, no rows yet."""
    if os.path.isfile(path) and os.path.getsize(path) == 0 and is_locked(path):
        return Result(path=path, status="starting", config={}, metrics={"round": np.zeros(0, np.int64)},
                      attrs={"status": "starting", "rounds_done": 0})
    metrics, attrs = read_metrics(path)
    try:  # the stored config is text from the file: read it with the input limits (no alias bombs)
        config = yamlio.loads(str(attrs.get("config", "")), f"{path}: config") or {}
    except InputError:
        config = {}
    config = current_spelling(config) if isinstance(config, dict) else {}  # keys that moved since it was written
    return Result(path=path, status=str(attrs.get("status")), config=config, metrics=metrics, attrs=attrs)


def dataframe(runs: Iterable[str | Result], keys: Iterable[str] = ("algorithm.name", "seed")):
    """Many runs in one long pandas DataFrame: columns ``file``, the config ``keys``, then the metrics."""
    pd = _pandas()
    frames = []
    for r in runs:
        r = load(r) if isinstance(r, str) else r
        df = r.dataframe()
        flat = r.flat_config()
        for i, k in enumerate(["file", *keys]):
            df.insert(i, k, r.path if k == "file" else flat.get(k))
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError("fedmpi.results: DataFrames need pandas (pip install pandas); "
                          "Result.metrics holds the same data as numpy arrays") from None
    return pandas
