"""The scheduler: the server's one component of time -- who is asked when, how long their tasks
take and what the server keeps of them.

It owns the availability model asked per round or at virtual times (``clock.slot``:
``availability.InTime``), the clients' durations (``durations``), the clock and the tasks in
flight, and declares their state (``state_dict`` under the names checkpoints have always held:
``clock.now``, ``clock.avail_step``/``clock.avail_mask``, ``flight.*``). A server
(``algorithms.base.ServerAlgorithm``) holds one, as ``self.clock``, and asks it; it never reads
the clock itself. Two policies, synchronous rounds (untimed or on the clock) and asynchronous steps:

- ``Rounds`` (synchronous, ``clock.kind: none``): ``available(t)`` is round t's available set;
  ``keep(t, selected)`` keeps every selected client, in no time;
- ``TimedRounds`` (synchronous, a clock): ``available(t)`` is the set at ``now`` (with
  ``clock.slot``); ``keep`` keeps whom the clock keeps (``rounds.RoundClock``: dropout, deadline,
  over-selection) and moves ``now`` to the round's end;
- ``Steps`` (asynchronous): ``arrivals(t, K, limit)`` are the arrivals a server step keeps and
  the tasks to train from x^t (``flight.Flight``); ``stepped(t, plan)`` dispatches from x^{t+1}.

Every policy answers ``virtual_time()`` (None untimed) and ``round_events()`` (``events``; None
untimed). Everything here is the same on every rank and is pure bookkeeping: no models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from ..errors import InputError
from ..state import State, Stateful, as_tensor, restore_like
from .availability import InTime
from .durations import Durations
from .flight import Flight
from .rounds import Cohort, RoundClock

if TYPE_CHECKING:
    from ..algorithms.base import Context
    from ..participation import Participation

#: local steps (n,) of clients in a round or of a model version: ``LocalTrainer.steps_of``
StepsOf = Callable[[np.ndarray, int], np.ndarray]

#: with availability in time, the most availability steps a server step waits with nothing in flight
#: before it steps with what arrived (a trace that never brings a client back must not hang the run)
MAX_IDLE_STEPS = 100_000

#: the flight's arrays of a task's repeats, state only without ``once_per_version`` (``Steps.state_dict``)
REPEATS = ("repeat", "repeats")

_NONE = np.zeros(0, dtype=np.int64)


def check(cfg: Any, cls: type) -> None:
    """The clock's refusals for a server algorithm ``cls`` (both policies): an algorithm that
    weights clients by their true availability p_i^t cannot run where the clock changes who
    trains."""
    c = cfg.clock
    if (c.drops or c.slot is not None) and getattr(cls, "needs_probabilities", False):
        key = next(k for k, on in (("slot", c.slot is not None), ("deadline", c.deadline is not None),
                                   ("over_select", c.over_select > 0), ("dropout", True)) if on)
        raise InputError(f"clock.{key}: algorithm.name {cfg.algorithm.name} weights clients by their true "
                         f"availability p_i^t in round t, which the clock changes")


class Scheduler(Stateful):
    """What every policy holds: the availability model (asked at virtual times with ``clock.slot``:
    ``in_time``) and the clients' durations (None without a clock)."""

    configuration = ("participation", "durations", "steps_of", "deadline")
    custom_state = ("in_time",)  # saved by ``state_dict``: the availability step reached and its set

    def __init__(self, participation: Participation | None, durations: Durations | None, slot: float | None,
                 m: int, steps_of: StepsOf):
        self.participation, self.durations, self.steps_of = participation, durations, steps_of
        #: the synchronous rounds' deadline (``clock.deadline``), None without one
        self.deadline = None if durations is None else durations.params.deadline
        self.in_time = InTime(participation, slot, m) if slot is not None and participation is not None else None

    def virtual_time(self) -> float | None:
        """Virtual seconds since the start (the metric ``time``); None untimed."""
        return None

    def round_events(self) -> dict[str, np.ndarray] | None:
        """The events of the last round or server step (``events``), handed over once; None untimed."""
        return None

    def state_dict(self) -> State:
        state = super().state_dict()
        if self.in_time is not None:  # the availability step reached and who is available in it
            state.shared.update(self.in_time.state_dict().shared)
        return state

    def load_state_dict(self, state: State) -> None:
        super().load_state_dict(state)
        if self.in_time is not None:
            self.in_time.load_state_dict(state.shared)


class Rounds(Scheduler):
    """Synchronous rounds without a clock (``clock.kind: none``): round t asks availability step t,
    keeps every selected client and takes no time."""

    def available(self, t: int) -> np.ndarray:
        """The clients available to round t (sorted ids)."""
        return self.participation.available(t)

    def keep(self, t: int, selected: np.ndarray) -> Cohort:
        """Of the clients ``select`` chose in round t, those that train: all of them."""
        return Cohort(selected, _NONE, _NONE, _NONE, 0.0)


