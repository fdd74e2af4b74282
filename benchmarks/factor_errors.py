"""The errors of banded_mf's factors (docs/REPRODUCTION.md section 4, issue #34): rmse =
||A C^-1||_F / sqrt(N) with unit-norm columns, for the square root truncated to b bands and the
Toeplitz factor fedmpi optimises (fedmpi/privacy/factors.py); with ``--general`` also the best
general b-banded C (N b free entries, columns normalised: the banded-MF paper's and jax_privacy's
``ColumnNormalizedBanded`` problem), by L-BFGS on dense matrices, N <= 200 only (O(N^3) a step).

    PYTHONPATH=. python benchmarks/factor_errors.py [--general]

Also prints the full square root (b = N) against its closed form: with C = A^(1/2) unnormalised
(c = r, r_k = binom(2k, k) / 4^k), A C^-1 = C, so the unit-norm factor's max_error^2 is
(sum_{k<N} r_k^2)^2 (an independent check of the error computation)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import numpy as np
import torch

from fedmpi.privacy import factors

NS = (50, 100, 200, 500, 1000, 2000)
BANDS = (1, 2, 4, 8, 16)


def general(n: int, b: int) -> float:
    """rmse of the best general b-banded column-normalised C (dense L-BFGS from the square root)."""
    torch.set_num_threads(1)
    c = torch.tensor(factors.sqrt_coefficients(b))
    params = c.repeat(n, 1).clone().requires_grad_()  # params[j, i] = C[j + i, j] before normalising
    rows = [torch.arange(i, n) for i in range(b)]
    A = torch.tril(torch.ones(n, n, dtype=torch.float64))

    def matrix() -> torch.Tensor:
        C = torch.zeros(n, n, dtype=torch.float64)
        for i in range(b):
            C = C.index_put((rows[i], rows[i] - i), params[: n - i, i])
        return C / C.norm(dim=0, keepdim=True)

    opt = torch.optim.LBFGS([params], max_iter=3000, max_eval=10000, tolerance_grad=1e-12,
                            tolerance_change=1e-16, history_size=50, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.log((torch.linalg.solve_triangular(matrix(), A, upper=False, left=False) ** 2).sum())
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    with torch.no_grad():
        return float(torch.linalg.solve_triangular(matrix(), A, upper=False, left=False).norm() / math.sqrt(n))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--general", action="store_true", help="also the general banded optimum (N <= 200)")
    args = ap.parse_args()
    os.environ.setdefault(factors.CACHE_ENV, tempfile.mkdtemp())  # measure the optimisation, not a cache
    print("rmse = ||A C^-1||_F / sqrt(N), unit column norms: sqrt / optimized Toeplitz (gain)")
    print("     N | " + " | ".join(f"b = {b:<22}" for b in BANDS))
    for n in NS:
        cells = []
        for b in BANDS:
            s = factors.errors(factors.sqrt_coefficients(b), n)["rmse"]
            o = factors.errors(factors.optimize(n, b), n)["rmse"]
            cells.append(f"{s:7.4f} / {o:7.4f} ({100 * (s - o) / s:4.1f} %)")
        print(f"{n:>6} | " + " | ".join(cells), flush=True)
    if args.general:
        print("\ngeneral banded optimum vs the Toeplitz one (rmse)")
        for n, b in ((50, 4), (100, 8), (200, 16)):
            t = factors.errors(factors.optimize(n, b), n)["rmse"]
            g = general(n, b)
            print(f"N = {n:>4}, b = {b:>2}: Toeplitz {t:.4f}  general {g:.4f}  ({100 * (t - g) / t:.1f} % lower)",
                  flush=True)
    print("\nfull square root (b = N): max_error^2 computed vs closed form")
    for n in NS:
        r = np.ones(n)
        for k in range(1, n):
            r[k] = r[k - 1] * (2 * k - 1) / (2 * k)
        got = factors.errors(r / np.linalg.norm(r), n)["max_error"] ** 2
        print(f"N = {n:>5}: max_error^2 {got:.10f}  (sum_k r_k^2)^2 {float(r @ r) ** 2:.10f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
