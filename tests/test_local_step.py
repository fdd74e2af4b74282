"""Local optimizer options (train.momentum, train.weight_decay) and FedProx's proximal term:
against torch.optim.SGD on a real model, against plain-float loops on quadratics, independent
of batch-mates (what rank-count invariance rests on), and refused where they mean nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import synthetic_config
from helpers.quadratic import CPU, Scripted, scalar
from helpers.curved import LR, SCRIPT, X0, A, M, S, U, curved_build

from fedmpi import config
from fedmpi.build import build_task
from fedmpi.algorithms.fedprox import Proximal
from fedmpi.algorithms.scaffold import Correction
from fedmpi.engine.local import LocalTrainer
from fedmpi.errors import InputError

MOM, WD = 0.9, 0.1


def trainer(path: str, **train):
    cfg = config.from_dict(synthetic_config(**{f"train.{k}": v for k, v in train.items()}))
    task = build_task(cfg, CPU)
    return task, LocalTrainer(task, cfg.train, cfg.seed, path=path)


@pytest.mark.parametrize("path", ["batched", "sequential"])
@pytest.mark.parametrize("train", [{"momentum": MOM}, {"weight_decay": WD}, {"momentum": MOM, "weight_decay": WD},
                                   {"momentum": 0.5, "weight_decay": 0.01, "grad_clip": 0.2}])
def test_matches_torch_sgd_on_each_client(path, train):
    """Each client's end model = torch.optim.SGD(momentum, weight_decay) from a fresh optimizer
    over the same minibatches (grad_clip: clip_grad_norm_ before the step)."""
    task, tr = trainer(path, local_steps=4, lr=0.3, **train)
    ids = np.array([0, 2, 5, 7])
    x0 = tr.spec.flatten(task.model)
    got = tr.train(x0.expand(len(ids), -1), ids, t=3)
    model = task.model
    for k, i in enumerate(ids):
        torch.nn.utils.vector_to_parameters(x0.clone(), model.parameters())
        sgd = torch.optim.SGD(model.parameters(), lr=0.3, momentum=train.get("momentum", 0.0),
                              weight_decay=train.get("weight_decay", 0.0))
        for step in range(4):
            xb, yb, _ = tr.batch(ids[k:k + 1], 3, step)
            sgd.zero_grad()
            task.loss(model(task.inputs(xb[0])), yb[0]).backward()
            if "grad_clip" in train:
                torch.nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
            sgd.step()
        want = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        assert (want - x0).abs().max() > 1e-3
        assert torch.allclose(got[k], want, rtol=1e-5, atol=1e-6), (i, (got[k] - want).abs().max())


def test_options_off_are_plain_sgd_bit_for_bit():
    task, plain = trainer("batched")
    _, off = trainer("batched", momentum=0.0, weight_decay=0.0)
    _, on = trainer("batched", momentum=MOM)
    ids = np.arange(task.m)
    x0 = plain.spec.flatten(task.model).expand(task.m, -1)
    assert torch.equal(plain.train(x0, ids, 1), off.train(x0, ids, 1))
    assert not torch.equal(plain.train(x0, ids, 1), on.train(x0, ids, 1))


def test_client_results_do_not_depend_on_their_companions():
    task, tr = trainer("batched", momentum=MOM, weight_decay=WD)
    ids = np.array([0, 3, 4, 7, 11])
    x0 = tr.spec.flatten(task.model).expand(len(ids), -1)
    corr = torch.randn(len(ids), tr.spec.dim, generator=torch.Generator().manual_seed(0)) * 0.1
    together = tr.train(x0, ids, t=1, terms=(Proximal(0.5, x0), Correction(corr)))
    for k in range(len(ids)):
        one = slice(k, k + 1)
        alone = tr.train(x0[one], ids[one], t=1, terms=(Proximal(0.5, x0[one]), Correction(corr[one])))
        assert torch.equal(alone[0], together[k])


# ----------------------------------------------------------------------------- quadratic references

def ref_fedavg(momentum=0.0, wd=0.0, mu=0.0, rounds=None, script=SCRIPT) -> list[float]:
    """FedAvg over A_t; each client: d = a_i (y - u_i) + wd y + mu (y - x), buf = momentum buf + d
    (buf = 0 every round), y -= lr buf."""
    x, out = X0, []
    for active in (script if rounds is None else [list(range(M))] * rounds):
        deltas = []
        for i in active:
            y, buf = x, 0.0
            for _ in range(S):
                buf = momentum * buf + A[i] * (y - U[i]) + wd * y + mu * (y - x)
                y -= LR * buf
            deltas.append(y - x)
        if active:
            x += sum(deltas) / len(active)
        out.append(x)
    return out


@pytest.mark.parametrize("name, train, algo, ref", [
    ("fedavg_active", {"momentum": MOM}, {}, {"momentum": MOM}),
    ("fedavg_active", {"weight_decay": WD}, {}, {"wd": WD}),
    ("fedprox", {}, {"mu": 0.7}, {"mu": 0.7}),
    ("fedprox", {"momentum": 0.5, "weight_decay": WD}, {"mu": 0.7}, {"momentum": 0.5, "wd": WD, "mu": 0.7}),
])
def test_trajectory_matches_a_plain_loop(name, train, algo, ref):
    alg = curved_build(name, part=Scripted(M, SCRIPT), train=train, **algo)
    got = []
    for t in range(len(SCRIPT)):
        alg.round(t)
        got.append(scalar(alg.x))
    assert got == pytest.approx(ref_fedavg(**ref), rel=1e-5, abs=1e-5)


@pytest.mark.slow
def test_fedprox_fixed_point():
    """Full participation: FedProx converges to sum_i w_i u_i / sum_i w_i with
    w_i = (1 - r_i^s) a_i / (a_i + mu), r_i = 1 - lr (a_i + mu) -- where Delta_i(x) = 0 on average --
    which moves with mu (mu = 0: FedAvg's fixed point)."""
    def fixed_point(mu):
        w = [(1 - (1 - LR * (a + mu)) ** S) * a / (a + mu) for a in A]
        return float(np.dot(w, U) / np.sum(w))

    mu = 2.0
    algo = curved_build("fedprox", mu=mu)
    for t in range(300):
        algo.round(t)
    assert scalar(algo.x) == pytest.approx(fixed_point(mu), abs=1e-4)
    assert abs(fixed_point(mu) - fixed_point(0.0)) > 0.1


def test_fedprox_without_mu_is_fedavg_bit_for_bit():
    a, b = curved_build("fedprox", mu=0.0), curved_build("fedavg_active")
    for t in range(5):
        a.round(t), b.round(t)
        assert torch.equal(a.x, b.x)


# ----------------------------------------------------------------------------- config

@pytest.mark.parametrize("key, value", [("momentum", 1.0), ("momentum", -0.1), ("weight_decay", -1e-4)])
def test_ranges(key, value):
    with pytest.raises(InputError, match=rf"^train\.{key}: must be"):
        config.from_dict({"train": {key: value}})


def test_decentralized_refuses_momentum_but_takes_weight_decay():
    dec = {"algorithm": {"name": "dspodfl"}, "topology": {"kind": "ring"}}
    with pytest.raises(InputError, match=r"^train\.momentum: algorithm\.name dspodfl takes one local step"):
        config.from_dict({**dec, "train": {"momentum": 0.5}})
    assert config.from_dict({**dec, "train": {"weight_decay": 1e-3}}).train.weight_decay == 1e-3
