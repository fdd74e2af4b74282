"""The general b-banded factor of ``banded_mf`` (``privacy.factor: banded``; docs/PRIVACY.md, "The factor").

C is n x n lower-triangular with b bands and every entry free: column j holds x_j = (C[j, j], ...,
C[j + b - 1, j]) scaled to unit norm (Choquette-Choo et al. 2023's and jax_privacy's
``ColumnNormalizedBanded``; ``params[j, i]`` = C[j + i, j] before the scaling, as there). The
optimum minimises ||A C^{-1}||_F^2 (A the prefix sums) over the n b entries; the Toeplitz factor of
fedmpi/privacy/factors.py is the special case of equal columns.

The loss in O(n m^2), m = max(b, 32) (``loss``). A = (I - S)^{-1} with S the shift, so
A C^{-1} = L^{-1} for L = C (I - S), lower-triangular with b + 1 bands. Cut the rows into blocks of
m >= b: L is block-bidiagonal (diagonal blocks D_k, lower-triangular; blocks E_k to the left), and
block k of rows of L^{-1} is G_k = D_k^{-1} (I_k - E_k G_{k-1}), where I_k's columns and G_{k-1}'s
do not overlap. So the Gram matrices W_k = G_k G_k^T of the blocks follow the recursion

    M_k = I + E_k W_{k-1} E_k^T,   W_k = D_k^{-1} M_k D_k^{-T},   ||A C^{-1}||_F^2 = sum_k tr W_k

(diag W_k: the squared errors of the block's prefix sums). Its gradient by hand, backwards:
What_K = I, Mhat_k = D_k^{-T} What_k D_k^{-1}, What_{k-1} = I + E_k^T Mhat_k E_k; then
dL/dD_k = -2 Mhat_k M_k D_k^{-T} and dL/dE_k = 2 Mhat_k E_k W_{k-1}, carried back through
L = C (I - S) and the column scaling (``loss_and_gradient``). ``optimize`` runs L-BFGS (torch,
float64, one thread: the same bits on any rank) on log ||A C^{-1}||_F^2, started from the
optimised Toeplitz factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..engine.threads import one_thread

MIN_BLOCK = 32  # rows per block at least: fewer Python steps for a narrow band
#: L-BFGS stops when an iteration gains less than this in log ||A C^{-1}||_F^2: the rmse is then
#: within about 1e-9 of where thousands more iterations would take it (measured at n = 2000, b = 4, 64)
TOLERANCE = 1e-11


@dataclass(frozen=True)
class Layout:
    """Where the bands of L sit in the blocks: n rows, b bands of C, blocks of m rows (K of them,
    the last padded with rows of the identity); ``rows``/``cols`` index block k's m x 2m slab
    [E_k | D_k] by (row in block, band offset o = 0..b)."""

    n: int
    b: int

    @property
    def m(self) -> int:
        return min(max(self.b, MIN_BLOCK), self.n)

    @property
    def K(self) -> int:
        return -(-self.n // self.m)

    @property
    def slab_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        p = torch.arange(self.m)[:, None].expand(self.m, self.b + 1)
        return p, self.m + p - torch.arange(self.b + 1)[None]


def valid(n: int, b: int) -> torch.Tensor:
    """(n, b) mask of the entries of ``params`` inside the matrix (row j + i < n)."""
    return (torch.arange(n)[:, None] + torch.arange(b)[None]) < n


def normalized(params: torch.Tensor) -> torch.Tensor:
    """The columns of C (``params`` layout, float64) scaled to unit norm, entries outside the matrix 0."""
    x = params * valid(*params.shape)
    return x / x.norm(dim=1, keepdim=True)


def rows(columns: torch.Tensor) -> torch.Tensor:
    """The (n, b) row layout of C: ``rows[t, o]`` = C[t, t - o] (0 above the matrix), from its columns
    in ``params`` layout (``columns[j, i]`` = C[j + i, j]): what the noise's recursion reads per round."""
    n, b = columns.shape
    out = torch.zeros_like(columns)
    for o in range(min(b, n)):
        out[o:, o] = columns[:n - o, o]
    return out


def _columns_of_rows(r: torch.Tensor) -> torch.Tensor:
    """The adjoint of ``rows``: the (n, b) ``params`` layout of a row-layout array."""
    n, b = r.shape
    out = torch.zeros_like(r)
    for o in range(min(b, n)):
        out[:n - o, o] = r[o:, o]
    return out


def _slabs(C_rows: torch.Tensor, lay: Layout) -> torch.Tensor:
    """The K x m x 2m slabs [E_k | D_k] of L = C (I - S), from C's row layout; padding rows: identity."""
    n, b, m, K = lay.n, lay.b, lay.m, lay.K
    band = torch.zeros(K * m, b + 1, dtype=C_rows.dtype)  # band[t, o] = L[t, t - o] = C[t, t-o] - C[t, t-o+1]
    band[:n, :b] += C_rows
    band[:n, 1:] -= C_rows
    band[n:, 0] = 1
    p, q = lay.slab_index
    slab = torch.zeros(K, m, 2 * m, dtype=C_rows.dtype)
    slab[:, p, q] = band.view(K, m, b + 1)
    return slab


