"""The asynchronous server's clients in flight, on the virtual clock (bookkeeping only: no models).

``concurrency`` M slots; each holds one dispatched task: its client, dispatch and finish times
(virtual seconds), the model version it trains from (server steps done at its dispatch), its
``repeat`` (how many tasks its client was dispatched from that version before it), its local
steps, whether it fails (``clock.dropout``) and whether its update was computed. Arrivals come in
(finish time, client id) order. A dispatch picks a client uniformly among the idle ones (not in
flight), from the stream (seed, "dispatch", n) of the n-th dispatch. A task's random streams
(minibatches, dropout, augmentation) have the coordinate ``stream(version, repeat)``: the version
for a client's first task from it (the streams of a synchronous round t), a coordinate of its
own for each further one, so a client may train again before the model moves.

``once_per_version`` (``algorithm.once_per_version``, the default) keeps the rule of the runs made
before that coordinate existed: only idle clients that have not trained from the current version
are drawn (every repeat is 0), and with none such the slot waits for the next version; it keeps
their draws, and so their bits. Off, the effective concurrency stays M whenever M clients are idle.
With availability in time (``clock.slot``, ``availability``) only the clients available at the
dispatch time are drawn. Every array here is the same on every rank, and all of it is the run's
state (checkpointed, so a resumed run continues the same queue).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import rng
from .durations import Durations
from .events import OUTCOMES, Events

FREE = -1
STREAMS = 1 << 63  # a further task's stream coordinate is at least this: never a version


def stream(seed: int, version: int, repeat: int) -> int:
    """The random streams' coordinate of a task: ``version`` for a client's first task from it
    (``repeat`` 0), else a hash of (version, repeat) above every version (``STREAMS``)."""
    return version if repeat == 0 else STREAMS | int(rng.key(seed, "task", version, repeat)) >> 1


class Flight:
    """M slots of tasks in flight, the clock ``now`` and the dispatch counter."""

    def __init__(self, concurrency: int, m: int, durations: Durations, seed: int,
                 steps_of: Callable[[np.ndarray, int], np.ndarray],
                 available: Callable[[float], np.ndarray] | None = None, once_per_version: bool = True):
        self.durations, self.seed, self.steps_of, self.m = durations, seed, steps_of, m
        self.available = available  # ids available at a virtual time (None: everyone, always)
        self.once_per_version = once_per_version
        self.client = np.full(concurrency, FREE, dtype=np.int64)
        self.dispatch = np.zeros(concurrency)
        self.finish = np.zeros(concurrency)
        self.version = np.zeros(concurrency, dtype=np.int64)
        self.steps = np.zeros(concurrency, dtype=np.int64)
        self.failed = np.zeros(concurrency, dtype=np.int8)
        self.trained = np.zeros(concurrency, dtype=np.int8)
        self.repeat = np.zeros(concurrency, dtype=np.int64)
        self.last_version = np.full(m, -1, dtype=np.int64)  # the version each client last trained from
        self.repeats = np.zeros(m, dtype=np.int64)  # its tasks from last_version, less one
        self.dispatched = 0  # tasks dispatched so far (the n of the next dispatch's streams)
        self.now = 0.0
        self.events = Events()

    @property
    def busy(self) -> np.ndarray:
        return self.client != FREE

    def idle(self, version: int) -> np.ndarray:
        """(m,) bool: the clients a dispatch from ``version`` may draw: not in flight (and, once
        per version, not trained from ``version``)."""
        idle = self.last_version != version if self.once_per_version else np.ones(self.m, dtype=bool)
        idle[self.client[self.busy]] = False
        return idle

    def fill(self, version: int) -> None:
        """Dispatch into every free slot at ``now`` from model ``version`` (while clients are left)."""
        up = np.ones(self.m, dtype=bool)
        if self.available is not None:
            up[:] = False
            up[self.available(self.now)] = True
        for slot in np.flatnonzero(~self.busy):
            candidates = np.flatnonzero(self.idle(version) & up)
            if not len(candidates):
                return
            n = self.dispatched
            client = candidates[int(rng.integers(rng.key(self.seed, "dispatch", n), 0, len(candidates)))]
            steps = int(self.steps_of(np.array([client]), n)[0])
            d = float(self.durations.of(np.array([client]), np.array([steps]))[0])
            failed, fraction = self.durations.failures(np.array([client]), n)
            self.client[slot], self.dispatch[slot], self.version[slot] = client, self.now, version
            self.finish[slot] = self.now + (fraction[0] * d if failed[0] else d)
            self.steps[slot], self.failed[slot], self.trained[slot] = steps, int(failed[0]), 0
            self.repeats[client] = self.repeats[client] + 1 if self.last_version[client] == version else 0
            self.repeat[slot], self.last_version[client] = self.repeats[client], version
            self.dispatched = n + 1

    def task(self, slot: int) -> tuple[int, int, int]:
        """(client, steps, repeat) of the task in ``slot``."""
        return int(self.client[slot]), int(self.steps[slot]), int(self.repeat[slot])

    def next_arrival(self) -> int | None:
        """The slot that reports next ((finish, client) order), or None when nothing is in flight."""
        busy = np.flatnonzero(self.busy)
        if not len(busy):
            return None
        return int(busy[np.lexsort((self.client[busy], self.finish[busy]))[0]])

    def untrained(self, version: int) -> np.ndarray:
        """Slots whose task trains from ``version`` and whose update is not computed yet (failed
        tasks excepted: their work is lost)."""
        return np.flatnonzero(self.busy & (self.version == version) & (self.trained == 0) & (self.failed == 0))

    def arrive(self, slot: int, t: int, outcome: str) -> None:
        """The task in ``slot`` reports at its finish time during server step ``t``: ``now`` moves
        there, the event is recorded, the slot is freed."""
        self.now = float(self.finish[slot])
        self.events.add(t, self.client[slot], self.dispatch[slot], self.finish[slot], self.version[slot],
                        t - self.version[slot], OUTCOMES.index(outcome))
        self.client[slot] = FREE
