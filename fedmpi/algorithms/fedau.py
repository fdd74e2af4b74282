"""FedAU (Wang & Ji 2024): weights from online estimates of each client's participation interval.

Per client: interval counter c_i (init 0) and the list L_i of observed intervals, kept as its
sum and length since only mean(L_i) is used. Round t:

    i in A_t:      w_i = mean(L_i) (1 if L_i is empty), THEN append c_i + 1 to L_i, c_i <- 0
    i not in A_t:  c_i <- c_i + 1; if c_i reaches K: append K to L_i, c_i <- 0   (K = fedau_cap)
    x^{t+1} = x^t + eta_g * (1/N) sum_{i in A_t} w_i Delta_i       (A_t empty: x^{t+1} = x^t)

The O(m) integer state is replicated on every rank (updated identically from A_t).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..schema import opt
from .base import Context, ServerAlgorithm, ServerParams, register


@dataclass
class FedAUParams(ServerParams):
    fedau_cap: int = opt(50, "interval cap K", ge=1)


@register("fedau")
class FedAU(ServerAlgorithm):
    clients_anywhere = True  # nothing per client on its owner: any rank trains it
    Params = FedAUParams
    shared_state = ("c", "L_sum", "L_len")  # replicated on every rank
    configuration = ("K",)
    private = "its weights, each client's mean participation interval, have no bound (no sensitivity)"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.K = self.params.fedau_cap
        self.c = np.zeros(self.m, dtype=np.int64)  # c_i
        self.L_sum = np.zeros(self.m, dtype=np.int64)  # sum of L_i
        self.L_len = np.zeros(self.m, dtype=np.int64)  # |L_i|

    def interval_estimate(self, ids: np.ndarray) -> np.ndarray:
        """w_i = mean(L_i), 1 while L_i is empty."""
        n = self.L_len[ids]
        return np.where(n > 0, self.L_sum[ids] / np.maximum(n, 1), 1.0)

    def weights(self, t: int, active: np.ndarray, local: np.ndarray) -> np.ndarray:
        return self.interval_estimate(local) / self.m  # w_i / N

    def after_round(self, t: int, active: np.ndarray, local: np.ndarray,
                    start: torch.Tensor, end: torch.Tensor) -> None:
        on = np.zeros(self.m, dtype=bool)
        on[active] = True
        self.L_sum[on] += self.c[on] + 1  # active: append c_i + 1, reset
        self.L_len[on] += 1
        self.c[on] = 0
        self.c[~on] += 1  # inactive: count, and close the interval at the cap K
        full = ~on & (self.c >= self.K)
        self.L_sum[full] += self.K
        self.L_len[full] += 1
        self.c[full] = 0
