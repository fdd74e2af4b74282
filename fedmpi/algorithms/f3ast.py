"""F3AST (Ribero et al. 2022): serve the clients whose selection rate lags their data share.

p_i = client i's share of the training data (sum p_i = 1); r_i = running estimate of the rate
at which client i is selected; K = ``select``; beta = ``rate_beta`` (paper: 0.001). Round t:

    S_t     = the K clients of A_t with the largest p_i^2 / (r_i^t)^2   (all of A_t if |A_t| <= K;
              ties: smaller id first)
    r^{t+1} = (1 - beta) r^t + beta 1{i in S_t}                      (BEFORE the weights)
    x^{t+1} = x^t + eta_g sum_{i in S_t} (p_i / r_i^{t+1}) Delta_i    (S_t empty: x^{t+1} = x^t)

p_i^2 / r_i^2 is the gradient of -sum_i p_i^2 / r_i (the variance of the estimator), so S_t
takes the steepest step towards the rates that minimise it (r proportional to p when everyone
is available). Since r_i tracks how often i is selected, the update is unbiased in steady
state: its expectation is the full-participation average sum_i p_i Delta_i.

Variants (``f3ast_variant``):
- ``paper`` (default): r_i^0 = K p_i, the rate of a uniform choice, so the step is
  FedAvg-sized from round 0 (sum_i r_i stays K while K clients are available).
- ``authors``: the authors' code (repo mriberodiaz/f3ast): r_i^0 = p_i and the sum divided by K,
  so the step starts at FedAvg's and shrinks towards 1/K of the paper's over ~1/beta rounds.

The O(m) estimates are replicated on every rank (updated identically from A_t).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..schema import opt
from .base import Context, ServerAlgorithm, ServerParams, register


@dataclass
class F3ASTParams(ServerParams):
    select: int = opt(10, "clients selected per round among the available", ge=1)
    rate_beta: float = opt(0.001, "rate-estimate smoothing beta", gt=0, le=1)
    f3ast_variant: Literal["paper", "authors"] = opt(
        "paper", "paper = r_i init K p_i; authors = their code (r_i init p_i, sum / K)")


@register("f3ast")
class F3AST(ServerAlgorithm):
    clients_anywhere = True  # nothing per client on its owner: any rank trains it
    Params = F3ASTParams
    shared_state = ("r",)  # replicated on every rank
    derived = ("p",)  # the data shares, from the task
    configuration = ("K", "beta", "authors")
    private = "its weights p_i / r_i have no bound, and it selects by the clients' data shares"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        a = self.params
        self.K, self.beta = a.select, a.rate_beta
        self.authors = a.f3ast_variant == "authors"
        sizes = np.asarray(ctx.task.sizes, dtype=np.float64)
        self.p = sizes / sizes.sum()  # p_i: data shares
        self.r = self.p.copy() if self.authors else self.K * self.p  # r_i^0

    def select(self, t: int, available: np.ndarray) -> np.ndarray:
        """S_t by p_i^2 / r_i^2, then the rate update r^t -> r^{t+1} (every rank, once per round)."""
        score = (self.p[available] / self.r[available]) ** 2
        chosen = np.sort(available[np.lexsort((available, -score))[: self.K]])  # largest score, then id
        hit = np.zeros(self.m)
        hit[chosen] = 1.0
        self.r = (1.0 - self.beta) * self.r + self.beta * hit
        return chosen

    def weights(self, t: int, active: np.ndarray, local: np.ndarray) -> np.ndarray:
        w = self.p[local] / self.r[local]  # p_i / r_i^{t+1}
        return w / self.K if self.authors else w
