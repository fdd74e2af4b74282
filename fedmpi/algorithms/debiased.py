"""Debiased FedAvg under correlated participation (``debiased_fedavg``; debiasing paper, Algorithm 1).

Round t = 0, 1, ... with S_t the sampler's set, B = |S_t| and N clients:

    t_i     <- t_i + 1                    for i in S_t (participations in rounds 0..t)
    lambda_i = t_i / ((t + 1) B)          estimate of pi_R^i  (sum_i lambda_i = 1)
    nu_i     = 1 / (lambda_i N)           1 in the first ``warmup`` rounds; at most ``nu_max``
    x_{t,k+1}^i = x_{t,k}^i - alpha nu_i grad f_i(x_{t,k}^i),   k = 0..K-1,  x_{t,0}^i = x_t
    x_{t+1}  = x_t + eta_g mean_{i in S_t} (x_{t,K}^i - x_t)    (eta_g = 1: the paper's average)

FedAvg weights client i by how often it participates, pi_R^i; scaling its steps by
nu_i ~ 1 / (N pi_R^i) makes the weight 1 / N, so the fixed point is that of F = mean_i f_i.

Reading of the paper: t_i is incremented *before* lambda_i is computed, so t_i / (t + 1) is
client i's participation frequency over the t + 1 rounds played so far (this one included),
and dividing by B gives the estimate of pi_R^i = frequency / B (eq. 6). Incrementing after
would give t_i = 0, lambda_i = 0 and an infinite nu_i at every client's first round.
B is the size of the current S_t (B clients, or the selected group's N / M clients with
``markov_groups``), so the lambda_i sum to 1 under the Markov sampler. Under privacy B is the
fixed expected cohort n~ (the same under the Markov sampler): with the realised |S_t| a client
that joins would change every other client's step size, so one client's influence on the sum would
exceed its own clipped update (docs/PRIVACY.md).

The counts t_i depend only on the participation sequence, which every rank knows, so the
(N,) int64 vector is replicated and no communication is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..privacy import Private
from ..schema import opt
from .base import Context, ServerParams, register
from .fedavg import FedAvgActive


@dataclass
class DebiasedParams(ServerParams):
    warmup: int = opt(0, "rounds with nu_i = 1", ge=0)
    nu_max: Optional[float] = opt(None, "cap on nu_i; null = none", gt=0)


@register("debiased_fedavg")
class DebiasedFedAvg(FedAvgActive):
    Params = DebiasedParams
    shared_state = ("counts",)  # t_i, replicated on every rank
    configuration = ("warmup", "nu_max")
    private = Private()  # select counts participations only; nu_i scales a client's own steps, before the clip

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.counts = np.zeros(self.m, dtype=np.int64)  # t_i
        self.warmup = self.params.warmup
        self.nu_max = self.params.nu_max

    def select(self, t: int, available: np.ndarray) -> np.ndarray:
        self.counts[available] += 1  # every selected client increments t_i
        return available

    def nu(self, t: int, clients: np.ndarray) -> np.ndarray:
        """nu_i of ``clients`` (ids in S_t) in round t, after this round's increments."""
        if t < self.warmup:
            return np.ones(len(clients))
        B, N = self.cohort(self.active), self.m  # |S_t|; under privacy the fixed n~
        lam = self.counts[clients] / ((t + 1) * B)  # lambda_i
        nu = 1.0 / (lam * N)
        return nu if self.nu_max is None else np.minimum(nu, self.nu_max)

    def lr_scale(self, t: int, local: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(self.nu(t, local), dtype=torch.float32)  # alpha -> alpha nu_i
