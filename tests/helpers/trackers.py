"""What a run logged to its trackers, read back without a server: W&B's offline run folders (their
``.wandb`` record logs) and MLflow's local store."""

from __future__ import annotations

import glob
import json
import os
import struct

_BLOCK = 32768  # W&B's .wandb file: LevelDB's log format, records in 32 KiB blocks
_HEADER = 7     # checksum (4), length (2), type (1: full, 2: first, 3: middle, 4: last)


def wandb_records(path: str) -> list:
    """The protobuf records (wandb_internal_pb2.Record) of one offline run's ``run-<id>.wandb``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", path
    out, pos, part = [], 7, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if kind == 0 and length == 0:  # padding or a record not written yet
            pos += left
            continue
        chunk = data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(part)
            out.append(rec)
    return out


def wandb_offline_runs(folder: str) -> list[dict]:
    """Each offline run folder under ``folder`` (its ``wandb/``), in time order: the run id (``id``
    from its records, ``file_id`` from its file's name: a killed process may leave no records), its
    project, its config (top-level keys -> values) and the history rows it logged."""
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "offline-run-*", "run-*.wandb"))):
        stem = os.path.basename(path)[len("run-"):-len(".wandb")]
        info: dict = {"id": None, "file_id": stem, "project": None, "config": {}, "rows": []}
        for rec in wandb_records(path):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                info["id"], info["project"] = rec.run.run_id, rec.run.project
                info["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
            elif kind == "config":
                info["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
            elif kind == "history":
                row = {(i.key or ".".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
                info["rows"].append({k: v for k, v in row.items() if not k.startswith("_")})
        runs.append(info)
    return runs


def mlflow_runs(uri: str) -> list:
    """Every run of every experiment at an MLflow tracking ``uri`` (mlflow.entities.Run)."""
    import warnings

    from mlflow.tracking import MlflowClient

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLAlchemy's deprecation warnings as MLflow opens a SQLite store
        client = MlflowClient(tracking_uri=uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        return client.search_runs(experiments) if experiments else []


def mlflow_history(uri: str, run_id: str, metric: str) -> list[tuple[int, float]]:
    """(step, value) of every value logged for ``metric`` (a resumed run's repeated rounds twice)."""
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, metric))
