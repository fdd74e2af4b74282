"""Optimised factors kept between runs (``privacy.factor: optimized | banded``), verified or ignored.

A factor costs seconds to minutes to optimise, so it is computed once per (factor, rounds, band)
and kept in ``folder()``. What is read back is used only when it is what was stored for exactly
these inputs: a file is one header line of JSON -- the inputs that made it (factor, version of the
optimisation, rounds, band), the array's shape, and the SHA-256 of that header and the array's
bytes -- then the array's float64 bytes. A file that is not a regular file (a FIFO, a device), is
larger than its shape allows (read no further), names other inputs (a factor swapped from another
run's) or fails its digest (damaged, or crafted) is ignored with one warning and recomputed; the
caller re-checks what the numbers must satisfy (``optimal``). Files are written to a temporary
name and renamed, so concurrent runs never read half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import tempfile
from typing import Any, Callable

import numpy as np

CACHE_ENV = "FEDMPI_CACHE"
MAGIC = "fedmpi-factor"
HEADER_MAX = 4096  # bytes of the header line at most

log = logging.getLogger(__name__)


def folder() -> str:
    """Where optimised factors are kept: ``$FEDMPI_CACHE/factors``, else
    ``$XDG_CACHE_HOME/fedmpi/factors``, else ``~/.cache/fedmpi/factors``."""
    if os.environ.get(CACHE_ENV):
        base = os.environ[CACHE_ENV]
    else:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                            "fedmpi")
    return os.path.join(base, "factors")


def path_of(inputs: dict[str, Any]) -> str:
    """The file of the factor made from ``inputs`` (factor, version, rounds, band)."""
    return os.path.join(folder(), "{factor}-v{version}-n{rounds}-b{band}.f64".format(**inputs))


def _header(inputs: dict[str, Any], shape: tuple[int, ...], data: bytes) -> dict[str, Any]:
    head = {"format": MAGIC, "inputs": inputs, "shape": list(shape)}
    digest = hashlib.sha256(json.dumps(head, sort_keys=True).encode() + data).hexdigest()
    return {**head, "sha256": digest}


def digest(array: np.ndarray) -> str:
    """SHA-256 of a factor's float64 bytes (little-endian), as the result file names it."""
    return hashlib.sha256(np.ascontiguousarray(array, dtype="<f8").tobytes()).hexdigest()


def read(inputs: dict[str, Any], shape: tuple[int, ...]) -> tuple[np.ndarray | None, str]:
    """(the array stored for ``inputs``, "") when the file holds it and passes its checks; else
    (None, why not) -- "" when there is no file."""
    path = path_of(inputs)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without waiting for a writer
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"cannot open it: {e.strerror or e}"
    size = 8 * int(np.prod(shape))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        if info.st_size > HEADER_MAX + size:
            return None, f"{info.st_size} bytes, more than a {shape} factor takes"
        blob = _read_at_most(fd, HEADER_MAX + size + 1)
    except OSError as e:
        return None, f"cannot read it: {e.strerror or e}"
    finally:
        os.close(fd)
    line, _, data = blob.partition(b"\n")
    try:
        head = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None, "not a fedmpi factor file"
    if not (isinstance(head, dict) and head.get("format") == MAGIC):
        return None, "not a fedmpi factor file"
    if head.get("inputs") != inputs:
        return None, f"made for other inputs ({json.dumps(head.get('inputs'))[:120]})"
    if head.get("shape") != list(shape) or len(data) != size:
        return None, f"of shape {head.get('shape')} with {len(data)} bytes, not {list(shape)}"
    if head != _header(inputs, shape, data):
        return None, "its digest does not match its contents"
    return np.frombuffer(data, dtype="<f8").reshape(shape).astype(np.float64), ""


def _read_at_most(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of the file ``fd``, to its end."""
    parts, left = [], limit
    while left > 0:
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def write(inputs: dict[str, Any], array: np.ndarray) -> None:
    """Keep ``array`` for ``inputs`` (a warning where the folder cannot be written)."""
    data = np.ascontiguousarray(array, dtype="<f8").tobytes()
    head = json.dumps(_header(inputs, array.shape, data), sort_keys=True).encode()
    where = folder()
    try:
        os.makedirs(where, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".factor-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(head + b"\n" + data)
            os.replace(tmp, path_of(inputs))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        log.warning("privacy.factor: cannot keep the optimised factor in %s (%s); it is recomputed each run",
                    where, e.strerror or e)


def cached(inputs: dict[str, Any], shape: tuple[int, ...], compute: Callable[[], np.ndarray],
           optimal: Callable[[np.ndarray], str]) -> np.ndarray:
    """The array for ``inputs``: from the cache when a file holds it and ``optimal`` (a re-check of
    the numbers: "" when they are fine, else why not) accepts it; else ``compute()``, stored. A file
    that is there but not used is named in one warning."""
    array, why = read(inputs, shape)
    if array is not None:
        why = optimal(array)
        if not why:
            return array
    if why:
        log.warning("privacy.factor: ignoring the cached factor %s (%s); recomputing it", path_of(inputs), why)
    array = compute()
    write(inputs, array)
    return array
