"""FedVARP (Jhunjhunwala et al. 2022): SAGA-style variance reduction with a table y_j.

    y_j = 0 initially
    x^{t+1} = x^t + eta_g * [ mean_{i in A_t} (Delta_i - y_i) + (1/N) sum_j y_j ]
    then y_i <- Delta_i for i in A_t
    A_t empty: no update at all (x^{t+1} = x^t, table unchanged)
"""

from __future__ import annotations

import numpy as np
import torch

from .base import register
from .tables import TableAlgorithm


@register("fedvarp")
class FedVARP(TableAlgorithm):
    def server_update(self, t: int, active: np.ndarray, total: torch.Tensor) -> torch.Tensor:
        x = self.x.double()
        if len(active) == 0:
            return x
        x = x + self.eta_g * (total / len(active) + self.table_sum / self.m)  # sum_j y_j before the update
        self.absorb(total)  # y_i <- Delta_i
        return x
