"""How long a client's task takes: comm_time_i + steps * step_time_i virtual seconds.

- ``constant``: every client has ``clock.step_time`` and ``clock.comm_time``;
- ``lognormal``: a device speed v_i = exp(sigma z_i), z_i ~ N(0, 1), drawn once per client from
  the stream (seed, "clock.speed") with the client id as counter (median speed 1, as PAPAYA and
  FedScale model devices); client i takes step_time / v_i per step and comm_time / v_i per task;
- ``file``: one row per client of a CSV with header ``client,step_time,comm_time``
  (``read_devices``), or FedScale's device-capacity map (its pickle, read without running code, or
  the same as JSON): {device id: {"computation": ms per sample, "communication": kbit/s}}; the
  k-th smallest device id is client k, and as FedScale does, a step costs 3 x batch x computation
  (forward and backward) and a task sends the model twice: step_time = 3 B c / 1000 s and
  comm_time = 2 x 32 d / (1000 kbps) s for B = ``train.batch_size`` and d float32 parameters.

Every draw is a pure function of (seed, client), so every rank holds the same durations whatever
the number of ranks. Failures (``clock.dropout``): whether a task fails and when (a fraction of its
duration) are draws of the streams (seed, "clock.dropout", unit) and (seed, "clock.fail_at",
unit) with the client id as counter, ``unit`` the round (synchronous) or the dispatch number
(asynchronous).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re

import numpy as np

from .. import rng, safepickle
from ..errors import InputError
from ..inputs import read_input
from .params import MAX_SECONDS, ClockParams

_KEY = "clock.file"
_MAX_BYTES = 64 << 20
_ID = re.compile(r"[+-]?[0-9]{1,18}")  # a device id: an integer (in FedScale's maps, or as JSON's string keys)
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(nan|inf|infinity)", re.I)


class Durations:
    """Per-client step and communication times (m,) float64, the same on every rank."""

    def __init__(self, params: ClockParams, m: int, seed: int, batch_size: int = 1, dim: int = 1):
        self.params, self.seed, self.m = params, seed, m
        if params.kind == "file":
            self.step_time, self.comm_time = read_devices(params.file, m, batch_size, dim)
        else:
            speed = np.ones(m)
            if params.kind == "lognormal":
                speed = np.exp(params.sigma * rng.normal(rng.key(seed, "clock.speed"), np.arange(m)))
            self.step_time = params.step_time / speed
            self.comm_time = params.comm_time / speed

    def of(self, clients: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Seconds (n,) the tasks of ``clients`` take with ``steps`` local steps each."""
        clients = np.asarray(clients, dtype=np.int64)
        return self.comm_time[clients] + np.asarray(steps, dtype=np.float64) * self.step_time[clients]

    def check_deadline(self, least: np.ndarray) -> None:
        """Refuse (InputError naming ``clock.deadline``) a deadline no client can ever meet: every
        task takes comm_time_i + least_i step_time_i > D, ``least`` (m,) the fewest local steps each
        client can do in a round; such a run would train nobody."""
        deadline = self.params.deadline
        if deadline is None or not self.m:
            return
        fastest = self.of(np.arange(self.m), least)
        i = int(np.argmin(fastest))
        if fastest[i] > deadline:
            raise InputError(f"clock.deadline: {deadline:g} s, but no client's task can finish within it (the "
                             f"fastest, client {i}, takes {fastest[i]:.6g} s: comm_time + {int(least[i])} step(s) x "
                             f"step_time), so every round would train nobody")

    def failures(self, clients: np.ndarray, unit: int) -> tuple[np.ndarray, np.ndarray]:
        """(failed (n,) bool, fraction of the task done when it fails (n,)) for the tasks of
        ``clients`` started in ``unit`` (a round, or an asynchronous dispatch number)."""
        clients = np.asarray(clients, dtype=np.int64)
        p = self.params.dropout
        if p == 0 or not len(clients):
            return np.zeros(len(clients), dtype=bool), np.ones(len(clients))
        failed = rng.uniform(rng.key(self.seed, "clock.dropout", unit), clients) < p
        return failed, rng.uniform(rng.key(self.seed, "clock.fail_at", unit), clients)


