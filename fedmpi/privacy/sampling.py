"""What the noise scale and the accountant need to know about who takes part (docs/PRIVACY.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..participation import Participation
from .params import separation_of


@dataclass(frozen=True)
class Sampling:
    """How one client takes part in the rounds, for accounting.

    ``cohort``: expected clients per round, the fixed divisor of the noisy sum (the realised
    count would reveal who took part); ``q``: the largest probability that a client takes part in
    a round it may take part in, drawn independently of everything else (1: no amplification);
    ``fixed``: (m, size) for a uniform sample of fixed size; ``separation``: the fewest rounds
    between two participations of one client."""

    cohort: float
    q: float = 1.0
    fixed: tuple[int, int] | None = None
    separation: int = 1

    def participations(self, rounds: int) -> int:
        """The most rounds out of ``rounds`` in which one client can take part."""
        return math.ceil(rounds / self.separation)


def sampling_of(cfg, participation: Participation, amplified: bool = True) -> Sampling:
    """The ``Sampling`` of the availability kinds that ``params.KNOWN_SAMPLING`` lists; with
    ``amplified`` False (an algorithm whose release shows who took part) q = 1 and no fixed-size
    sample, which every Bernoulli kind (``params.BERNOULLI``) then also has."""
    if not amplified:
        return replace(_sampling(cfg, participation), q=1.0, fixed=None)
    return _sampling(cfg, participation)


def _sampling(cfg, participation: Participation) -> Sampling:
    kind, m = cfg.availability.kind, participation.m
    if kind == "always":
        return Sampling(cohort=float(m))
    if kind == "cohort":
        size = cfg.availability.size
        return Sampling(cohort=float(size), fixed=(m, size)) if size < m else Sampling(cohort=float(m))
    if kind == "markov":
        return Sampling(cohort=float(participation.clients_per_round), separation=separation_of(cfg))
    # Bernoulli kinds: stationary (one period), cyclic (a period of K rounds), the others all rounds
    period = {"stationary": 1, "cyclic": getattr(cfg.availability, "groups", 1)}.get(kind, cfg.rounds)
    p = np.stack([participation.probabilities(t) for t in range(period)])
    return Sampling(cohort=float(p.sum() / period), q=float(p.max()), separation=separation_of(cfg))
