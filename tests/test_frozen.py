"""The trainable/frozen split (engine.params): a parameter with requires_grad False belongs to the
frozen base, held once per rank; a client's row, and everything that carries client rows, holds
only the trainable part. Every path (stacked layers, vmap, sequential) trains the trainable part
only and never changes the base; a model that trains everything is described as before."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

from conftest import synthetic_config
from fedmpi import config
from fedmpi.build import build_components, build_task
from fedmpi.checkpointer import Checkpointer
from fedmpi.engine.layers import StackedNet
from fedmpi.engine.local import LocalTrainer
from fedmpi.engine.packed import PackedTrainer, SharedData, incompatibility
from fedmpi.engine.params import ParamSpec, frozen, frozen_bytes
from fedmpi.errors import InputError
from fedmpi.models import ARCHS, MLPParams, build_model
from fedmpi.models import register as register_model
from fedmpi.registry import MODELS
from fedmpi.runtime import World

CPU = torch.device("cpu")


def half_frozen(features: int = 16, classes: int = 4, seed: int = 0) -> nn.Module:
    """An MLP whose first layer is a frozen base."""
    torch.manual_seed(seed)
    model = nn.Sequential(OrderedDict(flatten=nn.Flatten(), fc1=nn.Linear(features, 12), act=nn.Tanh(),
                                      fc2=nn.Linear(12, 12), relu=nn.ReLU(), out=nn.Linear(12, classes)))
    model.fc1.requires_grad_(False)
    return model


def _task(model: nn.Module):
    cfg = config.from_dict(synthetic_config())
    task = build_task(cfg, CPU)
    task.model = model
    return cfg, task


def test_the_spec_is_the_trainable_part():
    model = half_frozen()
    spec = ParamSpec.of(model)
    assert spec.names == ("fc2.weight", "fc2.bias", "out.weight", "out.bias")
    assert spec.dim == 12 * 12 + 12 + 4 * 12 + 4
    flat = spec.flatten(model)
    assert flat.shape == (spec.dim,) and torch.equal(spec.views(flat)["out.bias"], model.out.bias)
    assert set(frozen(model)) == {"fc1.weight", "fc1.bias"} and frozen_bytes(model) == 4 * (16 * 12 + 12)


@pytest.mark.parametrize("name", list(ARCHS))
def test_a_model_that_trains_everything_is_described_as_before(name):
    model = build_model(name, (3, 32, 32), 10, params=MLPParams(hidden=8))
    named = list(model.named_parameters())
    spec = ParamSpec.of(model)
    assert spec.names == tuple(n for n, _ in named) and spec.shapes == tuple(p.shape for _, p in named)
    assert torch.equal(spec.flatten(model), torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    assert frozen(model) == {} and frozen_bytes(model) == 0


def test_the_stacked_net_reads_the_base_expanded_not_copied():
    model = half_frozen()
    net = StackedNet.compile(model)
    assert net is not None and set(net.frozen) == {"fc1.weight", "fc1.bias"} and not net._head
    spec = ParamSpec.of(model)
    params = spec.views(spec.flatten(model).expand(5, -1))
    full = net.with_base(params, 5)
    w = full["fc1.weight"]
    assert w.shape == (5, 12, 16) and w.stride(0) == 0 and w.data_ptr() == model.fc1.weight.data_ptr()
    x, y = torch.randn(5, 3, 16), torch.randint(0, 4, (5, 3))
    loss, grads = net.value_and_gradients(nn.functional.cross_entropy, params, x, y, None, None)
    assert set(grads) == set(spec.names)  # gradients only of the trainable part
    ref = model(x[2])
    torch.testing.assert_close(net.forward(params, x)[2], ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("path,stacked", [("batched", True), ("batched", False), ("sequential", True)])
def test_every_path_trains_the_trainable_part_and_leaves_the_base(path, stacked):
    """Stacked layers, vmap(grad) and the sequential loop agree; the base is never written; a
    client gets the same bits alone and in a block."""
    cfg, task = _task(half_frozen())
    base = {k: v.detach().clone() for k, v in frozen(task.model).items()}
    tr = LocalTrainer(task, cfg.train, cfg.seed, path=path, stacked=stacked)
    ref = LocalTrainer(task, cfg.train, cfg.seed, path="sequential")
    assert (tr.net is not None) == stacked
    ids = np.arange(6)
    x0 = tr.spec.flatten(task.model).expand(len(ids), -1)
    together = tr.train(x0, ids, t=1)
    assert together.shape == (6, tr.spec.dim) and (together - x0).abs().max() > 1e-3
    torch.testing.assert_close(together, ref.train(x0, ids, t=1), rtol=0, atol=1e-5)
    alone = tr.train(x0[3:4], ids[3:4], t=1)
    assert torch.equal(alone[0], together[3])
    assert all(torch.equal(v, base[k]) for k, v in frozen(task.model).items())


def test_packing_needs_equal_bases_and_shares_one_copy():
    cfg, task = _task(half_frozen(seed=0))
    _, same = _task(half_frozen(seed=0))
    _, other = _task(half_frozen(seed=1))
    a, b, c = (LocalTrainer(t, cfg.train, cfg.seed) for t in (task, same, other))
    assert incompatibility(a, b) is None and incompatibility(a, c) == "task.model (frozen base)"
    shared = SharedData()
    shared.share(task)
    shared.share(same)
    assert same.model.fc1.weight.data_ptr() == task.model.fc1.weight.data_ptr()  # one copy
    ids = np.arange(4)
    x0 = a.spec.flatten(task.model).expand(4, -1)
    from fedmpi.engine.local import Training

    packed = PackedTrainer([a, b]).train([(0, Training(x0, ids, 1)), (1, Training(x0, ids[::-1].copy(), 1))])
    assert torch.equal(packed[0], a.train(x0, ids, t=1)) and torch.equal(packed[1], b.train(x0, ids[::-1].copy(), t=1))


@pytest.fixture
def frozen_model():
    """A registered model whose first layer is frozen (a plug-in's)."""
    @register_model("half_frozen_mlp")
    def _make(in_shape, classes, params):
        return half_frozen(int(np.prod(in_shape)), classes)

    yield "half_frozen_mlp"
    MODELS._entries.pop("half_frozen_mlp", None)


def test_a_run_keeps_client_rows_and_checkpoints_of_the_trainable_part(frozen_model, tmp_path):
    """MIFA keeps one row per client: a row is the trainable part; the checkpoint holds rows of
    that width and no base; the base does not change over the rounds; a resumed run ends with the
    same bits."""
    cfg = config.from_dict(synthetic_config(task__model=frozen_model, algorithm={"name": "mifa"}, rounds=4))
    world = World()
    run = build_components(cfg, world)
    d = run.trainer.spec.dim
    base = {k: v.detach().clone() for k, v in frozen(run.task.model).items()}
    for t in range(4):
        run.algorithm.round(t)
    final = run.algorithm.final_params()
    assert final.shape == (d,)
    assert all(torch.equal(v, base[k]) for k, v in frozen(run.task.model).items())
    cut = build_components(cfg, world)
    for t in range(2):
        cut.algorithm.round(t)
    path = str(tmp_path / "r.h5")
    Checkpointer(cut, path).save(2, 0.0)
    state = cut.algorithm.state_dict()
    widths = {tuple(v.shape)[1:] for v in state.clients.values() if torch.is_tensor(v) and v.dim() == 2}
    assert widths == {(d,)}, widths
    resumed = build_components(cfg, world)
    keeper = Checkpointer(resumed, path, required=True)
    assert keeper.rounds_done == 2
    for t in range(2, 4):
        resumed.algorithm.round(t)
    assert torch.equal(resumed.algorithm.final_params(), final)


def test_the_memory_check_counts_the_base_once(frozen_model, monkeypatch):
    cfg = config.from_dict(synthetic_config(task__model=frozen_model))
    world = World()
    base = frozen_bytes(build_task(cfg, CPU).model)
    monkeypatch.setattr(World, "free_memory", lambda self: (int(base / 0.9) - 1, "in RAM"))
    with pytest.raises(InputError, match=r"^task\.model: the frozen base of half_frozen_mlp takes"):
        build_components(cfg, world)
