"""What the per-client outputs (``ClientOutputs``) cost in a round of the anchor task
(benchmarks/at1.py's config), measured in one process, one rank:

    python benchmarks/outputs_cost.py [--rounds 400] [--norms] [--quantities] [--model mlp]

FedAvg made to declare ``client_outputs = True`` (``--norms``: ``delta_norms`` too), as an
algorithm that reads ``self.outputs`` does; without the declaration FedAvg computes none of it.
Rounds alternate between the round as it is and the same round without the outputs (the
trainer's loss recording, ||Delta_i||^2 and the gather skipped), so both saw the same machine
load; prints the fastest and the 10th-percentile round of each (wall clock), and the share.
``--quantities``: rounds with ``client_quantities = (MEAN_SQUARED_LOSS,)`` declared (the per-sample
losses kept, engine.quantities) alternate with rounds of ``client_outputs`` alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from at1 import anchor  # noqa: E402
from fedmpi import config, plugins  # noqa: E402
from fedmpi.algorithms import base  # noqa: E402
from fedmpi.build import build_components  # noqa: E402
from fedmpi.runtime import World  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--off", default="stats,norm,gather", help="parts to switch off in the rounds without")
    ap.add_argument("--norms", action="store_true", help="declare delta_norms too (qffl, fedexp)")
    ap.add_argument("--model", default="logreg", help="task.model (logreg: the closed form; mlp: the stacked "
                                                      "layers' autograd)")
    ap.add_argument("--quantities", action="store_true",
                    help="compare client_quantities = (MEAN_SQUARED_LOSS,) with client_outputs alone")
    args = ap.parse_args()
    torch.set_num_threads(1)
    plugins.load([])
    cfg = anchor(args.rounds + 10, "cpu")
    cfg["task"]["model"] = args.model
    algo = build_components(config.from_dict(cfg), World()).algorithm
    algo.client_outputs, algo.delta_norms = True, args.norms  # as a class reading self.outputs declares
    trainer, gather = algo.ctx.trainer.train, base.ClientOutputs.gather
    empty = base.ClientOutputs(*[np.zeros(0)] * 6)
    _norm = algo._delta_sq

    off = set(args.off.split(","))

    def without(on: bool) -> None:  # the outputs off: no loss recording, no norms, no gather
        if args.quantities:  # the outputs on either way; the quantity only in the rounds "with"
            from fedmpi.engine.quantities import MEAN_SQUARED_LOSS  # (not in an older checkout: --plain)

            algo.client_quantities = (MEAN_SQUARED_LOSS,) if on else ()
            return
        algo.ctx.trainer.train = trainer if on or "stats" not in off else \
            (lambda *a, stats=None, **k: trainer(*a, **k))
        base.ClientOutputs.gather = gather if on or "gather" not in off else classmethod(lambda cls, *a: empty)
        algo._delta_sq = _norm if on or "norm" not in off else (lambda start, end: np.zeros(len(end)))

    times: dict[bool, list[float]] = {True: [], False: []}
    for t in range(10):
        algo.round(t)
    for t in range(10, args.rounds + 10):
        on = t % 2 == 0
        without(on)
        t0 = time.perf_counter()
        algo.round(t)
        times[on].append(time.perf_counter() - t0)
    without(True)
    what = "quantities" if args.quantities else "outputs"
    for on, label in ((False, f"without {what}"), (True, f"with {what}")):
        v = np.sort(times[on]) * 1000
        print(f"{label:16s} fastest {v[0]:.2f} ms, 10th percentile {v[len(v) // 10]:.2f} ms, "
              f"median {np.median(v):.2f} ms")
    a, b = (np.sort(times[k])[len(times[k]) // 10] for k in (False, True))
    print(f"{what} ({'sq_loss' if args.quantities else args.off + ' off'}): {100 * (b - a) / a:+.1f}% of a round "
          f"(10th percentiles), "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
