"""Per-client outputs of local training (``ClientOutputs``), heterogeneous local work, and the
algorithms built on them (qffl, fednova, fedexp, power_of_choice) against plain re-derivations
on the quadratic task F_i(x) = (x - u_i)^2 / 2 (exact gradients: tau steps of size eta_l from x
give Delta_i = (1 - (1 - eta_l)^tau)(u_i - x)). Rank-count invariance and resume of the four
algorithms: tests/test_matrix.py (tests/mpi_scripts/matrix.py lists them)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import synthetic_config
from fedmpi import config, rng
from fedmpi.build import build_task
from fedmpi.engine.local import LocalStats, LocalTrainer
from fedmpi.engine.reduce import client_sum, gather_clients
from fedmpi.errors import InputError
from fedmpi.runtime import World
from helpers.quadratic import Scripted, build, quadratic_cfg, scalar

CPU = torch.device("cpu")
U, X0, LR = [0.0, 8.0, -4.0], 2.0, 0.5
ROUNDS = 5
SEED = 1  # helpers.quadratic's


def delta(u: float, x: float, tau: int) -> float:
    return (1 - (1 - LR) ** tau) * (u - x)


def run(algo, rounds: int = ROUNDS) -> list[float]:
    got = []
    for t in range(rounds):
        algo.round(t)
        got.append(scalar(algo.x))
    return got


# ----------------------------------------------------------------------------- the outputs

def test_client_outputs_on_the_quadratic_task():
    quiet = build(quadratic_cfg("fedavg_active", U, X0, s=2), Scripted(3, [[0, 2]]))
    quiet.round(0)
    with pytest.raises(TypeError, match="declare client_outputs = True"):  # no gather for those that read none
        assert quiet.outputs is None  # raises first
    plain = build(quadratic_cfg("fednova", U, X0, s=2), Scripted(3, [[0, 2]]))  # declares client_outputs
    plain.round(0)
    assert np.isnan(plain.outputs.delta_sq).all()  # no delta_norms declared: no pass over the updates
    algo = build(quadratic_cfg("qffl", U, X0, s=2, q=0.0), Scripted(3, [[0, 2]]))  # declares delta_norms
    algo.round(0)
    out = algo.outputs
    assert np.array_equal(out.loss, plain.outputs.loss) and np.array_equal(out.steps, plain.outputs.steps)
    assert out.ids.tolist() == [0, 2] and out.steps.tolist() == [2, 2] and out.samples.tolist() == [1, 1]
    for j, i in enumerate([0, 2]):
        e = X0 - U[i]
        assert out.first_loss[j] == pytest.approx(e * e / 2, rel=1e-6)
        assert out.loss[j] == pytest.approx((e * e / 2 + (0.5 * e) ** 2 / 2) / 2, rel=1e-6)  # x_1 = u + e / 2
        assert out.delta_sq[j] == pytest.approx(delta(U[i], X0, 2) ** 2, rel=1e-6)
    assert out.at(np.array([2])).tolist() == [1]


def test_gather_and_sum_on_one_rank():
    ids = np.array([5, 1, 3])
    got = gather_clients(World(), ids, np.array([1, 3, 5]), np.array([[1.0], [3.0], [5.0]]))
    assert got[:, 0].tolist() == [5.0, 1.0, 3.0]  # in the order of ids
    v = np.array([1e16, 1.0, -1e16, 1.0])
    assert client_sum(v) == 2.0 == client_sum(v[::-1])  # correctly rounded: no order matters


# ----------------------------------------------------------------------------- heterogeneous local work

def trainer(**over):
    cfg = config.from_dict(synthetic_config(**over))
    task = build_task(cfg, CPU)
    return task, LocalTrainer(task, cfg.train, cfg.seed, path="batched")


@pytest.mark.parametrize("model", ["logreg", "mlp"])
def test_a_client_with_fewer_steps_is_the_same_bits_as_alone(model):
    """Batch-mates with more steps do not move a client that is done, nor change its losses."""
    task, tr = trainer(task__model=model, task__hidden=16)
    ids = np.array([0, 3, 4, 7])
    steps = np.array([1, 4, 2, 3])
    x0 = tr.spec.flatten(task.model).expand(len(ids), -1)
    stats = LocalStats()
    together = tr.train(x0, ids, t=1, steps=steps, stats=stats)
    assert stats.steps.tolist() == steps.tolist()
    for k in range(len(ids)):
        one = LocalStats()
        alone = tr.train(x0[k:k + 1], ids[k:k + 1], t=1, steps=int(steps[k]), stats=one)
        assert torch.equal(alone[0], together[k])
        assert one.loss[0] == stats.loss[k] and one.first_loss[0] == stats.first_loss[k]
        assert not torch.equal(alone[0], tr.train(x0[k:k + 1], ids[k:k + 1], t=1, steps=int(steps[k]) + 1)[0])


def test_losses_come_from_the_training_pass_on_every_path():
    task, tr = trainer()
    ids = np.array([1, 2])
    x0 = tr.spec.flatten(task.model).expand(2, -1)
    seen = {}
    for path in ("batched", "sequential"):
        tr.path, stats = path, LocalStats()
        tr.train(x0, ids, t=0, stats=stats)
        seen[path] = stats
    xb, yb, _ = tr.batch(ids, 0, 0)  # the first minibatch, at the start model
    first = task.loss(torch.func.functional_call(task.model, tr.spec.views(x0[0]), (task.inputs(xb[0]),)), yb[0])
    assert seen["batched"].first_loss[0] == pytest.approx(float(first), rel=1e-6)
    assert np.allclose(seen["batched"].loss, seen["sequential"].loss, rtol=1e-5)


def test_steps_of_epochs_and_uniform_draws():
    task, tr = trainer(train__local_epochs=2.0, train__batch_size=8)
    ids = np.arange(task.m)
    assert tr.steps_of(ids, 0).tolist() == [max(1, math.ceil(n * 2.0 / 8)) for n in task.sizes]
    task, tr = trainer(train__local_steps=6, train__local_steps_draw="uniform")
    draws = np.stack([tr.steps_of(ids, t) for t in range(5)])
    u = np.stack([rng.uniform(rng.key(3, "steps", t), ids) for t in range(5)])
    assert draws.tolist() == (np.floor(u * 6).astype(int) + 1).tolist()
    assert draws.min() >= 1 and draws.max() <= 6 and len(np.unique(draws)) > 2
    assert tr.steps_of(ids[3:5], 2).tolist() == draws[2, 3:5].tolist()  # per client, whoever else trains


# ----------------------------------------------------------------------------- the algorithms

def losses(x: float, i: int, tau: int) -> tuple[float, float]:
    """(first minibatch loss, mean loss over tau steps) of client i from x."""
    ls = [((1 - LR) ** k * (x - U[i])) ** 2 / 2 for k in range(tau)]
    return ls[0], sum(ls) / tau


@pytest.mark.parametrize("q", [0.0, 1.0, 2.5])
def test_qffl_matches_its_definition(q):
    x, ref, L = X0, [], 1 / LR
    for _ in range(ROUNDS):
        F = [losses(x, i, 2)[0] for i in range(3)]
        d = [delta(U[i], x, 2) for i in range(3)]
        h = [(q * F[i] ** (q - 1) * L ** 2 * d[i] ** 2 if q else 0.0) + L * F[i] ** q for i in range(3)]
        x = x + sum(L * F[i] ** q * d[i] for i in range(3)) / sum(h)
        ref.append(x)
    assert run(build(quadratic_cfg("qffl", U, X0, q=q))) == pytest.approx(ref, rel=1e-5, abs=1e-5)
    if q == 0.0:
        assert run(build(quadratic_cfg("fedavg_active", U, X0))) == pytest.approx(ref, rel=1e-5, abs=1e-5)


def test_fednova_with_per_client_steps_matches_its_definition():
    s = 5
    x, ref, taus = X0, [], []
    for t in range(ROUNDS):
        u = rng.uniform(rng.key(SEED, "steps", t), np.arange(3))
        tau = [min(int(u[i] * s) + 1, s) for i in range(3)]
        taus.append(tau)
        p = [1 / 3] * 3  # one sample each
        tau_eff = sum(p[i] * tau[i] for i in range(3))
        x = x + tau_eff * sum(p[i] * delta(U[i], x, tau[i]) / tau[i] for i in range(3))
        ref.append(x)
    assert any(len(set(tau)) > 1 for tau in taus)  # the test needs unequal work
    algo = build(quadratic_cfg("fednova", U, X0, s=s, train={"local_steps_draw": "uniform"}))
    assert run(algo) == pytest.approx(ref, rel=1e-5, abs=1e-5)
    assert algo.outputs.steps.tolist() == taus[-1]
    # FedAvg with the same unequal work drifts elsewhere: normalisation matters
    avg = []
    x = X0
    for tau in taus:
        x = x + sum(delta(U[i], x, tau[i]) for i in range(3)) / 3
        avg.append(x)
    assert abs(avg[-1] - ref[-1]) > 1e-3


@pytest.mark.parametrize("eps", [1e-3, 10.0])
def test_fedexp_matches_its_definition(eps):
    x, ref = X0, []
    for _ in range(ROUNDS):
        d = [delta(U[i], x, 2) for i in range(3)]
        mean = sum(d) / 3
        eta = max(1.0, sum(v * v for v in d) / (2 * 3 * (mean * mean + eps)))
        x = x + eta * mean
        ref.append(x)
    assert run(build(quadratic_cfg("fedexp", U, X0, fedexp_eps=eps))) == pytest.approx(ref, rel=1e-5, abs=1e-4)


def test_fedexp_refuses_a_server_step_size():
    with pytest.raises(InputError, match="algorithm.global_lr"):
        build(quadratic_cfg("fedexp", U, X0, eta_g=0.5))


def test_power_of_choice_matches_its_definition():
    K, d = 1, 2
    x, ref, ell, picks = X0, [], [math.inf] * 3, []
    for t in range(ROUNDS):
        u = rng.uniform(rng.key(SEED, "candidates", t), np.arange(3))
        cand = sorted(range(3), key=lambda i: (-u[i] ** 3, i))[:d]  # keys u^(1 / p_i), p_i = 1/3
        S = sorted(sorted(cand, key=lambda i: (-ell[i], i))[:K])
        picks.append(S)
        for i in S:
            ell[i] = losses(x, i, 2)[1]
        x = x + sum(delta(U[i], x, 2) for i in S) / len(S)
        ref.append(x)
    algo = build(quadratic_cfg("power_of_choice", U, X0, select=K, candidates=d))
    assert run(algo) == pytest.approx(ref, rel=1e-5, abs=1e-5)
    assert algo.active.tolist() == picks[-1] and len({tuple(p) for p in picks}) > 1
    assert [e if t else math.inf for e, t in zip(algo.ell, algo.tried)] == pytest.approx(ell, rel=1e-5)


def test_power_of_choice_refuses_fewer_candidates_than_it_selects():
    with pytest.raises(InputError, match="algorithm.candidates"):
        build(quadratic_cfg("power_of_choice", U, X0, select=3, candidates=2))


@pytest.mark.parametrize("name, algo", [("qffl", {"q": 2.0}), ("fednova", {}), ("fedexp", {}),
                                        ("power_of_choice", {"select": 1, "candidates": 2})])
def test_state_dict_round_trip(name, algo):
    a, b = build(quadratic_cfg(name, U, X0, **algo)), build(quadratic_cfg(name, U, X0, **algo))
    run(a, 3)
    b.load_state_dict(a.state_dict())
    for t in range(3, ROUNDS):
        a.round(t), b.round(t)
    assert torch.equal(a.x, b.x)


@pytest.mark.parametrize("name, why", [("fedexp", "reads every"), ("power_of_choice", "selects clients by their data")])
def test_fedexp_and_power_of_choice_are_refused_under_privacy(name, why):
    from fedmpi.algorithms.fedexp import FedExP
    from fedmpi.algorithms.power_of_choice import PowerOfChoice
    from fedmpi.errors import InputError
    from fedmpi.privacy.declaration import declaration

    with pytest.raises(InputError, match=why):
        declaration({"fedexp": FedExP, "power_of_choice": PowerOfChoice}[name], name)


# ----------------------------------------------------------------------------- lr schedules

def schedule(**train):
    from fedmpi.engine.local_step import TrainConfig, lr_at

    cfg = TrainConfig(lr=0.8, **train)
    return [lr_at(cfg, t) for t in range(8)]


def test_lr_schedules():
    assert schedule() == [0.8] * 8
    assert schedule(lr_schedule="inv_sqrt")[5] == 0.8 / math.sqrt(1.5)
    cos = schedule(lr_schedule="cosine", lr_period=4)
    assert cos == pytest.approx([0.8 * (1 + math.cos(math.pi * min(t, 4) / 4)) / 2 for t in range(8)])
    assert cos[4:] == [0.0] * 4
    assert schedule(lr_schedule="step", lr_period=3, lr_gamma=0.5) == pytest.approx([0.8] * 3 + [0.4] * 3 + [0.2] * 2)
    warm = schedule(lr_schedule="warmup_cosine", lr_period=8, lr_warmup=3)
    assert warm[:3] == pytest.approx([0.8 / 3, 1.6 / 3, 0.8]) and warm[3:] == schedule(lr_schedule="cosine",
                                                                                       lr_period=8)[3:]


def test_a_plugin_schedule_and_bad_schedule_keys():
    from fedmpi.engine.local_step import LR_SCHEDULES, lr_schedule

    @lr_schedule("halve_once")
    def halve_once(cfg, t):
        return cfg.lr if t < 2 else cfg.lr / 2

    try:
        assert schedule(lr_schedule="halve_once")[:3] == [0.8, 0.8, 0.4]
        assert schedule(lr_schedule="warmup_halve_once", lr_warmup=2)[:3] == [0.4, 0.8, 0.4]
    finally:
        del LR_SCHEDULES["halve_once"]
    for train, key in [({"lr_schedule": "linear"}, "train.lr_schedule"), ({"lr_schedule": "cosine"}, "train.lr_period"),
                       ({"lr_schedule": "warmup_constant"}, "train.lr_warmup")]:
        with pytest.raises(InputError, match=key):
            quadratic_cfg("fedavg_active", U, X0, train=train)


def test_the_schedule_drives_local_training():
    """Round t's steps use lr_at(t): the quadratic task's Delta_i shows the step size."""
    algo = build(quadratic_cfg("fedavg_active", [4.0], 0.0, s=1, lr=0.5,
                               train={"lr_schedule": "step", "lr_period": 1, "lr_gamma": 0.5}))
    x = 0.0
    for t in range(3):
        algo.round(t)
        x = x + 0.5 * 0.5 ** t * (4.0 - x)
        assert scalar(algo.x) == pytest.approx(x, rel=1e-6)


def test_steps_from_a_file_and_its_errors(tmp_path):
    path = tmp_path / "steps.txt"
    path.write_text("1 2 3\n4 5 6\n7 8 9 10 11 12\n")
    task, tr = trainer(train__local_steps_file=str(path))
    assert tr.steps_of(np.array([0, 5, 11]), 3).tolist() == [1, 6, 12]
    path.write_text("3 1 2")
    algo = build(quadratic_cfg("fednova", U, X0, train={"local_steps_file": str(path)}))
    algo.round(0)
    assert algo.outputs.steps.tolist() == [3, 1, 2]
    for text, needle in [("1 2", "one integer >= 1 per client"), ("1 0 2", "one integer"), ("a b c", "integers")]:
        path.write_text(text)
        with pytest.raises(InputError, match=f"train.local_steps_file: .*{needle}"):
            build(quadratic_cfg("fedavg_active", U, X0, train={"local_steps_file": str(path)}))
    with pytest.raises(InputError, match="train.local_steps_file"):
        build(quadratic_cfg("fedavg_active", U, X0, train={"local_steps_file": str(tmp_path / "none.txt")}))
    with pytest.raises(InputError, match="train.local_steps_file"):
        quadratic_cfg("fedavg_active", U, X0, train={"local_steps_file": str(path), "local_epochs": 1.0})


@pytest.mark.slow
@pytest.mark.parametrize("name, algo", [("qffl", {"q": 1.0}), ("fednova", {}), ("fedexp", {}),
                                        ("power_of_choice", {"select": 2, "candidates": 3})])
def test_checkpoint_resume_gives_the_same_run(name, algo, tmp_path):
    """Through the runner: fail at round 5, resume from the round-4 checkpoint, finish as if uninterrupted."""
    from conftest import assert_resume_identical

    cfg = quadratic_cfg(name, [[0.0, 1.0], [8.0, -2.0], [-4.0, 3.0], [1.0, 1.0], [2.0, -6.0]], s=4,
                        availability={"kind": "stationary", "base": {"kind": "fixed", "values": [0.7]}},
                        train={"local_steps_draw": "uniform"}, **algo)
    cfg.rounds, cfg.eval_every, cfg.runtime.checkpoint_every = 8, 2, 2
    assert_resume_identical(cfg, tmp_path)


def test_fednova_weights_with_local_momentum():
    """a_i = (tau_i - rho (1 - rho^tau_i) / (1 - rho)) / (1 - rho), tau_eff = sum p_i a_i."""
    from fedmpi.algorithms import ClientOutputs

    rho = 0.5
    algo = build(quadratic_cfg("fednova", U, X0, train={"momentum": rho}))
    tau, n = np.array([1.0, 3.0, 4.0]), np.array([1.0, 2.0, 5.0])
    algo.outputs = ClientOutputs(np.arange(3), *[np.zeros(3)] * 2, tau, np.zeros(3), n)
    a = (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho)
    p = n / n.sum()
    assert a[0] == pytest.approx(1.0) and a[2] > 2 * a[0]  # a momentum step moves more than a plain one
    assert algo.weights(0, np.arange(3), np.array([2, 0])) == pytest.approx((p @ a) * p[[2, 0]] / a[[2, 0]])
