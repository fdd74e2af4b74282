"""What a loaded metric plug-in costs a run that does not name it (issue 35 item 5).

    python benchmarks/metric_cost.py [--rounds 100] [--repeat 3]

The quickstart experiment (configs/quickstart.yaml: Fashion-MNIST, or the synthetic set when it
is absent, 100 Dirichlet clients, logreg, a cohort of 10, an evaluation every 5 rounds) run in
one process, one rank, ``--repeat`` times in turn:

- ``plain``: no plug-in loaded;
- ``loaded``: a fairness plug-in (``register_metric("acc_gap", clients=True)``) loaded, the
  config unchanged (before issue 35 this turned the per-client evaluation on for every run);
- ``named``: the same plug-in named by the config (``evaluation.metrics: [acc_gap]``), which asks
  for the per-client evaluation (skipped on a fedmpi without that key).

Prints each variant's best wall time of the rounds and evaluations (the result file's last
``wall_time``: start-up excluded) and its ratio to ``plain`` measured in the same run, with the
machine's load, and whether the ``loaded`` run's file equals the ``plain`` one (metric names and
every value but the clocks).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import h5py
import numpy as np
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from common import machine  # noqa: E402
from fedmpi import config, plugins  # noqa: E402
from fedmpi.errors import InputError  # noqa: E402
from fedmpi.registry import METRICS  # noqa: E402
from fedmpi.runner import Runner  # noqa: E402
from fedmpi.runtime import World  # noqa: E402

CLOCKS = ("wall_time", "peak_rss_mb")


def acc_gap(m) -> float:
    """Best minus worst client accuracy."""
    return float(np.nanmax(m.clients["acc"]) - np.nanmin(m.clients["acc"]))


def quickstart(rounds: int) -> dict:
    with open(os.path.join(ROOT, "configs", "quickstart.yaml"), encoding="utf-8") as fh:
        cfg = yaml.safe_load(fh)
    cfg.update(rounds=rounds, runtime={"progress": False})
    return cfg


def run(cfg: dict, out: str) -> float:
    """Seconds of rounds and evaluations of one run of ``cfg`` (written to ``out``)."""
    Runner(config.from_dict(cfg), World(), out, quiet=True, overwrite=True).run()
    with h5py.File(out, "r") as f:
        return float(f["metrics/wall_time"][-1])


def same_file(a: str, b: str) -> bool:
    """Whether two result files hold the same metric names and values (the clocks aside)."""
    with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
        if sorted(x["metrics"]) != sorted(y["metrics"]) or ("clients" in x) != ("clients" in y):
            return False
        return all(np.array_equal(x[f"metrics/{k}"][:], y[f"metrics/{k}"][:], equal_nan=True)
                   for k in x["metrics"] if k not in CLOCKS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    plugins.load([])
    base = quickstart(args.rounds)
    named = {**base, "evaluation": {**base.get("evaluation", {}), "metrics": ["acc_gap"]}}
    times: dict[str, list[float]] = {"plain": [], "loaded": [], "named": []}
    try:
        METRICS.register("acc_gap", acc_gap, clients=True)
        config.from_dict(named)
    except InputError as e:  # a fedmpi without evaluation.metrics
        times.pop("named")
        print(f"named: skipped ({e})")
    with tempfile.TemporaryDirectory() as tmp:
        out = {k: os.path.join(tmp, f"{k}.h5") for k in times}
        for _ in range(args.repeat):
            METRICS._entries.pop("acc_gap", None)
            times["plain"].append(run(base, out["plain"]))
            METRICS.register("acc_gap", acc_gap, clients=True)
            times["loaded"].append(run(base, out["loaded"]))
            if "named" in times:
                times["named"].append(run(named, out["named"]))
        unchanged = same_file(out["plain"], out["loaded"])
    print(f"# metric_cost on {machine()}, quickstart {args.rounds} rounds, best of {args.repeat}, "
          f"load {os.getloadavg()[0]:.1f}")
    ref = min(times["plain"])
    for k, v in times.items():
        print(f"{k:7s} {min(v):7.2f} s  x{min(v) / ref:5.2f}")
    print(f"loaded == plain (metric names and values): {unchanged}")


if __name__ == "__main__":
    main()
