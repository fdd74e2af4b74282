"""Exceptions that map to the CLI's exit codes (see docs/INTERFACES.md)."""

from __future__ import annotations

import os
import sys


class InputError(Exception):
    """Bad input: config key, argument, or data file. Exit code 2, one line on stderr.

    The message must start with the offending key path or file name, e.g.
    ``"train.lr: must be > 0, got -1"`` or ``"/data/train_32x32.mat: missing (expected SVHN format 2)"``.
    """

    exit_code = 2


class Interrupted(Exception):
    """The run was stopped by a signal after writing a checkpoint. Exit code 3."""

    exit_code = 3


class Diverged(Exception):
    """A loss or the model became NaN or infinite; the last good checkpoint is kept. Exit code 4."""

    exit_code = 4


class RankLost(ConnectionError):
    """Another rank was lost: its process or node died (a connection closed without a goodbye, or
    no heartbeat for ``runtime.lost_after_s``; ``runtime.watch``). The result file is marked
    ``failed`` naming the rank and node, the last checkpoint is kept. Exit code 5, so that a
    batch script requeues the job (slurm/job.sh) and the rerun resumes; ``code`` is 1 instead
    when the run was lost again before any newer checkpoint (``runtime.watch.lost_code``)."""

    exit_code = 5
    code = 5


class WriteFailed(Exception):
    """A result file or checkpoint could not be written during a run (disk full, I/O error).
    Exit code 1 with one line; the last checkpoint and the result file as of its last flush stay
    valid, so the same command resumes once there is space."""

    exit_code = 1


#: The endings every rank of a run agrees on before its rounds start (``runtime.launcher.agree_on_error``).
AGREED = (InputError, Interrupted, WriteFailed)


def exit_code(e: InputError | Interrupted | Diverged | WriteFailed | KeyboardInterrupt, rank: int) -> int:
    """The exit code that ``e`` ends a command with, after its one line on stderr (rank 0 only):
    InputError 2 (``fedmpi: error: ...``), Interrupted 3 (``fedmpi: interrupted: ...``),
    Diverged 4 (``fedmpi: diverged: ...``), WriteFailed 1 (``fedmpi: error: ...``; a result file
    that could not be created), KeyboardInterrupt 3 (silent). A stderr that a killed launcher
    closed does not turn the code into a BrokenPipeError."""
    if isinstance(e, KeyboardInterrupt):
        return 3
    if rank == 0:
        word = "diverged" if isinstance(e, Diverged) else "interrupted" if isinstance(e, Interrupted) else "error"
        try:
            print(f"fedmpi: {word}: {e}", file=sys.stderr, flush=True)
        except OSError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())  # the rest goes to /dev/null
    return e.exit_code
