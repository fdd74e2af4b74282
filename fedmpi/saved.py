"""What autograd keeps for the backward pass of one computation: the memory estimates of a
client's local step (``LocalTrainer.memory``) and of the up-front check (``guards.step_bytes``)
count it with saved-tensor hooks, once, instead of guessing it from layer outputs.

A tensor saved by several ops (a layer's input that two projections save, an output saved by the
next op too) is one storage and is counted once; the storages listed in ``held`` (a model's
parameters, a frozen base, a client's trainable tensors) are not activations and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch


@dataclass(frozen=True)
class Kept:
    """Bytes autograd keeps: ``total`` over distinct storages, ``largest`` the biggest of them."""

    total: int
    largest: int


def kept(run: Callable[[], object], held: Iterable[torch.Tensor] = ()) -> Kept:
    """Run ``run`` (a forward pass and loss) with gradients on, and count the storages autograd
    saves for its backward pass, those of ``held`` excepted. Every rank computes the same count:
    it depends on shapes and the ops, not on values."""
    skip = {t.untyped_storage().data_ptr() for t in held}
    reached: dict[int, list[tuple[int, int]]] = {}  # per storage, the byte ranges its saved views reach
    alive: list[torch.Tensor] = []  # held until counted: no storage is freed and its address reused meanwhile

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if t.device.type == "meta" or key == 0:  # no storage to share: count the tensor itself
            reached[id(t)] = [(0, t.numel() * t.element_size())]
        elif key not in skip:
            start = t.storage_offset() * t.element_size()
            reached.setdefault(key, []).append((start, start + _span(t)))
        alive.append(t)
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    sizes = [_union(ranges) for ranges in reached.values()]
    return Kept(sum(sizes), max(sizes, default=0))


def _union(ranges: list[tuple[int, int]]) -> int:
    """Bytes covered by the ranges [start, end)."""
    total, end = 0, -1
    for a, b in sorted(ranges):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _span(t: torch.Tensor) -> int:
    """Bytes of its storage that a view reaches: a minibatch sliced from the training set keeps
    its rows, not the set; a stride-0 expansion one row."""
    if t.numel() == 0:
        return 0
    return (1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))) * t.element_size()
