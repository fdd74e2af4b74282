"""The communication graph G = (M, E) of the decentralized algorithms.

``build_graph`` makes one of:

- ``rgg``: random geometric graph (paper default): m points uniform in the unit square,
  edge ij iff ||p_i - p_j|| <= radius, redrawn (stream ``(seed, "topology", attempt)``)
  until connected, at most ``topology.max_attempts`` times;
- ``ring``, ``complete``;
- ``file``: an edge list, one ``i j`` per line, ``#`` starts a comment.

Edges are undirected, stored once as (i, j) with i < j, sorted lexicographically; for a client
i its incident edges in edge order are therefore also in neighbour-id order. Mixing weights
follow the Metropolis-Hastings heuristic of the paper: r_ij = 1 / (1 + max(deg_i, deg_j)).

Locality: the world shards clients in contiguous id blocks, so the number of edges whose
endpoints live on different ranks is the number of edges cut by those blocks.
``locality_order`` orders clients so that contiguous blocks are compact:

- with positions (rgg): by the points' index along a Hilbert curve (order 16) over the unit
  square; contiguous Hilbert segments are compact regions, so a block of m/P clients cuts
  roughly its perimeter's worth of edges instead of a (1 - 1/P) fraction of them;
- without (ring, complete, file): breadth-first (Cuthill-McKee-like) order from a
  pseudo-peripheral client, neighbours taken in id order, which keeps the bandwidth small.

``relabel(graph, order)`` renumbers clients so that new id n is old client ``order[n]``. The
order depends only on the graph (never on the number of ranks), so a relabelled run is still
the same run on any number of ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, Optional

import numpy as np
import torch

from .. import rng
from ..errors import InputError
from ..inputs import open_input
from ..schema import opt


@dataclass
class TopologyConfig:
    kind: Literal["rgg", "ring", "complete", "file"] = opt("rgg", "communication graph")
    radius: float = opt(0.4, "rgg: connection radius in the unit square", gt=0)
    max_attempts: int = opt(1000, "rgg: redraws allowed until connected", ge=1)
    file: Optional[str] = opt(None, "file: edge list, one 'i j' per line")

    def input_files(self) -> tuple[str, ...]:
        """The files the graph is read from."""
        return (self.file,) if self.file else ()


@dataclass(eq=False)
class Graph:
    """Undirected graph on clients 0..m-1 with Metropolis-Hastings mixing weights."""

    m: int
    edges: np.ndarray    # (E, 2) int64, i < j, sorted lexicographically
    weights: np.ndarray  # (E,) float64, r_ij = 1 / (1 + max(deg_i, deg_j))
    degree: np.ndarray   # (m,) int64
    points: np.ndarray | None = field(default=None, repr=False)  # (m, 2) positions (rgg only)

    @property
    def num_edges(self) -> int:
        return int(self.edges.shape[0])

    @cached_property
    def adjacency(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """CSR over both directions: (indptr (m+1,), neighbour (2E,), edge index (2E,)).

        Row i lists i's neighbours in increasing id (equivalently, increasing edge index).
        """
        return _csr(self.m, self.edges)


def make_graph(m: int, edges: np.ndarray, points: np.ndarray | None = None) -> Graph:
    """Canonicalise an edge list (i < j, sorted, int64) and attach degrees and weights."""
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    e = np.sort(e, axis=1)
    e = e[np.lexsort((e[:, 1], e[:, 0]))]
    deg = np.bincount(e.ravel(), minlength=m).astype(np.int64)
    w = 1.0 / (1.0 + np.maximum(deg[e[:, 0]], deg[e[:, 1]]))
    return Graph(m, e, w.astype(np.float64), deg, points)


# ----------------------------------------------------------------------------- building

def build_graph(cfg: TopologyConfig, m: int, seed: int) -> Graph:
    """The communication graph of ``cfg.kind`` on m clients (same on every rank)."""
    if cfg.kind == "rgg":
        return _rgg(m, cfg.radius, cfg.max_attempts, seed)
    if cfg.kind == "ring":
        i = np.arange(m if m > 2 else max(m - 1, 0))  # m = 2: a single edge, not a double one
        return make_graph(m, np.stack([i, (i + 1) % m], 1))
    if cfg.kind == "complete":
        i, j = np.triu_indices(m, 1)
        return make_graph(m, np.stack([i, j], 1))
    if cfg.kind == "file":
        return _read_edge_list(cfg.file, m)
    raise InputError(f"topology.kind: unknown kind {cfg.kind!r}")


def _rgg(m: int, radius: float, max_attempts: int, seed: int) -> Graph:
    for attempt in range(max_attempts):
        pts = rng.generator(seed, "topology", attempt).random((m, 2))
        g = make_graph(m, _pairs_within(pts, radius), pts)
        if _bfs_order(g, 0).size == m:
            return g
    raise InputError(f"topology.radius: no connected random geometric graph with m={m} and radius={radius} "
                     f"after {max_attempts} attempts; increase topology.radius or topology.max_attempts")


def _pairs_within(pts: np.ndarray, radius: float, chunk: int = 1 << 22) -> np.ndarray:
    """All pairs (i < j) at distance <= radius: sweep along x, candidate pairs in bounded chunks."""
    m = pts.shape[0]
    by_x = np.argsort(pts[:, 0], kind="stable")
    xs = pts[by_x, 0]
    end = np.searchsorted(xs, xs + radius, side="right")   # candidates of sorted a: a+1 .. end[a]-1
    count = end - np.arange(1, m + 1)
    cum = np.concatenate([[0], np.cumsum(count)])  # candidate pairs before sorted point a
    out, a = [], 0
    while a < m:
        b = max(a + 1, int(np.searchsorted(cum, cum[a] + chunk, side="right")) - 1)
        n = count[a:b]
        left = np.repeat(np.arange(a, b), n)
        right = left + 1 + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
        p, q = by_x[left], by_x[right]
        close = np.sum((pts[p] - pts[q]) ** 2, axis=1) <= radius * radius
        out.append(np.stack([p[close], q[close]], 1))
        a = b
    return np.concatenate(out) if out else np.zeros((0, 2), np.int64)


def _read_edge_list(path: str | None, m: int) -> Graph:
    if not path:
        raise InputError("topology.file: required when topology.kind is 'file'")
    try:
        with open_input(path, "graph file (edge list)", "topology.file", limit=1 << 30) as f:
            lines = f.read().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise InputError(f"topology.file: {path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise InputError(f"topology.file: cannot read {path}: {e.strerror or e}") from None
    seen: dict[tuple[int, int], int] = {}
    for no, raw in enumerate(lines, 1):
        tokens = raw.split("#", 1)[0].split()
        if not tokens:
            continue
        where = f"{path}:{no}"
        try:
            i, j = map(int, tokens)
        except ValueError:
            raise InputError(f"{where}: expected two client ids 'i j', got {raw.strip()!r}") from None
        for c in (i, j):
            if not 0 <= c < m:
                raise InputError(f"{where}: client id {c} out of range [0, {m}) (task.clients = {m})")
        if i == j:
            raise InputError(f"{where}: self-loop {i} {j}")
        key = (min(i, j), max(i, j))
        if key in seen:
            raise InputError(f"{where}: duplicate edge {i} {j} (first on line {seen[key]})")
        seen[key] = no
    g = make_graph(m, np.array(list(seen), dtype=np.int64))
    reached = _bfs_order(g, 0)
    if reached.size < m:
        missing = int(np.flatnonzero(~np.isin(np.arange(m), reached))[0])
        raise InputError(f"{path}: graph is disconnected: client {missing} cannot reach client 0 "
                         f"(every client needs a path to every other)")
    return g


# ----------------------------------------------------------------------------- locality

def locality_order(graph: Graph, points: np.ndarray | None = None) -> np.ndarray:
    """A permutation of the clients whose contiguous blocks cut few edges (see module doc)."""
    pts = graph.points if points is None else np.asarray(points, dtype=np.float64)
    if pts is not None:
        h = _hilbert_index(pts)
        return np.lexsort((np.arange(graph.m), h))
    if graph.m == 0:
        return np.zeros(0, np.int64)
    start = int(np.argmin(graph.degree))
    far = int(_bfs_order(graph, start)[-1])  # pseudo-peripheral start: the last client reached
    order = _bfs_order(graph, far)
    rest = np.setdiff1d(np.arange(graph.m), order)  # other components (not for connected graphs)
    return np.concatenate([order, rest])


def relabel(graph: Graph, order: np.ndarray) -> Graph:
    """The same graph with client ``order[n]`` renamed n."""
    order = np.asarray(order, dtype=np.int64)
    if not np.array_equal(np.sort(order), np.arange(graph.m)):
        raise ValueError("relabel: order must be a permutation of 0..m-1")
    new_id = np.empty_like(order)
    new_id[order] = np.arange(graph.m)
    pts = None if graph.points is None else graph.points[order]
    return make_graph(graph.m, new_id[graph.edges], pts)


def _hilbert_index(pts: np.ndarray, order: int = 16) -> np.ndarray:
    """Index along a Hilbert curve of points in [0, 1]^2 (vectorised xy -> d)."""
    n = 1 << order
    xy = np.clip((pts * n).astype(np.int64), 0, n - 1)
    x, y = xy[:, 0].copy(), xy[:, 1].copy()
    d = np.zeros(len(pts), np.int64)
    s = n >> 1
    while s > 0:
        rx = (x & s) > 0
        ry = (y & s) > 0
        d += s * s * ((3 * rx) ^ ry)
        flip = ~ry & rx
        x = np.where(flip, n - 1 - x, x)
        y = np.where(flip, n - 1 - y, y)
        x, y = np.where(ry, x, y), np.where(ry, y, x)
        s >>= 1
    return d


# ----------------------------------------------------------------------------- helpers

def mixing_matrix(graph: Graph, active: np.ndarray | None = None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Dense W with W_ij = r_ij v_ij and W_ii = 1 - sum_j W_ij (doubly stochastic); small m only."""
    v = np.ones(graph.num_edges, bool) if active is None else np.asarray(active, bool)
    w = np.zeros((graph.m, graph.m))
    i, j = graph.edges[v, 0], graph.edges[v, 1]
    w[i, j] = w[j, i] = graph.weights[v]
    w[np.diag_indices(graph.m)] = 1.0 - w.sum(1)
    return torch.as_tensor(w, dtype=dtype)


