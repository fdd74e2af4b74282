"""Model zoo: parameter counts, deterministic init, and vmap(grad) == per-client loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from fedmpi.errors import InputError
from fedmpi.models import MLPParams, build_model, count_params, loss_fn
from fedmpi.models.nets import ARCHS
from fedmpi.models.dropout import KeyedDropout
from helpers.images import image_trainer

IMG = (3, 32, 32)


@pytest.mark.parametrize("name,count", [("svhn_cnn", 273_706), ("cifar_cnn", 551_786), ("cinic_cnn", 1_193_130),
                                        ("logreg", 3072 * 10 + 10), ("linear_svm", 3072 * 10 + 10),
                                        ("mlp", 3072 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10)])
def test_parameter_counts(name, count):
    assert count_params(build_model(name, IMG, 10)) == count


def test_vgg11_shape_and_inputs():
    model = build_model("vgg11", IMG, 10)
    assert model(torch.zeros(2, *IMG)).shape == (2, 10)
    assert count_params(model) == 9_225_610  # conv features + Linear(512, 10), no batch norm
    with pytest.raises(InputError, match=r"^task\.model: vgg11 needs images of at least 32x32"):
        build_model("vgg11", (1, 28, 28), 10)
    with pytest.raises(InputError, match=r"^task\.model: unknown model"):
        build_model("resnet", IMG, 10)


def test_fmnist_shapes():
    x = torch.rand(3, 1, 28, 28)
    for name in ("logreg", "linear_svm", "mlp", "svhn_cnn", "cifar_cnn", "cinic_cnn"):
        assert build_model(name, (1, 28, 28), 10, params=MLPParams(hidden=16))(x).shape == (3, 10)


def test_init_deterministic_without_global_rng():
    state = torch.get_rng_state()
    a, b, c = (build_model("cifar_cnn", IMG, 10, seed=s) for s in (5, 5, 6))
    assert torch.equal(state, torch.get_rng_state())
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb)
        if name.endswith("weight"):
            assert not torch.equal(pa, pc)
    assert len(list(a.buffers())) == 0
    w = a.conv2.weight  # Kaiming normal: std sqrt(2 / fan_in)
    assert abs(w.std().item() / (2 / (32 * 9)) ** 0.5 - 1) < 0.05
    assert torch.all(a.conv2.bias == 0)


def test_meta_built_models_get_real_memory_and_keep_ties():
    """``init: fedmpi`` builds on the meta device and then gives every tensor CPU memory
    (``_materialise``, in place of ``to_empty``): nothing stays on meta, a tensor shared by two
    modules stays one tensor, and requires_grad is kept."""
    from fedmpi.models import _materialise

    with torch.device("meta"):
        a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        b.weight = a.weight  # tied
        a.bias.requires_grad_(False)
        model = torch.nn.Sequential(a, b)
        model.register_buffer("scale", torch.ones(3), persistent=False)
    _materialise(model)
    assert all(t.device.type == "cpu" for t in (*model.parameters(), *model.buffers()))
    assert model[0].weight is model[1].weight and isinstance(model[1].weight, torch.nn.Parameter)
    assert len(list(model.parameters())) == 3 and not model[0].bias.requires_grad
    assert "scale" not in model.state_dict()  # still non-persistent


@pytest.mark.slow
def test_a_run_imports_no_sympy(tmp_path):
    """torch imports sympy for ``to_empty`` and for meta-device matmuls: 0.3 s, which fell inside a
    run's first timed round once model building stopped paying it (benchmarks/RESULTS.md). A whole
    run (an MLP, batched: the trainer counts its activations) stays clear of it."""
    import os
    import subprocess
    import sys

    import yaml

    from conftest import ROOT, synthetic_config

    cfg = synthetic_config(rounds=2, task__model="mlp", task__hidden=16)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code = ("import sys; from fedmpi.cli import main; "
            f"code = main(['run', {str(path)!r}, '--out', {str(tmp_path / 'r.h5')!r}, '--quiet']); "
            "print(code, 'sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=ROOT)).stdout
    assert out.split() == ["0", "False"], out


def test_hinge_matches_multi_margin_loss():
    logits, y = torch.randn(7, 10), torch.randint(0, 10, (7,))
    torch.testing.assert_close(loss_fn("linear_svm")(logits, y), F.multi_margin_loss(logits, y))
    torch.testing.assert_close(loss_fn("mlp")(logits, y), F.cross_entropy(logits, y))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "vgg11" else n for n in ARCHS])
def test_vmapped_grad_equals_loop(name):
    n, b = 2, 2
    small = MLPParams(hidden=32)
    models = [build_model(name, IMG, 10, seed=s, params=small).eval() for s in range(n)]  # eval: dropout off
    stacked = {k: torch.stack([dict(m.named_parameters())[k].detach() for m in models])
               for k, _ in models[0].named_parameters()}
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, b, *IMG, generator=gen), torch.randint(0, 10, (n, b), generator=gen)
    loss = loss_fn(name)
    base = models[0]

    def client_loss(params, xb, yb):
        return loss(functional_call(base, params, (xb,)), yb)

    batched = vmap(grad(client_loss), randomness="different")(stacked, x, y)
    for i, m in enumerate(models):
        m.zero_grad()
        loss(m(x[i]), y[i]).backward()
        for k, p in m.named_parameters():
            torch.testing.assert_close(batched[k][i], p.grad, rtol=1e-5, atol=1e-5)


def test_dropout_masks_are_a_function_of_the_key():
    """KeyedDropout: same key, same mask (batched or alone); other key, other mask; eval: identity."""
    drop = KeyedDropout(0.25, salt=1).train()
    x = torch.ones(3, 40, 500)
    keys = torch.tensor([5, 6, 5])
    batched = vmap(lambda k, xb: functional_call(drop, {"key": k}, (xb,)))(keys, x)
    alone = torch.stack([functional_call(drop, {"key": k}, (xb,)) for k, xb in zip(keys, x)])
    assert torch.equal(batched, alone)
    assert torch.equal(batched[0], batched[2]) and not torch.equal(batched[0], batched[1])
    assert torch.equal(batched.unique(), torch.tensor([0.0, 1 / 0.75]))
    assert abs(float((batched == 0).float().mean()) - 0.25) < 0.01
    other_layer = functional_call(KeyedDropout(0.25, salt=2).train(), {"key": keys[0]}, (x[0],))
    assert not torch.equal(other_layer, batched[0])
    assert torch.equal(drop.eval()(x), x)


def test_cinic_cnn_dropout_under_vmap_follows_the_keys():
    model = build_model("cinic_cnn", IMG, 10).train()
    params = {k: torch.stack([p.detach()] * 3) for k, p in model.named_parameters()}
    keys = {n + ".key": torch.tensor([1, 2, 1]) for n, mod in model.named_modules() if isinstance(mod, KeyedDropout)}
    assert len(keys) == 3 and not any(k.endswith(".key") for k in model.state_dict())
    x = torch.randn(1, 4, *IMG).expand(3, 4, *IMG)
    out = vmap(lambda p, k, xb: functional_call(model, {**p, **k}, (xb,)))(params, keys, x)
    assert out.shape == (3, 4, 10) and not torch.equal(out[0], out[1])  # independent masks
    torch.testing.assert_close(out[0], out[2], rtol=0, atol=1e-6)  # same key, same mask


def test_pfl_cnn_is_pfl_researchs_simple_cnn():
    """apple/pfl-research publications/pfl/compare_utils/pytorch.py: Conv(32, 3x3) ReLU Conv(64, 3x3) ReLU
    MaxPool(2) Dropout(0.25) Flatten Linear(128) ReLU Dropout(0.5) Linear(10), unpadded convolutions,
    Glorot-uniform weights; dropout off, it computes what that nn.Sequential computes."""
    state = torch.get_rng_state()
    model, same, other = (build_model("pfl_cnn", IMG, 10, seed=s) for s in (5, 5, 6))
    assert torch.equal(state, torch.get_rng_state())
    shapes = {k: tuple(p.shape) for k, p in model.named_parameters() if k.endswith("weight")}
    assert shapes == {"conv1.weight": (32, 3, 3, 3), "conv2.weight": (64, 32, 3, 3), "fc1.weight": (128, 12544),
                      "out.weight": (10, 128)}
    assert count_params(model) == 1_626_442 and len(list(model.buffers())) == 2  # the dropout keys (not saved)
    for (name, p), q, r in zip(model.named_parameters(), same.parameters(), other.parameters()):
        assert torch.equal(p, q) and not torch.equal(p, r)
        if name.endswith("weight"):  # Glorot uniform: U(+-sqrt(6 / (fan_in + fan_out)))
            fan_in, fan_out = p[0].numel(), p.shape[0] * p[0, 0].numel()
            bound = (6 / (fan_in + fan_out)) ** 0.5
            assert p.abs().max() <= bound and abs(p.std().item() / (bound / 3 ** 0.5) - 1) < 0.05
    plain = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3),
                                torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Dropout(0.25), torch.nn.Flatten(),
                                torch.nn.Linear(12544, 128), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(128, 10)).eval()
    with torch.no_grad():
        for p, q in zip(plain.parameters(), model.parameters()):
            p.copy_(q)
        x = torch.randn(4, *IMG)
        torch.testing.assert_close(plain(x), model.eval()(x))
    with pytest.raises(InputError, match=r"^task\.model: pfl_cnn needs images"):
        build_model("pfl_cnn", (3, 4, 4), 10)


def test_pfl_cnn_trains_the_same_batched_and_sequential():
    """Stacked layers (unpadded convolutions, dropout on feature maps) against the per-client loop."""
    seq = image_trainer("sequential", model="pfl_cnn")
    ids = np.array([0, 2, 3])
    x0 = seq.spec.flatten(seq.task.model).expand(len(ids), -1)
    together = seq.train(x0, ids, t=1)
    assert (together - x0).abs().max() > 1e-3
    torch.testing.assert_close(image_trainer("batched", model="pfl_cnn").train(x0, ids, t=1), together,
                               rtol=0, atol=1e-5)
