"""FedAvg over all clients (``fedavg_all``): absent clients count as a zero update.

    x^{t+1} = x^t + eta_g * (1/N) sum_{i in A_t} Delta_i        (A_t empty: x^{t+1} = x^t)
"""

from __future__ import annotations

import numpy as np

from .base import ServerAlgorithm, register


@register("fedavg_all")
class FedAvgAll(ServerAlgorithm):
    clients_anywhere = True  # nothing per client on its owner: any rank trains it
    private = "use fedavg_active: under privacy its mean over the expected cohort is DP-FedAvg"

    def weights(self, t: int, active: np.ndarray, local: np.ndarray) -> np.ndarray:
        return np.full(len(local), 1.0 / self.m)  # 1/N