class TimedRounds(Rounds):
    """Synchronous rounds on the clock (``rounds.RoundClock``): availability asked at ``now`` with
    ``clock.slot``, who the clock keeps (deadline, over-selection, dropout), ``now`` at the round's
    end. A round that asks nobody under ``clock.slot`` waits for the next availability step."""

    custom_state = ("clock",)  # saved by ``state_dict`` as ``clock.now``: the time the next round starts

    def __init__(self, participation: Participation | None, durations: Durations, slot: float | None, m: int,
                 steps_of: StepsOf, keep: int | None = None):
        super().__init__(participation, durations, slot, m, steps_of)
        self.clock = RoundClock(durations, keep)

    def available(self, t: int) -> np.ndarray:
        return super().available(t) if self.in_time is None else self.in_time.at(self.clock.now)

    def keep(self, t: int, selected: np.ndarray) -> Cohort:
        """Who the clock keeps of ``selected`` (``RoundClock.round``); records the events, moves ``now``."""
        cohort = self.clock.round(t, selected, self.steps_of(selected, t))
        if self.in_time is not None and not len(selected):  # nobody to ask: wait for the next availability step
            self.clock.now = self.in_time.next_change(self.clock.now)
        return cohort

    def virtual_time(self) -> float:
        return self.clock.now

    def round_events(self) -> dict[str, np.ndarray]:
        return self.clock.events.take()

    def state_dict(self) -> State:
        state = super().state_dict()
        state.shared["clock.now"] = torch.tensor(self.clock.now, dtype=torch.float64)
        return state

    def load_state_dict(self, state: State) -> None:
        super().load_state_dict(state)
        if "clock.now" not in state.shared:
            raise InputError("checkpoint: no saved clock.now (written by another version?)")
        self.clock.now = float(state.shared["clock.now"].item())


@dataclass
class Plan:
    """What an asynchronous server step takes (``Steps.arrivals``): the kept arrivals in arrival
    order, the tasks to train from x^t and where each kept update comes from."""

    kept: list[tuple[int, int, int]]  # (client, staleness, slot)
    fresh: list[tuple[int, int, int]]  # (client, steps, repeat) of the tasks trained from x^t, in this order
    source: list[int]  # for each kept update: its row in ``fresh``, or -1 - its slot in the held updates
    in_flight: np.ndarray  # the slots whose tasks train from x^t now and arrive later (the last of ``fresh``)

    @property
    def active(self) -> np.ndarray:
        """The step's contributors (sorted ids)."""
        return np.sort(np.array([k[0] for k in self.kept], dtype=np.int64))

    @property
    def staleness(self) -> np.ndarray:
        """The kept updates' staleness, in arrival order."""
        return np.array([k[1] for k in self.kept], dtype=np.int64)


