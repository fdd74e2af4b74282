"""Opening an input file safely: the one way every reader of fedmpi opens what a user names.

A config, a trace, a steps file, a graph, a LEAF split, a dataset file, a checkpoint: each is read
through ``open_input`` (or ``read_input``), which

- refuses a path that is not a regular file -- a FIFO, a device, a socket, a directory --
  *before* opening it (``os.stat``), and again on the opened descriptor (``os.fstat``; it is
  opened non-blocking, so a FIFO swapped in between cannot block the open either): reading a
  FIFO would wait forever for a writer, ``/dev/zero`` would never end;
- with ``limit``, refuses a file larger than ``limit`` bytes before reading any of it.

A refusal is ``InputError`` (exit 2) naming the key (when given) and the file; a missing or
unreadable file stays ``OSError`` for the caller, whose message says what the file should be.
Local to the process; imports nothing of fedmpi but its errors.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from .errors import InputError

_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


def _where(path: str, key: str) -> str:
    return f"{key}: {path}" if key else str(path)


def _check(st: os.stat_result, path: str, what: str, key: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise InputError(f"{_where(path, key)}: is {kind}, expected a {what} (a regular file)")


def check_regular(path: str, what: str, key: str = "") -> None:
    """Refuse ``path`` unless it is a regular file (symbolic links followed), without opening it.
    OSError (e.g. FileNotFoundError) when it cannot be looked at."""
    try:
        st = os.stat(path)
    except ValueError:  # an embedded NUL byte: no file can have that name
        raise InputError(f"{_where(repr(path), key)}: not a usable path (a NUL byte in it)") from None
    _check(st, path, what, key)


def open_input(path: str, what: str, key: str = "", limit: int | None = None) -> BinaryIO:
    """``path`` opened for binary reading, after ``check_regular`` (and on the descriptor again);
    with ``limit``, a file of more bytes is refused unread. ``what`` names the kind of file in
    messages (``"trace"``), ``key`` the config key that named it."""
    check_regular(path, what, key)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        _check(st, path, what, key)
        if limit is not None and st.st_size > limit:
            raise InputError(f"{_where(path, key)}: {what} of {_size(st.st_size)} is larger than the "
                             f"{_size(limit)} allowed")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str, what: str, key: str = "", limit: int | None = None) -> bytes:
    """The bytes of ``path`` (``open_input``'s checks; at most ``limit`` bytes are read even
    when the file grows meanwhile)."""
    with open_input(path, what, key, limit) as fh:
        data = fh.read() if limit is None else fh.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise InputError(f"{_where(path, key)}: {what} grew past the {_size(limit)} allowed while it was read")
    return data


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"
