"""The basic kinds: ``always``, ``cohort`` (fixed-size uniform sample), ``stationary``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import rng
from ..errors import InputError
from ..schema import opt
from .base import AvailabilityParams, Bernoulli, ClientInfo, Participation, Sampling, register
from .probs import WithBaseParams, base_probabilities, check_base, data_key


class Always(Participation):
    """Full participation: everyone, every round."""

    derived = ("_all",)

    def __init__(self, m: int, seed: int):
        super().__init__(m, seed)
        self._all = np.arange(m)

    def available(self, t: int) -> np.ndarray:
        return self._all

    def probabilities(self, t: int) -> np.ndarray:
        return np.ones(self.m)

    def sampling(self, rounds: int) -> Sampling:
        return Sampling("none", float(self.m))


class Cohort(Participation):
    """Exactly ``size`` clients drawn uniformly without replacement each round.

    The ``size`` clients with the smallest counter-based keys are taken: O(m) per round,
    identical on every rank.
    """

    derived = ("_w", "_buf")  # the clients' Weyl counters and a scratch buffer
    configuration = ("size",)

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

    def sampling(self, rounds: int) -> Sampling:
        if self.size >= self.m:
            return Sampling("none", float(self.m))
        return Sampling("fixed_size", float(self.size), q=self.size / self.m, m=self.m, size=self.size)


@dataclass
class CohortParams(AvailabilityParams):
    size: int = opt(10, "cohort: clients drawn uniformly per round", ge=1)


def _check_cohort(cfg) -> None:
    if cfg.availability.size > cfg.task.clients:
        raise InputError(f"availability.size: cohort of {cfg.availability.size} exceeds task.clients "
                         f"({cfg.task.clients})")


@register("always")
def _always(cfg: AvailabilityParams, info: ClientInfo) -> Participation:
    return Always(info.m, info.seed)


@register("cohort", params=CohortParams, check=_check_cohort)
def _cohort(cfg: CohortParams, info: ClientInfo) -> Participation:
    return Cohort(info.m, info.seed, cfg.size)


@register("stationary", params=WithBaseParams, check=check_base)
def _stationary(cfg: WithBaseParams, info: ClientInfo) -> Participation:
    p = base_probabilities(cfg.base, info)
    return Bernoulli(info.m, info.seed, lambda t: p, static=True, data=data_key(cfg.base))
