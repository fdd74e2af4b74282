"""``fedmpi dp-factor --rounds N --band B --factor sqrt|optimized [--json]``: the error and
sensitivity of banded_mf's factor (fedmpi/privacy/factors.py, docs/PRIVACY.md "The factor")."""

from __future__ import annotations

import argparse
import json

from .factors import FACTORS, coefficients, errors


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs an integer >= 1, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("The error and sensitivity of banded_mf's factor for N rounds and B bands: rmse = "
                     "||A C^-1||_F / sqrt(N), max_error = the largest row norm of A C^-1 (A the prefix sums), "
                     "sensitivity = max_j ||C[:, j]|| (one participation, per unit of clip).")
    p.add_argument("--rounds", type=_positive, required=True, help="N, the run's rounds")
    p.add_argument("--band", type=_positive, required=True, help="B, privacy.band")
    p.add_argument("--factor", choices=FACTORS, default="sqrt", help="privacy.factor (default: sqrt)")
    p.add_argument("--json", action="store_true", help="one JSON object")


def run_cli(args: argparse.Namespace) -> int:
    c = coefficients(args.factor, args.rounds, args.band)
    out = {"rounds": args.rounds, "band": args.band, "factor": args.factor, **errors(c, args.rounds)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{args.factor} factor, N = {args.rounds}, B = {args.band}: rmse {out['rmse']:.6g}, "
              f"max_error {out['max_error']:.6g}, sensitivity {out['sensitivity']:.12g}")
        print("coefficients: " + " ".join(f"{x:.6g}" for x in c))
    return 0
