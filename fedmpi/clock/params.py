"""The ``clock`` section: how long each client's task takes in virtual seconds, and what a
synchronous round does with time (deadline, over-selection, dropout)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Optional

from ..errors import InputError
from ..schema import Digest, opt

KINDS = ("none", "constant", "lognormal", "file")


@dataclass
class ClockParams:
    """The ``clock`` block (docs/CONFIG.md); ``kind: none`` keeps rounds timeless (the default)."""

    kind: Literal["none", "constant", "lognormal", "file"] = opt(
        "none", "client durations: none (no time), constant, lognormal (a speed per client) or file",
        digest=Digest(off="none"))  # timeless rounds: the checkpoints before the clock
    step_time: float = opt(1.0, "virtual seconds of one local step (lognormal: of the median device)", gt=0)
    comm_time: float = opt(0.0, "virtual seconds of a task's download and upload (lognormal: median device)",
                           ge=0)
    sigma: float = opt(0.5, "lognormal: spread of the devices' speeds, v_i = exp(sigma z_i)", ge=0, le=10)
    file: Optional[str] = opt(None, "file: CSV with header client,step_time,comm_time, one row per client, or "
                                    "FedScale's device-capacity map (pickle or JSON)")
    deadline: Optional[float] = opt(None, "synchronous: seconds after a round starts; later clients are "
                                          "dropped as stragglers (null: wait for all)", gt=0)
    over_select: float = opt(0.0, "synchronous: ask ceil((1 + f) K) clients of a cohort of K, keep the "
                                  "first K to report (needs availability.kind: cohort)", ge=0, le=10)
    dropout: float = opt(0.0, "probability that a task fails mid-way (its work is lost)", ge=0, lt=1)
    slot: Optional[float] = opt(None, "seconds per step of the availability kind, asked at the virtual time a "
                                      "client is asked (null: one step per round)", gt=0)

    @property
    def on(self) -> bool:
        return self.kind != "none"

    @property
    def drops(self) -> bool:
        """True when some asked clients' work may be discarded (deadline, over-selection, dropout)."""
        return self.deadline is not None or self.over_select > 0 or self.dropout > 0

    def input_files(self) -> tuple[str, ...]:
        return (self.file,) if self.kind == "file" and self.file else ()


def asked(cohort: int, over_select: float) -> int:
    """ceil((1 + f) K): the clients a cohort of K asks with over-selection f."""
    return math.ceil((1 + over_select) * cohort - 1e-9)


def check(cfg: Any) -> None:
    """Cross-key checks of the ``clock`` section (InputError naming the keys)."""
    c = cfg.clock
    if not c.on:
        for key, idle in (("deadline", c.deadline is None), ("over_select", c.over_select == 0),
                          ("dropout", c.dropout == 0), ("slot", c.slot is None)):
            if not idle:
                raise InputError(f"clock.{key}: needs a clock (set clock.kind: constant, lognormal or file)")
        return
    if c.kind == "file" and not c.file:
        raise InputError("clock.file: kind 'file' needs a CSV path (header client,step_time,comm_time)")
    if c.kind != "file" and c.file:
        raise InputError(f"clock.file: only read with clock.kind: file (got kind {c.kind!r})")
    if c.over_select > 0 and cfg.availability.kind != "cohort":
        raise InputError(f"clock.over_select: over-selection asks more clients of a cohort of K "
                         f"(availability.kind: cohort), got availability.kind {cfg.availability.kind!r}")
    if c.slot is not None and cfg.privacy.mechanism != "none":
        raise InputError("clock.slot: privacy.mechanism accounts for one availability draw per round, which "
                         "slots of virtual time are not (leave clock.slot: null)")
    if c.over_select > 0 and cfg.privacy.mechanism != "none":
        raise InputError("clock.over_select: privacy.mechanism divides the noisy sum by the expected cohort of "
                         "those asked, which keeping the first K of them would shrink (leave over_select: 0)")
    if c.over_select > 0 and asked(cfg.availability.size, c.over_select) > cfg.task.clients:
        raise InputError(f"clock.over_select: asks {asked(cfg.availability.size, c.over_select)} clients "
                         f"(ceil((1 + f) availability.size)), more than task.clients ({cfg.task.clients})")
