"""``privacy.mechanism: gaussian`` -- DP-FedAvg (McMahan et al. 2018): a fresh y_t = z_t ~ N(0, I)
every round.

Accounting (docs/PRIVACY.md): one round is a Gaussian mechanism of multiplier sigma on the sum of
clipped updates; a client takes part in at most k of the rounds (``Sampling.participations``).
Where the algorithm's release hides who took part (``Private.amplifiable``), the kind's randomness
amplifies it: k x PoissonSampled(q, Gaussian(sigma)) for independent participation with
probability <= q (add/remove neighbours), k x SampledWithoutReplacement(m, size,
Gaussian(sigma / 2)) for a uniform sample of fixed size (replace-one neighbours: one client moves
the sum by up to 2C). Otherwise k x Gaussian(sigma).
"""

from __future__ import annotations

from typing import Any

import torch

from ..participation import Sampling
from .mechanism import Mechanism, Relation, register, standard_normal


@register("gaussian")
class Gaussian(Mechanism):
    def noise(self, t: int, dim: int) -> torch.Tensor:
        return standard_normal(self.seed, t, dim, self.device)

    def amplifies(self, sampling: Sampling) -> bool:
        return sampling.kind in ("poisson", "fixed_size")

    def relation(self, sampling: Sampling, amplified: bool) -> Relation:
        return "replace_one" if amplified and sampling.kind == "fixed_size" else "add_or_remove"

    def sensitivity(self, sampling: Sampling, amplified: bool) -> float:
        return 2.0 if self.relation(sampling, amplified) == "replace_one" else 1.0

    def event(self, sampling: Sampling, amplified: bool, sigma: float, rounds: int) -> Any:
        import dp_accounting as dp

        one = dp.GaussianDpEvent(sigma / self.sensitivity(sampling, amplified))
        if amplified and sampling.kind == "fixed_size":
            one = dp.SampledWithoutReplacementDpEvent(sampling.m, sampling.size, one)
        elif amplified and sampling.kind == "poisson":
            one = dp.PoissonSampledDpEvent(sampling.q, one)
        return dp.SelfComposedDpEvent(one, sampling.participations(rounds))
