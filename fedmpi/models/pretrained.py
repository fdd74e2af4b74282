"""The final model of a result file: its config and its trained parameters (``/final/params``,
the flat trainable vector of ``engine.params.ParamSpec``), and the model they make.

Used by ``fedmpi export-peft`` (the final global adapter in PEFT's format, ``models.peft_export``)
and by ``task.init`` (a later run starting from it). Read on any rank, no communication; every
problem is one ``InputError`` naming ``key`` and the file.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import h5py
import numpy as np
import torch
from torch import nn

from ..errors import InputError

if TYPE_CHECKING:
    from ..config import Config


def final_params(path: str, key: str) -> tuple[dict, np.ndarray]:
    """(the stored config as a dict, the final trainable parameters (d,) float32) of result file ``path``."""
    from ..results.reader import load

    where = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(where):
        raise InputError(f"{key}: {where}: no such result file")
    result = load(where)
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


def final_model(path: str, key: str) -> tuple[Config, nn.Module]:
    """The config of result file ``path`` and its model (built as the run built it, on the CPU)
    holding the final parameters."""
    from .. import config as configs
    from ..build import build_task
    from ..engine.params import ParamSpec

    stored, params = final_params(path, key)
    try:
        cfg = configs.from_dict(stored)
    except InputError as e:
        raise InputError(f"{key}: {path}: its config no longer builds ({e})") from None
    model = build_task(cfg, torch.device("cpu")).model
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
