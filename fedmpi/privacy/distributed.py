"""``privacy.mechanism: distributed_dgauss | distributed_skellam`` -- distributed DP: each client adds its
share of discrete noise on the integer lattice, and only the sum modulo 2^bits is decoded
(docs/PRIVACY.md, "Distributed noise"; the functions in ``discrete``).

A round's release (``Privacy.release`` hands the algorithm's sum this ``Lattice``):

    u_i   = n~ w_i Delta_i                               client i's row of the sum, ||u_i|| <= C
    z_i   = round(H D pad(u_i) s) + noise_i  mod 2^bits  client i (every rank, its clients): rotation D keyed
                                                         by the round, scale s, conditional rounding, its share
                                                         of noise: variance (sigma C s)^2 / n_t, n_t this round's
    Z     = sum_i z_i  mod 2^bits                        the aggregation (what secure aggregation reveals; here
                                                         the plain sum of the integers, one reduction, or with
                                                         aggregation.kind secagg the masked sum unmasked)
    total = unrotate(centred(Z)) / (s n~)                rank 0: the decoded mean

so the summed noise has variance (sigma C s)^2 whatever the cohort, and one client moves Z by its
rounded vector, of L2 norm <= Delta_2 = ``discrete.rounded_l2``(C s, d', beta). s (1 / gamma) fits k
standard deviations of a coordinate of the sum in 2^bits (``discrete.scale_factor``, k from
``privacy.wrap_probability``); each round records its bound on a wrap (``privacy/wrap_bound``) and,
emulation's privilege, the coordinates that did wrap (``privacy/wrapped``).

Accounting: the releases are compositions of the summed noise's Renyi DP (``discrete.ddg_rdp`` with
the tau of n clients, n the most a round can have, ``population``; ``discrete.skellam_rdp``), k of
them for a client (the kind's bound on its participations), with zero-out neighbours and no
amplification: the noise of a round is its clients' shares, so who took part is not hidden.

The distributed matrix mechanism (``privacy.band`` b > 1, the factor's c_0..c_{b-1} as ``banded_mf``'s):
the lattice releases w_t = sum_{j<b} c_j X_{t-j} + z_t, the rows of C X + z, each client of round
t - j re-sending c_j u_i in round t (rounded anew, with a noise share: every sender of a round adds
one), and rank 0 decodes s_t = (w_t - sum_{j>=1} c_j s_{t-j}) / c_0, i.e. C^{-1} w = X + C^{-1} z: a
post-processing. With participations >= b rounds apart a client enters each round's sum at most once,
so one participation is b rounds of sensitivity Delta_2(|c_j| C s), composed. In emulation rank 0
keeps the rows of the last b - 1 rounds for their clients (``held``), who must still be reachable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from .. import rng
from ..errors import InputError
from ..participation import Sampling
from ..registry import ALGORITHMS
from ..schema import opt
from . import discrete
from . import factors
from .aggregation import cohort_of
from .banded import BandedMF, BandedParams, require_separation
from .mechanism import Mechanism, register


@dataclass
class DistributedParams(BandedParams):
    bits: int = opt(16, "distributed noise: bits of each coordinate of the sum (the modulus 2^bits the clients' "
                        "integers are summed in)", ge=2, le=32)
    wrap_probability: float = opt(1e-4, "distributed noise: the scale is chosen so that a coordinate of the noisy "
                                        "sum leaves [-2^(bits-1), 2^(bits-1)) with about this probability "
                                        "(k standard deviations fit, as TFF)", gt=0, lt=1)
    beta: float = opt(0.0, "distributed noise: conditional randomized rounding (a client redraws a rounding whose "
                           "norm exceeds the bound that holds with probability 1 - beta; 0 = plain randomized "
                           "rounding, norm bound C s + sqrt(d'))", ge=0, lt=1)


#: what a release records: its bound on a wrap, the coordinates that wrapped (rank 0's count, an emulation's
#: privilege: a real server cannot see it) and the scale s (integers per unit of the update)
RECORD = ("privacy/wrap_bound", "privacy/wrapped", "privacy/scale")


class Distributed(Mechanism):
    """The shared mechanism of the two lattice noises; a subclass says which (``sample``, ``rdp_of``)."""

    Params = DistributedParams
    #: the decoded releases s_{t-1..t-b+1}; the rows the last b - 1 rounds' clients re-send (rank 0's)
    shared_state = ("history", "held", "senders")
    derived = ("c",)  # the factor's coefficients (privacy.band, privacy.factor)
    reads = BandedMF.reads  # an optimized factor reads the run's rounds
    noise_at = "distributed"
    needs = ("a synchronous algorithm whose rows are its weighted clipped updates (the base contribution); "
             "never amplified")
    curve = True  # its RDP curve is the papers' bound (``rdp``), not a dp-accounting event
    purpose = "privacy_distributed"
    exponential = False  # the noise's tail: sub-Gaussian (False) or sub-exponential (Skellam)

    def __init__(self, params: DistributedParams, dim: int, seed: int, device: torch.device, rounds: int = 0):
        super().__init__(params, dim, seed, device, rounds)
        self.padded = discrete.padded(dim)
        self.k = discrete.stddevs(params.wrap_probability)
        b = params.band
        self.c = np.ones(1) if b == 1 else factors.coefficients(params.factor, rounds, b)
        self.history = torch.zeros(b - 1, dim, dtype=torch.float64)  # rank 0's decoded s_{t-j}
        self.population = 1  # the most clients a round can have (Privacy sets it; the DDG's tau)
        self.senders = np.zeros(b - 1, dtype=np.int64)  # n_{t-1}, ..., n_{t-b+1}: who re-sends in round t (public)
        self.last = dict.fromkeys(RECORD, math.nan)  # the last release's record

    # ---------------------------------------------------------------- config
    @classmethod
    def check_config(cls, cfg: Any) -> None:
        p, name = cfg.privacy, cfg.privacy.mechanism
        for key, why in (("target_quantile", "adaptive clipping's noisy count is not encoded by the clients"),
                         ("noise_cohort_size", "each client adds its share of the noise of its own round")):
            if getattr(p, key) is not None:
                raise InputError(f"privacy.{key}: privacy.mechanism {name}: {why} (leave privacy.{key} null)")
        from .declaration import declaration

        algo = ALGORITHMS.get(cfg.algorithm.name).obj
        if declaration(algo, cfg.algorithm.name).counted:
            raise InputError(f"privacy.mechanism: {name} encodes the clients of a round together (their integer "
                             f"sum); algorithm.name {cfg.algorithm.name} is an asynchronous server, whose updates "
                             f"arrive one by one (use privacy.mechanism gaussian or local_gaussian)")
        own = [h for h in ("contribution", "private_part") if definer(algo, h) is not definer(algo, "finish_round")]
        if own:
            raise InputError(f"privacy.mechanism: {name} has each client encode its row of the sum, its weighted "
                             f"clipped update; algorithm.name {cfg.algorithm.name} makes its own rows "
                             f"({', '.join(own)}), which are not that (use privacy.mechanism gaussian)")
        if p.bits < 2 or 4.0 ** p.bits <= discrete.stddevs(p.wrap_probability) ** 2:
            raise InputError(f"privacy.bits: {p.bits} bits cannot hold a sum to privacy.wrap_probability "
                             f"{p.wrap_probability:g}")

    @property
    def population(self) -> int:
        return self._population

    @population.setter
    def population(self, m: int) -> None:
        """The most clients a round can hold: the DDG's tau, and the room for the rows re-sent (rank 0's
        (round, client, u_i) of rounds t-b+1..t-1, round -1 where empty: (b - 1) m slots, a fixed shape)."""
        self._population = m
        self.held = torch.zeros((len(self.c) - 1) * m, self.dim + 2, dtype=torch.float64)
        self.held[:, 0] = -1

    @classmethod
    def state_bytes(cls, params: DistributedParams, dim: int) -> int:
        return 8 * (params.band - 1) * dim  # the decoded history (rank 0 also holds the rows it re-sends)

    def check(self, cfg: Any, sampling: Sampling, amplified: bool) -> None:
        require_separation(cfg, sampling, self.params.mechanism, self.params.band,
                           " (each client's rows re-sent over b rounds may not overlap)")

    # ---------------------------------------------------------------- the scale and what one client moves
    def scale(self, sigma: float, cohort: float) -> float:
        """C s: the clip in integer units (s = 1 / gamma, ``discrete.scale_factor`` in units of C),
        for noise multiplier ``sigma`` and n~ = ``cohort``; InputError naming privacy.bits when the bits
        cannot hold the cohort's rounding."""
        n = max(cohort, 1.0)
        try:
            return discrete.scale_factor(sigma / math.sqrt(n), 1.0, self.params.bits, n, self.padded, self.k)
        except ValueError as e:
            raise InputError(f"privacy.bits: {e} (expected cohort {cohort:g}); give more bits or a larger "
                             f"privacy.wrap_probability") from None

    def bounds(self, cs: float) -> tuple[float, float]:
        """(Delta_2, Delta_1): one client's rounded vector's norms for the clip in integer units ``cs``."""
        l2 = discrete.rounded_l2(cs, self.padded, self.params.beta)
        return l2, discrete.rounded_l1(l2, self.padded)

    def inflation(self, sigma: float, cohort: float) -> float:
        """Delta_2 / (c_0 C s) >= 1: how far one client can move a round's decoded sum, in units of C
        (its rounded vector's bound), at noise multiplier ``sigma`` and n~ = ``cohort``."""
        cs = self.scale(sigma, cohort) * self.c[0]
        return self.bounds(cs)[0] / cs

    def sensitivity(self, sampling: Sampling, amplified: bool) -> float:
        """``inflation`` at multiplier 1 (the accountant works in integer units, ``rdp``)."""
        return self.inflation(1.0, sampling.cohort)

    # ---------------------------------------------------------------- accounting
    def event(self, sampling: Sampling, amplified: bool, sigma: float, rounds: int) -> Any:
        return None  # no dp-accounting event: ``rdp`` gives the curve

    def rdp(self, sampling: Sampling, sigma: float, rounds: int) -> tuple[np.ndarray, np.ndarray]:
        """(orders, RDP) of ``rounds`` rounds at multiplier ``sigma``: k participations, each moving the b
        rounds' sums it enters by its rounded c_j u (``rdp_of`` of each, composed)."""
        cs = self.scale(sigma, sampling.cohort)
        var = (sigma * cs) ** 2
        orders = discrete.ORDERS
        one = sum(self.rdp_of(orders, *self.bounds(abs(cj) * cs), var) for cj in self.c)
        return orders, sampling.participations(rounds) * one

    def rdp_of(self, orders: np.ndarray, l2: float, l1: float, var: float) -> np.ndarray:
        """One round's RDP for sensitivities ``l2``, ``l1`` and summed noise variance ``var`` (integer units)."""
        raise NotImplementedError

    def sample(self, gen: np.random.Generator, var: float, size: int) -> np.ndarray:
        """One client's noise share of variance ``var``."""
        raise NotImplementedError

    def record(self) -> dict[str, float]:
        return dict(self.last)

    # ---------------------------------------------------------------- a release
    def lattice(self, t: int, clients: np.ndarray, part: Callable, C: float, sigma: float, cohort: float,
                is_server: bool, secure: Any = None) -> "Lattice":
        return Lattice(self, t, clients, part, C, sigma, cohort, is_server, secure)

    def signs(self, t: int) -> torch.Tensor:
        """D_t: the rotation's +-1 diagonal of round t (d',), keyed (seed, "privacy_rotation", t): every client's."""
        b = rng.bits(rng.key(self.seed, "privacy_rotation", t), np.arange(self.padded)) >> np.uint64(63)
        return torch.from_numpy(1.0 - 2.0 * b.astype(np.float64))

    def encode(self, t: int, clients: np.ndarray, rows: torch.Tensor, cs: float, C: float, var: float,
               signs: torch.Tensor, lag: int = 0) -> torch.Tensor:
        """The clients' integer vectors before the modulus (n, d') int64: each row (norm <= C) times c_lag,
        rotated, scaled to C s, conditionally rounded, plus the client's noise share of variance ``var``,
        drawn from its own stream (seed, purpose, t, i; a re-send of lag j > 0 from (..., t, i, j)).
        Modulo 2^bits (``torch.remainder``) they are the int64 vectors in [0, M) that secure aggregation
        masks (``fedmpi.privacy.secagg``'s interface, M = 2^bits)."""
        rows = rows.double().cpu()
        norms = torch.linalg.vector_norm(rows, dim=1)
        rows = rows * torch.clamp(C / torch.clamp(norms, min=1e-300), max=1.0)[:, None]  # float64 guard
        x = discrete.rotate(rows, signs).numpy() * (self.c[lag] * cs / C)
        bound = self.bounds(abs(self.c[lag]) * cs)[0]
        out = np.empty(x.shape, dtype=np.int64)
        for j, i in enumerate(clients):
            gen = rng.generator(self.seed, self.purpose, t, int(i), *((lag,) if lag else ()))
            out[j] = discrete.conditional_round(gen, x[j], bound) + self.sample(gen, var, self.padded)
        return torch.from_numpy(out)

    def resent(self, t: int, cs: float, C: float, var: float, signs: torch.Tensor) -> torch.Tensor:
        """Rank 0: the sum of the re-sends of round t, c_j u_i for each client i of round t - j, 0 < j < b,
        each with its noise share of variance ``var`` (every sender of a round adds one), int64 (d',)."""
        total = torch.zeros(self.padded, dtype=torch.int64)
        for j in range(1, min(len(self.c), t + 1)):  # round -1 marks an empty slot
            mine = self.held[self.held[:, 0] == t - j]
            if len(mine):
                ids = mine[:, 1].long().numpy()
                total += self.encode(t, ids, mine[:, 2:], cs, C, var, signs, lag=j).sum(0)
        return total

    def keep(self, t: int, ids: np.ndarray, rows: torch.Tensor, decoded: torch.Tensor) -> torch.Tensor:
        """Rank 0: round t's rows kept for their re-sends (rounds t + 1..t + b - 1), and s_t from the
        decoded w_t = sum_j c_j X_{t-j} + z_t: s_t = (w_t - sum_{j>=1} c_j s_{t-j}) / c_0 (C^{-1} w)."""
        if len(self.c) == 1:
            return decoded
        c = torch.as_tensor(self.c[1:], dtype=torch.float64)
        s = (decoded - c @ self.history) / self.c[0]
        self.history = torch.cat([s[None], self.history[:-1]])
        self.held[self.held[:, 0] <= t - len(self.c) + 1, 0] = -1  # round t - b + 1 re-sent its last
        free = torch.nonzero(self.held[:, 0] < 0).ravel()[:len(ids)]
        self.held[free, 0] = float(t)
        self.held[free, 1] = torch.from_numpy(ids.astype(np.float64))
        self.held[free, 2:] = rows.double().cpu()
        return s

    def decode(self, total: torch.Tensor, cs: float, C: float, signs: torch.Tensor) -> torch.Tensor:
        """The decoded sum of the rows (d,) float64 from the centred integer sum (d',)."""
        return discrete.unrotate(total.double(), signs, self.dim) * (C / cs)


