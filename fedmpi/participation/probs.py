"""Base availability probabilities p_i (``availability.base``), drawn once per seed.

Kinds: ``fixed`` (listed values), ``uniform`` U(lo, hi), ``beta`` Beta(a, b) and
``dirichlet_phi`` (FedSWE paper default): p_i = <nu_i, phi>, nu_i client i's normalised label
histogram, phi_c ~ U(0, Phi_c). Every draw comes from ``rng.generator(seed, purpose)``, so p is
identical on every rank and for every algorithm of a seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Optional, Union

import numpy as np

from .. import rng
from ..errors import InputError
from ..schema import opt
from .base import AvailabilityParams, ClientInfo


@dataclass
class BaseProbConfig:
    kind: Literal["fixed", "uniform", "beta", "dirichlet_phi"] = opt(
        "uniform", "how base probabilities p_i are made")
    values: Optional[Union[float, list]] = opt(None, "fixed: one p per client, or a single p for all (a number "
                                                     "or a list of one)")
    lo: float = opt(0.1, "uniform: lower end", ge=0, le=1)
    hi: float = opt(0.5, "uniform: upper end", ge=0, le=1)
    a: float = opt(0.5, "beta: a", gt=0)
    b: float = opt(0.5, "beta: b", gt=0)
    phi_max: Optional[list] = opt(None, "dirichlet_phi: Phi_c per class; null = 1 for the first half, 0.5 after")
    p_min: Optional[float] = opt(None, "floor applied to every p_i; null = none", ge=0, le=1)


@dataclass
class WithBaseParams(AvailabilityParams):
    """The keys of a kind built on base probabilities p_i."""

    base: BaseProbConfig = opt(BaseProbConfig(), "base probabilities p_i")


def check_base(cfg) -> None:
    """Cross-key checks of ``availability.base`` (kinds with ``WithBaseParams``)."""
    m, b = cfg.task.clients, cfg.availability.base
    if b.lo > b.hi:
        raise InputError(f"availability.base.lo: must be <= hi ({b.hi}), got {b.lo}")
    if b.values is not None:
        values = b.values if isinstance(b.values, list) else [b.values]
        if len(values) not in (1, m):
            raise InputError(f"availability.base.values: needs 1 or {m} (task.clients) values, got {len(values)}")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise InputError(f"availability.base.values: probabilities must be in [0, 1], got {v!r}")
    elif b.kind == "fixed":
        raise InputError("availability.base.values: base kind 'fixed' needs values")


def data_key(cfg: BaseProbConfig) -> str:
    """``availability.base.kind`` when the p_i are computed from the clients' data (``DATA_KINDS``),
    else ""; the kinds built on p_i pass it on to their ``Sampling`` (privacy refuses such a kind)."""
    return "availability.base.kind" if cfg.kind in DATA_KINDS else ""


def base_probabilities(cfg: BaseProbConfig, info: ClientInfo) -> np.ndarray:
    """The (m,) vector of base probabilities p_i, floored at ``p_min`` when set."""
    m = info.m
    if cfg.kind == "fixed":
        if cfg.values is None:
            raise InputError("availability.base.values: base kind 'fixed' needs values")
        v = np.asarray(cfg.values, dtype=np.float64).reshape(-1)  # a single p may be a number
        p = np.full(m, v[0]) if v.size == 1 else v.copy()
    elif cfg.kind == "uniform":
        p = rng.generator(info.seed, "base_prob").uniform(cfg.lo, cfg.hi, size=m)
    elif cfg.kind in _EXTRA:
        p = _EXTRA[cfg.kind](cfg, info)
    else:
        raise InputError(f"availability.base.kind: unknown kind {cfg.kind!r} "
                         f"(allowed: fixed, uniform, {', '.join(_EXTRA)})")
    if cfg.p_min is not None:
        p = np.maximum(p, cfg.p_min)
    return np.clip(p, 0.0, 1.0)


def _beta(cfg: BaseProbConfig, info: ClientInfo) -> np.ndarray:
    return rng.generator(info.seed, "base_prob").beta(cfg.a, cfg.b, size=info.m)


def class_weights(cfg: BaseProbConfig, seed: int, classes: int) -> np.ndarray:
    """phi: phi_c ~ U(0, Phi_c), drawn once per seed (independent of m and of the rank).

    Phi_c defaults to 1 for the first ceil(C/2) classes and 0.5 for the others.
    """
    if cfg.phi_max is None:
        cap = np.where(np.arange(classes) < classes / 2, 1.0, 0.5)
    else:
        vals = cfg.phi_max  # checked as Python values first: ['a', 'b'] or [[1], 2] must not reach numpy
        if len(vals) != classes or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in vals):
            raise InputError(f"availability.base.phi_max: needs {classes} numbers (one per class) "
                             f"in [0, 1], got {str(vals)[:80]}")
        cap = np.asarray(vals, dtype=np.float64)
    return rng.generator(seed, "base_prob_phi").uniform(0.0, 1.0, size=classes) * cap


def _dirichlet_phi(cfg: BaseProbConfig, info: ClientInfo) -> np.ndarray:
    hist = info.label_hist
    if hist is None:
        raise InputError("availability.base.kind: 'dirichlet_phi' needs the clients' label histograms; "
                         "this task has no labels (use fixed, uniform or beta)")
    hist = np.asarray(hist, dtype=np.float64)
    if hist.ndim != 2 or hist.shape[0] != info.m or np.any(hist < 0):
        raise InputError(f"availability.base.kind: 'dirichlet_phi' needs an (m={info.m}, classes) "
                         f"non-negative label histogram, got shape {hist.shape}")
    total = hist.sum(axis=1, keepdims=True)
    nu = np.divide(hist, total, out=np.zeros_like(hist), where=total > 0)  # no data -> p_i = 0
    return nu @ class_weights(cfg, info.seed, hist.shape[1])


# kind -> fn(cfg, info) -> (m,) array, for the kinds beyond fixed and uniform.
_EXTRA: dict[str, Callable[[BaseProbConfig, ClientInfo], np.ndarray]] = {
    "beta": _beta,
    "dirichlet_phi": _dirichlet_phi,
}
#: the base kinds whose p_i are computed from the clients' data (their label histograms)
DATA_KINDS = ("dirichlet_phi",)
