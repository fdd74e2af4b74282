"""``privacy.mechanism: banded_mf`` -- DP-FTRL with banded matrix-factorization noise
(Choquette-Choo et al. 2023; docs/PRIVACY.md, "Theorem used for banded MF").

y = C^{-1} z for a lower-triangular b-banded Toeplitz C -- the square root of the prefix-sum
matrix truncated to b bands, scaled to unit column norm -- solved one round at a time from the
last b - 1 values of y:

    y_t = (z_t - sum_{j=1}^{b-1} c_j y_{t-j}) / c_0          (O(b d) memory: ``history``)

Under b-min-separation (every client's participations >= b rounds apart) the columns one client
touches are orthogonal, so its sensitivity is sqrt(k) C max_j ||C[:, j]|| = sqrt(k) C: the
accountant composes k Gaussians of multiplier sigma, with no amplification. Without that
separation the bound fails: refused. An optimised factor replaces ``coefficients`` (a plug-in's:
examples/fedmpi_examples/mechanism.py); an amplified variant would replace ``event``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..participation import Sampling
from ..schema import opt
from .mechanism import Mechanism, register, standard_normal
from .params import PrivacyParams


def banded_sqrt_coefficients(b: int) -> np.ndarray:
    """c_0..c_{b-1} of the b-banded square root of the prefix-sum matrix, scaled to unit norm.

    The prefix-sum matrix is the Toeplitz matrix of 1 / (1 - x); its square root has the
    coefficients of (1 - x)^{-1/2}: c_j = binom(2j, j) / 4^j (c_{j} = c_{j-1} (2j - 1) / (2j)).
    Keeping b of them and dividing by their L2 norm makes every full column of C unit-norm."""
    c = np.ones(b)
    for j in range(1, b):
        c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
    return c / np.linalg.norm(c)


@dataclass
class BandedParams(PrivacyParams):
    band: int = opt(1, "b: bands of banded_mf's factor (1 = independent noise); needs separation >= b", ge=1)


@register("banded_mf")
class BandedMF(Mechanism):
    Params = BandedParams
    shared_state = ("history",)  # y_{t-1}, ..., y_{t-b+1}
    derived = ("c",)  # the factor's coefficients, from privacy.band
    state_key = "privacy.band"
    needs = "participations >= b = `privacy.band` rounds apart (the kind's separation)"

    def __init__(self, params: BandedParams, dim: int, seed: int, device: torch.device):
        super().__init__(params, dim, seed, device)
        self.c = self.coefficients()
        self.history = torch.zeros(len(self.c) - 1, dim, dtype=torch.float64, device=device)

    def coefficients(self) -> np.ndarray:
        """c_0..c_{b-1} (b = ``privacy.band``), the factor's first column, of unit norm (c_0 > 0)."""
        return banded_sqrt_coefficients(self.params.band)

    @classmethod
    def state_bytes(cls, params: BandedParams, dim: int) -> int:
        return 8 * (params.band - 1) * dim

    def check(self, cfg: Any, sampling: Sampling, amplified: bool) -> None:
        b, sep = self.params.band, sampling.separation
        if sep < b:
            how = f"{sampling.separation_key} >= {b} or " if sampling.separation_key else ""
            raise InputError(f"privacy.band: banded_mf needs participations >= b = {b} rounds apart, "
                             f"availability.kind {cfg.availability.kind!r} guarantees {sep} "
                             f"(set {how}privacy.band <= {sep})")

    def noise(self, t: int, dim: int) -> torch.Tensor:
        z = standard_normal(self.seed, t, dim, self.device)
        if len(self.c) == 1:
            return z
        c = torch.as_tensor(self.c[1:], dtype=torch.float64, device=self.device)
        y = (z - c @ self.history) / self.c[0]  # history[j - 1] = y_{t-j}
        self.history = torch.cat([y[None], self.history[:-1]])
        return y

    def event(self, sampling: Sampling, amplified: bool, sigma: float, rounds: int) -> Any:
        import dp_accounting as dp

        return dp.SelfComposedDpEvent(dp.GaussianDpEvent(sigma), sampling.participations(rounds))
