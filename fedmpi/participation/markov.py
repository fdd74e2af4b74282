"""Correlated participation with a minimum separation R (debiasing paper, docs/ALGORITHMS.md section 3).

Each round t the server draws S_t, |S_t| = B, among the clients that did NOT participate in
rounds t-R .. t-1, with probability proportional to sum_{i in S_t} p_i over all size-B subsets
of those eligible clients. The exact O(n) sampler: one client j with probability
p_j / sum_{eligible} p, then B - 1 others uniformly among the remaining eligible clients
(summing over j in S gives P(S) = sum_{i in S} p_i / (C(n_e - 1, B - 1) sum_{eligible} p)).

``groups`` variant (the paper's experiments): the N clients are cut into M contiguous groups of
N / M; the chain runs over groups (B = 1, group weight = sum of its members' p_i) and the
selected group participates fully.

The only state is the last participation round of each unit; every draw comes from the
counter-based stream (seed, "markov", t), so every rank computes the same S_t.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .. import rng
from ..errors import InputError
from ..schema import opt
from .base import ClientInfo, Participation, Sampling, register
from .probs import WithBaseParams, base_probabilities, check_base, data_key

NEVER = np.int64(-(2**62))  # "last participation" of a unit that never participated

CONFIG_KEYS = {"p": "availability.base", "B": "availability.B", "R": "availability.R",
               "groups": "availability.markov_groups"}


def chain_shape(n: int, B: int, R: int, groups: int | None = None,
                keys: dict[str, str] = CONFIG_KEYS) -> tuple[int, int, int]:
    """Validate (N, B, R, groups); return (units, units per round, clients per unit).

    Per client: N units, B per round, 1 client each. Groups: M units, 1 per round, N / M
    clients each. The chain needs at least one full draw of eligible units every round:
    units - R * per_round >= per_round. ``keys`` names the parameters in error messages.
    """
    if groups is not None:
        if groups < 1 or n % groups:
            raise InputError(f"{keys['groups']}: must divide the number of clients N = {n} "
                             f"into equal groups, got {groups}")
        units, per_round, size = groups, 1, n // groups
    else:
        if not 1 <= B <= n:
            raise InputError(f"{keys['B']}: must be in 1..{n} (the number of clients N), got {B}")
        units, per_round, size = n, B, 1
    r_max = units // per_round - 1
    if not 0 <= R <= r_max:
        what = f"{units} groups" if groups is not None else f"N = {n} clients and B = {B}"
        raise InputError(f"{keys['R']}: must be in 0..{r_max} with {what} "
                         f"(at least one full draw must stay eligible every round), got {R}")
    return units, per_round, size


def check_weights(p: np.ndarray, n: int, key: str = CONFIG_KEYS["p"]) -> np.ndarray:
    """The weights as a float64 vector of length n, all finite and > 0 (the paper's p_i > 0)."""
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    if p.size != n:
        raise InputError(f"{key}: needs one weight per client ({n}), got {p.size}")
    if not np.all(np.isfinite(p)) or np.any(p <= 0):
        bad = p[~(np.isfinite(p) & (p > 0))][0]
        raise InputError(f"{key}: the markov chain needs every p_i > 0 (set a floor such as "
                         f"availability.base.p_min), got {bad!r}")
    return p


class Markov(Participation):
    """The minimum-separation chain over N = p.size clients; ``available(t)`` gives sorted S_t.

    ``p``: weights p_i > 0; ``B``: clients per round (ignored with ``groups``); ``R``: minimum
    separation; ``groups``: M for the groups variant; ``data``: the config key that makes the
    weights depend on the clients' data ("" when they do not). ``available`` must be called for
    t = 0, 1, 2, ... (or resumed with ``load_state_dict``); ``probabilities`` is None.
    """

    shared_state = ("last",)  # the last participation round of each unit (NEVER before the first)
    derived = ("weights", "_mask", "_cw")  # from the config; scratch buffers
    configuration = ("data", "keys", "per_round", "group_size", "R")

    def __init__(self, p: np.ndarray, B: int, R: int, seed: int, groups: int | None = None,
                 keys: dict[str, str] = CONFIG_KEYS, data: str = ""):
        p = np.asarray(p, dtype=np.float64).reshape(-1)
        super().__init__(p.size, seed)
        self.data, self.keys = data, keys
        units, self.per_round, self.group_size = chain_shape(p.size, B, R, groups, keys)
        p = check_weights(p, p.size, keys["p"])
        self.R = R
        self.weights = p.reshape(units, self.group_size).sum(axis=1)  # unit weights
        self.last = np.full(units, NEVER, dtype=np.int64)
        self._mask = np.empty(units, dtype=bool)  # scratch buffers (no allocation per round)
        self._cw = np.empty(units)

    @property
    def clients_per_round(self) -> int:
        return self.per_round * self.group_size

    def sampling(self, rounds: int) -> Sampling:
        """No amplification (the choice depends on the past); a client waits R rounds."""
        return Sampling("none", float(self.clients_per_round), separation=self.R + 1,
                        separation_key=f"{self.keys['R']} + 1", data=self.data)

    def step(self, t: int) -> np.ndarray:
        """Draw the units of round t (sorted) and record their participation."""
        eligible_mask = np.less(self.last, t - self.R, out=self._mask)
        eligible = np.flatnonzero(eligible_mask)
        k = rng.key(self.seed, "markov", t)
        # stage 1: unit j with probability w_j / sum_eligible w (ineligible units weigh 0)
        cw = np.cumsum(np.multiply(self.weights, eligible_mask, out=self._cw), out=self._cw)
        j = int(np.searchsorted(cw, rng.uniform(k, 0) * cw[-1], side="right"))
        j = j if j < cw.size else int(eligible[-1])  # u * total rounded up to the total
        if self.per_round == 1:
            chosen = np.array([j])
        else:  # stage 2: B - 1 others uniformly among the eligible units except j
            n, extra = eligible.size - 1, self.per_round - 1
            q = _floyd(rng.integers(k, np.arange(1, extra + 1), np.arange(n - extra + 1, n + 1)), n)
            q += q >= np.searchsorted(eligible, j)  # positions in eligible without j
            chosen = np.sort(np.append(eligible[q], j))
        self.last[chosen] = t
        return chosen

    def available(self, t: int) -> np.ndarray:
        units = self.step(t)
        if self.group_size == 1:
            return units
        return (units[:, None] * self.group_size + np.arange(self.group_size)).ravel()


def _floyd(draws: np.ndarray, n: int) -> np.ndarray:
    """Floyd's algorithm: k = len(draws) distinct positions, uniform in range(n).

    ``draws[s - (n - k)]`` must be uniform in 0..s for s = n - k, ..., n - 1.
    """
    chosen: set[int] = set()
    for s, r in zip(range(n - draws.size, n), draws.tolist()):
        chosen.add(s if r in chosen else r)
    return np.fromiter(chosen, dtype=np.int64, count=draws.size)


@dataclass
class MarkovParams(WithBaseParams):
    R: int = opt(0, "markov: minimum separation (rounds a client must wait)", ge=0)
    B: int = opt(1, "markov: clients per round (groups variant: the group size N/M, or 1)", ge=1)
    markov_groups: Optional[int] = opt(None, "markov: M groups of B clients run the chain; null = per client", ge=1)


@register("markov", params=MarkovParams, check=check_base)
def _markov(cfg: MarkovParams, info: ClientInfo) -> Participation:
    groups = cfg.markov_groups
    if groups is not None and info.m % groups == 0 and cfg.B not in (1, info.m // groups):
        raise InputError(f"availability.B: with markov_groups = {groups} one group of "
                         f"{info.m // groups} clients is selected per round; leave B at 1 or set it "
                         f"to {info.m // groups}, got {cfg.B}")
    return Markov(base_probabilities(cfg.base, info), cfg.B, cfg.R, info.seed, groups=groups, data=data_key(cfg.base))
