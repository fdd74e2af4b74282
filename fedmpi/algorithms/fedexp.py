"""FedExP (Jhunjhunwala, Wang & Joshi, ICLR 2023, "FedExP: Speeding Up Federated Averaging via
Extrapolation", Algorithm 1): FedAvg whose server step size adapts to how much the clients'
updates agree.

Delta_bar = mean_{i in A_t} Delta_i, M = |A_t|, eps = ``fedexp_eps``:

    eta_g^t = max(1, sum_{i in A_t} ||Delta_i||^2 / (2 M (||Delta_bar||^2 + eps)))
    x^{t+1} = x^t + eta_g^t Delta_bar                                       (A_t empty: x^t)

When the updates point the same way ||Delta_bar||^2 is about their mean square and eta_g^t = 1
(FedAvg); when they cancel, the server extrapolates. ||Delta_i||^2 comes from
``ClientOutputs.delta_sq`` (summed reproducibly). ``algorithm.global_lr`` is not used (it must stay
1), and privacy is refused (the rule reads every ||Delta_i||^2). The paper also reports the
average of the last two iterates; fedmpi evaluates x^t.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..schema import opt
from .base import ServerParams, register
from .fedavg import FedAvgActive


@dataclass
class FedExPParams(ServerParams):
    fedexp_eps: float = opt(1e-3, "eps in FedExP's server step size (keeps it finite)", gt=0)


@register("fedexp")
class FedExP(FedAvgActive):
    Params = FedExPParams
    delta_norms = True  # self.outputs.delta_sq
    private = "its server step size reads every ||Delta_i||^2, which the noise on the sum does not cover"
    own_server_step = "sets its own server step size"

    def server_update(self, t: int, active: np.ndarray, total: torch.Tensor) -> torch.Tensor:
        """x^t + eta_g^t Delta_bar (rank 0; ``total`` = Delta_bar)."""
        if len(active) == 0:
            return self.x.double()
        spread = self.outputs.sum(self.outputs.delta_sq)
        eta = max(1.0, spread / (2 * len(active) * (float(total.pow(2).sum()) + self.params.fedexp_eps)))
        return self.x.double() + eta * total
