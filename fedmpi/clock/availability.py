"""Availability in virtual time (``clock.slot``): a round-indexed availability kind asked at the
virtual time a client is asked.

With ``clock.slot`` = S seconds, the kind's step k covers the virtual times [k S, (k + 1) S): a
synchronous round that starts at ``now`` asks the clients available at step floor(now / S), and the
asynchronous server dispatches among those available at the dispatch time. Every kind works
unchanged (its steps are then slots of S seconds, not rounds): Bernoulli dynamics, cohorts, the
Markov sampler, and traces, so that an intervals trace in seconds (FedScale's behaviour traces:
``availability.trace_format: intervals``) is replayed in seconds with ``clock.slot: 1``. The kind
is stepped through every slot in order (stateful kinds rely on it); the step reached and its
available set are the run's state.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..state import State


class InTime:
    """``participation`` asked at virtual times, ``slot`` seconds a step."""

    def __init__(self, participation, slot: float, m: int):
        self.participation, self.slot, self.m = participation, slot, m
        self.step = -1  # the kind's last step asked
        self.mask = np.zeros(m, dtype=bool)  # who is available in it

    def step_at(self, seconds: float) -> int:
        return int(math.floor(seconds / self.slot + 1e-9))

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
