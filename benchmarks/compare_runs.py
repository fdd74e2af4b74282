"""Compare two fedmpi result files: bit for bit, or within a stated tolerance.

    python benchmarks/compare_runs.py REF.h5 OTHER.h5            # every metric and /final/params identical
    python benchmarks/compare_runs.py REF.h5 OTHER.h5 --rtol 1e-3 --metric-atol 0.01

Both runs must have completed the same rounds. Compared: every ``/metrics`` column except the
timing ones (``wall_time``, ``peak_rss_mb``), and ``/final/params``. With a tolerance, the
parameters may differ by ``rtol`` times the largest |parameter| of REF, the metrics by
``metric_atol`` (absolute: accuracies are fractions). Used by benchmarks/device_check.sh for
the CUDA-vs-CPU comparisons, where float32 kernels round differently, so bits cannot match.
Prints one line; exit 0 when the files agree, 1 when not.
"""

from __future__ import annotations

import argparse
import sys

import h5py
import numpy as np

TIMING = ("wall_time", "peak_rss_mb")


def compare(ref: str, other: str, rtol: float = 0.0, metric_atol: float = 0.0) -> tuple[bool, str]:
    """(agree, one-line summary) for two result files; zero tolerances ask for identical bits."""
    exact = rtol == 0 and metric_atol == 0
    with h5py.File(ref, "r") as fa, h5py.File(other, "r") as fb:
        for f, name in ((fa, ref), (fb, other)):
            if f.attrs.get("status") != "completed":
                return False, f"{name}: status {f.attrs.get('status')!r}, not completed"
        if not np.array_equal(fa["metrics/round"][:], fb["metrics/round"][:]):
            return False, "evaluated at different rounds"
        names = sorted(set(fa["metrics"]) - set(TIMING))
        if names != sorted(set(fb["metrics"]) - set(TIMING)):
            return False, f"different metrics: {names} vs {sorted(set(fb['metrics']) - set(TIMING))}"
        worst_metric, worst_name = 0.0, ""
        for k in names:
            a, b = fa["metrics"][k][:], fb["metrics"][k][:]
            if not np.array_equal(np.isnan(a), np.isnan(b)):
                return False, f"metric {k}: NaN in different places"
            diff = float(np.nanmax(np.abs(a - b), initial=0.0))
            if diff > worst_metric or (exact and not np.array_equal(a, b, equal_nan=True)):
                worst_metric, worst_name = max(diff, worst_metric), k
        pa, pb = fa["final/params"][:], fb["final/params"][:]
    if pa.shape != pb.shape:
        return False, f"final/params: shapes {pa.shape} and {pb.shape}"
    pdiff = float(np.abs(pa.astype(np.float64) - pb).max(initial=0.0))
    scale = float(np.abs(pa).max(initial=0.0)) or 1.0
    if exact:
        same = worst_name == "" and np.array_equal(pa, pb)
        return same, ("identical bits (metrics and final/params)" if same else
                      f"NOT identical: max param diff {pdiff:.3g}, max metric diff {worst_metric:.3g} ({worst_name})")
    ok = pdiff <= rtol * scale and worst_metric <= metric_atol
    return ok, (f"{'within' if ok else 'OUTSIDE'} tolerance: max param diff {pdiff:.3g} = {pdiff / scale:.3g} of "
                f"max |param| (allowed {rtol:g}), max metric diff {worst_metric:.3g} "
                f"({worst_name or '-'}, allowed {metric_atol:g})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ref")
    p.add_argument("other")
    p.add_argument("--rtol", type=float, default=0.0, help="parameters: allowed diff / max |param| (0 = exact)")
    p.add_argument("--metric-atol", type=float, default=0.0, help="metrics: allowed absolute diff (0 = exact)")
    args = p.parse_args(argv)
    ok, line = compare(args.ref, args.other, args.rtol, args.metric_atol)
    print(f"{args.other} vs {args.ref}: {line}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
