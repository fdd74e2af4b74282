"""A dataset plug-in from numpy arrays: ``arms`` interleaved 2-D spirals, one class per arm.

A dataset is a factory ``(cfg) -> DataArrays``; its own keys (``spiral_samples``, ``arms``,
``noise``) sit in the ``task`` block. fedmpi does the rest: the split over clients
(``task.partition``), the cache (``cache=True``: the arrays are kept in ``task.cache_dir``,
keyed by these keys, the seed and this file), placement on each rank's device and minibatches
drawn there. Every rank calls the factory, so it must be a function of the config alone: draw
from ``cfg.seed``, never from global random state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmpi.config import Config, DatasetParams, opt
from fedmpi.data.datasets import DataArrays, register_dataset


@dataclass
class SpiralParams(DatasetParams):
    spiral_samples: int = opt(2000, "training points (and a quarter as many test points)", ge=10)
    arms: int = opt(3, "spiral arms, one class each", ge=2)
    noise: float = opt(0.05, "standard deviation of the noise added to each point", ge=0)


@register_dataset("spirals", params=SpiralParams, cache=True)
def spirals(cfg: Config) -> DataArrays:
    p = cfg.task
    gen = np.random.default_rng([cfg.seed, 17])

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = gen.integers(0, p.arms, n)
        r = gen.uniform(0.05, 1.0, n)  # distance from the centre
        angle = 2 * np.pi * (y / p.arms + 0.75 * r)  # each arm turns by 3/4 of a circle
        x = np.stack([r * np.cos(angle), r * np.sin(angle)], axis=1) + gen.normal(scale=p.noise, size=(n, 2))
        return x.astype(np.float32), y.astype(np.int64)

    x_train, y_train = draw(p.spiral_samples)
    x_test, y_test = draw(max(1, p.spiral_samples // 4))
    return DataArrays(x_train, y_train, x_test, y_test, classes=p.arms)
