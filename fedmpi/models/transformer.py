"""A small decoder-only transformer (GPT-2's shape) for token sequences: model ``transformer``.

Token and position embeddings, ``layers`` pre-LayerNorm blocks of causal multi-head
self-attention and an MLP (each added to the residual stream), a final LayerNorm and an output
head tied to the token embedding: logits = LN(h) E^T. Inputs are token ids (b, T), right-padded
(causal attention then needs no padding mask: a real token never attends to a later pad);
outputs the next-token logits (b, T, vocab), trained with ``losses.token_cross_entropy``.

Module names follow Llama's (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``up_proj``,
``down_proj``), so that LoRA's usual ``target_modules`` apply (the default: ``q_proj``, ``v_proj``).
The forward here is the per-client reference; the engine trains a block of clients through the
stacked rules of ``engine.sequence_layers`` (the same operations on (n, b, T, ...) tensors).
Initialisation (GPT-2's): normal(0, 0.02) embeddings and Linear weights, the residual output
projections (``o_proj``, ``down_proj``) normal(0, 0.02 / sqrt(2 layers)), zero biases, LayerNorms
1 and 0; drawn from a local generator seeded by the run's seed.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..schema import opt
from . import ModelParams, register
from .losses import token_cross_entropy


@dataclass
class TransformerParams(ModelParams):
    layers: int = opt(2, "transformer blocks", ge=1, le=1024)
    heads: int = opt(2, "attention heads of a block (width must be a multiple of it)", ge=1)
    width: int = opt(64, "model width: embeddings, attention and the residual stream", ge=1)
    mlp_ratio: int = opt(4, "the MLP's hidden width is mlp_ratio x width", ge=1, le=64)
    context: Optional[int] = opt(None, "longest sequence (position embeddings); null = the dataset's "
                                       "sequence length", ge=1)


class Embeddings(nn.Module):
    """Token ids (..., T) -> token embedding + position embedding (..., T, width)."""

    def __init__(self, vocab: int, context: int, width: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tok(x) + self.pos.weight[:x.shape[-1]]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_head) + causal mask) v over ``heads`` heads: q, k, v (..., T, width) ->
    (..., T, width). Batched products over every leading index, row-wise softmax: a sequence's
    numbers do not depend on the others in the batch (the engine's bit contract)."""
    *lead, t, width = q.shape
    hd = width // heads

    def split(z: torch.Tensor) -> torch.Tensor:  # (..., T, width) -> (..., heads, T, hd)
        return z.reshape(*lead, t, heads, hd).transpose(-3, -2)

    qh, kh = split(q).reshape(-1, t, hd), split(k).reshape(-1, t, hd)
    mask = torch.full((t, t), float("-inf"), dtype=q.dtype, device=q.device).triu_(1)  # 0 on and below the diagonal
    scores = torch.baddbmm(mask, qh, kh.transpose(1, 2), alpha=1.0 / math.sqrt(hd))  # mask + q k^T / sqrt(hd)
    probs = torch.softmax(scores, dim=-1).view(*lead, heads, t, t)
    return torch.matmul(probs, split(v)).transpose(-3, -2).reshape(*lead, t, width)


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = nn.Linear(width, width), nn.Linear(width, width)
        self.v_proj, self.o_proj = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.o_proj(causal_attention(self.q_proj(h), self.k_proj(h), self.v_proj(h), self.heads))


class Block(nn.Module):
    """h + attn(ln1(h)), then + mlp(ln2(h)) (pre-LayerNorm)."""

    def __init__(self, width: int, heads: int, hidden: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(OrderedDict(up_proj=nn.Linear(width, hidden), act=nn.GELU(),
                                             down_proj=nn.Linear(hidden, width)))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.ln1(h))
        return h + self.mlp(self.ln2(h))


class TiedHead(nn.Module):
    """Logits h E^T with the token embedding E of ``embeddings`` (no parameter of its own: the
    embedding is not registered here, so it is named, saved and trained once)."""

    def __init__(self, embeddings: Embeddings):
        super().__init__()
        object.__setattr__(self, "embeddings", embeddings)  # not a submodule

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.embeddings.tok.weight)


def transformer(vocab: int, seq_len: int, p: TransformerParams) -> nn.Sequential:
    """The model (module docstring) for sequences of ``seq_len`` tokens of a ``vocab``-token vocabulary."""
    context = p.context if p.context is not None else seq_len
    if context < seq_len:
        raise InputError(f"task.context: {context} positions, but the dataset's sequences are {seq_len} tokens")
    if p.width % p.heads:
        raise InputError(f"task.width: {p.width} is not a multiple of task.heads ({p.heads})")
    hidden = p.mlp_ratio * p.width
    embed = Embeddings(vocab, context, p.width)
    layers = [("embed", embed)] + [(f"h{i}", Block(p.width, p.heads, hidden)) for i in range(p.layers)]
    model = nn.Sequential(OrderedDict(layers + [("ln_f", nn.LayerNorm(p.width)), ("head", TiedHead(embed))]))
    return model


def init_weights(model: nn.Module, gen: torch.Generator) -> None:
    """GPT-2's initialisation (module docstring), drawn from ``gen`` in module order."""
    layers = sum(isinstance(mod, Block) for mod in model.modules())
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, nn.Embedding):
                nn.init.normal_(mod.weight, 0.0, 0.02, generator=gen)
            elif isinstance(mod, nn.Linear):
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("o_proj", "down_proj")) else 0.02
                nn.init.normal_(mod.weight, 0.0, std, generator=gen)
                nn.init.zeros_(mod.bias)
            elif isinstance(mod, nn.LayerNorm):
                nn.init.ones_(mod.weight)
                nn.init.zeros_(mod.bias)


def _check(cfg) -> None:
    if cfg.train.full_gradient:
        raise InputError("train.full_gradient: task.model transformer's loss is the mean over a minibatch's "
                         "target tokens, which full_gradient's per-sample weights do not give; use minibatches")


@register("transformer", params=TransformerParams, loss=token_cross_entropy, init=init_weights,
          targets=("q_proj", "v_proj"), check=_check)
def _transformer(in_shape: tuple, classes: int, params: TransformerParams) -> nn.Module:
    if len(in_shape) != 1 or classes < 1:
        raise InputError(f"task.model: transformer needs token sequences (N, T) of a vocabulary, got samples of "
                         f"shape {in_shape} (task.dataset must be a text dataset)")
    return transformer(classes, in_shape[0], params)
