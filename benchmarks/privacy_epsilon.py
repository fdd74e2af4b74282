"""The epsilon fedmpi reports for the privacy setups of issue #34, beside dp-accounting's own
answer for the event of the tightest analysis it has (benchmarks/RESULTS.md).

    PYTHONPATH=. python benchmarks/privacy_epsilon.py            # this checkout
    PYTHONPATH=/path/to/older python benchmarks/privacy_epsilon.py   # the same on another checkout

Each line builds the run as ``fedmpi run`` does (nothing trains) and asks its accountant for
epsilon after T rounds at delta = 1e-6."""

from __future__ import annotations

import logging
import math

import dp_accounting as dp

from fedmpi import config
from fedmpi.build import build_components
from fedmpi.runtime import World

logging.getLogger("absl").setLevel(logging.ERROR)
DELTA = 1e-6


def reported(availability: dict, privacy: dict, rounds: int, clients: int = 40) -> float:
    cfg = {"seed": 0, "rounds": rounds, "eval_every": rounds, "algorithm": {"name": "fedavg_active"},
           "task": {"dataset": "synthetic", "clients": clients, "model": "logreg", "partition": {"kind": "iid"},
                    "synthetic": {"samples": 20 * clients, "test_samples": 20, "features": 3, "classes": 2}},
           "availability": availability, "privacy": {"clip": 1.0, "delta": DELTA, **privacy},
           "runtime": {"progress": False}}
    return build_components(config.from_dict(cfg), World()).algorithm.privacy.epsilon(rounds)


def library(event, relation=dp.NeighboringRelation.ADD_OR_REMOVE_ONE, accountant: str = "rdp") -> float:
    acc = (dp.pld.PLDAccountant if accountant == "pld" else dp.rdp.RdpAccountant)(neighboring_relation=relation)
    acc.compose(event)
    return acc.get_epsilon(DELTA)


def main() -> None:
    T, K, sigma = 400, 4, 1.5
    print(f"banded_mf, band {K}, cyclic K = {K} groups, T = {T}, sigma = {sigma}, delta = {DELTA:g}")
    print(f"{'q':>5}  {'fedmpi reports':>14}  {'no amplification':>16}  {'amplified_bandmf_event':>22}")
    for q in (0.5, 0.1):
        got = reported({"kind": "cyclic", "groups": K, "base": {"kind": "fixed", "values": [q]}},
                       {"mechanism": "banded_mf", "band": K, "noise_multiplier": sigma}, T)
        plain = library(dp.SelfComposedDpEvent(dp.GaussianDpEvent(sigma), math.ceil(T / K)))
        amplified = library(dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(sigma)),
                                                   math.ceil(T / K)))
        print(f"{q:>5}  {got:>14.4g}  {plain:>16.4g}  {amplified:>22.4g}")


if __name__ == "__main__":
    main()
