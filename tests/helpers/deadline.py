"""A time limit for a command run in the test process (``conftest.cli``), where a subprocess
would have had ``timeout=``: a regression that hangs fails the test instead of the suite."""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """TimeoutError when the body still runs after ``seconds`` (SIGALRM: main thread, Unix;
    a blocking system call such as opening a FIFO is interrupted too)."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
