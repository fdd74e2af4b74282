"""Model zoo and model registry: ``register``, ``build_model``, ``loss_fn``, ``count_params``.

A model is a registered factory ``(in_shape, classes, params) -> nn.Module``; ``params`` is the
``task`` block, which holds the model's own keys (a ``ModelParams`` subclass, e.g. ``hidden``
of ``mlp``). Built-ins: logreg, linear_svm (multi-class hinge loss), mlp, svhn_cnn, cifar_cnn,
cinic_cnn (dropout 0.2), vgg11, pfl_cnn (pfl-research's CIFAR-10 CNN, with its own Glorot
init) -- see ``nets`` -- and ``scalar`` (the quadratic task's model, built by that dataset).

Initialisation is a pure function of ``seed``; torch's global RNG is never touched. Built-ins
(``init="fedmpi"``) are made on the meta device and get Kaiming-normal weights and zero biases
on conv/hidden layers, PyTorch's default uniform(+-1/sqrt(fan_in)) on the output layer, from a
local ``torch.Generator``. A plug-in's module keeps its own initialisation (``init="own"``), run
under a forked global RNG seeded with ``seed``. Models hold no persistent buffers, so
``dict(model.named_parameters())`` describes them fully: the engine trains many clients'
copies at once through its stacked layers (``engine.layers``), or ``torch.func.functional_call``
+ ``vmap`` + ``grad`` for other modules. A parameter with ``requires_grad`` False is frozen: it
belongs to the base every client shares, held once per rank, and only the others are the
clients' own (``engine.params``). Losses: ``models.losses``. Dropout is
``models.dropout.KeyedDropout``: its mask comes from a per-client key the engine passes (a
non-persistent buffer), not from torch's generator; ``nn.Dropout`` is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import psutil
import torch
from torch import nn

from ..data.datasets import TaskConfig
from ..errors import InputError
from ..registry import MODELS
from ..schema import Digest, opt
from . import adapters
from .adapters import AdapterParams
from .losses import Loss, cross_entropy, multiclass_hinge
from .nets import ARCHS, pfl_cnn



@dataclass
class ModelParams(TaskConfig):
    """Base of a model's own parameters (they sit in the ``task`` block): every model takes an
    ``adapter`` (``models.adapters``)."""

    adapter: AdapterParams = opt(AdapterParams(), "an adapter (LoRA) trained over the frozen model; "
                                                  "kind none trains every parameter (models/adapters.py)")
    init: Optional[str] = opt(None, "start from a pretrained model: a result file (RUN.h5) of this model, its "
                                    "final parameters (LoRA merged into the base), or a folder of safetensors "
                                    "weights (a Hugging Face folder for hf); its parameters are the model's before "
                                    "the adapter (models/pretrained.py); null = initialised from the seed",
                                digest=Digest(absent=None))  # from the seed: the checkpoints before this key


Factory = Callable[[tuple, int, TaskConfig], nn.Module]


def register(name: str, *, params: type | None = None, loss: Loss | None = None, init: str | Callable = "own",
             check: Callable | None = None, targets: tuple[str, ...] = ()) -> Callable[[Factory], Factory]:
    """Decorator registering a model factory ``(in_shape, classes, params) -> nn.Module``.

    ``params``: a ``ModelParams`` subclass with the model's own keys (in the ``task`` block;
    default ``ModelParams``: ``adapter`` only); ``loss``: (logits, labels) -> mean loss, default
    cross-entropy; ``init``: ``"own"`` keeps the module's initialisation (seeded), ``"fedmpi"``
    re-initialises Linear/Conv2d layers, a function ``init(model, gen)`` initialises the model
    built on the meta device from the seeded ``torch.Generator`` ``gen`` (the transformer's);
    ``targets``: the module names an adapter wraps when ``task.adapter.target_modules`` is null
    (``models.adapters``)."""
    if init not in ("own", "fedmpi") and not callable(init):
        raise ValueError(f"model {name!r}: init must be 'own', 'fedmpi' or a function (model, gen), got {init!r}")
    return MODELS.register(name, params=params or ModelParams, check=check, loss=loss, init=init,
                           targets=tuple(targets))


def build_model(name: str, in_shape: tuple[int, ...], classes: int, seed: int = 0,
                params: TaskConfig | None = None,
                pretrained: Callable[[nn.Module], None] | None = None) -> nn.Module:
    """Model ``name`` for inputs of shape ``in_shape`` (without batch dim), initialised from ``seed``,
    then given ``pretrained``'s weights (a function loading them into the model, before its adapter:
    ``task.init``, ``models.pretrained``), with the adapter of ``params.adapter``
    (``models.adapters``: the rest then frozen).

    ``params``: the ``task`` block with the model's keys (default: the model's defaults)."""
    entry = MODELS.get(name)
    params = params if params is not None else (entry.params or ModelParams)()
    shape = tuple(int(d) for d in in_shape)
    init = entry.options["init"]
    if init != "own":
        with torch.device("meta"):  # no allocation, no default init drawing from the global RNG
            model = entry.obj(shape, int(classes), params)
        _check_size(name, model)
        _materialise(model)
        (_init if init == "fedmpi" else init)(model, torch.Generator().manual_seed(int(seed)))
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            model = entry.obj(shape, int(classes), params).to("cpu")
    _check_trainable(name, model)
    if pretrained is not None:  # a pretrained model's weights, before the adapter
        pretrained(model)
    adapter = getattr(params, "adapter", None)
    if adapter is not None:
        adapters.apply(model, adapter, seed, entry.options.get("targets", ()))
    return model


def _materialise(model: nn.Module) -> None:
    """Give the parameters and buffers of a model built on the meta device uninitialised,
    contiguous CPU memory, in place. Like ``nn.Module.to_empty``, except that a tensor shared by
    two modules (tied weights) stays one tensor, where ``to_empty`` makes two. ``to_empty`` also
    goes through torch's Python reference of ``empty_like``, whose first call imports sympy:
    0.25 s of every run's start-up, for a model of any size."""
    made: dict[int, torch.Tensor] = {}

    def empty(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            new = torch.empty(t.shape, dtype=t.dtype, device="cpu")
            made[id(t)] = nn.Parameter(new, t.requires_grad) if isinstance(t, nn.Parameter) else new
        return made[id(t)]

    for mod in model.modules():
        for table in (mod._parameters, mod._buffers):
            for key, t in table.items():
                if t is not None:
                    table[key] = empty(t)


def _check_trainable(name: str, model: nn.Module) -> None:
    """Refuse what stacked-parameter training cannot reproduce (persistent buffers, nn.Dropout) and
    a model with nothing to train (every parameter frozen)."""
    if not isinstance(model, nn.Module):
        raise InputError(f"task.model: {name!r} must build an nn.Module, got {type(model).__name__}")
    extra = sorted(set(model.state_dict()) - {n for n, _ in model.named_parameters(remove_duplicate=False)})
    if extra:
        raise InputError(f"task.model: {name!r} has buffers ({', '.join(extra[:3])}); fedmpi trains "
                         f"parameters only (no batch-norm statistics)")
    if any(isinstance(mod, nn.Dropout) for mod in model.modules()):
        raise InputError(f"task.model: {name!r} uses nn.Dropout, whose masks depend on torch's global "
                         f"generator; use fedmpi.models.dropout.KeyedDropout")
    if not any(p.requires_grad for p in model.parameters()):
        raise InputError(f"task.model: {name!r} has no trainable parameter (every one has requires_grad False)")


def _check_size(name: str, model: nn.Module) -> None:
    """Refuse, before allocating, a model larger than half the available memory (task.hidden:
    10**5 makes a 40 GB mlp, which would be an OOM kill or a DefaultCPUAllocator traceback)."""
    n = sum(p.numel() for p in model.parameters())
    need, free = 4 * n, psutil.virtual_memory().available
    if need > free // 2:
        raise InputError(f"task.model: {name} has {n} parameters here ({need / 2**30:.1f} GiB), more than half "
                         f"of the {free / 2**30:.1f} GiB available (check task.hidden)")


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


def loss_fn(name: str) -> Loss:
    """Training loss of model ``name``: (logits (..., b, classes), y (..., b) int64) -> the mean
    over b, leading (client) dims kept for a ``Loss`` (``models.losses``)."""
    return MODELS.get(name).options["loss"] or cross_entropy


def count_params(model: nn.Module) -> int:
    """Number of scalar parameters."""
    return sum(p.numel() for p in model.parameters())


def has_conv(model: nn.Module) -> bool:
    """True when the model has convolutions (they change which training path is faster)."""
    return any(isinstance(mod, nn.modules.conv._ConvNd) for mod in model.modules())


# ----------------------------------------------------------------------------- built-ins

@dataclass
class MLPParams(ModelParams):
    hidden: int = opt(200, "hidden width", ge=1)


def _scalar_only_with_quadratic(cfg) -> None:
    if cfg.task.dataset != "quadratic":
        raise InputError(f"task.model: 'scalar' is only for dataset quadratic, got dataset {cfg.task.dataset!r}")


def _builtin(arch: str) -> Factory:
    def make(in_shape: tuple, classes: int, params: TaskConfig) -> nn.Module:
        return ARCHS[arch](in_shape, classes, params.hidden if isinstance(params, MLPParams) else 0)

    make.__qualname__ = f"builtin_{arch}"
    return make


def _scalar(in_shape: tuple, classes: int, params: TaskConfig) -> nn.Module:
    raise InputError("task.model: 'scalar' is built by the quadratic dataset")


for _arch in ARCHS:
    register(_arch, params=MLPParams if _arch == "mlp" else None, init="fedmpi",
             loss=multiclass_hinge if _arch == "linear_svm" else None)(_builtin(_arch))
register("scalar", check=_scalar_only_with_quadratic)(_scalar)


@register("pfl_cnn", init="own")  # keeps its authors' Glorot init (nets.pfl_cnn)
def _pfl_cnn(in_shape: tuple, classes: int, params: TaskConfig) -> nn.Module:
    return pfl_cnn(in_shape, classes)


from . import transformer  # noqa: E402,F401  (registers the transformer: it needs ``register`` above)
from . import hf  # noqa: E402,F401  (registers hf, a Hugging Face causal LM folder: transformers imported when built)
