"""Sporadic SGD and sporadic links: probabilities d_i, b_ij and indicators v_i, v_ij.

Probabilities are drawn once per seed (and once per epoch k // redraw_every when
``sporadicity.redraw_every`` > 0) from Beta(a, b), U(lo, hi] (never 0) or a fixed value: d_i per
client from stream (seed, "sgd_prob", epoch), b_ij per undirected edge from
(seed, "link_prob", epoch).

Each iteration k draws fresh indicators from counter-based streams, identical on every rank:

- v_i ~ Bern(d_i), counter i of stream (seed, "sgd", k);
- ``per_edge`` (paper): one v_ij ~ Bern(b_ij) per undirected edge, counter e of (seed, "link", k);
- ``per_endpoint``: each endpoint tries with probability b_ij (counters 2e, 2e+1) and the link
  fires if either does, i.e. with probability 1 - (1 - b_ij)^2 -- the per-iteration draw of the
  authors' code. Only that draw: both options redraw every iteration, as the paper and the
  authors' first commit do. In their latest commit the reset at the start of an iteration writes
  ``neighbor['vhat'] = 0`` while the flag is ``'v_hat'``, so a link that fires once stays on for
  the rest of the run (in a mock of their lines: first fire at iteration 18, then on every
  iteration), and their DSpodFL pays DGD's transmission delay from then on. fedmpi does not
  reproduce that bug.

``force_sgd`` / ``force_links`` make every indicator 1 (DGD, RG, sporadic SGD); the drawn d, b
are still what ``probabilities`` returns, because the emulated delay uses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np

from .. import rng
from ..errors import InputError
from ..schema import opt
from .topology import Graph


@dataclass
class ProbDistConfig:
    dist: Literal["beta", "uniform", "fixed"] = opt("beta", "distribution of the probabilities")
    a: float = opt(0.5, "beta: a", gt=0)
    b: float = opt(0.5, "beta: b", gt=0)
    lo: float = opt(0.0, "uniform: lower end (exclusive of 0)", ge=0, le=1)
    hi: float = opt(1.0, "uniform: upper end", gt=0, le=1)
    value: float = opt(1.0, "fixed: the probability", gt=0, le=1)


@dataclass
class SporadicityConfig:
    sgd_prob: ProbDistConfig = opt(ProbDistConfig(), "d_i: probability that client i takes an SGD step")
    link_prob: ProbDistConfig = opt(ProbDistConfig(), "b_ij: probability that edge ij is active")
    link_draw: Literal["per_edge", "per_endpoint"] = opt(
        "per_edge", "per_endpoint: link fires w.p. 1-(1-b)^2, the authors' draw (redrawn every iteration)")
    redraw_every: int = opt(0, "redraw d_i, b_ij every N iterations; 0 = never", ge=0)
    delay: Literal["raw", "normalized"] = opt(
        "raw", "emulated delay: raw (what the authors' stop budget sums) or normalized (their logged utilisation)")
    max_delay: Optional[float] = opt(None, "stop once the cumulative emulated delay reaches this", gt=0)

_P_MIN = float(np.finfo(np.float64).eps)  # a drawn probability is never 0 (delay divides by it)


def draw_probabilities(cfg: SporadicityConfig, graph: Graph, seed: int,
                       epoch: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(d (m,), b (E,)) in (0, 1]: SGD probability per client, link probability per edge."""
    d = _draw(cfg.sgd_prob, graph.m, seed, "sgd_prob", epoch, "sporadicity.sgd_prob")
    b = _draw(cfg.link_prob, graph.num_edges, seed, "link_prob", epoch, "sporadicity.link_prob")
    return d, b


def _draw(p: ProbDistConfig, n: int, seed: int, purpose: str, epoch: int, key: str) -> np.ndarray:
    if p.dist == "fixed":
        return np.full(n, float(p.value))
    gen = rng.generator(seed, purpose, epoch)
    if p.dist == "uniform":
        if p.lo > p.hi:
            raise InputError(f"{key}.lo: must be <= hi ({p.hi}), got {p.lo}")
        return p.hi - (p.hi - p.lo) * gen.random(n)  # U(lo, hi]
    if p.dist == "beta":
        return np.clip(gen.beta(p.a, p.b, n), _P_MIN, 1.0)
    raise InputError(f"{key}.dist: unknown distribution {p.dist!r}")


class Indicators:
    """Per-iteration indicators (v_i, v_ij) and the probabilities in force at iteration k."""

    def __init__(self, cfg: SporadicityConfig, graph: Graph, seed: int, *,
                 force_sgd: bool = False, force_links: bool = False) -> None:
        self.cfg, self.graph, self.seed = cfg, graph, seed
        self.force_sgd, self.force_links = force_sgd, force_links
        self.per_endpoint = cfg.link_draw == "per_endpoint"
        self._w_sgd = rng.weyl(np.arange(graph.m))
        self._w_link = rng.weyl(np.arange(graph.num_edges * (2 if self.per_endpoint else 1)))
        self._epoch: int | None = None

    def epoch(self, k: int) -> int:
        return k // self.cfg.redraw_every if self.cfg.redraw_every > 0 else 0

    def probabilities(self, k: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The drawn (d, b) in force at iteration k (what the delay uses)."""
        e = self.epoch(k)
        if e != self._epoch:
            self._d, self._b = draw_probabilities(self.cfg, self.graph, self.seed, e)
            self._t_sgd, self._t_link = rng.threshold(self._d), rng.threshold(self._b)
            self._epoch = e
        return self._d, self._b

    def draw(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(v (m,) bool, v_edges (E,) bool) of iteration k."""
        self.probabilities(k)
        m, n_e = self.graph.m, self.graph.num_edges
        if self.force_sgd:
            v = np.ones(m, bool)
        else:
            v = rng.bits_weyl(rng.key(self.seed, "sgd", k), self._w_sgd) < self._t_sgd
        if self.force_links:
            return v, np.ones(n_e, bool)
        tries = rng.bits_weyl(rng.key(self.seed, "link", k), self._w_link)
        if self.per_endpoint:
            tries = tries.reshape(n_e, 2) < self._t_link[:, None]
            return v, tries.any(axis=1)
        return v, tries < self._t_link
