"""The batched client engine, its stores and the reproducible reduction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import synthetic_config
from helpers.images import image_trainer

from fedmpi import config
from fedmpi.build import build_task
from fedmpi.engine.evaluate import evaluate
from fedmpi.algorithms.fedprox import Proximal
from fedmpi.algorithms.scaffold import Correction
from fedmpi.engine.local import LocalTrainer, choose_path, lr_at
from fedmpi.engine.reduce import preround
from fedmpi.engine.store import ClientTable, VersionStore

CPU = torch.device("cpu")


def trainer(**over):
    cfg = config.from_dict(synthetic_config(**over))
    task = build_task(cfg, CPU)
    return cfg, task, LocalTrainer(task, cfg.train, cfg.seed, path="batched")


@pytest.mark.parametrize("model", ["logreg", "mlp", "linear_svm"])
def test_batched_equals_sequential(model):
    _, task, tr = trainer(task__model=model, task__hidden=16)
    clients = np.arange(task.m)
    x0 = tr.spec.flatten(task.model).expand(task.m, -1)
    a = tr.train(x0, clients, t=2)
    tr.path = "sequential"
    b = tr.train(x0, clients, t=2)
    assert (a - x0).abs().max() > 1e-4  # it trained
    assert torch.allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("model", ["logreg", "mlp", "linear_svm"])
def test_client_results_do_not_depend_on_their_companions(model):
    """What makes results independent of the number of ranks: a client's end model is the
    same bits whether it trains alone, in a block, or in another order."""
    _, task, tr = trainer(task__model=model, task__hidden=32,
                          task__synthetic={"samples": 1200, "test_samples": 100, "features": 64, "classes": 4})
    ids = np.array([0, 3, 4, 7, 11])
    x0 = tr.spec.flatten(task.model).expand(len(ids), -1)
    together = tr.train(x0, ids, t=1)
    for k in range(len(ids)):
        alone = tr.train(x0[k:k + 1], ids[k:k + 1], t=1)
        assert torch.equal(alone[0], together[k])


@pytest.mark.parametrize("model,stacked", [("logreg", True), ("mlp", True), ("mlp", False)])
def test_fixed_shape_blocks_change_no_bit(monkeypatch, model, stacked):
    """CUDA pads every batched block to chunk_size rows (engine.shapes); on CPU, where kernels
    do not depend on the batch count, the padded path must give exactly today's bits, for
    every per-client input: start rows, ids, lr_scale, FedProx's anchor, SCAFFOLD's correction."""
    cfg, task, _ = trainer(task__model=model, task__hidden=16)
    plain = LocalTrainer(task, cfg.train, cfg.seed, path="batched", stacked=stacked)
    padded = LocalTrainer(task, cfg.train, cfg.seed, path="batched", stacked=stacked, fixed_shape=True)
    for tr in (plain, padded):
        monkeypatch.setattr(tr, "chunk_size", lambda: 4)  # 7 clients: a full block and one of 3 padded to 4
    seen = []
    block = padded._train_block
    monkeypatch.setattr(padded, "_train_block", lambda x, ids, *a: (seen.append(len(ids)), block(x, ids, *a))[1])
    ids = np.array([5, 0, 3, 9, 2, 7, 11])
    g = torch.Generator().manual_seed(1)
    x0 = plain.spec.flatten(task.model).expand(len(ids), -1) + 0.01 * torch.randn(len(ids), plain.spec.dim, generator=g)
    scale = torch.linspace(0.5, 1.5, len(ids))
    corr = 0.01 * torch.randn(len(ids), plain.spec.dim, generator=g)
    a = plain.train(x0, ids, t=3, lr_scale=scale, terms=(Proximal(0.1, x0), Correction(corr)))
    b = padded.train(x0, ids, t=3, lr_scale=scale, terms=(Proximal(0.1, x0), Correction(corr)))
    assert seen == [4, 4]
    assert (a - x0).abs().max() > 1e-4 and torch.equal(a, b)


def test_cuda_blocks_are_capped_by_the_run_and_the_same_on_every_rank():
    """chunk_size on CUDA: every block is padded to it, so it is a function of the model, data
    and config only, at most 256 clients, and never more than the run's m (no padding beyond)."""
    cfg, task, tr = trainer()
    tr.device = torch.device("cuda")  # the rule only; nothing runs on a GPU here
    assert tr.chunk_size() == task.m == 12
    _, big, tr2 = trainer(task__clients=600)
    tr2.device = torch.device("cuda")
    assert tr2.chunk_size() == 256 and big.m == 600


