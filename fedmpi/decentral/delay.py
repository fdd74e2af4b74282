"""Emulated per-iteration delay of the DSpodFL family (paper Sec. 5.2).

A client with SGD probability d_i needs 1/d_i time units for one SGD step and a link with
probability b_ij needs 1/b_ij units for one model exchange (weak resources = rare use = slow),
always with the DRAWN d_i, b_ij, also for DGD/RG/sporadic SGD whose indicators are forced to 1.
Iteration k costs, averaged over clients,

    raw:  delay_k = (1/m) sum_i [ v_i / d_i + (1/deg_i) sum_{j in N_i} v_ij / b_ij ]
                    \\__ processing __/   \\________ transmission ________/

Each active undirected edge counts for both endpoints (each sends its model).

``raw`` is what the authors' code accumulates and stops on: its delay budget (500 for FMNIST,
5000 for CIFAR-10) is compared with the running sum of ``delay_used / num_agents``, this formula.

``normalized``: the paper's text we have lost its formulas, so this reading follows the
utilisation the authors' code LOGS (``delay_used / max_delay_usable``), not what it stops on:
the same two parts divided by the delay of an iteration in which everything fires (all
v_i = v_ij = 1), (1/m) sum_i [ 1/d_i + (1/deg_i) sum_j 1/b_ij ]. Each iteration then costs a
fraction in [0, 1] (its utilisation of the worst-case delay), and processing + transmission is
that fraction. A ``max_delay`` of the paper's budgets is meant for ``raw``.
"""

from __future__ import annotations

import numpy as np

from .topology import Graph


def iteration_delay(v: np.ndarray, v_edges: np.ndarray, d: np.ndarray, b: np.ndarray, graph: Graph,
                    mode: str = "raw") -> tuple[float, float]:
    """(processing, transmission) parts of iteration k's delay; ``mode`` raw or normalized."""
    proc, trans = _parts(np.asarray(v, np.float64), np.asarray(v_edges, np.float64), d, b, graph)
    if mode == "raw":
        return proc, trans
    if mode == "normalized":
        full = sum(_parts(np.ones(graph.m), np.ones(graph.num_edges), d, b, graph))
        return (proc / full, trans / full) if full > 0 else (0.0, 0.0)
    raise ValueError(f"sporadicity.delay: unknown mode {mode!r}")


def _parts(v: np.ndarray, v_edges: np.ndarray, d: np.ndarray, b: np.ndarray, graph: Graph) -> tuple[float, float]:
    m = graph.m
    inv_deg = 1.0 / np.maximum(graph.degree, 1)
    i, j = graph.edges[:, 0], graph.edges[:, 1]
    proc = float(np.sum(v / d)) / m
    trans = float(np.sum(v_edges / b * (inv_deg[i] + inv_deg[j]))) / m
    return proc, trans