def _forward(columns: torch.Tensor, lay: Layout):
    """The recursion of the module docstring: (D^{-1}, E, M, W) per block, each (K, m, m)."""
    m, K = lay.m, lay.K
    slab = _slabs(rows(columns), lay)
    E, D = slab[:, :, :m], slab[:, :, m:]
    eye = torch.eye(m, dtype=columns.dtype)
    F = torch.linalg.solve_triangular(D, eye.expand(K, m, m), upper=False)
    M, W = torch.empty_like(F), torch.empty_like(F)
    before = torch.zeros(m, m, dtype=columns.dtype)  # W_{-1}: no rows above the first block
    for k in range(K):
        M[k] = eye + E[k] @ before @ E[k].T
        W[k] = before = F[k] @ M[k] @ F[k].T
    return F, E, M, W


def squared_errors(columns: torch.Tensor) -> torch.Tensor:
    """The n squared errors of the prefix sums, ||row t of A C^{-1}||^2 (C from ``columns``, unit norm)."""
    columns = columns[:, :len(columns)]  # bands beyond n: outside the matrix
    lay = Layout(*columns.shape)
    with one_thread(torch.device("cpu")):
        W = _forward(columns, lay)[3]
        return torch.diagonal(W, dim1=1, dim2=2).reshape(-1)[:lay.n]


def loss(columns: torch.Tensor) -> float:
    """||A C^{-1}||_F^2 for C of unit-norm ``columns`` (``params`` layout)."""
    return float(squared_errors(columns).sum())


def loss_and_gradient(params: torch.Tensor) -> tuple[float, torch.Tensor]:
    """||A C^{-1}||_F^2 for C = ``params`` with columns scaled to unit norm, and its gradient in ``params``."""
    n, b = params.shape
    lay = Layout(n, b)
    m, K = lay.m, lay.K
    mask = valid(n, b)
    x = params * mask
    norm = x.norm(dim=1, keepdim=True)
    columns = x / norm
    F, E, M, W = _forward(columns, lay)
    total = float(torch.diagonal(W, dim1=1, dim2=2).sum()) - (K * m - n)  # padding rows: 1 each
    eye = torch.eye(m, dtype=params.dtype)
    Mhat = torch.empty_like(M)
    What = eye
    for k in range(K - 1, -1, -1):
        Mhat[k] = F[k].T @ What @ F[k]
        What = eye + E[k].T @ Mhat[k] @ E[k]
    W_before = torch.cat([torch.zeros(1, m, m, dtype=params.dtype), W[:-1]])
    slab_hat = torch.cat([2 * Mhat @ E @ W_before, -2 * Mhat @ M @ F.transpose(1, 2)], dim=2)
    p, q = lay.slab_index
    band_hat = slab_hat[:, p, q].reshape(K * m, b + 1)[:n]
    rows_hat = band_hat[:, :b] - band_hat[:, 1:]  # through L = C (I - S)
    col_hat = _columns_of_rows(rows_hat)
    grad = (col_hat - columns * (columns * col_hat).sum(dim=1, keepdim=True)) / norm  # through the scaling
    return total, grad * mask


def optimize(n: int, b: int, start: np.ndarray) -> np.ndarray:
    """The unit-norm columns (n, b ``params`` layout, float64) of the b-banded C minimising
    ||A C^{-1}||_F^2 for n rounds, by L-BFGS from the Toeplitz factor of first column ``start``
    (never worse than it). Bands beyond n (b > n) are 0."""
    bb = min(b, n)
    init = torch.from_numpy(np.asarray(start, dtype=np.float64)[:bb]).expand(n, bb).clone()
    with one_thread(torch.device("cpu")):
        init = normalized(init)
        v = init.clone().requires_grad_(True)
        opt = torch.optim.LBFGS([v], lr=1, max_iter=4000, max_eval=8000, tolerance_grad=1e-9,
                                tolerance_change=TOLERANCE, history_size=30, line_search_fn="strong_wolfe")

        def closure():
            with torch.no_grad():
                value, grad = loss_and_gradient(v)
                if not (math.isfinite(value) and value > 0 and bool(torch.isfinite(grad).all())):
                    v.grad = torch.zeros_like(v)  # C singular on the way: a large loss, the line search steps back
                    return torch.tensor(1e10, dtype=v.dtype)
                v.grad = grad / value  # of log ||A C^{-1}||_F^2
                return torch.tensor(math.log(value), dtype=v.dtype)

        for _ in range(3):  # LBFGS restarts its memory: stop when a restart gains nothing
            before = loss_and_gradient(v.detach())[0]
            opt.step(closure)
            if not loss_and_gradient(v.detach())[0] < before:
                break
        best = normalized(v.detach())
        if not loss(best) < loss(init):
            best = init
    out = np.zeros((n, b))
    out[:, :bb] = best.numpy()
    return out
