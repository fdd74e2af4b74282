"""The one trap for stop signals (SIGTERM, SIGINT, SIGHUP, SIGUSR1): remember, never die.

A preemption warning, a time limit or a user's ``scancel`` may come at any moment of a run's
life, so ``fedmpi run`` and ``fedmpi sweep`` install the trap first thing, before importing
torch (``install``), and keep it until the process exits: a signal during start-up is acted on
at the first round boundary, one during teardown lets the run finish normally (and one
after the exit code is settled is ignored, ``ignore_from_now``). The round loop
(``Checkpointer``) and the sweep executors only ask ``received()``, which also
knows the launcher's stop file (``launch/fedmpi-launch``); which signals requeue a
SLURM job and which cancel it is the batch script's decision (slurm/*.sbatch).

Torch-free, per process, main thread only (Python's rule for signal handlers).
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from typing import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)

_received: list[str] = []          # names of the signals caught since the trap was installed
_listeners: list[Callable[[int], None]] = []
_installed = False
_depth = 0                         # ``trapped`` blocks open


def _on_signal(signum: int, frame: object) -> None:
    _received.append(signal.Signals(signum).name)
    for listener in list(_listeners):
        listener(signum)


def install() -> None:
    """Trap the stop signals in this process for good (idempotent; main thread)."""
    global _installed
    if not _installed:
        for sig in STOP_SIGNALS:
            signal.signal(sig, _on_signal)
        _installed = True


def received() -> str:
    """The name of the first stop signal caught (``""`` when none). ``SIGUSR1`` also when the
    file ``$FEDMPI_STOP_FILE`` exists: launch/fedmpi-launch creates it when it passes a signal
    on, for a rank that was still starting up (its launcher may have dropped the signal)."""
    if _received:
        return _received[0]
    stop_file = os.environ.get("FEDMPI_STOP_FILE")
    return "SIGUSR1" if stop_file and os.path.exists(stop_file) else ""


@contextmanager
def trapped(listener: Callable[[int], None] | None = None) -> Iterator[None]:
    """Within the block the stop signals are trapped (and passed to ``listener``, e.g. to forward
    them to child processes). The outermost block of a process that did not call ``install``
    starts with no signal remembered and puts the previous handlers back at its end; after
    ``install`` the trap stays. Main thread only (elsewhere: not trapped)."""
    global _depth
    old: dict = {}
    if not _installed and _depth == 0:
        _received.clear()
        try:
            old = {sig: signal.signal(sig, _on_signal) for sig in STOP_SIGNALS}
        except ValueError:  # not the main thread: nothing to trap
            old = {}
    if listener is not None:
        _listeners.append(listener)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if listener is not None:
            _listeners.remove(listener)
        for sig, handler in old.items():
            signal.signal(sig, handler)


def ignore_from_now() -> None:
    """The exit code is settled: a stop signal from now on must not replace it (Python puts
    back the default handlers, which kill, while it shuts down; ignored ones stay ignored)."""
    for sig in STOP_SIGNALS:
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:
            pass
