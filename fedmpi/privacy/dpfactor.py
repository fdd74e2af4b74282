"""``fedmpi dp-factor --rounds N --band B [--factor sqrt|optimized|banded] [--json]``: the error and
sensitivity of banded_mf's factors, all three unless one is named (fedmpi/privacy/factors.py,
docs/PRIVACY.md "The factor")."""

from __future__ import annotations

import argparse
import json

from .factors import FACTORS, TOEPLITZ, check_size, coefficients, factor_errors

NAMES = {"sqrt": "square root (Toeplitz)", "optimized": "optimized Toeplitz", "banded": "general banded"}


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs an integer >= 1, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("The error and sensitivity of banded_mf's factors for N rounds and B bands: rmse = "
                     "||A C^-1||_F / sqrt(N), max_error = the largest row norm of A C^-1 (A the prefix sums), "
                     "sensitivity = max_j ||C[:, j]|| (one participation, per unit of clip).")
    p.add_argument("--rounds", type=_positive, required=True, help="N, the run's rounds")
    p.add_argument("--band", type=_positive, required=True, help="B, privacy.band")
    p.add_argument("--factor", choices=FACTORS, default=None, help="privacy.factor (default: all three)")
    p.add_argument("--json", action="store_true", help="one JSON object per factor, one a line")


def run_cli(args: argparse.Namespace) -> int:
    chosen = FACTORS if args.factor is None else (args.factor,)
    for factor in chosen:  # all bounds first: nothing is computed for a size refused
        check_size(factor, args.rounds, args.band, keys=("--rounds", "--band"))
    for factor in chosen:
        out = {"rounds": args.rounds, "band": args.band, "factor": factor,
               **factor_errors(factor, args.rounds, args.band)}
        if args.json:
            print(json.dumps(out), flush=True)
            continue
        print(f"{NAMES[factor]} factor ({factor}), N = {args.rounds}, B = {args.band}: rmse {out['rmse']:.6g}, "
              f"max_error {out['max_error']:.6g}, sensitivity {out['sensitivity']:.12g}", flush=True)
        if factor in TOEPLITZ:
            print("  coefficients: " + " ".join(f"{x:.6g}" for x in coefficients(factor, args.rounds, args.band)))
    return 0
