"""Stacked layers (engine.layers): the same outputs and gradients as each client's own module,
closed-form gradients equal to autograd, bit-level independence from batch-mates and thread
counts, and the vmap fallback for modules without a stacked rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from conftest import synthetic_config
from fedmpi import config
from fedmpi.models.nets import ScalarModel
from fedmpi.build import build_task
from fedmpi.task import Task
from fedmpi.engine.layers import CONV_IMPLS, StackedNet
from fedmpi.engine.local import LocalTrainer
from fedmpi.models import MLPParams, build_model, loss_fn
from fedmpi.models.nets import ARCHS
from fedmpi.models.dropout import KeyedDropout
from fedmpi.models.losses import cross_entropy, multiclass_hinge, quadratic

CPU = torch.device("cpu")
IMG = (3, 32, 32)


def stacked_params(models: list[nn.Module]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([dict(m.named_parameters())[k].detach() for m in models])
            for k, _ in models[0].named_parameters()}


def models_and_data(name: str, n: int = 3, b: int = 2, shape=IMG):
    models = [build_model(name, shape, 10, seed=s, params=MLPParams(hidden=32)) for s in range(n)]
    gen = torch.Generator().manual_seed(0)
    return models, torch.randn(n, b, *shape, generator=gen), torch.randint(0, 10, (n, b), generator=gen)


@pytest.mark.parametrize("name", [m for m in ARCHS if m != "vgg11"])
@pytest.mark.parametrize("conv", CONV_IMPLS)
def test_stacked_forward_and_gradients_equal_each_clients_module(name, conv):
    models, x, y = models_and_data(name)
    net = StackedNet.compile(models[0], conv)
    assert net is not None
    params = stacked_params(models)
    out = net.forward(params, x)  # eval mode: dropout off
    grads = net.gradients(loss_fn(name), params, x, y, None, None)
    for i, m in enumerate(models):
        m.eval().zero_grad()
        ref = m(x[i])
        torch.testing.assert_close(out[i], ref, rtol=1e-5, atol=1e-5)
        loss_fn(name)(ref, y[i]).backward()
        for k, p in m.named_parameters():
            torch.testing.assert_close(grads[k][i], p.grad, rtol=1e-5, atol=1e-5)


def test_vgg11_compiles_to_stacked_layers():
    net = StackedNet.compile(build_model("vgg11", IMG, 10))
    assert net is not None and sum(1 for layer in net.layers if layer.params) == 9  # 8 convs + the classifier


def test_dropout_in_the_stacked_net():
    """cinic_cnn in train mode: the stacked net applies each client's mask (its key), as the module does."""
    model = build_model("cinic_cnn", (3, 8, 8), 10)
    net = StackedNet.compile(model)
    params = stacked_params([model] * 3)
    names = [n + ".key" for n, mod in model.named_modules() if isinstance(mod, KeyedDropout)]
    keys = {n: torch.tensor([11, 12, 11]) for n in names}
    x = torch.randn(3, 4, 3, 8, 8)
    out = net.forward(params, x, keys)
    for i in range(3):
        ref = functional_call(model.train(), {**{k: v[i] for k, v in params.items()},
                                              **{n: k[i] for n, k in keys.items()}}, (x[i],))
        torch.testing.assert_close(out[i], ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[0], out[1])
    drop = KeyedDropout(0.3, salt=4).train()
    acts = torch.ones(3, 5, 7)
    k = torch.tensor([1, 2, 3])
    stacked = drop.drop(acts, k)
    assert all(torch.equal(stacked[i], drop.drop(acts[i], k[i])) for i in range(3))  # bitwise, per client


@pytest.mark.parametrize("loss", [cross_entropy, multiclass_hinge, quadratic])
def test_closed_form_output_gradients_equal_autograd(loss):
    gen = torch.Generator().manual_seed(1)
    out = torch.randn(4, 6, 5, generator=gen, dtype=torch.float64)
    y = torch.randn(4, 6, 5, generator=gen, dtype=torch.float64) if loss is quadratic else \
        torch.randint(0, 5, (4, 6), generator=gen)
    w = torch.rand(4, 6, generator=gen, dtype=torch.float64)
    for weights in (None, w):
        leaf = out.clone().requires_grad_(True)
        value = loss(leaf, y) if weights is None else (loss.per_sample(leaf, y) * weights).sum(-1)
        expect, = torch.autograd.grad(value.sum(), leaf)
        torch.testing.assert_close(loss.output_grad(out.clone(), y, weights), expect)


def test_loss_keeps_leading_dims():
    logits, y = torch.randn(3, 7, 10), torch.randint(0, 10, (3, 7))
    for loss in (cross_entropy, multiclass_hinge):
        per_client = loss(logits, y)
        assert per_client.shape == (3,)
        torch.testing.assert_close(per_client[1], loss(logits[1], y[1]))


