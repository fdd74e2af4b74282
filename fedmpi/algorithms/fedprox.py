"""FedProx (Li et al. 2020): FedAvg whose clients minimise a proximal local objective.

    h_i(y) = F_i(y) + (mu / 2) ||y - x^t||^2        (s local SGD steps on h_i from y = x^t)
    x^{t+1} = x^t + eta_g * mean_{i in A_t} Delta_i  (A_t empty: x^{t+1} = x^t)

The gradient of the proximal term, mu (y - x^t), is added to each (clipped) minibatch
gradient (``Proximal``, a term of the local step). The active clients are weighted as ``fedavg_active`` weights
them (the paper's simple average over the selected devices). Every client does the same s
steps: the paper's variable amount of local work (gamma-inexact solutions) is not modelled.
mu = 0 is FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..engine.local_step import StepTerm
from ..schema import opt
from .base import ServerParams, register
from .fedavg import FedAvgActive


@dataclass
class FedProxParams(ServerParams):
    mu: float = opt(0.01, "proximal coefficient mu (0 = FedAvg)", ge=0)


class Proximal(StepTerm):
    """mu (y - x_start): ``rows`` are the models the clients started the round from."""

    def __init__(self, mu: float, start: torch.Tensor):
        super().__init__(start)
        self.mu = mu

    def add(self, d: torch.Tensor, v: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return d.add(v - start, alpha=self.mu)


@register("fedprox")
class FedProx(FedAvgActive):
    Params = FedProxParams

    def local_terms(self, t: int, local: np.ndarray, start: torch.Tensor) -> tuple[StepTerm, ...]:
        return (Proximal(self.params.mu, start),) if self.params.mu else ()  # mu = 0: FedAvg, bit for bit
