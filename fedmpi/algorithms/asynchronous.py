"""The asynchronous server on the virtual clock, shared by FedBuff and FedAsync.

M = ``algorithm.concurrency`` clients train at once. Who is dispatched, when each task arrives and
which arrivals a step keeps is the scheduler's asynchronous policy (``self.clock``:
``fedmpi.clock.scheduler.Steps`` on ``fedmpi.clock.flight``); this class trains the tasks, holds
their updates and applies the step. Server step t (the runner's round t; ``rounds`` counts server
steps) holds the model x^t, version t:

    repeat until K updates are kept (K = ``buffer_size``):
        the next task to finish (finish time, then client id) arrives; now <- its finish time
        tau = t - (its version)                              # staleness in server steps
        failed (clock.dropout) or tau > algorithm.max_staleness: dropped, else kept
        a new client is dispatched in its place, from x^t
    x^{t+1} = step(t, kept updates, their tau)               # the algorithm's rule
    the free slots are filled from x^{t+1}

A client trains from the model current at its dispatch. The updates of every task dispatched from
version t are computed in one batch on the engine at step t, from x^t (those dispatched after step
t-1 and those dispatched during step t, known before any update is needed: the queue is
bookkeeping), each rank training an even share by position; rank 0 holds the updates still in
flight (``held``, one row per slot) until they arrive, and applies the step. The sums run in
arrival order on rank 0, so any number of ranks gives the same bits, and the queue and the clock
(the scheduler's declared state) and the held updates (``held``) are the run's state: a resumed
run continues them exactly.

The hooks of a task's training are the synchronous round's (``HONOURED``): ``lr_scale(t, clients)``
and ``local_terms(t, clients, start)``, with t the model version the tasks train from and
``start`` x^t (asynchronous FedProx is FedBuff with ``fedprox.Proximal`` as its term; FedAsync's
``algorithm.rho`` is one). Any other hook of the round is refused at ``register``.

When nothing is left in flight before K updates are kept (every client trained from x^t and
failed or was stale), the step uses the updates it has. With availability in time (``clock.slot``)
a free slot is filled at the next availability step when that comes before the next arrival.
Clients the clock drops are recorded in ``/events``; asynchronous algorithms have no client
state, so nothing else follows from a drop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import torch

from ..clock import scheduler
from ..clock.flight import Flight, stream
from ..clock.scheduler import Steps
from ..engine.threads import one_thread
from ..schema import Digest, opt
from ..state import declared
from .base import Context, ServerAlgorithm, ServerParams


@dataclass
class AsyncParams(ServerParams):
    """The keys of every asynchronous algorithm."""

    concurrency: int = opt(10, "asynchronous: M, clients training at once", ge=1)
    staleness: Literal["none", "sqrt", "poly", "hinge"] = opt(
        "sqrt", "asynchronous: staleness weight s(tau): none 1, sqrt 1/sqrt(1+tau), poly (1+tau)^-a, "
                "hinge 1 if tau <= b else 1/(a (tau - b) + 1)")
    staleness_a: float = opt(0.5, "asynchronous: a of the poly and hinge weights", ge=0)
    staleness_b: int = opt(4, "asynchronous: b of the hinge weight (staleness without discount)", ge=0)
    max_staleness: Optional[int] = opt(None, "asynchronous: drop updates staler than this (null: keep all)", ge=0)
    once_per_version: bool = opt(True, "asynchronous: a client trains at most once from one model version (the rule "
                                       "of runs before a task had its own random streams: true keeps their bits); "
                                       "false: any idle client may be dispatched",
                                 digest=Digest(absent=True))  # the rule of the checkpoints before this key


def staleness_weight(kind: str, tau: np.ndarray, a: float, b: int) -> np.ndarray:
    """s(tau) (float64), the discount of an update ``tau`` server steps stale (FedAsync, Xie et al.
    2019: polynomial and hinge; FedBuff, Nguyen et al. 2022: 1/sqrt(1 + tau))."""
    tau = np.asarray(tau, dtype=np.float64)
    if kind == "none":
        return np.ones_like(tau)
    if kind == "sqrt":
        return 1.0 / np.sqrt(1.0 + tau)
    if kind == "poly":
        return (1.0 + tau) ** -a
    return np.where(tau <= b, 1.0, 1.0 / (a * (tau - b) + 1.0))


#: the hooks of the synchronous round (``base.HOOKS``) a server step honours; overriding another is
#: refused at ``register`` (``AsyncAlgorithm._unhonoured``)
HONOURED: tuple[str, ...] = ("lr_scale", "local_terms")


class AsyncAlgorithm(ServerAlgorithm):
    """Asynchronous FL on the virtual clock (the module docstring); subclasses give ``buffer_size``,
    what the server keeps of an update (``keep``) and the server ``step``."""

    Params = AsyncParams
    private = ("an asynchronous server whose step is not declared a release of a sum (FedBuff's is: declare "
               "`private = Private(..., counted=True)` on it)")
    shared_state = ("held",)  # the updates of tasks still in flight (the tasks are the scheduler's, ``self.clock``)

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        Steps.check(cfg)

    @classmethod
    def _unhonoured(cls) -> str | None:
        """The first hook of the synchronous round (``base.HOOKS``, ``base.SWITCHES``) that ``cls``
        overrides and a server step would ignore, in one line; client state is refused too (a
        task trains on any rank, not on its client's owner)."""
        ignored = [h for h in cls._overridden() if h not in HONOURED]
        if ignored:
            return (f"{cls.__name__}.{ignored[0]}: the asynchronous server does not honour it (a server step "
                    f"takes arrivals as they come; it honours {', '.join(HONOURED) or 'none of the round hooks'} "
                    f"and its own buffer_size, keep, step and weight)")
        if declared(cls, "client_state"):
            return (f"{cls.__name__}.client_state: the asynchronous server trains a task on any rank, not on its "
                    f"client's owner (declare shared_state)")
        return None

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.held = torch.zeros(self.params.concurrency, ctx.spec.dim, device=ctx.device)  # updates in flight (rank 0)

    def schedule(self) -> Steps:
        """Asynchronous server steps (``fedmpi.clock.scheduler.Steps``): M tasks in flight."""
        return scheduler.steps(self.ctx, self.params.concurrency, self.params.once_per_version)

    @property
    def flight(self) -> Flight:
        """The tasks in flight (the scheduler's)."""
        return self.clock.flight

    @property
    def buffer_size(self) -> int:
        """K: kept arrivals per server step."""
        raise NotImplementedError

    def keep(self, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """What the server holds of updates trained from ``start`` to ``end`` (rows; default the
        changes Delta_i = end - start)."""
        return end - start

    def step(self, t: int, rows: torch.Tensor, staleness: np.ndarray) -> torch.Tensor:
        """x^{t+1} from the kept updates' ``keep`` rows (k, d) in arrival order and their staleness
        (rank 0; float64)."""
        raise NotImplementedError

    def weight(self, staleness: np.ndarray) -> np.ndarray:
        """s(tau) of ``algorithm.staleness``."""
        p = self.params
        return staleness_weight(p.staleness, staleness, p.staleness_a, p.staleness_b)

    # ---------------------------------------------------------------- one server step
    def round(self, t: int) -> int:
        plan = self.clock.arrivals(t, self.buffer_size, self.params.max_staleness)
        fresh, in_flight = plan.fresh, plan.in_flight
        rows = self._train(t, fresh)  # rank 0: (len(fresh), d); elsewhere None
        self.active = plan.active  # the step's contributors
        if self.world.is_server:
            picked = [rows[j] if j >= 0 else self.held[-1 - j] for j in plan.source]
            update = torch.stack(picked) if picked else self.held[:0]
            self.x = self.step(t, update, plan.staleness).float() if len(plan.kept) else self.x.clone()
            for i, s in enumerate(in_flight):  # the updates still in flight, until they arrive
                self.held[s] = rows[len(fresh) - len(in_flight) + i]
        else:
            self.x = torch.empty_like(self.x)
        self.world.broadcast_(self.x)
        self.clock.stepped(t, plan)
        return len(plan.kept)

    def _train(self, t: int, work: list[tuple[int, int, int]]) -> torch.Tensor | None:
        """The ``keep`` rows of ``work`` (client, steps, repeat) trained from x^t on the engine, each
        rank an even share by position; all of them on rank 0 in ``work``'s order (None elsewhere)."""
        n, r, size = len(work), self.world.rank, self.world.size
        clients, steps, repeat = np.array(work, dtype=np.int64).reshape(n, 3).T
        lo, hi = n * r // size, n * (r + 1) // size
        start = self.x.expand(hi - lo, -1)
        groups = np.unique(repeat[lo:hi])
        if len(groups) <= 1:  # one engine call (every task a client's first from x^t, unless once_per_version is off)
            end = self._tasks(t, clients[lo:hi], steps[lo:hi], start, int(groups[0]) if len(groups) else 0)
        else:  # a client's k-th task from x^t: its own streams, so one call per k
            end = torch.empty_like(start)
            for k in groups:
                rows = np.flatnonzero(repeat[lo:hi] == k)
                end[rows] = self._tasks(t, clients[lo:hi][rows], steps[lo:hi][rows], start[: len(rows)], int(k))
        with one_thread(self.device):
            mine = self.keep(start, end)
        if size == 1:
            return mine
        width = -(-n // size)  # every rank sends the same shape
        padded = torch.zeros(width, mine.shape[1], dtype=mine.dtype, device=mine.device)
        padded[: hi - lo] = mine
        parts = self.world.gather_to_server(padded)
        if parts is None:
            return None
        return torch.cat([parts[q][: n * (q + 1) // size - n * q // size] for q in range(size)])

    def _tasks(self, t: int, clients: np.ndarray, steps: np.ndarray, start: torch.Tensor, repeat: int) -> torch.Tensor:
        """End models of ``clients``' tasks from x^t (``start``), each its client's ``repeat``-th from
        it, trained with the round's hooks and bounded (privacy: the client's half of its release),
        their random streams at ``flight.stream(seed, t, repeat)``."""
        key = stream(self.cfg.seed, t, repeat)
        end = self.ctx.trainer.train(start, clients, t, lr_scale=self.lr_scale(t, clients), steps=steps,
                                     terms=self.local_terms(t, clients, start), stream=key)
        return self.privacy.client_side(key, clients, start, end)

    @property
    def device(self) -> torch.device:
        return self.ctx.device
