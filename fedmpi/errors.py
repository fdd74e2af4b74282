"""Exceptions that map to the CLI's exit codes (see INTERFACES.md)."""

from __future__ import annotations


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
