"""Documents -> token sequences: the samples of a text dataset (docs/DATASETS.md, "Text").

A document is one text of one client (a speech of a role, a JSONL record, a LEAF user's text)
with, per character, whether it is to be learnt (``mask``; None: all of it). It becomes
``[bos] + its tokens + [eos]`` (those of the two ids the tokenizer has). Position j's target is
the next token of the same document when that token is to be learnt (its first character's mask),
else ``IGNORE``: so a document's last token has none (targets never cross documents), nor does
the token before a prompt token under a response-only loss. The bos is never a target; the eos is
one when the document's last character is.

``documents`` says how documents become sequences of ``context`` (T) tokens:

- ``pack``: a client's documents one after another (in the reader's order), cut every T tokens;
  only the client's last sequence is right-padded. A sequence may hold the end of one document
  and the start of the next (attention sees both; targets stay within each).
- ``pad``: each document cut on its own every T tokens, its last sequence right-padded.
- ``truncate``: each document's first T tokens only (right-padded when shorter).

A sequence left with no target (all prompt, or a lone bos) is dropped: it would add nothing to a
loss averaged over targets, and a minibatch of only such sequences would have none.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import psutil

from ..errors import InputError
from .arrays import IGNORE
from .tokenize import Tokenizer

log = logging.getLogger(__name__)

Documents = Literal["pack", "pad", "truncate"]


@dataclass
class Document:
    """One text of one client; ``mask``: bool per character, True where it is to be learnt."""

    client: int
    text: str
    mask: Optional[np.ndarray] = None


def held_out(n: int, fraction: float) -> int:
    """How many of a client's ``n`` documents (its last ones) form its test split: ``fraction``
    of them rounded, at least one and at most all but one (none of a single document)."""
    return min(max(1, round(fraction * n)), n - 1) if n > 1 and fraction > 0 else 0


def sequences(docs: list[Document], tok: Tokenizer, context: int, documents: Documents,
              what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, client) of ``docs``: int64 token ids (N, T) right-padded with the pad id, their
    targets (N, T) (``IGNORE`` where none) and each sequence's client. ``what`` names the split in
    messages."""
    info = tok.info
    if not docs:
        return np.zeros((0, context), np.int64), np.zeros((0, context), np.int64), np.zeros(0, np.int64)
    docs = sorted(docs, key=lambda d: d.client) if documents == "pack" else docs  # stable: reader's order kept
    stream, target, lengths = _tokens(docs, tok)
    clients = np.fromiter((d.client for d in docs), dtype=np.int64, count=len(docs))
    if documents == "pack":  # one unit per client: its documents' tokens, contiguous after the sort
        first_doc = np.flatnonzero(np.r_[True, np.diff(clients) != 0])
        unit_len, unit_client = np.add.reduceat(lengths, first_doc), clients[first_doc]
    else:
        unit_len, unit_client = lengths, clients
    unit_start = np.cumsum(unit_len) - unit_len
    chunks = -(-unit_len // context)
    if documents == "truncate":
        chunks = np.minimum(chunks, 1)
    n = int(chunks.sum())
    need = 2 * 8 * n * context
    free = psutil.virtual_memory().available
    if need > free // 2:
        raise InputError(f"task.text.context: {n} {what} sequences of {context} tokens need {need / 2**30:.1f} GiB, "
                         f"more than half of the {free / 2**30:.1f} GiB available")
    unit = np.repeat(np.arange(len(unit_len)), chunks)
    k = np.arange(n) - np.repeat(np.cumsum(chunks) - chunks, chunks)  # chunk index within its unit
    start = unit_start[unit] + k * context
    length = np.minimum(context, unit_len[unit] - k * context)
    x = np.full((n, context), info.pad_id, dtype=np.int64)
    y = np.full((n, context), IGNORE, dtype=np.int64)
    valid = np.arange(context)[None, :] < length[:, None]
    pos = (start[:, None] + np.arange(context)[None, :])[valid]
    x[valid], y[valid] = stream[pos], target[pos]
    keep = (y != IGNORE).any(axis=1)
    if not keep.all():
        log.info("%s: %d of %d sequences have no target (all prompt or too short) and are left out",
                 what, int((~keep).sum()), n)
    return x[keep], y[keep], unit_client[unit][keep]


def _tokens(docs: list[Document], tok: Tokenizer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every document's ``[bos] tokens [eos]`` one after another, each position's target, and
    each document's length in tokens."""
    info = tok.info
    ids, first, counts = tok.encode([d.text for d in docs])
    chars = np.fromiter((len(d.text) for d in docs), dtype=np.int64, count=len(docs))
    char_start = np.cumsum(chars) - chars
    doc_of = np.repeat(np.arange(len(docs)), counts)
    if all(d.mask is None for d in docs):
        learn, last = np.ones(len(ids), bool), np.ones(len(docs), bool)
    else:
        masks = [np.ones(len(d.text), bool) if d.mask is None else np.asarray(d.mask, bool) for d in docs]
        if any(len(m) != n for m, n in zip(masks, chars)):
            raise ValueError("a document's mask must have one value per character")
        flat = np.concatenate(masks) if masks else np.zeros(0, bool)
        learn = flat[char_start[doc_of] + first]
        last = np.zeros(len(docs), bool)
        last[chars > 0] = flat[(char_start + chars - 1)[chars > 0]]
    nb, ne = int(info.bos_id is not None), int(info.eos_id is not None)
    lengths = counts + nb + ne
    start = np.cumsum(lengths) - lengths
    stream = np.empty(int(lengths.sum()), dtype=np.int64)
    learnt = np.zeros(len(stream), bool)
    at = start[doc_of] + nb + np.arange(len(ids)) - np.repeat(np.cumsum(counts) - counts, counts)
    stream[at], learnt[at] = ids, learn
    if nb:
        stream[start] = info.bos_id
    if ne:
        stream[start + nb + counts], learnt[start + nb + counts] = info.eos_id, last
    target = np.full(len(stream), IGNORE, dtype=np.int64)
    follows = learnt[1:].copy()  # position j + 1 is learnt and in the same document as j
    ends = np.cumsum(lengths)
    follows[ends[ends < len(stream)] - 1] = False
    target[:-1][follows] = stream[1:][follows]
    return stream, target, lengths
