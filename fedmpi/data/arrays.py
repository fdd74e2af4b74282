"""``DataArrays``: what every dataset provides, before partitioning and device placement;
``TextInfo``: what a text dataset adds (its tokenizer's vocabulary and special ids)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

#: the target of a position that has none (padding, a document's last token, a masked prompt):
#: PyTorch's ``cross_entropy`` and Hugging Face's ``ignore_index``
IGNORE = -100


@dataclass(frozen=True)
class TextInfo:
    """The tokenizer behind a text dataset's token ids.

    ``vocab_size``: ids are in [0, vocab_size) (``DataArrays.classes`` is the same number);
    ``pad_id``: the id right-padding fills (never a target: its targets are ``IGNORE``);
    ``tokenizer``: a short description, ``"bytes"`` for the built-in byte-level tokenizer or
    ``"<path> sha256:<digest>"`` for a ``tokenizer.json``; ``bos_id``/``eos_id``: the ids that
    open and close each document, or None when the tokenizer has none."""

    vocab_size: int
    pad_id: int
    tokenizer: str
    bos_id: Optional[int] = None
    eos_id: Optional[int] = None


@dataclass
class DataArrays:
    """Training and test samples with int64 labels in [0, classes), or, with ``classes`` 0
    (regression), float targets (N,) or (N, k) fitted by mean squared error.

    ``x``: float32 features of any shape, or uint8 images (N, C, H, W) with the per-channel
    ``mean``/``std`` on the [0, 1] scale (then inputs are normalised on the device and
    ``train.augment`` applies). ``client_train``: the dataset's own client id of each training
    sample (any integers), used by ``task.partition.kind: natural``; ``client_test``: the same ids
    for the test samples (an id no training sample has: a test sample of no client), which
    ``task.partition.local_test: dataset`` makes the clients' local test splits. Every test sample
    also stays in the global test set.

    Text (``text`` given): a sample is one sequence of T tokens. ``x``: int64 token ids (N, T) in
    [0, classes), right-padded with ``text.pad_id`` (so causal attention needs no mask);
    ``y``: int64 next-token targets (N, T), ``y[:, j]`` the token after ``x[:, j]``, and
    ``IGNORE`` (-100) where there is none to learn: padding, a document's last token, a prompt
    token under a response-only loss. ``classes`` = ``text.vocab_size``."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    mean: Optional[tuple] = None
    std: Optional[tuple] = None
    client_train: Optional[np.ndarray] = None
    client_test: Optional[np.ndarray] = None
    text: Optional[TextInfo] = None

    @property
    def image(self) -> bool:
        return self.mean is not None
