"""SCAFFOLD with option II control variates (Karimireddy et al. 2020, Algorithm 1).

The server keeps the model x and a control variate c; client i keeps its own c_i (zero until
it first trains). Round t, with A_t the active clients and s local steps of size eta_l:

    i in A_t, from y_i = x^t, s times:   y_i <- y_i - eta_l (g_i(y_i) + c - c_i)
    Delta_i  = y_i - x^t
    c_i^+    = c_i - c - Delta_i / (s eta_l)                                  (option II)
    x^{t+1}  = x^t + eta_g mean_{i in A_t} Delta_i                           (eta_g: algorithm.global_lr)
    c       <- c + (1/N) sum_{i in A_t} (c_i^+ - c_i),    then c_i <- c_i^+  (A_t empty: nothing moves)

The mean over A_t weights the active clients as ``fedavg_active`` does (the paper's mean over
the sampled set S; its c update (|S|/N) mean_S is the 1/N sum above). The correction
c - c_i is added to each (clipped) minibatch gradient (``Correction``, a term of the local step).

State: x and c are the same on every rank (c is broadcast after each update); the rows c_i
live in a ``ClientTable`` sharded over ranks -- O(m d) memory, refused up front when it does
not fit (``client_rows``), as MIFA's table.
"""

from __future__ import annotations

import numpy as np
import torch

from ..engine.local import lr_at
from ..engine.local_step import StepTerm
from ..engine.store import ClientTable
from .base import Context, register
from .fedavg import FedAvgActive


class Correction(StepTerm):
    """c - c_i: ``rows`` are each client's correction."""

    def add(self, d: torch.Tensor, v: torch.Tensor, correction: torch.Tensor) -> torch.Tensor:
        return d + correction


@register("scaffold")
class Scaffold(FedAvgActive):
    client_rows = 1  # c_i: one model-sized row per client (sharded)
    client_state = ("controls.rows",)  # c_i of the local clients
    shared_state = ("c",)  # server control variate, identical on every rank

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        lo, hi = ctx.shard
        self.controls = ClientTable(lo, hi, ctx.spec.dim, ctx.device)  # c_i of the local clients
        self.c = torch.zeros_like(self.x)  # server control variate, identical on every rank
        self._next_c = self.c

    def local_terms(self, t: int, local: np.ndarray, start: torch.Tensor) -> tuple[StepTerm, ...]:
        return (Correction(self.c - self.controls.get(local)),)  # c - c_i

    def control_change(self, t: int, local: np.ndarray, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """c_i^+ - c_i = -c - Delta_i / (s eta_l), float64 (n, d) (option II)."""
        s_eta = self.cfg.train.local_steps * lr_at(self.cfg.train, t)
        return -self.c.double() - (end - start).double() / s_eta

    def contribution(self, t: int, active: np.ndarray, local: np.ndarray,
                     start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """Rows [Delta_i / |A_t| | (c_i^+ - c_i) / N]: one reduction gives both server updates."""
        return torch.cat([super().contribution(t, active, local, start, end),
                          self.control_change(t, local, start, end) / self.m], dim=1)

    def server_update(self, t: int, active: np.ndarray, total: torch.Tensor) -> torch.Tensor:
        d = self.x.shape[0]
        self._next_c = (self.c.double() + total[d:]).float()  # c + (1/N) sum (c_i^+ - c_i)
        return super().server_update(t, active, total[:d])  # x^t + eta_g mean Delta_i

    def after_round(self, t: int, active: np.ndarray, local: np.ndarray,
                    start: torch.Tensor, end: torch.Tensor) -> None:
        if len(local):  # c_i <- c_i^+ with this round's c
            new = self.controls.get(local).double() + self.control_change(t, local, start, end)
            self.controls.set(local, new.float())
        self.c = self._next_c if self.world.is_server else torch.empty_like(self.c)
        self.world.broadcast_(self.c)
