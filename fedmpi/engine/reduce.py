"""Sums over clients that do not depend on how clients are spread over ranks.

Floating-point addition is not associative, so summing the same client contributions as
one block (1 rank) or as two partial sums (2 ranks) can differ in the last bit, and
training then drifts apart. ``reproducible_sum`` first rounds every term to a common
grid -- per coordinate, a multiple of ulp(sigma) with sigma = 2^(e + k), 2^e above the
largest |term| over all ranks, 2^k >= 2 * number of terms -- so every partial sum is exact
in float64 and the total is the same whatever the order (the pre-rounding idea of
Demmel & Nguyen's reproducible summation). The error is at most n 2^(k-52) times the
largest term (about 1e-12 for n = 100): far under float32 resolution.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..runtime import World
from .threads import one_thread


def reproducible_sum(world: World, rows: torch.Tensor, n_total: int, to_all: bool = False) -> torch.Tensor:
    """Sum over all ranks' rows (n_local, width) -> (width,) float64, on rank 0 (all ranks if ``to_all``).

    ``n_total`` is the number of rows over all ranks (the same value on every rank).
    """
    return reproducible_sum_blocks(world, lambda s: rows[s], rows.shape[0], n_total, to_all)


def reproducible_sum_blocks(world: World, make_rows: Callable[[slice], torch.Tensor], n_local: int, n_total: int,
                            to_all: bool = False, block_bytes: int = 256 << 20,
                            overwrite: bool = False) -> torch.Tensor:
    """``reproducible_sum`` of rows produced block by block by ``make_rows(slice)``.

    Two passes over the blocks (the global maximum first, then the exact sums), so only one
    block of float64 rows exists at a time: memory O(block x width) instead of O(n x width).
    ``make_rows`` must be a pure function of its slice (it may be called twice per block, and
    once on an empty slice for the width); rows that fit in one block are made only once.
    ``overwrite``: every call of ``make_rows`` returns a new tensor, which the reduction may
    overwrite, so the pre-rounding works in place (writing a fresh buffer of the rows' size
    cost 3-5x an in-place pass over rows still in cache: benchmarks/RESULTS.md, anchor task).
    """
    empty = make_rows(slice(0, 0))
    width, device = empty.shape[-1], empty.device
    block = max(1, block_bytes // (8 * width))
    slices = [slice(a, a + block) for a in range(0, n_local, block)]
    with one_thread(device):
        kept = make_rows(slices[0]).double() if len(slices) == 1 else None  # one block: made once, used twice

        def rows(s: slice) -> torch.Tensor:
            return kept if kept is not None else make_rows(s).double()

        biggest = torch.zeros(width, dtype=torch.float64, device=device)
        for s in slices:  # max |row| as max(max, -min): exact, and no |rows| temporary
            r = rows(s)
            torch.maximum(biggest, r.amax(0), out=biggest)
            torch.maximum(biggest, r.amin(0).neg_(), out=biggest)
        world.allreduce_max_(biggest)
        sigma = grid(biggest, n_total)
        total = torch.zeros(width, dtype=torch.float64, device=device)
        for s in slices:
            r = rows(s)
            total += preround(r, biggest, n_total, out=r if overwrite else None, sigma=sigma).sum(0)
    return world.allreduce_sum_(total) if to_all else world.sum_to_server_(total)


def grid(biggest: torch.Tensor, n_total: int) -> torch.Tensor:
    """sigma = 2^(e + k) per coordinate: 2^e above ``biggest`` (>= every |term|), 2^k >= 2 n_total."""
    _, e = torch.frexp(biggest)  # biggest < 2^e
    k = math.ceil(math.log2(max(n_total, 1))) + 1
    return torch.ldexp(torch.ones_like(biggest), e + k)


def preround(rows: torch.Tensor, biggest: torch.Tensor, n_total: int, out: torch.Tensor | None = None,
             sigma: torch.Tensor | None = None) -> torch.Tensor:
    """Round float64 ``rows`` to the grid on which sums of ``n_total`` terms are exact: (rows +
    sigma) - sigma, in two float64 roundings (the second is exact). ``out``: where to write
    (``rows`` itself for in place; default a new tensor); ``sigma``: ``grid(biggest, n_total)``
    when already known."""
    sigma = grid(biggest, n_total) if sigma is None else sigma
    return torch.add(rows, sigma, out=out).sub_(sigma)


def gather_clients(world: World, ids: np.ndarray, local: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per-client scalar rows of every rank, on every rank (collective, through torch.distributed).

    ``ids``: all clients concerned (the same on every rank); ``local``: this rank's clients among
    them; ``rows`` (len(local), k) their values. Returns (len(ids), k) float64 in the order of
    ``ids``. Each rank fills its own clients' places of a zero matrix and one all-reduce sums
    them: every value meets only exact zeros, so it keeps its bits whatever the number of ranks
    (losses, norms, counts and sizes are >= 0, so no -0.0 turns into +0.0); sums of the result
    with ``client_sum`` are then the same too. A collective of the torch world, not of mpi4py,
    so a rank that died ends it after ``runtime.timeout_s`` like every other collective."""
    rows = np.asarray(rows, dtype=np.float64)
    rows = rows.reshape(len(local), -1) if rows.ndim != 2 else rows
    if world.size == 1 and np.array_equal(local, ids):  # one rank, in order: nothing to move
        return rows
    out = np.zeros((len(ids), rows.shape[1]))
    sorter = np.argsort(ids, kind="stable")
    out[sorter[np.searchsorted(ids, np.asarray(local, dtype=np.int64), sorter=sorter)]] = rows
    if world.size == 1:
        return out
    t = torch.from_numpy(out).to("cpu" if world.staged else world.device)
    return world.allreduce_sum_(t).cpu().numpy()


def client_sum(values: np.ndarray) -> float:
    """The sum of per-client scalars, correctly rounded (``math.fsum``): independent of their order,
    so of how clients are spread over ranks."""
    return math.fsum(np.asarray(values, dtype=np.float64).ravel().tolist())
