"""Stacked rules of the transformer's layers (``models.transformer``): token and position
embeddings, LayerNorm, causal self-attention, the pre-LayerNorm block and the tied output head.

Each takes the n clients' parameters stacked, (n, *shape), or a frozen base tensor expanded
over them (stride 0: ``StackedNet.with_base``), and activations (n, b, T, ...), and computes
what the module computes for each client, with operations that never mix clients' rows (the
bit contract of ``engine.layers``):

- embeddings: a gather of each client's rows of its own table (``w[i, x_i]``; its backward
  accumulates a client's rows in the order of its own tokens), or one ``F.embedding`` on a frozen
  table; plus the client's position rows;
- LayerNorm (over the last dimension, with weight and bias; other forms train through vmap):
  ``F.layer_norm`` without affine on every row (row by row), then each client's
  weight and bias (the module's own fused call on a frozen one: the same bits as the module);
- attention: the projections are the Linear (or LoRA) rules of its children; the scores, the
  causal softmax and the weighted sum are batched products and row-wise operations over (n, b,
  heads), ``models.transformer.causal_attention``, the module's own function;
- the tied head: one ``bmm`` per client against its token embedding (a read of the embedding's
  parameter, which is used and trained once).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..models.transformer import Block, CausalSelfAttention, Embeddings, TiedHead, causal_attention
from .layers import Compiler, Params, Tensor, _Layer, _Linear, stacked_rule


def _per_client(v: Tensor, like: Tensor) -> Tensor:
    """(n, d) -> (n, 1, ..., 1, d), to broadcast over ``like``'s (n, ..., d)."""
    return v.view(v.shape[0], *[1] * (like.dim() - 2), v.shape[-1])


def embed(w: Tensor, x: Tensor, frozen: bool, padding: int | None = None) -> Tensor:
    """Token ids x (n, ...) -> each client's rows of its table w (n, vocab, width); a frozen table
    (expanded over the clients) as one ``F.embedding``; ``padding``: the id whose row gets no
    gradient (``nn.Embedding``'s ``padding_idx``)."""
    if frozen:
        return F.embedding(x, w[0])
    n = x.shape[0]
    e = w[torch.arange(n, device=x.device).view(n, *[1] * (x.dim() - 1)), x]
    return e if padding is None else torch.where((x == padding).unsqueeze(-1), e.detach(), e)


class _Embedding(_Layer):
    """An ``nn.Embedding`` (its weight named ``name``) on token ids (n, b, T)."""

    def __init__(self, name: str, padding: int | None, frozen: bool):
        self.w, self.padding, self.frozen = name, padding, frozen
        self.params = (name,)

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        return embed(p[self.w], x, self.frozen, self.padding)


class _Embeddings(_Layer):
    """Token + learned position embeddings (the tables named ``tok`` and ``pos``) on token ids (n, b, T)."""

    def __init__(self, tok: str, pos: str, frozen: bool):
        self.tok, self.pos = tok, pos
        self.params, self.frozen = (self.tok, self.pos), frozen

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        w, pos = p[self.tok], p[self.pos]  # (n, vocab, width), (n, context, width)
        n, t = x.shape[0], x.shape[-1]
        e = embed(w, x, self.frozen)
        return e + pos[:, :t].reshape(n, *[1] * (x.dim() - 2), t, pos.shape[-1])


class _LayerNorm(_Layer):
    def __init__(self, prefix: str, mod: nn.LayerNorm, frozen: bool):
        self.shape, self.eps = tuple(mod.normalized_shape), mod.eps
        self.w, self.b = prefix + "weight", prefix + "bias"
        self.params, self.frozen = (self.w, self.b), frozen

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        w, b = p[self.w], p[self.b]
        if self.frozen:  # one copy of the affine part: the module's own call
            return F.layer_norm(x, self.shape, w[0], b[0], self.eps)
        y = F.layer_norm(x, self.shape, None, None, self.eps)
        return y * _per_client(w, y) + _per_client(b, y)


