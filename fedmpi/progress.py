"""Progress of a run on rank 0's stderr: a tqdm bar on a terminal, one line per evaluation elsewhere.

A SLURM ``.out`` file or a pipe gets lines such as::

    fedmpi: round 40/300  test_acc 0.7712  test_loss 0.6543  2.31 rounds/s  ETA 1m52s

so a batch log shows where a run stands. A terminal gets the tqdm bar, also when it reports
0 columns (then the bar is 80 wide instead of vanishing). Only rank 0 creates one.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from .schema import opt


@dataclass
class ProgressParams:
    """``runtime.progress`` (read by the runner when it starts the reporter)."""

    progress: bool = opt(True, "progress on rank 0's stderr: a tqdm bar on a TTY, else one line per evaluation")

MAIN_METRICS = ("test_acc", "test_loss", "x", "consensus_error", "sim_delay")


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _usable_terminal(stream: TextIO) -> bool:
    """False for a terminal that reports (almost) no size: tqdm would then draw nothing."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return size.columns >= 20 and size.lines >= 2


def summary(row: dict[str, Any]) -> str:
    """The main metrics of an evaluation row, e.g. ``test_acc 0.7712  test_loss 0.6543``."""
    return "  ".join(f"{k} {row[k]:.4g}" for k in MAIN_METRICS if k in row)


class Progress:
    """Reports rounds and evaluations of one run (create with :func:`start`)."""

    def __init__(self, total: int, start: int, label: str = "", stream: TextIO | None = None,
                 bar: bool = False):
        self.total, self.done, self.label = total, start, label
        self.stream = stream or sys.stderr
        self._t0, self._start = time.monotonic(), start  # rates and ETAs count the rounds of this start
        self._bar = None
        if start:
            self.stream.write(f"fedmpi:{' ' + label if label else ''} resumed from round {start}/{total} "
                              f"(checkpoint)\n")
            self.stream.flush()
        if bar:
            from tqdm import tqdm

            sized = _usable_terminal(self.stream)  # else a fixed 80 x 24 (tqdm hides bars on a 0 x 0 pty)
            self._bar = tqdm(total=total, initial=start, unit="round", file=self.stream, desc=label or None,
                             dynamic_ncols=sized, ncols=None if sized else 80, nrows=None if sized else 24)

    def update(self, rounds: int = 1) -> None:
        """``rounds`` more rounds are done."""
        self.done += rounds
        if self._bar is not None:
            self._bar.update(rounds)

    def evaluated(self, row: dict[str, Any]) -> None:
        """An evaluation row (rank 0's metrics at ``row['round']``)."""
        if self._bar is not None:
            self._bar.set_postfix({k: f"{row[k]:.4f}" for k in ("test_acc", "test_loss") if k in row})
            return
        self.stream.write(self.line(row) + "\n")
        self.stream.flush()

    def line(self, row: dict[str, Any]) -> str:
        """The line printed for an evaluation without a terminal."""
        rounds = int(row.get("round", self.done))
        parts = [f"fedmpi:{' ' + self.label if self.label else ''} round {rounds}/{self.total}"]
        if summary(row):
            parts.append(summary(row))
        elapsed, ran = time.monotonic() - self._t0, rounds - self._start
        if ran > 0 and elapsed > 0:
            rate = ran / elapsed
            parts.append(f"{rate:.3g} rounds/s")
            if rounds < self.total:
                parts.append(f"ETA {_duration((self.total - rounds) / rate)}")
        return "  ".join(parts)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def start(total: int, done: int, enabled: bool, label: str = "", stream: TextIO | None = None) -> Progress | None:
    """A reporter for a run with ``total`` rounds, ``done`` of them already done; None when
    ``enabled`` is false (``--quiet``, ``runtime.progress: false``, ranks other than 0).
    ``FEDMPI_PROGRESS=lines`` forces lines on a terminal (parallel sweep workers use it)."""
    if not enabled:
        return None
    stream = stream or sys.stderr
    tty = stream.isatty() and os.environ.get("FEDMPI_PROGRESS") != "lines"
    return Progress(total, done, label, stream, bar=tty)
