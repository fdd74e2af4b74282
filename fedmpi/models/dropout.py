"""Dropout with masks that are a pure function of (client key, layer, element).

``torch.nn.Dropout`` draws from torch's generator: under ``vmap`` the mask a client gets
depends on which clients share its batched call, so results would change with the number of
ranks. ``KeyedDropout`` instead hashes (key, layer salt, element index) with ``rng.torch_bits``
(SplitMix64 in int64 tensor ops): it runs on any device and under ``vmap``, and gives the
batched and the sequential engine the same masks. The engine sets each client's ``key`` per
round and local step through ``functional_call`` (``LocalTrainer.dropout_keys``), or passes
the stacked keys to ``drop`` (``engine.layers``); a model called directly in train mode uses
key 0, i.e. the same mask on every call.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import rng


class KeyedDropout(nn.Module):
    """Zero each element with probability ``p`` (scale the rest by 1/(1-p)) in train mode."""

    def __init__(self, p: float, salt: int) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p, self.salt = float(p), int(salt)
        self.register_buffer("key", torch.zeros((), dtype=torch.int64), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return self.drop(x, self.key)

    def drop(self, x: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """``x`` masked with the keys ``key``: one key per index of x's first ``key.dim()`` dims
        (a scalar key for one client's activations, (n,) keys for n clients' stacked ones); the
        mask of each client is the same either way."""
        layer_key = rng.torch_bits(key, self.salt)  # a stream per layer
        per_client = math.prod(x.shape[key.dim():])
        idx = torch.arange(per_client, device=x.device)
        bits = rng.torch_bits(layer_key.unsqueeze(-1), idx)  # (*key.shape, per_client)
        u = rng.srl(bits, 40).to(torch.float32) * (1.0 / (1 << 24))  # top 24 bits -> [0, 1), exact
        keep = (u >= self.p).to(x.dtype).view(x.shape)
        return x * keep * (1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}, salt={self.salt}"
