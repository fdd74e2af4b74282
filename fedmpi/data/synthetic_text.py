"""``synthetic_text``: a seeded token dataset for tests and quick runs of language models.

Each of ``users`` writers draws sequences from its own Markov chain over a vocabulary of
``vocab`` ids (id 0 is padding): a shared transition matrix, peaked on a few successors per token,
mixed with the writer's own with weight ``heterogeneity``. Sequences are 2 to ``length`` tokens
long (right-padded with 0), so the next-token targets follow the text-data contract
(``DataArrays``: the token after each position, ``IGNORE`` at padding and at the last token).
Every writer is a client of ``task.partition.kind: natural``, with its own test sequences
(``local_test: dataset``). No file is read; the same seed gives the same data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import rng
from ..errors import InputError
from ..schema import opt
from .arrays import IGNORE, DataArrays, TextInfo
from .datasets import DatasetParams, register_dataset


@dataclass
class SyntheticTextConfig:
    samples: int = opt(2000, "training sequences", ge=1, le=10**7)
    test_samples: int = opt(400, "test sequences", ge=1, le=10**7)
    vocab: int = opt(32, "vocabulary size, padding id 0 included", ge=3, le=65536)
    length: int = opt(24, "longest sequence (T): sequences are 2 to length tokens, right-padded", ge=2, le=4096)
    users: int = opt(20, "writers (natural clients), each with its own Markov chain", ge=1)
    heterogeneity: float = opt(0.5, "weight of a writer's own transition matrix against the shared one", ge=0, le=1)


@dataclass
class SyntheticTextParams(DatasetParams):
    synthetic_text: SyntheticTextConfig = opt(SyntheticTextConfig(), "shape of the synthetic token dataset")


def _chains(gen: np.random.Generator, users: int, vocab: int, mix: float) -> np.ndarray:
    """(users, vocab, vocab) cumulative transition probabilities over the ids 1..vocab-1 (row 0 unused)."""
    def peaked(lead: tuple[int, ...]) -> np.ndarray:
        p = gen.dirichlet(np.full(vocab - 1, 0.1), size=lead + (vocab,))
        return np.concatenate([np.zeros(lead + (vocab, 1)), p], axis=-1)

    trans = (1 - mix) * peaked(())[None] + mix * peaked((users,))
    return np.cumsum(trans, axis=-1)


def _sequences(gen: np.random.Generator, cum: np.ndarray, n: int, length: int,
               users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    vocab = cum.shape[-1]
    lengths = gen.integers(2, length + 1, size=n)
    x = np.zeros((n, length), dtype=np.int64)
    x[:, 0] = gen.integers(1, vocab, size=n)
    for j in range(1, length):
        u = gen.random(n)
        rows = cum[users, x[:, j - 1]]
        x[:, j] = np.minimum((rows < u[:, None]).sum(1), vocab - 1)
    pos = np.arange(length)[None, :]
    x[pos >= lengths[:, None]] = 0
    y = np.full((n, length), IGNORE, dtype=np.int64)
    y[:, :-1] = np.where(pos[:, 1:] < lengths[:, None], x[:, 1:], IGNORE)
    return x, y


@register_dataset("synthetic_text", params=SyntheticTextParams)
def synthetic_text(cfg) -> DataArrays:
    """The dataset of the module docstring."""
    s = cfg.task.synthetic_text
    need = 8 * s.users * s.vocab * s.vocab + 24 * (s.samples + s.test_samples) * s.length
    if need > 2**31:
        raise InputError(f"task.synthetic_text: {s.users} writers x {s.vocab}^2 transitions and "
                         f"{s.samples + s.test_samples} sequences of {s.length} need {need / 2**30:.1f} GiB; "
                         f"make it smaller")
    gen = rng.generator(cfg.seed, "synthetic_text")
    cum = _chains(gen, s.users, s.vocab, s.heterogeneity)
    train_users = np.sort(gen.integers(0, s.users, size=s.samples))
    test_users = np.sort(gen.integers(0, s.users, size=s.test_samples))
    xtr, ytr = _sequences(gen, cum, s.samples, s.length, train_users)
    xte, yte = _sequences(gen, cum, s.test_samples, s.length, test_users)
    return DataArrays(xtr, ytr, xte, yte, s.vocab, client_train=train_users, client_test=test_users,
                      text=TextInfo(vocab_size=s.vocab, pad_id=0, tokenizer="synthetic"))
