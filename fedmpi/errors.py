"""Exceptions that map to the CLI's exit codes (see docs/INTERFACES.md)."""

from __future__ import annotations

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


def exit_code(e: InputError | Interrupted | KeyboardInterrupt, rank: int) -> int:
    """The exit code that ``e`` ends a command with, after its one line on stderr (rank 0 only):
    InputError 2 (``fedmpi: error: ...``), Interrupted 3 (``fedmpi: interrupted: ...``),
    KeyboardInterrupt 3 (silent)."""
    if isinstance(e, KeyboardInterrupt):
        return 3
    if rank == 0:
        print(f"fedmpi: {'error' if isinstance(e, InputError) else 'interrupted'}: {e}", file=sys.stderr)
    return e.exit_code
