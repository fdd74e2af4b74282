"""Test plug-in: with ``FEDMPI_TEST_KILL_ONCE=RANK:ROUND:MARKER``, that rank dies by SIGKILL just
before round ROUND, once per job: it first creates the file MARKER (on a shared file system), and
a rerun that finds it runs on. A rank lost on a node that lives on, as by a kill meant for an earlier
start of a requeued job that Slurm delivered late."""

from __future__ import annotations

import os
import signal

from fedmpi.registry import CALLBACKS


def _kill_once(run, t: int) -> None:
    rank, when, marker = os.environ["FEDMPI_TEST_KILL_ONCE"].split(":", 2)
    if run.world.rank != int(rank) or t != int(when):
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


if os.environ.get("FEDMPI_TEST_KILL_ONCE"):
    CALLBACKS.register("test_kill_once", _kill_once)
