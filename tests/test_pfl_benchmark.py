"""benchmarks/pfl_cifar10.py: pfl-research's CIFAR-10 setup is a valid fedmpi config, and its
synthetic stand-in goes through fedmpi's own CIFAR-10 reader with the benchmark's shapes."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

from conftest import ROOT
from fedmpi import config
from fedmpi.build import build_task
from fedmpi.engine.local import LocalTrainer
from fedmpi.models import count_params


def bench():
    spec = importlib.util.spec_from_file_location("pfl_cifar10", os.path.join(ROOT, "benchmarks", "pfl_cifar10.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_setup_is_pfl_researchs(tmp_path):
    b = bench()
    root = b.synthetic_cifar(str(tmp_path / "data"))
    cfg = config.from_dict(b.pfl_config(10, 10, "cpu", root, str(tmp_path / "cache")))
    assert cfg.availability.size == 50 and cfg.train.batch_size == 10 and cfg.train.lr == 0.1
    task = build_task(cfg, torch.device("cpu"))
    assert task.m == 1000 and set(np.asarray(task.sizes).tolist()) == {50}
    assert tuple(task.train_x.shape) == (50_000, 3, 32, 32) and task.train_x.dtype == torch.uint8
    assert len(task.test_y) == 10_000 and count_params(task.model) == 1_626_442
    steps = LocalTrainer(task, cfg.train, cfg.seed).steps_of(np.arange(1000), 0)
    assert set(steps.tolist()) == {5}  # one epoch of 50 images in batches of 10
