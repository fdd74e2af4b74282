"""Generalized FedAvg with amplified updates (``gfedavg``, Wang & Ji 2022).

FedAvg over the active clients, and every P rounds the progress made since the last anchor
is amplified by a:

    x^{t+1} = x^t + eta_g * mean_{i in A_t} Delta_i               (A_t empty: x^{t+1} = x^t)
    if (t + 1) mod P = 0:  x^{t+1} <- x_anchor + a (x^{t+1} - x_anchor)
                                    = x^{t+1} + (a - 1)(x^{t+1} - x_anchor),   x_anchor <- x^{t+1}

The first anchor is x_0, so the first amplification produces x^P from x^0 (P =
``anchor_period``, a = ``amplification``; FedSWE paper: a = 10, P = 100). The amplification
happens at the end of every period even when the last round had no active client.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..privacy import Private
from ..schema import opt
from .base import Context, ServerParams, register
from .fedavg import FedAvgActive


@dataclass
class GFedAvgParams(ServerParams):
    amplification: float = opt(10.0, "amplification a", gt=0)
    anchor_period: int = opt(100, "rounds P between amplifications", ge=1)


@register("gfedavg")
class GFedAvg(FedAvgActive):
    Params = GFedAvgParams
    shared_state = ("anchor",)
    configuration = ("P", "a")
    private = Private()  # the amplification reads only past releases (x_anchor): post-processing

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.a = self.params.amplification
        self.P = self.params.anchor_period
        self.anchor = self.x.clone()  # x_anchor = x_0, kept on every rank

    def _period_ends(self, t: int) -> bool:
        return (t + 1) % self.P == 0

    def server_update(self, t: int, active: np.ndarray, total: torch.Tensor) -> torch.Tensor:
        x = super().server_update(t, active, total)
        if self._period_ends(t):
            x = x + (self.a - 1.0) * (x - self.anchor.double())
        return x

    def after_round(self, t: int, active: np.ndarray, local: np.ndarray,
                    start: torch.Tensor, end: torch.Tensor) -> None:
        if self._period_ends(t):
            self.anchor = self.x.clone()  # x_anchor <- x^{t+1} (the amplified, broadcast model)
