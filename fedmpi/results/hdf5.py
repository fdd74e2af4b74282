"""The HDF5 result file (INTERFACES.md): written by rank 0 only, readable at any moment.

Layout: root attributes ``config`` (resolved YAML), ``fedmpi_version``, ``world_size``,
``seed``, ``status`` (one of ``STATUSES``), ``rounds_done``;
``/metrics/<name>`` 1-D chunked resizable datasets aligned with ``/metrics/round``;
``/availability/mask`` (rounds x m uint8) when requested; per-round numbers the algorithm reports
(``round_series``, one float64 per round run: ``/privacy/noise_multiplier``; or one row of m float64
per round run: ``/client_rounds/<name>``, a declared per-client quantity); ``/clients/<name>``
(evaluations x m float64, rows aligned with ``/metrics/round``) for per-client metrics when requested; ``notes``
attributes (e.g. ``stopped_early``) set by the run; ``/events/<column>`` (one row per task the
virtual clock ran, ``fedmpi.clock.events``) when the run has a clock; ``/final/params``; extra groups
(``/partition``, ``/topology``) written once.

Safety. A writer first *claims* its path (:func:`claim`): an exclusive ``flock`` on the file,
taken before anything is written, so a second run on the same path exits 2 and leaves the
first run's file alone; then the claim decides whether the existing content may be replaced
(a completed or foreign file only with ``overwrite``). Rows are buffered in memory and written
at most every ``flush_s`` seconds, at checkpoints and at the end: between two flushes the file
on disk is not touched at all, so a run killed at any moment leaves the file as of its last
flush, which opens, with ``status = running``.

Disk full. HDF5 cannot undo a write that fails half-way (a compressed mask chunk is left
corrupt, and closing such a file can crash the process). So before each flush the writer
reserves the space that flush can use beyond the end of the file (``fallocate`` without changing
the size; a free-space check where the file system cannot), plus a margin that stays reserved
for marking the file and closing it. No space: :class:`WriteFailed` (one line, exit 1) before
anything is written; the file keeps its last flush, is marked ``failed`` and resumes from the
last checkpoint.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import resource
import time
from typing import Any, Iterable

import h5py
import numpy as np

from .. import __version__
from ..clock.events import EVENT_COLUMNS, OUTCOMES
from ..errors import InputError, WriteFailed

STATUSES = ("running", "completed", "interrupted", "failed", "diverged")
#: What h5py raises on a damaged file, from any call (opening, a membership test, a read).
READ_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)
_MASK_BUFFER_BYTES = 64 << 20  # flush early rather than hold more participation rows than this
_CLOSE_MARGIN = 64 << 10  # kept reserved beyond the file's end: status attribute and close
_FLUSH_BASE = 32 << 10  # what any flush may add (metadata), besides the chunks its rows need


class OutputBusy(InputError):
    """Another process holds the result file (exit 2; a sweep worker skips such a cell)."""


# ----------------------------------------------------------------------------- claiming a path

def _lock(fd: int, path: str) -> bool:
    """Exclusive non-blocking flock; False on a file system without flock (nothing to enforce)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        raise OutputBusy(f"{path}: another run is writing this result file; wait for it to end "
                         f"or choose another output") from None
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        raise


