"""``fedmpi export-peft RUN.h5 DIR``: the final global LoRA adapter of a run in PEFT's format.

DIR gets ``adapter_config.json`` and ``adapter_model.safetensors`` as PEFT's ``save_pretrained``
writes them, so that ``peft.PeftModel.from_pretrained(base, DIR)`` adapts ``base`` (the
``transformers`` model of the run's ``task.path``, for ``task.model: hf``) with the run's final
adapter, giving fedmpi's final model's logits. fedmpi's LoRA already follows PEFT's conventions
(``models.adapters``: A r x in, B out x r, scale alpha / r, the same module names), so the export
renames and writes:

- the tensors: ``<module>.lora_A.weight`` -> ``base_model.model.<module>.lora_A.weight`` (PEFT's
  saved names, without its adapter name), the module named inside the ``transformers`` model
  (``models.hf.CausalLM.lm``; the built-in models: inside the model itself);
- the config: ``peft_type`` LORA, ``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules`` (the
  run's, or its model's default; PEFT matches them as fedmpi did: a name or a ``.`` suffix),
  ``fan_in_fan_out`` for GPT-2's Conv1D layers, ``task_type`` CAUSAL_LM and
  ``base_model_name_or_path`` (the folder) for an hf model.

Writes nothing when anything is wrong (one line naming the file or the key, exit 2); replaces
existing adapter files only with ``--overwrite``. Needs ``safetensors`` (``[llm]``), not ``peft``.
"""

from __future__ import annotations

import argparse
import json
import os

from ..errors import InputError
from ..registry import MODELS

FILES = ("adapter_config.json", "adapter_model.safetensors")


def adapter_files(model, cfg) -> tuple[dict, dict]:
    """(PEFT's adapter config, {PEFT name: tensor}) of the LoRA adapter of ``model`` built from ``cfg``."""
    from .adapters import LoRALinear
    from .hf import CausalLM

    adapter = cfg.task.adapter
    if adapter.kind != "lora":
        raise InputError(f"task.adapter.kind: the run trained {adapter.kind!r}; export-peft exports LoRA adapters "
                         f"(task.adapter.kind: lora)")
    base = model.lm if isinstance(model, CausalLM) else model
    lora = {name: mod for name, mod in base.named_modules() if isinstance(mod, LoRALinear)}
    tensors = {f"base_model.model.{name}.lora_{ab}.weight": getattr(mod, f"lora_{ab}").weight.detach().contiguous()
               for name, mod in lora.items() for ab in "AB"}
    targets = adapter.target_modules or list(MODELS.get(cfg.task.model).options.get("targets", ()))
    hf = isinstance(model, CausalLM)
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM" if hf else None,
        "base_model_name_or_path": os.path.abspath(os.path.expanduser(cfg.task.path)) if hf else None,
        "r": adapter.r, "lora_alpha": adapter.alpha, "lora_dropout": adapter.dropout,
        "target_modules": list(targets), "fan_in_fan_out": bool(hf and model.transposed & set(lora)),
        "bias": "none", "use_rslora": False, "use_dora": False, "modules_to_save": None,
        "init_lora_weights": True, "inference_mode": True, "revision": None,
    }
    return config, tensors


def export(run: str, folder: str, overwrite: bool = False) -> list[str]:
    """Write the final adapter of result file ``run`` into ``folder`` (module docstring); the paths written."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise InputError("export-peft: writing adapter_model.safetensors needs the safetensors package: "
                         "pip install 'fedmpi[llm]'") from None
    from ..build import build_task
    from .pretrained import final_model

    where = os.path.abspath(os.path.expanduser(folder))
    if os.path.exists(where) and not os.path.isdir(where):
        raise InputError(f"export-peft: {where} exists and is not a folder")
    there = [f for f in FILES if os.path.exists(os.path.join(where, f))]
    if there and not overwrite:
        raise InputError(f"export-peft: {os.path.join(where, there[0])} already exists; use --overwrite to replace it")
    cfg, model = final_model(run, "export-peft", build_task)
    config, tensors = adapter_files(model, cfg)
    os.makedirs(where, exist_ok=True)
    paths = [os.path.join(where, f) for f in FILES]
    save_file(tensors, paths[1] + ".tmp", metadata={"format": "pt"})
    with open(paths[0] + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2, sort_keys=True)
        fh.write("\n")
    for p in paths:
        os.replace(p + ".tmp", p)
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Write the final global LoRA adapter of a run as PEFT's adapter_config.json + "
                          "adapter_model.safetensors (peft.PeftModel.from_pretrained(base, DIR) loads it).")
    parser.add_argument("run", help="result file of a LoRA run (task.adapter.kind: lora)")
    parser.add_argument("folder", help="folder to write the adapter into (made when missing)")
    parser.add_argument("--overwrite", action="store_true", help="replace adapter files already in the folder")


def run_cli(args: argparse.Namespace) -> int:
    for path in export(args.run, args.folder, args.overwrite):
        print(f"fedmpi: wrote {path}")
    return 0
