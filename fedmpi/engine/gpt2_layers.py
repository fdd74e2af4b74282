"""Stacked rules of a Hugging Face GPT-2 (``task.model: hf`` over ``transformers``'
``GPT2LMHeadModel``): a block of clients as batched ops over the one frozen base, instead of
``vmap``.

GPT-2 is the built-in transformer's block (``engine.sequence_layers``) under other names, so the
chain reuses its rules: token + position embeddings, pre-LayerNorm decoder layers h + attn(ln_1(h)),
then + mlp(ln_2(h)), the final LayerNorm and the head. What is GPT-2's own:

- self-attention: one fused projection ``c_attn`` (a Linear, or a LoRA on it: ``models.hf``
  turns GPT-2's ``Conv1D`` into the ``nn.Linear`` it is) split into q, k and v, the heads and the
  causal softmax through the architecture's own ``eager_attention_forward`` with the n clients'
  b sequences as its batch, under the causal mask the model builds for it, then ``c_proj``;
- the MLP: c_proj(act(c_fc(x))), the model's own activation (``gelu_new``).

A GPT-2 with cross-attention or ``reorder_and_upcast_attn`` has no rule (``gpt2_lm`` returns None)
and trains through ``vmap`` (``models.hf``).
"""

from __future__ import annotations

from torch import nn

from ..models.hf import CausalLM
from .layers import Compiler, Params, Tensor, _Chain, _Elementwise, _Layer
from .llama_layers import eager_attention
from .sequence_layers import _Block, _Embeddings, output_head


class _Attention(_Layer):
    """GPT-2's self-attention over (n, b, T, width): c_proj(attention(split(c_attn(x))))."""

    def __init__(self, mod: nn.Module, qkv: _Layer, out: _Layer):
        self.mod, self.proj = mod, (qkv, out)
        self.params = tuple(name for layer in self.proj for name in layer.params)
        self.reads = tuple(name for layer in self.proj for name in layer.reads)

    def _mixed(self, qkv: Tensor) -> Tensor:
        """The attention of the fused projection (n, b, T, 3 width) -> (n, b, T, width)."""
        return eager_attention(self.mod, *qkv.split(self.mod.split_size, dim=-1), None)

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        qkv, out = self.proj
        return out.forward(p, self._mixed(qkv.forward(p, x, keys)), keys)

    def activations(self, p: Params, x: Tensor) -> tuple[Tensor, int]:
        qkv, out = self.proj
        fused, a = qkv.activations(p, x)
        mixed = self._mixed(fused)
        y, b = out.activations(p, mixed)
        scores = mixed.numel() // mixed.shape[-1] * self.mod.num_heads * x.shape[-2]  # heads x T per position
        return y, a + b + mixed.numel() + 2 * scores  # the scores and their softmax


def gpt2_lm(mod: CausalLM, compiler: Compiler) -> _Layer | None:
    """The chain of a wrapped ``GPT2LMHeadModel`` (parameter names under ``lm.``), None for another
    architecture or a layout the rules do not know."""
    try:
        from transformers.models.gpt2.modeling_gpt2 import GPT2LMHeadModel
    except ImportError:
        return None
    lm = mod.lm
    cfg = lm.config
    if type(lm) is not GPT2LMHeadModel or cfg._attn_implementation != "eager" or cfg.reorder_and_upcast_attn \
            or cfg.add_cross_attention:
        return None
    body = lm.transformer
    tok, pos = compiler.name_of(body.wte.weight), compiler.name_of(body.wpe.weight)
    if tok is None or pos is None or compiler.frozen(tok) != compiler.frozen(pos):
        return None  # one table trained, the other frozen: a layout the embedding rule does not know
    layers: list[_Layer] = [_Embeddings(tok, pos, compiler.frozen(tok))]
    for i, block in enumerate(body.h):
        at = f"lm.transformer.h.{i}."
        names = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
        parts = [compiler.layer(block.get_submodule(name), f"{at}{name}.") for name in names]
        if any(part is None for part in parts):
            return None
        ln_1, qkv, out, ln_2, fc, proj = parts
        mlp = _Chain([fc, _Elementwise(block.mlp.act), proj])
        layers.append(_Block(ln_1, _Attention(block.attn, qkv, out), ln_2, mlp))
    final = compiler.layer(body.ln_f, "lm.transformer.ln_f.")
    if final is None:
        return None
    layers.append(final)
    head = output_head(lm.lm_head, body.wte.weight, tok, "lm.lm_head.", compiler)
    return None if head is None else _Chain(layers + [head])

