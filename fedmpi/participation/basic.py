"""The basic kinds: ``always``, ``cohort`` (fixed-size uniform sample), ``stationary``."""

from __future__ import annotations

import numpy as np

from .. import rng
from ..config import AvailabilityConfig
from .base import Bernoulli, ClientInfo, Participation, register
from .probs import base_probabilities


class Always(Participation):
    """Full participation: everyone, every round."""

    def __init__(self, m: int, seed: int):
        super().__init__(m, seed)
        self._all = np.arange(m)

    def available(self, t: int) -> np.ndarray:
        return self._all

    def probabilities(self, t: int) -> np.ndarray:
        return np.ones(self.m)


class Cohort(Participation):
    """Exactly ``size`` clients drawn uniformly without replacement each round.

    The ``size`` clients with the smallest counter-based keys are taken: O(m) per round,
    identical on every rank.
    """

    def __init__(self, m: int, seed: int, size: int):
        super().__init__(m, seed)
        self.size = size
        self._w = rng.weyl(np.arange(m))
        self._buf = np.empty(m, dtype=np.uint64)

    def available(self, t: int) -> np.ndarray:
        if self.size >= self.m:
            return np.arange(self.m)
        keys = rng.bits_weyl(rng.key(self.seed, "cohort", t), self._w, out=self._buf)
        return np.sort(np.argpartition(keys, self.size - 1)[: self.size])

    def probabilities(self, t: int) -> np.ndarray:
        return np.full(self.m, self.size / self.m)


@register("always")
def _always(cfg: AvailabilityConfig, info: ClientInfo) -> Participation:
    return Always(info.m, info.seed)


@register("cohort")
def _cohort(cfg: AvailabilityConfig, info: ClientInfo) -> Participation:
    return Cohort(info.m, info.seed, cfg.size)


@register("stationary")
def _stationary(cfg: AvailabilityConfig, info: ClientInfo) -> Participation:
    p = base_probabilities(cfg.base, info)
    return Bernoulli(info.m, info.seed, lambda t: p, static=True)
