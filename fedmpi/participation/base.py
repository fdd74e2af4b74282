"""The participation interface: who is available in round t.

A ``Participation`` is a deterministic function of (seed, round) -- plus its own chain
state for the Markov sampler -- computed identically on every rank without communication
(counter-based streams of ``fedmpi.rng``). ``available(t)`` must be called for
t = 0, 1, 2, ... in order (stateful kinds rely on it); it returns the sorted global ids
of the available clients. ``probabilities(t)`` returns the true p_i^t where the model is
Bernoulli (FedKnown needs it), else ``None``. ``sampling(rounds)`` describes how the kind picks
clients (``Sampling``), which is what client-level privacy needs to know of it (``fedmpi.privacy``
asks the kind; it knows no kind by name); a kind that does not describe itself (``None``) is
refused under ``privacy:``.

Kinds register themselves with ``@register("name")`` (``fedmpi.registry.AVAILABILITY``);
``build`` picks one from the config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from .. import rng
from ..errors import InputError
from ..registry import AVAILABILITY, is_builtin
from ..schema import Reads, opt
from ..state import Stateful


@dataclass
class AvailabilityParams:
    """The ``availability`` block: ``kind``, then the chosen kind's own parameters (a subclass)."""

    kind: str = opt("always", "availability dynamics", selects=AVAILABILITY)

    def input_files(self) -> tuple[str, ...]:
        """The files this kind reads (a run's result file must never be one of them)."""
        return ()


@dataclass
class ClientInfo:
    """What a participation model may know about the clients (built by the task)."""

    m: int  # the number of clients
    seed: int  # the run's seed (draw from fedmpi.rng streams keyed by it)
    label_hist: np.ndarray | None = None  # (m, classes) sample counts per class, None for quadratic
    group: np.ndarray | None = None  # (m,) data group of each client (partition 'groups'), else None
    rounds: int | None = None  # the run's rounds (None: no run, e.g. fedmpi availability's preview)


@dataclass(frozen=True)
class Sampling:
    """How a participation kind picks the clients of a round, as privacy accounting needs it.

    ``kind``: ``poisson`` -- every client independently, with probability at most ``q`` in any round
    (amplification by Poisson sampling applies); ``fixed_size`` -- ``size`` of the ``m`` clients
    uniformly without replacement (amplification by sampling without replacement); ``none`` --
    nothing random to amplify (everyone, a chain that depends on the past, a replayed trace).
    ``cohort``: n~, the expected number of clients per round (the fixed divisor of the noisy sum).
    ``separation``: the fewest rounds between two participations of one client (1: none), and
    ``separation_key`` the config key that sets it. ``period``, ``per_period``: a client takes part
    in at most ``per_period`` of any ``period`` consecutive rounds; ``counted``: (rounds, the most
    participations of one client in the first that many), measured (a trace). ``data``: the config
    key that makes who takes part depend on the clients' data ("" when it does not)."""

    kind: Literal["poisson", "fixed_size", "none"]
    cohort: float
    q: float = 1.0
    m: int = 0
    size: int = 0
    separation: int = 1
    separation_key: str = ""
    period: int | None = None
    per_period: int = 1
    counted: tuple[int, int] | None = None
    data: str = ""

    def participations(self, rounds: int) -> int:
        """k: the most rounds out of the first ``rounds`` in which one client can take part."""
        k = math.ceil(rounds / self.separation)
        if self.period is not None:
            full, rest = divmod(rounds, self.period)
            k = min(k, full * self.per_period + min(rest, self.per_period))
        if self.counted is not None and rounds <= self.counted[0]:
            k = min(k, self.counted[1])
        return k


class Participation(Stateful):
    """Base class; subclasses implement ``available``, ``sampling`` and, when Bernoulli,
    ``probabilities``; a stateful kind declares its ``shared_state`` (``fedmpi.state``) for
    checkpoints, its scratch arrays in ``derived`` and what set-up fixes in ``configuration``."""

    configuration = ("m", "seed")

    def __init__(self, m: int, seed: int):
        self.m = m
        self.seed = seed

    def available(self, t: int) -> np.ndarray:
        """The sorted global ids of the clients available in round t (every rank, t = 0, 1, ... in order)."""
        raise NotImplementedError

    def probabilities(self, t: int) -> np.ndarray | None:
        """The true p_i^t (m,) of a Bernoulli kind, else None."""
        return None

    def sampling(self, rounds: int) -> Sampling | None:
        """How this kind picks clients over a run of ``rounds`` rounds (``Sampling``; computed once,
        on every rank, before the first round); None: it does not say (refused under privacy)."""
        return None


