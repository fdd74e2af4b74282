"""Bounding the sensitivity: each client's update clipped to L2 norm C (docs/PRIVACY.md).

    Delta_i <- Delta_i * min(1, C / ||Delta_i||)       every client whose update enters a release

A fixed C is ``privacy.clip``. Adaptive clipping (Andrew et al. 2021, ``privacy.target_quantile``
gamma) moves C towards the gamma quantile of the update norms through a noisy sum of bits
(``privacy.count_bits``):

    share  =  (sum_i (b_i - 1/2) + sigma_b xi_t) / n~ + 1/2       b_i = [||Delta_i|| <= C], xi_t ~ N(0, 1)
    C      <- C exp(-eta_C (share - gamma))

The centred sum runs over the clients whose update is not zero: a zeroed client (zero-out
neighbours) adds 0 to it, so one client moves it by at most 1/2 (uncentred bits b_i: by 1).
Releasing the bits spends part of the budget: the sum gets the multiplier sigma_u (``split``), and
the pair is one Gaussian mechanism of multiplier sigma.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import rng
from ..errors import InputError
from ..runtime import World
from ..state import Stateful
from .params import PrivacyParams


class Clip(Stateful):
    """The L2 clip of one run (C = 0: none). ``bound`` runs on every rank for its clients, once per
    release, in order; with adaptive clipping it is collective (the count over all ranks)."""

    shared_state = ("C",)  # the clip of the next release (adapted; checkpointed)
    derived = ("C_used",)  # the clip of the current release, which scales its noise
    configuration = ("params", "cohort", "seed", "world", "noisy", "noise_scale", "adaptive")

    def __init__(self, params: PrivacyParams, cohort: float, seed: int, world: World, noisy: bool,
                 noise_scale: float = 1.0):
        """``cohort``: n~, the divisor of the share; ``noisy``: whether the bits get noise (sigma > 0);
        ``noise_scale``: the factor of every noise term (``privacy.noise_cohort_size``)."""
        self.params, self.cohort, self.seed, self.world = params, cohort, seed, world
        self.noisy, self.noise_scale = noisy, noise_scale
        self.C = np.float64(params.clip or 0.0)
        self.C_used = self.C
        self.adaptive = params.target_quantile is not None

    @property
    def sigma_count(self) -> float:
        """sigma_b, the std of the noise on the bits (as for N clients with ``noise_cohort_size``:
        the run's is scaled by ``noise_scale``)."""
        return self.params.count_noise or (self.params.noise_cohort_size or self.cohort) / 20

    @property
    def count_sensitivity(self) -> float:
        """How far one client moves the sum of the bits: 1/2 centred, 1 uncentred."""
        return 0.5 if self.params.count_bits == "centred" else 1.0

    def split(self, sigma: float) -> float:
        """sigma_u, the multiplier left for the sum when the bits take their share of sigma:
        (sigma^-2 - (sigma_b / sensitivity)^-2)^(-1/2); sigma itself without adaptive clipping."""
        if not (self.adaptive and sigma > 0):
            return sigma
        return (sigma ** -2 - (self.sigma_count / self.count_sensitivity) ** -2) ** -0.5

    def check(self, sigma: float) -> None:
        """The bits must leave the sum some budget (InputError naming ``privacy.count_noise``)."""
        if self.adaptive and sigma > 0 and self.sigma_count / self.count_sensitivity <= sigma:
            twice = "2 x " if self.count_sensitivity < 1 else ""
            raise InputError(f"privacy.count_noise: adaptive clipping needs {twice}the count's noise "
                             f"{self.sigma_count:g} > the noise multiplier sigma = {sigma:.4g} "
                             f"(privacy.count_bits: {self.params.count_bits})")

    def bound(self, t: int, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """End models whose updates end - start are clipped to norm C (``end`` itself without a
        clip); with adaptive clipping, then C for release t + 1."""
        self.C_used = self.C
        C = float(self.C)  # a Python float in tensor arithmetic, on any device
        if C == 0:
            return end
        delta = end - start
        norm = delta.double().norm(dim=1)
        if self.adaptive:  # centred bits: a zero update (a zeroed client) adds 0 to the bit sum, not +1/2
            counted = norm > 0 if self.params.count_bits == "centred" else torch.ones_like(norm, dtype=torch.bool)
            self._adapt(t, int(((norm <= C) & counted).sum()), int(counted.sum()))
        scale = (C / torch.clamp(norm, min=C)).to(delta.dtype)  # min(1, C / ||Delta_i||)
        return start + delta * scale[:, None]

    def _adapt(self, t: int, unclipped: int, clients: int) -> None:
        """C <- C exp(-eta_C (share - gamma)) from the noisy count over all ranks (collective);
        ``unclipped`` of the ``clients`` whose bits count (centred: those with a non-zero update)."""
        count, n = self.world.allreduce_sum_(torch.tensor([float(unclipped), float(clients)], dtype=torch.float64,
                                                          device=self.world.device)).tolist()
        xi = float(rng.normal(rng.key(self.seed, "privacy_count", t), 0)) if self.noisy else 0.0
        noise = self.sigma_count * self.noise_scale * xi
        if self.params.count_bits == "centred":
            share = (count - n / 2 + noise) / self.cohort + 0.5
        else:
            share = (count + noise) / self.cohort
        p = self.params
        self.C = np.float64(self.C * np.exp(-p.clip_lr * (share - p.target_quantile)))