def _trainer(model: str, features: int, hidden: int = 200) -> tuple[Task, LocalTrainer]:
    cfg = config.from_dict(synthetic_config(task__model=model, task__hidden=hidden,
                                            task__synthetic={"samples": 1200, "test_samples": 100,
                                                             "features": features, "classes": 10}))
    task = build_task(cfg, CPU)
    return task, LocalTrainer(task, cfg.train, cfg.seed, path="batched")


def test_alone_equals_together_with_several_threads():
    """With 2 intra-op threads, MKL computes a lone client's (32 x 784) @ (784 x 200) product with
    other rounding than the same product inside a batch of 7; the engine's one-thread rule makes
    a client's result the same bits anyway (and the same as with 1 thread)."""
    task, tr = _trainer("mlp", 784)
    assert tr.net is not None
    ids = np.arange(7)
    x0 = tr.spec.flatten(task.model).expand(len(ids), -1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = tr.train(x0, ids, t=1)
        alone = tr.train(x0[:1], ids[:1], t=1)
        assert torch.get_num_threads() == 2  # restored
        torch.set_num_threads(1)
        one_thread = tr.train(x0, ids, t=1)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(alone[0], together[0])
    assert torch.equal(one_thread, together)


@pytest.mark.parametrize("model", ["svhn_cnn", "cinic_cnn"])
def test_conv_nets_batched_alone_equals_together(model):
    from helpers.images import image_trainer

    tr = image_trainer("batched")
    if model != "cinic_cnn":
        tr.task.model = build_model(model, (3, 8, 8), 10)
        tr = LocalTrainer(tr.task, tr.cfg, tr.seed, path="batched")
    assert tr.net is not None
    ids = np.array([0, 2, 3, 4])
    x0 = tr.spec.flatten(tr.task.model).expand(len(ids), -1)
    together = tr.train(x0, ids, t=1)
    assert (together - x0).abs().max() > 1e-3
    for k in range(len(ids)):
        assert torch.equal(tr.train(x0[k:k + 1], ids[k:k + 1], t=1)[0], together[k])


def test_plug_in_model_of_stacked_layers_trains_stacked():
    """A user's nn.Sequential of supported layers (other activations, nesting) compiles; one
    with an unsupported module falls back to vmap(grad), and both train to the same result."""
    task, _ = _trainer("logreg", 16)
    torch.manual_seed(0)
    plug = nn.Sequential(nn.Flatten(), nn.Sequential(nn.Linear(16, 12), nn.Tanh()), nn.Linear(12, 10))
    other = nn.Sequential(nn.Flatten(), nn.Sequential(nn.Linear(16, 12), nn.Tanh()), nn.Linear(12, 10),
                          nn.LayerNorm(10, elementwise_affine=False))  # no stacked rule
    assert StackedNet.compile(other) is None
    cfg = config.from_dict(synthetic_config()).train
    ids = np.arange(5)
    for module in (plug, other):
        task.model = module
        batched = LocalTrainer(task, cfg, 0, path="batched")
        seq = LocalTrainer(task, cfg, 0, path="sequential")
        assert (batched.net is not None) == (module is plug)
        x0 = batched.spec.flatten(module).expand(len(ids), -1)
        a, b = batched.train(x0, ids, t=0), seq.train(x0, ids, t=0)
        assert (a - x0).abs().max() > 1e-4
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_unused_or_shared_parameters_fall_back():
    lin = nn.Linear(4, 4)
    assert StackedNet.compile(nn.Sequential(lin, nn.ReLU(), lin)) is None  # one parameter used twice
    assert StackedNet.compile(nn.Sequential(nn.PReLU())) is None  # an activation with a parameter
    assert StackedNet.compile(nn.Sequential(nn.Conv2d(3, 4, 3, groups=1, padding_mode="circular"))) is None


def test_quadratic_model_is_stacked_and_exact():
    cfg = config.from_dict({"task": {"dataset": "quadratic", "model": "scalar", "clients": 3,
                                     "u": [[1.0, -2.0], [2.0, 0.5], [6.0, 3.0]]},
                            "train": {"local_steps": 3, "lr": 0.25, "batch_size": 4}})
    task = build_task(cfg, CPU)
    tr = LocalTrainer(task, cfg.train, 0)
    assert isinstance(task.model, ScalarModel) and tr.net is not None and tr.net.closed_form(task.loss)
    x = tr.train(torch.zeros(3, 2), np.arange(3), t=0)
    u = torch.tensor(cfg.task.u)
    torch.testing.assert_close(x, u * (1 - 0.75 ** 3))  # x <- x - 0.25 (x - u), three times


def test_only_the_quadratic_model_ignores_input_values():
    """``reads_inputs``: the trainer gathers no input rows for a model of the inputs' shape only
    (10^6 quadratic clients: 5% of a round); every other model reads them."""
    from fedmpi.models import build_model
    from fedmpi.models.nets import ScalarModel

    assert StackedNet.compile(ScalarModel(3, 0.0)).reads_inputs is False
    for name in ("logreg", "mlp", "cifar_cnn"):
        assert StackedNet.compile(build_model(name, (3, 8, 8) if name == "cifar_cnn" else (1, 6, 6), 4)).reads_inputs
