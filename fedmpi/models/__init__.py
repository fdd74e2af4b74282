"""Model zoo: ``build_model``, ``loss_fn``, ``count_params``.

Models: logreg, linear_svm (multi-class hinge loss), mlp, svhn_cnn, cifar_cnn, cinic_cnn
(dropout 0.2), vgg11 -- see ``nets``. Initialisation is a pure function of ``seed`` (a
local ``torch.Generator``; torch's global RNG is never touched): Kaiming-normal weights and
zero biases on conv/hidden layers, PyTorch's default uniform(+-1/sqrt(fan_in)) on the
output layer. Models hold no persistent buffers, so ``dict(model.named_parameters())``
describes them fully and they run under ``torch.func.functional_call`` + ``vmap`` + ``grad``
over stacked parameters. Dropout is ``models.dropout.KeyedDropout``: its mask comes from a
per-client key the engine passes (a non-persistent buffer), not from torch's generator.
"""

from __future__ import annotations

import math
from typing import Callable

import psutil
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .nets import ARCHS

MODELS = tuple(ARCHS)


def build_model(name: str, in_shape: tuple[int, ...], classes: int, hidden: int = 200, seed: int = 0) -> nn.Module:
    """Model ``name`` for inputs of shape ``in_shape`` (without batch dim), initialised from ``seed``."""
    if name not in ARCHS:
        raise InputError(f"task.model: unknown model {name!r} (allowed: {', '.join(MODELS)})")
    with torch.device("meta"):  # no allocation, no default init drawing from the global RNG
        model = ARCHS[name](tuple(int(d) for d in in_shape), int(classes), int(hidden))
    need, free = 4 * count_params(model), psutil.virtual_memory().available
    if need > free // 2:  # refused before allocating (task.hidden: 10**5 makes a 40 GB mlp)
        raise InputError(f"task.model: {name} has {count_params(model)} parameters here ({need / 2**30:.1f} GiB), "
                         f"more than half of the {free / 2**30:.1f} GiB available (check task.hidden)")
    model.to_empty(device="cpu")
    _init(model, torch.Generator().manual_seed(int(seed)))
    return model


def _init(model: nn.Module, gen: torch.Generator) -> None:
    layers = [mod for mod in model.modules() if isinstance(mod, (nn.Linear, nn.Conv2d))]
    with torch.no_grad():
        for j, layer in enumerate(layers):
            if j < len(layers) - 1:  # conv / hidden: Kaiming (He) normal for ReLU
                nn.init.kaiming_normal_(layer.weight, nonlinearity="relu", generator=gen)
                nn.init.zeros_(layer.bias)
            else:  # output layer: PyTorch's default Linear init
                bound = 1.0 / math.sqrt(layer.weight[0].numel())
                nn.init.uniform_(layer.weight, -bound, bound, generator=gen)
                nn.init.uniform_(layer.bias, -bound, bound, generator=gen)


def multiclass_hinge(logits: torch.Tensor, y: torch.Tensor, margin: float = 1.0) -> torch.Tensor:
    """Mean over the batch of sum_{j != y} max(0, margin - z_y + z_j) / classes
    (``F.multi_margin_loss`` semantics, written with vmap-friendly ops)."""
    z_y = logits.gather(-1, y[..., None])
    hinge = (margin - z_y + logits).clamp(min=0).sum(-1) - margin  # the j = y term is exactly margin
    return hinge.mean() / logits.shape[-1]


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y)


def loss_fn(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Training loss of model ``name``: (logits (b, classes), y (b,) int64) -> scalar mean."""
    if name not in ARCHS:
        raise InputError(f"task.model: unknown model {name!r} (allowed: {', '.join(MODELS)})")
    return multiclass_hinge if name == "linear_svm" else cross_entropy


def count_params(model: nn.Module) -> int:
    """Number of scalar parameters."""
    return sum(p.numel() for p in model.parameters())
