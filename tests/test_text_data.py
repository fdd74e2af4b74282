"""Text datasets (docs/DATASETS.md, "Text"): the contract every text dataset follows
(``DataArrays.text``), tokenizers, sequences, the readers and the embedded default, on tiny files
written by the tests."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedmpi.data.arrays import IGNORE, DataArrays, TextInfo
from fedmpi.data.datasets import checked_arrays
from fedmpi.errors import InputError


def _tiny_text() -> DataArrays:
    """Two sequences of 4 tokens over a vocabulary of 10 (pad 9), following the contract."""
    x = np.array([[1, 2, 3, 4], [5, 6, 9, 9]])
    y = np.array([[2, 3, 4, IGNORE], [6, IGNORE, IGNORE, IGNORE]])
    return DataArrays(x, y, x[:1], y[:1], 10, client_train=np.array([0, 1]), client_test=np.array([0]),
                      text=TextInfo(vocab_size=10, pad_id=9, tokenizer="test", bos_id=None, eos_id=8))


def test_checked_arrays_takes_token_sequences():
    data = checked_arrays(_tiny_text(), "t")
    assert data.x_train.dtype == np.int64 and data.y_train.shape == (2, 4) and data.text.pad_id == 9


@pytest.mark.parametrize("change, message", [
    (dict(classes=11), "classes must be its vocabulary size"),
    (dict(x_train=np.array([[1, 2, 3, 10], [5, 6, 9, 9]])), r"x_train must hold token ids in \[0, 10\)"),
    (dict(y_train=np.array([[2, 3, 4, -1], [6, IGNORE, IGNORE, IGNORE]])), "y_train must hold token ids"),
    (dict(y_train=np.full((2, 4), IGNORE)), "y_train has no target"),
    (dict(x_test=np.array([1, 2])), "x_test and y_test must be token sequences"),
    (dict(x_train=np.ones((2, 4), np.float32)), "must hold integer token ids"),
    (dict(text=TextInfo(vocab_size=10, pad_id=10, tokenizer="t")), r"text.pad_id must be a token id in \[0, 10\)"),
    (dict(text=TextInfo(vocab_size=10, pad_id=0, tokenizer="t", eos_id=-1)), "text.eos_id"),
    (dict(mean=(0.5,), std=(0.5,)), "without mean/std"),
])
def test_checked_arrays_refuses_what_breaks_the_text_contract(change, message):
    with pytest.raises(InputError, match=message):
        checked_arrays(dataclasses.replace(_tiny_text(), **change), "t")
