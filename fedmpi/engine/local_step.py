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

import math
from dataclasses import dataclass
from typing import Callable, Literal, Optional

import torch

from ..errors import InputError
from ..schema import Digest, opt


@dataclass
class TrainConfig:
    local_steps: int = opt(5, "s: local SGD steps per round", ge=1, le=2**31 - 1)
    local_epochs: Optional[float] = opt(
        None, "E: client i does ceil(n_i E / batch_size) steps instead of s; null = off", gt=0)
    local_steps_file: Optional[str] = opt(
        None, "a text file of m integers >= 1, client i's steps instead of s (e.g. measured device speeds); "
        "null = off")
    local_steps_draw: Literal["fixed", "uniform", "geometric", "lognormal"] = opt(
        "fixed", "how much of its c_i steps a client does (always 1..c_i; engine/steps.py): uniform: each round "
        "uniformly; geometric: each round, interrupted after each step with probability local_steps_stop; "
        "lognormal: floor(v_i c_i) every round, device speed v_i = exp(local_steps_sigma z_i) drawn once")
    local_steps_stop: float = opt(0.2, "q: the geometric draw's chance of stopping after each step", gt=0, lt=1,
                                  digest=Digest(when=(("local_steps_draw", "geometric"),)))
    local_steps_sigma: float = opt(1.0, "sigma: the lognormal draw's log-speed spread", gt=0, le=100,
                                   digest=Digest(when=(("local_steps_draw", "lognormal"),)))
    batch_size: int = opt(32, "minibatch size (drawn uniformly with replacement)", ge=1)
    lr: float = opt(0.05, "eta_l (eta_0 when scheduled)", gt=0)
    lr_schedule: str = opt(
        "constant", "eta_l by 0-based round t: constant, inv_sqrt (eta_0 / sqrt(t/10 + 1)), cosine, step, "
        "warmup_<any of these>, or a plug-in's (fedmpi.engine.local_step.lr_schedule)")
    lr_period: Optional[int] = opt(
        None, "T: cosine eta_0 (1 + cos(pi min(t, T) / T)) / 2; step: eta_0 lr_gamma^floor(t / T)", ge=1)
    lr_gamma: float = opt(0.1, "the step schedule's factor every lr_period rounds", gt=0)
    lr_warmup: int = opt(0, "W: warmup_<schedule> ramps eta_0 (t + 1) / W for t < W, then follows it", ge=0)
    grad_clip: Optional[float] = opt(None, "clip each client's gradient to this norm; null = off", gt=0)
    momentum: float = opt(0.0, "local SGD momentum, buffer reset every round; 0 = plain SGD", ge=0, lt=1)
    weight_decay: float = opt(0.0, "local L2 weight decay, added to each (clipped) gradient; 0 = off", ge=0)
    augment: list = opt([], "on-device augmentation: any of crop, flip")
    augment_mode: Literal["per_image", "per_batch"] = opt(
        "per_image", "per_batch draws one crop/flip per minibatch (authors' code)")
    full_gradient: bool = opt(False, "local steps use the client's full local gradient (GD)")
    engine: Literal["auto", "batched", "sequential"] = opt(
        "auto", "batched = all clients of a rank at once; auto picks the faster path")
    cuda_graphs: bool = opt(
        False, "on CUDA, replay each block's local steps as one captured CUDA graph (stacked models; algorithms "
        "without step terms); the same bits, fewer launches (engine/graphs.py)",
        result=False, resume=True)  # how the steps are launched, not what they compute

    def __post_init__(self) -> None:
        if self.local_epochs is not None and self.local_steps_file is not None:
            raise InputError("train.local_steps_file: give either local_epochs or local_steps_file, not both")
        base = self.lr_schedule.removeprefix("warmup_")
        if base not in LR_SCHEDULES:
            raise InputError(f"train.lr_schedule: unknown schedule {self.lr_schedule!r} (allowed: "
                             f"{', '.join(LR_SCHEDULES)}, and warmup_ before any of them)")
        if base in ("cosine", "step") and self.lr_period is None:
            raise InputError(f"train.lr_period: the {base} schedule needs its period in rounds")
        if base != self.lr_schedule and self.lr_warmup < 1:
            raise InputError(f"train.lr_warmup: {self.lr_schedule} needs a warmup of at least 1 round")


#: name -> f(train config, 0-based round t) -> eta_l; ``lr_schedule`` adds to it.
LR_SCHEDULES: dict[str, Callable[[TrainConfig, int], float]] = {}


def lr_schedule(name: str) -> Callable:
    """Decorator: ``@lr_schedule("name") def f(cfg: TrainConfig, t: int) -> float`` makes
    ``train.lr_schedule: name`` (and ``warmup_name``) available; a plug-in may add its own. It must
    be a function of its arguments only (every rank computes it)."""

    def deco(fn: Callable[[TrainConfig, int], float]) -> Callable[[TrainConfig, int], float]:
        LR_SCHEDULES[name] = fn
        return fn

    return deco


def lr_at(cfg: TrainConfig, t: int) -> float:
    """eta_l at 0-based round t: ``cfg.lr_schedule`` (``warmup_X``: eta_0 (t + 1) / W while t < W, then X)."""
    base = cfg.lr_schedule.removeprefix("warmup_")
    if base != cfg.lr_schedule and t < cfg.lr_warmup:
        return cfg.lr * (t + 1) / cfg.lr_warmup
    return LR_SCHEDULES[base](cfg, t)


@lr_schedule("constant")
def _constant(cfg: TrainConfig, t: int) -> float:
    return cfg.lr


@lr_schedule("inv_sqrt")
def _inv_sqrt(cfg: TrainConfig, t: int) -> float:
    return cfg.lr / math.sqrt(t / 10.0 + 1.0)


@lr_schedule("cosine")
def _cosine(cfg: TrainConfig, t: int) -> float:
    return cfg.lr * (1.0 + math.cos(math.pi * min(t, cfg.lr_period) / cfg.lr_period)) / 2.0


@lr_schedule("step")
def _step(cfg: TrainConfig, t: int) -> float:
    return cfg.lr * cfg.lr_gamma ** (t // cfg.lr_period)


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
        d = self.add_terms(name, d, v)
        if not self.momentum:
            return d
        if name not in self.buf:
            self.buf[name] = d.clone()  # momentum * 0 + d
        else:
            self.buf[name].mul_(self.momentum).add_(d)
        return self.buf[name]

    def add_terms(self, name: str, d: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """d plus the algorithm's terms for parameter block ``name``."""
        for term, rows in self.terms:
            d = term.add(d, v, rows[name])
        return d
