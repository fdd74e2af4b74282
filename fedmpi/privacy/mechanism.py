"""The one privacy mechanism of the centralized algorithms, applied by ``ServerAlgorithm.round``.

Round t (docs/PRIVACY.md):

    Delta_i  <- Delta_i * min(1, C / ||Delta_i||)       every participating client (every rank, its own)
    sum      <- sum_i w_i Delta_i,  w_i = 1 / n~        n~ the expected cohort (``Sampling.cohort``)
    sum      <- sum + sigma C / n~ * y_t                rank 0, the server

An algorithm whose summed rows are not that mean (FedSWE) declares, with its ``contribution``,
which part of the sum holds sum_i s_i Delta_i and the bound a / n >= |s_i|
(``ServerAlgorithm.private_part``); the noise is then sigma C a / n * y_t on that part.

Adaptive clipping (Andrew et al. 2021, ``privacy.target_quantile`` gamma): C follows the gamma
quantile of the update norms through a noisy count of the unclipped ones,

    share    =  (#{i : ||Delta_i|| <= C} + sigma_b xi_t) / n~          xi_t ~ N(0, 1), every rank
    C        <- C exp(-eta_C (share - gamma))

and the updates get the multiplier sigma_u = (sigma^-2 - sigma_b^-2)^(-1/2) instead of sigma, so
the pair (sum, count) -- sensitivities C and 1 -- is one Gaussian mechanism of multiplier sigma.

``gaussian`` (DP-FedAvg): y_t = z_t ~ N(0, I_d). ``banded_mf`` (DP-FTRL): y = C^{-1} z for a
lower-triangular b-banded Toeplitz C -- the square root of the prefix-sum matrix truncated to b
bands, scaled to unit column norm -- solved one round at a time from the last b - 1 values of y:

    y_t = (z_t - sum_{j=1}^{b-1} c_j y_{t-j}) / c_0          (O(b d) memory: ``history``)

z_t comes from the keyed stream (seed, "privacy", t), so the noise is the same on any number of
ranks; ``history`` and sigma are declared state (checkpointed by rank 0, restored on every rank).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import rng
from ..errors import InputError
from ..runtime import World
from ..state import Stateful
from . import accounting
from .params import PrivacyParams
from .sampling import Sampling


def banded_sqrt_coefficients(b: int) -> np.ndarray:
    """c_0..c_{b-1} of the b-banded square root of the prefix-sum matrix, scaled to unit norm.

    The prefix-sum matrix is the Toeplitz matrix of 1 / (1 - x); its square root has the
    coefficients of (1 - x)^{-1/2}: c_j = binom(2j, j) / 4^j (c_{j} = c_{j-1} (2j - 1) / (2j)).
    Keeping b of them and dividing by their L2 norm makes every full column of C unit-norm."""
    c = np.ones(b)
    for j in range(1, b):
        c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
    return c / np.linalg.norm(c)


class Privacy(Stateful):
    """Clipping and noise of one run (a no-op with ``mechanism: none``); see the module docstring.

    ``clip`` runs on every rank, collective with adaptive clipping (the count); ``noise`` on rank 0
    only; both once per round, in order."""

    #: sigma and C too: a resumed run keeps the noise it was calibrated with and the adapted C
    shared_state = ("history", "sigma", "C")

    def __init__(self, params: PrivacyParams, sampling: Sampling | None, rounds: int, seed: int, dim: int,
                 world: World):
        self.params, self.sampling, self.seed, self.world = params, sampling, seed, world
        self.on = params.mechanism != "none"
        self.sigma = np.float64(0.0)  # float64 in checkpoints (a Python float would be saved as float32)
        if self.on:
            self.sigma = np.float64(params.noise_multiplier if params.epsilon is None else
                                    accounting.calibrate(sampling, params.epsilon, rounds, params.delta,
                                                         params.mechanism, params.accountant))
        self.C = np.float64(params.clip or 0.0)  # the clip of the next round (0: none)
        self.C_used = self.C  # the clip of the current round, which scales its noise
        self.adaptive = self.on and params.target_quantile is not None
        self.sigma_count = self.sigma_update = self.sigma
        if self.adaptive and self.sigma > 0:
            self.sigma_count = params.count_noise or self.cohort / 20
            if self.sigma_count <= self.sigma:
                raise InputError(f"privacy.count_noise: adaptive clipping needs the count's noise "
                                 f"{self.sigma_count:g} > the noise multiplier sigma = {self.sigma:.4g}")
            self.sigma_update = (self.sigma ** -2 - self.sigma_count ** -2) ** -0.5
        banded = params.mechanism == "banded_mf"
        self.c = banded_sqrt_coefficients(params.band) if banded else np.ones(1)
        self.history = torch.zeros(len(self.c) - 1, dim if self.on else 0, dtype=torch.float64, device=world.device)

    @property
    def cohort(self) -> float:
        """n~, the divisor of the noisy sum."""
        return self.sampling.cohort

    def clip(self, t: int, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """End models whose updates end - start are clipped to norm C (``end`` itself without clipping);
        with adaptive clipping, then C for round t + 1."""
        self.C_used = self.C
        C = float(self.C)  # a Python float in tensor arithmetic, on any device
        if not self.on or C == 0:
            return end
        delta = end - start
        norm = delta.double().norm(dim=1)
        if self.adaptive:
            self._adapt(t, int((norm <= C).sum()))
        scale = (C / torch.clamp(norm, min=C)).to(delta.dtype)  # min(1, C / ||Delta_i||)
        return start + delta * scale[:, None]

    def _adapt(self, t: int, unclipped: int) -> None:
        """C <- C exp(-eta_C (share - gamma)) from the noisy count over all ranks (collective)."""
        count = float(self.world.allreduce_sum_(torch.tensor([float(unclipped)], dtype=torch.float64,
                                                                device=self.world.device))[0])
        xi = float(rng.normal(rng.key(self.seed, "privacy_count", t), 0)) if self.sigma > 0 else 0.0
        share = (count + self.sigma_count * xi) / self.cohort
        p = self.params
        self.C = np.float64(self.C * np.exp(-p.clip_lr * (share - p.target_quantile)))

    @property
    def noisy(self) -> bool:
        """Whether ``noise`` adds anything (not with sigma = 0)."""
        return self.on and self.sigma > 0

    def noise(self, t: int, dim: int, device: torch.device, bound: float = 1.0,
              divisor: float | None = None) -> torch.Tensor:
        """sigma_u C bound / divisor * y_t (sigma_u = sigma without adaptive clipping), float64, for a
        sum of s_i Delta_i with |s_i| <= bound / divisor (default: the mean, 1 / n~); rank 0, rounds in
        order, only when ``noisy``."""
        z = torch.from_numpy(rng.normal(rng.key(self.seed, "privacy", t), np.arange(dim))).to(device)
        y = z
        if len(self.c) > 1:  # y_t = (z_t - sum_j c_j y_{t-j}) / c_0; history[j - 1] = y_{t-j}
            c = torch.as_tensor(self.c[1:], dtype=torch.float64, device=device)
            y = (z - c @ self.history) / self.c[0]
            self.history = torch.cat([y[None], self.history[:-1]])
        return y * float(self.sigma_update * self.C_used * bound / (self.cohort if divisor is None else divisor))

    def epsilon(self, rounds: int) -> float:
        """Epsilon at ``privacy.delta`` after ``rounds`` rounds."""
        p = self.params
        return accounting.epsilon(self.sampling, self.sigma, rounds, p.delta, p.mechanism, p.accountant)

