"""The asynchronous server's clients in flight, on the virtual clock (bookkeeping only: no models).

``concurrency`` M slots; each holds one dispatched task: its client, dispatch and finish times
(virtual seconds), the model version it trains from (server steps done at its dispatch), its local
steps, whether it fails (``clock.dropout``) and whether its update was computed. Arrivals come in
(finish time, client id) order. A dispatch picks a client uniformly among the idle ones (not in
flight) that have not trained from the current version yet (a client trains at most once from one
model: its minibatches are keyed by the version), from the stream (seed, "dispatch", n) of the
n-th dispatch; with none such, the slot waits for the next version. With availability in time
(``clock.slot``, ``availability``) only the clients available at the dispatch time are drawn.
Every array here is the same
on every rank, and all of it is the run's state (checkpointed, so a resumed run continues the
same queue).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import rng
from .durations import Durations
from .events import OUTCOMES, Events

FREE = -1


class Flight:
    """M slots of tasks in flight, the clock ``now`` and the dispatch counter."""

    def __init__(self, concurrency: int, m: int, durations: Durations, seed: int,
                 steps_of: Callable[[np.ndarray, int], np.ndarray],
                 available: Callable[[float], np.ndarray] | None = None):
        self.durations, self.seed, self.steps_of, self.m = durations, seed, steps_of, m
        self.available = available  # ids available at a virtual time (None: everyone, always)
        self.client = np.full(concurrency, FREE, dtype=np.int64)
        self.dispatch = np.zeros(concurrency)
        self.finish = np.zeros(concurrency)
        self.version = np.zeros(concurrency, dtype=np.int64)
        self.steps = np.zeros(concurrency, dtype=np.int64)
        self.failed = np.zeros(concurrency, dtype=np.int8)
        self.trained = np.zeros(concurrency, dtype=np.int8)
        self.last_version = np.full(m, -1, dtype=np.int64)  # the version each client last trained from
        self.dispatched = 0  # tasks dispatched so far (the n of the next dispatch's streams)
        self.now = 0.0
        self.events = Events()

    @property
    def busy(self) -> np.ndarray:
        return self.client != FREE

    def idle(self, version: int) -> np.ndarray:
        """(m,) bool: the clients not in flight that have not trained from ``version``."""
        idle = self.last_version != version
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
            self.last_version[client] = version
            self.dispatched = n + 1

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
