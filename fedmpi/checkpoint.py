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

The manifest is trusted only after checks: its own SHA-256 (``manifest_sha256``, over every
other field, the config digest included), a schema (field names, types, ranges; shards that
tile [0, m) in rank order; file names as written), each shard's SHA-256, and each shard's
client rows against its range. Any mismatch is exit 2 naming the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from typing import Callable

import torch

from . import __version__, yamlio
from .config import differing_keys
from .errors import InputError, WriteFailed
from .inputs import open_input
from .runtime import World
from .state import State


def _is_client(key: str) -> bool:
    return key.split("/")[1:2] == ["client"]

MANIFEST = "manifest.json"


def folder_for(out_path: str) -> str:
    return out_path + ".ckpt"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_TMP = re.compile(r".*\.tmp-[0-9]+")  # _atomic_write's temporary names


def _atomic_write(path: str, write) -> None:
    """Write ``path`` under a temporary name, fsync, rename. A failure (disk full) removes the
    temporary file and raises WriteFailed: the previous checkpoint stays the committed one."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(os.path.dirname(path))
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise WriteFailed(f"{path}: cannot write the checkpoint ({e.strerror or e}); the previous "
                          f"checkpoint is kept: free space and run the same command to resume") from None


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open_input(path, "checkpoint shard") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save(world: World, folder: str, rounds_done: int, digest: str, m: int, parts: dict[str, State],
         keys: dict[str, str] | None = None) -> None:
    """Write this rank's part of each component's state (all ranks call it), then rank 0 commits
    the manifest."""
    sub = os.path.join(folder, f"round-{rounds_done:08d}")
    try:
        os.makedirs(sub, exist_ok=True)
    except OSError as e:
        raise WriteFailed(f"{sub}: cannot write the checkpoint ({e.strerror or e})") from None
    world.barrier()
    mine = {f"{component}/{key}": v.detach().cpu() for component, state in parts.items()
            for key, v in state.items() if world.rank == 0 or not key.startswith("shared/")}
    name = f"shard-{world.rank:05d}.pt"
    _atomic_write(os.path.join(sub, name), lambda fh: torch.save(mine, fh))
    lo, hi = world.shard(m)
    entry = {"rank": world.rank, "lo": lo, "hi": hi, "file": f"round-{rounds_done:08d}/{name}",
             "sha256": _sha256(os.path.join(sub, name))}
    entries = world.allgather_obj(entry)  # every rank has renamed its shard: no write is in flight
    if world.rank == 0:
        manifest = {"round": rounds_done, "config_digest": digest, "world_size": world.size, "m": m,
                    "fedmpi_version": __version__, "shards": entries, **({"config_keys": keys} if keys else {})}
        manifest["manifest_sha256"] = _manifest_sha256(manifest)
        _atomic_write(os.path.join(folder, MANIFEST), lambda fh: fh.write(json.dumps(manifest, indent=1).encode()))
        _remove_stale(folder, f"round-{rounds_done:08d}")
    world.barrier()


def _remove_stale(folder: str, keep: str) -> None:
    """After a commit: drop older checkpoints and temporary files a killed writer left behind."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.startswith("round-") and name != keep:
            shutil.rmtree(path, ignore_errors=True)
        elif _TMP.fullmatch(name):
            os.unlink(path)
    for name in os.listdir(os.path.join(folder, keep)):
        if _TMP.fullmatch(name):
            os.unlink(os.path.join(folder, keep, name))


# ----------------------------------------------------------------------------- manifest

def _manifest_sha256(manifest: dict) -> str:
    """SHA-256 of every field but ``manifest_sha256``, in a canonical JSON form."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


_HEX64 = re.compile(r"[0-9a-f]{64}")
_FIELDS = {"round": int, "config_digest": str, "world_size": int, "m": int, "fedmpi_version": str,
           "shards": list, "manifest_sha256": str}
_OPTIONAL = {"config_keys": dict}  # the digest's keys and values (Config.resume_keys), to name differences
_SHARD_FIELDS = {"rank": int, "lo": int, "hi": int, "file": str, "sha256": str}


def _fields(obj: object, spec: dict[str, type], where: str) -> None:
    """``obj`` is a mapping with exactly the fields of ``spec``, of those types."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where or 'top level'}: must be an object")
    for k in obj:
        if k not in spec:
            raise ValueError(f"{where}{k}: unknown field")
    for k, tp in spec.items():
        if k not in obj:
            raise ValueError(f"{where}{k}: missing")
        v = obj[k]
        if isinstance(v, bool) or not isinstance(v, tp):
            raise ValueError(f"{where}{k}: must be {'an integer' if tp is int else 'a ' + tp.__name__}, "
                             f"got {json.dumps(v)[:40]}")
        if tp is int and not 0 <= v < 2**62:
            raise ValueError(f"{where}{k}: must be in [0, 2^62), got {v}")


