"""The quadratic task in one process: F_i(x) = (x - u_i)^2 / 2 with exact gradients, so s local
steps of size eta_l from x give x_i^{t,s} = u_i + q (x - u_i) with q = (1 - eta_l)^s; a
scripted participation model; the algorithm of a config built on one rank."""

from __future__ import annotations

import numpy as np
import torch

from fedmpi import algorithms, config
from fedmpi.build import build_components
from fedmpi.participation import Participation
from fedmpi.runtime import World

CPU = torch.device("cpu")
LR, S = 0.5, 2  # eta_l, s  ->  q = (1 - eta_l)^s = 0.25
Q = (1 - LR) ** S


class Scripted(Participation):
    """A fixed list of available sets (round t uses script[t]), and p_i^t when given."""

    configuration = ("script", "probs")

    def __init__(self, m: int, script: list[list[int]], probs: list[list[float]] | None = None):
        super().__init__(m, seed=0)
        self.script, self.probs = script, probs

    def available(self, t: int) -> np.ndarray:
        return np.asarray(self.script[t], dtype=np.int64)

    def probabilities(self, t: int) -> np.ndarray | None:
        return None if self.probs is None else np.asarray(self.probs[t], dtype=np.float64)


def quadratic_cfg(name: str, u: list, x0: float = 0.0, eta_g: float = 1.0, lr: float = LR, s: int = S,
                  availability: dict | None = None, train: dict | None = None, **algo) -> config.Config:
    return config.from_dict({
        "seed": 1, "task": {"dataset": "quadratic", "model": "scalar", "clients": len(u), "u": u, "x0": x0},
        "train": {"local_steps": s, "lr": lr, "batch_size": 1, "engine": "sequential", **(train or {})},
        "algorithm": {"name": name, "global_lr": eta_g, **algo}, "availability": availability or {"kind": "always"},
        "runtime": {"progress": False}})


def build(cfg: config.Config, part: Participation | None = None) -> algorithms.Algorithm:
    """The algorithm of ``cfg`` in this process (World() = one rank), on ``part`` or the config's kind."""
    return build_components(cfg, World(), participation=part).algorithm


def scalar(x: torch.Tensor) -> float:
    return float(x.reshape(-1)[0])
