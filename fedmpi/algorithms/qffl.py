"""q-FFL as q-FedAvg (Li, Sanjabi, Beirami & Smith, ICLR 2020, "Fair Resource Allocation in
Federated Learning", Algorithm 2): clients with a larger loss weigh more, by the power q.

F_i = client i's loss at x^t (``ClientOutputs.first_loss``: the loss of its first minibatch,
at x^t), L = 1 / eta_l (the paper's Lipschitz estimate), Delta_i = x_i - x^t:

    h_i     = q F_i^(q-1) L^2 ||Delta_i||^2 + L F_i^q
    x^{t+1} = x^t + eta_g sum_{i in A_t} L F_i^q Delta_i / sum_{i in A_t} h_i   (A_t empty: x^t)

q = 0 is FedAvg over A_t (h_i = L). The sum of the h_i runs over every rank's clients
(``ClientOutputs.sum``: the same bits on any number of ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.local import lr_at
from ..schema import Reads, opt
from .base import ServerAlgorithm, ServerParams, register


@dataclass
class QFFLParams(ServerParams):
    q: float = opt(1.0, "fairness power q (0 = FedAvg; larger q weighs high-loss clients more)", ge=0)


@register("qffl")
class QFFL(ServerAlgorithm):
    clients_anywhere = True  # nothing per client on its owner: any rank trains it
    Params = QFFLParams
    delta_norms = True  # self.outputs.delta_sq, in h_i
    uses = ("train.lr_schedule", "train.lr_period", "train.lr_gamma", "train.lr_warmup")  # eta_l of round t
    reads = (Reads("train.lr", "takes L = 1 / eta_l as its Lipschitz estimate"),)
    private = "its weights read each client's loss and ||Delta_i||^2, which the noise on the sum does not cover"

    def weights(self, t: int, active: np.ndarray, local: np.ndarray) -> np.ndarray:
        """L F_i^q / sum_{A_t} h_i, from ``self.outputs`` (every rank, pure)."""
        q, L, out = self.params.q, 1.0 / lr_at(self.cfg.train, t), self.outputs
        F = np.maximum(out.first_loss, 0.0)
        h = L * F ** q + (q * F ** (q - 1) * L ** 2 * out.delta_sq if q else 0.0)
        return L * F[out.at(local)] ** q / out.sum(h)
