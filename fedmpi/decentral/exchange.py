"""Model exchange along the active edges of one iteration, across ranks.

Each rank holds the stacked flat models x_local (n_local, d) of its contiguous client block
``world.shard(m)``. ``Exchanger.neighbor_sum`` returns, for every local client i, the DSpodFL
mixing term

    sum_{j in N_i} r_ij v_ij (x_j - x_i)

Communication: only ACTIVE cross-rank edges move data. For each peer rank, both sides derive
from the (shared) active-edge mask, without talking, the same two lists: my clients with an
active edge to that peer and its clients with an active edge to me, each in increasing client
id. The rows to send are packed into one contiguous buffer (one slice per peer); one isend and
one irecv per peer, ordered by peer rank, go out in a single ``batch_isend_irecv``
(``World.send_recv_``, which stages through host memory when ranks share a GPU). A warm-up
batch among all rank pairs sharing an edge (plus ring neighbours, so that every rank takes part)
runs once at construction, as NCCL wants the first P2P call of a group to be collective. A
single process makes no torch.distributed call at all.

Determinism: the result is bitwise the same on any number of ranks. Row i is one bag of
``embedding_bag(mode="sum", per_sample_weights=...)`` over the buffer [x_local; received rows]:

    bag_i = r_ij1 x_j1 + r_ij2 x_j2 + ... + (-s_i) x_i,    s_i = sum_j r_ij v_ij

with the active neighbours in increasing id, then i itself (clients without an active edge get
an empty bag, 0). The sum is the mixing term sum_j r_ij v_ij (x_j - x_i). A bag's terms are
accumulated in bag order, every bag by the same kernel (fbgemm's for float32 on CPU, one
thread per coordinate on CUDA), independently of the other bags: its bits do not depend on
where x_j came from, on the bag's position in the buffer, or on how many clients a rank holds.
The kernels may fuse multiply and add, but they do it for every bag alike; the buffer is made
contiguous so that every rank takes the same kernel. One kernel reads each neighbour row once,
without temporaries (6-8x faster at m = 1000 than gather/subtract/scale/add passes).

Rounding: the expanded form costs accuracy near consensus. Its error is about eps |x|, not
eps |x_j - x_i|: equal models get a mixing term of about eps |x| instead of exactly 0.
Measured with pure gossip (50 clients, rgg, |x| ~ 5, 1500 iterations): the consensus error
levels off at 1.0e-9 (difference form: 4.0e-10) and the mean model drifts by 2e-5 at most
(difference form: 2e-6), both far below the noise of the SGD steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..engine.reduce import preround
from ..runtime.world import World
from .topology import Graph

_CHUNK = 1 << 24  # elements per float64 chunk in mean_and_consensus


@dataclass
class _Plan:
    """Index work of one iteration: the bags of ``neighbor_sum``.

    ``index`` points into a buffer holding x_local followed by the rows received from the peers.
    """

    index: np.ndarray      # buffer rows of all bags, bag after bag
    weight: np.ndarray     # their weights: r_ij for a neighbour, -s_i for the client itself
    offsets: np.ndarray    # (n_local,) start of each local client's bag
    send_rows: np.ndarray  # local rows packed for sending, peer after peer
    peers: list            # (peer, send_start, send_stop, recv_start, recv_stop), ascending peer
    n_recv: int


class Exchanger:
    """Cross-rank neighbour sums, gathering, mean model and consensus error for one graph."""

    def __init__(self, world: World, graph: Graph, m: int | None = None) -> None:
        if m is not None and m != graph.m:
            raise ValueError(f"Exchanger: m={m} but the graph has {graph.m} clients")
        self.world, self.graph, self.m = world, graph, graph.m
        self.lo, self.hi = world.shard(self.m)
        self.n_local = self.hi - self.lo
        indptr, nbr, eid = graph.adjacency
        s, t = indptr[self.lo], indptr[self.hi]
        # directed entries (i local, j neighbour) in (i, j) order
        self._row = np.repeat(np.arange(self.n_local), np.diff(indptr[self.lo:self.hi + 1]))
        self._nbr, self._eid = nbr[s:t], eid[s:t]
        self._peer = world.owner(self._nbr, self.m) if world.size > 1 else np.zeros(t - s, np.int64)
        self.peers = np.unique(self._peer[self._peer != world.rank])  # ranks sharing an edge with us
        self._max_recv = int(np.unique(self._nbr[self._peer != world.rank]).size)  # all cross edges active
        self._buf: torch.Tensor | None = None
        self.sent_rows = 0  # model rows sent so far (cumulative)
        self.sent_ops = 0   # isend calls so far (cumulative)
        if world.size > 1:
            self._warm_up()

    # ------------------------------------------------------------------ mixing term
    def neighbor_sum(self, x_local: torch.Tensor, active_edges: np.ndarray) -> torch.Tensor:
        """(n_local, d): row i = sum_{j in N_i, v_ij = 1} r_ij (x_j - x_i)."""
        plan = self._plan(np.asarray(active_edges, dtype=bool))
        dev, n = x_local.device, self.n_local
        buf = x_local = x_local.contiguous()  # a strided buffer would take another kernel
        if plan.n_recv:  # x_local, then the peers' rows; kept between calls (no page faults)
            if self._buf is None or (self._buf.shape[1:], self._buf.dtype, self._buf.device) != \
                    (x_local.shape[1:], x_local.dtype, dev):
                self._buf = x_local.new_empty((n + self._max_recv, *x_local.shape[1:]))
            buf = self._buf[:n + plan.n_recv]
            buf[:n] = x_local
            self._exchange(x_local, plan, buf[n:])
        return F.embedding_bag(torch.as_tensor(plan.index, device=dev), buf,
                               torch.as_tensor(plan.offsets, device=dev), mode="sum",
                               per_sample_weights=torch.as_tensor(plan.weight, dtype=x_local.dtype, device=dev))

    def _plan(self, active: np.ndarray) -> _Plan:
        if active.shape != (self.graph.num_edges,):
            raise ValueError(f"active_edges: expected shape ({self.graph.num_edges},), got {active.shape}")
        on = np.flatnonzero(active[self._eid])  # active entries in (row, neighbour) order
        row, nbr, peer = self._row[on], self._nbr[on], self._peer[on]
        remote = peer != self.world.rank
        src = np.zeros(on.size, np.int64)
        src[~remote] = nbr[~remote] - self.lo
        send_rows, peers, n_sent, n_recv = [], [], 0, 0
        for p in np.unique(peer[remote]):
            sel = peer == p
            mine, theirs = np.unique(row[sel]), np.unique(nbr[sel])  # increasing client id
            src[sel] = self.n_local + n_recv + np.searchsorted(theirs, nbr[sel])
            send_rows.append(mine)
            peers.append((int(p), n_sent, n_sent + mine.size, n_recv, n_recv + theirs.size))
            n_sent, n_recv = n_sent + mine.size, n_recv + theirs.size
        # bag i = its active neighbours (in (row, neighbour) order), then i itself with -s_i
        r = self.graph.weights[self._eid[on]]
        count = np.bincount(row, minlength=self.n_local)
        size = count + (count > 0)
        offsets = np.cumsum(size) - size
        at = offsets[row] + np.arange(on.size) - np.repeat(np.cumsum(count) - count, count)
        index, weight = np.empty(size.sum(), np.int64), np.empty(size.sum(), np.float64)
        index[at], weight[at] = src, r
        me = np.flatnonzero(count)
        index[offsets[me] + count[me]] = me
        weight[offsets[me] + count[me]] = -np.bincount(row, weights=r, minlength=self.n_local)[me]
        return _Plan(index, weight, offsets, np.concatenate(send_rows) if send_rows else np.zeros(0, np.int64),
                     peers, n_recv)

    def _exchange(self, x_local: torch.Tensor, plan: _Plan, recv: torch.Tensor) -> None:
        """Send my rows / receive into ``recv`` the peers' rows that this iteration's active cross edges need."""
        if not plan.peers:
            return
        packed = x_local.index_select(0, torch.as_tensor(plan.send_rows, device=x_local.device))
        self.world.send_recv_(packed, recv, plan.peers)
        self.sent_rows += packed.shape[0]
        self.sent_ops += len(plan.peers)

    def _warm_up(self) -> None:
        r, n = self.world.rank, self.world.size
        partners = sorted((set(self.peers.tolist()) | {(r + 1) % n, (r - 1) % n}) - {r})
        k, dev = len(partners), self.world.device
        self.world.send_recv_(torch.zeros(k, device=dev), torch.empty(k, device=dev),
                              [(p, i, i + 1, i, i + 1) for i, p in enumerate(partners)])

    # ------------------------------------------------------------------ global views
    def gather_all(self, x_local: torch.Tensor) -> torch.Tensor | None:
        """All m models (m, d) on rank 0, in client order; None on the other ranks."""
        w = self.world
        if w.size == 1:
            return x_local
        n_max = max(w.shard(self.m, r)[1] - w.shard(self.m, r)[0] for r in range(w.size))
        buf = x_local.new_zeros((n_max, x_local.shape[1]))
        buf[:self.n_local] = x_local
        parts = w.gather_to_server(buf)
        if parts is None:
            return None
        return torch.cat([parts[r][:w.shard(self.m, r)[1] - w.shard(self.m, r)[0]] for r in range(w.size)])

    def mean_and_consensus(self, x_local: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(mean model x_bar (d,) float32, consensus error (1/m) sum_i ||x_i - x_bar||^2), on every rank.

        Bitwise the same on any number of ranks: both sums over clients are pre-rounded per
        coordinate (``engine.reduce.preround``), hence exact in float64 whatever the grouping of
        the terms, and the last sum, over coordinates, runs in numpy on identical data everywhere.
        """
        w, dev, dim = self.world, x_local.device, x_local.shape[1]
        step = max(1, _CHUNK // max(1, dim))
        chunks = [x_local[a:a + step] for a in range(0, self.n_local, step)]
        ext = torch.full((2, dim), -math.inf, dtype=torch.float64, device=dev)  # per coordinate: max, -min
        for c in chunks:
            ext = torch.maximum(ext, torch.stack([c.amax(0), -c.amin(0)]).double())
        w.allreduce_max_(ext)
        hi, lo = ext[0], -ext[1]
        total = torch.zeros(dim, dtype=torch.float64, device=dev)
        for c in chunks:
            total += preround(c.double(), torch.maximum(hi.abs(), lo.abs()), self.m).sum(0)
        mean = w.allreduce_sum_(total) / self.m
        bound = torch.maximum((hi - mean).square(), (lo - mean).square())  # >= every (x_i - x_bar)^2
        sq = torch.zeros_like(total)
        for c in chunks:
            sq += preround((c.double() - mean).square(), bound, self.m).sum(0)
        sq = w.allreduce_sum_(sq)
        return mean.float(), float(np.sum(sq.cpu().numpy())) / self.m
