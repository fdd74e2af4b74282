"""FedBuff (Nguyen et al., AISTATS 2022): buffered asynchronous aggregation.

    M clients train at once, each from the model current at its dispatch
    each arrival i (staleness tau_i):  buffer += s(tau_i) Delta_i
    after K arrivals:                  x <- x + eta_g * buffer / K;  buffer <- 0

s = ``algorithm.staleness`` (the paper: 1/sqrt(1 + tau)); the queue, dispatch and the clock are
the shared asynchronous mechanism (``asynchronous``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InputError
from ..schema import opt
from .asynchronous import AsyncAlgorithm, AsyncParams
from .base import register


@dataclass
class FedBuffParams(AsyncParams):
    buffer: int = opt(10, "fedbuff: K, arrivals per server step", ge=1)


@register("fedbuff")
class FedBuff(AsyncAlgorithm):
    Params = FedBuffParams

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.algorithm.buffer > cfg.task.clients:
            raise InputError(f"algorithm.buffer: {cfg.algorithm.buffer} arrivals per step, more than task.clients "
                             f"({cfg.task.clients}; a client trains once from each model)")

    @property
    def buffer_size(self) -> int:
        return self.params.buffer

    def buffered(self, rows: torch.Tensor, staleness: np.ndarray) -> torch.Tensor:
        """The buffer, sum_i s(tau_i) Delta_i over the kept ``rows`` in arrival order (rank 0; float64)."""
        buffer = torch.zeros(rows.shape[1], dtype=torch.float64, device=rows.device)
        for row, s in zip(rows, self.weight(staleness)):  # in arrival order
            buffer += float(s) * row.double()
        return buffer

    def step(self, t: int, rows: torch.Tensor, staleness: np.ndarray) -> torch.Tensor:
        return self.x.double() + self.eta_g * self.buffered(rows, staleness) / self.buffer_size