def test_pad_rows():
    from fedmpi.engine.shapes import pad_rows

    t = torch.arange(6.0).view(3, 2)
    assert torch.equal(pad_rows(t, 2), torch.tensor([[0.0, 1], [2, 3], [4, 5], [4, 5], [4, 5]]))
    assert pad_rows(t, 0) is t and pad_rows(None, 3) is None
    assert pad_rows(np.array([1, 2]), 2).tolist() == [1, 2, 2, 2]


def test_train_in_place_is_train(monkeypatch):
    _, task, tr = trainer()
    ids = np.array([1, 2, 5, 6, 7, 9, 11])
    x0 = tr.spec.flatten(task.model).expand(len(ids), -1).contiguous()
    expected = tr.train(x0, ids, t=3, steps=2)
    monkeypatch.setattr(tr, "chunk_size", lambda: 3)  # blocks of 3, 3, 1: views into x
    x = x0.clone()
    assert tr.train_(x, ids, t=3, steps=2) is x
    assert torch.equal(x, expected) and not torch.equal(x, x0)


def test_dropout_masks_follow_the_client_not_its_companions():
    seq = image_trainer("sequential")
    ids = np.array([0, 2, 3, 4])
    x0 = seq.spec.flatten(seq.task.model).expand(len(ids), -1)
    together = seq.train(x0, ids, t=1)
    for k in range(len(ids)):  # the sequential path: bitwise, alone or with others
        assert torch.equal(seq.train(x0[k:k + 1], ids[k:k + 1], t=1)[0], together[k])
    batched = image_trainer("batched").train(x0, ids, t=1)  # other conv kernels, the same masks
    assert (together - x0).abs().max() > 0.1
    torch.testing.assert_close(batched, together, rtol=0, atol=1e-5)
    assert not torch.allclose(image_trainer("sequential", seed=1).train(x0, ids, t=1), together, atol=1e-3)
    with pytest.raises(ValueError, match="pass keys"):
        xb, yb, wb = seq.batch(ids, 1, 0)
        seq.param_gradients(x0, xb, yb, wb)


def test_minibatches_come_from_the_client_only():
    _, task, tr = trainer()
    xb, yb, _ = tr.batch(np.array([2, 5]), t=0, step=0)
    for row, c in zip(xb, (2, 5)):
        own = task.train_x[task.order[task.offsets[c]:task.offsets[c + 1]]]
        assert all(any(torch.equal(s, o) for o in own) for s in row)


def test_quadratic_full_gradient_is_exact():
    cfg = config.from_dict({"task": {"dataset": "quadratic", "model": "scalar", "clients": 3, "u": [1.0, 2.0, 6.0]},
                            "train": {"local_steps": 2, "lr": 0.25, "full_gradient": True}})
    task = build_task(cfg, CPU)
    tr = LocalTrainer(task, cfg.train, 0)
    x = tr.train(torch.zeros(3, 1), np.arange(3), t=0)
    u = torch.tensor([[1.0], [2.0], [6.0]])
    expect = u - (u - 0.0) * 0.75 ** 2  # x <- x - 0.25 (x - u), twice
    assert torch.allclose(x, expect)


def test_grad_clip_and_lr_scale():
    cfg = config.from_dict({"task": {"dataset": "quadratic", "model": "scalar", "clients": 2, "u": [100.0, -1.0]},
                            "train": {"local_steps": 1, "lr": 1.0, "grad_clip": 2.0}})
    task = build_task(cfg, CPU)
    tr = LocalTrainer(task, cfg.train, 0)
    x = tr.train(torch.zeros(2, 1), np.arange(2), t=0, lr_scale=torch.tensor([1.0, 0.5]))
    assert torch.allclose(x[:, 0], torch.tensor([2.0, -0.5]))


def test_lr_schedule():
    cfg = config.from_dict({"train": {"lr": 0.1, "lr_schedule": "inv_sqrt"}}).train
    assert lr_at(cfg, 0) == pytest.approx(0.1) and lr_at(cfg, 30) == pytest.approx(0.1 / 2)


