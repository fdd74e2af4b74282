"""SCAFFOLD (option II) on quadratics with heterogeneous curvature, against plain-float references.

F_i(x) = a_i (x - u_i)^2 / 2: with s > 1 local steps FedAvg's fixed point is
sum_i (1 - q_i) u_i / sum_i (1 - q_i), q_i = (1 - eta_l a_i)^s, not the optimum of the mean
objective sum_i a_i u_i / sum_i a_i (client drift); SCAFFOLD's correction removes that bias.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.curved import LR, SCRIPT, X0, A, M, S, U, curved_build
from helpers.quadratic import Scripted, quadratic_cfg, scalar

from fedmpi.build import build_components
from fedmpi.runtime import World


def ref_scaffold(script, s=S, lr=LR, eta_g=1.0) -> list[float]:
    x, c, ci, out = X0, 0.0, [0.0] * M, []
    for active in script:
        dx, dc = {}, {}
        for i in active:
            y = x
            for _ in range(s):
                y -= lr * (A[i] * (y - U[i]) + c - ci[i])
            dx[i] = y - x
            dc[i] = -c - dx[i] / (s * lr)  # option II: c_i^+ - c_i
        if active:
            x += eta_g * sum(dx.values()) / len(active)
        c += sum(dc.values()) / M
        for i in active:
            ci[i] += dc[i]
        out.append(x)
    return out


@pytest.mark.parametrize("eta_g", [1.0, 0.5])
def test_trajectory_matches_option_ii(eta_g):
    ref = ref_scaffold(SCRIPT, eta_g=eta_g)
    algo = curved_build("scaffold", part=Scripted(M, SCRIPT), eta_g=eta_g)
    got = []
    for t in range(len(SCRIPT)):
        algo.round(t)
        got.append(scalar(algo.x))
    assert got == pytest.approx(ref, rel=1e-5, abs=1e-5)


def test_server_control_is_the_mean_of_the_client_controls():
    """c = (1/N) sum_j c_j holds after every round (c_j = 0 for clients not seen yet)."""
    algo = curved_build("scaffold", part=Scripted(M, SCRIPT))
    for t in range(len(SCRIPT)):
        algo.round(t)
        assert torch.allclose(algo.c, algo.controls.rows.mean(0), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_removes_the_client_drift_of_fedavg():
    rounds = 300
    optimum = float(np.dot(A, U) / np.sum(A))
    q = [(1 - LR * a) ** S for a in A]
    biased = float(np.dot([1 - v for v in q], U) / np.sum([1 - v for v in q]))
    assert abs(biased - optimum) > 0.5  # the setting has drift to remove
    fedavg, scaffold = curved_build("fedavg_active"), curved_build("scaffold")
    for t in range(rounds):
        fedavg.round(t), scaffold.round(t)
    assert scalar(fedavg.x) == pytest.approx(biased, abs=1e-4)
    assert scalar(scaffold.x) == pytest.approx(optimum, abs=1e-4)


def test_empty_round_moves_nothing():
    algo = curved_build("scaffold", part=Scripted(M, SCRIPT))
    algo.round(0)
    before = {k: v.clone() for k, v in algo.state_dict().items()}
    algo.round(1)
    assert all(torch.equal(before[k], v) for k, v in algo.state_dict().items())


def test_state_dict_round_trip():
    a = curved_build("scaffold", part=Scripted(M, SCRIPT))
    for t in range(3):
        a.round(t)
    state = a.state_dict()
    assert state.clients["controls.rows"].shape == (M, 1) and set(state.shared) == {"x", "c"}
    b = curved_build("scaffold", part=Scripted(M, SCRIPT))
    b.load_state_dict(state)
    for t in range(3, len(SCRIPT)):
        a.round(t), b.round(t)
    assert torch.equal(a.x, b.x) and torch.equal(a.c, b.c)


@pytest.mark.parametrize("name", ["scaffold", "fedavg_active"])
def test_memory_of_the_client_controls_is_checked_up_front(name, tmp_path, monkeypatch):
    """With 10 bytes of memory (and local steps that need none), SCAFFOLD's 3 x 1 float32 controls
    (12 bytes) are refused before the first round, naming the key; FedAvg (no per-client state) starts."""
    from fedmpi import runner
    from fedmpi.errors import InputError

    monkeypatch.setattr(World, "free_memory", lambda self: (10, "host memory per rank"))
    monkeypatch.setattr(runner.guards, "step_bytes", lambda *args: 0)
    monkeypatch.setattr(runner.guards, "step_inputs_bytes", lambda *args: 0)
    cfg = quadratic_cfg(name, U, X0)
    cfg.rounds = 1
    if name == "fedavg_active":
        runner.Runner(cfg, World(), str(tmp_path / "r.h5"), quiet=True)
        return
    with pytest.raises(InputError, match=r"algorithm.name: scaffold keeps .* per-client state"):
        runner.Runner(cfg, World(), str(tmp_path / "r.h5"), quiet=True)



@pytest.mark.slow
@pytest.mark.parametrize("train", [{"local_steps_file": "steps.txt"}, {"momentum": 0.9},
                                   {"momentum": 0.9, "local_steps_file": "steps.txt"}],
                         ids=["steps_file", "momentum", "both"])
def test_control_variates_divide_by_the_local_work_done(train, tmp_path):
    """Option II divides each client's change by the local work it did: its own step count, and
    with momentum rho the sum of its buffer's weights (FedNova's ||a_i||_1). Issue #32's case: 6
    clients doing 1, 2, 5, 10, 20, 40 local steps (train.local_steps: 10) on F_i(x) = (x - u_i)^2 / 2,
    mean u_i = 50; dividing by the nominal s eta_l diverged to NaN, and so did momentum 0.9."""
    (tmp_path / "steps.txt").write_text("1 2 5 10 20 40\n")
    train = {k: str(tmp_path / v) if k == "local_steps_file" else v for k, v in train.items()}
    cfg = quadratic_cfg("scaffold", [0.0, 20.0, 40.0, 60.0, 80.0, 100.0], 0.0, lr=0.01, s=10, train=train)
    algo = build_components(cfg, World()).algorithm
    for t in range(200):
        algo.round(t)
    assert scalar(algo.x) == pytest.approx(50.0, abs=1e-3)
