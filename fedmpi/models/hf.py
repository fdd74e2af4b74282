"""A Hugging Face causal language model read from a local folder: model ``hf`` (the optional
extra ``[llm]``: ``transformers``, ``safetensors``).

``task.path`` names a folder as ``save_pretrained`` writes it: ``config.json`` and the weights in
safetensors (``model.safetensors``, or shards with their ``model.safetensors.index.json``);
nothing is downloaded, and pickled ``.bin`` weights are refused. The config must describe a
decoder-only causal LM (one of ``transformers``' ``*ForCausalLM`` / ``*LMHeadModel``
architectures). The folder's ``tokenizer.json``, when it has one, tokenizes a text dataset
(``fedmpi.data.text``), since the model's ids are that tokenizer's.

The loaded model is the frozen base of an adapter (``task.adapter``, e.g. LoRA on ``q_proj`` and
``v_proj``; ``target_modules`` has no default here, since module names differ between
architectures), held once per rank; with ``adapter.kind: none`` every weight is trained. The engine
trains a block of clients as one batched program: a Llama, Mistral, Qwen2 or GPT-2 through its
stacked rules (``engine.hf_layers``), another architecture through ``torch.func``: ``vmap`` of
``functional_call`` over the clients' stacked adapters and the base expanded over the block (a
stride-0 view; ``engine.params.expanded``), so that each client's products are its own batched
products and its bits do not depend on its block.

Made deterministic for that: the weights are float32; attention is ``eager`` (plain products
and a softmax; no fused kernel choosing by shape); the base runs as in inference, its own dropout
off whatever its config says (its ``nn.Dropout`` modules become identities, and the wrapped model
stays in eval mode; only fedmpi's keyed dropout, e.g. ``task.adapter.dropout``, follows train
mode). GPT-2's ``Conv1D`` layers (a Linear with its weight stored transposed) become the
``nn.Linear`` they are, so that adapters wrap them like any Linear (PEFT adapts them with
``fan_in_fan_out``; the adapter's A and B are the same).

Inputs are token ids (b, T), right-padded: causal attention needs no padding mask (a real token
never attends to a later pad), positions are 0..T-1; outputs the next-token logits (b, T, vocab).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import nn

from .. import provenance
from ..errors import InputError
from ..schema import opt
from . import ModelParams, register
from .dropout import KeyedDropout
from .losses import token_cross_entropy

INSTALL = "pip install 'fedmpi[llm]'"
WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


@dataclass
class HFParams(ModelParams):
    path: Optional[str] = opt(None, "a Hugging Face causal LM folder (config.json + safetensors "
                                    "weights; its tokenizer.json, if any, tokenizes text data); needs "
                                    f"{INSTALL}")


class CausalLM(nn.Module):
    """A ``transformers`` causal LM as a module of token ids (b, T) -> logits (b, T, vocab)."""

    def __init__(self, lm: nn.Module, transposed: frozenset[str] = frozenset()):
        super().__init__()
        self.lm = lm
        self.transposed = transposed  # the modules of ``lm`` that were Conv1D (PEFT's fan_in_fan_out)
        self.train()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=x, use_cache=False).logits

    def from_saved(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A folder's tensors (transformers' names and layouts) as this module's parameters
        (``models.pretrained.initialise``): ``lm.`` + name, Conv1D weights transposed, a tied copy
        (GPT-2's head) and what transformers ignores on loading dropped."""
        import re

        names = {n for n, _ in self.named_parameters()}
        tied = {n for n, _ in self.named_parameters(remove_duplicate=False)} - names
        ignored = [re.compile(r) for r in getattr(self.lm, "_keys_to_ignore_on_load_unexpected", None) or ()]
        out = {}
        for k, v in tensors.items():
            name = "lm." + k
            if name in tied or (name not in names and any(r.search(k) for r in ignored)):
                continue
            out[name] = v.t() if k.endswith(".weight") and k.rpartition(".")[0] in self.transposed else v
        return out

    def train(self, mode: bool = True) -> "CausalLM":
        """The wrapped model stays in eval mode (module docstring); fedmpi's keyed dropout layers
        (an adapter's) follow ``mode``."""
        self.training = mode
        for mod in self.lm.modules():
            mod.training = isinstance(mod, KeyedDropout) and mode
        return self


def folder(path: Optional[str], key: str = "task.path") -> str:
    """The absolute model folder ``path``, checked to hold config.json and safetensors weights."""
    if path is None:
        raise InputError(f"{key}: task.model hf needs the model folder (config.json + safetensors weights)")
    where = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(where):
        raise InputError(f"{key}: {where}: no such folder (a Hugging Face model folder)")
    if not os.path.isfile(os.path.join(where, "config.json")):
        raise InputError(f"{key}: {where}: no config.json (a Hugging Face model folder as save_pretrained writes it)")
    if not any(os.path.isfile(os.path.join(where, w)) for w in WEIGHTS):
        bins = [f for f in ("pytorch_model.bin", "pytorch_model.bin.index.json")
                if os.path.exists(os.path.join(where, f))]
        raise InputError(f"{key}: {where}: no safetensors weights (model.safetensors)"
                         + (f"; {bins[0]} is pickled, which fedmpi does not load" if bins else ""))
    return where


