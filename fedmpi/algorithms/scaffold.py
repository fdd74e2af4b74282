"""SCAFFOLD with option II control variates (Karimireddy et al. 2020, Algorithm 1).

The server keeps the model x and a control variate c; client i keeps its own c_i (zero until
it first trains). Round t, with A_t the active clients and tau_i local steps of size eta_l:

    i in A_t, from y_i = x^t, tau_i times:   y_i <- y_i - eta_l (g_i(y_i) + c - c_i)
    Delta_i  = y_i - x^t
    c_i^+    = c_i - c - Delta_i / (a_i eta_l)                                (option II)
    x^{t+1}  = x^t + eta_g mean_{i in A_t} Delta_i                           (eta_g: algorithm.global_lr)
    c       <- c + (1/N) sum_{i in A_t} (c_i^+ - c_i),    then c_i <- c_i^+  (A_t empty: nothing moves)

The mean over A_t weights the active clients as ``fedavg_active`` does (the paper's mean over
the sampled set S; its c update (|S|/N) mean_S is the 1/N sum above). The correction
c - c_i is added to each (clipped) minibatch gradient (``Correction``, a term of the local step).

a_i is the local work client i did (``local_work``): its own step count tau_i, which
``train.local_epochs``, ``train.local_steps_file`` and the draws of ``train.local_steps_draw`` make
differ between clients and rounds, and with local momentum rho the sum of the weights its buffer
gives the step directions (FedNova's ||a_i||_1). Delta_i / (a_i eta_l) is then the mean of the
directions the client followed, the paper's (1 / K) sum_k g_i for plain SGD; dividing by the
nominal s eta_l instead diverged (issue #32: steps 1 to 40 with s = 10, or momentum 0.9).

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
from ..schema import Reads
from .base import Context, local_work, register
from .fedavg import FedAvgActive


class Correction(StepTerm):
    """c - c_i: ``rows`` are each client's correction."""

    def add(self, d: torch.Tensor, v: torch.Tensor, correction: torch.Tensor) -> torch.Tensor:
        return d + correction


@register("scaffold")
class Scaffold(FedAvgActive):
    client_rows = 1  # c_i: one model-sized row per client (sharded)
    client_state = ("controls.rows",)  # c_i of the local clients
    clients_anywhere = False  # c_i lives on its client's owner: each rank trains the clients it owns
    shared_state = ("c",)  # server control variate, identical on every rank
    derived = ("_next_c",)  # c of the next round, between server_update and after_round
    uses = ("train.lr_schedule", "train.lr_period", "train.lr_gamma", "train.lr_warmup")  # eta_l of round t
    reads = (Reads("train.lr", "divides each change by the local work eta_l a_i"),
             Reads("train.momentum", "counts the local work a_i of each client's momentum steps"),
             Reads("train.local_steps", "counts each client's own local steps tau_i (engine/steps.py)"))
    private = "it also sends the changes of the control variates, whose sum the noise does not cover"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        lo, hi = ctx.shard
        self.controls = ClientTable(lo, hi, ctx.spec.dim, ctx.device)  # c_i of the local clients
        self.c = torch.zeros_like(self.x)  # server control variate, identical on every rank
        self._next_c = self.c

    def local_terms(self, t: int, local: np.ndarray, start: torch.Tensor) -> tuple[StepTerm, ...]:
        return (Correction(self.c - self.controls.get(local)),)  # c - c_i

    def control_change(self, t: int, local: np.ndarray, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """c_i^+ - c_i = -c - Delta_i / (a_i eta_l), float64 (n, d) (option II); tau_i is the count the
        trainer used (``steps_of``, what ``ClientOutputs.steps`` reports)."""
        work = local_work(self.ctx.trainer.steps_of(local, t), self.cfg.train.momentum) * lr_at(self.cfg.train, t)
        a_eta = torch.as_tensor(work, dtype=torch.float64, device=end.device)
        return -self.c.double() - (end - start).double() / a_eta[:, None]

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
