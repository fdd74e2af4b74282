"""Test plug-in: with ``FEDMPI_TEST_TEARDOWN_KILL=RANK`` (not 0), that rank dies by SIGKILL as it
exits, once rank 0 has recorded its exit code in ``$FEDMPI_EXIT_FILE``: a rank killed after the run
was completed, as by a kill that Slurm kept for a node that was down and delivered, once the node
was back, to the requeued job's step of the same id."""

from __future__ import annotations

import atexit
import os
import signal
import time

from fedmpi.runtime.launcher import launched_rank


def _die_once_rank0_ended() -> None:
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            with open(os.environ["FEDMPI_EXIT_FILE"]) as fh:
                if fh.read().strip():
                    break
        except (OSError, KeyError):
            pass
        time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGKILL)


if os.environ.get("FEDMPI_TEST_TEARDOWN_KILL") and launched_rank() == int(os.environ["FEDMPI_TEST_TEARDOWN_KILL"]):
    atexit.register(_die_once_rank0_ended)
