"""The local optimizer step: what a client does with its minibatch gradient.

For a block of parameters v (one row per client) with its (clipped) loss gradient g, one
local step is

    d   = g + weight_decay * v + (the algorithm's terms)                 (terms that are off are skipped)
    buf = momentum * buf + d                                          (buf = 0 when training starts)
    v  <- v - lr * buf                                                (v - lr * d without momentum)

``weight_decay`` and ``momentum`` are ``train.*`` keys (torch.optim.SGD's convention: decay
added to the gradient, no dampening, no Nesterov). The algorithm's terms are ``StepTerm``
objects it hands to the trainer (FedProx's proximal term mu (v - x_start), SCAFFOLD's
correction c - c_i; ``ServerAlgorithm.local_terms``): the engine knows no algorithm.
``grad_clip`` clips only g, as ``clip_grad_norm_`` before an optimizer step would. The momentum
buffer lives for one call of the trainer, so it is reset every round, as is usual in FL. Every
term is elementwise per client, so a client's step does not depend on its batch-mates or on the
number of ranks; with every option off ``d`` is ``g`` itself (the same bits as plain SGD).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch

from ..schema import opt


@dataclass
class TrainConfig:
    local_steps: int = opt(5, "s: local SGD steps per round", ge=1)
    local_epochs: Optional[float] = opt(
        None, "E: client i does ceil(n_i E / batch_size) steps instead of s; null = off", gt=0)
    local_steps_draw: Literal["fixed", "uniform"] = opt(
        "fixed", "uniform: each round a client does 1..its steps, uniformly (stragglers' partial work)")
    batch_size: int = opt(32, "minibatch size (drawn uniformly with replacement)", ge=1)
    lr: float = opt(0.05, "eta_l (eta_0 when scheduled)", gt=0)
    lr_schedule: Literal["constant", "inv_sqrt"] = opt(
        "constant", "inv_sqrt: eta_0 / sqrt(t/10 + 1), t the 0-based round")
    global_lr: float = opt(1.0, "eta_g, server learning rate", gt=0)
    grad_clip: Optional[float] = opt(None, "clip each client's gradient to this norm; null = off", gt=0)
    momentum: float = opt(0.0, "local SGD momentum, buffer reset every round; 0 = plain SGD", ge=0, lt=1)
    weight_decay: float = opt(0.0, "local L2 weight decay, added to each (clipped) gradient; 0 = off", ge=0)
    augment: list = opt([], "on-device augmentation: any of crop, flip")
    augment_mode: Literal["per_image", "per_batch"] = opt(
        "per_image", "per_batch draws one crop/flip per minibatch (authors' code)")
    full_gradient: bool = opt(False, "local steps use the client's full local gradient (GD)")
    engine: Literal["auto", "batched", "sequential"] = opt(
        "auto", "batched = all clients of a rank at once; auto picks the faster path")


class StepTerm:
    """An algorithm's term of the local step's direction d, one row per trained client.

    ``rows`` (n, d): what the term needs per client, in the order of the trained clients (the
    trainer cuts and pads it along with them); ``add(d, v, row)`` returns d plus the term for one
    parameter block: ``v`` the clients' parameters, ``row`` the same block of ``rows``. It must
    be elementwise per client and must not change ``rows`` (nor may ``rows`` be the trained
    tensor itself)."""

    def __init__(self, rows: torch.Tensor):
        self.rows = rows

    def add(self, d: torch.Tensor, v: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class LocalStep:
    """The step rule of one training call for one block of clients.

    ``terms``: the algorithm's ``StepTerm`` objects, each with its rows as {name: (n, *shape)}
    blocks matching the parameter blocks."""

    def __init__(self, cfg: TrainConfig, terms: list[tuple[StepTerm, dict[str, torch.Tensor]]] = ()):
        self.weight_decay, self.momentum = cfg.weight_decay, cfg.momentum
        self.terms = terms
        self.buf: dict[str, torch.Tensor] = {}

    def direction(self, name: str, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The d (or momentum buffer) that multiplies -lr for parameter block ``name``."""
        d = g
        if self.weight_decay:
            d = d.add(v, alpha=self.weight_decay)
        for term, rows in self.terms:
            d = term.add(d, v, rows[name])
        if not self.momentum:
            return d
        if name not in self.buf:
            self.buf[name] = d.clone()  # momentum * 0 + d
        else:
            self.buf[name].mul_(self.momentum).add_(d)
        return self.buf[name]
