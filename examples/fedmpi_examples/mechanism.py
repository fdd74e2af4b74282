"""A privacy mechanism of your own: banded matrix-factorization noise with a factor you give
(``privacy.mechanism: own_factor``, ``privacy.coefficients: [c_0, ..., c_{b-1}]``), e.g. one optimised
offline for your rounds and separation (Choquette-Choo et al. 2023) instead of fedmpi's
``privacy.factor`` (its square root of the prefix-sum matrix, or the one it optimises).

Everything else is ``banded_mf``'s (fedmpi/privacy/banded.py): the noise y = C^{-1} z solved one
round at a time, its declared state (the last b - 1 values of y), its memory in the up-front check,
its need of participations >= b rounds apart, and its accounting: with unit-norm columns one
client's sensitivity is sqrt(k) C under that separation, so k Gaussians of multiplier sigma.
With ``coefficients`` = fedmpi's own it gives banded_mf's bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmpi.config import opt
from fedmpi.errors import InputError
from fedmpi.privacy import register
from fedmpi.privacy.banded import BandedMF, BandedParams


@dataclass
class OwnFactorParams(BandedParams):
    coefficients: list = opt([1.0], "own_factor: c_0..c_{b-1} of the banded factor's first column (scaled to "
                                    "unit norm)")


@register("own_factor")
class OwnFactor(BandedMF):
    Params = OwnFactorParams

    @classmethod
    def check_config(cls, cfg) -> None:
        c, b = cfg.privacy.coefficients, cfg.privacy.band
        if cfg.privacy.factor != "sqrt":
            raise InputError(f"privacy.factor: own_factor takes its factor from privacy.coefficients, not "
                             f"{cfg.privacy.factor!r}")
        if len(c) != b or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in c):
            raise InputError(f"privacy.coefficients: needs privacy.band = {b} numbers, got {str(c)[:60]}")
        if not c[0] > 0:
            raise InputError(f"privacy.coefficients: c_0 must be > 0 (the noise solves C y = z), got {c[0]}")

    def coefficients(self) -> np.ndarray:
        c = np.asarray(self.params.coefficients, dtype=np.float64)
        return c / np.linalg.norm(c)