def definer(cls: type, hook: str) -> type | None:
    """The class in ``cls``'s MRO that defines ``hook``: the base round's rows (the weighted clipped
    updates) are those of the class that defines the round (``finish_round``)."""
    return next((c for c in cls.__mro__ if hook in vars(c)), None)


def gathered(world: Any, clients: np.ndarray, rows: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """Every rank's (client ids, rows) on rank 0, sorted by id (collective; the same whatever the
    ranks): each rank's block padded to the most any rank has, one gather."""
    most = int(world.max_float(float(len(clients))))
    block = torch.full((most, rows.shape[1] + 1), -1.0, dtype=torch.float64)
    block[:len(clients), 0] = torch.from_numpy(np.asarray(clients, dtype=np.float64))
    block[:len(clients), 1:] = rows
    parts = world.gather_to_server(block)
    if parts is None:
        return np.zeros(0, np.int64), torch.zeros(0, rows.shape[1], dtype=torch.float64)
    every = torch.cat(parts)
    every = every[every[:, 0] >= 0]
    every = every[torch.argsort(every[:, 0])]
    return every[:, 0].long().numpy(), every[:, 1:]


class Lattice:
    """One release's sum on the lattice, in the shape of ``reproducible_sum_blocks`` (the reduction an
    algorithm's ``summed`` takes): the rows made block by block, encoded by their clients, summed
    (every rank; one reduction of int64 to rank 0), decoded on rank 0."""

    def __init__(self, mech: Distributed, t: int, clients: np.ndarray, part: Callable, C: float, sigma: float,
                 cohort: float, is_server: bool, secure: Any = None):
        self.mech, self.t, self.clients, self.part, self.C = mech, t, clients, part, C
        self.sigma, self.cohort, self.is_server = sigma, cohort, is_server
        self.secure = secure  # aggregation.kind secagg (fedmpi.privacy.aggregation): the integers masked

    def __call__(self, world: Any, make_rows: Callable[[slice], torch.Tensor], n_local: int, n_total: int,
                 **_: Any) -> torch.Tensor:
        mech, p = self.mech, self.mech.params
        width = make_rows(slice(0, 0)).shape[-1]
        _, bound, divisor = self.part(torch.zeros(width, dtype=torch.float64))
        cs = mech.scale(self.sigma, self.cohort)
        senders = n_total + int(mech.senders.sum())  # the round's clients and (banded) the last b - 1 rounds'
        mech.senders = np.concatenate([[n_total], mech.senders[:-1]]) if len(mech.senders) else mech.senders
        var = (self.sigma * cs) ** 2 / max(senders, 1)  # each sender's share of the round's noise
        signs = mech.signs(self.t)
        device = make_rows(slice(0, 0)).device
        total = torch.zeros(mech.padded, dtype=torch.int64)
        block = max(1, (64 << 20) // (8 * mech.padded))
        kept = []  # banded: the rows the clients re-send in the next b - 1 rounds
        for a in range(0, n_local, block):
            s = slice(a, min(a + block, n_local))
            rows = make_rows(s).double() * (divisor / bound)  # u_i = n~ w_i Delta_i, ||u_i|| <= C
            total += mech.encode(self.t, self.clients[s], rows, cs, self.C, var, signs).sum(0)
            if len(mech.c) > 1:
                kept.append(rows.cpu())
        total = world.sum_to_server_(total.to(device)).cpu()  # the plain sum of the clients' integers (exact)
        if len(mech.c) > 1:
            ids, rows = gathered(world, self.clients, torch.cat(kept) if kept else torch.zeros(0, width))
            if self.is_server:
                total += mech.resent(self.t, cs, self.C, var, signs)
        m = 1 << p.bits
        secured = None if self.secure is None else self.secure.masked_sum(  # what secure aggregation unmasks
            self.t, cohort_of(world, self.clients), self.clients, lambda s: mech.encode(
                self.t, self.clients[s], make_rows(s).double() * (divisor / bound), cs, self.C, var, signs
            ).remainder_(m).numpy(), mech.padded, m, private=True)
        mech.last = {"privacy/wrap_bound": discrete.wrap_bound(senders, mech.padded, cs, (self.sigma * cs) ** 2,
                                                               p.bits, p.beta, mech.exponential),
                     "privacy/wrapped": math.nan, "privacy/scale": cs / self.C}
        if not self.is_server:
            return torch.zeros(width, dtype=torch.float64, device=device)
        if self.secure is not None and secured is None:  # secure aggregation aborted: an empty sum
            return torch.zeros(width, dtype=torch.float64, device=device)
        # what the server learns: Z mod 2^bits (unmasked by secure aggregation, the same integers)
        released = discrete.centred(torch.remainder(total, m) if secured is None else torch.from_numpy(secured),
                                    p.bits)
        mech.last["privacy/wrapped"] = float((released != total).sum())
        out = mech.decode(released, cs, self.C, signs)
        if len(mech.c) > 1:
            out = mech.keep(self.t, ids, rows, out)
        return (out * (bound / divisor)).to(device)


@register("distributed_dgauss")
class DistributedDGauss(Distributed):
    """Each client's share is discrete Gaussian N_Z(0, (sigma C s)^2 / n_t) (Kairouz, Liu, Steinke 2021)."""

    def sample(self, gen: np.random.Generator, var: float, size: int) -> np.ndarray:
        return discrete.discrete_gaussian(gen, var, size)

    def rdp_of(self, orders: np.ndarray, l2: float, l1: float, var: float) -> np.ndarray:
        tau = discrete.ddg_tau(var / self.population, self.population)
        return discrete.ddg_rdp(orders, l2 / math.sqrt(var), l1 / math.sqrt(var), tau, self.padded)


@register("distributed_skellam")
class DistributedSkellam(Distributed):
    """Each client's share is Skellam of variance (sigma C s)^2 / n_t (Agarwal, Kairouz, Liu 2021): the sum
    is Skellam of variance (sigma C s)^2, whatever the cohort."""

    exponential = True

    def sample(self, gen: np.random.Generator, var: float, size: int) -> np.ndarray:
        return discrete.skellam(gen, var, size)

    def rdp_of(self, orders: np.ndarray, l2: float, l1: float, var: float) -> np.ndarray:
        return discrete.skellam_rdp(orders, l2, l1, var)