class Steps(Scheduler):
    """Asynchronous server steps (``algorithms.asynchronous``): M tasks in flight (``flight.Flight``).

    Server step t: ``arrivals`` takes the next task to finish, (finish time, client id) order,
    until K updates are kept (failed tasks and those staler than ``max_staleness`` are dropped),
    dispatching a replacement from x^t after each, and lists every task that trains from x^t;
    after the server's step, ``stepped`` marks those trained and dispatches from x^{t+1}. With
    availability in time a free slot is filled at the next availability step when that comes
    before the next arrival."""

    shared_state = ("flight.client", "flight.dispatch", "flight.finish", "flight.version", "flight.steps",
                    "flight.failed", "flight.trained", "flight.last_version", "flight.dispatched", "flight.now")
    configuration = ("once_per_version",)

    def __init__(self, participation: Participation | None, durations: Durations, slot: float | None, m: int,
                 steps_of: StepsOf, seed: int, concurrency: int, once_per_version: bool):
        super().__init__(participation, durations, slot, m, steps_of)
        self.once_per_version = once_per_version
        self.flight = Flight(concurrency, m, durations, seed, steps_of,
                             None if self.in_time is None else self.in_time.at, once_per_version)
        self.flight.fill(0)

    @classmethod
    def check(cls, cfg: Any) -> None:
        """The asynchronous server's refusals of the ``clock`` and ``availability`` keys."""
        name, c = cfg.algorithm.name, cfg.clock
        if not c.on:
            raise InputError(f"clock.kind: algorithm.name {name} is asynchronous: it runs on the virtual clock "
                             f"(set clock.kind: constant, lognormal or file)")
        if cfg.availability.kind != "always" and c.slot is None:
            raise InputError(f"availability.kind: algorithm.name {name} dispatches at virtual times: set "
                             f"clock.slot (seconds per step of {cfg.availability.kind!r}) or leave availability.kind: "
                             f"always")
        for key, used in (("deadline", c.deadline is not None), ("over_select", c.over_select > 0)):
            if used:
                raise InputError(f"clock.{key}: algorithm.name {name} is asynchronous: it has no rounds to cut "
                                 f"(a deadline and over-selection apply to synchronous rounds)")
        if cfg.algorithm.concurrency > cfg.task.clients:
            raise InputError(f"algorithm.concurrency: {cfg.algorithm.concurrency} clients in flight, more than "
                             f"task.clients ({cfg.task.clients})")

    def arrivals(self, t: int, k: int, limit: int | None) -> Plan:
        """Server step t's arrivals until ``k`` updates are kept (fewer when nothing is left in
        flight), dropping failed tasks and, with ``limit``, those staler than it; and the tasks that
        train from x^t: those kept now and those still in flight, whose updates the server holds."""
        flight = self.flight
        kept: list[tuple[int, int, int]] = []
        fresh: list[tuple[int, int, int]] = []
        source: list[int] = []
        idle = 0  # availability steps waited with nothing in flight
        while len(kept) < k:
            slot = flight.next_arrival()
            if self._wait_for_clients(slot, t):  # availability in time: a free slot waits for the next step
                idle = idle + 1 if slot is None else 0
                if idle < MAX_IDLE_STEPS:
                    continue
                break
            if slot is None:  # nothing in flight: step with what arrived
                break
            tau = t - int(flight.version[slot])
            outcome = "failed" if flight.failed[slot] else "stale" if limit is not None and tau > limit else "kept"
            if outcome == "kept":
                kept.append((int(flight.client[slot]), tau, slot))
                if flight.trained[slot]:
                    source.append(-1 - slot)
                else:
                    source.append(len(fresh))
                    fresh.append(flight.task(slot))
            flight.arrive(slot, t, outcome)
            if len(kept) < k:
                flight.fill(t)
        in_flight = flight.untrained(t)
        fresh += [flight.task(s) for s in in_flight]
        return Plan(kept, fresh, source, in_flight)

    def stepped(self, t: int, plan: Plan) -> None:
        """After server step t: the tasks of ``plan`` still in flight have their updates; the free
        slots are filled from x^{t+1}."""
        self.flight.trained[plan.in_flight] = 1
        self.flight.fill(t + 1)

    def _wait_for_clients(self, slot: int | None, t: int) -> bool:
        """With availability in time, when a task slot is free and the kind's next step comes before
        the next arrival (or nothing is in flight but some idle client may become available): move
        ``now`` there and dispatch who is available; True when it did."""
        flight = self.flight
        if self.in_time is None or flight.busy.all():
            return False
        boundary = self.in_time.next_change(flight.now)
        if slot is not None and boundary >= flight.finish[slot]:
            return False
        if slot is None and not flight.idle(t).any():  # nobody could be dispatched from x^t at any time
            return False
        flight.now = boundary
        flight.fill(t)
        return True

    def virtual_time(self) -> float:
        return self.flight.now

    def round_events(self) -> dict[str, np.ndarray]:
        return self.flight.events.take()

    def state_dict(self) -> State:
        """The declared state; without ``once_per_version`` also the tasks' repeats (with it they are
        all 0, and a checkpoint holds what it held before repeats existed)."""
        state = super().state_dict()
        if not self.once_per_version:
            state.shared.update({f"flight.{n}": as_tensor(getattr(self.flight, n)) for n in REPEATS})
        return state

    def load_state_dict(self, state: State) -> None:
        super().load_state_dict(state)
        if not self.once_per_version:
            for n in REPEATS:
                setattr(self.flight, n, restore_like(getattr(self.flight, n), state.shared[f"flight.{n}"], n))


def durations(ctx: Context) -> Durations:
    """The clients' task durations (a device map needs the batch and the model size)."""
    cfg = ctx.cfg
    return Durations(cfg.clock, ctx.m, cfg.seed, cfg.train.batch_size, ctx.spec.dim)


def rounds(ctx: Context) -> Rounds:
    """The synchronous policy of a run: ``Rounds`` without a clock, else ``TimedRounds`` (a cohort of
    K = ``availability.size`` keeps K under ``clock.over_select``; a deadline nobody can meet is
    refused, exit 2)."""
    c, trainer = ctx.cfg.clock, ctx.trainer
    if not c.on:
        return Rounds(ctx.participation, None, c.slot, ctx.m, trainer.steps_of)
    made = durations(ctx)
    made.check_deadline(trainer.least_steps())  # a deadline nobody can meet: exit 2
    keep = ctx.cfg.availability.size if c.over_select > 0 else None
    return TimedRounds(ctx.participation, made, c.slot, ctx.m, trainer.steps_of, keep)


def steps(ctx: Context, concurrency: int, once_per_version: bool) -> Steps:
    """The asynchronous policy of a run: ``concurrency`` tasks in flight, dispatched at once from x^0."""
    return Steps(ctx.participation, durations(ctx), ctx.cfg.clock.slot, ctx.m, ctx.trainer.steps_of, ctx.cfg.seed,
                 concurrency, once_per_version)
