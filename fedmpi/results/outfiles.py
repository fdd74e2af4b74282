"""Files written next to result files (CSV sidecars and exports, figures): never over a file this
command did not make, and never half-written.

The rule (docs/GUARANTEES.md): a command replaces an existing file only when the
user named it with ``--overwrite``, or when it is recognisably the same kind of output (a figure
over a figure, a run's own metric CSV when that run is resumed or overwritten). An input of the
command, a fedmpi result file or anything that is not a regular file is never replaced. Content is
written to a temporary file in the same folder and renamed over the target, so a failed write
(disk full) leaves the old file, and a symbolic link is replaced, not written through.
"""

from __future__ import annotations

import os
import stat
import tempfile
from typing import Callable, Iterable, TextIO

from ..errors import InputError

FIGURE_TYPES = {".png": (b"\x89PNG",), ".pdf": (b"%PDF",), ".svg": (b"<?xml", b"<svg"), ".eps": (b"%!PS",),
                ".ps": (b"%!PS",)}


def same_file(a: str, b: str) -> bool:
    """True when ``a`` and ``b`` name one file (also through links; by path when one is missing)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _starts_with(path: str, prefixes: tuple[bytes, ...]) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(64).lstrip()
    except OSError:
        return False
    return head.startswith(prefixes)


def is_metric_csv(path: str) -> bool:
    """A CSV of metric rows as fedmpi writes them (its header starts with ``round``)."""
    return _starts_with(path, (b"round,", b"round\n", b"file,seed,", b"file,variant,seed,"))


def is_figure(path: str) -> bool:
    """A figure of the type its extension names (PNG, PDF or SVG)."""
    return _starts_with(path, FIGURE_TYPES.get(os.path.splitext(path)[1].lower(), ()))


def _temp_beside(path: str, suffix: str) -> tuple[int, str]:
    """A new file in the folder of ``path`` (created if needed), with the usual permissions."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=suffix, dir=folder)
    mask = os.umask(0)
    os.umask(mask)
    os.fchmod(fd, 0o666 & ~mask)
    return fd, temp


def check_target(path: str, key: str, inputs: Iterable[str] = (), overwrite: bool = False,
                 replaceable: Callable[[str], bool] | None = None,
                 advice: str = "use --overwrite to replace it, or another path") -> None:
    """Refuse (InputError naming ``key`` and ``path``, ending in ``advice`` where that helps) to
    write ``path`` when it is one of ``inputs`` (also through a link), a directory or special
    file, a fedmpi result file, or an existing file that neither ``overwrite`` nor
    ``replaceable(path)`` allows replacing."""
    if not path or not path.strip():
        raise InputError(f"{key}: empty path")
    if "\0" in path:  # os.stat and os.path.samefile raise ValueError on it
        raise InputError(f"{key}: {path!r}: not a usable path (a NUL byte in it)")
    for inp in inputs:
        if inp and os.path.exists(inp) and same_file(path, inp):
            raise InputError(f"{key}: {path} is an input of this command ({inp}); choose another path")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise InputError(f"{key}: {path}: cannot write ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{key}: {path} exists and is not a regular file; choose another path")
    from .hdf5 import peek

    if peek(path)[0] not in ("missing", "empty", "foreign"):
        raise InputError(f"{key}: {path} is a fedmpi result file; choose another path")
    if not overwrite and not (replaceable is not None and replaceable(path)):
        raise InputError(f"{key}: {path} already exists; {advice}")


class AtomicFile:
    """A text file written under a temporary name and renamed to ``path`` by :meth:`commit`
    (the open handle then writes the renamed file). Failures are InputError naming ``key``."""

    def __init__(self, path: str, key: str):
        self.path, self.key = path, key
        try:
            fd, self.temp = _temp_beside(path, ".tmp")
        except OSError as e:
            raise self.error(e) from None
        self.fh: TextIO = os.fdopen(fd, "w", newline="", encoding="utf-8")

    def error(self, e: OSError) -> InputError:
        return InputError(f"{self.key}: cannot write {self.path} ({e.strerror or e})")

    def commit(self) -> None:
        """Flush and put the file in place; on failure remove the temporary file and raise."""
        try:
            self.fh.flush()
            os.replace(self.temp, self.path)
        except OSError as e:
            self.discard()
            raise self.error(e) from None

    def discard(self) -> None:
        try:
            self.fh.close()
        except OSError:
            pass
        try:
            os.unlink(self.temp)
        except OSError:
            pass


def write_text(path: str, key: str, write: Callable[[TextIO], None]) -> None:
    """Write ``path`` all at once through ``write(fh)``: the old content stays on any failure."""
    out = AtomicFile(path, key)
    try:
        write(out.fh)
    except OSError as e:
        out.discard()
        raise out.error(e) from None
    except BaseException:
        out.discard()
        raise
    out.commit()
    out.fh.close()


def check_figure(path: str, key: str, inputs: Iterable[str] = ()) -> None:
    """Refuse a figure path (before the work that draws it): not .png/.pdf/.svg, an input, or an
    existing file that is not a figure of that type."""
    if os.path.splitext(path)[1].lower() not in FIGURE_TYPES:
        raise InputError(f"{key}: {path}: a figure file must end in {', '.join(FIGURE_TYPES)}")
    check_target(path, key, inputs, replaceable=is_figure)


def save_figure(fig, path: str, key: str, inputs: Iterable[str] = ()) -> str:
    """Save a matplotlib figure to ``path`` (:func:`check_figure`), under a temporary name, then
    renamed: a failed write leaves the previous figure. Fonts are embedded as TrueType (Type 42)
    in PDF and PostScript, never as Type 3; bitmaps have 300 dpi."""
    import matplotlib

    check_figure(path, key, inputs)
    ext = os.path.splitext(path)[1].lower()
    temp = None
    try:
        fd, temp = _temp_beside(path, ext)
        with os.fdopen(fd, "wb") as fh, matplotlib.rc_context({"pdf.fonttype": 42, "ps.fonttype": 42}):
            fig.savefig(fh, format=ext[1:], dpi=300)  # TrueType fonts (venues refuse Type 3), print resolution
        os.replace(temp, path)
    except (OSError, ValueError) as e:
        if temp is not None and os.path.exists(temp):
            os.unlink(temp)
        raise InputError(f"{key}: cannot write the figure {path} ({getattr(e, 'strerror', None) or e})") from None
    return path
