"""An adapter type plug-in: IA3 (Liu et al., "Few-Shot Parameter-Efficient Fine-Tuning is Better
and Cheaper than In-Context Learning", NeurIPS 2022), a learned scale of each output feature of
the target Linear layers: y = base_layer(x) * ia3_l, ia3_l starting at ones.

An adapter type is a function ``(model, params, gen, targets)`` registered with
``register_adapter``; fedmpi has frozen the whole model before calling it, so the parameters it
adds are the clients' own (trained, averaged, clipped, checkpointed per client) and everything else
is the base, held once per rank. ``adapted`` resolves ``task.adapter.target_modules`` (PEFT's rule;
null = the model's default targets) with one-line errors. The module trains through vmap as it is;
the stacked rule below makes it a batched layer of the engine (a block of clients in one call).

Config: ``task: {model: transformer, adapter: {kind: my_ia3, target_modules: [k_proj, v_proj, down_proj]}}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from fedmpi.engine.layers import Compiler, Layer, stacked_rule
from fedmpi.models.adapters import AdapterParams, adapted, register_adapter, replace
from fedmpi.schema import opt


@dataclass
class IA3Params(AdapterParams):
    target_modules: Optional[list] = opt(None, "the Linear layers IA3 scales (null: the model's default targets)")


class IA3Linear(nn.Module):
    """A frozen Linear whose outputs are scaled by the trainable ``ia3_l`` (out,)."""

    def __init__(self, base: nn.Linear):
        super().__init__()
        self.base_layer = base
        self.ia3_l = nn.Parameter(torch.ones(base.out_features, device=base.weight.device, dtype=base.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) * self.ia3_l


@register_adapter("my_ia3", params=IA3Params)
def ia3(model: nn.Module, params: IA3Params, gen: torch.Generator, targets: tuple[str, ...]) -> None:
    for name in adapted(model, params.target_modules, targets):
        replace(model, name, IA3Linear(model.get_submodule(name)))


class _IA3(Layer):
    """The stacked form: the base layer's rule (one bmm against the frozen weight, expanded over
    the clients), times each client's own scales."""

    def __init__(self, base: Layer, scale: str):
        self.base, self.scale = base, scale
        self.params, self.reads = base.params + (scale,), base.reads

    def forward(self, p, x, keys):
        out = self.base.forward(p, x, keys)
        s = p[self.scale]  # (n, out)
        return out * s.view(s.shape[0], *[1] * (out.dim() - 2), s.shape[-1])


@stacked_rule(IA3Linear)
def _ia3_rule(mod: IA3Linear, prefix: str, compiler: Compiler) -> Layer | None:
    base = compiler.layer(mod.base_layer, prefix + "base_layer.")
    return None if base is None else _IA3(base, prefix + "ia3_l")
