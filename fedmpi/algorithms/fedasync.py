"""FedAsync (Xie, Koyejo and Gupta 2019): the server mixes in each arrival at once.

    M clients train at once, each from the model current at its dispatch, x_t:
        local SGD steps on g(y) = F_i(y) + (rho / 2) ||y - x_t||^2 from y = x_t -> x_i
    each arrival i (client model x_i, staleness tau_i):
        alpha_tau = alpha * s(tau_i)
        x <- (1 - alpha_tau) x + alpha_tau x_i

s = ``algorithm.staleness`` (the paper's polynomial (1 + tau)^-a or hinge); rho =
``algorithm.rho``, the paper's proximal weight (its gradient rho (y - x_t) is a term of each local
step, ``fedprox.Proximal``; rho = 0, the default, is plain SGD bit for bit); one server step per
arrival. The queue, dispatch and the clock are the shared asynchronous mechanism (``asynchronous``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..engine.local_step import StepTerm
from ..schema import Digest, opt
from .asynchronous import AsyncAlgorithm, AsyncParams
from .base import register
from .fedprox import Proximal


@dataclass
class FedAsyncParams(AsyncParams):
    alpha: float = opt(0.6, "fedasync: alpha, the mixing weight of a fresh arrival", gt=0, le=1)
    rho: float = opt(0.0, "fedasync: rho, the proximal weight of the local objective F_i(y) + (rho/2)||y - x_t||^2 "
                          "(x_t the model the task started from; 0: none)", ge=0,
                   digest=Digest(absent=0.0))  # FedAsync without its term: the checkpoints before this key


@register("fedasync")
class FedAsync(AsyncAlgorithm):
    Params = FedAsyncParams
    buffer_size = 1
    own_server_step = "mixes each arrival in by algorithm.alpha"
    private = ("it mixes each client's whole model into the server's (x <- (1 - a) x + a x_i), not a sum of "
               "clipped updates the noise could cover")

    def local_terms(self, t: int, local: np.ndarray, start: torch.Tensor) -> tuple[StepTerm, ...]:
        return (Proximal(self.params.rho, start),) if self.params.rho else ()  # rho = 0: plain SGD, bit for bit

    def keep(self, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        return end  # x_i, the client's model

    def step(self, t: int, rows: torch.Tensor, staleness: np.ndarray) -> torch.Tensor:
        a = self.params.alpha * float(self.weight(staleness)[0])
        return (1 - a) * self.x.double() + a * rows[0].double()
