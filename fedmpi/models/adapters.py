"""Adapters: a small trainable part added to a frozen base model; the registry of adapter types,
LoRA the first.

The ``task`` block's ``adapter`` selects one (``adapter: {kind: lora, r: 8, ...}``; the default
``kind: none`` trains the whole model). ``apply`` freezes every parameter of the built model
(``requires_grad`` False: the base, held once per rank, ``engine.params``), then the adapter type
adds its own trainable parameters around the modules it targets, initialised from fedmpi's
seeded generator (never torch's global one). The engine then trains, averages, clips and
checkpoints only those; the base product of an adapted layer is shared by the block's clients
(``engine.adapter_layers``).

**Adding an adapter type** (docs/PLUGINS.md): a function ``(model, params, gen, targets) ->
None`` registered with ``register_adapter(name, params=ParamsClass)``, ``ParamsClass`` extending
``AdapterParams`` with the type's own keys; it replaces the target modules of ``model`` in place
(``adapted``: the modules ``target_modules`` names, one-line errors for names that match nothing)
by modules that hold the original as their frozen base. The new module trains through the vmap
path as it is; a stacked rule (``engine.layers.stacked_rule``) makes it a batched layer.

**LoRA** (Hu et al., ICLR 2022; PEFT's conventions): a target ``nn.Linear`` with weight W (out x in)
becomes a ``LoRALinear``: y = base_layer(x) + lora_B(lora_A(dropout(x))) * alpha / r, with A
(r x in) drawn kaiming-uniform with a = sqrt(5) (PEFT's default init), B (out x r) zero, so the
adapted model starts as its base. Parameter names follow PEFT's saved adapters (without PEFT's
adapter name ``default``): ``<target>.base_layer.weight`` and ``.bias`` (frozen),
``<target>.lora_A.weight`` and ``<target>.lora_B.weight`` (the client's). LoRA dropout is a
``KeyedDropout`` (a mask per client and local step from the engine's keyed streams).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from .. import rng
from ..errors import InputError
from ..registry import ADAPTERS
from ..schema import Digest, opt
from .dropout import KeyedDropout


@dataclass
class AdapterParams:
    """The ``task.adapter`` block: ``kind``, then the chosen adapter type's own keys (a subclass)."""

    kind: str = opt("none", "an adapter trained over the frozen model (none: the whole model is trained)",
                    selects=ADAPTERS, digest=Digest(off="none"))  # no adapter: the checkpoints before it


Adapt = Callable[[nn.Module, AdapterParams, torch.Generator, tuple[str, ...]], None]

#: KeyedDropout salts of adapters start here, above any model's own dropout layers'
SALT = 1 << 20


def register_adapter(name: str, *, params: type | None = None,
                     check: Callable | None = None) -> Callable[[Adapt], Adapt]:
    """Decorator registering an adapter type ``fn(model, params, gen, targets) -> None`` (see the
    module docstring). ``params``: an ``AdapterParams`` subclass with its keys (in ``task.adapter``);
    ``targets``: the model's default targets (``fedmpi.models.register(..., targets=...)``)."""
    return ADAPTERS.register(name, params=params, check=check)


def apply(model: nn.Module, adapter: AdapterParams, seed: int, targets: tuple[str, ...] = ()) -> None:
    """Freeze ``model`` and add the adapter ``adapter`` selects (nothing for ``kind: none``), in place;
    its initialisation draws from a generator keyed by (seed, "adapter")."""
    if adapter.kind == "none":
        return
    model.requires_grad_(False)
    gen = torch.Generator().manual_seed(int(rng.key(seed, "adapter")))
    ADAPTERS.get(adapter.kind).obj(model, adapter, gen, tuple(targets))


