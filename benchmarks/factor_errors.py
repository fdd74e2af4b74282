"""The errors of banded_mf's factors (docs/REPRODUCTION.md section 4, issues #34, #45): rmse =
||A C^-1||_F / sqrt(N) with unit-norm columns, for the square root truncated to b bands and the
Toeplitz factor fedmpi optimises (fedmpi/privacy/factors.py); with ``--general`` also the general
b-banded optimum (``privacy.factor: banded``, N b free entries, columns normalised: the banded-MF
paper's and jax_privacy's ``ColumnNormalizedBanded``; fedmpi/privacy/general.py) beside the Toeplitz
one, jax_privacy's numbers where we have them, and the seconds each optimisation takes (one thread,
no cache; the general one starts from the Toeplitz optimum, whose time is not in its own).

    PYTHONPATH=. python benchmarks/factor_errors.py [--general] [--only-general]

Also prints the full square root (b = N) against its closed form: with C = A^(1/2) unnormalised
(c = r, r_k = binom(2k, k) / 4^k), A C^-1 = C, so the unit-norm factor's max_error^2 is
(sum_{k<N} r_k^2)^2 (an independent check of the error computation)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch

from fedmpi.privacy import factors, general

NS = (50, 100, 200, 500, 1000, 2000)
BANDS = (1, 2, 4, 8, 16)


#: jax_privacy 2.0.0's ``banded.optimize`` (1000 steps; 100 give the same 6 digits), rmse (issue #45)
JAX_PRIVACY = {(64, 4): 3.21218, (128, 8): 3.39273, (256, 4): 5.95565}
GENERAL = ((50, 4), (100, 8), (200, 16), (64, 4), (128, 8), (256, 4), (500, 8), (1000, 16),
           (2000, 4), (2000, 16), (2000, 64))


def general_table() -> None:
    """The general banded optimum vs the Toeplitz one, with the optimisations' times."""
    torch.set_num_threads(1)
    print("\ngeneral banded optimum vs the optimised Toeplitz one (rmse; CPU seconds of each optimisation, one thread)")
    print("     N |  b | Toeplitz    (s)  | general     (s)  | gain   | jax_privacy")
    for n, b in GENERAL:
        t0 = time.process_time()
        c = factors.optimize(n, b)
        t1 = time.process_time()
        cols = general.optimize(n, b, c)
        t2 = time.process_time()
        t, g = factors.errors(c, n)["rmse"], factors.columns_errors(cols)["rmse"]
        ref = f"{JAX_PRIVACY[n, b]:.5f}" if (n, b) in JAX_PRIVACY else "-"
        print(f"{n:>6} | {b:>2} | {t:9.5f} {t1 - t0:6.1f} | {g:9.5f} {t2 - t1:6.1f} | {100 * (t - g) / t:4.2f} % | "
              f"{ref}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--general", action="store_true", help="also the general banded optimum, with timings")
    ap.add_argument("--only-general", action="store_true", help="only the general banded optimum's table")
    args = ap.parse_args()
    os.environ.setdefault(factors.CACHE_ENV, tempfile.mkdtemp())  # measure the optimisation, not a cache
    if args.only_general:
        general_table()
        return
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
        general_table()
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
