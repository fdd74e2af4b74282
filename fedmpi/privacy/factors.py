"""The banded factors of ``banded_mf`` (``privacy.factor``) and their errors (docs/PRIVACY.md,
"The factor"); ``fedmpi dp-factor`` prints them (fedmpi/privacy/dpfactor.py).

A factor is C, n x n lower-triangular and b-banded with unit-norm columns: the noise is
y = C^{-1} z, solved one round at a time from the last b - 1 values (``BandedMF.noise``). With A
the prefix-sum matrix, the released prefix sums carry the noise A C^{-1} z, whose expected total
squared error is ||A C^{-1}||_F^2 per unit of noise; one participation moves C x by its column, of
norm at most max_j ||C[:, j]|| = 1 (the sensitivity).

- ``sqrt``: Toeplitz, the square root of A truncated to b bands, scaled to unit norm
  (c_j = binom(2j, j) / 4^j before scaling);
- ``optimized``: Toeplitz, first column c minimising ||A C^{-1}||_F^2 subject to ||c|| = 1, for the
  run's n = rounds: L-BFGS (torch, float64) on log ||A C^{-1}||_F^2 over v with c = v / ||v||,
  started from ``sqrt``. The loss needs only w, the first column of C^{-1} (C^{-1} is Toeplitz too),
  and its prefix sums s: ||A C^{-1}||_F^2 = sum_k (n - k) s_k^2, O(n b) per evaluation;
- ``banded``: the general b-banded optimum, all n b entries free, each column scaled to unit norm
  (Choquette-Choo et al.'s and jax_privacy's ``ColumnNormalizedBanded``; fedmpi/privacy/general.py),
  O(n max(b, 32)^2) per evaluation, started from ``optimized``: 0.2-1.3 % less rmse
  (docs/REPRODUCTION.md).

A Toeplitz factor is its first column c_0..c_{b-1}; any factor its rows, ``rows[t, o]`` = C[t, t - o].
The optimised ones are computed once per (n, b) and kept, verified, in the user's cache folder
(fedmpi/privacy/factor_cache.py).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Literal

import numpy as np

from ..engine.threads import one_thread
from ..errors import InputError
from . import factor_cache, general
from .factor_cache import CACHE_ENV  # noqa: F401  (where the cache is)

Factor = Literal["sqrt", "optimized", "banded"]
FACTORS: tuple[str, ...] = ("sqrt", "optimized", "banded")
TOEPLITZ: tuple[str, ...] = ("sqrt", "optimized")  # the factors given by their first column
VERSION = {"optimized": 2, "banded": 1}  # of each optimisation: a cached factor of another version is not used
#: what a factor may take (exit 2 beyond): entries n min(b, n) of any factor, and for ``banded`` the
#: work of one evaluation n max(b, 32)^2 (about a minute of optimisation per 1e8 on one core)
MAX_ENTRIES = 10 ** 7
MAX_BANDED_WORK = 2 * 10 ** 8
STATIONARY = 1e-4  # a cached optimum's gradient of log ||A C^-1||_F^2 is below this (L-BFGS ends near 1e-7)


def sqrt_coefficients(b: int) -> np.ndarray:
    """c_0..c_{b-1} of the b-banded square root of the prefix-sum matrix, scaled to unit norm.

    The prefix-sum matrix is the Toeplitz matrix of 1 / (1 - x); its square root has the
    coefficients of (1 - x)^{-1/2}: c_j = binom(2j, j) / 4^j (c_{j} = c_{j-1} (2j - 1) / (2j)).
    Keeping b of them and dividing by their L2 norm makes every full column of C unit-norm."""
    c = np.ones(b)
    for j in range(1, b):
        c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
    return c / np.linalg.norm(c)


def check_size(factor: str, rounds: int, band: int, keys: tuple[str, str] = ("rounds", "privacy.band")) -> None:
    """InputError naming ``keys`` (rounds, band) where ``factor`` for ``rounds`` x ``band`` is beyond
    ``MAX_ENTRIES`` / ``MAX_BANDED_WORK``, or either is < 1."""
    if rounds < 1 or band < 1:
        raise InputError(f"{keys[0]}: the {factor} factor needs {keys[0]} >= 1 and {keys[1]} >= 1 "
                         f"(got {rounds}, {band})")
    entries = rounds * min(band, rounds)
    if factor in TOEPLITZ and band > MAX_ENTRIES:
        raise InputError(f"{keys[1]}: {band} bands, more than {MAX_ENTRIES:.0e}")
    if entries > MAX_ENTRIES:
        raise InputError(f"{keys[0]}, {keys[1]}: the {factor} factor for {rounds} rounds and {band} bands has "
                         f"rounds x min(band, rounds) = {entries:.3g} entries, more than {MAX_ENTRIES:.0e}")
    work = rounds * general.Layout(rounds, min(band, rounds)).m ** 2
    if factor == "banded" and work > MAX_BANDED_WORK:
        raise InputError(f"{keys[0]}, {keys[1]}: the banded factor for {rounds} rounds and {band} bands takes "
                         f"rounds x max(band, 32)^2 = {work:.3g} per evaluation, more than {MAX_BANDED_WORK:.0e} "
                         f"(use privacy.factor: optimized, the Toeplitz one, or fewer bands)")


def coefficients(factor: str, rounds: int, band: int) -> np.ndarray:
    """c_0..c_{band-1} of the Toeplitz ``factor`` for a run of ``rounds`` rounds (float64, unit norm)."""
    if factor == "sqrt":
        return sqrt_coefficients(band)
    if factor == "optimized":
        return optimized_coefficients(rounds, band)
    raise InputError(f"privacy.factor: {factor!r} is not a Toeplitz factor, which this mechanism needs "
                     f"(allowed: {', '.join(TOEPLITZ)})")


def rows_of(columns: np.ndarray) -> np.ndarray:
    """(n, b): ``rows[t, o]`` = C[t, t - o] (0 above the matrix) of the factor of ``columns`` (``banded_columns``)."""
    return general.rows(_tensor(columns)).numpy()


def _tensor(a: np.ndarray):
    import torch

    return torch.from_numpy(np.require(a, np.float64, ["C", "W"]))  # a read-only view (broadcast_to): copied


# ----------------------------------------------------------------------------- errors

def _inverse(c, n: int):
    """w_0..w_{n-1}, the first column of C^{-1} (torch, float64, differentiable in c).

    w_0 = 1 / c_0 and w_k = -(c_1 w_{k-1} + ... + c_{b-1} w_{k-b+1}) / c_0: the state
    (w_k, ..., w_{k-b+2}) moves by a companion matrix F, so all n states come from log2(n)
    doublings (states 0..m-1, then times F^m for m..2m-1), vectorised."""
    import torch

    b = c.shape[0]
    w0 = (1 / c[:1])
    if b == 1 or n == 1:
        return torch.cat([w0, torch.zeros(n - 1, dtype=c.dtype)])
    shift = torch.eye(b - 1, dtype=c.dtype)[:-1]
    F = torch.cat([(-c[1:] / c[0])[None], shift])
    states = torch.cat([w0, torch.zeros(b - 2, dtype=c.dtype)])[None]
    power = F
    while states.shape[0] < n:
        states = torch.cat([states, states @ power.T])
        power = power @ power
    return states[:n, 0]


def _squared_error(c, n: int):
    """||A C^{-1}||_F^2 for the n x n factor of first column ``c`` (torch, differentiable)."""
    import torch

    s = torch.cumsum(_inverse(c, n), 0)  # A C^{-1} is Toeplitz with first column s
    return ((n - torch.arange(n, dtype=c.dtype)) * s ** 2).sum()


def errors(c: np.ndarray, n: int) -> dict[str, float]:
    """The n x n factor of first column ``c``: ``rmse`` = ||A C^{-1}||_F / sqrt(n), ``max_error`` =
    the largest row norm of A C^{-1} (its last row's), ``sensitivity`` = max_j ||C[:, j]|| (one
    participation, per unit of clip; k participations >= b rounds apart: sqrt(k) times it)."""
    import torch

    c = np.asarray(c, dtype=np.float64)[:n]
    with one_thread(torch.device("cpu")):  # one order of additions: the same factor on any rank
        s = torch.cumsum(_inverse(torch.from_numpy(c), n), 0)
        total = float(((n - torch.arange(n, dtype=torch.float64)) * s ** 2).sum())
        last = float((s ** 2).sum())
    return {"rmse": math.sqrt(total / n), "max_error": math.sqrt(last), "sensitivity": float(np.linalg.norm(c))}


# ----------------------------------------------------------------------------- optimisation

def optimize(n: int, b: int) -> np.ndarray:
    """The unit-norm c_0..c_{b-1} minimising ||A C^{-1}||_F^2 for n rounds (module docstring);
    coefficients beyond n (b > n) are 0. Never worse than ``sqrt``: it starts there."""
    import torch

    start = sqrt_coefficients(min(b, n))
    v = torch.tensor(start, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([v], lr=1, max_iter=1000, max_eval=5000, tolerance_grad=1e-12,
                            tolerance_change=1e-15, history_size=50, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.log(_squared_error(v / v.norm(), n))
        if not torch.isfinite(loss):  # C^{-1} overflows (c(x) has a root in the unit disc): too far, says
            loss = (v * 0).sum() + 1e10  # a large finite loss, so that the line search steps back
        loss.backward()
        return loss

    def value() -> float:
        with torch.no_grad():
            return float(_squared_error(v / v.norm(), n))

    with one_thread(torch.device("cpu")):  # one order of additions: the same factor on any rank
        for _ in range(3):  # LBFGS restarts its memory: stop when a restart gains nothing
            before = value()
            opt.step(closure)
            if not value() < before:
                break
        c = (v / v.norm()).detach()
        if not float(_squared_error(c, n)) < float(_squared_error(torch.from_numpy(start), n)):
            c = torch.from_numpy(start)  # b = 1, or n too small to gain anything
    out = np.zeros(b)
    out[:min(b, n)] = c.numpy()
    return out


def cache_folder() -> str:
    """Where optimised factors are kept (in its ``factors`` folder): ``$FEDMPI_CACHE``, else
    ``$XDG_CACHE_HOME/fedmpi``, else ``~/.cache/fedmpi``."""
    return os.path.dirname(factor_cache.folder())


def optimized_coefficients(n: int, b: int) -> np.ndarray:
    """``optimize(n, b)``, from the cache when it holds it (verified), else computed and kept there."""
    check_size("optimized", n, b)
    inputs = {"factor": "optimized", "version": VERSION["optimized"], "rounds": n, "band": b}
    return factor_cache.cached(inputs, (b,), lambda: optimize(n, b), lambda c: _toeplitz_optimal(c, n))


def banded_columns(n: int, b: int) -> np.ndarray:
    """The general b-banded optimum for n rounds, its unit-norm columns in jax_privacy's ``params``
    layout (n, b): ``columns[j, i]`` = C[j + i, j]; from the cache when it holds it (verified), else
    computed (``general.optimize``, from the optimised Toeplitz factor) and kept there."""
    check_size("banded", n, b)
    inputs = {"factor": "banded", "version": VERSION["banded"], "rounds": n, "band": b}
    return factor_cache.cached(inputs, (n, b), lambda: general.optimize(n, b, optimized_coefficients(n, b)),
                               lambda a: _banded_optimal(a, n, b))


def _toeplitz_optimal(c: np.ndarray, n: int) -> str:
    """The re-check of a cached ``optimize(n, b)``: "" when ``c`` is a unit-norm factor (c_0 > 0) at
    which log ||A C^{-1}||_F^2 is stationary on the sphere, or the start ``sqrt`` (where nothing was
    gained); else why not."""
    import torch

    bb = min(len(c), n)
    if not (np.all(np.isfinite(c)) and c[0] > 0 and abs(_norm(c) - 1) < 1e-12 and not np.any(c[bb:])):
        return "not a unit-norm factor with c_0 > 0"
    if np.array_equal(c[:bb], sqrt_coefficients(bb)):
        return ""
    v = torch.tensor(c[:bb], requires_grad=True)
    with _one_cpu_thread():
        torch.log(_squared_error(v / v.norm(), n)).backward()
    g = float(v.grad.norm())
    return "" if g < STATIONARY else f"not the optimum for {n} rounds: its gradient is {g:.2g}"


def _norm(a: np.ndarray, axis: int | None = None) -> Any:
    """The L2 norm of a cached file's numbers, inf where they overflow it (a crafted 1e300: no warning)."""
    with np.errstate(over="ignore"):
        return np.linalg.norm(a, axis=axis) if axis is not None else float(np.linalg.norm(a))