class Bernoulli(Participation):
    """Client i is available in round t independently with probability p_i^t.

    ``prob(t)`` gives the (m,) vector p_i^t. When ``static`` the thresholds are computed once
    (one number when every client has the same p). The draw is ``rng.below``: client i is
    available when ``bits(key(seed, "availability", t), i) < threshold(p_i^t)``.

    ``period``: p^{t + period} = p^t (a static kind has period 1); without one the kind does not
    describe its sampling. ``data``: the config key that makes the p_i depend on the clients' data
    (``""``: they do not). ``separation_key``: the key that sets the rounds a client must wait.
    """

    derived = ("_thr",)  # thresholds, from the config
    configuration = ("_prob", "period", "data", "separation_key")

    def __init__(self, m: int, seed: int, prob: Callable[[int], np.ndarray], static: bool = False,
                 period: int | None = None, data: str = "", separation_key: str = ""):
        super().__init__(m, seed)
        self._prob = prob
        self._thr = _compact(rng.threshold(prob(0))) if static else None
        self.period = 1 if static else period
        self.data, self.separation_key = data, separation_key

    def probabilities(self, t: int) -> np.ndarray:
        return np.clip(self._prob(t), 0.0, 1.0)

    def available(self, t: int) -> np.ndarray:
        thr = self._thr if self._thr is not None else rng.threshold(self._prob(t))
        return rng.below(rng.key(self.seed, "availability", t), thr, self.m)

    def sampling(self, rounds: int) -> Sampling | None:
        """Poisson with q = the largest p_i^t of a period and n~ = the mean of sum_i p_i^t over it;
        the rounds where p_i^t > 0 give the separation and how many of a period a client can use
        (cyclic: 1 of K). O(period x m), once."""
        if self.period is None:
            return None
        if self.period * self.m > _DESCRIBE_LIMIT:
            raise InputError(f"availability.period: describing {self.period} rounds x {self.m} clients of "
                             f"probabilities for privacy accounting is more than {_DESCRIBE_LIMIT:.0e} values")
        support = _Support(self.m)
        q = total = 0.0
        for t in range(self.period):
            p = self.probabilities(t)
            q, total = max(q, float(p.max(initial=0.0))), total + float(p.sum())
            support.add(t, p > 0)
        sep = support.separation(self.period)
        kind = "poisson" if q < 1 else "none"  # p_i^t in {0, 1}: no chance involved
        return Sampling(kind, total / self.period, q=q if q < 1 else 1.0, separation=sep,
                        separation_key=self.separation_key, period=self.period,
                        per_period=max(int(support.count.max(initial=0)), 1), data=self.data)


_DESCRIBE_LIMIT = 2**28  # p_i^t values a Bernoulli kind may read to describe its sampling


class _Support:
    """The rounds in which each client can take part, folded as they come: how many, and the
    fewest rounds between two of them (``add`` in round order)."""

    def __init__(self, m: int):
        self.first = np.full(m, -1, dtype=np.int64)
        self.last = np.full(m, -1, dtype=np.int64)
        self.gap = np.full(m, np.iinfo(np.int64).max, dtype=np.int64)
        self.count = np.zeros(m, dtype=np.int64)

    def add(self, t: int, on: np.ndarray | slice) -> None:
        ids = np.flatnonzero(on) if not isinstance(on, np.ndarray) or on.dtype == bool else on
        seen = self.last[ids] >= 0
        self.gap[ids[seen]] = np.minimum(self.gap[ids[seen]], t - self.last[ids[seen]])
        self.first[ids[~seen]] = t
        self.last[ids] = t
        self.count[ids] += 1

    def separation(self, period: int | None = None, none: int = 1) -> int:
        """The fewest rounds between two participations of one client (``none`` when no client
        takes part twice); with ``period`` the rounds repeat, so the last of a period and the first
        of the next count too."""
        gap = self.gap
        if period is not None:
            on = self.first >= 0
            gap = gap.copy()
            gap[on] = np.minimum(gap[on], self.first[on] + period - self.last[on])
        smallest = int(gap.min(initial=np.iinfo(np.int64).max))
        return smallest if smallest < np.iinfo(np.int64).max else none


def _compact(thr: np.ndarray) -> np.ndarray | np.uint64:
    """One threshold when all are equal (``rng.below`` then reads no (m,) array), else ``thr``."""
    flat = np.ravel(thr)
    return flat[0] if flat.size and np.all(flat == flat[0]) else thr


Factory = Callable[[AvailabilityParams, ClientInfo], Participation]


#: what a plug-in kind that declares no read of ``rounds`` is taken to read: it is given the
#: run's rounds (``ClientInfo.rounds``), and fedmpi cannot see whether it uses them (one that
#: does only sometimes declares its own ``Reads("rounds", ..., when=...)``)
GIVEN_ROUNDS = Reads("rounds", "is a plug-in kind, given the run's rounds (ClientInfo.rounds)")


def register(kind: str, *, params: type = AvailabilityParams, check: Callable | None = None,
             reads: tuple[Reads, ...] = ()) -> Callable[[Factory], Factory]:
    """Decorator: ``@register("sine", params=SineParams) def make(params, info) -> Participation``.

    ``params``: the dataclass of the kind's keys in the ``availability`` block (an
    ``AvailabilityParams`` subclass; the default: no keys of its own). ``check``: a cross-key
    check of the config (raises InputError). ``reads``: keys of other sections it reads
    (``fedmpi.schema.Reads``); a plug-in's that names no ``rounds`` gets ``GIVEN_ROUNDS``, so a
    resume or an extension with other rounds is refused (docs/PLUGINS.md)."""

    def deco(factory: Factory) -> Factory:
        declared = tuple(reads)
        if not is_builtin(getattr(factory, "__module__", "") or "") and all(r.key != "rounds" for r in declared):
            declared += (GIVEN_ROUNDS,)
        return AVAILABILITY.register(kind, params=params, check=check, reads=declared)(factory)

    return deco


def build(cfg: AvailabilityParams, info: ClientInfo) -> Participation:
    """The participation model named by ``availability.kind``."""
    return AVAILABILITY.get(cfg.kind).obj(cfg, info)


def mask(ids: np.ndarray, m: int) -> np.ndarray:
    """uint8 0/1 vector of length m from sorted available ids."""
    out = np.zeros(m, dtype=np.uint8)
    out[ids] = 1
    return out
