"""Result files as Python objects: ``fedmpi.results.load(path)`` for analysis scripts.

    from fedmpi import results
    r = results.load("runs/fmnist-sine-fedswe-s0.h5")
    r.status                    # 'completed' (or running, interrupted, failed, diverged)
    r.metrics["test_acc"]       # numpy float64 array, aligned with r.metrics["round"] (int64)
    r.config["train"]["lr"]     # the fully resolved config as a nested dict
    r.get("algorithm.k")        # the same by dotted key
    r.label                     # its sweep variant's label (runtime.label), or ''
    r.mask()                    # who trained in each round: uint8 (rounds x clients)
    r.clients()                 # per-client arrays: {"loss": (evaluations x clients), ...}
    r.records("privacy")        # any other group: {"noise_multiplier": (rounds,)}, {} when absent
    r.dataframe()               # pandas.DataFrame, one row per evaluation (needs pandas)
    r.clients_frame(), r.mask_frame(), r.records_frame("privacy")      # the same as DataFrames
    results.dataframe(["a.h5", "b.h5"], keys=["algorithm.name", "seed"])   # long format, many runs

Arrays are read from the file when asked for (a participation mask can be large), whole, as
stored. Rows: ``/metrics`` and ``/clients`` have one per evaluation (``round`` = rounds done at
it); ``/availability/mask`` and per-round records (``/privacy``) one per round, the round that
``round = t + 1`` completed; a group with a ``round`` dataset of its own (``/events``) says it.

Which keys define an experiment's results is decided here once: every config key except the
run-only ones (``RUN_KEYS``: the run's name, length and evaluation schedule, where it writes, how
its processes run, evaluation switches that add or leave out metrics) and ``seed``, which tells
the replicates apart. So a section added to the config schema defines results unless it is
declared run-only here (tests/test_table.py holds this against the schema). Runs that differ only
in seed and run-only keys are one experiment: ``fedmpi plot`` and ``fedmpi table`` put them into
one mean +/- std.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from .. import yamlio
from ..errors import InputError
from ..schema import current_spelling
from .hdf5 import is_locked, open_result, read_arrays, read_metrics

#: Config keys (a top-level key covers its whole section) that cannot change a number a run
#: stores: a longer run's rows are a shorter one's and more (``rounds``, ``runtime.stop_at``), the
#: schedule only picks rows (``eval_every``), the rest names, places, launches (``train.cuda_graphs``:
#: how the steps are launched, not what they compute) or adds and leaves out metrics.
RUN_KEYS = ("name", "rounds", "eval_every", "output", "runtime", "train.cuda_graphs", "evaluation.train",
            "evaluation.batch_size", "evaluation.clients.enabled", "evaluation.clients.arrays")
#: Groups whose rows are evaluations, aligned with /metrics/round; other groups' rows are rounds.
EVALUATION_GROUPS = ("metrics", "clients")


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
    """Whether a config key can change a run's numbers (besides ``seed``): every key that is not
    run-only (``RUN_KEYS``)."""
    return dotted != "seed" and not any(dotted == k or dotted.startswith(k + ".") for k in RUN_KEYS)


def _private(flat: dict[str, Any]) -> bool:
    return flat.get("privacy.mechanism") not in (None, "none")


@dataclass
class Result:
    """One result file: ``status``, ``metrics`` (name -> numpy array), ``config`` (nested dict);
    ``config_problem`` says why the config could not be read (then ``config`` is empty)."""

    path: str
    status: str
    config: dict
    metrics: dict[str, np.ndarray]
    attrs: dict[str, Any] = field(repr=False)
    config_problem: str | None = None

    @property
    def seed(self) -> int:
        return self._integer("seed", self.config.get("seed", self.attrs.get("seed", 0)))

    @property
    def rounds_done(self) -> int:
        return self._integer("rounds_done", self.attrs.get("rounds_done", 0))

    def _integer(self, name: str, value: Any) -> int:
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return int(value)
        raise InputError(f"{self.path}: damaged result file ({name} {str(value)[:40]!r} is not an integer)")

    @property
    def label(self) -> str:
        """Its sweep variant's label, or the label its run was given (``runtime.label``), or ''."""
        value = self.get("runtime.label")
        return "" if value is None else str(value)

    def get(self, dotted: str, default: Any = None) -> Any:
        """A config value by dotted key (``default`` when absent)."""
        return self.flat_config().get(dotted, default)

    def flat_config(self) -> dict[str, Any]:
        return flatten(self.config)

    def experiment(self) -> dict[str, Any]:
        """The result-defining config keys and values (``is_result_key``). With privacy, the
        noise is calibrated and the epsilon accounted over all rounds: ``rounds`` is one too."""
        flat = self.flat_config()
        return {k: v for k, v in flat.items() if is_result_key(k) or (k == "rounds" and _private(flat))}

    def require_config(self) -> None:
        """InputError unless the config was read: a run without one cannot be grouped with others."""
        if self.config_problem:
            raise InputError(f"{self.path}: has no readable config ({self.config_problem}); it cannot be "
                             f"grouped with other runs: leave it out")

    # ---------------------------------------------------------------- arrays beyond /metrics
    def records(self, group: str) -> dict[str, np.ndarray]:
        """Every dataset of the file's ``/group`` (nested ones by dotted name), as stored; {} when
        the file has none (e.g. ``records("privacy")`` of a run without privacy)."""
        return read_arrays(self.path, group.strip("/"))

    def mask(self) -> np.ndarray:
        """Who trained in each round: uint8 (rounds x clients), row t for round t (0-based)."""
        mask = self.records("availability").get("mask")
        if mask is None:
            raise InputError(f"{self.path}: has no /availability/mask (run with runtime.log_availability: true)")
        if mask.ndim != 2:
            raise InputError(f"{self.path}: damaged result file (/availability/mask has shape {mask.shape})")
        return mask

    def clients(self) -> dict[str, np.ndarray]:
        """Per-client arrays: name -> float64 (evaluations x clients), row i at
        ``metrics["round"][i]``; {} without ``evaluation.clients.arrays``."""
        arrays = self.records("clients")
        n = len(self.metrics["round"])
        for name, a in arrays.items():
            if a.ndim != 2:
                raise InputError(f"{self.path}: damaged result file (/clients/{name} has shape {a.shape})")
        if len({a.shape[1] for a in arrays.values()}) > 1:  # one column per client in every array
            shapes = ", ".join(f"{k} {a.shape}" for k, a in arrays.items())
            raise InputError(f"{self.path}: damaged result file (/clients arrays of different widths: {shapes})")
        return {k: a[:n] for k, a in arrays.items()}  # rows past the last evaluation were never flushed as one

    # ---------------------------------------------------------------- DataFrames (pandas)
    def dataframe(self):
        """The metrics as a pandas DataFrame, one row per evaluation (pandas is optional)."""
        pd = _pandas()
        return pd.DataFrame({k: v for k, v in self.metrics.items()})

    def clients_frame(self):
        """The per-client arrays in long format: columns ``round``, ``client``, then one per array."""
        pd = _pandas()
        arrays = self.clients()
        rounds = self.metrics["round"]
        m = next(iter(arrays.values())).shape[1] if arrays else 0
        n = min([len(rounds), *(a.shape[0] for a in arrays.values())])
        cols = {"round": np.repeat(rounds[:n], m), "client": np.tile(np.arange(m), n)}
        cols.update({k: a[:n].reshape(-1) for k, a in arrays.items()})
        return pd.DataFrame(cols)

    def mask_frame(self):
        """The participation mask: one row per round (index ``round``, the rounds done after it),
        one column per client id."""
        pd = _pandas()
        mask = self.mask()
        return pd.DataFrame(mask, index=pd.Index(np.arange(1, mask.shape[0] + 1), name="round"))

    def records_frame(self, group: str):
        """A group of one value per row (``/privacy``, ``/events``) as a table: a ``round``
        column (the group's own, else its row's round: the evaluation's for /clients-like groups,
        t + 1 for per-round groups), then one column per dataset; a column of named codes (an HDF5
        enum: /events's ``outcome``) holds the names, as a pandas Categorical."""
        pd = _pandas()
        arrays = self.records(group)
        flat = {k: a for k, a in arrays.items() if a.ndim == 1}
        if len(flat) != len(arrays) or len({len(a) for a in flat.values()}) > 1:
            shapes = ", ".join(f"{k} {a.shape}" for k, a in arrays.items())
            raise InputError(f"{self.path}: /{group} is not a table of one value per row ({shapes}); "
                             f"use records({group!r}) for its arrays")
        cols: dict[str, np.ndarray] = {}
        if flat and "round" not in flat:
            n = len(next(iter(flat.values())))
            cols["round"] = (self.metrics["round"][:n] if group.strip("/") in EVALUATION_GROUPS
                             else np.arange(1, n + 1))
        cols.update(flat)
        for k, a in flat.items():
            names = _enum_names(a) or (self._legacy_names(group) if k == "outcome" else None)
            if names:
                cols[k] = self._named(group, k, a, names, pd)
        return pd.DataFrame(cols)

    def _named(self, group: str, column: str, codes: np.ndarray, names: dict[int, str], pd):
        """A column of enum codes as a pandas Categorical of their names (categories in code order)."""
        unknown = sorted(set(np.unique(codes).tolist()) - set(names))
        if unknown:
            raise InputError(f"{self.path}: damaged result file (/{group.strip('/')}/{column} holds code "
                             f"{unknown[0]}, not one of {dict(sorted(names.items()))})")
        order = [names[c] for c in sorted(names)]
        return pd.Categorical([names[int(c)] for c in codes], categories=order)

    def _legacy_names(self, group: str) -> dict[int, str] | None:
        """The outcome names of /events in a file from before they were an enum (its ``outcomes``
        attribute, the names in code order), or None."""
        try:
            with open_result(self.path) as f:
                text = f[group.strip("/")].attrs.get("outcomes")
        except (OSError, KeyError, ValueError, TypeError, InputError):
            return None
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return dict(enumerate(text.split(","))) if isinstance(text, str) and text else None