def test_auto_path_rule():
    from fedmpi.models import build_model

    assert choose_path("auto", build_model("logreg", (1, 8, 8), 10), CPU) == "batched"
    assert choose_path("auto", build_model("svhn_cnn", (3, 8, 8), 10), CPU) == "batched"  # stacked conv layers
    other_conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding="same"), torch.nn.Flatten())  # no stacked rule
    assert choose_path("auto", other_conv, CPU) == "sequential"
    assert choose_path("sequential", build_model("logreg", (1, 8, 8), 10), CPU) == "sequential"


def test_evaluate_many_models_equals_one_by_one():
    _, task, tr = trainer()
    models = tr.train(tr.spec.flatten(task.model).expand(4, -1), np.arange(4), t=0)
    loss, acc = evaluate(task, tr.spec, models, task.test_x, task.test_y, batch_size=64)
    for i in range(4):
        l1, a1 = evaluate(task, tr.spec, models[i], task.test_x, task.test_y, batch_size=64)
        assert torch.allclose(loss[i], l1[0]) and acc[i] == a1[0]
    # accuracy agrees with a plain forward pass
    with torch.no_grad():
        out = torch.func.functional_call(task.model, tr.spec.views(models[0]), (task.test_x,))
    assert acc[0].item() == pytest.approx((out.argmax(1) == task.test_y).float().mean().item())


def test_preround_sum_is_order_independent():
    g = torch.Generator().manual_seed(0)
    rows = (torch.randn(64, 500, generator=g) * torch.logspace(-12, 2, 500)).double() / 3
    biggest = rows.abs().amax(0)
    r = preround(rows, biggest, 64)
    ref = r.sum(0)
    for seed in range(5):
        perm = torch.randperm(64, generator=torch.Generator().manual_seed(seed))
        split = 1 + seed * 11
        parts = r[perm[:split]].sum(0) + r[perm[split:]].sum(0)
        assert torch.equal(parts, ref)
    rel = ((ref - rows.sum(0)).abs() / biggest).max().item()
    k = 7  # ceil(log2 64) + 1
    assert rel <= 64 * 2.0 ** (k - 52)  # n terms, each off by at most ulp(sigma) / 2


def test_version_store_shares_versions():
    s = VersionStore(10, 20, torch.zeros(3))
    s.assign(np.array([10, 11, 12]), torch.ones(3))
    s.assign(np.array([12, 13]), torch.full((3,), 2.0))
    assert len(s.versions) == 3  # x0, ones, twos
    got = s.gather(np.array([10, 12, 19]))
    assert torch.equal(got, torch.tensor([[1.0] * 3, [2.0] * 3, [0.0] * 3]))
    s.assign(np.arange(10, 20), torch.full((3,), 5.0))
    assert len(s.versions) == 1 and torch.equal(s.gather(np.array([15])), torch.full((1, 3), 5.0))


def test_client_table():
    tab = ClientTable(4, 8, 2, CPU)
    tab.set(np.array([5, 7]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert torch.equal(tab.get(np.array([7, 4])), torch.tensor([[3.0, 4.0], [0.0, 0.0]]))
    assert math.isclose(float(tab.rows.sum()), 10.0)


@pytest.mark.parametrize("permuted", [False, True])
@pytest.mark.parametrize("steps, batch", [(1, 1), (3, 2)])
def test_one_sample_clients_skip_the_draw_and_keep_its_rows(permuted, steps, batch):
    """Clients that hold one sample each (the quadratic task) take it at every draw: the
    shortcut gives the rows the keyed draw gives, whatever the order of the samples."""
    cfg = config.from_dict({"seed": 4, "task": {"dataset": "quadratic", "model": "scalar", "clients": 50,
                                                "u": [float(i) for i in range(50)]},
                            "train": {"local_steps": steps, "batch_size": batch, "lr": 0.1}})
    task = build_task(cfg, torch.device("cpu"))
    if permuted:
        task.order = torch.as_tensor(np.random.default_rng(0).permutation(50))
    fast = LocalTrainer(task, cfg.train, cfg.seed)
    slow = LocalTrainer(task, cfg.train, cfg.seed)
    slow._one_sample = False
    assert fast._one_sample and (fast._only is None) != permuted
    clients = np.array([0, 3, 7, 20, 49])
    for t in range(3):
        assert torch.equal(fast.sample_ids(clients, t, steps), slow.sample_ids(clients, t, steps))
