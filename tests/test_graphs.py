"""The replayed step loop (engine/graphs.py): the same bits as the loop run step by step.

On CPU a replay calls the step loop again on the graph's own buffers, so these tests check what
a CUDA graph depends on -- every round's inputs copied in, the rows copied out, one graph per
shape reused across rounds -- with every per-step input present, and that the loop reads no
host value (what a capture cannot contain). On a GPU machine the same cases capture real CUDA
graphs (tests/test_gpu.py adds whole models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fedmpi import config
from fedmpi.algorithms.fedprox import Proximal
from fedmpi.engine.local import LocalStats, LocalStep
from helpers.images import image_trainer

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SIZES = (6, 9, 14, 7, 10, 8, 12, 6)  # uneven: full_gradient pads to a block's largest client
CASES = {
    "logreg": ("logreg", {}),
    "dropout, augmentation, momentum, decay, clipping, uneven steps": (
        "cinic_cnn", {"augment": ["crop", "flip"], "momentum": 0.9, "weight_decay": 1e-3, "grad_clip": 0.5,
                      "local_steps_draw": "uniform"}),
    "full gradient, per-batch augmentation": ("svhn_cnn", {"full_gradient": True, "augment": ["flip"],
                                                          "augment_mode": "per_batch"}),
}


def trainers(model: str, device: str = "cpu", **train):
    """The plain step loop and the replayed one, fixed-shape blocks of 4 rows (CUDA's layout)."""
    kw = dict(device=torch.device(device), model=model, sizes=SIZES, train={"local_steps": 3, "lr": 0.05, **train},
              seed=7, fixed_shape=True)
    plain, replayed = image_trainer("batched", **kw), image_trainer("batched", replay=True, **kw)
    for tr in (plain, replayed):
        tr.chunk_size = lambda: 4  # 5 or 3 clients: two blocks or one
    return plain, replayed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_replayed_steps_are_the_step_loop_bit_for_bit(device, case):
    model, train = CASES[case]
    plain, replayed = trainers(model, device, **train)
    assert plain._graphs is None and replayed._graphs is not None
    x0 = plain.spec.flatten(plain.task.model).to(device)
    for t, clients in enumerate([np.array([0, 3, 5, 6, 7]), np.array([2, 1, 4]), np.array([6, 0, 3, 1, 2])]):
        start = x0 + 0.01 * t
        stats = [LocalStats(), LocalStats()]
        a = plain.train(start.expand(len(clients), -1), clients, t, stats=stats[0])
        b = replayed.train(start.expand(len(clients), -1), clients, t, stats=stats[1])
        assert (a - start).abs().max() > 1e-5 and torch.equal(a, b)
        for name in ("loss", "first_loss", "steps"):
            np.testing.assert_array_equal(getattr(stats[0], name), getattr(stats[1], name))
    assert not replayed._graphs.failed
    # one graph per shape, replayed: per step count drawn (uniform), per block width (full gradient)
    if "local_steps_draw" not in train and "full_gradient" not in train:
        assert replayed._graphs.captures == 1


class _NoHostValues(TorchDispatchMode):
    """Fails on what a CUDA graph cannot hold: reading a tensor's value on the host (``item``,
    ``nonzero``, a data-dependent shape), making a tensor from host data, or moving one between
    devices."""

    BANNED = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "lift_fresh")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        moved = name == "_to_copy" and kwargs.get("device") not in (None, args[0].device)
        if name in self.BANNED or moved:
            raise AssertionError(f"the step loop calls {func.__name__} {kwargs}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("case", list(CASES))
def test_the_step_loop_reads_no_host_value(case):
    model, train = CASES[case]
    _, tr = trainers(model, **train)
    clients = np.array([0, 3, 5, 6])
    x = tr.spec.flatten(tr.task.model).expand(4, -1).clone()
    inp = tr.step_inputs(clients, 2, tr.steps_of(clients, 2), masks=True)
    lr = torch.full((4,), 0.05)
    tr.task.inputs(tr.task.train_x[:1])  # the normalisation constants exist before the loop (as after warm-up)
    with _NoHostValues():
        losses = tr.run_steps(x, inp, lr, LocalStep(tr.cfg), record=True)
    assert len(losses) == inp.steps


def test_algorithm_terms_run_step_by_step():
    """A step term's rows belong to the algorithm, not to a graph's buffers: no replay then."""
    plain, replayed = trainers("logreg")
    clients = np.array([1, 2, 3])
    x0 = plain.spec.flatten(plain.task.model).expand(3, -1)
    a = plain.train(x0, clients, 0, terms=(Proximal(0.1, x0),))
    b = replayed.train(x0, clients, 0, terms=(Proximal(0.1, x0),))
    assert torch.equal(a, b) and replayed._graphs.captures == 0


def test_graphs_are_kept_for_the_last_shapes_only(monkeypatch):
    """A new step count is a new graph; the least recently used beyond KEEP are dropped."""
    from fedmpi.engine import graphs

    monkeypatch.setattr(graphs, "KEEP", 2)
    plain, replayed = trainers("logreg")
    clients = np.array([1, 2, 3, 4])
    x0 = plain.spec.flatten(plain.task.model).expand(4, -1)
    for steps in (1, 2, 3, 1):
        assert torch.equal(plain.train(x0, clients, 0, steps=steps), replayed.train(x0, clients, 0, steps=steps))
    assert replayed._graphs.captures == 4 and len(replayed._graphs.entries) == 2


def test_the_key_is_off_by_default_and_needs_cuda():
    plain, _ = trainers("logreg", cuda_graphs=True)  # asked for, on CPU: the step loop as it is
    assert plain._graphs is None
    assert config.from_dict({}).train.cuda_graphs is False
    digest = config.from_dict({}).resume_digest()
    assert config.from_dict({"train": {"cuda_graphs": True}}).resume_digest() == digest  # the same bits