def _check_manifest(man: object) -> None:
    """Raise ValueError("field: problem") unless ``man`` is a manifest as ``save`` writes it."""
    _fields(man, {**_FIELDS, **{k: tp for k, tp in _OPTIONAL.items() if k in man}}, "")
    if man["manifest_sha256"] != _manifest_sha256(man):
        raise ValueError("manifest_sha256: does not match the manifest (edited or damaged)")
    for k in ("world_size", "m"):
        if man[k] < 1:
            raise ValueError(f"{k}: must be >= 1, got {man[k]}")
    shards = man["shards"]
    if len(shards) != man["world_size"]:
        raise ValueError(f"shards: {len(shards)} entries for world_size {man['world_size']}")
    hi = 0
    for r, e in enumerate(shards):
        where = f"shards[{r}]."
        _fields(e, _SHARD_FIELDS, where)
        expected = {"rank": r, "lo": hi, "file": f"round-{man['round']:08d}/shard-{r:05d}.pt"}
        for k, v in expected.items():
            if e[k] != v:
                raise ValueError(f"{where}{k}: must be {v!r}, got {e[k]!r}")
        if not e["lo"] <= e["hi"] <= man["m"]:
            raise ValueError(f"{where}hi: must be in [{e['lo']}, m = {man['m']}], got {e['hi']}")
        if not _HEX64.fullmatch(e["sha256"]):
            raise ValueError(f"{where}sha256: must be 64 hex digits")
        hi = e["hi"]
    if hi != man["m"]:
        raise ValueError(f"shards[{len(shards) - 1}].hi: the shards end at client {hi}, not m = {man['m']}")