class _Attention(_Layer):
    def __init__(self, heads: int, q: _Layer, k: _Layer, v: _Layer, o: _Layer):
        self.heads, self.proj = heads, (q, k, v, o)
        self.params = tuple(name for layer in self.proj for name in layer.params)
        self.reads = tuple(name for layer in self.proj for name in layer.reads)

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        q, k, v, o = self.proj
        mixed = causal_attention(q.forward(p, x, keys), k.forward(p, x, keys), v.forward(p, x, keys), self.heads)
        return o.forward(p, mixed, keys)

    def activations(self, p: Params, x: Tensor) -> tuple[Tensor, int]:
        q, k, v, o = self.proj
        (qx, a), (kx, b), (vx, c) = (layer.activations(p, x) for layer in (q, k, v))
        mixed = causal_attention(qx, kx, vx, self.heads)
        out, d = o.activations(p, mixed)
        scores = x.numel() // x.shape[-1] * self.heads * x.shape[-2]  # heads x T per position
        return out, a + b + c + d + mixed.numel() + 2 * scores  # the scores and their softmax


class _Block(_Layer):
    def __init__(self, ln1: _Layer, attn: _Layer, ln2: _Layer, mlp: _Layer):
        self.parts = (ln1, attn, ln2, mlp)
        self.params = tuple(name for layer in self.parts for name in layer.params)
        self.reads = tuple(name for layer in self.parts for name in layer.reads)

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        ln1, attn, ln2, mlp = self.parts
        h = x + attn.forward(p, ln1.forward(p, x, keys), keys)
        return h + mlp.forward(p, ln2.forward(p, h, keys), keys)

    def activations(self, p: Params, x: Tensor) -> tuple[Tensor, int]:
        ln1, attn, ln2, mlp = self.parts
        y, a = ln1.activations(p, x)
        y, b = attn.activations(p, y)
        h = x + y
        y, c = ln2.activations(p, h)
        y, d = mlp.activations(p, y)
        out = h + y
        return out, a + b + c + d + h.numel() + out.numel()


class _TiedHead(_Linear):
    """logits = h E^T, E the token embedding (read, not owned: ``reads``)."""

    def __init__(self, name: str):
        self.w, self.b, self.params, self.reads = name, None, (), (name,)


def output_head(head: nn.Module, table: Tensor, name: str, prefix: str, compiler: Compiler) -> _Layer | None:
    """The rule of a causal LM's head ``head`` (parameters under ``prefix``): tied to the token
    embedding ``table`` (named ``name``), a read of it; else its own rule (None: none known)."""
    if isinstance(head, nn.Linear) and head.weight is table and head.bias is None:
        return _TiedHead(name)
    return compiler.layer(head, prefix)


@stacked_rule(Embeddings)
def _embeddings(mod: Embeddings, prefix: str, compiler: Compiler) -> _Layer:
    return _Embeddings(prefix + "tok.weight", prefix + "pos.weight", compiler.frozen(prefix + "tok.weight"))


@stacked_rule(nn.LayerNorm)
def _layer_norm(mod: nn.LayerNorm, prefix: str, compiler: Compiler) -> _Layer | None:
    if len(mod.normalized_shape) != 1 or mod.weight is None or mod.bias is None:
        return None  # the transformer's: over the last dim, with its weight and bias
    return _LayerNorm(prefix, mod, compiler.frozen(prefix + "weight", prefix + "bias"))


@stacked_rule(CausalSelfAttention)
def _attention(mod: CausalSelfAttention, prefix: str, compiler: Compiler) -> _Layer | None:
    proj = [compiler.layer(getattr(mod, name), f"{prefix}{name}.") for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    return None if any(layer is None for layer in proj) else _Attention(mod.heads, *proj)


@stacked_rule(Block)
def _block(mod: Block, prefix: str, compiler: Compiler) -> _Layer | None:
    parts = [compiler.layer(getattr(mod, name), f"{prefix}{name}.") for name in ("ln1", "attn", "ln2", "mlp")]
    return None if any(layer is None for layer in parts) else _Block(*parts)


@stacked_rule(TiedHead)
def _tied_head(mod: TiedHead, prefix: str, compiler: Compiler) -> _Layer | None:
    name = compiler.name_of(mod.embeddings.tok.weight)
    return None if name is None else _TiedHead(name)
