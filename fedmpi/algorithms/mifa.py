"""MIFA (Gu et al. 2021): average the latest update of EVERY client, stale or fresh.

    G_j = 0 until client j first participates
    i in A_t:   G_i <- Delta_i
    every round (A_t empty included):  x^{t+1} = x^t + eta_g * (1/N) sum_j G_j
"""

from __future__ import annotations

import numpy as np
import torch

from .base import register
from .tables import TableAlgorithm


@register("mifa")
class MIFA(TableAlgorithm):
    def server_update(self, t: int, active: np.ndarray, total: torch.Tensor) -> torch.Tensor:
        self.absorb(total)  # sum_j G_j with this round's G_i <- Delta_i
        return self.x.double() + self.eta_g * self.table_sum / self.m
