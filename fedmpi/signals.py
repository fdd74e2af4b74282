"""The one trap for stop signals (SIGTERM, SIGINT, SIGHUP, SIGUSR1): never die of one.

A preemption warning, a time limit or a user's ``scancel`` may come at any moment of a run's
life, so ``fedmpi run`` and ``fedmpi sweep`` install the trap first thing, before importing
torch (``install``), and keep it until the process exits. What a signal does depends on the
moment:

- in set-up (``interruptible`` blocks: reading the config, the data, a checkpoint) it ends the
  run at once: the handler raises ``Interrupted`` (exit 3), so a set-up that blocks (a slow file
  system, a peer that never comes) cannot swallow it; a signal that came before such a block
  raises on entering it. Inside ``deferred`` (writing the result file's first rows) it waits for
  the block's end;
- in the round loop (``Checkpointer``) it is remembered and acted on at the next round
  boundary, where the ranks agree on it, checkpoint and exit 3;
- in teardown it lets the run finish normally (and one after the exit code is settled is
  ignored, ``ignore_from_now``).

The round loop and the sweep executors only ask ``received()``, which also knows the launcher's
stop file (``launch/fedmpi-launch`` writes the name of the signal it got there, so a SIGTERM it
passed on as SIGUSR1 is reported as SIGTERM); which signals requeue a SLURM job and which cancel
it is the batch script's decision (slurm/*.sbatch).

Torch-free, per process, main thread only (Python's rule for signal handlers).
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from typing import Callable, Iterator

from .errors import Interrupted

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
_NAMES = {sig.name for sig in STOP_SIGNALS}

_received: list[str] = []          # names of the signals caught since the trap was installed
_listeners: list[Callable[[int], None]] = []
_installed = False
_depth = 0                         # ``trapped`` blocks open
_raise: list[str | None] = []      # open ``interruptible`` blocks' messages, None for ``shielded`` ones


def _on_signal(signum: int, frame: object) -> None:
    _received.append(signal.Signals(signum).name)
    for listener in list(_listeners):
        listener(signum)
    _raise_if_due()


def _raise_if_due() -> None:
    """In an ``interruptible`` block (innermost: not ``shielded``) after a signal caught by the trap
    (none when it is not set: in-process callers outside ``trapped``), raise Interrupted."""
    if _raise and _raise[-1] is not None and (_installed or _depth) and received():
        raise Interrupted(f"signal {received()} {_raise[-1]}")


@contextmanager
def _pushed(moment: str | None) -> Iterator[None]:
    _raise.append(moment)
    try:
        yield
    finally:
        _raise.pop()


@contextmanager
def interruptible(moment: str) -> Iterator[None]:
    """Within the block a stop signal (or one already received) raises ``Interrupted("signal
    NAME <moment>")`` at once; for set-up, where nothing is lost by stopping. Main thread only."""
    with _pushed(moment):
        _raise_if_due()
        yield


@contextmanager
def shielded() -> Iterator[None]:
    """Within the block a signal is only remembered, also inside an ``interruptible`` one (a file
    being written is not left half-done); the round loop or the next ``interruptible`` block acts
    on it."""
    with _pushed(None):
        yield


@contextmanager
def deferred() -> Iterator[None]:
    """``shielded``, then, inside an ``interruptible`` block, raise at the block's end if a signal came."""
    with shielded():
        yield
    _raise_if_due()


def install() -> None:
    """Trap the stop signals in this process for good (idempotent; main thread)."""
    global _installed
    if not _installed:
        for sig in STOP_SIGNALS:
            signal.signal(sig, _on_signal)
        _installed = True


def received() -> str:
    """The name of the first stop signal caught (``""`` when none). The file ``$FEDMPI_STOP_FILE``
    counts too: launch/fedmpi-launch creates it when it passes a signal on as SIGUSR1, for a rank
    that was still starting up (its launcher may have dropped the signal), and writes there the
    name of the signal it got, which is the one reported (SIGUSR1 when the file names none)."""
    stop_file = os.environ.get("FEDMPI_STOP_FILE")
    if _received and _received[0] != "SIGUSR1":
        return _received[0]
    if not stop_file or not os.path.isfile(stop_file):  # (a regular file: never blocks)
        return _received[0] if _received else ""
    try:
        with open(stop_file, "rb") as fh:
            said = fh.read(32).decode("ascii", "replace").strip()
    except OSError:
        said = ""
    return said if said in _NAMES else "SIGUSR1"


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
