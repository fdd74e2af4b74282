"""The stacked rule of a Hugging Face causal LM (``models.hf.CausalLM``, ``task.model: hf``): the
chain of the first architecture whose rules know the wrapped model, the Llama family
(``engine.llama_layers``: Llama, Mistral, Qwen2) or GPT-2 (``engine.gpt2_layers``); None for any
other, which then trains through ``vmap`` (``models.hf``)."""

from __future__ import annotations

from ..models.hf import CausalLM
from .gpt2_layers import gpt2_lm
from .layers import Compiler, _Layer, stacked_rule
from .llama_layers import llama_lm

#: the architectures with stacked rules, each a function (wrapper, compiler) -> chain or None
ARCHITECTURES = (llama_lm, gpt2_lm)


@stacked_rule(CausalLM)
def _causal_lm(mod: CausalLM, prefix: str, compiler: Compiler) -> _Layer | None:
    if prefix != "":
        return None
    for chain in ARCHITECTURES:
        layer = chain(mod, compiler)
        if layer is not None:
            return layer
    return None
