"""``privacy.mechanism: banded_mf`` -- DP-FTRL with banded matrix-factorization noise
(Choquette-Choo et al. 2023; docs/PRIVACY.md, "Theorem used for banded MF").

y = C^{-1} z for a lower-triangular b-banded C of unit column norm -- Toeplitz (first column c:
the square root of the prefix-sum matrix truncated to b bands, or the one optimised for the run's
rounds) or the general b-banded optimum (``privacy.factor``, fedmpi/privacy/factors.py) -- solved
one round at a time from the last b - 1 values of y, with row t of C (c_j = C[t, t - j]; the
first column for a Toeplitz one):

    y_t = (z_t - sum_{j=1}^{b-1} c_j y_{t-j}) / c_0          (O(b d) memory: ``history``)

Under b-min-separation (every client's participations >= b rounds apart) the columns one client
touches are orthogonal, so its sensitivity is sqrt(k) C max_j ||C[:, j]|| = sqrt(k) C: the
accountant composes k Gaussians of multiplier sigma; where the kind also samples each client
independently (Poisson, e.g. ``cyclic``) and the algorithm's release hides who took part, k
Poisson-subsampled Gaussians (amplified banded MF, Choquette-Choo et al. 2023, Theorem 4;
docs/PRIVACY.md). Without that separation the bound fails: refused. A factor of one's own
replaces ``coefficients`` (a plug-in's: examples/fedmpi_examples/mechanism.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..participation import Sampling
from ..schema import Digest, Reads, opt
from . import factors
from .factors import sqrt_coefficients as banded_sqrt_coefficients  # noqa: F401  (its old name)
from .mechanism import Mechanism, register, standard_normal
from .params import PrivacyParams


@dataclass
class BandedParams(PrivacyParams):
    band: int = opt(1, "b: bands of banded_mf's factor (1 = independent noise); needs separation >= b", ge=1,
                    digest=Digest(at="privacy.band", default=1))  # once a key of every mechanism
    factor: factors.Factor = opt(
        "sqrt", "banded_mf's factor C: sqrt (the prefix-sum matrix's square root, truncated to b bands), "
                "optimized (the Toeplitz C of least expected squared error of the prefix sums for the run's "
                "rounds) or banded (the general b-banded C of least error, every entry free); optimised ones are "
                "computed once, cached in $FEDMPI_CACHE or $XDG_CACHE_HOME/fedmpi")


def require_separation(cfg: Any, sampling: Sampling, mechanism: str, b: int, why: str = "") -> None:
    """Refuse (InputError naming the keys) a kind whose participations may come closer than ``b``
    rounds: banded noise's bound (and the distributed lattice's re-sent rows) assume they do not."""
    sep = sampling.separation
    if sep < b:
        how = f"{sampling.separation_key} >= {b} or " if sampling.separation_key else ""
        raise InputError(f"privacy.band: {mechanism} needs participations >= b = {b} rounds apart{why}, "
                         f"availability.kind {cfg.availability.kind!r} guarantees {sep} "
                         f"(set {how}privacy.band <= {sep})")


@register("banded_mf")
class BandedMF(Mechanism):
    Params = BandedParams
    shared_state = ("history",)  # y_{t-1}, ..., y_{t-b+1}
    derived = ("c", "rows", "used")  # the factor, from privacy.band, .factor and the rounds
    state_key = "privacy.band"
    needs = "participations >= b = `privacy.band` rounds apart (the kind's separation)"
    reads = Mechanism.reads + (
        Reads("rounds", "optimises the banded factor for the run's rounds (privacy.factor: optimized or banded)",
              lambda r: r >= 1, expect=">= 1", when=lambda cfg: cfg.privacy.factor in ("optimized", "banded")),)

    def __init__(self, params: BandedParams, dim: int, seed: int, device: torch.device, rounds: int = 0):
        super().__init__(params, dim, seed, device, rounds)
        self.rows: np.ndarray | None = None  # the general factor's rows, rows[t, j] = C[t, t - j]
        if params.factor == "banded" and type(self).coefficients is BandedMF.coefficients:
            self.rows = factors.rows_of(factors.banded_columns(rounds, params.band))
            self.c = self.rows[0]
        else:
            with np.errstate(all="ignore"):  # a plug-in's factor of NaN or inf: one line below, not numpy's warning
                c = self.coefficients()
            self.c = self.checked(c, rounds)
        self.used = self.described(rounds)
        self.history = torch.zeros(len(self.c) - 1, dim, dtype=torch.float64, device=device)

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        p = cfg.privacy
        if p.factor != "sqrt":  # what an optimised factor may take
            factors.check_size(p.factor, cfg.rounds, p.band)

    def described(self, rounds: int) -> str:
        """The factor this run uses, for the result file (``factors.described``)."""
        own = type(self).coefficients is not BandedMF.coefficients
        name = f"coefficients() of {self.params.mechanism}" if own else self.params.factor
        return factors.described(name, rounds, self.params.band, self.c if self.rows is None else self.rows)

    def checked(self, c: np.ndarray, rounds: int) -> np.ndarray:
        """``c`` when it is a factor whose noise stays finite over ``rounds`` rounds: finite
        numbers, c_0 > 0, and C^{-1} (the noise's recurrence) without overflow; else InputError
        naming the mechanism (a plug-in's own coefficients)."""
        name = self.params.mechanism
        c = np.asarray(c, dtype=np.float64).ravel()
        if not (c.size and np.all(np.isfinite(c)) and c[0] > 0):
            raise InputError(f"privacy.mechanism: {name}'s factor coefficients() must be finite numbers with "
                             f"c_0 > 0 (the noise solves C y = z), got {np.array2string(c[:8], precision=4)}")
        if rounds >= 1 and len(c) > 1 and not math.isfinite(factors.errors(c, rounds)["max_error"]):
            raise InputError(f"privacy.mechanism: {name}'s factor {np.array2string(c[:8], precision=4)} has an "
                             f"inverse that overflows within {rounds} rounds (its noise would grow without bound); "
                             f"give coefficients whose polynomial has no root inside the unit circle")
        return c

    def coefficients(self) -> np.ndarray:
        """c_0..c_{b-1} (b = ``privacy.band``), the factor's first column, of unit norm (c_0 > 0)."""
        return factors.coefficients(self.params.factor, self.rounds, self.params.band)

    @classmethod
    def state_bytes(cls, params: BandedParams, dim: int) -> int:
        return 8 * (params.band - 1) * dim

    def check(self, cfg: Any, sampling: Sampling, amplified: bool) -> None:
        require_separation(cfg, sampling, "banded_mf", self.params.band)

    def notes(self) -> dict[str, str]:
        """``privacy_factor``: the factor used (``factors.described``: which, for what, its SHA-256)."""
        return {"privacy_factor": self.used}

    def row(self, t: int) -> np.ndarray:
        """c_j = C[t, t - j], j = 0..b-1: row t of the factor (a Toeplitz one's first column)."""
        if self.rows is None:
            return self.c
        if t >= len(self.rows):
            raise RuntimeError(f"banded_mf: release {t} beyond the {len(self.rows)} rounds its factor is for")
        return self.rows[t]

    def noise(self, t: int, dim: int) -> torch.Tensor:
        z = standard_normal(self.seed, t, dim, self.device)
        if len(self.c) == 1:
            return z
        row = self.row(t)
        c = torch.as_tensor(row[1:], dtype=torch.float64, device=self.device)
        y = (z - c @ self.history) / row[0]  # history[j - 1] = y_{t-j}
        self.history = torch.cat([y[None], self.history[:-1]])
        return y

    def amplifies(self, sampling: Sampling) -> bool:
        """Poisson sampling in rounds >= b apart (b-min-separation, e.g. ``cyclic`` with groups >= b)."""
        return sampling.kind == "poisson" and sampling.separation >= self.params.band

    def event(self, sampling: Sampling, amplified: bool, sigma: float, rounds: int) -> Any:
        """k x Gaussian(sigma); amplified (Poisson sampling, separation >= b): k x PoissonSampled(q,
        Gaussian(sigma)), jax_privacy's ``amplified_bandmf_event`` (k = ceil(T / b) for cyclic, K = b)."""
        import dp_accounting as dp

        one = dp.GaussianDpEvent(sigma)
        if amplified and self.amplifies(sampling):
            one = dp.PoissonSampledDpEvent(sampling.q, one)
        return dp.SelfComposedDpEvent(one, sampling.participations(rounds))