def adapted(model: nn.Module, names: list | None, defaults: tuple[str, ...], kind: type = nn.Linear,
            key: str = "task.adapter.target_modules") -> list[str]:
    """The names of the modules of ``model`` that ``names`` target (PEFT's rule: a module whose
    name is one of them or ends with ``.`` + one of them), in module order; ``names`` None: the
    model's ``defaults``. InputError naming ``key`` when there are none, when one names nothing or
    when one names a module that is not a ``kind``."""
    if names is None:
        names = list(defaults)
        if not names:
            raise InputError(f"{key}: this model has no default targets; name its {kind.__name__} layers "
                             f"({', '.join(_of_kind(model, kind)[:8]) or 'it has none'})")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise InputError(f"{key}: must be a non-empty list of module names, got {names!r}")
    found = []
    for target in names:
        hits = [n for n, _ in model.named_modules() if n == target or n.endswith("." + target)]
        if not hits:
            raise InputError(f"{key}: {target!r} names no module of the model (its {kind.__name__} layers: "
                             f"{', '.join(_of_kind(model, kind)[:8]) or 'none'})")
        wrong = [n for n in hits if not isinstance(model.get_submodule(n), kind)]
        if wrong:
            raise InputError(f"{key}: {target!r} names {wrong[0]}, a {type(model.get_submodule(wrong[0])).__name__}; "
                             f"adapters wrap {kind.__name__} layers")
        found += hits
    order = [n for n, _ in model.named_modules()]
    return sorted(set(found), key=order.index)


def _of_kind(model: nn.Module, kind: type) -> list[str]:
    return [n for n, mod in model.named_modules() if isinstance(mod, kind)]


def replace(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` where the submodule ``name`` of ``model`` is."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


# ----------------------------------------------------------------------------- none

@register_adapter("none")
def _none(model: nn.Module, params: AdapterParams, gen: torch.Generator, targets: tuple[str, ...]) -> None:
    """No adapter: every parameter of the model is trained."""


# ----------------------------------------------------------------------------- LoRA

@dataclass
class LoRAParams(AdapterParams):
    r: int = opt(8, "LoRA rank r: A is r x in, B out x r", ge=1)
    alpha: float = opt(16.0, "LoRA alpha: the low-rank path is scaled by alpha / r", gt=0)
    dropout: float = opt(0.0, "dropout on the low-rank path's input (a keyed mask per client and step)", ge=0, lt=1)
    target_modules: Optional[list] = opt(
        None, "the Linear layers LoRA adapts: names or name suffixes (PEFT's rule, e.g. [q_proj, v_proj]); "
              "null = the model's default (transformer: q_proj, v_proj)")


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` (``base_layer``) with a trainable low-rank path (module docstring)."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0, salt: int = SALT,
                 gen: torch.Generator | None = None):
        super().__init__()
        self.base_layer = base
        self.r, self.alpha, self.scaling = int(r), float(alpha), float(alpha) / int(r)
        self.lora_dropout = KeyedDropout(dropout, salt) if dropout > 0 else nn.Identity()
        like = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = _linear(base.in_features, r, like)
        self.lora_B = _linear(r, base.out_features, like)
        with torch.no_grad():
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5), generator=gen)  # PEFT's default
            nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha:g}"


def _linear(n_in: int, n_out: int, like: dict) -> nn.Linear:
    """A bias-free Linear whose weight is allocated but not drawn (no global generator)."""
    lin = nn.Linear(n_in, n_out, bias=False, device="meta")
    lin.weight = nn.Parameter(torch.empty(n_out, n_in, **like))
    return lin


@register_adapter("lora", params=LoRAParams)
def lora(model: nn.Module, params: LoRAParams, gen: torch.Generator, targets: tuple[str, ...]) -> None:
    """LoRA on every ``nn.Linear`` that ``target_modules`` names (module docstring)."""
    for k, name in enumerate(adapted(model, params.target_modules, targets)):
        replace(model, name, LoRALinear(model.get_submodule(name), params.r, params.alpha, params.dropout,
                                        SALT + k, gen))
