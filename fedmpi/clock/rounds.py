"""Synchronous rounds on the clock: which asked clients count, and how long the round lasts.

A round starts at virtual time ``now``; every asked client i starts its task then and would
report d_i = comm_time_i + steps_i step_time_i seconds later (``Durations``). Then:

- ``clock.dropout`` p: the task fails with probability p, a uniform fraction of the way through
  (the server hears of it then); its work is lost (outcome ``failed``);
- ``clock.deadline`` D: a client with d_i > D is a straggler (``late``): the server stops
  waiting at D and discards its work;
- ``clock.over_select`` f with a cohort of K: the round asked ceil((1 + f) K) clients (the
  availability model drew that many) and keeps the first K to report, ties by client id; the
  others' work is discarded (``surplus``).

The round lasts until the K-th kept report when K were kept under over-selection; else until the
deadline when a client was late; else until the last report or failure (0 when nobody was asked).
Only the kept clients train: the others' results would be discarded unread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from .durations import Durations
from .events import OUTCOMES, Events


@dataclass
class Cohort:
    """What the clock kept of a round's asked clients (sorted ids) and how long the round lasted."""

    kept: np.ndarray
    failed: np.ndarray
    late: np.ndarray
    surplus: np.ndarray
    duration: float


class RoundClock:
    """The synchronous rounds' clock: ``now`` (virtual seconds, replicated state) and the events."""

    def __init__(self, durations: Durations, keep: int | None = None):
        self.durations, self.keep, self.deadline = durations, keep, durations.params.deadline
        self.now = 0.0
        self.events = Events()
        self.told = False  # whether the notice of a round the deadline emptied was given (once a run)

    def round(self, t: int, asked: np.ndarray, steps: np.ndarray) -> Cohort:
        """Round t of the clients ``asked`` (sorted ids) doing ``steps`` local steps each: the
        kept cohort; records the events and moves ``now`` to the round's end."""
        asked = np.asarray(asked, dtype=np.int64)
        d = self.durations.of(asked, steps)
        failed, fraction = self.durations.failures(asked, t)
        ok = ~failed
        on_time = ok if self.deadline is None else ok & (d <= self.deadline)
        order = np.lexsort((asked, d))  # by (finish, id)
        ranked = order[on_time[order]]
        kept_at = ranked if self.keep is None else ranked[: self.keep]
        outcome = np.full(len(asked), OUTCOMES.index("surplus"), dtype=np.int8)
        outcome[kept_at] = OUTCOMES.index("kept")
        outcome[ok & ~on_time] = OUTCOMES.index("late")
        outcome[failed] = OUTCOMES.index("failed")
        end = np.where(failed, fraction * d, d)
        if self.keep is not None and len(kept_at) == self.keep and self.keep > 0:
            duration = float(d[kept_at[-1]])  # the K-th report
        elif (ok & ~on_time).any():
            duration = float(self.deadline)
        else:
            heard = end[(outcome == OUTCOMES.index("kept")) | failed]
            duration = float(heard.max()) if len(heard) else 0.0
            duration = duration if self.deadline is None else min(duration, self.deadline)
        late = ok & ~on_time
        if late.any() and not len(kept_at) and not self.told:  # says so once: it may be every round
            self.told = True
            logging.getLogger(__name__).info(
                f"clock.deadline: round {t + 1} kept none of its {len(asked)} asked clients (the fastest took "
                f"{float(d[late].min()):.6g} s, the deadline is {self.deadline:g} s); such a round trains nobody")
        self.events.add(t, asked, self.now, self.now + end, t, 0, outcome)
        self.now += duration
        pick = lambda code: asked[outcome == OUTCOMES.index(code)]  # noqa: E731  (sorted: asked is)
        return Cohort(pick("kept"), pick("failed"), pick("late"), pick("surplus"), duration)
