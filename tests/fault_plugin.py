"""Test plug-in: fault injection, reachable only from the tests.

``FEDMPI_TEST_FAULT="RANK:ROUND:raise|kill|usr1|stop|fill"`` with ``FEDMPI_PLUGINS=<this file>``
makes that rank raise, die by SIGKILL, receive SIGUSR1 (a preemption), stop (SIGSTOP, a hung
node) or fill the file system of ``$FEDMPI_TEST_FILL`` (a file it creates) to the last byte,
just before that round.
In-process tests pass ``Runner(..., callbacks=[inject("0:5:raise")])`` instead.
"""

from __future__ import annotations

import os
import signal
from typing import Callable

from fedmpi.registry import CALLBACKS

PATH = os.path.abspath(__file__)


def inject(spec: str) -> Callable[[object, int], None]:
    """A round callback that fails as ``spec`` says (``RANK:ROUND:raise|kill|usr1``)."""
    rank, when, how = spec.split(":")

    def fault(run, t: int) -> None:
        if run.world.rank != int(rank) or t != int(when):
            return
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "usr1":
            os.kill(os.getpid(), signal.SIGUSR1)
        elif how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif how == "fill":
            fill(os.environ["FEDMPI_TEST_FILL"])
        else:
            raise RuntimeError(f"injected fault at round {t}")

    return fault


def fill(path: str) -> None:
    """Write ``path`` until its file system is full (disk full for every later write)."""
    with open(path, "wb", buffering=0) as fh:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    fh.write(b"\0" * size)
            except OSError:
                pass


def env(spec: str) -> dict[str, str]:
    """The environment that makes a ``fedmpi`` subprocess load this plug-in with ``spec``."""
    return {"FEDMPI_TEST_FAULT": spec, "FEDMPI_PLUGINS": PATH}


if os.environ.get("FEDMPI_TEST_FAULT"):
    CALLBACKS.register("test_fault", inject(os.environ["FEDMPI_TEST_FAULT"]))
