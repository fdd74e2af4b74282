"""Per-round work done once instead of every time, with the same results: the images'
normalisation constants, the stacked net's activation count, the process handle of the
peak-memory probe."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import torch

from fedmpi import evaluator
from fedmpi.task import Task
from fedmpi.engine.layers import StackedNet
from fedmpi.models import build_model


def image_task(channels: int) -> Task:
    g = torch.Generator().manual_seed(channels)
    x = torch.randint(0, 256, (40, channels, 6, 6), generator=g, dtype=torch.uint8)
    x[0] = 0
    x[1] = 255
    y = torch.randint(0, 10, (40,), generator=g)
    return Task(model=build_model("logreg", (channels, 6, 6), 10), loss=None, train_x=x, train_y=y, test_x=x,
                test_y=y, order=torch.arange(40), offsets=np.array([0, 40]), classes=10, label_hist=None,
                groups=None, mean=torch.rand(channels, generator=g), std=0.1 + torch.rand(channels, generator=g),
                image=True)


def per_batch_normalisation(task: Task, xb: torch.Tensor) -> torch.Tensor:
    """What Task.inputs computed before its constants were cached: the constants made from
    mean and std at every call, the same two float32 roundings per element."""
    shape = [1] * (xb.dim() - 3) + [-1, 1, 1]
    return xb.float().mul_((1.0 / (255.0 * task.std)).view(shape)).sub_((task.mean / task.std).view(shape))


def test_image_inputs_have_the_bits_of_the_per_batch_normalisation():
    for channels in (1, 3):
        task = image_task(channels)
        for xb in (task.train_x, task.train_x[5:25].view(4, 5, channels, 6, 6)):  # one batch; stacked clients
            for _ in range(2):  # the constants are made at the first call and reused
                assert torch.equal(task.inputs(xb), per_batch_normalisation(task, xb))
        moved = task.to(torch.device("cpu"))
        assert torch.equal(moved.inputs(task.train_x), per_batch_normalisation(task, task.train_x))
        other = dataclasses.replace(task, std=task.std * 2)  # a new Task makes its own constants
        assert torch.equal(other.inputs(task.train_x), per_batch_normalisation(other, task.train_x))
        assert not torch.equal(other.inputs(task.train_x), task.inputs(task.train_x))


def test_float_inputs_pass_through():
    task = dataclasses.replace(image_task(1), image=False)
    xb = torch.randn(3, 4)
    assert task.inputs(xb) is xb


def test_activation_count_is_made_once_per_shape():
    net = StackedNet.compile(build_model("mlp", (1, 8, 8), 10))
    shapes = {name: p.shape for name, p in build_model("mlp", (1, 8, 8), 10).named_parameters()}
    first = net.activation_numel(shapes, torch.Size((1, 8, 8)), 4)
    calls = []
    net._count_activations = lambda *a: calls.append(a) or -1  # any new computation would show
    assert net.activation_numel(shapes, torch.Size((1, 8, 8)), 4) == first and not calls
    assert net.activation_numel(shapes, torch.Size((1, 8, 8)), 5) == -1 and len(calls) == 1
    fresh = StackedNet.compile(build_model("mlp", (1, 8, 8), 10))
    assert fresh.activation_numel(shapes, torch.Size((1, 8, 8)), 5) == first // 4 * 5 > first


def test_peak_rss_keeps_one_process_handle():
    first = evaluator.peak_rss_mb()
    handle = evaluator._process
    big = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MB touched
    second = evaluator.peak_rss_mb()
    assert evaluator._process is handle and handle.pid == os.getpid()
    assert second >= first > 0 and second >= big.numel() / 2**20


def test_the_reduction_pre_rounds_in_place_only_rows_the_algorithm_does_not_hold():
    """Row ownership is decided once, in ServerAlgorithm: fresh rows are rounded in place (no
    copy); an override returning rows it keeps (a plug-in caching what it sent, a view of its
    state or of the round's models) has them left intact, with the same model."""
    from helpers.quadratic import build, quadratic_cfg

    from fedmpi.algorithms.fedavg import FedAvgActive

    class KeepsRows(FedAvgActive):  # e.g. a plug-in caching what it sent
        def contribution(self, t, active, local, start, end):
            self.kept = super().contribution(t, active, local, start, end)
            self.copy = self.kept.clone()
            return self.kept

    cfg = quadratic_cfg("fedavg_active", [[0.3, 1.7], [8.1, -2.2], [-4.9, 3.3]],
                        availability={"kind": "stationary", "base": {"kind": "fixed", "values": [1.0]}})
    plain, keeps = build(cfg), build(cfg)
    keeps.__class__ = KeepsRows
    for t in range(3):
        plain.round(t)
        keeps.round(t)
        assert torch.equal(keeps.kept, keeps.copy)  # not pre-rounded in place
        assert torch.equal(plain.x, keeps.x)
    fresh = torch.ones(2, 3, dtype=torch.float64)
    start = torch.zeros(2, 3, dtype=torch.float64)
    assert plain._owned(fresh, start, start) is fresh  # new rows: no copy
    for held in (start[:1], keeps.kept):  # a view of the round's models, a tensor it holds
        copy = keeps._owned(held, start, start)
        assert copy is not held and torch.equal(copy, held)
