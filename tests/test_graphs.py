"""The replayed step loop (engine/graphs.py): the same bits as the loop run step by step.

On CPU a replay calls the step loop again on the graph's own buffers, so these tests check what
a CUDA graph depends on -- every round's inputs copied in, the rows copied out, one graph per
shape reused across rounds -- with every per-step input present. tests/test_gpu.py checks the
capture itself on a GPU machine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedmpi import config
from fedmpi.algorithms.fedprox import Proximal
from fedmpi.engine.local import LocalStats, LocalTrainer
from fedmpi.models import build_model, loss_fn
from fedmpi.task import Task

CPU = torch.device("cpu")


def image_task(model: str) -> Task:
    """8 clients of 6-14 random 3x8x8 images each (uneven sizes: full_gradient pads)."""
    g = torch.Generator().manual_seed(0)
    sizes = np.array([6, 9, 14, 7, 10, 8, 12, 6])
    n = int(sizes.sum())
    x = torch.randint(0, 256, (n, 3, 8, 8), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (n,), generator=g)
    return Task(model=build_model(model, (3, 8, 8), 10), loss=loss_fn(model), train_x=x, train_y=y, test_x=x,
                test_y=y, order=torch.randperm(n, generator=g), offsets=np.concatenate([[0], np.cumsum(sizes)]),
                classes=10, label_hist=None, groups=None, mean=torch.full((3,), 0.5), std=torch.full((3,), 0.25),
                image=True)


def trainers(model: str, **train) -> tuple[LocalTrainer, LocalTrainer]:
    task = image_task(model)
    cfg = config.from_dict({"task": {"clients": 8}, "train": {"batch_size": 4, "local_steps": 3, "lr": 0.05, **train}})
    return (LocalTrainer(task, cfg.train, 7, path="batched", fixed_shape=True),
            LocalTrainer(task, cfg.train, 7, path="batched", fixed_shape=True, replay=True))


CASES = {
    "logreg": ("logreg", {}),
    "dropout, augmentation, momentum, decay, clipping, uneven steps": (
        "cinic_cnn", {"augment": ["crop", "flip"], "momentum": 0.9, "weight_decay": 1e-3, "grad_clip": 0.5,
                      "local_steps_draw": "uniform"}),
    "full gradient, per-batch augmentation": ("svhn_cnn", {"full_gradient": True, "augment": ["flip"],
                                                          "augment_mode": "per_batch"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_replayed_steps_are_the_step_loop_bit_for_bit(monkeypatch, case):
    model, train = CASES[case]
    plain, replayed = trainers(model, **train)
    assert plain._graphs is None and replayed._graphs is not None
    for tr in (plain, replayed):
        monkeypatch.setattr(tr, "chunk_size", lambda: 4)  # 5 or 3 clients: one or two blocks of 4 rows
    x0 = plain.spec.flatten(plain.task.model)
    for t, clients in enumerate([np.array([0, 3, 5, 6, 7]), np.array([2, 1, 4]), np.array([6, 0, 3, 1, 2])]):
        start = x0 + 0.01 * t
        stats = [LocalStats(), LocalStats()]
        a = plain.train(start.expand(len(clients), -1), clients, t, stats=stats[0])
        b = replayed.train(start.expand(len(clients), -1), clients, t, stats=stats[1])
        assert (a - start).abs().max() > 1e-5 and torch.equal(a, b)
        for name in ("loss", "first_loss", "steps"):
            np.testing.assert_array_equal(getattr(stats[0], name), getattr(stats[1], name))
    # one graph per shape, replayed: per step count drawn (uniform), per block width (full gradient)
    if "local_steps_draw" not in train and "full_gradient" not in train:
        assert replayed._graphs.captures == 1


def test_algorithm_terms_run_step_by_step():
    """A step term's rows belong to the algorithm, not to a graph's buffers: no replay then."""
    plain, replayed = trainers("logreg")
    clients = np.array([1, 2, 3])
    x0 = plain.spec.flatten(plain.task.model).expand(3, -1)
    a = plain.train(x0, clients, 0, terms=(Proximal(0.1, x0),))
    b = replayed.train(x0, clients, 0, terms=(Proximal(0.1, x0),))
    assert torch.equal(a, b) and replayed._graphs.captures == 0


def test_the_key_is_off_by_default_and_needs_cuda():
    plain, _ = trainers("logreg", cuda_graphs=True)  # asked for, on CPU: the step loop as it is
    assert plain._graphs is None
    assert config.from_dict({}).train.cuda_graphs is False
    digest = config.from_dict({}).resume_digest()
    assert config.from_dict({"train": {"cuda_graphs": True}}).resume_digest() == digest  # the same bits