def read_devices(path: str, m: int, batch_size: int = 1, dim: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(step_time, comm_time) (m,) from a CSV with header ``client,step_time,comm_time`` and one row
    per client 0..m-1 (any order), or from FedScale's device-capacity map (module docstring);
    InputError ``clock.file: <path>: ...`` (one line) on any problem."""
    try:
        data = read_input(path, "device table", _KEY, _MAX_BYTES)  # a FIFO or a device is refused unopened
    except FileNotFoundError:
        raise InputError(f"{_KEY}: {path}: file not found") from None
    except OSError as e:
        raise InputError(f"{_KEY}: {path}: cannot read ({e.strerror or type(e).__name__})") from None
    if data.startswith(b"\x80") or data.lstrip().startswith(b"{"):
        return _fedscale(path, data, m, batch_size, dim)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{_KEY}: {path}: not UTF-8 text (a CSV with header client,step_time,comm_time)") from None
    try:
        rows = [r for r in csv.reader(io.StringIO(text)) if r and any(c.strip() for c in r)]
    except csv.Error as e:  # a field over the csv module's limit, a NUL byte
        raise InputError(f"{_KEY}: {path}: not a CSV with header client,step_time,comm_time ({str(e)[:80]})") from None
    header = [c.strip() for c in rows[0]] if rows else []
    if header != ["client", "step_time", "comm_time"]:
        raise InputError(f"{_KEY}: {path}: the first line must be the header client,step_time,comm_time, "
                         f"got {','.join(header)[:60]!r}")
    step, comm = np.full(m, np.nan), np.full(m, np.nan)
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != 3:
            raise InputError(f"{_KEY}: {path}: line {line}: expected 3 fields client,step_time,comm_time, "
                             f"got {len(row)}")
        try:
            if not (_ID.fullmatch(row[0].strip()) and all(_NUMBER.fullmatch(v.strip()) for v in row[1:])):
                raise ValueError  # plain numbers only: Python also reads '1_0' as 10 and Arabic-Indic digits
            client, s, c = int(row[0]), float(row[1]), float(row[2])
        except ValueError:
            raise InputError(f"{_KEY}: {path}: line {line}: not a client id and two numbers: "
                             f"{','.join(row)[:60]!r}") from None
        if not 0 <= client < m:
            raise InputError(f"{_KEY}: {path}: line {line}: client {client} outside 0..{m - 1} (task.clients {m})")
        if not (0 < s <= MAX_SECONDS and 0 <= c <= MAX_SECONDS):
            raise InputError(f"{_KEY}: {path}: line {line}: step_time must be in (0, {MAX_SECONDS:g}] s and comm_time "
                             f"in [0, {MAX_SECONDS:g}] s, got {s}, {c}")
        if not np.isnan(step[client]):
            raise InputError(f"{_KEY}: {path}: line {line}: client {client} given twice")
        step[client], comm[client] = s, c
    missing = np.flatnonzero(np.isnan(step))
    if len(missing):
        raise InputError(f"{_KEY}: {path}: no row for {len(missing)} of the {m} clients (first: {missing[0]})")
    return step, comm


def _fedscale(path: str, data: bytes, m: int, batch_size: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """FedScale's {device id: {"computation": ms/sample, "communication": kbit/s}} (pickle or JSON)."""
    try:
        obj = safepickle.load(data) if data.startswith(b"\x80") else json.loads(data.decode("utf-8"),
                                                                                object_pairs_hook=_no_repeats)
    except _Repeated as e:
        raise InputError(f"{_KEY}: {path}: device id {str(e)[:20]!r} given twice") from None
    except Exception as e:  # untrusted bytes: any failure is a malformed file
        raise InputError(f"{_KEY}: {path}: unreadable device map ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(obj, dict):
        raise InputError(f"{_KEY}: {path}: expected FedScale's map {{device id: {{computation, communication}}}}")
    number: dict[int, object] = {}  # integer id -> the key as given
    for key in obj:
        if not (isinstance(key, int) and not isinstance(key, bool) and abs(key) < 10**18
                or isinstance(key, str) and _ID.fullmatch(key)):
            raise InputError(f"{_KEY}: {path}: device ids must be integers, got {str(key)[:20]!r}")
        if int(key) in number:  # 1 and '1', '01' and '1': one device twice would shift later clients
            raise InputError(f"{_KEY}: {path}: device id {int(key)} given twice ({number[int(key)]!r} and {key!r})")
        number[int(key)] = key
    ids = [number[k] for k in sorted(number)]
    if len(ids) < m:
        raise InputError(f"{_KEY}: {path}: {len(ids)} devices, fewer than task.clients ({m})")
    step, comm = np.empty(m), np.empty(m)
    for k, key in enumerate(ids[:m]):
        spec = obj[key]
        try:
            if any(isinstance(spec[k], (bool, str)) for k in ("computation", "communication")):
                raise TypeError  # numbers, not true or "1"
            c, kbps = float(spec["computation"]), float(spec["communication"])
        except (TypeError, KeyError, ValueError, OverflowError):  # OverflowError: a pickled int beyond float
            raise InputError(f"{_KEY}: {path}: device {str(key)[:20]}: expected numbers 'computation' (ms per "
                             f"sample) and 'communication' (kbit/s)") from None
        if not (math.isfinite(c) and c > 0 and math.isfinite(kbps) and kbps > 0):
            raise InputError(f"{_KEY}: {path}: device {str(key)[:20]}: computation and communication must be "
                             f"finite and > 0, got {c}, {kbps}")
        step[k], comm[k] = 3 * batch_size * c / 1000, 2 * 32 * dim / (1000 * kbps)
        if not (0 < step[k] <= MAX_SECONDS and comm[k] <= MAX_SECONDS):
            raise InputError(f"{_KEY}: {path}: device {str(key)[:20]}: a step of {step[k]:.3g} s and a transfer of "
                             f"{comm[k]:.3g} s (train.batch_size {batch_size}, {dim} parameters); each must be in "
                             f"(0, {MAX_SECONDS:g}] s")
    return step, comm


class _Repeated(ValueError):
    """A JSON object that names one key twice."""


def _no_repeats(pairs: list[tuple[str, object]]) -> dict:
    """json's object hook: the object, refusing a key given twice (json keeps the last silently)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Repeated(key)
        out[key] = value
    return out
