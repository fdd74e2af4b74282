"""FedAvgM: FedAvg with server momentum (Hsu, Qi and Brown, 2019), as a plug-in ``my_fedavgm``.

    Delta^t = mean_{i in A_t} Delta_i                 (the clients' mean change)
    v^{t+1} = beta v^t + Delta^t,   v^0 = 0           (server momentum, beta = algorithm.beta)
    x^{t+1} = x^t + eta_g v^{t+1}
    A_t empty: x and v unchanged

Only the server step differs from FedAvg, so this overrides two hooks of ``ServerAlgorithm``:
``weights`` (each active client's change counts 1/|A_t|; fedmpi sums the weighted changes of all
ranks into rank 0, reproducibly) and ``server_update`` (runs on rank 0 only). The momentum
buffer is declared in ``shared_state``, so checkpoints save it and a resumed run, on any
number of ranks, continues exactly. (fedmpi's own ``fedavgm``, with ``server_momentum``, computes
the same bits; ``tests/test_examples.py`` checks it.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedmpi.algorithms import Context, ServerAlgorithm, register
from fedmpi.config import ServerParams, opt


@dataclass
class FedAvgMParams(ServerParams):
    beta: float = opt(0.9, "server momentum: v <- beta v + mean Delta_i", ge=0, lt=1)


@register("my_fedavgm")
class FedAvgM(ServerAlgorithm):
    Params = FedAvgMParams
    shared_state = ("momentum",)  # v, kept by the server (rank 0)

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.momentum = torch.zeros_like(self.x, dtype=torch.float64)  # v^0 = 0

    def weights(self, t: int, active: np.ndarray, local: np.ndarray) -> np.ndarray:
        return np.full(len(local), 1.0 / max(len(active), 1))  # total = mean_{A_t} Delta_i

    def server_update(self, t: int, active: np.ndarray, total: torch.Tensor) -> torch.Tensor:
        if len(active) == 0:
            return self.x.double()
        self.momentum = self.params.beta * self.momentum + total  # v^{t+1}
        return self.x.double() + self.eta_g * self.momentum  # x^{t+1}