def transformers_module(key: str = "task.model"):
    """``transformers`` (with ``safetensors``), or InputError naming the extra to install."""
    try:
        import safetensors  # noqa: F401
        import transformers
    except ImportError as e:
        raise InputError(f"{key}: hf needs the {e.name or 'transformers'} package: {INSTALL}") from None
    return transformers


@contextlib.contextmanager
def _quiet(transformers) -> Iterator[None]:
    """transformers' progress bars and warnings off (fedmpi refuses what matters itself)."""
    logging = transformers.utils.logging
    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def causal_lm_config(where: str, key: str = "task.path"):
    """The ``transformers`` config of the folder ``where``, checked to be a causal LM's."""
    transformers = transformers_module()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    with _quiet(transformers):
        try:
            config = transformers.AutoConfig.from_pretrained(where, local_files_only=True)
        except Exception as e:  # bad JSON, an unknown model_type, ...
            detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise InputError(f"{key}: {where}/config.json: not a usable model config ({detail})") from None
    names = {n for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() for n in ((v,) if isinstance(v, str) else v)}
    archs = list(getattr(config, "architectures", None) or [])
    causal = type(config) in MODEL_FOR_CAUSAL_LM_MAPPING and not getattr(config, "is_encoder_decoder", False)
    if not causal or (archs and not names.intersection(archs)):
        what = ", ".join(archs) or getattr(config, "model_type", "?")
        raise InputError(f"{key}: {where}/config.json describes {what}, not a causal language model "
                         f"(a *ForCausalLM or *LMHeadModel architecture)")
    return config


def load(path: Optional[str], key: str = "task.path") -> nn.Module:
    """The causal LM of folder ``path`` in float32, its dropout off and its Conv1D layers Linear
    (module docstring); every problem one InputError naming ``key`` and the file."""
    where = folder(path, key)
    config = causal_lm_config(where, key)
    transformers = transformers_module()
    with _quiet(transformers):
        try:
            lm, info = transformers.AutoModelForCausalLM.from_pretrained(
                where, config=config, dtype=torch.float32, attn_implementation="eager", local_files_only=True,
                use_safetensors=True, output_loading_info=True)
        except Exception as e:
            detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise InputError(f"{key}: {where}: cannot load the model ({detail})") from None
    for what in ("missing_keys", "mismatched_keys", "unexpected_keys"):
        bad = sorted(str(k) for k in info.get(what) or ())
        if bad:
            raise InputError(f"{key}: {where}: the weights do not fit config.json ({what.replace('_', ' ')}: "
                             f"{', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})")
    for name in sorted(os.listdir(where)):  # what defines the base: inputs of the run (a resume checks them)
        if name == "config.json" or name.endswith((".safetensors", ".safetensors.index.json")):
            provenance.note_input(os.path.join(where, name))
    transposed = _as_linear(lm)
    _no_dropout(lm)
    return CausalLM(lm, transposed)


def _as_linear(model: nn.Module) -> frozenset[str]:
    """GPT-2's ``Conv1D`` (y = x W + b, W in x out) -> ``nn.Linear`` (W^T), in place; their names."""
    from transformers.pytorch_utils import Conv1D

    found = set()
    for name, mod in list(model.named_modules()):
        if isinstance(mod, Conv1D):
            lin = nn.Linear(mod.nx, mod.nf, device="meta")
            lin.weight = nn.Parameter(mod.weight.detach().t().contiguous(), requires_grad=mod.weight.requires_grad)
            lin.bias = nn.Parameter(mod.bias.detach().clone(), requires_grad=mod.bias.requires_grad)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, lin)
            found.add(name)
    return frozenset(found)


def _no_dropout(model: nn.Module) -> None:
    """The base's ``nn.Dropout`` modules -> identities (module docstring)."""
    for name, mod in list(model.named_modules()):
        if isinstance(mod, nn.Dropout):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, nn.Identity())


def context_of(config) -> Optional[int]:
    """The longest sequence the config's positions allow (None when it does not say)."""
    for name in ("max_position_embeddings", "n_positions"):
        v = getattr(config, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _check(cfg) -> None:
    if cfg.train.full_gradient:
        raise InputError("train.full_gradient: task.model hf's loss is the mean over a minibatch's target tokens, "
                         "which full_gradient's per-sample weights do not give; use minibatches")
    folder(cfg.task.path)


@register("hf", params=HFParams, loss=token_cross_entropy, init="own", check=_check)
def _hf(in_shape: tuple, classes: int, params: HFParams) -> nn.Module:
    if len(in_shape) != 1 or classes < 1:
        raise InputError(f"task.model: hf needs token sequences (N, T) of a vocabulary, got samples of shape "
                         f"{in_shape} (task.dataset must be a text dataset)")
    model = load(params.path)
    config = model.lm.config
    vocab = int(model.lm.get_input_embeddings().num_embeddings)
    if classes > vocab:
        raise InputError(f"task.text.tokenizer: the dataset's vocabulary has {classes} ids, more than the "
                         f"{vocab} of {folder(params.path)} (tokenize with the model folder's tokenizer.json)")
    longest = context_of(config)
    if longest is not None and in_shape[0] > longest:
        raise InputError(f"task.text.context: {in_shape[0]} tokens per sequence, more than the {longest} positions "
                         f"of {folder(params.path)}/config.json")
    return model
