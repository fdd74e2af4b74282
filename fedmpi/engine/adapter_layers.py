"""Stacked rules of adapters (``models.adapters``): LoRA over a block of clients.

A ``LoRALinear`` of n clients computes, for inputs h (n, b, ..., in),

    h W^T + bias  +  ((dropout(h) A_i^T) B_i^T) * alpha / r

the first term the shared base product, one ``bmm`` of every client's rows against the frozen
W expanded over the block (a stride-0 view: the weight is held once, and each client's product
is the same (rows x in) @ (in x out) product whatever the block, so its bits do not depend on
its batch-mates; a plain product over the block's concatenated rows could round differently for
another number of rows), the second the clients' own low-rank products, two small ``bmm`` each
(Punica's and S-LoRA's split: one shared product plus a small batched one per adapter). The
dropout mask is the client's keyed one. Autograd computes gradients of A and B only: the base
needs none, and its product passes the input gradient back through the same expanded weight.
"""

from __future__ import annotations

from ..models.adapters import LoRALinear
from ..models.dropout import KeyedDropout
from .layers import Compiler, Params, Tensor, _KeyedDropout, _Layer, stacked_rule


class _LoRA(_Layer):
    def __init__(self, base: _Layer, a: _Layer, b: _Layer, drop: _Layer | None, scaling: float):
        self.base, self.a, self.b, self.drop, self.scaling = base, a, b, drop, scaling
        parts = (base, a, b)
        self.params = tuple(name for layer in parts for name in layer.params)
        self.reads = tuple(name for layer in parts for name in layer.reads)

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        h = x if self.drop is None else self.drop.forward(p, x, keys)
        return self.base.forward(p, x, keys) + self.b.forward(p, self.a.forward(p, h, keys), keys) * self.scaling

    def activations(self, p: Params, x: Tensor) -> tuple[Tensor, int]:
        base, k = self.base.activations(p, x)
        low, j = self.a.activations(p, x)
        low, i = self.b.activations(p, low)
        out = base + low * self.scaling
        return out, k + j + i + out.numel() + (x.numel() if self.drop is not None else 0)


@stacked_rule(LoRALinear)
def _lora(mod: LoRALinear, prefix: str, compiler: Compiler) -> _Layer | None:
    parts = [compiler.layer(getattr(mod, name), f"{prefix}{name}.") for name in ("base_layer", "lora_A", "lora_B")]
    if any(layer is None for layer in parts):
        return None
    drop = mod.lora_dropout
    keyed = _KeyedDropout(f"{prefix}lora_dropout.", drop) if isinstance(drop, KeyedDropout) else None
    return _LoRA(*parts, keyed, mod.scaling)
