"""Models as flat vectors: one row of a (n, d) float32 matrix per client.

Algorithms work on flat vectors (averaging, echoing, tables, reductions are plain tensor
arithmetic); the engine views a row block as a dict of stacked parameter tensors for
``torch.func.functional_call``. The flat order is the module's ``named_parameters`` order,
which is also ``state_dict`` order for the buffer-free models of fedmpi.

**Trainable and frozen.** A model declares its frozen part the way PyTorch does: a parameter
with ``requires_grad`` False (``LoRA``'s base weights, ``fedmpi.models.adapters``) is frozen.
``ParamSpec`` describes the trainable part only: a client's row, and so everything that carries
client rows (the client table, reproducible sums, server state, privacy, checkpoints' client
rows, packing, the memory check's per-client part), holds only it. The frozen parameters stay
in the model itself, held once per rank on its device (``frozen``): the stacked layers read them
un-batched (``engine.layers``), ``functional_call`` keeps them from the module. A model whose
parameters are all trainable (every built-in model without an adapter) is described exactly as
before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ParamSpec:
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]

    @classmethod
    def of(cls, model: torch.nn.Module) -> "ParamSpec":
        """The trainable part of ``model`` (its parameters with ``requires_grad``)."""
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return cls(tuple(n for n, _ in named), tuple(p.shape for _, p in named))

    @property
    def numels(self) -> list[int]:
        return [s.numel() for s in self.shapes]

    @property
    def dim(self) -> int:
        return sum(self.numels)

    def flatten(self, model: torch.nn.Module) -> torch.Tensor:
        """The model's current trainable parameters as one float32 vector (d,)."""
        return torch.cat([p.detach().reshape(-1).float() for p in model.parameters() if p.requires_grad])

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of a (..., d) tensor as {name: (..., *shape)} (no copy)."""
        lead = flat.shape[:-1]
        out, start = {}, 0
        for name, shape, n in zip(self.names, self.shapes, self.numels):
            out[name] = flat[..., start:start + n].view(*lead, *shape)
            start += n
        return out

    def cat(self, tensors: dict[str, torch.Tensor], lead: int) -> torch.Tensor:
        """Inverse of ``views`` for freshly computed tensors (e.g. gradients)."""
        return torch.cat([tensors[n].reshape(lead, -1) for n in self.names], dim=1)


def frozen(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The frozen parameters of ``model`` by name (``requires_grad`` False): its base, held once
    per rank; {} for a model that trains every parameter."""
    return {n: p for n, p in model.named_parameters() if not p.requires_grad}


def expanded(model: torch.nn.Module, n: int) -> dict[str, torch.Tensor]:
    """The frozen base of ``model`` expanded over n clients, (n, *shape) stride-0 views (no copy):
    what a ``vmap`` over a block's clients takes beside their stacked parameters, so that each
    client's products with the base are its own batched products (its bits independent of the
    block; an un-batched base would make one product of the block's concatenated rows)."""
    return {name: p.detach().expand(n, *p.shape) for name, p in frozen(model).items()}


def frozen_bytes(model: torch.nn.Module) -> int:
    """Bytes of the frozen base of ``model`` (``frozen``)."""
    return sum(p.numel() * p.element_size() for p in frozen(model).values())
