"""FedSWE / FedAWE on the quadratic task: hand-computed trajectories, Example 1, Proposition 14,
the version store's memory, and the collective outputs x_bar / consensus error.

F_i(x) = (x - u_i)^2 / 2 with exact gradients, so s local steps of size eta_l from x give
x_i^{t,s} = u_i + q (x - u_i) with q = (1 - eta_l)^s; the references below follow
ALGORITHMS.md section 2 with plain Python floats.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from helpers.quadratic import Q, Scripted, build, quadratic_cfg, scalar

from fedmpi import config


def fedswe_reference(u, x0, script, k, eta_g=1.0, q=Q, clip=None, max_echo=None, dp_clip=None):
    """Algorithm 1 in plain floats: per round (x^{t+1}, x_bar, consensus error); ``max_echo`` E caps
    the echo factor, ``dp_clip`` C clips |G_i| first (privacy.clip, docs/PRIVACY.md)."""
    m = len(u)
    xi, tau, x, out = [x0] * m, [-1] * m, x0, []
    for t, active in enumerate(script):
        dag = {}
        for i in active:
            end = u[i] + q * (xi[i] - u[i])  # s local steps from x_i
            G = xi[i] - end
            if dp_clip is not None:
                G = max(-dp_clip, min(dp_clip, G))
            dag[i] = xi[i] - eta_g * min(t - tau[i], max_echo or t + 1) * G  # echo
            tau[i] = t
        if active:
            n = len(active)
            total = sum(dag.values())
            if clip is not None:  # the authors' order: clip the mean echoed innovation, then eta_g
                mean_innovation = sum(dag[i] - xi[i] for i in active) / n / eta_g
                mean_innovation = max(-clip, min(clip, mean_innovation))  # |.| <= c in one dimension
                total = sum(xi[i] for i in active) + n * eta_g * mean_innovation
            x = (total + k * x) / (n + k)
        for i in active:
            xi[i] = x  # postponed multicast
        bar = sum(xi) / m
        out.append((x, bar, sum((v - bar) ** 2 for v in xi) / m))
    return out


U = [0.0, 8.0, -4.0]
SCRIPT = [[0, 1], [], [2], [0, 1, 2]]  # an empty round; client 2 first seen at t = 2; 0, 1 come back


@pytest.mark.parametrize("k", [0, 1, None])  # None = m
@pytest.mark.parametrize("eta_g", [1.0, 0.5])
def test_trajectory_matches_algorithm_1(k, eta_g):
    x0 = 2.0
    ref = fedswe_reference(U, x0, SCRIPT, len(U) if k is None else k, eta_g)
    algo = build(quadratic_cfg("fedswe", U, x0, eta_g=eta_g, k=k), Scripted(3, SCRIPT))
    for t, (x, bar, cons) in enumerate(ref):
        assert algo.round(t) == len(SCRIPT[t])
        snap = algo.evaluation_snapshot()
        assert scalar(snap.models["server"]) == pytest.approx(x, rel=1e-5, abs=1e-5)
        assert scalar(snap.models[""]) == pytest.approx(bar, rel=1e-5, abs=1e-5)
        assert snap.metrics["consensus_error"] == pytest.approx(cons, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("k", [0, None])
def test_max_echo_caps_the_echo_factor(k):
    """Client 2 first comes at t = 2 (echo 3) and clients 0, 1 come back at t = 3 (echo 3): E = 2
    caps both; the trajectory is Algorithm 1 with min(t - tau_i, E)."""
    k_ = len(U) if k is None else k
    ref = fedswe_reference(U, 2.0, SCRIPT, k_, max_echo=2)
    algo = build(quadratic_cfg("fedswe", U, 2.0, k=k, max_echo=2), Scripted(3, SCRIPT))
    for t, (x, bar, _) in enumerate(ref):
        algo.round(t)
        assert scalar(algo.x) == pytest.approx(x, rel=1e-5, abs=1e-5)
        assert scalar(algo.evaluation_snapshot().models[""]) == pytest.approx(bar, rel=1e-5, abs=1e-5)
    assert ref != fedswe_reference(U, 2.0, SCRIPT, k_)  # the cap was active


def test_first_rounds_by_hand():
    """k = 0, x0 = 2, q = 1/4: the reference itself, checked against numbers worked out by hand."""
    # t=0: x^{0,s} = 1/2 and 13/2 (echo 1) -> x_i^dag = 1/2, 13/2 -> x^1 = 7/2
    # t=1: nobody -> x^2 = 7/2
    # t=2: client 2 from x_0 = 2: x^{2,s} = -4 + 6/4 = -5/2, G = 9/2, echo t - tau = 3:
    #      x^dag = 2 - 27/2 = -23/2 -> x^3 = -23/2; x_bar = (7/2 + 7/2 - 23/2) / 3 = -3/2
    ref = fedswe_reference(U, 2.0, SCRIPT, 0)
    assert [r[0] for r in ref[:3]] == [3.5, 3.5, -11.5]
    assert ref[2][1] == -1.5


@pytest.mark.parametrize("eta_g", [1.0, 0.5])
def test_server_clip_limits_the_mean_echoed_change(eta_g):
    ref = fedswe_reference(U, 2.0, SCRIPT, 1, eta_g=eta_g, clip=0.75)
    algo = build(quadratic_cfg("fedswe", U, 2.0, eta_g=eta_g, k=1, server_clip=0.75), Scripted(3, SCRIPT))
    for t, (x, _, _) in enumerate(ref):
        algo.round(t)
        assert scalar(algo.x) == pytest.approx(x, rel=1e-5)
    assert ref != fedswe_reference(U, 2.0, SCRIPT, 1, eta_g=eta_g)  # the clip was active


def test_server_clip_comes_before_eta_g_by_hand():
    """The authors' accumulation: x^{t+1} = mean x_i + eta_g clip(mean (t - tau_i)(x_i^{t,s} - x_i), c).
    k = 0, x0 = 2, q = 1/4, c = 1, eta_g = 0.5, round 0 with clients 0 and 1 (echo t - tau = 1):
    x^{0,s} = 1/2 and 13/2, innovations -3/2 and 9/2, mean 3/2 -> clipped to 1 -> x^1 = 2 + 0.5 * 1 = 2.5.
    (Clipping after eta_g would give 2 + clip(0.75, 1) = 2.75.)"""
    algo = build(quadratic_cfg("fedswe", U, 2.0, eta_g=0.5, k=0, server_clip=1.0), Scripted(3, SCRIPT))
    algo.round(0)
    assert scalar(algo.x) == pytest.approx(2.5, rel=1e-6)


def test_vector_model_and_x_bar_against_explicit_client_models():
    """x_bar and the consensus error from versions + counts equal the explicit per-client mean."""
    u = [[1.0, -2.0], [4.0, 0.5], [-3.0, 2.0], [0.0, 6.0], [2.0, 2.0]]
    script = [[0, 3], [1], [], [0, 2, 4], [3]]
    algo = build(quadratic_cfg("fedswe", u, k=2), Scripted(5, script))
    for t in range(len(script)):
        algo.round(t)
        xs = algo.store.gather(np.arange(5)).double()
        bar = xs.mean(0)
        snap = algo.evaluation_snapshot()
        assert torch.allclose(snap.models[""].double(), bar, atol=1e-6)
        cons = float((xs - bar).pow(2).sum(1).mean())
        assert snap.metrics["consensus_error"] == pytest.approx(cons, rel=1e-6, abs=1e-9)


def test_empty_round_keeps_everything():
    algo = build(quadratic_cfg("fedswe", U, 2.0, k=0), Scripted(3, [[1], []]))
    algo.round(0)
    before = algo.x.clone(), algo.tau.copy(), dict(algo.store.versions)
    assert algo.round(1) == 0
    assert torch.equal(algo.x, before[0]) and np.array_equal(algo.tau, before[1])
    assert algo.store.versions.keys() == before[2].keys()


def test_state_dict_round_trip():
    a = build(quadratic_cfg("fedswe", U, 2.0, k=1), Scripted(3, SCRIPT))
    for t in range(2):
        a.round(t)
    b = build(quadratic_cfg("fedswe", U, 2.0, k=1), Scripted(3, SCRIPT))
    state = a.state_dict()
    assert set(state.shared) == {"x"} and set(state.clients) == {"tau"} and state.union  # x^t, tau_i, versions
    b.load_state_dict(state)
    for t in range(2, 4):
        a.round(t), b.round(t)
    assert torch.equal(a.x, b.x) and torch.equal(a.final_params(), b.final_params())


# ----------------------------------------------------------------------------- paper examples

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "unavailability")


def prop14(k: int, rounds: int) -> tuple[list[float], list[float], list[float]]:
    """configs/unavailability/prop14_k{k}.yaml: u = (100, -100); client 0 only in even rounds, client 1
    only in odd rounds (cyclic, K = 2); s = 1, eta_l = 0.1 / sqrt(t/10 + 1)."""
    cfg = config.load(os.path.join(CONFIGS, f"prop14_k{k}.yaml"), [f"rounds={rounds}", "train.engine=sequential"])
    algo = build(cfg)
    server, bar, cons = [], [], []
    for t in range(rounds):
        algo.round(t)
        snap = algo.evaluation_snapshot()
        cons.append(snap.metrics["consensus_error"])
        server.append(scalar(snap.models["server"]))
        bar.append(scalar(snap.models[""]))
    return server, bar, cons


def test_proposition_14_no_interpolation_alternates_between_optima():
    server, _, cons = prop14(k=0, rounds=300)
    # the server model ends up at u_0 = 100 after even rounds and at u_1 = -100 after odd ones ...
    assert server[-4:] == pytest.approx([100.0, -100.0, 100.0, -100.0], abs=0.5)
    assert min(cons[100:]) > 9e3  # ... and the clients never agree (x_0 = 100, x_1 = -100)


def test_proposition_14_interpolation_reaches_consensus_at_the_minimizer():
    server, bar, cons = prop14(k=1, rounds=300)
    # x -> x* = 0 and consensus, up to an O(eta_l) oscillation that shrinks with the step size
    assert abs(server[-1]) < 2.5 and abs(server[-2]) < 2.5 and abs(bar[-1]) < 0.5
    assert cons[-1] < 5.0 and cons[-1] < cons[99] < cons[9]


def example1_time_average(which: str, rounds: int = 1000, burn_in: int = 100) -> float:
    """configs/unavailability/example1_{which}.yaml (m = 2, u = (0, 100), p = (0.2, 0.8), s = 1,
    eta_l = 0.1): the time average of the evaluated model (FedAvg: x^t; FedSWE: x_bar)."""
    cfg = config.load(os.path.join(CONFIGS, f"example1_{which}.yaml"), [f"rounds={rounds}", "train.engine=sequential"])
    algo = build(cfg)
    seen = []
    for t in range(rounds):
        algo.round(t)
        if t >= burn_in:
            seen.append(scalar(algo.evaluation_snapshot().models[""]))
    return float(np.mean(seen))


@pytest.mark.slow
def test_example_1_fedavg_bias_and_fedswe_fix():
    p1, p2, u1, u2 = 0.2, 0.8, 0.0, 100.0  # lim E x^t for FedAvg over the active clients, q = (1 - eta_l)^s:
    # E x' = P0 E x + (1 - P0) q E x + (1 - q) [p1 (1-p2) u1 + p2 (1-p1) u2 + p1 p2 (u1+u2)/2], P0 = (1-p1)(1-p2)
    x_out = (p1 * (1 - p2) * u1 + p2 * (1 - p1) * u2 + p1 * p2 * (u1 + u2) / 2) / (1 - (1 - p1) * (1 - p2))
    assert x_out == pytest.approx(85.714, abs=1e-3)
    fedavg = example1_time_average("fedavg")
    assert fedavg == pytest.approx(x_out, abs=3.0)
    fedswe = example1_time_average("fedswe")  # k = m = 2
    assert abs(fedswe - 50.0) < 1.0 and abs(fedswe - 50.0) < abs(fedavg - 50.0) / 20


# ----------------------------------------------------------------------------- memory

def test_inactive_clients_share_past_global_models():
    m, rounds = 1000, 60
    cfg = quadratic_cfg("fedswe", np.linspace(-1, 1, m).tolist(), lr=0.1, s=1,
                        availability={"kind": "stationary", "base": {"kind": "fixed", "values": [0.01]}})
    algo = build(cfg)
    for t in range(rounds):
        algo.round(t)
        # one version per distinct tau_i: at most one per past round, plus x_0
        assert len(algo.store.versions) == len(np.unique(algo.tau)) <= t + 2
    assert (algo.tau >= 0).sum() > 300  # many clients took part ...
    assert len(algo.store.versions) < m / 10  # ... yet few models are stored
    assert algo.store.nbytes() == len(algo.store.versions) * 4
