"""The participation interface: who is available in round t.

A ``Participation`` is a deterministic function of (seed, round) -- plus its own chain
state for the Markov sampler -- computed identically on every rank without communication
(counter-based streams of ``fedmpi.rng``). ``available(t)`` must be called for
t = 0, 1, 2, ... in order (stateful kinds rely on it); it returns the sorted global ids
of the available clients. ``probabilities(t)`` returns the true p_i^t where the model is
Bernoulli (FedKnown needs it), else ``None``.

Kinds register themselves with ``@register("name")`` (``fedmpi.registry.AVAILABILITY``);
``build`` picks one from the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import rng
from ..registry import AVAILABILITY
from ..schema import opt
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

    m: int
    seed: int
    label_hist: np.ndarray | None = None  # (m, classes) sample counts per class, None for quadratic
    group: np.ndarray | None = None  # (m,) data group of each client (partition 'groups'), else None
    rounds: int | None = None  # the run's rounds (None: no run, e.g. fedmpi availability's preview)


class Participation(Stateful):
    """Base class; subclasses implement ``available`` and, when Bernoulli, ``probabilities``;
    a stateful kind declares its ``shared_state`` (``fedmpi.state``) for checkpoints."""

    def __init__(self, m: int, seed: int):
        self.m = m
        self.seed = seed

    def available(self, t: int) -> np.ndarray:
        raise NotImplementedError

    def probabilities(self, t: int) -> np.ndarray | None:
        return None


class Bernoulli(Participation):
    """Client i is available in round t independently with probability p_i^t.

    ``prob(t)`` gives the (m,) vector p_i^t. When ``static`` the thresholds are computed once
    (one number when every client has the same p). The draw is ``rng.below``: client i is
    available when ``bits(key(seed, "availability", t), i) < threshold(p_i^t)``.
    """

    def __init__(self, m: int, seed: int, prob: Callable[[int], np.ndarray], static: bool = False):
        super().__init__(m, seed)
        self._prob = prob
        self._thr = _compact(rng.threshold(prob(0))) if static else None

    def probabilities(self, t: int) -> np.ndarray:
        return np.clip(self._prob(t), 0.0, 1.0)

    def available(self, t: int) -> np.ndarray:
        thr = self._thr if self._thr is not None else rng.threshold(self._prob(t))
        return rng.below(rng.key(self.seed, "availability", t), thr, self.m)


def _compact(thr: np.ndarray) -> np.ndarray | np.uint64:
    """One threshold when all are equal (``rng.below`` then reads no (m,) array), else ``thr``."""
    flat = np.ravel(thr)
    return flat[0] if flat.size and np.all(flat == flat[0]) else thr


Factory = Callable[[AvailabilityParams, ClientInfo], Participation]


def register(kind: str, *, params: type = AvailabilityParams,
             check: Callable | None = None) -> Callable[[Factory], Factory]:
    """Decorator: ``@register("sine", params=SineParams) def make(params, info) -> Participation``.

    ``params``: the dataclass of the kind's keys in the ``availability`` block (an
    ``AvailabilityParams`` subclass; the default: no keys of its own). ``check``: a cross-key
    check of the config (raises InputError)."""
    return AVAILABILITY.register(kind, params=params, check=check)


def build(cfg: AvailabilityParams, info: ClientInfo) -> Participation:
    """The participation model named by ``availability.kind``."""
    return AVAILABILITY.get(cfg.kind).obj(cfg, info)


def mask(ids: np.ndarray, m: int) -> np.ndarray:
    """uint8 0/1 vector of length m from sorted available ids."""
    out = np.zeros(m, dtype=np.uint8)
    out[ids] = 1
    return out
