"""``fedmpi export RUN.h5 ... --csv``: the metric rows of result files as CSV.

Without ``--out`` each ``X.h5`` gets ``X.csv`` next to it (the same file ``runtime.csv`` writes
during a run). ``--out FILE`` (or ``-`` for stdout) writes one long table of all runs instead:
columns ``file``, ``variant`` (the sweep variant's label a cell's file records, else empty),
``seed``, the config keys that differ between the runs, then ``round`` and the metrics (empty
where a run lacks one). An existing CSV is replaced only with ``--overwrite``;
an input or a result file never is (outfiles.py). Every target is checked before any is written.
"""

from __future__ import annotations

import argparse
import csv
import sys
from typing import TextIO

from ..errors import InputError
from .outfiles import check_target, write_text
from .reader import Result, load
from .sidecars import csv_path, csv_value


def write_one(r: Result, fh: TextIO) -> None:
    w = csv.writer(fh, lineterminator="\n")
    names = list(r.metrics)
    w.writerow(names)
    for i in range(len(r.metrics["round"])):
        w.writerow([csv_value(k, r.metrics[k][i]) for k in names])


def write_long(runs: list[Result], fh: TextIO) -> None:
    flats = [r.flat_config() for r in runs]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    differ = [k for k in keys if k not in ("seed", "output", "runtime.label")
              and len({repr(f.get(k)) for f in flats}) > 1]
    names = list(dict.fromkeys(k for r in runs for k in r.metrics))
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["file", "variant", "seed", *differ, *names])
    for r, f in zip(runs, flats):
        fixed = [r.path, r.label, r.seed, *(f.get(k, "") for k in differ)]
        for i in range(len(r.metrics["round"])):
            w.writerow([*fixed, *(csv_value(k, r.metrics[k][i]) if k in r.metrics else "" for k in names)])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Export the metric rows of result files (CSV)."
    parser.add_argument("files", nargs="+", help="result files")
    parser.add_argument("--csv", action="store_true", default=True, help="CSV (the only format; the default)")
    parser.add_argument("--out", help="one CSV of all runs here ('-' = stdout); default: X.csv next to each X.h5")
    parser.add_argument("--overwrite", action="store_true", help="replace existing CSV files")


def run_cli(args: argparse.Namespace) -> int:
    if args.out is not None and not args.out.strip():
        raise InputError("--out: empty path")
    runs = [load(p) for p in args.files]
    if args.out == "-":
        write_long(runs, sys.stdout)
        return 0
    if args.out is not None:
        check_target(args.out, "--out", args.files, args.overwrite)
        write_text(args.out, "--out", lambda fh: write_long(runs, fh))
        print(args.out)
        return 0
    targets = [csv_path(r.path) for r in runs]
    for target in targets:
        check_target(target, "export", args.files, args.overwrite)
    for r, target in zip(runs, targets):
        write_text(target, "export", lambda fh, r=r: write_one(r, fh))
        print(target)
    return 0
