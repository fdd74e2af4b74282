"""Notices for the user: the ``fedmpi`` logger, printed as ``notice: ...`` on stderr by rank 0.

Modules log with ``logging.getLogger(__name__).info(...)`` on every rank; ``setup(rank)``
(called by the command line) lets only rank 0 print, so a notice appears once per job.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from typing import Iterator


class _Stderr(logging.StreamHandler):
    """Writes to the current ``sys.stderr`` (not the one at set-up time)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup(rank: int) -> None:
    """Print the ``fedmpi`` logger's notices on stderr, on rank 0 only (idempotent)."""
    logger = logging.getLogger("fedmpi")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("notice: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if rank == 0 else logging.ERROR)


class _Once(logging.Filter):
    """Lets each distinct message through once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text in self.seen:
            return False
        self.seen.add(text)
        return True


@contextmanager
def once() -> Iterator[None]:
    """Each distinct notice printed once inside: a sweep says what its cells share (a key of
    another algorithm in the base config) once, not once per cell."""
    handlers = [h for h in logging.getLogger("fedmpi").handlers if isinstance(h, _Stderr)]
    only_once = _Once()
    for h in handlers:
        h.addFilter(only_once)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(only_once)


@contextmanager
def muted(name: str = "fedmpi") -> Iterator[None]:
    """No notices of logger ``name`` (and below) inside: for configs that are only checked or
    compared, not run (a sweep's cells, the config stored in a result file); the run itself
    prints them."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
