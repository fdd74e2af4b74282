"""The text datasets' one path from a reader's documents to ``DataArrays`` (docs/DATASETS.md,
"Text"); ``fedmpi.data.datasets`` registers them and declares their keys (``task.text``: the
tokenizer, the context, how documents become sequences; each dataset's own block).

- ``shakespeare``: the embedded default, Shakespeare's plays, each speaking role a client
  (``plays``), read offline from what ``launch/install.sh`` downloaded;
- ``leaf_shakespeare``: LEAF's Shakespeare JSON, each user a client, LEAF's own split by sample
  as the local test splits (``leaf.text_documents``);
- ``jsonl``: JSONL text, instruction or chat records with a user field (``jsonl``).

A reader gives documents ``(client name, text, mask)`` of the training and the test split;
clients are numbered in order of first appearance in the training documents (a test document of
a client with none: no client's, id -1), and ``sequences`` cuts them into the samples, one
sequence of ``task.text.context`` tokens each.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Optional

import numpy as np

from ..errors import InputError
from . import jsonl, leaf, plays, readers, tokenize
from .arrays import IGNORE, DataArrays
from .sequences import Document, held_out, sequences

if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger(__name__)

Docs = list[tuple[str, str, Optional[np.ndarray]]]


def text_arrays(cfg: Config, train: Docs, test: Docs, where: str) -> DataArrays:
    """The samples of a text dataset from its documents ``(client name, text, mask)``."""
    t = cfg.task.text
    tok = tokenize.load(_tokenizer(cfg))
    ids = {name: i for i, name in enumerate(dict.fromkeys(name for name, _, _ in train))}
    if not ids:
        raise InputError(f"{where}: no training text")
    if not test:
        raise InputError(f"{where}: no test text (every client too small to hold some out?)")
    split = {}
    for what, docs in (("training", train), ("test", test)):
        split[what] = sequences([Document(ids.get(name, -1), text, mask) for name, text, mask in docs],
                                tok, t.context, t.documents, f"{where} {what}")
        if not len(split[what][0]):
            raise InputError(f"{where}: no {what} sequence has a target to learn")
    (xtr, ytr, ctr), (xte, yte, cte) = split["training"], split["test"]
    log.info("%s: %d clients, %d training and %d test sequences of %d tokens (%s; %.0f%% of the training "
             "positions without a target)", where, len(ids), len(xtr), len(xte), t.context, tok.info.tokenizer,
             100 * float(np.mean(ytr == IGNORE)))
    return DataArrays(xtr, ytr, xte, yte, tok.info.vocab_size, client_train=ctr, client_test=cte, text=tok.info)


def _tokenizer(cfg: Config) -> str:
    """``task.text.tokenizer``; its default (bytes) under ``task.model: hf`` is the model folder
    (``task.path``) when it holds a tokenizer.json: the model's ids are that tokenizer's."""
    spec, folder = cfg.task.text.tokenizer, getattr(cfg.task, "path", None)
    if spec == tokenize.BYTES and cfg.task.model == "hf" and folder is not None \
            and os.path.isfile(os.path.join(os.path.expanduser(folder), "tokenizer.json")):
        return folder
    return spec


def tokenizer_files(cfg: Config) -> list[str]:
    """The files the tokenizer of ``cfg`` reads (``tokenizer.json`` and the
    ``tokenizer_config.json`` beside it, when there is one; none for ``bytes``): what of a model
    folder a text dataset depends on (``datasets.dataset_arrays``' cache key)."""
    spec = _tokenizer(cfg)
    if spec == tokenize.BYTES:
        return []
    path = os.path.abspath(os.path.expanduser(spec))
    path = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    beside = os.path.join(os.path.dirname(path), "tokenizer_config.json")
    return [p for p in (path, beside) if os.path.isfile(p)]


def shakespeare_arrays(cfg: Config) -> DataArrays:
    """Shakespeare's plays by speaking role (``plays``), or synthetic text when they are missing
    at the standard location (``fallback_synthetic``)."""
    s = cfg.task.shakespeare
    root = os.path.abspath(os.path.expanduser(cfg.task.root or os.path.join(readers.data_home(), "shakespeare")))
    try:
        found = plays.read(root, s.plays)
    except readers.DatasetMissing as e:  # absent only; a damaged corpus stays an error
        if cfg.task.root is not None or not s.fallback_synthetic:
            raise
        log.info("Shakespeare's plays not found (%s); using synthetic text instead", e)
        found = plays.synthetic(cfg.seed)
    train, test = plays.split(found, s.test_fraction, s.min_speeches)
    return text_arrays(cfg, train, test, "task.dataset: 'shakespeare'")


def leaf_shakespeare_arrays(cfg: Config) -> DataArrays:
    """LEAF's Shakespeare: each user's windows rebuilt into its text (``leaf.text_documents``)."""
    p = cfg.task.leaf_shakespeare
    train, test = leaf.text_documents(p.train, p.test, "task.leaf_shakespeare")
    return text_arrays(cfg, train, test, "task.dataset: 'leaf_shakespeare'")


def jsonl_arrays(cfg: Config) -> DataArrays:
    """JSONL records of users (``jsonl``); without a test file, each user's last records."""
    j = cfg.task.jsonl
    users = jsonl.read(j.train, "task.jsonl.train", j.user_field, j.loss)
    if j.test is not None:
        train = [r for records in users for r in records]
        test = [r for records in jsonl.read(j.test, "task.jsonl.test", j.user_field, j.loss) for r in records]
    else:
        train, test = [], []
        for records in users:
            n = len(records) - held_out(len(records), j.test_fraction)
            train += records[:n]
            test += records[n:]
    return text_arrays(cfg, train, test, "task.dataset: 'jsonl'")
