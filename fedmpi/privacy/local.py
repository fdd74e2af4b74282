"""``privacy.mechanism: local_gaussian`` -- local DP: each client adds Gaussian noise to its own clipped
update before anything leaves it (docs/PRIVACY.md, "Local DP").

    Delta_i <- Delta_i * min(1, C / ||Delta_i||) + sigma C z_{t,i}      z_{t,i} ~ N(0, I), client i's own

The server only ever sees noisy updates, so the guarantee holds against it too, for every
message: one client's message in a release is a Gaussian mechanism of multiplier sigma
(sensitivity C: its update replaced by zeros), and who sent it is visible, so nothing amplifies
it: k x Gaussian(sigma), k the kind's bound on its participations (or the counted releases of an
asynchronous server). The price is the noise on the sum: sqrt(n) sigma C for n clients, where
central DP adds sigma C once. z_{t,i} comes from the keyed stream (seed, "privacy_local", t, i):
the same on any number of ranks and after a resume.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import rng
from ..errors import InputError
from ..participation import Sampling
from .mechanism import Mechanism, register


@register("local_gaussian")
class LocalGaussian(Mechanism):
    noise_at = "clients"

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        p = cfg.privacy
        for key, why in (("target_quantile", "adaptive clipping releases a noisy count the clients do not noise "
                                             "themselves"),
                         ("noise_cohort_size", "each client's noise is its own, not a share of a cohort's")):
            if getattr(p, key) is not None:
                raise InputError(f"privacy.{key}: privacy.mechanism local_gaussian adds the noise on each client; "
                                 f"{why} (leave privacy.{key} null)")

    def client_noise(self, t: int, clients: np.ndarray, dim: int) -> torch.Tensor:
        coords = np.arange(dim)
        rows = [rng.normal(rng.key(self.seed, "privacy_local", t, int(i)), coords) for i in clients]
        return torch.from_numpy(np.stack(rows) if rows else np.zeros((0, dim))).to(self.device)

    def event(self, sampling: Sampling, amplified: bool, sigma: float, rounds: int) -> Any:
        import dp_accounting as dp

        return dp.SelfComposedDpEvent(dp.GaussianDpEvent(sigma), sampling.participations(rounds))
