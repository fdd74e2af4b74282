"""DSpodFL (Decentralized Sporadic FL) and its special cases, as presets of one mechanism.

All five run ``Decentralized`` (x_i <- x_i + sum_j r_ij v_ij (x_j - x_i) - alpha v_i g_i(x_i));
they differ only in the indicators v_i, v_ij. The emulated delay always uses the drawn
d_i, b_ij (a client with small d_i is slow even when a baseline makes it compute every time).

- ``dspodfl``:      v_i ~ Bern(d_i), v_ij ~ Bern(b_ij)
- ``dgd``:          v_i = 1, v_ij = 1
- ``rg``:           v_i = 1, v_ij ~ Bern(b_ij)          (randomized gossip)
- ``sporadic_sgd``: v_i ~ Bern(d_i), v_ij = 1
- ``dfedavg``:      D SGD-only iterations (v_i = 1, v_ij = 0), then one aggregation-only
                    iteration (v_i = 0, v_ij = 1), D = ceil(mean_i 1/d_i); with
                    ``algorithm.dfedavg_steps: authors`` D = int(mean_i 1/d_i) + 1 as the authors'
                    code (``determine_DandB``): one more step when the mean is an integer
                    (d_i = 0.5 for all: 2 vs 3)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..schema import opt
from .base import AlgorithmParams, register
from .decentralized import Decentralized


@register("dspodfl")
class DSpodFL(Decentralized):
    """Sporadic SGD and sporadic links."""


@register("dgd")
class DGD(Decentralized):
    """Distributed (stochastic) gradient descent: every client and link, every iteration."""

    force_sgd = force_links = True


@register("rg")
class RandomizedGossip(Decentralized):
    """SGD every iteration, sporadic links."""

    force_sgd = True


@register("sporadic_sgd")
class SporadicSGD(Decentralized):
    """Sporadic SGD, every link every iteration."""

    force_links = True


@dataclass
class DFedAvgParams(AlgorithmParams):
    dfedavg_steps: Literal["ceil", "authors"] = opt(
        "ceil", "D = ceil(mean 1/d_i), or int(mean 1/d_i) + 1 as the authors' code")


@register("dfedavg")
class DFedAvg(Decentralized):
    """Decentralized FedAvg (local SGD): iteration k aggregates iff k mod (D + 1) = D."""

    Params = DFedAvgParams
    force_sgd = force_links = True

    def local_steps(self, k: int) -> int:
        """D from the d_i in force at iteration k: ceil(mean 1/d_i), or int(mean 1/d_i) + 1 (authors)."""
        d, _ = self.sporadic.probabilities(k)
        mean = float(np.mean(1.0 / d))
        if self.params.dfedavg_steps == "authors":
            return int(mean) + 1
        return max(1, math.ceil(mean))

    def aggregates(self, k: int) -> bool:
        return k % (self.local_steps(k) + 1) == self.local_steps(k)

    def indicators(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        v, v_edges = super().indicators(k)  # all ones
        if self.aggregates(k):
            return np.zeros_like(v), v_edges
        return v, np.zeros_like(v_edges)
