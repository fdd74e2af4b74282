"""Pretrained models: the final model of a result file (its config and its trained parameters,
``/final/params``, the flat trainable vector of ``engine.params.ParamSpec``), and ``task.init``.

Used by ``fedmpi export-peft`` (the final global adapter in PEFT's format, ``models.peft_export``)
and by ``task.init``: a run starts from a pretrained model, a result file's final model (e.g. the
small transformer pretrained centrally, then fine-tuned federated with LoRA over it) or a folder
of safetensors weights. ``initialise`` loads it into the model as built, before its adapter: the
pretrained model's LoRA, if it had one, merged into its base (W + alpha / r B A), so that the
adapter of the new run starts at the pretrained model. The key is a ``task`` key, so the resume
digest covers it (the file's content is recorded as an input of the run, ``provenance``).

Read on any rank, no communication; every problem is one ``InputError`` naming ``key`` and the file.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING, Callable, Iterator

import h5py
import numpy as np
import torch
from torch import nn

from .. import provenance, yamlio
from ..errors import InputError
from ..inputs import read_input

if TYPE_CHECKING:
    from ..config import Config
    from ..task import Task

Build = Callable[["Config", torch.device], "Task"]


def final_params(path: str, key: str) -> tuple[dict, np.ndarray]:
    """(the stored config as a dict, the final trainable parameters (d,) float32) of result file ``path``."""
    from ..results.reader import load

    where = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(where):
        raise InputError(f"{key}: {where}: no such result file")
    result = load(where)
    provenance.note_input(where)
    if result.config_problem:
        raise InputError(f"{key}: {where}: has no readable config ({result.config_problem})")
    try:
        with h5py.File(where, "r") as f:
            if "final/params" not in f:
                raise InputError(f"{key}: {where}: holds no final model (/final/params: the run has not finished, "
                                 f"status {result.status})")
            params = np.asarray(f["final/params"][:], dtype=np.float32)
    except OSError as e:
        raise InputError(f"{key}: {where}: cannot read ({e})") from None
    return result.config, params


def final_model(path: str, key: str, build: Build) -> tuple[Config, nn.Module]:
    """The config of result file ``path`` and its model (built by ``build``, ``fedmpi.build.build_task``,
    as the run built it, on the CPU) holding the final parameters."""
    from .. import config as configs
    from ..engine.params import ParamSpec

    stored, params = final_params(path, key)
    try:
        cfg = configs.from_dict(stored)
    except InputError as e:
        raise InputError(f"{key}: {path}: its config no longer builds ({e})") from None
    model = build(cfg, torch.device("cpu")).model
    spec = ParamSpec.of(model)
    if params.shape != (spec.dim,):
        raise InputError(f"{key}: {path}: /final/params holds {params.size} numbers, but its model has "
                         f"{spec.dim} trainable parameters")
    load_trainable(model, spec.views(torch.from_numpy(params)))
    return cfg, model


def load_trainable(model: nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Copy ``values`` {name: tensor} into the parameters of ``model`` of those names."""
    named = dict(model.named_parameters())
    with torch.no_grad():
        for name, v in values.items():
            named[name].copy_(v)


# ----------------------------------------------------------------------------- task.init

def initialise(model: nn.Module, init: str, name: str, build: Build, key: str = "task.init") -> None:
    """Load the pretrained parameters that ``init`` names into ``model`` (``task.model`` ``name``, built
    without its adapter yet), in place: a result file's final model (its LoRA merged into the base
    weights: W + alpha / r B A), or a folder of safetensors weights (``model.safetensors`` or its
    shards; a Hugging Face folder for ``hf``). Every parameter of ``model`` must be there with its
    shape, and nothing else: otherwise one InputError naming the file and the parameter. ``build``:
    ``fedmpi.build.build_task``, which builds the result file's model."""
    where = os.path.abspath(os.path.expanduser(init))
    if os.path.isdir(where):
        state = _folder_state(where, key)
        if hasattr(model, "from_saved"):  # names and layouts of the model's own saved form (models.hf)
            state = model.from_saved(state)
    else:
        with _quiet_logs(), _link(where, key):
            state = merged_state(final_model(where, key, build)[1])
    own = dict(model.named_parameters())
    for n, p in own.items():
        if n not in state:
            raise InputError(f"{key}: {where}: has no parameter {n!r} of task.model {name}")
        if tuple(state[n].shape) != tuple(p.shape):
            raise InputError(f"{key}: {where}: parameter {n!r} is {_shape(state[n].shape)} there, "
                             f"{_shape(p.shape)} in task.model {name}")
    extra = [n for n in state if n not in own]
    if extra:
        raise InputError(f"{key}: {where}: holds parameter {extra[0]!r}, which task.model {name} has not")
    load_trainable(model, state)


_CHAIN: list[str] = []  # the result files whose models are being built, outermost first (this process)


@contextlib.contextmanager
def _link(where: str, key: str) -> Iterator[None]:
    """One link of a chain of ``task.init`` result files (a result file's model is built from its
    own ``task.init``): InputError when the chain comes back to ``where``."""
    if where in _CHAIN:
        chain = " -> ".join(_CHAIN[_CHAIN.index(where):] + [where])
        raise InputError(f"{key}: {where}: its chain of task.init leads back to it ({chain})")
    _CHAIN.append(where)
    try:
        yield
    finally:
        _CHAIN.pop()


def merged_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters of ``model`` by name, each LoRA module merged into its base Linear
    (``<module>.weight`` = W + alpha / r B A, ``<module>.bias``): the model without its adapter."""
    from .adapters import LoRALinear

    lora = {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}
    state = {n: p.detach() for n, p in model.named_parameters()
             if not any(n.startswith(q + ".") for q in lora)}
    with torch.no_grad():
        for q, mod in lora.items():
            state[f"{q}.weight"] = mod.base_layer.weight + (mod.lora_B.weight @ mod.lora_A.weight) * mod.scaling
            if mod.base_layer.bias is not None:
                state[f"{q}.bias"] = mod.base_layer.bias.detach()
    return state


def _folder_state(where: str, key: str) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors weights in folder ``where`` (one file or an index's shards)."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise InputError(f"{key}: reading {where} needs the safetensors package: pip install 'fedmpi[llm]'") from None
    index = os.path.join(where, "model.safetensors.index.json")
    if os.path.isfile(os.path.join(where, "model.safetensors")):
        files = ["model.safetensors"]
    elif os.path.isfile(index):
        doc = yamlio.loads_json(read_input(index, "model.safetensors.index.json", key), f"{key}: {index}")
        shards = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(shards, dict) or not all(isinstance(f, str) and "/" not in f for f in shards.values()):
            raise InputError(f"{key}: {index}: no weight_map of tensor names to shard files")
        files = sorted(set(shards.values()))
    else:
        raise InputError(f"{key}: {where}: no safetensors weights (model.safetensors)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        path = os.path.join(where, f)
        provenance.note_input(path)
        try:
            state.update(load_file(path))
        except Exception as e:  # a missing shard, a damaged header
            raise InputError(f"{key}: {path}: not readable safetensors ({str(e).splitlines()[0][:160]})") from None
    return state


def _shape(shape) -> str:
    return " x ".join(str(int(s)) for s in shape) or "a scalar"


@contextlib.contextmanager
def _quiet_logs():
    """The notices of building another run's task (its dataset's lines) stay unprinted."""
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
