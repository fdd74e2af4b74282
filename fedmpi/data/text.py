"""The text datasets: their common keys (``task.text``: tokenizer, context, documents), their
registration, and the one path from a reader's documents to ``DataArrays`` (docs/DATASETS.md,
"Text").

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional

import numpy as np

from ..errors import InputError
from ..schema import opt
from .arrays import IGNORE, DataArrays
from .datasets import DatasetParams, LeafSplits, register_dataset

if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger(__name__)

MAX_CONTEXT = 1 << 16


@dataclass
class TextConfig:
    tokenizer: str = opt("bytes", "bytes (built in: ids 0-255 the UTF-8 bytes, 256 pad, 257 bos, 258 eos) or a "
                                  "tokenizer.json, or the model folder holding it (needs pip install 'fedmpi[llm]')")
    context: int = opt(64, "tokens per sequence T (a sample is one sequence; train.batch_size counts sequences)",
                       ge=1, le=MAX_CONTEXT)
    documents: Literal["pack", "pad", "truncate"] = opt(
        "pack", "pack: a client's documents one after another, cut every T tokens (a sequence may span two; "
                "targets never do); pad: each document starts a sequence, its last one right-padded; truncate: "
                "each document's first T tokens only")


@dataclass
class TextParams(DatasetParams):
    """The keys every text dataset has."""

    text: TextConfig = opt(TextConfig(), "tokenizer and sequences of a text dataset")


Docs = list[tuple[str, str, Optional[np.ndarray]]]


def text_arrays(cfg: Config, train: Docs, test: Docs, where: str) -> DataArrays:
    """The samples of a text dataset from its documents ``(client name, text, mask)``."""
    from . import tokenize
    from .sequences import Document, sequences

    t = cfg.task.text
    tok = tokenize.load(t.tokenizer)
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


# ----------------------------------------------------------------------------- shakespeare (embedded)

@dataclass
class ShakespeareConfig:
    plays: Optional[list[str]] = opt(None, "plays by file name (hamlet, macbeth, the-tempest, ...); null = all 38")
    test_fraction: float = opt(0.2, "each role's last speeches held out as its local test split", ge=0, lt=1)
    min_speeches: int = opt(2, "roles with fewer speeches are left out (McMahan et al. keep roles of two lines)",
                            ge=1)
    fallback_synthetic: bool = opt(True, "plays missing at the standard location -> seeded synthetic text, with "
                                         "a one-line notice (else exit 2)")


@dataclass
class ShakespeareParams(TextParams):
    shakespeare: ShakespeareConfig = opt(ShakespeareConfig(), "Shakespeare's plays, each speaking role a client "
                                                              "(task.root: null = $FEDMPI_DATA/shakespeare)")


@register_dataset("shakespeare", params=ShakespeareParams)
def shakespeare_data(cfg: Config) -> DataArrays:
    """The embedded default: Shakespeare's plays by speaking role (``fedmpi.data.plays``)."""
    import os

    from . import plays, readers

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


# ----------------------------------------------------------------------------- LEAF's Shakespeare

@dataclass
class LeafTextParams(TextParams):
    leaf_shakespeare: LeafSplits = opt(LeafSplits(), "LEAF's Shakespeare JSON files (users are the clients)")


@register_dataset("leaf_shakespeare", params=LeafTextParams, cache=True)
def leaf_shakespeare_data(cfg: Config) -> DataArrays:
    """LEAF's Shakespeare as text: each user's windows rebuilt into its lines (``leaf.text_documents``)."""
    from . import leaf

    p = cfg.task.leaf_shakespeare
    train, test = leaf.text_documents(p.train, p.test, "task.leaf_shakespeare")
    return text_arrays(cfg, train, test, "task.dataset: 'leaf_shakespeare'")


# ----------------------------------------------------------------------------- JSONL

@dataclass
class JsonlConfig:
    train: str = opt("", "training records: a .jsonl file or a folder of them")
    test: Optional[str] = opt(None, "test records (same layout); null = each user's last test_fraction of records")
    user_field: str = opt("user_id", "the field naming a record's user (its client)")
    test_fraction: float = opt(0.1, "with test null: each user's last records held out as its local test split",
                               ge=0, lt=1)
    loss: Literal["all", "response"] = opt("all", "all: every token is learnt; response: only responses (assistant "
                                                  "turns), prompts are context")


@dataclass
class JsonlParams(TextParams):
    jsonl: JsonlConfig = opt(JsonlConfig(), "JSONL text, instruction or chat records with a user field")


def _check_jsonl(cfg: Config) -> None:
    j = cfg.task.jsonl
    if j.test is None and j.test_fraction == 0:
        raise InputError("task.jsonl.test_fraction: 0 with task.jsonl.test null leaves no test records; "
                         "give task.jsonl.test or a fraction > 0")


@register_dataset("jsonl", params=JsonlParams, check=_check_jsonl, cache=True)
def jsonl_data(cfg: Config) -> DataArrays:
    """JSONL records of users (``fedmpi.data.jsonl``)."""
    from . import jsonl
    from .sequences import held_out

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
