"""The virtual clock: how long clients take (``durations``), what a synchronous round keeps when
time matters (``rounds``), the asynchronous server's queue of clients in flight (``flight``), and
the record of who was asked when (``events``). The ``clock`` section (``params``) configures it;
``clock.kind: none`` (the default) is fedmpi without time: rounds take no time and nothing here
runs. docs/DESIGN.md ("The clock") says where it sits."""

from __future__ import annotations

from .durations import Durations
from .events import EVENT_COLUMNS, OUTCOMES, Events
from .params import ClockParams, check

__all__ = ["ClockParams", "check", "Durations", "Events", "EVENT_COLUMNS", "OUTCOMES"]
