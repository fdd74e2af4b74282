"""Copies of the metric rows outside the HDF5 file: a CSV file, TensorBoard scalars, and the run
trackers Weights & Biases and MLflow.

All are optional (``runtime.csv``, ``runtime.tensorboard``, ``runtime.wandb``, ``runtime.mlflow``:
``fedmpi.outputs.SidecarParams``) and written by rank 0, one row per evaluation as it happens; the
HDF5 file stays the reference. A tracker gets one run per result file, the config as its
parameters, and the metric rows with ``round`` as their step; the result file records the tracker
run (root attribute ``trackers``, JSON), so that a resumed or extended run continues the same
tracker run (rows of the rounds run again are logged again, with the same values), and
``--overwrite`` starts a new one. On resume the CSV is rewritten from the rows the result file kept,
so it never holds rows of the rounds that are run again. An existing ``RUN.csv`` is replaced only
when it is a metric CSV and the run continues or overwrites a result file at ``RUN.h5``; anything
else there (a trace, a config, a user's file) is refused before the run starts (outfiles.py).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import secrets
from typing import Any

import numpy as np

from ..errors import InputError, WriteFailed
from .outfiles import AtomicFile, check_target, is_metric_csv
from .reader import flatten


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

    def close(self, status: str | None = None) -> None:
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

    def close(self, status: str | None = None) -> None:
        if self.w is not None:
            self.w.close()


def run_name(result_path: str) -> str:
    """A tracker run's name: the result file's path relative to the working directory (absolute
    when outside it), without ``.h5`` (``runs/clock/fedavg-s0``)."""
    rel = os.path.relpath(os.path.abspath(result_path))
    if rel.startswith(".."):
        rel = os.path.abspath(result_path)
    return rel[:-3] if rel.endswith(".h5") else rel


def tensorboard_dir(root: str, result_path: str) -> str:
    """One TensorBoard run per result file: ``ROOT/<result path without .h5>`` (relative part)."""
    return os.path.join(root, run_name(result_path).lstrip(os.sep))


#: a fedmpi ending -> (MLflow's run status, W&B's exit code)
_ENDINGS = {"completed": ("FINISHED", 0), "interrupted": ("KILLED", 3), "diverged": ("FAILED", 4),
            "lost": ("FAILED", 5)}


def _ending(status: str | None) -> tuple[str, int]:
    return _ENDINGS.get(status or "", ("FAILED", 1))


def _number(v: Any) -> float | None:
    """A metric value a tracker takes (None for NaN: not logged, as TensorBoard's)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


class Tracker:
    """A run tracker (W&B, MLflow) as a sidecar: ``start`` opens or continues its run (``previous``:
    what the result file recorded of it), ``row`` logs one evaluation, ``close`` ends the run with
    the result file's status, ``record`` is what the result file keeps of it."""

    key = ""       # the runtime key that asks for it
    package = ""   # the package it needs, and the fedmpi extra that installs it

    def __init__(self, target: str, result_path: str, config: dict, previous: dict | None):
        self.target, self.result_path, self.config = target, result_path, config
        self.previous = previous or {}
        self.run_id: str | None = None

    @classmethod
    def check(cls) -> None:
        """Refuse (exit 2, naming the key and the pip command) when the package is missing."""
        if importlib.util.find_spec(cls.package) is None:
            raise InputError(f"runtime.{cls.key}: needs the {cls.package} package (pip install "
                             f"'fedmpi[{cls.package}]'), or set it to null")

    def record(self) -> dict[str, Any]:
        raise NotImplementedError

    def _error(self, e: BaseException, doing: str) -> InputError:
        text = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return InputError(f"runtime.{self.key}: {self.package} could not {doing} ({text})")


class WandbTracker(Tracker):
    """A Weights & Biases run in project ``runtime.wandb`` (entity: $WANDB_ENTITY or the account's
    default), named after the result file, grouped by the config's ``name``; its id is chosen here
    and kept in the result file. ``WANDB_MODE=offline`` logs to ./wandb (or $WANDB_DIR) without an
    account: ``wandb sync`` uploads it later, the pieces of a resumed run into one run. A continued
    run logs the rows the result file kept again first: W&B loses what it had buffered when a
    process is killed."""

    key, package = "wandb", "wandb"

    @classmethod
    def check(cls) -> None:
        """Also refuse to go online without a login (wandb.init would prompt for one, or fail)."""
        super().check()
        if os.environ.get("WANDB_MODE", "online") in ("online", "run") and not _wandb_credentials():
            raise InputError("runtime.wandb: no W&B login (run `wandb login` or set WANDB_API_KEY); "
                             "WANDB_MODE=offline logs locally without an account (wandb sync uploads it later)")

    def start(self, names: list[str], rows: dict[str, np.ndarray]) -> None:
        import wandb

        same = self.previous.get("project") == self.target and self.previous.get("id")
        self.run_id = str(self.previous["id"]) if same else secrets.token_hex(6)
        try:
            self.run = wandb.init(project=self.target, id=self.run_id, resume="allow", name=run_name(self.result_path),
                                  group=str(self.config.get("name", "run")), config=self.config,
                                  settings=wandb.Settings(console="off"),
                                  reinit="create_new")  # a packed sweep's cells: several runs in one process
            self.run.config.update(self.config, allow_val_change=True)  # a resumed run's changed keys
            self.run.define_metric("round")
            self.run.define_metric("*", step_metric="round")
        except Exception as e:  # W&B's own errors (login, network, a bad project name)
            raise self._error(e, "start its run") from None
        if same:  # what W&B had not yet written when the run was killed is lost: the kept rows again
            for i in range(len(rows.get("round", ()))):
                self.row({k: rows[k][i] for k in names})

    def row(self, row: dict[str, float]) -> None:
        values = {k: x for k, v in row.items() if (x := _number(v)) is not None}
        self.run.log(values)

    def close(self, status: str | None = None) -> None:
        if getattr(self, "run", None) is not None:
            self.run.finish(exit_code=_ending(status)[1])
            self.run = None

    def record(self) -> dict[str, Any]:
        return {"project": self.target, "id": self.run_id, "entity": os.environ.get("WANDB_ENTITY"),
                "mode": os.environ.get("WANDB_MODE", "online")}


def _wandb_credentials() -> bool:
    """Whether W&B has a credential to go online with: $WANDB_API_KEY, $WANDB_IDENTITY_TOKEN_FILE,
    or a .netrc entry for its host (what `wandb login` writes); otherwise wandb.init would prompt."""
    import netrc
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC") or None).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def mlflow_uri(target: str) -> str:
    """``runtime.mlflow`` as a tracking URI: a URI as given; a path ending in .db a local SQLite
    store; any other path a folder, MLflow's file store (absolute paths: a run may move)."""
    if "://" in target or target.startswith(("databricks", "sqlite:")):
        return target
    path = os.path.abspath(target)
    return f"sqlite:///{path}" if path.endswith(".db") else f"file://{path}"


class MlflowTracker(Tracker):
    """An MLflow run in the experiment named after the config's ``name``, at ``runtime.mlflow``
    (``mlflow_uri``), named after the result file; the config's dotted keys are its parameters
    (a key a resumed run changed is a tag ``config_change.<key>``: MLflow's parameters are
    immutable), the metric rows its metrics at step = round."""

    key, package = "mlflow", "mlflow"

    def __init__(self, target: str, result_path: str, config: dict, previous: dict | None):
        """Opens the store and its experiment (before the run starts: a store MLflow cannot open is
        refused before a result file is made)."""
        super().__init__(target, result_path, config, previous)
        self.uri = mlflow_uri(target)
        if self.uri.startswith("file://"):  # MLflow 3 keeps the folder store in maintenance mode: asked for, so used
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        name = str(config.get("name", "run"))
        with self._quiet():
            try:
                from mlflow.tracking import MlflowClient

                self.client = MlflowClient(tracking_uri=self.uri)
                exp = self.client.get_experiment_by_name(name)
                self.experiment_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
            except Exception as e:  # MLflow's own errors (a store it cannot open, a server it cannot reach)
                raise self._error(e, f"open the store {self.uri}") from None

    @staticmethod
    def _quiet():
        """MLflow's notices (database set-up) and its dependencies' deprecation warnings kept off stderr."""
        import contextlib
        import logging
        import warnings

        for name in ("mlflow", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
        stack = contextlib.ExitStack()
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        return stack

    def start(self, names: list[str], rows: dict[str, np.ndarray]) -> None:
        with self._quiet():
            try:
                self._open()
            except Exception as e:
                raise self._error(e, f"start its run at {self.uri}") from None

    def _open(self) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params = {k: str(v)[:MAX_PARAM_VAL_LENGTH] for k, v in flatten(self.config).items()}
        run = None
        if self.previous.get("tracking_uri") == self.uri and self.previous.get("run_id"):
            try:
                run = self.client.get_run(str(self.previous["run_id"]))
            except Exception:  # gone from that store: a new run
                run = None
        if run is None:
            run = self.client.create_run(self.experiment_id, run_name=run_name(self.result_path),
                                         tags={"fedmpi.result_file": os.path.abspath(self.result_path)})
            logged: dict[str, str] = {}
        else:
            self.client.update_run(run.info.run_id, status="RUNNING")
            logged = dict(run.data.params)
        self.run_id, self.experiment_id = run.info.run_id, run.info.experiment_id
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        for i in range(0, len(new), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=new[i:i + MAX_PARAMS_TAGS_PER_BATCH])
        for k, v in params.items():
            if k in logged and logged[k] != v:
                self.client.set_tag(self.run_id, f"config_change.{k}", v)

    def row(self, row: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        step, now = int(row["round"]), int(time.time() * 1000)
        metrics = [Metric(k, x, now, step) for k, v in row.items() if k != "round" and (x := _number(v)) is not None]
        try:
            self.client.log_batch(self.run_id, metrics=metrics)
        except Exception as e:
            raise WriteFailed(f"runtime.mlflow: cannot log to {self.uri} ({str(e).splitlines()[0][:160]}); the "
                              f"result file keeps every row") from None

    def close(self, status: str | None = None) -> None:
        if getattr(self, "client", None) is not None and self.run_id is not None:
            try:
                self.client.set_terminated(self.run_id, status=_ending(status)[0])
            except Exception:  # the run's end must not hide how the run itself ended
                pass
            self.client = None

    def record(self) -> dict[str, Any]:
        return {"tracking_uri": self.uri, "experiment_id": self.experiment_id, "run_id": self.run_id}


TRACKERS = (WandbTracker, MlflowTracker)


def recorded(result_path: str) -> dict[str, dict]:
    """The tracker runs a result file records (root attribute ``trackers``), {} when none."""
    from .hdf5 import peek

    try:
        data = json.loads(peek(result_path)[1].get("trackers") or "{}")
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def notes(sidecars: list) -> dict[str, str]:
    """The root attributes the started trackers ask the result file to keep (``trackers``)."""
    runs = {s.key: s.record() for s in sidecars if isinstance(s, Tracker) and s.run_id is not None}
    return {"trackers": json.dumps(runs)} if runs else {}


def build(runtime: Any, result_path: str, replace: bool = False, config: dict | None = None,
          continues: bool = False) -> list:
    """The sidecars ``runtime`` asks for (not started yet). ``replace``: the run continues or
    overwrites a result at ``result_path``, so its metric CSV may be rewritten; ``continues``: it
    continues the file's run (resumed or extended), so a tracker continues the run the file
    records; ``config``: the run's config, the trackers' parameters. Refuses (exit 2, naming the
    key) a CSV path holding another file, and a sidecar without its package."""
    out: list = []
    if runtime.csv:
        out.append(CsvSidecar(csv_path(result_path), replace))
    if runtime.tensorboard:
        if importlib.util.find_spec("tensorboard") is None:
            raise InputError("runtime.tensorboard: needs the tensorboard package "
                             "(pip install 'fedmpi[tensorboard]'), or set it to null")
        out.append(TensorBoardSidecar(tensorboard_dir(runtime.tensorboard, result_path)))
    previous = recorded(result_path) if continues else {}
    for tracker in TRACKERS:
        target = getattr(runtime, tracker.key, None)
        if target:
            tracker.check()
            out.append(tracker(target, result_path, config or {}, previous.get(tracker.key)))
    return out
