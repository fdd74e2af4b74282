"""A tiny language-model task: the small transformer on the synthetic token dataset, with or
without LoRA (tests of the trainable/frozen split, LoRA, the token loss and the text metrics)."""

from __future__ import annotations

import copy

from fedmpi.config import _set_dotted

#: LoRA on every Linear of the transformer's blocks, with dropout (the keyed masks)
LORA = {"kind": "lora", "r": 2, "alpha": 4.0, "dropout": 0.1,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]}
BASE = {
    "name": "lm", "seed": 2, "rounds": 3, "eval_every": 3,
    "task": {"dataset": "synthetic_text", "model": "transformer", "clients": 8, "partition": {"kind": "natural"},
             "synthetic_text": {"samples": 240, "test_samples": 64, "vocab": 20, "length": 12, "users": 8},
             "width": 16, "heads": 2, "layers": 2},
    "train": {"local_steps": 2, "batch_size": 4, "lr": 0.3},
    "availability": {"kind": "always"},
    "runtime": {"progress": False},
}


def text_config(lora: bool = True, **over) -> dict:
    """The config of the tiny task (``lora``: with ``LORA``); ``over`` as ``conftest.synthetic_config``'s."""
    cfg = copy.deepcopy(BASE)
    if lora:
        cfg["task"]["adapter"] = copy.deepcopy(LORA)
    for k, v in over.items():
        _set_dotted(cfg, k.replace("__", "."), v)
    return cfg
