"""The algorithm interface and the shared server-round mechanism.

Every algorithm is an ``Algorithm``: the runner calls ``round(t)`` on every rank for
t = 0..T-1, then asks for the models to evaluate (``eval_models``), extra scalar metrics
(``extra_metrics``) and the final model. A user's own algorithm subclasses ``Algorithm``
(or ``ServerAlgorithm``), declares its parameters as a dataclass ``Params`` (a subclass of
``AlgorithmParams``; they are the keys of the ``algorithm:`` block) and registers itself with
``@register("name")`` -- the Flower "strategy" idea, with rank-aware state.

``ServerAlgorithm`` is the centralized round of ARCHITECTURE.md:

1. every rank computes the same available set A_t (``participation``) and the
   algorithm may ``select`` among it;
2. each rank trains its local active clients at once (``local_training``), starting from
   ``start_models`` (default: the server model x^t);
3. ``contribution`` turns each local client's result into a float64 row; the rows of all
   ranks are summed into rank 0, the server, in one reproducible reduction
   (``engine.reduce``: the same bits whatever the number of ranks);
4. the server applies ``server_update`` and broadcasts x^{t+1};
5. ``after_round`` runs on every rank (e.g. postponed multicast, table updates).

Subclasses override only the steps their paper changes, so each algorithm file reads
like its definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..config import AlgorithmParams, Config
from ..data.task import Task
from ..engine.local import LocalTrainer
from ..engine.params import ParamSpec
from ..engine.reduce import reproducible_sum_blocks
from ..errors import InputError
from ..participation import Participation
from ..registry import ALGORITHMS
from ..runtime import World


@dataclass
class Context:
    """What an algorithm may use: config, world, task, trainer, participation."""

    cfg: Config
    world: World
    task: Task
    trainer: LocalTrainer
    participation: Participation | None

    @property
    def m(self) -> int:
        return self.task.m

    @property
    def spec(self) -> ParamSpec:
        return self.trainer.spec

    @property
    def shard(self) -> tuple[int, int]:
        return self.world.shard(self.m)

    @property
    def device(self) -> torch.device:
        return self.world.device

    def local(self, ids: np.ndarray) -> np.ndarray:
        """The ids of ``ids`` owned by this rank."""
        lo, hi = self.shard
        return ids[(ids >= lo) & (ids < hi)]


class Algorithm:
    """Base of every algorithm.

    ``Params``: the dataclass of its keys in the ``algorithm:`` block (``self.params`` holds the
    values); ``needs_participation``: it runs on an availability model (``ctx.participation``);
    ``metrics`` names the extra metrics it logs; ``client_rows`` is how many model-sized float32
    rows it keeps per client (for the up-front memory check)."""

    Params: type[AlgorithmParams] = AlgorithmParams
    needs_participation: bool = False
    metrics: tuple[str, ...] = ()
    client_rows: int = 0

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.params = ctx.cfg.algorithm
        self.world = ctx.world
        self.m = ctx.m

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        """Cross-key checks of a config that selects this algorithm (raise InputError)."""
        if not cls.needs_participation and cfg.availability.kind != "always":
            raise InputError(f"availability.kind: algorithm {cfg.algorithm.name!r} does not use availability "
                             f"(leave availability.kind: always)")

    def round(self, t: int) -> int:
        """Run round (iteration) t on this rank; return the number of clients that trained."""
        raise NotImplementedError

    def eval_models(self) -> dict[str, torch.Tensor]:
        """Models to evaluate on the test set: '' -> test_acc/test_loss, 'server' -> test_acc_server."""
        raise NotImplementedError

    def extra_metrics(self) -> dict[str, float]:
        """Scalar metrics of this algorithm (e.g. consensus_error); same value on every rank."""
        return {}

    def final_params(self) -> torch.Tensor:
        return self.eval_models()[""]

    def last_mask(self) -> np.ndarray | None:
        """The ids that participated in the last round (for /availability/mask)."""
        return None

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        pass

    def done(self) -> bool:
        """True to stop before ``rounds`` (e.g. a delay budget)."""
        return False


class ServerAlgorithm(Algorithm):
    """Centralized FL with rank 0 as the server; see the module docstring."""

    needs_participation = True

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.eta_g = self.cfg.train.global_lr
        self.x = ctx.spec.flatten(ctx.task.model).to(ctx.device)  # x^t, identical on every rank
        self.active = np.zeros(0, dtype=np.int64)

    # ---------------------------------------------------------------- the round
    def round(self, t: int) -> int:
        available = self.ctx.participation.available(t)
        active = self.select(t, available)
        self.active = active
        local = self.ctx.local(active)
        start = self.start_models(local)
        end = self.local_training(t, local, start)
        buf = reproducible_sum_blocks(  # one reduction; rows made block by block to bound memory
            self.world, lambda s: self.contribution(t, active, local[s], start[s], end[s]), len(local), len(active))
        # x^{t+1} goes into a fresh tensor on every rank: ``start`` may view x^t
        self.x = self.server_update(t, active, buf).float() if self.world.is_server else torch.empty_like(self.x)
        self.world.broadcast_(self.x)
        self.after_round(t, active, local, start, end)
        return len(active)

    # ---------------------------------------------------------------- hooks
    def select(self, t: int, available: np.ndarray) -> np.ndarray:
        """Which available clients train this round (default: all of them).

        Called exactly once per round, on every rank, with the same ``available``: it may
        update replicated per-round state (F3AST's rates, debiased FedAvg's counts)."""
        return available

    def start_models(self, local: np.ndarray) -> torch.Tensor:
        """Starting models of the local active clients (default: x^t for each)."""
        return self.x.expand(len(local), -1)

    def lr_scale(self, t: int, local: np.ndarray) -> torch.Tensor | None:
        return None

    def local_training(self, t: int, local: np.ndarray, start: torch.Tensor) -> torch.Tensor:
        """End models of the local active clients after their local steps from ``start``
        (default: ``ctx.trainer.train`` with ``lr_scale``; FedProx adds its proximal term here,
        SCAFFOLD its correction)."""
        return self.ctx.trainer.train(start, local, t, lr_scale=self.lr_scale(t, local))

    def contribution(self, t: int, active: np.ndarray, local: np.ndarray,
                     start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """One float64 row per listed local client, summed over all clients for the server.

        Called on blocks of the local clients, twice each: it must not change any state.
        Default: w_i Delta_i with w_i from ``weights``."""
        w = torch.as_tensor(self.weights(t, active, local), dtype=torch.float64, device=end.device)
        return w[:, None] * (end - start).double()

    def weights(self, t: int, active: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Weight w_i of each local active client's change Delta_i (used by ``contribution``)."""
        raise NotImplementedError

    def server_update(self, t: int, active: np.ndarray, total: torch.Tensor) -> torch.Tensor:
        """x^{t+1} from the summed buffer (rank 0 only). Default: x^t + eta_g * total."""
        return (self.x.double() + self.eta_g * total)

    def after_round(self, t: int, active: np.ndarray, local: np.ndarray,
                    start: torch.Tensor, end: torch.Tensor) -> None:
        pass

    # ---------------------------------------------------------------- outputs
    def eval_models(self) -> dict[str, torch.Tensor]:
        return {"": self.x}

    def last_mask(self) -> np.ndarray:
        return self.active

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"x": self.x}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.x = state["x"].to(self.ctx.device)


def register(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator: ``@register("fedavg_active") class FedAvgActive(ServerAlgorithm)``; the
    class's ``Params`` and ``check_config`` validate the ``algorithm:`` block."""

    def deco(cls: type[Algorithm]) -> type[Algorithm]:
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise TypeError(f"algorithm {name!r}: register a subclass of fedmpi.algorithms.Algorithm")
        return ALGORITHMS.register(name, params=cls.Params, check=cls.check_config)(cls)

    return deco


def memory_estimate(name: str, local_clients: int, d: int) -> int:
    """Bytes of per-client model-sized state an algorithm needs on one rank."""
    return int(ALGORITHMS.get(name).obj.client_rows) * local_clients * d * 4


def build(ctx: Context) -> Algorithm:
    return ALGORITHMS.get(ctx.cfg.algorithm.name).obj(ctx)
