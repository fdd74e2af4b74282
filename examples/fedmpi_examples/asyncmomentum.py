"""Asynchronous FL as a plug-in: FedBuff with server momentum, ``my_fedbuff_momentum``.

    each arrival i (staleness tau_i):  buffer += s(tau_i) Delta_i         (FedBuff's buffer)
    after K arrivals:                  v <- beta v + buffer,  v^0 = 0      (server momentum)
                                       x <- x + eta_g v / K

beta = 0 is FedBuff, bit for bit (``tests/test_examples.py`` checks it). The asynchronous server
(who trains when, from which model, how stale each update is, what the clock drops) is fedmpi's
shared mechanism, ``fedmpi.algorithms.asynchronous.AsyncAlgorithm``; an asynchronous algorithm
only says what a server step does with the updates that arrived. This one extends the built-in
``FedBuff`` and overrides its ``step`` (rank 0 only, float64, the kept updates in arrival order),
reusing FedBuff's ``buffered`` sum. The velocity is declared in ``shared_state``, as FedBuff's
in-flight updates are, so a checkpoint saves it and a resumed run continues exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedmpi.algorithms import Context, register
from fedmpi.algorithms.fedbuff import FedBuff, FedBuffParams
from fedmpi.config import opt


@dataclass
class FedBuffMomentumParams(FedBuffParams):
    beta: float = opt(0.9, "server momentum on the buffer: v <- beta v + buffer", ge=0, lt=1)


@register("my_fedbuff_momentum")
class FedBuffMomentum(FedBuff):
    Params = FedBuffMomentumParams
    shared_state = FedBuff.shared_state + ("velocity",)  # v, kept by the server (rank 0)

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.velocity = torch.zeros(ctx.spec.dim, dtype=torch.float64, device=ctx.device)  # v^0 = 0

    def step(self, t: int, rows: torch.Tensor, staleness: np.ndarray) -> torch.Tensor:
        self.velocity = self.params.beta * self.velocity + self.buffered(rows, staleness)
        return self.x.double() + self.eta_g * self.velocity / self.buffer_size
