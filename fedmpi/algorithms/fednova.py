"""FedNova (Wang, Liu, Liang, Joshi & Poor, NeurIPS 2020, "Tackling the Objective Inconsistency
Problem in Heterogeneous Federated Optimization"): normalised averaging for clients that do
different amounts of local work.

tau_i = client i's local steps this round (``ClientOutputs.steps``: ``train.local_epochs``,
stragglers' draws), p_i = n_i / sum_{j in A_t} n_j, rho = ``train.momentum``:

    a_i     = ||a_i||_1 = tau_i                                  (plain local SGD)
            = (tau_i - rho (1 - rho^tau_i) / (1 - rho)) / (1 - rho)   (local momentum rho)
    tau_eff = sum_{i in A_t} p_i a_i
    x^{t+1} = x^t + eta_g tau_eff sum_{i in A_t} p_i Delta_i / a_i          (A_t empty: x^t)

Each Delta_i / a_i is client i's average step direction (times -eta_l); FedAvg would weight
Delta_i itself, so clients with more steps pull the model towards their own optimum. With
equal tau_i this is FedAvg weighted by data share.
"""

from __future__ import annotations

import numpy as np

from ..schema import Reads
from .base import ServerAlgorithm, local_work, register


@register("fednova")
class FedNova(ServerAlgorithm):
    clients_anywhere = True  # nothing per client on its owner: any rank trains it
    client_outputs = True  # reads self.outputs
    reads = (Reads("train.momentum", "normalises each client's change by its momentum's a_i"),)
    private = "its weights read each client's step and sample counts, which the noise on the sum does not cover"

    def weights(self, t: int, active: np.ndarray, local: np.ndarray) -> np.ndarray:
        """tau_eff p_i / a_i, from ``self.outputs`` (every rank, pure)."""
        out = self.outputs
        a = local_work(out.steps, self.cfg.train.momentum)
        p = out.samples / out.sum(out.samples)
        tau_eff = out.sum(p * a)
        mine = out.at(local)
        return tau_eff * p[mine] / a[mine]
