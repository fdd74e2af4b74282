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


@contextmanager
def muted() -> Iterator[None]:
    """No notices inside: for configs that are only checked or compared, not run (a sweep's cells,
    the config stored in a result file); the run itself prints them."""
    logger = logging.getLogger("fedmpi")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