def read_manifest(folder: str) -> dict | None:
    """The committed manifest, checked (``_check_manifest``), or None when there is none."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        return None
    fix = "delete the folder to start afresh"
    try:
        man = yamlio.loads_json(yamlio.read_text(path, "checkpoint manifest", 16 * 2**20), path)
    except InputError as e:  # unreadable, too big, not JSON, nested too deep, repeated keys
        detail = str(e).removeprefix(f"{path}: ")
        raise InputError(f"{path}: corrupt checkpoint manifest: {detail} ({fix})") from None
    try:
        _check_manifest(man)
    except ValueError as e:
        raise InputError(f"{path}: checkpoint manifest field {e} ({fix})") from None
    return man


def load(world: World, folder: str, digest: str, m: int, rounds: int | None = None,
         declared: dict[str, State] | None = None,
         keys: dict[str, str] | None = None,
         refusals: Callable[[dict[str, str]], list[str]] | None = None) -> tuple[int, dict[str, State]] | None:
    """The last committed checkpoint, re-sharded for this rank: (rounds_done, {component: state})
    or None.

    ``rounds``: the run's length; a checkpoint beyond it is refused rather than silently ending.
    ``declared``: the run's own state now ({component: State}); the checkpoint must hold exactly
    its shared and client entries, of its dtypes and shapes (client rows: the row shape), and
    only finite values. The hashes show that files are intact, not who wrote them: this check is
    what keeps a resealed, edited checkpoint from being resumed.
    ``keys``: the run's ``Config.resume_keys``, to name where another experiment differs;
    ``refusals`` (``Config.resume_refusals``): given the keys a checkpoint of another digest records,
    the ones that keep the run from continuing it (none: keys added since, at their defaults).
    """
    man = read_manifest(folder)
    if man is None:
        return None
    where = os.path.join(folder, MANIFEST)  # errors about the manifest's fields name the manifest
    record = man.get("config_keys")
    if man["config_digest"] != digest and not (refusals is not None and record and not refusals(record)):
        differ = (refusals(record) if refusals is not None else differing_keys(record, keys or {})) if record else []
        named = f"; differs in {', '.join(differ[:6])}{', ...' if len(differ) > 6 else ''}" if differ else ""
        raise InputError(f"{where}: config_digest: checkpoint was made with a different config (resume needs the same "
                         f"task, train, algorithm, availability, topology, sporadicity and seed{named})")
    if man["m"] != m:
        raise InputError(f"{where}: m: checkpoint has {man['m']} clients, the config {m}")
    if rounds is not None and man["round"] > rounds:
        raise InputError(f"{where}: round: checkpoint is at round {man['round']}, beyond rounds = {rounds} "
                         f"(raise rounds to continue, or delete the folder to start afresh)")
    lo, hi = world.shard(m)
    client_rows: dict[str, list[torch.Tensor]] = {}
    flat: dict[str, torch.Tensor] = {}
    row_shapes = None  # client key -> (dtype, shape of one row), the same in every shard
    for e in man["shards"]:  # every shard: union/ entries may be anywhere
        path = os.path.join(folder, e["file"])
        part = _read_shard(path, e)
        shapes = {k: (v.dtype, tuple(v.shape[1:])) for k, v in part.items() if _is_client(k)}
        if row_shapes is not None and shapes != row_shapes:
            k = sorted(k for k in set(shapes) | set(row_shapes) if shapes.get(k) != row_shapes.get(k))[0]
            raise InputError(f"{path}: key {k}: missing, or rows of another shape or type than in "
                             f"{man['shards'][0]['file']}")
        row_shapes = shapes
        for k, v in part.items():
            if _is_client(k):
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
        component, _, key = k.partition("/")
        try:
            parts.setdefault(component, State()).put(key, v)
        except ValueError:
            raise InputError(f"{folder}: checkpoint in an older layout (key {k!r}); "
                             f"delete the folder to start afresh") from None
    if declared is not None:
        _check_declared(parts, declared, where)
    return man["round"], parts


def _older_float(saved: torch.Tensor, ref: torch.Tensor) -> bool:
    """A Python float of the state as an fedmpi before #44 saved it: float32 (now float64; loaded as
    the float it was rounded to)."""
    return saved.dim() == ref.dim() == 0 and saved.dtype == torch.float32 and ref.dtype == torch.float64


def _check_declared(parts: dict[str, State], declared: dict[str, State], where: str) -> None:
    """Refuse state the run does not declare, or of another dtype or shape, or not finite."""
    from .guards import nonfinite

    fix = "not a checkpoint this run wrote; delete the folder to start afresh"
    for component in sorted(set(parts) | set(declared)):
        got, want = parts.get(component, State()), declared.get(component, State())
        for kind, attr in (("shared", "shared"), ("client", "clients")):
            have, need = getattr(got, attr), getattr(want, attr)
            for name in sorted(set(have) | set(need)):
                key = f"{component}/{kind}/{name}"
                if name not in need or name not in have:
                    raise InputError(f"{where}: key {key}: {'not part of' if name not in need else 'missing from'} "
                                     f"this run's state ({fix})")
                t, ref = have[name], need[name]
                if t.dtype != ref.dtype and not _older_float(t, ref):
                    raise InputError(f"{where}: key {key}: dtype {t.dtype}, the run's is {ref.dtype} ({fix})")
                shape, ref_shape = (t.shape, ref.shape) if kind == "shared" else (t.shape[1:], ref.shape[1:])
                if tuple(shape) != tuple(ref_shape):
                    raise InputError(f"{where}: key {key}: shape {tuple(t.shape)}, the run's is "
                                     f"{tuple(ref.shape)} ({fix})")
        ref = next(iter(want.union.values()), None)  # union entries vary in name (FedSWE's versions), not in kind
        for name, t in got.union.items() if ref is not None else ():
            if t.dtype != ref.dtype or tuple(t.shape) != tuple(ref.shape):
                raise InputError(f"{where}: key {component}/union/{name}: {t.dtype} {tuple(t.shape)}, the run's "
                                 f"are {ref.dtype} {tuple(ref.shape)} ({fix})")
        bad = nonfinite({f"{component}/{k}": t for k, t in got.items()})
        if bad is not None:
            raise InputError(f"{where}: key {bad}: holds NaN or infinite values, which fedmpi never saves ({fix})")


def _read_shard(path: str, entry: dict) -> dict[str, torch.Tensor]:
    """One shard file, checked against its manifest entry (hash, tensors only, row counts)."""
    if not os.path.exists(path) or _sha256(path) != entry["sha256"]:
        raise InputError(f"{path}: checkpoint shard missing or corrupt (sha256 differs from the manifest)")
    try:
        part = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # rows read on demand
    except Exception:
        raise InputError(f"{path}: checkpoint shard unreadable") from None
    if not isinstance(part, dict):
        raise InputError(f"{path}: checkpoint shard is not a mapping of tensors")
    rows = entry["hi"] - entry["lo"]
    for k, v in part.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise InputError(f"{path}: key {str(k)[:40]}: checkpoint shards hold only named tensors")
        if _is_client(k) and (v.dim() == 0 or v.shape[0] != rows):
            got = "a scalar" if v.dim() == 0 else f"{v.shape[0]} rows"
            raise InputError(f"{path}: key {k}: {got}, the manifest's client range "
                             f"[{entry['lo']}, {entry['hi']}) has {rows}")
    return part
