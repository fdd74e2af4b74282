"""Stacked rules of a Hugging Face Llama and its family (``task.model: hf`` over ``transformers``'
``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``: ``FAMILY``): a block of clients
as batched ops over the one frozen base, instead of ``vmap`` (which kept about 2.5x the
activations of the model's own forward, benchmarks/RESULTS.md).

The rule is the wrapper's (``models.hf.CausalLM``): for a Llama it compiles the model into a
chain, token embedding -> decoder layers -> final RMSNorm -> head, each on activations
(n, b, T, ...) of n clients, with ops that never mix clients' rows (``engine.layers``' bit contract):

- the token embedding: one ``F.embedding`` on the frozen table, or a gather of each client's rows
  of its own (``engine.sequence_layers.embed``, the padding row's gradient zero as
  ``nn.Embedding``'s);
- RMSNorm: the module's own arithmetic (float32 x * rsqrt(mean(x^2) + eps), then the weight) on
  every row; the frozen weight once, a trained one per client;
- a decoder layer: ``engine.sequence_layers``' pre-norm block, h + attn(norm(h)), then
  + mlp(norm(h));
- self-attention: the q/k/v/o projections are the Linear or LoRA rules of its children (one
  ``bmm`` of each client's rows against the expanded frozen weight, plus the client's own
  low-rank ``bmm``, ``engine.adapter_layers``); rotary positions from the model's own rotary
  module and the architecture's ``apply_rotary_pos_emb``; the grouped-query heads and the causal
  softmax are the architecture's own ``eager_attention_forward`` with the n clients' b sequences
  as its batch (batched products over (n b, heads), a row-wise softmax), under the mask the model
  builds for it (causal; Mistral's sliding window, Qwen2's on the layers that have one);
- the gated MLP: down(act(gate(x)) * up(x)), each projection the Linear or LoRA rule;
- the head: a Linear over the last hidden state, or, tied to the token embedding, a read of the
  embedding's weight (``engine.sequence_layers``' tied head).

Mistral is a Llama with a sliding window; Qwen2 adds biases to the q/k/v projections (the Linear
rule's) and a window on some layers. ``engine.hf_layers`` tries this chain first, then GPT-2's
(``engine.gpt2_layers``); another architecture, or a model of the family whose layout the rule does
not know (``llama_lm`` returns None), trains through ``vmap`` (``models.hf``).
"""

from __future__ import annotations

import importlib
import sys

import torch
from torch import nn

from ..models.hf import CausalLM
from .layers import Compiler, Params, Tensor, _Chain, _Layer
from .sequence_layers import _Block, _Embedding, _per_client, output_head


class _RMSNorm(_Layer):
    def __init__(self, prefix: str, mod: nn.Module, frozen: bool):
        self.w, self.eps, self.frozen = prefix + "weight", mod.variance_epsilon, frozen
        self.params = (self.w,)

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)
        w = p[self.w]
        return w[0] * h if self.frozen else _per_client(w, h) * h

    def activations(self, p: Params, x: Tensor) -> tuple[Tensor, int]:
        out = self.forward(p, x, None)
        return out, x.numel() + out.numel()  # its input (for x^2 and x * r) and the normalised rows


class _GatedMLP(_Layer):
    """down(act(gate(x)) * up(x))."""

    def __init__(self, gate: _Layer, up: _Layer, down: _Layer, act: nn.Module):
        self.proj, self.act = (gate, up, down), act
        self.params = tuple(name for layer in self.proj for name in layer.params)
        self.reads = tuple(name for layer in self.proj for name in layer.reads)

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        gate, up, down = self.proj
        return down.forward(p, self.act(gate.forward(p, x, keys)) * up.forward(p, x, keys), keys)

    def activations(self, p: Params, x: Tensor) -> tuple[Tensor, int]:
        gate, up, down = self.proj
        (g, a), (u, b) = gate.activations(p, x), up.activations(p, x)
        mid = self.act(g) * u
        out, c = down.activations(p, mid)
        return out, a + b + c + 2 * mid.numel()  # act(gate) and the product


def _causal_mask(t: int, window: int | None, like: Tensor) -> Tensor:
    """The additive (T, T) mask of causal attention as the model's eager attention gets it: 0 where
    query i may attend to key j (j <= i, and i - j < ``window`` under a sliding window), the
    dtype's lowest value elsewhere."""
    i = torch.arange(t, device=like.device)
    apart = i[:, None] - i[None, :]  # query minus key position
    allowed = (apart >= 0) if window is None else (apart >= 0) & (apart < window)
    return torch.zeros((t, t), dtype=like.dtype, device=like.device).masked_fill_(~allowed, torch.finfo(like.dtype).min)


