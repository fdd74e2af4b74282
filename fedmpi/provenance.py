"""What made a result: fedmpi's source, the plug-ins' sources, the input data files.

A result file records (root attributes, written by the runner): ``fedmpi_source`` (a hash of
every ``.py`` file of the fedmpi package), ``plugins`` and ``inputs`` (JSON): each loaded
plug-in's path and source hash, and each input file's fingerprint. ``outdated(attrs)`` says,
later, what of that has changed since (``fedmpi sweep --status``: plug-ins and data;
``fedmpi info``: fedmpi's source too).

An input file is one the dataset reader read (``note_input``) or one named by a string value of
the config (e.g. a dataset plug-in's ``task.csv``, an availability trace). Its fingerprint is
its size, modification time and a SHA-256 of its content; files over ``FULL_HASH_BYTES`` are
hashed on ``SAMPLES`` evenly spaced blocks of ``BLOCK`` bytes and their size, so the cost is
bounded. A file whose size and time are as recorded is taken as unchanged without reading it.
Every function here is local to the process (no rank talks to another).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Any, Callable, Iterable, Mapping

from .inputs import open_input

FULL_HASH_BYTES = 64 << 20
BLOCK, SAMPLES = 1 << 20, 16

_inputs: dict[str, dict] = {}  # files read in this process (note_input)
_plugins: dict[str, dict] = {}  # plug-ins loaded in this process (note_plugin)


def _content_hash(path: str, size: int) -> str:
    """Read every time: a file rewritten with the same size and time still hashes anew."""
    h = hashlib.sha256()
    with open_input(path, "input file") as fh:
        if size <= FULL_HASH_BYTES:
            for block in iter(lambda: fh.read(BLOCK), b""):
                h.update(block)
        else:  # bounded cost: SAMPLES blocks, first and last included, and the size
            h.update(str(size).encode())
            for k in range(SAMPLES):
                fh.seek((size - BLOCK) * k // (SAMPLES - 1))
                h.update(fh.read(BLOCK))
    return h.hexdigest()[:32]


def fingerprint(path: str) -> dict:
    """``{"size", "mtime_ns", "sha256"}`` of a file (OSError when it cannot be read)."""
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "sha256": _content_hash(path, st.st_size)}


def file_changed(path: str, recorded: Mapping[str, Any]) -> bool:
    """Whether ``path`` no longer holds the content ``recorded`` (missing: changed)."""
    try:
        st = os.stat(path)
        if st.st_size == recorded.get("size") and st.st_mtime_ns == recorded.get("mtime_ns"):
            return False
        return fingerprint(path)["sha256"] != recorded.get("sha256")
    except OSError:
        return True


def source_hash(path: str) -> str:
    """SHA-256 of a ``.py`` file, or of every ``.py`` file under a folder (names and contents)."""
    h = hashlib.sha256()
    if os.path.isfile(path):
        with open(path, "rb") as fh:
            h.update(fh.read())
        return h.hexdigest()[:32]
    for folder, dirs, files in sorted(os.walk(path)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            p = os.path.join(folder, name)
            h.update(os.path.relpath(p, path).encode() + b"\0")
            with open(p, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def fedmpi_source() -> str:
    """The source hash of the fedmpi package (computed once per process)."""
    return source_hash(os.path.dirname(os.path.abspath(__file__)))


def reset_inputs() -> None:
    """Forget the files noted so far (a run's set-up starts with it)."""
    _inputs.clear()


def note_input(path: str) -> dict:
    """Record a data file this process read (readers and dataset plug-ins call it); its fingerprint."""
    path = os.path.abspath(path)
    _inputs[path] = fingerprint(path)
    return _inputs[path]


def note_plugin(label: str, path: str | None) -> None:
    """Record a loaded plug-in (its ``.py`` file, or its package folder for an ``__init__.py``)."""
    if not path:
        return
    path = os.path.dirname(path) if os.path.basename(path) == "__init__.py" else path
    _plugins[label] = {"path": os.path.abspath(path), "sha256": source_hash(path)}


FOLDER_FILES = 64  # a named folder of at most this many files counts as its files


def named_files(data: Any, folders: bool = False) -> list[str]:
    """The existing files named by string values anywhere in ``data`` (a config as a dict); with
    ``folders``, also the files directly in a named folder of at most ``FOLDER_FILES`` files."""
    out: list[str] = []
    if isinstance(data, dict):
        data = list(data.values())
    if isinstance(data, list):
        for v in data:
            out += named_files(v, folders)
    elif isinstance(data, str) and data:
        path = os.path.abspath(os.path.expanduser(data))
        if os.path.isfile(path):
            out.append(path)
        elif folders and os.path.isdir(path):
            inside = sorted(os.path.join(path, f) for f in os.listdir(path))
            inside = [f for f in inside if os.path.isfile(f)]
            out += inside if len(inside) <= FOLDER_FILES else []
    return out


def changed_inputs(recorded: str | None, config: dict) -> list[str]:
    """The input files of a run's recorded ``inputs`` attribute (JSON, ``record``) that no longer
    hold what was recorded (missing: changed), each as ``KEY: PATH`` (the config key that names
    it; a data file the dataset reader read: ``task.dataset``). Empty when nothing was recorded."""
    try:
        inputs = json.loads(recorded or "{}")
    except (TypeError, ValueError):
        return []
    named = _named(config, os.path.exists)

    def key(path: str) -> str:  # the key naming the file, or a folder it lies in
        return next((k for k, p in named if path == p or path.startswith(p + os.sep)), "task.dataset")

    return [f"{key(path)}: {path}" for path, fp in sorted(inputs.items())
            if isinstance(fp, dict) and file_changed(path, fp)]


def _named(data: Any, exists: Callable[[str], bool] = os.path.isfile, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, absolute path) of every string value of ``data`` that names a path for which
    ``exists`` holds (by default: an existing file)."""
    if isinstance(data, dict):
        return [kp for k, v in data.items() for kp in _named(v, exists, f"{prefix}{k}.")]
    if isinstance(data, list):
        return [kp for i, v in enumerate(data) for kp in _named(v, exists, f"{prefix.rstrip('.')}[{i}].")]
    path = os.path.abspath(os.path.expanduser(data)) if isinstance(data, str) and data else ""
    return [(prefix.rstrip("."), path)] if path and exists(path) else []


def record(config: dict, skip: Iterable[str] = ()) -> dict[str, str]:
    """The provenance attributes of a run of ``config``: after its set-up (the data was read)."""
    skip = {os.path.abspath(p) for p in skip}
    inputs = dict(_inputs)
    read = {k: v for k, v in config.items() if k != "runtime"}  # runtime names outputs (a tracker store), not inputs
    for _, p in _named(read):
        if p not in skip and p not in inputs:
            inputs[p] = fingerprint(p)
    return {"fedmpi_source": fedmpi_source(), "plugins": json.dumps(_plugins, sort_keys=True),
            "inputs": json.dumps(inputs, sort_keys=True)}


def outdated(attrs: Mapping[str, Any], fedmpi: bool = False) -> str | None:
    """What changed since the run that wrote ``attrs``: a plug-in's source, an input file (the
    first few named), with ``fedmpi`` also fedmpi's own source; or None. A file without
    provenance (older fedmpi) is None. A sweep leaves fedmpi's source out: every update of
    fedmpi would otherwise make every result outdated; ``fedmpi info`` shows it."""
    why = []
    if fedmpi and attrs.get("fedmpi_source") and attrs["fedmpi_source"] != fedmpi_source():
        why.append(f"fedmpi source (was {attrs.get('fedmpi_version')})")
    try:
        plugins = json.loads(attrs.get("plugins") or "{}")
        inputs = json.loads(attrs.get("inputs") or "{}")
    except (TypeError, ValueError):
        return "provenance attributes unreadable"
    for label, p in sorted(plugins.items()):
        if not os.path.exists(p.get("path", "")) or source_hash(p["path"]) != p.get("sha256"):
            why.append(f"plug-in {os.path.basename(p.get('path', label))}")
    why += [f"data {os.path.basename(path)}" for path, fp in sorted(inputs.items()) if file_changed(path, fp)]
    if not why:
        return None
    return ", ".join(why[:4]) + (f" and {len(why) - 4} more" if len(why) > 4 else "") + " changed"
