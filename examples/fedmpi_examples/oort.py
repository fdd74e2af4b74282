"""Oort-style guided client selection, as a plug-in ``my_oort`` (Lai, Zhu, Madhyastha, Chowdhury and
Ma, "Oort: Efficient Federated Learning via Guided Participant Selection", OSDI 2021), its
statistical utility without the system one (an emulation has no client durations to measure):

    U_i     = |B_i| sqrt(1/|B_i| sum_{k in B_i} loss(k)^2)    after client i trains, over the samples
              B_i it trained on (|B_i| = its steps x batch size), from the per-sample losses
    score_i = U_i + sqrt(staleness log(t) / L_i)               L_i: the round client i last trained
    eps_t   = max(epsilon_min, epsilon epsilon_decay^t)        the share of K that explores
    S_t     = K_exploit clients of the tried available ones, drawn with probabilities prop. to
              score_i among those whose score is at least cutoff x the K_exploit-th largest, and
              K - K_exploit untried ones drawn uniformly (all untried ones when fewer)

then FedAvg over S_t (``FedAvgActive``'s weights). The pieces a plug-in needs:

- a per-client quantity of local training (``client_quantities``): ``MEAN_SQUARED_LOSS`` asks the
  trainer for each client's mean squared per-sample loss, in ``self.outputs.extra["sq_loss"]``
  after the round's training, the same bits on any number of ranks (``store=True``: every round's
  values in the result file's ``/client_rounds/sq_loss``, rounds x m, NaN for clients that did not train);
- reproducible random draws (``fedmpi.rng``): a stream keyed by (seed, purpose, round) and read at
  the clients' ids, so every rank draws the same numbers, in any order, after any resume;
- declared state (``shared_state``): the utilities, the rounds each client last trained and who
  has been tried survive a checkpoint (``self.outputs`` does not: None after a resume);
- a privacy declaration: the selection reads training losses, so it is refused under ``privacy:``
  with one line (``Private(selection_reads_data=True)``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fedmpi import rng
from fedmpi.algorithms import register
from fedmpi.algorithms.base import Context, ServerParams
from fedmpi.algorithms.fedavg import FedAvgActive
from fedmpi.engine.quantities import MEAN_SQUARED_LOSS
from fedmpi.privacy import Private
from fedmpi.schema import opt


@dataclass
class OortParams(ServerParams):
    select: int = opt(5, "K: clients selected per round", ge=1)
    epsilon: float = opt(0.9, "the share of K that explores untried clients at round 0", ge=0, le=1)
    epsilon_decay: float = opt(0.98, "eps_t = max(epsilon_min, epsilon epsilon_decay^t)", gt=0, le=1)
    epsilon_min: float = opt(0.2, "the least share of K that explores", ge=0, le=1)
    cutoff: float = opt(0.95, "exploit among scores >= cutoff x the K_exploit-th largest", gt=0, le=1)
    staleness: float = opt(0.1, "weight of the bonus sqrt(staleness log t / L_i) of clients left out", ge=0)


@register("my_oort")
class Oort(FedAvgActive):
    Params = OortParams
    # self.outputs.extra["sq_loss"] after training; store: also every round's in /client_rounds/sq_loss
    client_quantities = (replace(MEAN_SQUARED_LOSS, store=True),)
    shared_state = ("utility", "last", "tried")  # replicated on every rank, saved in checkpoints
    private = Private(selection_reads_data=True)  # it picks by the clients' training losses: refused

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.utility = np.zeros(self.m)  # U_i, read once tried_i = 1
        self.last = np.zeros(self.m)     # the round after which client i last trained (L_i)
        self.tried = np.zeros(self.m)

    def select(self, t: int, available: np.ndarray) -> np.ndarray:
        """S_t (every rank, the same ``available``: the same draws)."""
        k = min(self.params.select, len(available))
        fresh, known = available[self.tried[available] == 0], available[self.tried[available] > 0]
        eps = max(self.params.epsilon_min, self.params.epsilon * self.params.epsilon_decay ** t)
        explore = min(len(fresh), max(int(round(eps * k)), k - len(known)))
        u = rng.uniform(rng.key(self.cfg.seed, "oort_explore", t), fresh)  # one number per client id
        explored = fresh[np.lexsort((fresh, u))[:explore]]
        return np.sort(np.concatenate([explored, self._exploit(t, known, k - explore)]))

    def _exploit(self, t: int, known: np.ndarray, n: int) -> np.ndarray:
        """``n`` of the tried clients ``known``, drawn by score above the cutoff."""
        n = min(n, len(known))
        if n <= 0:
            return known[:0]
        bonus = np.sqrt(self.params.staleness * np.log(max(t, 1)) / np.maximum(self.last[known], 1))
        score = self.utility[known] + bonus
        floor = np.sort(score)[::-1][n - 1] * self.params.cutoff
        pool, weight = known[score >= floor], np.maximum(score[score >= floor], 1e-12)
        u = rng.uniform(rng.key(self.cfg.seed, "oort_exploit", t), pool)
        keys = np.log(np.maximum(u, 1e-300)) / weight  # Efraimidis-Spirakis: u^(1/w), largest first
        return pool[np.lexsort((pool, -keys))[:n]]

    def after_round(self, t: int, active: np.ndarray, local: np.ndarray, start, end) -> None:
        """U_i of every client that trained (every rank: ``self.outputs`` holds all of them)."""
        out = self.outputs
        seen = out.steps * self.cfg.train.batch_size  # |B_i|
        self.utility[out.ids] = seen * np.sqrt(out.extra["sq_loss"])
        self.last[out.ids] = t + 1
        self.tried[out.ids] = 1.0