def is_locked(path: str) -> bool:
    """True while some process holds the result file's write lock (a run is writing it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # (a FIFO must not block us)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def peek(path: str) -> tuple[str, dict[str, Any]]:
    """What a path holds: ('missing' | 'empty' | 'foreign' | a status, root attributes).

    'foreign' also stands for a file whose structure HDF5 cannot read or whose status is none of
    ``STATUSES`` (damaged, or not written by fedmpi): nothing may replace it without --overwrite.
    Reads without any lock, so it works while a run writes the file."""
    try:
        if os.path.getsize(path) == 0:
            return "empty", {}
    except FileNotFoundError:
        return "missing", {}
    except OSError:
        return "foreign", {}
    try:
        with h5py.File(path, "r", locking=False) as f:
            if "metrics" not in f or "status" not in f.attrs:
                return "foreign", {}
            attrs = {k: _attr(v) for k, v in f.attrs.items()}
    except READ_ERRORS:
        return "foreign", {}
    if attrs["status"] not in STATUSES:
        return "foreign", {}
    return attrs["status"], attrs


def _stored_config(config_yaml: str) -> Any:
    """A stored config (None when it is no longer a valid config; ``config.from_stored``)."""
    from .. import config

    return config.from_stored(config_yaml)


def _stored_digest(config_yaml: str) -> str | None:
    """Resume digest of a stored config (None when it is no longer a valid config)."""
    stored = _stored_config(config_yaml)
    return None if stored is None else stored.resume_digest()


def _another_experiment(config_yaml: str, cfg: Any) -> str:
    """' (differs in: KEYS)' naming where a stored config differs from ``cfg``, or ''."""
    stored = _stored_config(config_yaml)
    if stored is None or cfg is None:
        return ""
    keys = stored.resume_differences(cfg)
    return f" (differs in {', '.join(keys[:6])}{', ...' if len(keys) > 6 else ''})" if keys else ""


def _read_changed(config_yaml: str, cfg: Any, path: str) -> str | None:
    """The refusal of a run of ``cfg`` that differs from the stored one only in a key a component
    reads (``Config.reads_changed``), or None."""
    stored = _stored_config(config_yaml)
    return None if stored is None or cfg is None else cfg.reads_changed(stored, f"the run {path} holds")


def _extends(attrs: dict[str, Any], digest: str, cfg: Any) -> bool:
    """Whether a run of ``cfg`` extends the completed run of ``attrs``: the same experiment, more
    ``rounds``, and the stored run ran all of its own rounds (not ended early by ``stop_at`` or
    the algorithm). What else may change is the resume's rule (``Config.reads_changed``)."""
    stored = _stored_config(str(attrs.get("config", "")))
    if stored is None or cfg is None or stored.resume_digest() != digest or attrs.get("stopped_early"):
        return False
    done = int(attrs.get("rounds_done", -1))
    return done == stored.rounds < cfg.rounds


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


class Claim:
    """The exclusive right to write one result file: an open descriptor holding its flock.

    ``previous`` is what the path held before ('missing', 'empty', a status, or 'foreign' when
    ``overwrite`` allowed replacing it). Release with :meth:`release` (the writer does it)."""

    def __init__(self, path: str, fd: int, created: bool, previous: str, overwrite: bool = False):
        self.path, self.fd, self.created, self.previous = path, fd, created, previous
        self.overwrite = overwrite

    @property
    def owns_sidecars(self) -> bool:
        """Whether this run may rewrite the files named after the result (its metric CSV): it
        continues or replaces a run there, or the user said --overwrite."""
        return self.overwrite or self.previous not in ("missing", "empty")

    def release(self, discard: bool = False) -> None:
        """Drop the lock; ``discard`` also removes a file this claim created (nothing was run)."""
        if self.fd < 0:
            return
        if discard and self.created:
            try:
                if os.path.getsize(self.path) == 0:
                    os.unlink(self.path)
            except OSError:
                pass
        os.close(self.fd)
        self.fd = -1


