"""Server optimizers on the averaged pseudo-gradient: ``fedavgm``, ``fedadam``, ``fedyogi``,
``fedadagrad`` (Reddi et al. 2021, "Adaptive Federated Optimization", Algorithm 2; FedAvgM:
Hsu et al. 2019).

The clients train as in FedAvg, and the active ones are weighted as ``fedavg_active`` weights
them; the server treats their mean change as a pseudo-gradient and takes one optimizer step:

    Delta_t = mean_{i in A_t} Delta_i                      (A_t empty: no step, state kept)
    x^{t+1} = x^t + eta_g * step(Delta_t)                  (eta_g = algorithm.global_lr)

    fedavgm:     v_t = beta v_{t-1} + Delta_t;                          step = v_t
    adaptive:    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t;             step = m_t / (sqrt(v_t) + tau)
      fedadagrad:  v_t = v_{t-1} + Delta_t^2
      fedyogi:     v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)
      fedadam:     v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2

with m_{-1} = v_{-1} = 0 for fedavgm and m_{-1} = 0, v_{-1} = tau^2 for the adaptive ones (the
paper asks v_{-1} >= tau^2); squares, roots and signs are per coordinate; no bias correction
(the paper has none). beta = 0 and eta_g = 1 is FedAvg. The adaptive steps are about eta_g
per coordinate, so they want a much smaller ``algorithm.global_lr`` than FedAvg's 1 (Reddi et al.
tune it on a log grid; 10^-2 to 10^-0.5 were their best values).

Under privacy every round takes a step, an empty one too: Delta_t is then the noise alone, so
the released models do not show that nobody took part (which would void the amplification by
sampling the accountant claims; docs/PRIVACY.md).

The optimizer state lives on the server (rank 0) in float64; checkpoints save it from there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..privacy import Private
from ..schema import opt
from .base import Context, ServerParams, register
from .fedavg import FedAvgActive


class ServerOptimizer(FedAvgActive):
    """FedAvg's clients and weights, then ``x^{t+1} = x^t + eta_g * step(Delta_t)`` on the server.

    Subclasses write ``step``; it runs on rank 0 only, once per round with active clients,
    and may update the server state it keeps in the attributes named by ``shared_state``
    (saved from rank 0 in checkpoints, ``fedmpi.state``)."""

    private = Private()  # an empty round releases a step under privacy (the noise alone)

    def server_update(self, t: int, active: np.ndarray, total: torch.Tensor) -> torch.Tensor:
        x = self.x.double()
        if len(active) == 0 and not self.privacy.on:
            return x  # no pseudo-gradient arrived: no step
        return x + self.eta_g * self.step(total)  # total = Delta_t (weights 1 / |A_t|, under privacy 1 / n~)

    def step(self, delta: torch.Tensor) -> torch.Tensor:
        """The update direction from the pseudo-gradient Delta_t (float64, (d,))."""
        raise NotImplementedError

    def zeros(self) -> torch.Tensor:
        return torch.zeros(self.ctx.spec.dim, dtype=torch.float64, device=self.ctx.device)


@dataclass
class FedAvgMParams(ServerParams):
    server_momentum: float = opt(0.9, "server momentum beta (0 = FedAvg)", ge=0, lt=1)


@register("fedavgm")
class FedAvgM(ServerOptimizer):
    Params = FedAvgMParams
    shared_state = ("v",)
    configuration = ("beta",)

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.beta = self.params.server_momentum
        self.v = self.zeros()

    def step(self, delta: torch.Tensor) -> torch.Tensor:
        self.v = self.beta * self.v + delta
        return self.v


@dataclass
class AdaptiveParams(ServerParams):
    beta1: float = opt(0.9, "first-moment decay beta_1 of the server optimizer", ge=0, lt=1)
    tau: float = opt(1e-3, "adaptivity tau (added to sqrt(v); v starts at tau^2)", gt=0)


@dataclass
class AdamParams(AdaptiveParams):
    beta2: float = opt(0.99, "second-moment decay beta_2 of the server optimizer", ge=0, lt=1)


class AdaptiveServerOptimizer(ServerOptimizer):
    """Reddi et al.'s adaptive step; subclasses say how the second moment v moves."""

    Params = AdaptiveParams
    shared_state = ("m", "v")
    configuration = ("beta1", "tau")

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.beta1, self.tau = self.params.beta1, self.params.tau
        self.m = self.zeros()
        self.v = self.zeros() + self.tau ** 2

    def step(self, delta: torch.Tensor) -> torch.Tensor:
        self.m = self.beta1 * self.m + (1 - self.beta1) * delta
        self.v = self.second_moment(self.v, delta * delta)
        return self.m / (self.v.sqrt() + self.tau)

    def second_moment(self, v: torch.Tensor, delta2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@register("fedadagrad")
class FedAdagrad(AdaptiveServerOptimizer):
    def second_moment(self, v: torch.Tensor, delta2: torch.Tensor) -> torch.Tensor:
        return v + delta2


@register("fedyogi")
class FedYogi(AdaptiveServerOptimizer):
    Params = AdamParams

    def second_moment(self, v: torch.Tensor, delta2: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.params.beta2) * delta2 * torch.sign(v - delta2)


@register("fedadam")
class FedAdam(AdaptiveServerOptimizer):
    Params = AdamParams

    def second_moment(self, v: torch.Tensor, delta2: torch.Tensor) -> torch.Tensor:
        return self.params.beta2 * v + (1 - self.params.beta2) * delta2
