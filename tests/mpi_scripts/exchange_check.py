"""Run a few gossip iterations x <- x + neighbor_sum(x) on however many ranks launched us.

``python exchange_check.py OUT.npz`` (under mpiexec or alone) writes, from rank 0, the final
models, the mean/consensus error, one intra-rank-only mixing term and the send counters.
``tests/test_exchange.py`` imports ``run`` for the single-process reference.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from fedmpi.config import SporadicityConfig, TopologyConfig
from fedmpi.decentral.exchange import Exchanger
from fedmpi.decentral.sporadicity import Indicators
from fedmpi.decentral.topology import build_graph, locality_order, relabel
from fedmpi.runtime.world import World

M, D, ITERS, SEED = 23, 37, 6, 7  # D = 37: vector body and tail of the mixing kernel


def make_graph():
    graph = build_graph(TopologyConfig(kind="rgg", radius=0.35), M, SEED)
    return relabel(graph, locality_order(graph))


def run(world: World) -> dict | None:
    graph = make_graph()
    ex = Exchanger(world, graph)
    links = Indicators(SporadicityConfig(), graph, SEED)
    x_all = torch.randn(M, D, generator=torch.Generator().manual_seed(SEED))
    lo, hi = world.shard(M)
    x = x_all[lo:hi].to(world.device).contiguous()
    for k in range(ITERS):
        x = x + ex.neighbor_sum(x, links.draw(k)[1])
    rows_after_loop = ex.sent_rows
    # an iteration whose cross-rank edges are all inactive must send nothing
    owner = world.owner(np.arange(M), M)
    intra = links.draw(ITERS)[1] & (owner[graph.edges[:, 0]] == owner[graph.edges[:, 1]])
    rows0, ops0 = ex.sent_rows, ex.sent_ops
    term = ex.neighbor_sum(x, intra)
    quiet = [ex.sent_rows - rows0, ex.sent_ops - ops0]
    mean, consensus = ex.mean_and_consensus(x)
    final, term_all = ex.gather_all(x), ex.gather_all(term)
    stats = world.allgather_obj((rows_after_loop, quiet))
    if world.rank != 0:
        return None
    return {"final": final.cpu().numpy(), "intra_mask": intra, "intra_term": term_all.cpu().numpy(),
            "mean": mean.cpu().numpy(), "consensus": consensus,
            "loop_rows": np.array([s[0] for s in stats]), "quiet": np.array([s[1] for s in stats]),
            "staged": world.staged}


if __name__ == "__main__":
    w = World.create(device="cpu")
    result = run(w)
    if result is not None:
        np.savez(sys.argv[1], **result)
    w.close()
