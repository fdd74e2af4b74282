"""Server optimizers (fedavgm, fedadam, fedyogi, fedadagrad): one step on known pseudo-gradients
against per-coordinate plain-float formulas (Reddi et al. 2021, Algorithm 2; Hsu et al. 2019), and
whole trajectories on the quadratic task with the scripted participation of test_baselines
(an empty round included), against plain-float references."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.baselines import SCRIPT, X0, M, U, delta
from helpers.quadratic import Scripted, build, quadratic_cfg, scalar

B1, B2, TAU = 0.8, 0.7, 0.05  # not the defaults, so a default silently used instead would fail
PARAMS = {"fedavgm": {"server_momentum": 0.6},
          "fedadagrad": {"beta1": B1, "tau": TAU},
          "fedyogi": {"beta1": B1, "beta2": B2, "tau": TAU},
          "fedadam": {"beta1": B1, "beta2": B2, "tau": TAU}}


# ----------------------------------------------------------------------------- references

def ref_optimizer(name: str):
    """A plain-float server optimizer for one coordinate: returns step(delta) -> direction."""
    state = {"m": 0.0, "v": 0.0 if name == "fedavgm" else TAU ** 2}

    def step(d: float) -> float:
        if name == "fedavgm":
            state["v"] = 0.6 * state["v"] + d
            return state["v"]
        state["m"] = B1 * state["m"] + (1 - B1) * d
        v = state["v"]
        if name == "fedadagrad":
            v = v + d * d
        elif name == "fedyogi":
            sign = (v > d * d) - (v < d * d)
            v = v - (1 - B2) * d * d * sign
        else:
            v = B2 * v + (1 - B2) * d * d
        state["v"] = v
        return state["m"] / (math.sqrt(v) + TAU)

    return step


def ref_trajectory(name: str, eta_g: float) -> list[float]:
    """FedAvg's mean Delta over A_t as the pseudo-gradient; an empty round takes no step."""
    step, x, out = ref_optimizer(name), X0, []
    for A in SCRIPT:
        if A:
            x = x + eta_g * step(sum(delta(i, x) for i in A) / len(A))
        out.append(x)
    return out


def make(name: str, eta_g: float = 1.0, u=U):
    return build(quadratic_cfg(name, u, X0, eta_g=eta_g, **PARAMS[name]), Scripted(len(u), SCRIPT))


# ----------------------------------------------------------------------------- tests

# pseudo-gradients per round (3 coordinates): signs change, some coordinates stay 0, some
# squares jump above and fall below v (Yogi's sign), one is large
DELTAS = [[0.5, -0.2, 0.0], [0.1, -0.9, 0.0], [-0.3, 0.05, 2.0], [0.0, 0.4, -0.01], [0.7, 0.7, 0.7]]


@pytest.mark.parametrize("name", list(PARAMS))
def test_step_on_known_pseudo_gradients(name):
    algo = make(name, u=[[0.0] * 3] * M)
    refs = [ref_optimizer(name) for _ in range(3)]
    for d in DELTAS:
        got = algo.step(torch.tensor(d, dtype=torch.float64))
        want = [refs[j](d[j]) for j in range(3)]
        assert got.tolist() == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_yogi_sign_differs_from_adam():
    """The same pseudo-gradients give other second moments: Yogi moves v additively toward Delta^2."""
    yogi, adam = make("fedyogi", u=[[0.0] * 3] * M), make("fedadam", u=[[0.0] * 3] * M)
    for d in DELTAS:
        yogi.step(torch.tensor(d, dtype=torch.float64)), adam.step(torch.tensor(d, dtype=torch.float64))
    assert not torch.allclose(yogi.v, adam.v)


@pytest.mark.parametrize("eta_g", [1.0, 0.1])
@pytest.mark.parametrize("name", list(PARAMS))
def test_trajectory_matches_definition(name, eta_g):
    ref = ref_trajectory(name, eta_g)
    algo = make(name, eta_g)
    got = []
    for t in range(len(SCRIPT)):
        algo.round(t)
        got.append(scalar(algo.x))
    assert got == pytest.approx(ref, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("name", list(PARAMS))
def test_empty_round_takes_no_step_and_keeps_the_state(name):
    algo = make(name)
    algo.round(0)
    before = {k: v.clone() for k, v in algo.state_dict().items()}
    algo.round(1)  # SCRIPT[1] is empty
    assert all(torch.equal(before[k], v) for k, v in algo.state_dict().items())


def test_fedavgm_without_momentum_is_fedavg_bit_for_bit():
    a = build(quadratic_cfg("fedavgm", U, X0, eta_g=0.7, server_momentum=0.0), Scripted(M, SCRIPT))
    b = build(quadratic_cfg("fedavg_active", U, X0, eta_g=0.7), Scripted(M, SCRIPT))
    for t in range(len(SCRIPT)):
        a.round(t), b.round(t)
        assert torch.equal(a.x, b.x)


@pytest.mark.parametrize("name", list(PARAMS))
def test_state_dict_round_trip(name):
    a = make(name)
    for t in range(3):
        a.round(t)
    b = make(name)
    b.load_state_dict(a.state_dict())
    for t in range(3, len(SCRIPT)):
        a.round(t), b.round(t)
    assert torch.equal(a.x, b.x)
