"""``DataArrays``: what every dataset provides, before partitioning and device placement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


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
    also stays in the global test set."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    mean: Optional[tuple] = None
    std: Optional[tuple] = None
    client_train: Optional[np.ndarray] = None
    client_test: Optional[np.ndarray] = None

    @property
    def image(self) -> bool:
        return self.mean is not None
