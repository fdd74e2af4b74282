"""Models as flat vectors: one row of a (n, d) float32 matrix per client.

Algorithms work on flat vectors (averaging, echoing, tables, reductions are plain tensor
arithmetic); the engine views a row block as a dict of stacked parameter tensors for
``torch.func.functional_call``. The flat order is the module's ``named_parameters`` order,
which is also ``state_dict`` order for the buffer-free models of fedmpi.
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
        named = list(model.named_parameters())
        return cls(tuple(n for n, _ in named), tuple(p.shape for _, p in named))

    @property
    def numels(self) -> list[int]:
        return [s.numel() for s in self.shapes]

    @property
    def dim(self) -> int:
        return sum(self.numels)

    def flatten(self, model: torch.nn.Module) -> torch.Tensor:
        """The model's current parameters as one float32 vector (d,)."""
        return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])

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
