"""The banded factors of ``banded_mf`` (``privacy.factor``) and their errors (docs/PRIVACY.md,
"The factor"); ``fedmpi dp-factor`` prints them (fedmpi/privacy/dpfactor.py).

A factor is C, n x n lower-triangular, b-banded and Toeplitz, given by its first column
c_0..c_{b-1} (c_0 > 0): the noise is y = C^{-1} z, solved one round at a time from the last b - 1
values (``BandedMF.noise``). With A the prefix-sum matrix, the released prefix sums carry the noise
A C^{-1} z, whose expected total squared error is ||A C^{-1}||_F^2 per unit of noise; one
participation moves C x by its column, of norm at most max_j ||C[:, j]|| = ||c|| (the sensitivity).

- ``sqrt``: the square root of A truncated to b bands, scaled to unit norm
  (c_j = binom(2j, j) / 4^j before scaling);
- ``optimized``: c minimising ||A C^{-1}||_F^2 subject to ||c|| = 1, for the run's n = rounds: L-BFGS
  (torch, float64) on log ||A C^{-1}||_F^2 over v with c = v / ||v||, started from ``sqrt``. The loss
  needs only w, the first column of C^{-1} (C^{-1} is Toeplitz too), and its prefix sums s:
  ||A C^{-1}||_F^2 = sum_k (n - k) s_k^2, O(n b) per evaluation. Computed once per (n, b) and kept in
  the user's cache folder (``cache_folder``).

We optimise over Toeplitz C (b numbers, the streaming noise of ``sqrt``), not over every banded C
(n b numbers, Choquette-Choo et al.'s and jax_privacy's ``ColumnNormalizedBanded``): that one costs
O(n^2 b) per evaluation and measured 1.0-1.6 % lower rmse at n = 50..200 (docs/REPRODUCTION.md).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from typing import Literal

import numpy as np

from ..engine.threads import one_thread
from ..errors import InputError

Factor = Literal["sqrt", "optimized"]
FACTORS: tuple[str, ...] = ("sqrt", "optimized")
VERSION = 2  # of the optimisation: a cached factor of another version is not used
CACHE_ENV = "FEDMPI_CACHE"

log = logging.getLogger(__name__)


def sqrt_coefficients(b: int) -> np.ndarray:
    """c_0..c_{b-1} of the b-banded square root of the prefix-sum matrix, scaled to unit norm.

    The prefix-sum matrix is the Toeplitz matrix of 1 / (1 - x); its square root has the
    coefficients of (1 - x)^{-1/2}: c_j = binom(2j, j) / 4^j (c_{j} = c_{j-1} (2j - 1) / (2j)).
    Keeping b of them and dividing by their L2 norm makes every full column of C unit-norm."""
    c = np.ones(b)
    for j in range(1, b):
        c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
    return c / np.linalg.norm(c)


def coefficients(factor: str, rounds: int, band: int) -> np.ndarray:
    """c_0..c_{band-1} of ``factor`` for a run of ``rounds`` rounds (float64, unit norm)."""
    if factor == "sqrt":
        return sqrt_coefficients(band)
    if factor == "optimized":
        return optimized_coefficients(rounds, band)
    raise InputError(f"privacy.factor: unknown factor {factor!r} (allowed: {', '.join(FACTORS)})")


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
    """Where optimised factors are kept: ``$FEDMPI_CACHE``, else ``$XDG_CACHE_HOME/fedmpi``, else
    ``~/.cache/fedmpi``."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fedmpi")


def optimized_coefficients(n: int, b: int) -> np.ndarray:
    """``optimize(n, b)``, from the cache when it holds a valid one, else computed and stored
    there (written to a temporary file and renamed: concurrent runs never read half a file)."""
    if n < 1 or b < 1:
        raise InputError(f"rounds: the optimized banded factor needs rounds >= 1 and privacy.band >= 1 "
                         f"(got {n}, {b})")
    folder = os.path.join(cache_folder(), "factors")
    path = os.path.join(folder, f"banded-toeplitz-v{VERSION}-n{n}-b{b}.npy")
    try:
        c = np.load(path, allow_pickle=False)
        if c.shape == (b,) and c.dtype == np.float64 and np.all(np.isfinite(c)) and c[0] > 0 \
                and abs(float(np.linalg.norm(c)) - 1) < 1e-12:
            return c
    except (OSError, ValueError):
        pass
    c = optimize(n, b)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".banded-", suffix=".npy")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.save(fh, c)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        log.warning("privacy.factor: cannot keep the optimized factor in %s (%s); it is recomputed each run",
                    folder, e.strerror or e)
    return c
