"""Batched local training of a rank's clients, client-state stores, evaluation.

Importing the package registers the stacked rules beyond ``layers``' own (the transformer's
layers, LoRA, a Hugging Face Llama's, Mistral's, Qwen2's and GPT-2's): any use of
``engine.layers`` imports this first."""

from . import adapter_layers, hf_layers, sequence_layers  # noqa: F401