def _csr(m: int, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    e = edges.shape[0]
    src = np.concatenate([edges[:, 0], edges[:, 1]])
    dst = np.concatenate([edges[:, 1], edges[:, 0]])
    eid = np.concatenate([np.arange(e), np.arange(e)])
    o = np.lexsort((dst, src))
    indptr = np.zeros(m + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=m), out=indptr[1:])
    return indptr, dst[o].astype(np.int64), eid[o].astype(np.int64)


def _bfs_order(graph: Graph, start: int) -> np.ndarray:
    """Clients reachable from ``start`` in breadth-first order (level by level, vectorised).

    Inside a level, clients come in the order of their first discovering parent, then by id.
    """
    indptr, nbr, _ = graph.adjacency
    seen = np.zeros(graph.m, bool)
    seen[start] = True
    levels = [np.array([start], np.int64)]
    while levels[-1].size:
        f = levels[-1]
        n = indptr[f + 1] - indptr[f]
        pos = np.repeat(indptr[f] - np.cumsum(n) + n, n) + np.arange(n.sum())
        cand = nbr[pos]
        cand = cand[~seen[cand]]
        _, first = np.unique(cand, return_index=True)
        new = cand[np.sort(first)]
        seen[new] = True
        levels.append(new)
    return np.concatenate(levels)
