"""A model plug-in: an MLP with residual blocks, ``h <- h + relu(W h + b)``.

A model is a factory ``(in_shape, classes, params) -> nn.Module``; ``params`` is the ``task``
block, which holds the model's own keys (``width``, ``blocks``) next to the common ones. The
module's own initialisation is kept; fedmpi runs it under a generator seeded with ``seed``, so
every rank builds the same model. It must have parameters only (no batch-norm statistics) and
no ``nn.Dropout`` (use ``fedmpi.models.dropout.KeyedDropout``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from fedmpi.config import ModelParams, opt
from fedmpi.models import register


@dataclass
class ResMLPParams(ModelParams):
    width: int = opt(64, "hidden width", ge=1)
    blocks: int = opt(2, "residual blocks", ge=0)


class ResMLP(nn.Module):
    def __init__(self, features: int, classes: int, width: int, blocks: int):
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x.flatten(1)))
        for block in self.blocks:
            h = h + torch.relu(block(h))
        return self.out(h)


@register("resmlp", params=ResMLPParams)
def resmlp(in_shape: tuple, classes: int, params: ResMLPParams) -> nn.Module:
    return ResMLP(math.prod(in_shape), classes, params.width, params.blocks)
