"""Availability replayed from a file (``availability.kind: trace``).

``availability.trace`` is the path (relative to the working directory);
``availability.trace_format`` one of:

- ``ids``: text, one line per round listing the available client ids, separated by whitespace
  and/or commas; an empty line means nobody is available that round.
- ``matrix``: a 0/1 matrix of rounds x m, as text (one row per line, whitespace/comma separated,
  blank lines ignored) or a ``.npy`` array.
- ``intervals``: on/off availability per client, as JSON ``{"<client id>": [[start, end], ...], ...}``
  of half-open round intervals [start, end) in which the client is available; the trace lasts
  until the last end and wraps around as a whole. A client may instead map to FedScale's
  behaviour-trace layout ``{"active": [...], "inactive": [...], "finish_time": F}``, replayed as
  FedScale replays it: the k-th interval is the *closed* [active[k], inactive[k]], and the client's
  own trace wraps at its own ``finish_time`` (client available at t when t mod F lies in one of its
  intervals; docs/TRACES.md); an unmatched last ``active`` stays on until the wrap; without
  ``finish_time`` the client wraps with the trace. FedScale's pickle of that layout is read with a
  restricted unpickler that admits only plain containers, numbers and strings (any class, numpy
  included, is refused). Times are taken as round indices (FedScale records seconds: replay them
  in virtual seconds with ``clock.slot: 1``, ``fedmpi.clock.availability``). Clients absent from
  the file are never available; a client named twice (``"1"`` and ``"01"``) is refused. The trace
  lasts max(end, inactive + 1, finish_time, open start + 1) rounds.
- ``auto`` (default): ``.npy`` (or numpy magic) -> matrix; ``.json``/``.pkl``/``.pickle``, a
  pickle, or text starting with ``{`` -> intervals; text whose every non-blank line has exactly
  m tokens of 0/1 -> matrix (refused as ambiguous when m <= 2); other text -> ids.

``availability.schedule`` gives the same rounds inline in the config: a list with one list per
round, each either the available client ids or (``trace_format: matrix``, or ``auto`` when every
row has m entries of 0/1 and m > 2) a 0/1 row; a string there is read as a trace path. Under
``auto`` one id list among the rows makes every row an id list.

A trace shorter than the run is refused (exit 2) unless ``availability.trace_repeat: true``;
then rounds beyond the trace's length wrap around: round t replays round t mod length (a
FedScale client with its own ``finish_time`` wraps at it, always).
docs/TRACES.md shows each format with an example.
Limits: a text, JSON or pickle trace file is at most ``MAX_TRACE_BYTES`` (checked before reading;
``.npy`` matrices are not limited), JSON nests at most ``yamlio.MAX_DEPTH`` levels, and every
client id is checked against [0, m) before it becomes a 64-bit integer.
Every problem raises a one-line ``InputError`` starting with ``availability.trace: <path>:``
(``availability.schedule:`` for inline rounds).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Union

import numpy as np

from .. import safepickle, yamlio
from ..errors import InputError
from ..inputs import open_input
from ..schema import Reads, opt
from .base import AvailabilityParams, ClientInfo, Participation, Sampling, _Support, register

_KEY = "availability.trace"
MAX_TRACE_BYTES = 1 << 30


class Trace(Participation):
    """Replays ``lookup(t)`` (the sorted ids available in round t, whatever t: the trace wraps
    itself); ``length``: the rounds of one pass (checked against the run's); ``mean()``: the mean
    participations per round (the expected cohort)."""

    configuration = ("_lookup", "length", "_mean")

    def __init__(self, m: int, seed: int, lookup: Callable[[int], np.ndarray], length: int,
                 mean: Callable[[], float]):
        super().__init__(m, seed)
        if length < 1:
            raise ValueError("a trace needs at least one round")
        self._lookup, self.length, self._mean = lookup, int(length), mean

    @classmethod
    def from_rounds(cls, m: int, seed: int, rounds: list[np.ndarray]) -> "Trace":
        """From one sorted id array per round; round t replays ``rounds[t mod len(rounds)]``."""
        return cls(m, seed, lambda t: rounds[t % len(rounds)], len(rounds),
                   lambda: sum(len(r) for r in rounds) / len(rounds))

    @classmethod
    def from_intervals(cls, m: int, seed: int, iv: np.ndarray, length: int) -> "Trace":
        """From (n, 4) rows (client, start, end, period): the client is available in round t when
        start <= t mod period < end."""
        def lookup(t: int) -> np.ndarray:
            phase = t % iv[:, 3]
            return np.unique(iv[(iv[:, 1] <= phase) & (phase < iv[:, 2]), 0])

        return cls(m, seed, lookup, length, lambda: _mean_cohort(iv))

    def available(self, t: int) -> np.ndarray:
        return self._lookup(t)

    def sampling(self, rounds: int) -> Sampling:
        """A public, replayed pattern: nothing to amplify. n~ = the mean participations per round
        (``mean``); the separation and the most participations of any client are measured over the
        run's ``rounds`` rounds (O(rounds x cohort), once)."""
        support = _Support(self.m)
        for t in range(rounds):
            support.add(t, self.available(t))
        most = int(support.count.max(initial=0))
        return Sampling("none", self._mean(), separation=support.separation(none=max(rounds, 1)),
                        separation_key=_KEY, counted=(rounds, most))


def _mean_cohort(iv: np.ndarray) -> float:
    """The mean participations per round of (client, start, end, period) rows: each client's
    rounds covered in one of its periods (overlaps counted once) over its period, summed."""
    total = 0.0
    rows = iv[np.lexsort((iv[:, 1], iv[:, 0]))]
    client, reach, covered, period = -1, 0, 0, 1
    for c, a, b, p in rows.tolist():
        if c != client:
            total += covered / period
            client, reach, covered, period = c, 0, 0, p
        a, b = max(a, reach), min(b, p)
        if b > a:
            covered, reach = covered + b - a, b
    return total + covered / period


# ----------------------------------------------------------------------------- parsing

class _Fail(Exception):
    """A parse problem; turned into one InputError line naming the file."""


def _ids_from_tokens(tokens: list[str], m: int, where: str) -> np.ndarray:
    try:
        ids = [int(x) for x in tokens]
    except ValueError:
        raise _Fail(f"{where}: expected integer client ids, got {' '.join(tokens)[:60]!r}") from None
    bad = next((i for i in ids if not 0 <= i < m), None)  # before numpy: 10**23 does not fit int64
    if bad is not None:
        raise _Fail(f"{where}: client id {str(bad)[:30]} outside [0, {m}) (task.clients = {m})")
    return np.unique(np.array(ids, dtype=np.int64))


def _tokens(line: str) -> list[str]:
    return line.replace(",", " ").split()


def parse_ids(text: str, m: int) -> list[np.ndarray]:
    """One sorted id array per line of ``text``."""
    return [_ids_from_tokens(_tokens(line), m, f"line {i + 1}") for i, line in enumerate(text.splitlines())]


def _check_matrix(a: np.ndarray, m: int) -> list[np.ndarray]:
    if a.ndim != 2 or a.shape[0] == 0:
        raise _Fail(f"expected a 2-D 0/1 matrix (rounds x {m}), got shape {a.shape}")
    if a.shape[1] != m:
        raise _Fail(f"matrix has {a.shape[1]} columns, expected task.clients = {m} (one per client)")
    if a.dtype != bool and not np.isin(a, (0, 1)).all():
        raise _Fail("matrix entries must be 0 or 1")
    return [np.flatnonzero(row) for row in a]


def _zero_one_rows(rows: list[tuple[str, list[int]]], m: int) -> list[np.ndarray]:
    """(where, row) pairs of a 0/1 matrix -> available ids per row; errors name the row."""
    for where, row in rows:
        if len(row) != m:
            raise _Fail(f"{where}: matrix row has {len(row)} entries, expected task.clients = {m}")
        if not set(row) <= {0, 1}:
            raise _Fail(f"{where}: matrix entries must be 0 or 1")
    return _check_matrix(np.array([row for _, row in rows], dtype=np.int64).reshape(-1, m), m)


def parse_matrix_text(text: str, m: int) -> list[np.ndarray]:
    """A 0/1 text matrix, one row per non-blank line."""
    bit = {"0": 0, "1": 1}  # any other token (e.g. "01", "+1") is refused, as -1
    return _zero_one_rows([(f"line {i + 1}", [bit.get(x, -1) for x in _tokens(line)])
                           for i, line in enumerate(text.splitlines()) if line.strip()], m)


def _unpickle(data: bytes) -> Any:
    try:
        return safepickle.load(data)  # plain containers, numbers and strings only
    except Exception as e:  # untrusted bytes: any failure is a malformed file
        raise _Fail(f"unreadable pickle ({e.__class__.__name__}: {str(e)[:80]})") from None


def _as_round(x: Any, what: str) -> int:
    integral = isinstance(x, int) or (isinstance(x, float) and x.is_integer())
    if isinstance(x, bool) or not integral or abs(x) >= 2**62:
        raise _Fail(f"{what}: expected an integer round, got {x!r}")
    if x < 0:
        raise _Fail(f"{what}: rounds must be >= 0, got {x!r}")
    return int(x)


def _fedscale_client(c: int, spec: dict) -> tuple[list[tuple[int, int]], Optional[int], Optional[int]]:
    """A client in FedScale's layout: its closed intervals as half-open [start, end) rows, its
    ``finish_time`` (None: it wraps with the trace) and the start of an unmatched last ``active``
    (None: none)."""
    on, off = spec.get("active", []), spec.get("inactive", [])
    if not (isinstance(on, (list, tuple)) and isinstance(off, (list, tuple))) or len(off) not in (len(on), len(on) - 1):
        raise _Fail(f"client {c}: 'active'/'inactive' must be lists with len(inactive) in "
                    f"(len(active), len(active) - 1)")
    finish = _as_round(spec["finish_time"], f"client {c} finish_time") if "finish_time" in spec else None
    if finish == 0:
        raise _Fail(f"client {c}: finish_time must be >= 1 (the trace wraps at it)")
    rows = []
    for a, b in zip(on, off):
        a, b = _as_round(a, f"client {c}"), _as_round(b, f"client {c}")
        if b < a:
            raise _Fail(f"client {c}: interval [{a}, {b}] ends before it starts")
        rows.append((a, b + 1))  # closed: available at b too
    open_start = _as_round(on[-1], f"client {c}") if len(on) > len(off) else None
    for a in [r[0] for r in rows] + ([open_start] if open_start is not None else []):
        if finish is not None and a >= finish:
            raise _Fail(f"client {c}: active {a} is at or after its finish_time {finish}, where its trace "
                        f"wraps: never reached")
    return rows, finish, open_start


def parse_intervals(obj: Any, m: int) -> tuple[np.ndarray, int]:
    """(client, start, end, period) rows (available when start <= t mod period < end) and the
    trace's length from the intervals mapping."""
    if not isinstance(obj, dict):
        raise _Fail('expected a mapping {"<client id>": [[start, end], ...]}')
    rows, length, seen = [], 0, {}
    for key, spec in obj.items():
        try:
            c = int(key)
        except (TypeError, ValueError):
            raise _Fail(f"key {key!r}: expected an integer client id") from None
        if not 0 <= c < m:
            raise _Fail(f"client id {str(c)[:30]} outside [0, {m}) (task.clients = {m})")
        if c in seen:
            raise _Fail(f"client {c} is given twice (keys {seen[c]!r} and {key!r})")
        seen[c] = key
        if isinstance(spec, dict):  # FedScale's layout: closed intervals, wrapping at the client's finish_time
            pairs, finish, open_start = _fedscale_client(c, spec)
            ends = [b for _, b in pairs] + ([open_start + 1] if open_start is not None else [])
            length = max([length, finish or 0] + ends)
            period = finish or 0  # 0: the trace's length, known at the end
            rows += [(c, a, b, period) for a, b in pairs]
            if open_start is not None:
                rows.append((c, open_start, -1, period))  # on until the wrap (end filled in below)
            continue
        if not isinstance(spec, (list, tuple)):
            raise _Fail(f"client {c}: expected a list of [start, end] pairs")
        for pair in spec:
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise _Fail(f"client {c}: expected [start, end] pairs, got {pair!r}")
            s, e = (_as_round(x, f"client {c}") for x in pair)
            if e < s:
                raise _Fail(f"client {c}: interval [{s}, {e}) ends before it starts")
            rows.append((c, s, e, 0))
            length = max(length, e)
    if length < 1:
        raise _Fail("no availability interval: the trace has no rounds")
    iv = np.array(rows, dtype=np.int64).reshape(-1, 4)
    iv[iv[:, 3] == 0, 3] = length
    iv[iv[:, 2] == -1, 2] = iv[iv[:, 2] == -1, 3]
    return iv, length


def _guess(path: str, data: bytes, m: int) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npy" or data.startswith(b"\x93NUMPY"):
        return "matrix"
    if ext in (".json", ".pkl", ".pickle") or data.lstrip().startswith(b"{") or data.startswith(b"\x80"):
        return "intervals"
    lines = [tok for tok in map(_tokens, data.decode("utf-8", errors="replace").splitlines()) if tok]
    if lines and all(len(tok) == m and set(tok) <= {"0", "1"} for tok in lines):
        if m <= 2:
            raise _Fail(f"cannot tell a 0/1 matrix from id lists with task.clients = {m}; "
                        f"set availability.trace_format to ids or matrix")
        return "matrix"
    return "ids"


def load_trace(path: str, fmt: str, m: int, seed: int = 0) -> Trace:
    """Read and validate a trace file; InputError ``availability.trace: <path>: ...`` on any problem."""
    try:
        with open_input(path, "trace", _KEY) as fh:
            npy = fh.read(6) == b"\x93NUMPY" or path.lower().endswith(".npy")
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_TRACE_BYTES and not npy:
                raise InputError(f"{_KEY}: {path}: {size / 2**20:.0f} MiB, more than the "
                                 f"{MAX_TRACE_BYTES >> 20} MiB a text, JSON or pickle trace may have")
            fh.seek(0)
            data = fh.read()
    except FileNotFoundError:
        raise InputError(f"{_KEY}: {path}: file not found "
                         f"(expected a trace: id lists, 0/1 matrix or intervals)") from None
    except OSError as e:
        raise InputError(f"{_KEY}: {path}: cannot read ({e.__class__.__name__})") from None
    try:
        fmt = _guess(path, data, m) if fmt == "auto" else fmt
        binary = data.startswith((b"\x93NUMPY", b"\x80"))
        if fmt == "matrix" and data.startswith(b"\x93NUMPY"):
            return Trace.from_rounds(m, seed, _check_matrix(np.load(io.BytesIO(data), allow_pickle=False), m))
        if fmt == "intervals":
            obj = _unpickle(data) if data.startswith(b"\x80") else yamlio.loads_json(data, f"{_KEY}: {path}")
            return Trace.from_intervals(m, seed, *parse_intervals(obj, m))
        if binary:
            raise _Fail(f"binary file, expected a text {fmt} trace")
        text = data.decode("utf-8")
        rounds = parse_ids(text, m) if fmt == "ids" else parse_matrix_text(text, m)
        if not rounds:
            raise _Fail(f"empty trace, expected at least one round ({fmt})")
        return Trace.from_rounds(m, seed, rounds)
    except _Fail as e:
        raise InputError(f"{_KEY}: {path}: {e}") from None
    except (ValueError, OSError, EOFError) as e:
        detail = str(e).splitlines()[0][:120] if str(e) else e.__class__.__name__
        raise InputError(f"{_KEY}: {path}: malformed {fmt} trace ({detail})") from None


def inline_trace(rows: list, fmt: str, m: int, seed: int = 0) -> Trace:
    """``availability.schedule`` given as one list per round; InputError naming the key on any problem."""
    key = "availability.schedule"
    try:
        if not rows:
            raise _Fail("empty schedule, expected at least one round")
        for i, row in enumerate(rows):
            if not isinstance(row, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in row):
                raise _Fail(f"round {i}: expected a list of integers, got {row!r:.60}")
        if fmt == "intervals":
            raise _Fail("trace_format intervals needs a file (availability.trace)")
        zero_one = all(len(row) == m and set(row) <= {0, 1} for row in rows)
        if fmt == "auto" and zero_one and m <= 2:
            raise _Fail(f"cannot tell 0/1 rows from id lists with task.clients = {m}; "
                        f"set availability.trace_format to ids or matrix")
        if fmt == "matrix" or (fmt == "auto" and zero_one):
            return Trace.from_rounds(m, seed, _zero_one_rows([(f"round {i}", row) for i, row in enumerate(rows)], m))
        return Trace.from_rounds(m, seed, [_ids_from_tokens([str(v) for v in row], m, f"round {i}")
                                           for i, row in enumerate(rows)])
    except _Fail as e:
        raise InputError(f"{key}: {e}") from None


@dataclass
class TraceParams(AvailabilityParams):
    trace: Optional[str] = opt(None, "trace: file of available ids per round, 0/1 matrix, or on/off intervals")
    trace_format: Literal["auto", "ids", "matrix", "intervals"] = opt("auto", "trace: file format")
    schedule: Optional[Union[str, list]] = opt(
        None,
        "trace: the rounds inline, one list per round (available ids, or a 0/1 row of m); a string is a trace path")
    trace_repeat: bool = opt(False, "trace: replay it from its first round when the run is longer than the trace "
                                    "(false: such a run is refused)")

    def input_files(self) -> tuple[str, ...]:
        return tuple(p for p in (self.trace, self.schedule) if isinstance(p, str) and p)


def _check_trace(cfg) -> None:
    if cfg.availability.schedule is not None and cfg.availability.trace is not None:
        raise InputError("availability.schedule: give either schedule or trace, not both")


#: under privacy the accountant counts a client's participations in the replay of the run's rounds
#: (``Trace.sampling``), so the epsilon of every round depends on ``rounds``
_READS_ROUNDS = Reads("rounds", "counts each client's participations in its replay of the run's rounds for the "
                                "privacy accountant", when=lambda cfg: cfg.privacy.mechanism != "none")


@register("trace", params=TraceParams, check=_check_trace, reads=(_READS_ROUNDS,))
def _trace(cfg: TraceParams, info: ClientInfo) -> Participation:
    if isinstance(cfg.schedule, list):
        return _long_enough(inline_trace(cfg.schedule, cfg.trace_format, info.m, info.seed), cfg, info,
                            "availability.schedule")
    path = cfg.schedule or cfg.trace
    if not path:
        raise InputError(f"{_KEY}: kind 'trace' needs a file path (ids per round, 0/1 matrix or intervals) "
                         f"or availability.schedule")
    return _long_enough(load_trace(path, cfg.trace_format, info.m, info.seed), cfg, info, f"{_KEY}: {path}")


def _long_enough(trace: Trace, cfg: TraceParams, info: ClientInfo, where: str) -> Trace:
    """A trace shorter than the run would silently repeat: refused unless ``trace_repeat`` asks for it."""
    if info.rounds is not None and trace.length < info.rounds and not cfg.trace_repeat:
        raise InputError(f"{where}: {trace.length} rounds, shorter than the run's {info.rounds} (rounds); "
                         f"set availability.trace_repeat: true to replay it from its first round")
    return trace
