"""Tiny random Hugging Face causal LMs saved to a folder (no download): a Llama (grouped-query
attention, rotary positions, RMSNorm, SiLU MLP) and a GPT-2 (Conv1D layers, learned positions,
a head tied to the token embedding), and the config of a federated run over one of them."""

from __future__ import annotations

import os

from helpers.text import text_config

#: LoRA on the attention projections of each architecture
TARGETS = {"llama": ["q_proj", "v_proj"], "mistral": ["q_proj", "v_proj"], "qwen2": ["q_proj", "v_proj"],
           "gpt2": ["c_attn"]}


def tiny_folder(root: str, arch: str = "llama", vocab: int = 40, seed: int = 0, tokenizer: bool = False) -> str:
    """A random ``arch`` model of ``vocab`` tokens saved as ``save_pretrained`` writes it, under
    ``root``/``arch`` (with a word-level tokenizer.json when ``tokenizer``)."""
    import torch
    import transformers

    llama = dict(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=32, bos_token_id=None, eos_token_id=None,
                 pad_token_id=None)
    if arch == "llama":
        config = transformers.LlamaConfig(**llama)
    elif arch == "mistral":  # a sliding window of 5 positions, shorter than the tests' sequences
        config = transformers.MistralConfig(**llama, sliding_window=5)
    elif arch == "qwen2":  # biased q/k/v; the second layer with a sliding window of 4
        config = transformers.Qwen2Config(**llama, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    else:
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=16, n_layer=2, n_head=2, n_positions=32,
                                         bos_token_id=None, eos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
    path = os.path.join(str(root), arch)
    model.save_pretrained(path)
    if tokenizer:
        _word_tokenizer(path, vocab)
    return path


def _word_tokenizer(path: str, vocab: int) -> None:
    import tokenizers

    words = {"<pad>": 0, "<s>": 1, "</s>": 2, **{chr(ord("a") + i): 3 + i for i in range(min(26, vocab - 3))}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    tok.save(os.path.join(path, "tokenizer.json"))


def hf_config(path: str, arch: str = "llama", lora: bool = True, **over) -> dict:
    """The tiny text task (``helpers.text``) over the model in ``path``."""
    cfg = text_config(False, task__model="hf", task__path=path)
    for key in ("width", "heads", "layers"):
        del cfg["task"][key]
    if lora:
        cfg["task"]["adapter"] = {"kind": "lora", "r": 2, "alpha": 4.0, "dropout": 0.1, "target_modules": TARGETS[arch]}
    from fedmpi.config import _set_dotted

    for k, v in over.items():
        _set_dotted(cfg, k.replace("__", "."), v)
    return cfg
