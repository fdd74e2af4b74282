"""Checkpoints that survive any interruption and re-shard onto another number of ranks.

Layout (next to the result file): ``RUN.h5.ckpt/round-00000120/shard-00003.pt`` per rank and
``RUN.h5.ckpt/manifest.json``, the commit point, written LAST by rank 0. Each file is written
to a temporary name in the same folder, fsynced, renamed, and the folder fsynced, so a crash
at any moment leaves either the previous complete checkpoint or the new one.

What is saved: one ``fedmpi.state.State`` per component (``{"algorithm": ..., "participation":
..., "runner": ...}``), tensors only (loaded with ``torch.load(weights_only=True)``: no
arbitrary unpickling), stored under the keys ``COMPONENT/KIND/NAME``; this module is the only
place that reads or writes those keys:

- ``client``: one row per client of this rank's shard [lo, hi), in id order; on resume the
  rows of all old shards are concatenated and cut to the new shard;
- ``union``: entries each rank holds a subset of, identical where they overlap (e.g. a shared
  model version); resume hands every rank the union;
- ``shared``: identical on every rank (saved once, by rank 0).

Nothing else is needed: all randomness comes from counter-based streams keyed by the round.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import torch

from . import __version__
from .errors import InputError
from .runtime import World
from .state import State

_KINDS = {"shared": "shared", "client": "clients", "union": "union"}  # key word -> State field

MANIFEST = "manifest.json"


def folder_for(out_path: str) -> str:
    return out_path + ".ckpt"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: str, write) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save(world: World, folder: str, rounds_done: int, digest: str, m: int, parts: dict[str, State]) -> None:
    """Write this rank's part of each component's state (all ranks call it), then rank 0 commits
    the manifest."""
    sub = os.path.join(folder, f"round-{rounds_done:08d}")
    if world.rank == 0:
        os.makedirs(sub, exist_ok=True)
    world.barrier()
    os.makedirs(sub, exist_ok=True)
    mine = {f"{component}/{word}/{name}": v.detach().cpu()
            for component, state in parts.items() for word, kind in _KINDS.items()
            if word != "shared" or world.rank == 0 for name, v in getattr(state, kind).items()}
    name = f"shard-{world.rank:05d}.pt"
    _atomic_write(os.path.join(sub, name), lambda fh: torch.save(mine, fh))
    lo, hi = world.shard(m)
    entry = {"rank": world.rank, "lo": lo, "hi": hi, "file": f"round-{rounds_done:08d}/{name}",
             "sha256": _sha256(os.path.join(sub, name))}
    entries = world.allgather_obj(entry)
    if world.rank == 0:
        manifest = {"round": rounds_done, "config_digest": digest, "world_size": world.size, "m": m,
                    "fedmpi_version": __version__, "shards": entries}
        _atomic_write(os.path.join(folder, MANIFEST), lambda fh: fh.write(json.dumps(manifest, indent=1).encode()))
        for old in os.listdir(folder):  # keep only the committed checkpoint
            if old.startswith("round-") and old != f"round-{rounds_done:08d}":
                shutil.rmtree(os.path.join(folder, old), ignore_errors=True)
    world.barrier()


def read_manifest(folder: str) -> dict | None:
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            man = json.load(fh)
        assert isinstance(man["round"], int) and isinstance(man["shards"], list)
        return man
    except (OSError, ValueError, KeyError, AssertionError, TypeError):
        raise InputError(f"{path}: corrupt checkpoint manifest (delete the folder to start afresh)") from None


def load(world: World, folder: str, digest: str, m: int) -> tuple[int, dict[str, State]] | None:
    """The last committed checkpoint, re-sharded for this rank: (rounds_done, {component: state})
    or None."""
    man = read_manifest(folder)
    if man is None:
        return None
    if man.get("config_digest") != digest:
        raise InputError(f"{folder}: checkpoint was made with a different config (resume needs the same "
                         f"task, train, algorithm, availability, topology, sporadicity and seed)")
    if man.get("m") != m:
        raise InputError(f"{folder}: checkpoint has {man.get('m')} clients, the config {m}")
    lo, hi = world.shard(m)
    client_rows: dict[str, list[torch.Tensor]] = {}
    flat: dict[str, torch.Tensor] = {}
    for e in sorted(man["shards"], key=lambda e: e["lo"]):  # every shard: union/ entries may be anywhere
        path = os.path.join(folder, e["file"])
        if not os.path.exists(path) or _sha256(path) != e["sha256"]:
            raise InputError(f"{path}: checkpoint shard missing or corrupt")
        try:
            part = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # rows read on demand
        except Exception:
            raise InputError(f"{path}: checkpoint shard unreadable") from None
        for k, v in part.items():
            if k.split("/")[1:2] == ["client"]:
                a, b = max(lo, e["lo"]), min(hi, e["hi"])
                if a < b:
                    client_rows.setdefault(k, []).append(v[a - e["lo"]:b - e["lo"]].clone())
                elif k not in client_rows:
                    client_rows[k] = [v[:0]]
            else:
                flat[k] = v
    flat.update({k: torch.cat(rows) for k, rows in client_rows.items()})
    parts: dict[str, State] = {}
    for k, v in flat.items():
        component, word, name = (k.split("/", 2) + ["", ""])[:3]
        if word not in _KINDS or not name:
            raise InputError(f"{folder}: checkpoint in an older layout (key {k!r}); delete the folder to start afresh")
        getattr(parts.setdefault(component, State()), _KINDS[word])[name] = v
    return man["round"], parts
