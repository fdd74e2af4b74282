"""Availability in virtual time (``clock.slot``): a round-indexed availability kind asked at the
virtual time a client is asked.

With ``clock.slot`` = S seconds, the kind's step k covers the virtual times [k S, (k + 1) S): a
synchronous round that starts at ``now`` asks the clients available at step floor(now / S), and the
asynchronous server dispatches among those available at the dispatch time. Every kind works
unchanged (its steps are then slots of S seconds, not rounds): Bernoulli dynamics, cohorts, the
Markov sampler, and traces, so that an intervals trace in seconds (FedScale's behaviour traces:
``availability.trace_format: intervals``) is replayed in seconds with ``clock.slot: 1``. The kind
is stepped through every slot in order (stateful kinds rely on it); the step reached and its
available set are the run's state. One ask steps through at most ``MAX_SLOTS`` slots (a few
seconds of draws): a round or an arrival that spans more is refused naming ``clock.slot`` (a tiny
slot stepped through every one of ~1e9 per round, and SIGTERM, acted on between rounds, waited).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import InputError
from ..state import State

MAX_SLOTS = 10**5  # availability steps one ask may step through (~40 us each on a loaded core)


class InTime:
    """``participation`` asked at virtual times, ``slot`` seconds a step."""

    def __init__(self, participation, slot: float, m: int):
        self.participation, self.slot, self.m = participation, slot, m
        self.step = -1  # the kind's last step asked
        self.mask = np.zeros(m, dtype=bool)  # who is available in it

    def step_at(self, seconds: float) -> int:
        """The kind's step at virtual time ``seconds``; InputError naming ``clock.slot`` when it is
        more than ``MAX_SLOTS`` after the last step asked."""
        k = seconds / self.slot + 1e-9
        if not k <= max(self.step, 0) + MAX_SLOTS + 1:  # also inf (5e-324 s) and nan
            last = max(self.step, 0) * self.slot
            raise InputError(f"clock.slot: {self.slot:g} s per availability step; the clock moved from {last:.6g} s "
                             f"to {seconds:.6g} s in one round or arrival, more than {MAX_SLOTS:.0e} steps of "
                             f"availability.kind to draw (use a slot of at least {(seconds - last) / MAX_SLOTS:.3g} s)")
        return int(math.floor(k))

    def at(self, seconds: float) -> np.ndarray:
        """The sorted ids available at virtual time ``seconds`` (not before the last time asked)."""
        k = self.step_at(seconds)
        while self.step < k:
            self.step += 1
            ids = self.participation.available(self.step)
            if self.step == k:
                self.mask[:] = False
                self.mask[ids] = True
        return np.flatnonzero(self.mask)

    def next_change(self, seconds: float) -> float:
        """The start of the slot after the one ``seconds`` lies in."""
        return (self.step_at(seconds) + 1) * self.slot

    def state_dict(self) -> State:
        return State(shared={"clock.avail_step": torch.tensor(self.step),
                             "clock.avail_mask": torch.from_numpy(self.mask.astype(np.uint8))})

    def load_state_dict(self, shared: dict[str, torch.Tensor]) -> None:
        self.step = int(shared["clock.avail_step"].item())
        self.mask = shared["clock.avail_mask"].numpy().astype(bool)
