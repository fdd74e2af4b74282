"""Decentralized FL on a graph: the DSpodFL iteration shared by dspodfl, dgd, rg, sporadic_sgd, dfedavg.

Set-up (identical on every rank, a pure function of the config and the seed):

- the graph G (``topology.kind``) is built from the seed and RELABELLED in locality order
  (``decentral.topology.locality_order``: Hilbert order of the rgg points, BFS order otherwise),
  so that the contiguous client blocks of the ranks cut few edges. The order depends only on
  the graph, never on the number of ranks; every client id of the run (data partition i,
  indicators, ``/topology/edges``) is a relabelled id;
- probabilities d_i (SGD) and b_ij (links) are drawn per seed (``decentral.sporadicity``);
- every client starts from the same initial model x_0.

Each rank keeps the models x_i of its clients as one (n_local, d) table. Iteration k:

    v_i ~ Bern(d_i), v_ij ~ Bern(b_ij)                          (``indicators``; presets override)
    x_i <- x_i + sum_{j in N_i} r_ij v_ij (x_j - x_i) - alpha v_i g_i(x_i)

synchronously: the mixing term (``Exchanger.neighbor_sum``, only active cross-rank edges send)
and the SGD step of the clients with v_i = 1 (one batched ``LocalTrainer`` step, alpha =
``train.lr`` at t = k, minibatch drawn from the (k, i) stream; ``train.local_steps`` is not
used) both read the
PRE-aggregation x_i. The emulated delay of the iteration uses the DRAWN d_i, b_ij, also when
a preset forces the indicators (``decentral.delay``); the run stops once the cumulative delay
reaches ``sporadicity.max_delay``.

Evaluation: ``test_acc``/``test_loss`` = mean over clients of each client's own test
accuracy/loss (each rank evaluates its clients' models at once, rank 0 averages them in client
order), ``test_acc_avg_model`` of x_bar = (1/m) sum_i x_i, ``consensus_error`` =
(1/m) sum_i ||x_i - x_bar||^2. Every number is bitwise the same on any number of ranks.
"""

from __future__ import annotations

import numpy as np
import torch

from ..decentral.delay import iteration_delay
from ..decentral.exchange import Exchanger
from ..decentral.sporadicity import Indicators
from ..decentral.topology import build_graph, locality_order, relabel
from ..engine.evaluate import evaluate
from ..engine.shapes import MAX_FIXED_BLOCK, fixed_shapes, pad_rows
from ..engine.store import ClientTable
from ..models import has_conv
from ..schema import Reads
from .base import Algorithm, Context, Snapshot

_EVAL_PARAMS = 1 << 24  # at most this many parameters of (non-conv) models evaluated in one vmapped batch