def eager_attention(mod: nn.Module, q: Tensor, k: Tensor, v: Tensor, window: int | None,
                    rotary: nn.Module | None = None) -> Tensor:
    """The attention module ``mod``'s own computation on the projections q, k, v (n, b, T, heads x
    head_dim) -> (n, b, T, heads x head_dim): the n clients' b sequences as the batch of the
    architecture's ``eager_attention_forward`` (the module's layout, (n b, heads, T, head_dim)),
    under ``_causal_mask(T, window)``; with ``rotary``, q and k rotated first by the architecture's
    ``apply_rotary_pos_emb`` at positions 0..T-1."""
    own = sys.modules[type(mod).__module__]  # the architecture's own functions
    lead, t, hd = q.shape[:-2], q.shape[-2], mod.head_dim

    def heads(z: Tensor) -> Tensor:  # (n, b, T, h hd) -> (n b, h, T, hd)
        return z.reshape(-1, t, z.shape[-1] // hd, hd).transpose(1, 2)

    qh, kh = heads(q), heads(k)
    if rotary is not None:
        cos, sin = rotary(q, torch.arange(t, device=q.device).unsqueeze(0))
        qh, kh = own.apply_rotary_pos_emb(qh, kh, cos, sin)
    out, _ = own.eager_attention_forward(mod, qh, kh, heads(v), _causal_mask(t, window, q), scaling=mod.scaling,
                                         dropout=0.0)
    return out.reshape(*lead, t, -1)


def _window(attn: nn.Module) -> int | None:
    """The sliding window the model's own forward gives layer ``attn``: Qwen2's layer says it
    (None on its full-attention layers), Mistral's config says it for every layer, a Llama has none
    (a ``sliding_window`` key in its config.json is kept by the config and ignored by the model)."""
    if hasattr(attn, "sliding_window"):
        return attn.sliding_window
    return getattr(attn.config, "sliding_window", None) if type(attn).__name__ == "MistralAttention" else None


class _Attention(_Layer):
    """Llama's self-attention over (n, b, T, width); see the module docstring."""

    def __init__(self, mod: nn.Module, rotary: nn.Module, q: _Layer, k: _Layer, v: _Layer, o: _Layer):
        self.mod, self.rotary, self.proj = mod, rotary, (q, k, v, o)
        self.window = _window(mod)
        self.params = tuple(name for layer in self.proj for name in layer.params)
        self.reads = tuple(name for layer in self.proj for name in layer.reads)

    def _mixed(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return eager_attention(self.mod, q, k, v, self.window, self.rotary)

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        q, k, v, o = self.proj
        return o.forward(p, self._mixed(q.forward(p, x, keys), k.forward(p, x, keys), v.forward(p, x, keys)), keys)

    def activations(self, p: Params, x: Tensor) -> tuple[Tensor, int]:
        q, k, v, o = self.proj
        (qx, a), (kx, b), (vx, c) = (layer.activations(p, x) for layer in (q, k, v))
        mixed = self._mixed(qx, kx, vx)
        out, d = o.activations(p, mixed)
        heads = self.mod.config.num_attention_heads
        scores = mixed.numel() // mixed.shape[-1] * heads * x.shape[-2]  # heads x T per position
        return out, a + b + c + d + 2 * qx.numel() + mixed.numel() + 2 * scores  # rotated q, k; scores, softmax


#: the Llama family: the same modules, module names and forward (Mistral: a sliding window;
#: Qwen2: q/k/v projections with biases, a sliding window on some layers), by transformers' module
FAMILY = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def _family() -> tuple[type, ...]:
    found = []
    for name, cls in FAMILY.items():
        try:
            found.append(getattr(importlib.import_module(f"transformers.models.{name}.modeling_{name}"), cls))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def llama_lm(mod: CausalLM, compiler: Compiler) -> _Layer | None:
    """The chain of a wrapped causal LM of the Llama family (``FAMILY``; parameter names under
    ``lm.``), None for another architecture or a layout the rules do not know."""
    lm = mod.lm
    if type(lm) not in _family() or lm.config._attn_implementation != "eager":
        return None
    body = lm.model
    table = body.embed_tokens
    name = compiler.name_of(table.weight)
    if not isinstance(table, nn.Embedding) or name is None:
        return None
    layers: list[_Layer] = [_Embedding(name, table.padding_idx, compiler.frozen(name))]
    for i, layer in enumerate(body.layers):
        at = f"lm.model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        proj = [compiler.layer(getattr(attn, n), f"{at}self_attn.{n}.") for n in ("q_proj", "k_proj", "v_proj",
                                                                                     "o_proj")]
        ffn = [compiler.layer(getattr(mlp, n), f"{at}mlp.{n}.") for n in ("gate_proj", "up_proj", "down_proj")]
        if any(part is None for part in proj + ffn):
            return None
        layers.append(_Block(_norm(layer.input_layernorm, at + "input_layernorm.", compiler),
                             _Attention(attn, body.rotary_emb, *proj),
                             _norm(layer.post_attention_layernorm, at + "post_attention_layernorm.", compiler),
                             _GatedMLP(*ffn, mlp.act_fn)))
    layers.append(_norm(body.norm, "lm.model.norm.", compiler))
    head = output_head(lm.lm_head, table.weight, name, "lm.lm_head.", compiler)
    return None if head is None else _Chain(layers + [head])


def _norm(mod: nn.Module, prefix: str, compiler: Compiler) -> _RMSNorm:
    return _RMSNorm(prefix, mod, compiler.frozen(prefix + "weight"))
