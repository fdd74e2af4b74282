"""Power-of-Choice client selection (Cho, Wang & Joshi, AISTATS 2022, "Towards Understanding
Biased Client Selection in Federated Learning"), in its computation-free form (rpow-d): pick
the clients with the largest recent local loss.

p_i = client i's data share, K = ``select``, d = ``candidates`` (K <= d):

    C_t     = d clients of A_t drawn without replacement with probabilities prop. to p_i
              (all of A_t when |A_t| <= d)
    S_t     = the K clients of C_t with the largest ell_i (ties: smaller id)
    x^{t+1} = x^t + eta_g mean_{i in S_t} Delta_i                           (S_t empty: x^t)
    ell_i   <- client i's mean training loss this round, for i in S_t

ell_i starts at +inf, so every client is tried before a loss ranks it. The paper's pow-d
instead asks all d candidates for their loss at x^t (one more pass each round); rpow-d uses
the loss each client last reported, which is what the training pass gives at no cost
(``ClientOutputs.loss``). C_t uses Efraimidis-Spirakis keys u_i^(1/p_i), u_i from the stream
(seed, "candidates", t) at counter i: the same draw on every rank. ell is replicated and saved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import rng
from ..errors import InputError
from ..privacy import Private
from ..schema import opt
from .base import Context, ServerParams, register
from .fedavg import FedAvgActive


@dataclass
class PowerOfChoiceParams(ServerParams):
    select: int = opt(10, "K: clients selected per round", ge=1)
    candidates: int = opt(20, "d: candidates drawn per round (d >= select)", ge=1)


@register("power_of_choice")
class PowerOfChoice(FedAvgActive):
    Params = PowerOfChoiceParams
    client_outputs = True  # reads self.outputs
    shared_state = ("ell", "tried")  # replicated on every rank
    derived = ("p",)  # the data shares, from the task
    private = Private(selection_reads_data=True)  # it picks by the clients' training losses

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        sizes = np.asarray(ctx.task.sizes, dtype=np.float64)
        self.p = sizes / sizes.sum()
        self.ell = np.zeros(self.m)  # ell_i, read once tried_i = 1 (checkpoints hold finite numbers only)
        self.tried = np.zeros(self.m)

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.algorithm.candidates < cfg.algorithm.select:
            raise InputError(f"algorithm.candidates: must be at least select ({cfg.algorithm.select}), "
                             f"got {cfg.algorithm.candidates}")

    def select(self, t: int, available: np.ndarray) -> np.ndarray:
        """S_t from C_t by ell (every rank, same input)."""
        cand = available
        if len(available) > self.params.candidates:
            u = rng.uniform(rng.key(self.cfg.seed, "candidates", t), available)
            keys = np.log(np.maximum(u, 1e-300)) / self.p[available]  # log of u^(1/p): same order
            cand = available[np.lexsort((available, -keys))[: self.params.candidates]]
        untried_first = self.tried[cand]  # ell_i = +inf before client i's first round
        return np.sort(cand[np.lexsort((cand, -self.ell[cand], untried_first))[: self.params.select]])

    def after_round(self, t: int, active: np.ndarray, local: np.ndarray, start, end) -> None:
        self.ell[self.outputs.ids] = self.outputs.loss
        self.tried[self.outputs.ids] = 1.0
