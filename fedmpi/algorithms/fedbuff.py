"""FedBuff (Nguyen et al., AISTATS 2022): buffered asynchronous aggregation.

    M clients train at once, each from the model current at its dispatch
    each arrival i (staleness tau_i):  buffer += s(tau_i) Delta_i
    after K arrivals:                  x <- x + eta_g * buffer / K;  buffer <- 0

s = ``algorithm.staleness`` (the paper: 1/sqrt(1 + tau)); the queue, dispatch and the clock are
the shared asynchronous mechanism (``asynchronous``).

Under privacy (DP-FedBuff, docs/PRIVACY.md) each step is one release of the buffer: every update
clipped to C when its client computes it, the buffer's noise sigma C added once (s(tau) <= 1, so
one update moves it by at most C), and the accountant charges each client the releases it
contributed to (``fedmpi.privacy.ledger``): the schedule is the clock's, public and data-free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InputError
from ..privacy import Private
from ..schema import opt
from .asynchronous import AsyncAlgorithm, AsyncParams
from .base import register


@dataclass
class FedBuffParams(AsyncParams):
    buffer: int = opt(10, "fedbuff: K, arrivals per server step", ge=1)


@register("fedbuff")
class FedBuff(AsyncAlgorithm):
    Params = FedBuffParams
    #: a step shows who arrived (no amplification); its contributors are the clock's schedule, counted
    private = Private(empty_round_releases=False, hides_participation=False, counted=True)

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.algorithm.once_per_version and cfg.algorithm.buffer > cfg.task.clients:
            raise InputError(f"algorithm.buffer: {cfg.algorithm.buffer} arrivals per step, more than task.clients "
                             f"({cfg.task.clients}; with algorithm.once_per_version a client trains once from each "
                             f"model)")

    @property
    def buffer_size(self) -> int:
        return self.params.buffer

    def buffered(self, rows: torch.Tensor, staleness: np.ndarray) -> torch.Tensor:
        """The buffer, sum_i s(tau_i) Delta_i over the kept ``rows`` in arrival order, released (rank 0;
        float64): under privacy with its noise, one release of the step's contributors ``active``."""
        buffer = torch.zeros(rows.shape[1], dtype=torch.float64, device=rows.device)
        for row, s in zip(rows, self.weight(staleness)):  # in arrival order
            buffer += float(s) * row.double()
        return self.privacy.server_side(None, buffer, contributors=self.active)

    def step(self, t: int, rows: torch.Tensor, staleness: np.ndarray) -> torch.Tensor:
        return self.x.double() + self.eta_g * self.buffered(rows, staleness) / self.buffer_size
