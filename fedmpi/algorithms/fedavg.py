"""FedAvg over the active clients (``fedavg_active``).

    x^{t+1} = x^t + eta_g * mean_{i in A_t} Delta_i        (no update when A_t is empty)

``fedavg_markov`` (debiasing paper) is the same rule under the Markov sampler S_t.
"""

from __future__ import annotations

import numpy as np

from ..privacy import Private
from .base import ServerAlgorithm, register


@register("fedavg_markov")
@register("fedavg_active")
class FedAvgActive(ServerAlgorithm):
    clients_anywhere = True  # nothing per client on its owner: any rank trains it
    private = Private()  # weights 1 / n~ under privacy: DP-FedAvg (docs/PRIVACY.md)

    def weights(self, t: int, active: np.ndarray, local: np.ndarray) -> np.ndarray:
        return np.full(len(local), 1.0 / self.cohort(active))
