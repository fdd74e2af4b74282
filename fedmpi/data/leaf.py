"""The ``leaf`` dataset: LEAF's JSON layout (FEMNIST, Shakespeare's features, Sent140, ...), with
each user a client (``task.partition.kind: natural``).

LEAF (Caldas et al. 2018) writes each split as one or more ``.json`` files, each

    {"users": ["f0000_14", ...], "num_samples": [n_0, ...],
     "user_data": {"f0000_14": {"x": [[...], ...], "y": [...]}, ...}}

where ``x`` holds one flat list of numbers per sample and ``y`` an integer label (or a number
or list of numbers for regression, ``task.leaf.classes: 0``). Users bring the files
(``task.leaf.train``, ``task.leaf.test``: a file or a folder of ``.json`` files). Users are
numbered in order of first appearance in the training files (files in name order); a test
sample of any user joins the global test set, and keeps its user (``DataArrays.client_test``):
with ``task.partition.local_test: dataset`` each user's test samples are its client's local
test split (per-client metrics, docs/DATASETS.md). With ``cache: true`` of the registration the
parsed arrays are cached, keyed by the files' contents (``fedmpi.data.datasets``, which registers
the dataset and declares its keys).
"""

from __future__ import annotations

import json
import os
import numpy as np

from .. import provenance
from ..errors import InputError
from .arrays import DataArrays


def _files(path: str, key: str) -> list[str]:
    if not path:
        raise InputError(f"{key}: give the LEAF .json file or folder")
    path = os.path.expanduser(path)
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".json"))
        if not files:
            raise InputError(f"{path}: no .json files in this folder ({key}, LEAF layout)")
        return files
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such LEAF file or folder ({key})")
    return [path]


def read_split(path: str, key: str) -> tuple[list[str], list, list]:
    """(user of each sample, x rows, y values) of every file of one split, in file order."""
    users, xs, ys = [], [], []
    for f in _files(path, key):
        try:
            provenance.note_input(f)
            with open(f, encoding="utf-8") as fh:
                doc = json.load(fh)
            for u in doc["users"]:
                data = doc["user_data"][u]
                if len(data["x"]) != len(data["y"]):
                    raise ValueError(f"user {u!r} has {len(data['x'])} x and {len(data['y'])} y")
                users += [u] * len(data["y"])
                xs += data["x"]
                ys += data["y"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InputError(f"{f}: not a LEAF json file ({type(e).__name__}: {str(e)[:120]}); expected "
                             f"{{users, num_samples, user_data: {{user: {{x, y}}}}}}") from None
    if not ys:
        raise InputError(f"{path}: holds no samples ({key})")
    return users, xs, ys


def _matrix(rows: list, what: str) -> np.ndarray:
    try:
        a = np.asarray(rows, dtype=np.float32)
    except (ValueError, TypeError):
        raise InputError(f"{what}: every sample must be a flat list of numbers of one length") from None
    return a if a.ndim > 1 else a[:, None]


def load(cfg) -> DataArrays:
    """LEAF's JSON splits as arrays, with each training sample's user as its client id."""
    p = cfg.task.leaf
    users, xtr, ytr = read_split(p.train, "task.leaf.train")
    test_users, xte, yte = read_split(p.test, "task.leaf.test")
    ids = {u: i for i, u in enumerate(dict.fromkeys(users))}
    x_train, x_test = _matrix(xtr, "task.leaf.train"), _matrix(xte, "task.leaf.test")
    if p.classes == 0:
        y_train, y_test, classes = _matrix(ytr, "task.leaf.train"), _matrix(yte, "task.leaf.test"), 0
    else:
        y_train, y_test = np.asarray(ytr), np.asarray(yte)
        if not (np.issubdtype(y_train.dtype, np.integer) and np.issubdtype(y_test.dtype, np.integer)):
            raise InputError("task.leaf.classes: labels are not integers; give classes: 0 for regression")
        classes = p.classes or int(max(y_train.max(), y_test.max())) + 1
    return DataArrays(x_train, y_train, x_test, y_test, classes,
                      client_train=np.array([ids[u] for u in users], dtype=np.int64),
                      client_test=np.array([ids.get(u, -1) for u in test_users], dtype=np.int64))  # -1: no client
