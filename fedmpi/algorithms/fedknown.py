"""FedAvg reweighted by the TRUE availability probabilities (``fedknown``).

    x^{t+1} = x^t + eta_g * (1/N) sum_{i in A_t} Delta_i / p_i^t    (A_t empty: x^{t+1} = x^t)

p_i^t comes from ``participation.probabilities(t)``; availability kinds that do not define it
(not Bernoulli, e.g. markov or trace) are refused at start-up (``needs_probabilities``).
"""

from __future__ import annotations

import numpy as np

from .base import ServerAlgorithm, register


@register("fedknown")
class FedKnown(ServerAlgorithm):
    clients_anywhere = True  # nothing per client on its owner: any rank trains it
    needs_probabilities = True
    private = "its weights 1 / (N p_i^t) have no bound as p_i^t -> 0 (no sensitivity)"

    def weights(self, t: int, active: np.ndarray, local: np.ndarray) -> np.ndarray:
        p = self.ctx.participation.probabilities(t)[local]  # p_i^t > 0 for every available i
        return 1.0 / (self.m * p)
