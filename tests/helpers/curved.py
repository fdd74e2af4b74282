"""Quadratics with heterogeneous curvature, F_i(x) = a_i (x - u_i)^2 / 2, and a script of
available sets (SCAFFOLD's and the local-step tests' scenario)."""

from __future__ import annotations

import torch

from fedmpi.build import build_components, build_task
from fedmpi.runtime import World
from helpers.quadratic import CPU, quadratic_cfg

U, A = [0.0, 8.0, -4.0], [0.5, 1.0, 3.0]  # optima and curvatures
M, X0, LR, S = 3, 2.0, 0.2, 4
SCRIPT = [[0, 1], [], [2], [0, 1, 2], [1], [0, 2], [0, 1, 2], [2]]


def curved_build(name: str, u=U, a=A, part=None, s: int = S, lr: float = LR, eta_g: float = 1.0,
                 train: dict | None = None, **algo):
    """``name`` on F_i(x) = a_i ||x - u_i||^2 / 2: the quadratic task with a curvature column in
    its targets and a loss that uses it; ``train``: other ``train.*`` keys."""
    cfg = quadratic_cfg(name, u, X0, eta_g=eta_g, lr=lr, s=s, **algo)
    for k, v in (train or {}).items():
        setattr(cfg.train, k, v)
    task = build_task(cfg, CPU)
    task.train_y = torch.cat([task.train_y, torch.tensor(a, dtype=torch.float32)[:, None]], dim=1)
    task.loss = lambda out, y: 0.5 * (y[..., -1:] * (out - y[..., :-1]).pow(2)).sum(-1).mean()
    return build_components(cfg, World(), participation=part, task=task).algorithm
