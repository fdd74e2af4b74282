"""F3AST (Ribero et al. 2022): select the least-served available clients, unbias by their rate.

Per client a participation-rate estimate r_i (init 1). Round t, with r^t the current estimates:

    S_t = the ``select`` clients of A_t with the smallest r_i^t (ties: smaller id first)
    x^{t+1} = x^t + eta_g * (1/N) sum_{i in S_t} Delta_i / r_i^t    (S_t empty: x^{t+1} = x^t)
    r_i^{t+1} = (1 - beta) r_i^t + beta 1{i in S_t}                 (beta = rate_beta, paper 0.001)

The O(m) estimates are replicated on every rank (updated identically from S_t).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..config import AlgorithmParams, opt
from .base import Context, ServerAlgorithm, register


@dataclass
class F3ASTParams(AlgorithmParams):
    select: int = opt(10, "clients selected per round among the available", ge=1)
    rate_beta: float = opt(0.001, "rate-estimate smoothing beta", gt=0, le=1)


@register("f3ast")
class F3AST(ServerAlgorithm):
    Params = F3ASTParams

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.n_select = self.params.select
        self.beta = self.params.rate_beta
        self.r = np.ones(self.m)  # r_i

    def select(self, t: int, available: np.ndarray) -> np.ndarray:
        order = np.lexsort((available, self.r[available]))  # by r_i, then by id
        return np.sort(available[order[: self.n_select]])

    def weights(self, t: int, active: np.ndarray, local: np.ndarray) -> np.ndarray:
        return 1.0 / (self.m * self.r[local])  # 1 / (N r_i)

    def after_round(self, t: int, active: np.ndarray, local: np.ndarray,
                    start: torch.Tensor, end: torch.Tensor) -> None:
        chosen = np.zeros(self.m)
        chosen[active] = 1.0
        self.r = (1.0 - self.beta) * self.r + self.beta * chosen

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**super().state_dict(), "r": torch.as_tensor(self.r)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.r = state["r"].cpu().numpy().astype(np.float64)
