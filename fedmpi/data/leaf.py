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

import os
from typing import Iterator

import numpy as np
import psutil

from .. import provenance, yamlio
from ..errors import InputError
from ..inputs import read_input
from .arrays import DataArrays


def split_files(path: str, key: str, suffix: str = ".json", layout: str = "LEAF layout") -> list[str]:
    """The files of one split: ``path`` itself, or the ``suffix`` files of the folder ``path``
    in name order."""
    if not path:
        raise InputError(f"{key}: give the {suffix} file or folder ({layout})")
    path = os.path.expanduser(path)
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(suffix))
        if not files:
            raise InputError(f"{path}: no {suffix} files in this folder ({key}, {layout})")
        return files
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or folder ({key}, {layout})")
    return [path]


def read_users(path: str, key: str) -> Iterator[tuple[str, str, list, list]]:
    """(file, user, x rows, y values) of every user of one split, files in name order."""
    for f in split_files(path, key):
        doc = _read_json(f)
        try:
            for u in doc["users"]:
                data = doc["user_data"][u]
                if len(data["x"]) != len(data["y"]):
                    raise ValueError(f"user {u!r} has {len(data['x'])} x and {len(data['y'])} y")
                yield f, u, data["x"], data["y"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InputError(f"{f}: not a LEAF json file ({type(e).__name__}: {str(e)[:120]}); expected "
                             f"{{users, num_samples, user_data: {{user: {{x, y}}}}}}") from None


def read_split(path: str, key: str) -> tuple[list[str], list, list]:
    """(user of each sample, x rows, y values) of every file of one split, in file order."""
    users, xs, ys = [], [], []
    for _, u, x, y in read_users(path, key):
        users += [u] * len(y)
        xs += x
        ys += y
    if not ys:
        raise InputError(f"{path}: holds no samples ({key})")
    return users, xs, ys


#: JSON text becomes Python lists about this many times its size before it is an array
PARSED_PER_BYTE = 8


def _read_json(path: str) -> object:
    """One LEAF file, read through ``fedmpi.inputs`` (a special file is refused unopened) and
    parsed with ``yamlio.loads_json`` (its nesting is counted before parsing: a 10^5-deep file
    is one line, not a RecursionError); refused unread when its parse would not fit in memory."""
    limit = max(psutil.virtual_memory().available // PARSED_PER_BYTE, 1 << 20)
    try:
        data = read_input(path, "LEAF json file", limit=limit)  # the limit: 1/8 of the available memory
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or type(e).__name__}; LEAF layout)") from None
    provenance.note_input(path)
    return yamlio.loads_json(data, path)


def _matrix(rows: list, what: str) -> np.ndarray:
    try:
        a = np.asarray(rows, dtype=np.float32)
    except (ValueError, TypeError):
        raise InputError(f"{what}: every sample must be a flat list of numbers of one length") from None
    a = a if a.ndim > 1 else a[:, None]
    if a.ndim != 2 or a.shape[1] == 0:
        got = "empty lists" if a.ndim == 2 else f"nested {a.ndim - 1} levels deep"
        raise InputError(f"{what}: every sample must be a flat list of at least one number, got {got}")
    return a


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


# ----------------------------------------------------------------------------- LEAF's Shakespeare as text

_CONTEXT, _TRAIN, _TEST = 0, 1, 2  # what a character of a rebuilt text is: context only, or whose target


def text_documents(train: str, test: str, block: str = "task.leaf_shakespeare") -> tuple[list, list]:
    """LEAF's Shakespeare (each sample x: 80 characters of a role's lines, y: the next one; a
    sliding window moved one character at a time, each window assigned to the training or the
    test split) -> (training, test) documents ``(user, text, mask)``.

    Each user's text is rebuilt once from its windows of both splits (in order, each window one
    character past the previous: its x ends where the next one's starts); a character is a
    target of the split whose window predicts it, so the training and the test documents hold the
    same text with complementary masks: LEAF's own split, each target in one split, without its
    80-fold repetition of the text. Windows that do not follow on (a gap) start a new document."""
    windows: dict[str, tuple[list[str], list[str]]] = {}
    for which, (path, key) in enumerate(((train, f"{block}.train"), (test, f"{block}.test"))):
        seen = False
        for f, u, xs, ys in read_users(path, key):
            if not ys:
                raise InputError(f"{f}: user {u!r} has no samples ({key}, LEAF's Shakespeare)")
            own = windows.setdefault(str(u), ([], []))[which]
            for j, (x, y) in enumerate(zip(xs, ys)):
                if not (isinstance(x, str) and x and isinstance(y, str) and len(y) == 1):
                    raise InputError(f"{f}: user {u!r}, sample {j}: LEAF's Shakespeare has x a string of "
                                     f"characters and y the next character, got {type(x).__name__} and "
                                     f"{y!r:.20}")
                own.append(x + y)
            seen = True
        if not seen:
            raise InputError(f"{path}: holds no users ({key})")
    train_docs, test_docs = [], []
    for u, (a, b) in windows.items():
        for text, label in _rebuild(a, b):
            if (label == _TRAIN).any():
                train_docs.append((u, text, label == _TRAIN))
            if (label == _TEST).any():
                test_docs.append((u, text, label == _TEST))
    return train_docs, test_docs


def _rebuild(a: list[str], b: list[str]) -> list[tuple[str, np.ndarray]]:
    """The texts a user's training windows ``a`` and test windows ``b`` (each list in order)
    cover, with each character's label. The next window is the one of either list that overlaps
    the text's end most (almost always all but its last character); with neither overlapping
    by half a window, a new text starts, with the one of the two that precedes the other."""
    out, chars, labels, tail = [], [], [], ""  # tail: the text's last window's worth of characters
    i = j = 0

    def flush() -> None:
        if chars:
            out.append(("".join(chars), np.array(labels, dtype=np.int8)))
            chars.clear()
            labels.clear()

    while i < len(a) or j < len(b):
        cands = ([(a[i], _TRAIN)] if i < len(a) else []) + ([(b[j], _TEST)] if j < len(b) else [])
        overlaps = [_overlap(tail, w) for w, _ in cands]
        k = int(np.argmax(overlaps))  # a tie (repetitive text): the training window
        (w, lab), overlap = cands[k], overlaps[k]
        if overlap == 0:  # a new text, opened by whichever window the other one continues
            flush()
            w, lab = cands[1] if len(cands) == 2 and _overlap(cands[1][0], cands[0][0]) else cands[0]
        chars.extend(w[overlap:])
        labels.extend([_CONTEXT] * (len(w) - overlap - 1) + [lab])
        tail = (tail + w[overlap:])[-len(w):]
        if lab == _TRAIN:
            i += 1
        else:
            j += 1
    flush()
    return out


def _overlap(tail: str, w: str) -> int:
    """How many leading characters of window ``w`` the text ending in ``tail`` already ends with:
    ``len(w) - 1`` for the window one character on, else the most of at least half a window, or 0."""
    if len(tail) >= len(w) - 1 and tail.endswith(w[:-1]):
        return len(w) - 1
    return next((o for o in range(len(w) - 2, len(w) // 2 - 1, -1) if tail.endswith(w[:o])), 0)
