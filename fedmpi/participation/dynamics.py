"""Time-varying Bernoulli availability: p_i^t = clip(p_i * f_i(t), 0, 1) (docs/ALGORITHMS.md section 1).

Kinds (period P = ``availability.period``):

- ``staircase``: f = 1 for t mod P < P/2, else ``low`` (paper: 0.4, P = 20).
- ``sine``: f = gamma * sin(2 pi t / P) + (1 - gamma).
- ``interleaved_sine``: the sine p_i^t, set to 0 where it is below ``cutoff`` (authors' code).
- ``periodic_groups``: n client groups take turns; group g owns the rounds with
  floor((t mod P) * n / P) = g (n = 2: M1 when t mod P < P/2, M2 otherwise). Groups are the data
  groups (``info.group``, partition 'groups') or else the first / second half of the ids. Inside
  its window a client uses p_i ("static") or p_i times the staircase of the window (1 in its
  first half, ``low`` in its second half; ``window: staircase``).
- ``cyclic``: K = ``groups``, G(i) = floor(i K / m); p_i^t = p_i if t mod K = G(i) else 0.

All draws go through ``base.Bernoulli`` (keyed by (seed, "availability", t)), so a seed gives the
same pattern for every algorithm and on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from ..errors import InputError
from ..schema import opt
from .base import Bernoulli, ClientInfo, Participation, register
from .probs import WithBaseParams, base_probabilities, check_base, data_key


@dataclass
class PeriodicParams(WithBaseParams):
    period: int = opt(20, "P: period of staircase/sine/periodic_groups", ge=1)


@dataclass
class StaircaseParams(PeriodicParams):
    low: float = opt(0.4, "staircase: factor in the second half of each period", ge=0, le=1)


@dataclass
class SineParams(PeriodicParams):
    gamma: float = opt(0.3, "sine degree", ge=0, le=1)


@dataclass
class InterleavedSineParams(SineParams):
    cutoff: float = opt(0.1, "interleaved_sine: p below this is set to 0", ge=0, le=1)


@dataclass
class PeriodicGroupsParams(StaircaseParams):
    window: Literal["static", "staircase"] = opt("static", "periodic_groups: pattern inside a group's window")


@dataclass
class CyclicParams(WithBaseParams):
    groups: int = opt(2, "cyclic: number of groups K", ge=1)

Factor = Callable[[int], "np.ndarray | float"]


def staircase(t: int, period: int, low: float) -> float:
    """f(t) = 1 in the first half of each period, ``low`` in the second."""
    return 1.0 if 2 * (t % period) < period else low


def sine(t: int, period: int, gamma: float) -> float:
    """f(t) = gamma * sin(2 pi t / P) + (1 - gamma)."""
    return gamma * np.sin(2.0 * np.pi * (t % period) / period) + (1.0 - gamma)


def block_groups(m: int, k: int) -> np.ndarray:
    """G(i) = floor(i * k / m): k contiguous, near-equal blocks of client ids."""
    return (np.arange(m, dtype=np.int64) * k) // m


def modulated(cfg: WithBaseParams, info: ClientInfo, factor: Factor, period: int,
              cutoff: float | None = None, separation_key: str = "") -> Bernoulli:
    """Bernoulli availability with p_i^t = clip(p_i * factor(t), 0, 1), zeroed below ``cutoff``;
    ``factor`` repeats every ``period`` rounds."""
    p = base_probabilities(cfg.base, info)

    def prob(t: int) -> np.ndarray:
        q = np.clip(p * factor(t), 0.0, 1.0)
        if cutoff is not None:
            q[q < cutoff] = 0.0
        return q

    return Bernoulli(info.m, info.seed, prob, period=period, data=data_key(cfg.base), separation_key=separation_key)


@register("staircase", params=StaircaseParams, check=check_base)
def _staircase(cfg: StaircaseParams, info: ClientInfo) -> Participation:
    return modulated(cfg, info, lambda t: staircase(t, cfg.period, cfg.low), cfg.period)


@register("sine", params=SineParams, check=check_base)
def _sine(cfg: SineParams, info: ClientInfo) -> Participation:
    return modulated(cfg, info, lambda t: sine(t, cfg.period, cfg.gamma), cfg.period)


@register("interleaved_sine", params=InterleavedSineParams, check=check_base)
def _interleaved_sine(cfg: InterleavedSineParams, info: ClientInfo) -> Participation:
    return modulated(cfg, info, lambda t: sine(t, cfg.period, cfg.gamma), cfg.period, cutoff=cfg.cutoff)


def _data_groups(info: ClientInfo) -> np.ndarray:
    """The clients' groups for periodic_groups: data groups when known, else two halves."""
    if info.group is None:
        return block_groups(info.m, 2)
    g = np.asarray(info.group)
    if g.shape != (info.m,) or not np.issubdtype(g.dtype, np.integer) or g.min(initial=0) < 0:
        raise InputError(f"availability.kind: periodic_groups needs one non-negative integer data group "
                         f"per client (m={info.m}), got shape {g.shape}")
    return g.astype(np.int64)


@register("periodic_groups", params=PeriodicGroupsParams, check=check_base)
def _periodic_groups(cfg: PeriodicGroupsParams, info: ClientInfo) -> Participation:
    group = _data_groups(info)
    n, period, low = int(group.max(initial=0)) + 1, cfg.period, cfg.low
    inner = cfg.window == "staircase"

    def factor(t: int) -> np.ndarray:
        r = t % period
        g = (r * n) // period  # the group whose window contains t
        level = low if inner and 2 * (n * r - g * period) >= period else 1.0
        return np.where(group == g, level, 0.0)

    return modulated(cfg, info, factor, period)


@register("cyclic", params=CyclicParams, check=check_base)
def _cyclic(cfg: CyclicParams, info: ClientInfo) -> Participation:
    group, k = block_groups(info.m, cfg.groups), cfg.groups
    return modulated(cfg, info, lambda t: (group == t % k).astype(np.float64), k,
                     separation_key="availability.groups")