def _banded_optimal(a: np.ndarray, n: int, b: int) -> str:
    """The re-check of a cached general factor: "" when ``a`` holds unit-norm columns (positive
    diagonal, 0 outside the matrix) at which log ||A C^{-1}||_F^2 is stationary, or the Toeplitz
    start; else why not."""
    bb = min(b, n)
    inside = general.valid(n, bb).numpy()
    cols = a[:, :bb]
    if not (np.all(np.isfinite(a)) and np.all(cols[:, 0] > 0) and not np.any(a[:, bb:])
            and not np.any(cols[~inside]) and np.all(np.abs(_norm(cols, axis=1) - 1) < 1e-12)):
        return "not unit-norm columns with a positive diagonal"
    start = general.normalized(_tensor(np.broadcast_to(optimized_coefficients(n, b)[:bb], (n, bb))))
    if np.array_equal(cols, start.numpy()):
        return ""
    with _one_cpu_thread():
        f, grad = general.loss_and_gradient(_tensor(cols))
    g = float(grad.norm()) / f
    return "" if g < STATIONARY else f"not the optimum for {n} rounds: its gradient is {g:.2g}"


def _one_cpu_thread():
    import torch

    return one_thread(torch.device("cpu"))


def factor_errors(factor: str, rounds: int, band: int) -> dict[str, float]:
    """``errors`` of ``factor`` for ``rounds`` rounds and ``band`` bands (any factor)."""
    if factor != "banded":
        return errors(coefficients(factor, rounds, band), rounds)
    return columns_errors(banded_columns(rounds, band))


def columns_errors(cols: np.ndarray) -> dict[str, float]:
    """``errors`` of the factor of unit-norm ``cols`` (``banded_columns``' layout), n = len(cols)."""
    rounds = len(cols)
    sq = general.squared_errors(_tensor(cols)).numpy()
    return {"rmse": math.sqrt(float(sq.sum()) / rounds), "max_error": math.sqrt(float(sq.max())),
            "sensitivity": float(np.linalg.norm(cols, axis=1).max())}


def described(factor: str, rounds: int, band: int, used: np.ndarray) -> str:
    """The factor a run used, for its result file (JSON): which, for how many rounds and bands, and
    the SHA-256 of its numbers (``used``: a Toeplitz factor's first column, else its rows)."""
    return json.dumps({"factor": factor, "rounds": rounds, "band": band, "sha256": factor_cache.digest(used)})
