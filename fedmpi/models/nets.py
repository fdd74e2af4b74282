"""Architectures of the model zoo, as plain ``nn.Sequential`` stacks with named layers.

No batch norm and no buffers: a model is fully described by its named parameters, which
is what stacked-parameter training (``functional_call`` + ``vmap``) needs. Conv layers are
3x3, stride 1, padding 1, each followed by ReLU; ``M`` is a 2x2 max-pool.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from ..errors import InputError
from .dropout import KeyedDropout


def _flat(in_shape: tuple[int, ...]) -> int:
    return math.prod(in_shape)


def linear(in_shape: tuple[int, ...], classes: int) -> nn.Module:
    """logreg / linear_svm: flatten + Linear(in, classes)."""
    return nn.Sequential(OrderedDict(flatten=nn.Flatten(), out=nn.Linear(_flat(in_shape), classes)))


def mlp(in_shape: tuple[int, ...], classes: int, hidden: int) -> nn.Module:
    """The 3-layer MLP of the debiasing paper: Linear-ReLU-Linear-ReLU-Linear."""
    return nn.Sequential(OrderedDict(
        flatten=nn.Flatten(),
        fc1=nn.Linear(_flat(in_shape), hidden), relu1=nn.ReLU(),
        fc2=nn.Linear(hidden, hidden), relu2=nn.ReLU(),
        out=nn.Linear(hidden, classes)))


def conv_stack(name: str, in_shape: tuple[int, ...], plan: list) -> tuple[list[tuple[str, nn.Module]], int]:
    """Layers for a plan like [32, "M", 32, "M"]; returns them and the flattened output size."""
    if len(in_shape) != 3:
        raise InputError(f"task.model: {name} needs image inputs (C, H, W), got shape {in_shape}")
    c, h, w = in_shape
    pools = plan.count("M")
    if h >> pools == 0 or w >> pools == 0:
        raise InputError(f"task.model: {name} needs images of at least {2 ** pools}x{2 ** pools}, got {h}x{w}")
    layers, i = [], 0
    for v in plan:
        if v == "M":
            layers.append((f"pool{i}", nn.MaxPool2d(2)))
            h, w = h // 2, w // 2
        else:
            i += 1
            layers += [(f"conv{i}", nn.Conv2d(c, v, 3, padding=1)), (f"relu_c{i}", nn.ReLU())]
            c = v
    return layers, c * h * w


def cnn(name: str, in_shape: tuple[int, ...], classes: int, plan: list, widths: list[int],
        dropout: float = 0.0) -> nn.Module:
    """conv_stack(plan) -> flatten -> [dropout] Linear(width) ReLU ... -> [dropout] Linear(classes)."""
    layers, size = conv_stack(name, in_shape, plan)
    layers.append(("flatten", nn.Flatten()))
    for j, width in enumerate(widths + [classes], 1):
        if dropout:
            layers.append((f"drop{j}", KeyedDropout(dropout, salt=j)))
        last = j == len(widths) + 1
        layers.append(("out" if last else f"fc{j}", nn.Linear(size, width)))
        if not last:
            layers.append((f"relu{j}", nn.ReLU()))
        size = width
    return nn.Sequential(OrderedDict(layers))


def pfl_cnn(in_shape: tuple[int, ...], classes: int) -> nn.Module:
    """pfl-research's CIFAR-10 benchmark CNN (``simple_cnn`` of apple/pfl-research,
    publications/pfl/compare_utils/pytorch.py): two unpadded 3x3 convolutions (32, 64 channels)
    with ReLU, a 2x2 max-pool, dropout 0.25, Linear(128) ReLU, dropout 0.5, Linear(classes);
    Glorot-uniform weights and PyTorch's default biases, as there (1,626,442 parameters at
    3x32x32 / 10 classes). Dropout is ``KeyedDropout``, drawn per client from fedmpi's streams."""
    if len(in_shape) != 3 or in_shape[1] < 6 or in_shape[2] < 6:
        raise InputError(f"task.model: pfl_cnn needs images (C, H, W) of at least 6x6, got shape {in_shape}")
    c, h, w = in_shape
    model = nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(c, 32, 3), relu_c1=nn.ReLU(), conv2=nn.Conv2d(32, 64, 3), relu_c2=nn.ReLU(),
        pool=nn.MaxPool2d(2), drop1=KeyedDropout(0.25, salt=1), flatten=nn.Flatten(),
        fc1=nn.Linear(64 * ((h - 4) // 2) * ((w - 4) // 2), 128), relu1=nn.ReLU(), drop2=KeyedDropout(0.5, salt=2),
        out=nn.Linear(128, classes)))
    for mod in model.modules():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(mod.weight)  # torch's global generator: build_model seeds a fork of it
    return model


_PAPER_CONVS = [32, "M", 32, "M"]
_VGG11 = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]

ARCHS = {
    # FedSWE paper CNNs (parameter counts at 3x32x32 / 10 classes: 273,706 / 551,786 / 1,193,130)
    "svhn_cnn": lambda s, k, h: cnn("svhn_cnn", s, k, _PAPER_CONVS, [128]),
    "cifar_cnn": lambda s, k, h: cnn("cifar_cnn", s, k, _PAPER_CONVS, [256, 64]),
    "cinic_cnn": lambda s, k, h: cnn("cinic_cnn", s, k, _PAPER_CONVS, [512, 256], dropout=0.2),
    # VGG11 for CIFAR-size inputs (the usual CIFAR variant: conv features -> Linear(512, classes))
    "vgg11": lambda s, k, h: cnn("vgg11", s, k, _VGG11, []),
    "logreg": lambda s, k, h: linear(s, k),
    "linear_svm": lambda s, k, h: linear(s, k),
    "mlp": lambda s, k, h: mlp(s, k, h),
}


class ScalarModel(torch.nn.Module):
    """The quadratic task's model: the vector x itself (forward ignores its input)."""

    def __init__(self, dim: int, x0: float):
        super().__init__()
        self.x = torch.nn.Parameter(torch.full((dim,), float(x0)))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return self.x.expand(*inp.shape[:-1], self.x.shape[0])
