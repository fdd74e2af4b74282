"""FedSWE (Algorithm 1 of the FedSWE paper); k = 0 is the conference version FedAWE.

State: every client i keeps x_i (init x_0) and tau_i (init -1); the server keeps x^t.
Round t:

    for i in A_t:  x_i^{t,0} <- x_i                                 (its OWN model, not x^t)
                   s local SGD steps with eta_l -> x_i^{t,s}
                   G_i = x_i - x_i^{t,s}
                   e_i = min(t - tau_i, E)                          (E = algorithm.max_echo, null: no cap)
                   x_i^dag = x_i - eta_g e_i G_i;  tau_i <- t       (adaptive innovation echoing)
    server:        x^{t+1} = (sum_{A_t} x_i^dag + k x^t) / (|A_t| + k)  (global moving average)
                   A_t empty: x^{t+1} = x^t
    for i in A_t:  x_i <- x^{t+1}                                   (postponed multicast)

``algorithm.k`` null means k = m. ``algorithm.server_clip: c`` is the authors' code (c = 0.5
with k = 0): the mean echoed innovation E = (1/|A_t|) sum_{A_t} (t - tau_i)(x_i^{t,s} - x_i) is
rescaled to norm c when longer, THEN multiplied by eta_g, so that
sum_{A_t} x_i^dag = sum_{A_t} x_i + |A_t| eta_g clip(E, c) enters the moving average
(the order matters only for eta_g != 1; the paper uses eta_g = 1).

Privacy (docs/PRIVACY.md, "FedSWE"): the mechanism clips the innovation Delta_i = -G_i to C before
the echo, so one client moves sum_{A_t} x_i^dag by at most |eta_g| E C; the noise, of std
sigma |eta_g| E C, goes on that sum (``private_part``). The rest of the sum, the x_i and |A_t|, is
what past rounds released plus who took part: its ``private`` declaration says that the release
does not hide participation, and the accountant claims no amplification by sampling.

Memory: an inactive client's x_i is the past global model x^{tau_i + 1} (x_0 when tau_i = -1),
so clients hold references into a ``VersionStore`` with one copy per distinct version.

Outputs: ``""`` = x_bar = (1/m) sum_i x_i over ALL m real clients (what the authors evaluate; the
analysis of Sec. 6.2 averages over m + k clients, the k virtual ones holding x^t), ``"server"`` =
x^t; metric ``consensus_error`` = (1/m) sum_i ||x_i - x_bar||^2 over the real clients.
Both are computed from the live versions and how many clients hold each (``_client_mean``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..engine.reduce import reproducible_sum, reproducible_sum_blocks
from ..engine.store import VersionStore
from ..errors import InputError
from ..privacy import Private
from ..state import State
from ..schema import Digest, opt
from .base import Context, ServerAlgorithm, ServerParams, Snapshot, register


@dataclass
class FedSWEParams(ServerParams):
    k: Optional[float] = opt(None, "moving-average coefficient k (0 = FedAWE); null = m", ge=0)
    server_clip: Optional[float] = opt(
        None, "(authors' code) clip the mean echoed innovation to this norm, then eta_g", gt=0)
    max_echo: Optional[int] = opt(
        None, "E: the echo factor is min(t - tau_i, E); needed under privacy, whose sensitivity is E * privacy.clip "
              "(docs/PRIVACY.md); null = no cap", ge=1,
        digest=Digest(absent=None))  # FedSWE without the cap: the checkpoints before it


@register("fedswe")
class FedSWE(ServerAlgorithm):
    Params = FedSWEParams
    evaluated_models = ("", "server")  # x_bar and x^t
    metrics = ("consensus_error",)
    client_state = ("tau",)
    custom_state = ("store",)  # the versions x_i, saved by state_dict once each
    configuration = ("k", "clip", "max_echo", "lo")
    # x^{t+1} divides by |A_t| + k, averages the x_i of A_t and keeps x^t when A_t is empty
    private = Private(empty_round_releases=False, hides_participation=False)

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        p = cfg.privacy
        if p.mechanism != "none" and p.noise_multiplier != 0 and cfg.algorithm.max_echo is None:
            raise InputError("algorithm.max_echo: set a cap E on FedSWE's echo factor t - tau_i under privacy "
                             "(one client's echoed update is bounded by E * privacy.clip, the noise's sensitivity)")

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        p = self.params
        self.k = float(self.m if p.k is None else p.k)  # k: weight of x^t in the moving average
        self.clip = p.server_clip  # c, or None
        self.max_echo = p.max_echo  # E, or None
        self.lo, hi = ctx.shard
        self.store = VersionStore(self.lo, hi, self.x)  # x_i of the local clients
        self.tau = np.full(hi - self.lo, -1, dtype=np.int64)  # tau_i of the local clients

    # ---------------------------------------------------------------- clients
    def start_models(self, local: np.ndarray) -> torch.Tensor:
        return self.store.gather(local)  # x_i^{t,0} <- x_i

    def contribution(self, t: int, active: np.ndarray, local: np.ndarray,
                     start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """x_i^dag per local active client; with server_clip the pair (x_i, e_i (x_i^{t,s} - x_i))."""
        x_i = start.double()
        G = x_i - end.double()  # G_i = x_i - x_i^{t,s}
        echo = t - self.tau[local - self.lo]  # t - tau_i
        if self.max_echo is not None:
            echo = np.minimum(echo, self.max_echo)  # e_i
        e = torch.as_tensor(echo, dtype=torch.float64, device=G.device)
        innovation = -e[:, None] * G  # x_i^dag - x_i = eta_g * innovation
        return x_i + self.eta_g * innovation if self.clip is None else torch.cat([x_i, innovation], dim=1)

    def private_part(self, t: int, total: torch.Tensor) -> tuple[torch.Tensor, float, float]:
        """The privacy mechanism's part of the sum: eta_g sum e_i Delta_i inside sum x_i^dag (bound
        |eta_g| E), or with server_clip the summed innovations sum e_i Delta_i (bound E)."""
        if self.clip is None:
            return total, abs(self.eta_g) * self.max_echo, 1.0
        return total.chunk(2)[1], float(self.max_echo), 1.0

    # ---------------------------------------------------------------- server
    def server_update(self, t: int, active: np.ndarray, total: torch.Tensor) -> torch.Tensor:
        n = len(active)
        x = self.x.double()
        if n == 0:  # nobody reported: k = 0 keeps x^t; k > 0 gives k x^t / k = x^t anyway
            return x
        if self.clip is not None:  # sum x_i^dag = sum x_i + |A_t| eta_g clip(E, c): clip, then eta_g
            sum_x, sum_innovation = total.chunk(2)
            E = sum_innovation / n
            norm = float(E.norm())
            if norm > self.clip:
                E = E * (self.clip / norm)
            total = sum_x + n * self.eta_g * E
        return (total + self.k * x) / (n + self.k)  # x^{t+1}

    def after_round(self, t: int, active: np.ndarray, local: np.ndarray,
                    start: torch.Tensor, end: torch.Tensor) -> None:
        self.tau[local - self.lo] = t  # tau_i <- t
        self.store.assign(local, self.x)  # postponed multicast: only A_t receive x^{t+1}

    # ---------------------------------------------------------------- outputs
    def _client_mean(self) -> tuple[torch.Tensor, float]:
        """x_bar and the consensus error over all m clients (collective: call on every rank).

        Versions are named by tau (x_i = x^{tau_i + 1}); every rank learns how many clients
        hold each tau, and the lowest rank holding a version contributes count * version.
        The sum is ``reproducible_sum_blocks`` over those rows (two passes: the global max per
        coordinate, then exact sums of pre-rounded rows, a bounded block of versions at a
        time), so it gives the same bits whatever the number of ranks.
        """
        taus, first, cnt = np.unique(self.tau, return_index=True, return_counts=True)
        per_rank = self.world.allgather_obj((taus, cnt))
        every = np.unique(np.concatenate([p[0] for p in per_rank]))  # all live versions
        count = np.zeros(len(every), dtype=np.int64)
        owner = np.full(len(every), -1)
        for r, (tr, cr) in enumerate(per_rank):
            pos = np.searchsorted(every, tr)
            count[pos] += cr
            owner[pos] = np.where(owner[pos] < 0, r, owner[pos])
        pos = np.searchsorted(every, taus)
        mine = owner[pos] == self.world.rank
        held = [(float(count[j]), self.lo + int(i)) for j, i in zip(pos[mine], first[mine])]

        def version(client: int) -> torch.Tensor:  # x^{tau+1} held by ``client``
            return self.store.gather(np.array([client]))[0].double()

        def rows(s: slice) -> torch.Tensor:  # count * version: exact in float64
            part = held[s]
            if not part:
                return torch.zeros(0, self.ctx.spec.dim, dtype=torch.float64, device=self.x.device)
            return torch.stack([c * version(client) for c, client in part])

        x_bar = reproducible_sum_blocks(self.world, rows, len(held), len(every), to_all=True) / self.m
        spread = torch.tensor([c * float((version(client) - x_bar).pow(2).sum()) for c, client in held],
                              dtype=torch.float64, device=x_bar.device)  # count * ||x^{tau+1} - x_bar||^2
        consensus = reproducible_sum(self.world, spread.reshape(-1, 1), len(every), to_all=True) / self.m
        return x_bar.float(), float(consensus[0])

    def evaluation_snapshot(self) -> Snapshot:
        x_bar, consensus = self._client_mean()
        return Snapshot({"": x_bar, "server": self.x}, {"consensus_error": consensus})

    def final_params(self) -> torch.Tensor:
        return self._client_mean()[0]

    def state_dict(self) -> State:
        """x^t and tau_i (declared), plus each live version once: union ``version/<tau>``."""
        state = super().state_dict()
        taus, first = np.unique(self.tau, return_index=True)
        state.union.update({f"version/{int(tau)}": v for tau, v in zip(taus, self.store.gather(self.lo + first))})
        return state

    def load_state_dict(self, state: State) -> None:
        super().load_state_dict(state)
        dev = self.x.device
        self.store = VersionStore(self.lo, self.lo + len(self.tau), state.union.get("version/-1", self.x).to(dev))
        for tau in np.unique(self.tau[self.tau >= 0]):  # x_i = x^{tau_i + 1}
            self.store.assign(self.lo + np.flatnonzero(self.tau == tau), state.union[f"version/{int(tau)}"].to(dev))
