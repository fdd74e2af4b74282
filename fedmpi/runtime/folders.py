"""Whether a folder is one that every rank sees: the result file and the checkpoint of a run whose
ranks span nodes must be on a file system that all its nodes share (every rank writes its
checkpoint shard there and reads every shard when it resumes, possibly on other nodes).

``check_shared(world, folder)`` (collective) refuses, with exit 2 naming the folder, at the start
of the run rather than at the first resume:
- a folder that a rank does not see as rank 0 wrote it: rank 0 writes a probe file with a random
  token, every rank looks for it (a node-local ``/tmp``, ``/local/scratch``, ... on real clusters);
- a folder inside a node's own temporary folder (``TMPDIR``, ``SLURM_TMPDIR``, ``LOCAL_SCRATCH``)
  when the nodes' values differ: the launcher gave each node its own, so other nodes never see
  it, even where, as with two Slurm nodes on one machine, they could read the path.
One node: nothing to check (no file, no collective).
"""

from __future__ import annotations

import os
import secrets
import time
from typing import TYPE_CHECKING

from ..errors import InputError

if TYPE_CHECKING:
    from .world import World

NODE_LOCAL_VARS = ("TMPDIR", "SLURM_TMPDIR", "LOCAL_SCRATCH")
_PROBE_WAIT_S = 2.0  # a network file system may show a new file to other clients a moment later


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _sees(probe: str, token: str) -> bool:
    """Whether this rank reads ``token`` from ``probe`` (retried for ``_PROBE_WAIT_S``)."""
    end = time.monotonic() + _PROBE_WAIT_S
    while True:
        try:
            with open(probe) as fh:
                if fh.read() == token:
                    return True
        except OSError:
            pass
        if time.monotonic() > end:
            return False
        time.sleep(0.1)


def check_shared(world: "World", folder: str, what: str = "--out") -> None:
    """Collective: raise InputError on every rank when ``folder`` (that of ``what``, the output and
    checkpoint) is not shared by all nodes of ``world``. Rank 0 has created ``folder``."""
    nodes = world.nodes or ("",)
    if len(set(nodes)) <= 1:
        return
    folder = os.path.realpath(folder)
    token = secrets.token_hex(8) if world.rank == 0 else None
    probe = os.path.join(folder, f".fedmpi-probe-{token}") if token else None
    if token is not None:
        try:
            with open(probe, "w") as fh:
                fh.write(token)
        except OSError as e:
            token = f"!{e.strerror or e}"
    token, probe = world.allgather_obj((token, probe))[0]
    sees = not token.startswith("!") and _sees(probe, token)
    roots = {var: os.path.realpath(os.environ[var]) for var in NODE_LOCAL_VARS if os.environ.get(var)}
    views = world.allgather_obj((sees, roots))
    if world.rank == 0 and not token.startswith("!"):
        try:
            os.unlink(probe)
        except OSError:
            pass
    why = ""
    if token.startswith("!"):
        why = f"rank 0 cannot write a file there ({token[1:]})"
    blind = [r for r, (seen, _) in enumerate(views) if not seen]
    if not why and blind:
        why = (f"rank {blind[0]} on node {nodes[blind[0]]} does not see what rank 0 on node {nodes[0]} wrote "
               f"there (a folder local to each node)")
    for var in NODE_LOCAL_VARS if not why else ():
        values = {r: v[1].get(var) for r, v in enumerate(views)}
        per_node = {nodes[r]: root for r, root in values.items() if root}
        if len(set(per_node.values())) > 1:
            owner = next((n for n, root in per_node.items() if _within(folder, root)), None)
            if owner is not None:
                why = f"it lies in node {owner}'s own ${var} ({per_node[owner]}), which the other nodes do not share"
                break
    if why:
        raise InputError(f"{what}: {folder} is not shared by the nodes of this run ({', '.join(sorted(set(nodes)))}): "
                         f"{why}; put the result file on a file system that every node mounts")