def _enum_names(a: np.ndarray) -> dict[int, str] | None:
    """{code: name} of an array read from an HDF5 enum dataset (h5py keeps the names in its
    dtype), or None."""
    enum = (a.dtype.metadata or {}).get("enum")
    return {int(v): str(k) for k, v in enum.items()} if isinstance(enum, dict) and enum else None


def load(path: str) -> Result:
    """Read a result file (also one a run is still writing). Bad files raise InputError. An
    empty file that a run holds is that run in set-up: status ``starting``, no rows yet."""
    if os.path.isfile(path) and os.path.getsize(path) == 0 and is_locked(path):
        return Result(path=path, status="starting", config={}, metrics={"round": np.zeros(0, np.int64)},
                      attrs={"status": "starting", "rounds_done": 0})
    metrics, attrs = read_metrics(path)
    config, problem = _config(path, attrs.get("config"))
    return Result(path=path, status=str(attrs.get("status")), config=config, metrics=metrics, attrs=attrs,
                  config_problem=problem)


def _config(path: str, text: Any) -> tuple[dict, str | None]:
    """The stored config as a dict (keys that moved since it was written at their new place), or
    ({}, why not)."""
    if text is None:
        return {}, "no config attribute"
    if not isinstance(text, str):
        return {}, "the config attribute is not text"
    try:  # text from the file: read with the input limits (no alias bombs)
        config = yamlio.loads(text, f"{path}: config")
    except (InputError, ValueError) as e:
        return {}, f"the config is not valid YAML: {str(e).splitlines()[0][-80:]}"
    if not isinstance(config, dict) or not config:
        return {}, "the config is not a mapping of keys"
    return current_spelling(config), None


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
        raise ImportError("fedmpi.results: DataFrames need pandas (pip install 'fedmpi[analysis]'); the numpy "
                          "arrays (Result.metrics, mask(), clients(), records()) hold the same data") from None
    return pandas