class Decentralized(Algorithm):
    """The DSpodFL mechanism; presets set ``force_sgd``/``force_links`` or override ``indicators``."""

    metrics = ("test_acc", "test_loss", "consensus_error",
               "sim_delay", "sim_delay_processing", "sim_delay_transmission")
    sections = ("topology", "sporadicity")  # the graph and the draws of d_i, b_ij
    force_sgd = False    # v_i = 1 for every client (DGD, RG)
    force_links = False  # v_ij = 1 for every edge (DGD, sporadic SGD)
    client_rows = 1      # x_i: each client's own model, sharded over ranks
    client_state = ("table.rows",)  # x_i of the local clients
    shared_state = ("delay",)
    evaluated_models = ("avg_model",)  # x_bar; test_acc/test_loss average the clients' own models
    derived = ("active",)  # the clients of the last iteration, for its mask
    configuration = ("graph", "sporadic", "exchanger", "lo", "hi", "metrics")
    uses = ("evaluation.batch_size",)  # the blocks of its own evaluation of the clients
    _ONE_STEP = "takes one SGD step per iteration (sporadicity draws who computes)"
    reads = (Reads("train.lr", "takes alpha = train.lr at iteration k as its SGD step size"),
             Reads("train.momentum", "takes one local step per iteration, so a momentum buffer reset every "
                                     "round has no effect", lambda v: v == 0, expect="0"),
             Reads("train.local_steps_draw", _ONE_STEP, lambda v: v == "fixed", expect="fixed"),
             Reads("train.local_epochs", _ONE_STEP, lambda v: v is None, expect="null"),
             Reads("train.local_steps_file", _ONE_STEP, lambda v: v is None, expect="null"))
    private = "a decentralized algorithm has no server whose sum the noise could cover"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        cfg, seed = self.cfg, self.cfg.seed
        graph = build_graph(cfg.topology, self.m, seed)
        self.graph = relabel(graph, locality_order(graph))
        self.sporadic = Indicators(cfg.sporadicity, self.graph, seed,
                                   force_sgd=self.force_sgd, force_links=self.force_links)
        self.exchanger = Exchanger(self.world, self.graph)
        self.lo, self.hi = ctx.shard
        x0 = ctx.spec.flatten(ctx.task.model).to(ctx.device)
        self.table = ClientTable(self.lo, self.hi, ctx.spec.dim, ctx.device, fill=x0)  # x_i, local clients
        self.delay = np.zeros(3)  # cumulative (processing, transmission, total) emulated delay
        self.active = np.zeros(0, np.int64)  # clients with v_i = 1 in the last iteration
        if ctx.task.classes == 0:
            self.metrics = tuple(n for n in self.metrics if n != "test_acc")

    # ---------------------------------------------------------------- iteration k
    def indicators(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(v (m,) bool, v_edges (E,) bool) of iteration k, the same on every rank."""
        return self.sporadic.draw(k)

    def round(self, k: int) -> int:
        """Iteration k on this rank's clients; returns the number of clients with v_i = 1 (all ranks)."""
        v, v_edges = self.indicators(k)
        x = self.table.rows
        mix = self.exchanger.neighbor_sum(x, v_edges) if v_edges.any() else None  # sum_j r_ij v_ij (x_j - x_i)
        mine = np.flatnonzero(v[self.lo:self.hi])
        if mine.size == x.shape[0]:
            self.ctx.trainer.train_(x, mine + self.lo, k, steps=1)  # x_i - alpha g_i(x_i), in place
        elif mine.size:
            rows = torch.as_tensor(mine, device=x.device)
            x.index_copy_(0, rows, self.ctx.trainer.train_(x.index_select(0, rows), mine + self.lo, k, steps=1))
        if mix is not None:
            x.add_(mix)
        d, b = self.sporadic.probabilities(k)
        proc, trans = iteration_delay(v, v_edges, d, b, self.graph, self.cfg.sporadicity.delay)
        self.delay += (proc, trans, proc + trans)
        self.active = np.flatnonzero(v)
        return int(self.active.size)

    def done(self) -> bool:
        """True once the cumulative emulated delay reaches ``sporadicity.max_delay``."""
        limit = self.cfg.sporadicity.max_delay
        return limit is not None and self.delay[2] >= limit

    # ---------------------------------------------------------------- outputs
    def evaluation_snapshot(self) -> Snapshot:
        """x_bar, consensus error, per-client test metrics (mean over clients, rank 0), delays."""
        x_bar, consensus = self.exchanger.mean_and_consensus(self.table.rows)
        out = {"consensus_error": consensus, "sim_delay": float(self.delay[2]),
               "sim_delay_processing": float(self.delay[0]), "sim_delay_transmission": float(self.delay[1])}
        scores = self._client_scores()
        if scores is not None:  # rank 0
            out["test_loss"] = float(scores[:, 0].mean())
            if "test_acc" in self.metrics:
                out["test_acc"] = float(scores[:, 1].mean())
        return Snapshot({"avg_model": x_bar}, out)

    def _client_scores(self) -> np.ndarray | None:
        """(m, 2) test (loss, accuracy) of every client's own model, on rank 0 (None elsewhere)."""
        task, spec, x = self.ctx.task, self.ctx.spec, self.table.rows
        # conv activations dominate memory: one model at a time
        fixed = fixed_shapes(x.device)  # the same kernel shapes on every rank count (engine.shapes)
        step = 1 if has_conv(task.model) else max(1, _EVAL_PARAMS // spec.dim)
        if fixed:
            step = min(step, MAX_FIXED_BLOCK)  # every block is padded to this size
        parts = []
        for a in range(0, x.shape[0], step):
            block = x[a:a + step]
            n = block.shape[0]
            if fixed:
                block = pad_rows(block, step - n)
            loss, acc = evaluate(task, spec, block, task.test_x, task.test_y, self.cfg.evaluation.batch_size)
            parts.append(torch.stack([loss, loss if acc is None else acc], 1)[:n])
        rows = self.exchanger.gather_all(torch.cat(parts))
        return None if rows is None else rows.cpu().numpy()

    def final_params(self) -> torch.Tensor:
        return self.exchanger.mean_and_consensus(self.table.rows)[0]  # x_bar

    def last_mask(self) -> np.ndarray:
        return self.active

    def static_groups(self) -> dict[str, dict[str, np.ndarray]]:
        """/topology: the relabelled graph, r_ij, and the drawn d_i, b_ij (of iteration 0)."""
        g = self.graph
        d, b = self.sporadic.probabilities(0)
        return {"topology": {"edges": g.edges, "weights": g.weights, "d": d, "b": b, "degree": g.degree}}