def _open_for_claim(path: str) -> tuple[int, bool]:
    """(descriptor, created) without truncating anything; (-1, False) when the file vanished."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), True
    except FileExistsError:
        try:
            return os.open(path, os.O_RDWR | os.O_CLOEXEC), False
        except FileNotFoundError:
            return -1, False
        except OSError as e:
            raise InputError(f"{path}: cannot write the result file ({e.strerror or e})") from None
    except OSError as e:
        raise InputError(f"{path}: cannot write the result file ({e.strerror or e})") from None


def _still_named(fd: int, path: str) -> bool:
    """True when ``path`` still names the file open on ``fd``."""
    try:
        st, fst = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def claim(path: str, digest: str, inputs: Iterable[str] = (), overwrite: bool = False, cfg: Any = None) -> Claim:
    """Lock ``path`` for writing a run whose ``Config.resume_digest()`` is ``digest``.

    Nothing is written. Refused (InputError, exit 2): an empty path, a directory, a path that
    is one of ``inputs`` (config, trace, graph files), a file another process is writing
    (:class:`OutputBusy`, even with ``overwrite``); without ``overwrite`` also a completed run, a
    file that is not a fedmpi result, and an unfinished run of another experiment. An unfinished
    run of the same experiment (killed, interrupted, failed) may be resumed or restarted. With
    ``cfg`` (the run's Config) the refusal of another experiment names the keys that differ."""
    if not path or not path.strip():
        raise InputError("--out: empty result path")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected a result file path")
    if os.path.islink(path) and not os.path.exists(path):  # O_EXCL would fail on it forever
        raise InputError(f"{path}: is a symbolic link to {os.path.realpath(path)}, which does not exist; "
                         f"remove the link or create its target's folder and file")
    if os.path.exists(path) and not os.path.isfile(path):  # /dev/null, a FIFO, a device: results would be lost
        raise InputError(f"{path}: is not a regular file; choose a result file path")
    for inp in inputs:
        if inp and os.path.exists(inp) and _same_file(path, inp):
            raise InputError(f"{path}: is an input of this run ({inp}); choose another output path")
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    except OSError as e:
        raise InputError(f"{path}: cannot write the result file ({e.strerror or e})") from None
    for _ in range(5):  # the previous holder may unlink the file between our open and our flock
        fd, created = _open_for_claim(path)
        if fd < 0:
            continue
        try:
            _lock(fd, path)
        except OutputBusy:
            os.close(fd)
            raise
        if _still_named(fd, path):
            break
        os.close(fd)
    else:
        raise InputError(f"{path}: the file keeps being replaced by another process; choose another output")
    previous, attrs = ("missing", {}) if created else peek(path)
    why = None
    if previous in ("missing", "empty") or overwrite or previous == "completed" and _extends(attrs, digest, cfg):
        pass
    elif previous not in ("completed", "foreign") and _stored_digest(str(attrs.get("config", ""))) == digest:
        pass  # an unfinished run of the same experiment: resumed or restarted
    elif previous != "foreign" and (read := _read_changed(str(attrs.get("config", "")), cfg, path)):
        why = read  # names the key a component reads (e.g. rounds under privacy.epsilon)
    elif previous == "completed":
        why = (f"{path}: holds a completed run; use --overwrite to replace it, or another output path (a larger "
               f"rounds extends it)")
    elif previous == "foreign":
        why = f"{path}: exists and is not a fedmpi result file; refusing to overwrite it (--overwrite to replace it)"
    else:
        why = (f"{path}: holds an unfinished ({previous}) run of another experiment"
               f"{_another_experiment(str(attrs.get('config', '')), cfg)}; use --overwrite to replace it, "
               f"or another output path")
    if why is not None:
        os.close(fd)
        raise InputError(why)
    return Claim(path, fd, created, previous, overwrite)


# ----------------------------------------------------------------------------- disk space

_KEEP_SIZE, _PUNCH_HOLE = 1, 2  # fallocate modes (linux/falloc.h)
_libc: Any = None


def _fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """Linux ``fallocate(fd, mode, offset, length)``; OSError(EOPNOTSUPP) elsewhere."""
    global _libc
    import ctypes
    import ctypes.util

    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fn = getattr(_libc, "fallocate", None)
    if fn is None:
        raise OSError(errno.EOPNOTSUPP, "no fallocate")
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if fn(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def reserve(fd: int, nbytes: int) -> None:
    """Make sure ``nbytes`` can be written past the end of the file open on ``fd``: within this
    process's file size limit (``ulimit -f``, which fallocate does not check), and allocated there
    without changing its size, or (file systems without fallocate) free on the device. OSError
    (ENOSPC, or EFBIG over the limit) when they cannot."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and os.fstat(fd).st_size + nbytes > limit:
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    try:
        _fallocate(fd, _KEEP_SIZE, os.fstat(fd).st_size, nbytes)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        st = os.fstatvfs(fd)
        if st.f_bavail * st.f_frsize < nbytes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from None


def unreserve(fd: int) -> None:
    """Give back what :func:`reserve` left allocated past the end of the file (best effort)."""
    try:
        _fallocate(fd, _KEEP_SIZE | _PUNCH_HOLE, os.fstat(fd).st_size, 1 << 40)
    except OSError:
        pass


# ----------------------------------------------------------------------------- writing

class ResultWriter:
    """Append-only writer of one run's result file (rank 0), on a path it has claimed.

    Rows (:meth:`append`, :meth:`append_mask`) are buffered and written at most every
    ``flush_s`` seconds, and always by :meth:`flush` (checkpoints) and :meth:`finish`."""

    def __init__(self, path: str, config_yaml: str, seed: int, world_size: int, metrics: list[str],
                 m: int, log_mask: bool, resume_at: int | None = None, claim_: Claim | None = None,
                 flush_s: float = 0.0, client_arrays: Iterable[str] = (), notes: dict[str, Any] | None = None,
                 rows_through: int | None = None, round_series: Iterable[str] | dict[str, Any] = (),
                 events: bool = False):
        """``resume_at``: continue the file after a checkpoint of that round (rows after
        ``rows_through``, default ``resume_at``, are dropped), with this run's config stored.
        ``round_series``: datasets of one entry per round run (``append_round``), by name: a
        number, or a row whose width the value gives. ``events``: the clock's ``/events`` table."""
        self.path = path
        self.notes = dict(notes or {})  # root attributes, written at every flush
        self.claim = claim_
        self.flush_s = flush_s
        self._rows: list[dict[str, float]] = []
        self._mask_rows: list[np.ndarray] = []
        self._client_rows: list[dict[str, np.ndarray]] = []
        # per-round numbers (/privacy/noise_multiplier) or rows (/client_rounds/<name>): name -> row width (0: a number)
        series = round_series if isinstance(round_series, dict) else dict.fromkeys(round_series, 0.0)
        self._widths = {name: int(np.size(v)) if np.ndim(v) else 0 for name, v in series.items()}
        self._series = {name: [] for name in self._widths}
        self._events: list[dict[str, np.ndarray]] | None = [] if events else None  # the clock's /events
        self._rounds_done = resume_at or 0
        self._last_flush = time.monotonic()
        self.sidecars: list = []
        self._broken = False  # a write failed inside HDF5: the file is not touched again
        if resume_at is not None:
            self._reopen(resume_at, world_size, resume_at if rows_through is None else rows_through)
            self._resumed_as(config_yaml, metrics, m, client_arrays, log_mask)
            return
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # for reserving space
        except OSError as e:
            raise InputError(f"{path}: cannot write the result file ({e.strerror or e})") from None
        try:
            self._create(config_yaml, seed, world_size, metrics, m, log_mask, client_arrays, events)
        except (OSError, RuntimeError, ValueError) as e:  # no space (or another I/O error) while creating it
            self._discard()
            raise self._set_up_failed(e) from None

    def _create(self, config_yaml: str, seed: int, world_size: int, metrics: list[str], m: int, log_mask: bool,
                client_arrays: Iterable[str], events: bool) -> None:
        """A new file with its root attributes and empty datasets, in space reserved first."""
        reserve(self._fd, 2 * _CLOSE_MARGIN)  # before HDF5 writes a byte: a full disk leaves the file as it was
        self.f = h5py.File(self.path, "w", locking=False)  # the claim's flock guards the file; HDF5's would conflict
        self.f.attrs["config"] = config_yaml
        self.f.attrs["fedmpi_version"] = __version__
        self.f.attrs["world_size"] = world_size
        self.f.attrs["seed"] = seed
        self.f.attrs["status"] = "running"
        self.f.attrs["rounds_done"] = 0
        g = self.f.create_group("metrics")
        self.names = ["round"] + [n for n in metrics if n != "round"]
        for n in self.names:
            g.create_dataset(n, shape=(0,), maxshape=(None,), chunks=(1024,),
                             dtype=np.int64 if n == "round" else np.float64)
        for n in client_arrays:
            self.f.create_dataset(f"clients/{n}", shape=(0, m), maxshape=(None, m), chunks=_client_chunks(m),
                                  dtype=np.float64)
        for name in self._series:
            self.f.create_dataset(name, **self._series_layout(name), shape=(0, *self._row(name)))
        if events:
            g = self.f.create_group("events")
            g.attrs["outcomes"] = ",".join(OUTCOMES)
            for n, dtype in EVENT_COLUMNS.items():
                g.create_dataset(n, shape=(0,), maxshape=(None,), chunks=(4096,), dtype=dtype)
        self.mask = None
        if log_mask:
            self.mask = self.f.create_dataset("availability/mask", shape=(0, m), maxshape=(None, m),
                                              chunks=(max(1, min(64, 2**20 // max(m, 1))), min(m, 2**20)),
                                              dtype=np.uint8, compression="gzip", compression_opts=1)
        self.f.flush()

    def _set_up_failed(self, e: BaseException) -> WriteFailed:
        """A write of the set-up failed (exit 1, as a full disk later on): nothing was run."""
        return WriteFailed(f"{self.path}: cannot write the result file ({_short(e)}); nothing was run, run the same "
                           f"command again once there is space")

    def _discard(self) -> None:
        """After a failed creation: nothing of it stays (an empty file, which the same command
        claims again; the run's set-up removes it when its claim created it). Not a stub that
        every later run would refuse as not a fedmpi result file."""
        f = getattr(self, "f", None)
        if f is not None:
            try:
                f.close()
            except Exception:  # closing a file HDF5 could not write may fail too: it is emptied below
                pass
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        unreserve(self._fd)
        os.close(self._fd)

    def _reopen(self, rounds_done: int, world_size: int, rows_through: int) -> None:
        """Continue a file after a checkpoint: drop rows of rounds after ``rows_through``."""
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            reserve(self._fd, 2 * _CLOSE_MARGIN)
            self.f = h5py.File(self.path, "a", locking=False)
            g = self.f["metrics"]
            self.names = ["round"] + [n for n in g if n != "round"]
            keep = int(np.searchsorted(g["round"][:], rows_through, side="right"))
        except (OSError, KeyError, RuntimeError) as e:
            raise InputError(f"{self.path}: cannot continue this result file ({_short(e)}); free space, "
                             f"or start afresh with --overwrite") from None
        try:
            for n in self.names:
                g[n].resize((keep,))
            for ds in self._client_sets():
                ds.resize((min(keep, ds.shape[0]), ds.shape[1]))
        except (OSError, RuntimeError, ValueError) as e:
            raise InputError(f"{self.path}: /metrics is damaged ({_short(e)}); this file cannot be continued: "
                             f"--overwrite starts afresh") from None
        for name in self._series:  # one value per round run: those after the checkpoint go
            ds = self.f.get(name)
            if ds is None:  # a file from before the series existed: its rounds were not recorded
                ds = self.f.create_dataset(name, data=np.full((rounds_done, *self._row(name)), np.nan),
                                           **self._series_layout(name))
            if ds.shape[0] < rounds_done:
                raise InputError(f"{self.path}: holds {ds.shape[0]} rows of /{name}, fewer than the checkpoint's "
                                 f"{rounds_done} rounds; --overwrite starts afresh")
            ds.resize((rounds_done, *self._row(name)))
        if self._events is not None:  # the events of rounds after the checkpoint go
            g = self.f.get("events")
            if g is None or "round" not in g:
                raise InputError(f"{self.path}: has no /events to continue; --overwrite starts afresh")
            keep_events = int(np.searchsorted(g["round"][:], rounds_done, side="right"))
            for ds in g.values():
                ds.resize((keep_events,))
        self.mask = self.f.get("availability/mask")
        if self.mask is not None:
            if self.mask.shape[0] < rounds_done:
                raise InputError(f"{self.path}: holds {self.mask.shape[0]} rows of /availability/mask, "
                                 f"fewer than the checkpoint's {rounds_done} rounds")
            damaged = _first_unreadable_row(self.mask, rounds_done)
            try:
                if damaged is None:
                    self.mask.resize((rounds_done, self.mask.shape[1]))
            except (OSError, RuntimeError, ValueError):
                damaged = rounds_done
            if damaged is not None:
                raise InputError(f"{self.path}: /availability/mask is damaged from row {damaged} (an earlier "
                                 f"write failed); this file cannot be continued: --overwrite starts afresh")
        if "final" in self.f:
            del self.f["final"]
        self.f.attrs["status"] = "running"
        self.f.attrs["rounds_done"] = rounds_done
        self.f.attrs["world_size"] = world_size
        self.f.flush()

    def _resumed_as(self, config_yaml: str, metrics: list[str], m: int, client_arrays: Iterable[str],
                    log_mask: bool) -> None:
        """A continued file takes the resumed run's config (what takes effect from now on), and its
        metrics and per-client arrays that the file lacks, NaN in the rows before (not evaluated
        then). The participation mask cannot be made up for the rounds run: it must be logged
        from round 1 on or not at all (InputError naming runtime.log_availability)."""
        rounds = int(self.f.attrs.get("rounds_done", 0))
        if log_mask != (self.mask is not None):
            now, then = ("asks for", "has none") if log_mask else ("does not ask for", "holds one")
            raise InputError(f"runtime.log_availability: this run {now} the participation mask, but the result "
                             f"file it continues (after round {rounds}) {then}; keep the setting of its first "
                             f"start, or start afresh with --overwrite")
        g, n = self.f["metrics"], self.f["metrics/round"].shape[0]
        for name in metrics:
            if name not in g:
                g.create_dataset(name, data=np.full(n, np.nan), maxshape=(None,), chunks=(1024,))
                self.names.append(name)
        for name in client_arrays:
            if f"clients/{name}" not in self.f:
                self.f.create_dataset(f"clients/{name}", data=np.full((n, m), np.nan), maxshape=(None, m),
                                      chunks=_client_chunks(m))
        self.f.attrs["config"] = config_yaml
        self.f.flush()

    def _row(self, name: str) -> tuple[int, ...]:
        """The shape of one round's entry of series ``name``: () for a number, (m,) for a row."""
        return (self._widths[name],) if self._widths[name] else ()

    def _series_layout(self, name: str) -> dict[str, Any]:
        """Dataset keywords of series ``name``: resizable along the rounds, float64."""
        w = self._widths[name]
        if not w:
            return {"maxshape": (None,), "chunks": (1024,), "dtype": np.float64}
        return {"maxshape": (None, w), "chunks": _client_chunks(w), "dtype": np.float64}

    def _client_sets(self) -> list[h5py.Dataset]:
        return list(self.f["clients"].values()) if "clients" in self.f else []

    def rows(self) -> dict[str, np.ndarray]:
        """The metric rows in the file plus the buffered ones (e.g. to rebuild a sidecar on resume)."""
        g = self.f["metrics"]
        n = g["round"].shape[0]
        return {k: np.concatenate([g[k][:n], np.array([r.get(k, np.nan) for r in self._rows])]) for k in self.names}

    def add_sidecars(self, sidecars: list) -> None:
        """Also send every row to these (``results.sidecars``), starting from the rows kept so far."""
        for s in sidecars:
            s.start(self.names, self.rows())
            self.sidecars.append(s)

    def append(self, row: dict[str, float], rounds_done: int, clients: dict[str, np.ndarray] | None = None) -> None:
        """Add one evaluation row (a declared metric missing from it is stored as NaN), with its
        per-client values for the file's ``/clients`` arrays (missing: NaN)."""
        self._rows.append({k: row.get(k, np.nan) for k in self.names})
        if "clients" in self.f:
            m = lambda ds: np.full(ds.shape[1], np.nan)  # noqa: E731
            self._client_rows.append({k: np.asarray((clients or {}).get(k, m(ds)), dtype=np.float64)
                                      for k, ds in self.f["clients"].items()})
        for s in self.sidecars:
            s.row(self._rows[-1])
        self._rounds_done = rounds_done
        self._maybe_flush()

    def append_mask(self, ids: np.ndarray) -> None:
        """Add one round of the participation mask (clients ``ids`` trained)."""
        if self.mask is None:
            return
        row = np.zeros(self.mask.shape[1], dtype=np.uint8)
        row[np.asarray(ids, dtype=np.int64)] = 1
        self._mask_rows.append(row)
        if len(self._mask_rows) * row.nbytes >= _MASK_BUFFER_BYTES:
            self.flush()
        else:
            self._maybe_flush()

    def append_round(self, values: dict[str, Any]) -> None:
        """Add one round's value (a number, or a row of m) to each per-round dataset (``round_series``)."""
        for name, value in values.items():
            self._series[name].append(value)

    def append_events(self, events: dict[str, np.ndarray]) -> None:
        """Add the clock's events of one round (``fedmpi.clock.events``: {column: array})."""
        if self._events is not None and len(events["round"]):
            self._events.append(events)

    def _maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= self.flush_s:
            self.flush()

    def _flush_bytes(self) -> int:
        """A bound on what the next flush can add to the file: the chunks its rows start (metric
        chunks are allocated whole) or rewrite (a compressed mask chunk may move when it grows),
        and metadata."""
        need = _FLUSH_BASE
        n = self.f["metrics/round"].shape[0]
        if self._rows:
            new_chunks = -(-(n + len(self._rows)) // 1024) - -(-n // 1024)
            need += len(self.names) * new_chunks * 8 * 1024
            need += sum(2 * ds.chunks[0] * ds.chunks[1] * 8 + len(self._rows) * ds.shape[1] * 8
                        for ds in self._client_sets())
        for name, rows in self._series.items():  # new chunks each, and the rows
            if rows:
                w = max(self._widths[name], 1)
                need += 2 * 8 * (1024 if not self._widths[name] else self.f[name].chunks[0] * min(w, 2**17))
                need += 8 * w * len(rows)
        if self._events:
            n = sum(len(e["round"]) for e in self._events)
            need += 7 * (2 * 8 * 4096 + n * 8)
        if self._mask_rows:
            (rows, cols), n = self.mask.chunks, self.mask.shape[0]
            touched = -(-(n + len(self._mask_rows)) // rows) - n // rows
            need += touched * -(-self.mask.shape[1] // cols) * (rows * cols * 101 // 100 + 4096)
        return need

    def _write_failed(self, e: BaseException, broken: bool) -> WriteFailed:
        self._broken = self._broken or broken
        return WriteFailed(f"{self.path}: cannot write the result file ({_short(e)}); it keeps the rows up to "
                           f"its last flush: free space and run the same command to resume from the last checkpoint")

    def flush(self, extra_bytes: int = 0) -> None:
        """Write the buffered rows and push everything to the file (then it is complete on disk).
        WriteFailed, before anything is written, when the space for it cannot be reserved."""
        if self._broken:
            raise self._write_failed(OSError("an earlier write failed"), True)
        try:
            reserve(self._fd, self._flush_bytes() + extra_bytes + _CLOSE_MARGIN)
        except OSError as e:
            raise self._write_failed(e, False) from None
        try:
            self._write_buffered()
        except (OSError, RuntimeError, ValueError) as e:
            raise self._write_failed(e, True) from None
        try:  # a flush that grew the file (HDF5 metadata) used part of what was reserved: keep the least
            reserve(self._fd, _FLUSH_BASE + _CLOSE_MARGIN)  # any next flush needs, while there is space
        except OSError:
            pass  # the disk is full: the next flush says so, before it writes anything
        self._last_flush = time.monotonic()

    def _write_buffered(self) -> None:
        if self._rows:
            g = self.f["metrics"]
            n, k = g["round"].shape[0], len(self._rows)
            for name in self.names:
                ds = g[name]
                ds.resize((n + k,))
                ds[n:] = np.array([r[name] for r in self._rows], dtype=ds.dtype)
            self._rows.clear()
        for k, ds in (self.f["clients"].items() if self._client_rows else ()):
            n = ds.shape[0]
            ds.resize((n + len(self._client_rows), ds.shape[1]))
            ds[n:] = np.stack([r[k] for r in self._client_rows])
        self._client_rows.clear()
        for name, rows in self._series.items():
            if rows:
                ds = self.f[name]
                n = ds.shape[0]
                ds.resize((n + len(rows), *self._row(name)))
                ds[n:] = np.asarray(rows, dtype=np.float64)
                rows.clear()
        if self._events:
            for name, ds in self.f["events"].items():
                rows = np.concatenate([e[name] for e in self._events])
                n = ds.shape[0]
                ds.resize((n + len(rows),))
                ds[n:] = rows
            self._events.clear()
        if self._mask_rows:
            n, k = self.mask.shape[0], len(self._mask_rows)
            self.mask.resize((n + k, self.mask.shape[1]))
            self.mask[n:] = np.stack(self._mask_rows)
            self._mask_rows.clear()
        self.f.attrs["rounds_done"] = self._rounds_done
        for k, v in self.notes.items():
            self.f.attrs[k] = v
        self.f.flush()

    def write_group(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        """A static group (e.g. /partition, /topology), written once."""
        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        try:
            reserve(self._fd, sum(a.nbytes for a in arrays.values()) + (64 << 10) + _CLOSE_MARGIN)
        except OSError as e:  # set-up: nothing has run yet (the file is then marked failed)
            raise self._set_up_failed(e) from None
        g = self.f.require_group(name)
        for k, v in arrays.items():
            g.create_dataset(k, data=v)
        self.f.flush()

    def finish(self, status: str, final_params: np.ndarray | None = None, rounds_done: int | None = None) -> None:
        """Write what is buffered, the final model and ``status``; close and release the claim.
        When the rows cannot be written, the file is marked as of its last flush (``failed``
        instead of ``completed``, then WriteFailed), in the space kept reserved for that."""
        try:
            if rounds_done is not None:
                self._rounds_done = rounds_done
            params = None if final_params is None else np.asarray(final_params, dtype=np.float32)
            try:
                self.flush(extra_bytes=0 if params is None else params.nbytes + (64 << 10))
            except WriteFailed:  # mark the file as of its last flush (in the space kept for it)
                if not self._broken:
                    self.f.attrs["status"] = "failed" if status == "completed" else status
                    self.f.close()
                if status == "completed":
                    raise
                return  # another error ended the run: that one is reported
            if params is not None:
                self.f.create_dataset("final/params", data=params)
            self.f.attrs["status"] = status
            self.f.flush()
            self.f.close()
        finally:
            for s in self.sidecars:
                s.close(status)  # (a tracker's run ends as the run did)
            if self.claim is not None:
                self.claim.release()
            unreserve(self._fd)
            os.close(self._fd)


def _short(e: BaseException) -> str:
    """An OSError's reason, or of an HDF5 error (they run over several lines) the system's reason
    it gives (``error message = '...'``), else its first line."""
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    said = re.search(r"error message = '([^']+)'", text)
    return said.group(1) if said else text.splitlines()[0][:160]


def _client_chunks(m: int) -> tuple[int, int]:
    """Chunks of a (evaluations x m) ``/clients`` array: at most 2^17 values of a row, 64 rows."""
    return max(1, min(64, 2**17 // max(m, 1))), min(m, 2**17)


def _first_unreadable_row(ds: h5py.Dataset, stop: int) -> int | None:
    """The first row before ``stop`` whose chunk no longer decodes (None: all read)."""
    step = ds.chunks[0] if ds.chunks else 1024
    for lo in range(0, min(stop, ds.shape[0]), step):
        try:
            ds[lo:lo + step]
        except (OSError, RuntimeError, ValueError):
            return lo
    return None


# ----------------------------------------------------------------------------- reading

def open_result(path: str) -> h5py.File:
    """Open a result file for reading, also while a run is writing it (no file lock)."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such result file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected a result file")
    if not os.path.isfile(path):  # a FIFO would block the reader forever
        raise InputError(f"{path}: is not a regular file, expected a result file")
    for attempt in range(3):  # a running writer may be mid-flush: look again shortly
        try:
            f = h5py.File(path, "r", locking=False)
            break
        except READ_ERRORS:
            if attempt == 2:
                raise InputError(f"{path}: not a readable HDF5 result file") from None
            time.sleep(0.2)
    try:
        ours = "metrics" in f and "status" in f.attrs and "round" in f["metrics"]
    except READ_ERRORS as e:
        f.close()
        raise damaged(path, "/metrics", e) from None
    if not ours:
        f.close()
        raise InputError(f"{path}: not a fedmpi result file (no /metrics or status)")
    return f


def damaged(path: str, part: str, e: BaseException | None = None) -> InputError:
    """The one-line error of a result file whose ``part`` cannot be read."""
    why = f": {e.__class__.__name__}: {_short(e)[:80]}" if e is not None else ""
    return InputError(f"{path}: damaged result file ({part}{why})")


def read_metrics(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """All metric arrays (cut to the length of ``round``) and the root attributes.

    A damaged file (unreadable blocks, a metric that is not a 1-D numeric dataset, rounds that
    are not integers, odd attributes) is an ``InputError`` naming the file and the part, never
    a traceback."""
    with open_result(path) as f:
        try:
            g = f["metrics"]
            if not isinstance(g, h5py.Group) or not isinstance(g.get("round"), h5py.Dataset):
                raise InputError(f"{path}: damaged result file (/metrics/round is missing)")
            for k in g:
                ds = g[k]
                if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype.kind not in "iuf":
                    raise InputError(f"{path}: damaged result file (/metrics/{k} is not a 1-D numeric dataset)")
            if g["round"].dtype.kind not in "iu":
                raise InputError(f"{path}: damaged result file (/metrics/round does not hold integers)")
            n = g["round"].shape[0]
            metrics = {k: g[k][: n] for k in g if g[k].shape[0] >= n}
            attrs = {k: _attr(v) for k, v in f.attrs.items()}
        except READ_ERRORS as e:
            raise damaged(path, "/metrics", e) from None
    return metrics, attrs


def read_arrays(path: str, group: str) -> dict[str, np.ndarray]:
    """Every dataset below ``/group`` of a result file (dotted sub-paths for nested groups), read
    whole; {} when the file has no such group. Damage is an InputError naming the dataset."""
    out: dict[str, np.ndarray] = {}
    with open_result(path) as f:
        try:
            g = f.get(group)
        except READ_ERRORS as e:
            raise damaged(path, f"/{group}", e) from None
        if g is None:
            return out
        if isinstance(g, h5py.Dataset):
            raise InputError(f"{path}: damaged result file (/{group} is a dataset, expected a group)")
        names: list[str] = []
        try:
            g.visit(names.append)
        except READ_ERRORS as e:
            raise damaged(path, f"/{group}", e) from None
        for name in names:
            try:
                ds = g[name]
                if isinstance(ds, h5py.Dataset):
                    if ds.dtype.kind not in "biuf":
                        raise InputError(f"{path}: damaged result file (/{group}/{name} is not numeric)")
                    out[name.replace("/", ".")] = ds[()]
            except READ_ERRORS as e:
                raise damaged(path, f"/{group}/{name}", e) from None
    return out


def _attr(v: Any) -> Any:
    """An attribute as text or a Python scalar (bytes decoded; odd values shown, not trusted)."""
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, str):  # h5py hands undecodable bytes over as surrogates, which no encoder takes
        return v.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
    if isinstance(v, np.generic):
        return v.item() if not isinstance(v, np.void) else repr(v)[:80]
    return v if isinstance(v, (int, float)) else repr(v)[:80]
