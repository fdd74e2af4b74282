"""F3AST against the properties its paper claims (not against a re-implementation).

- Unbiasedness: in steady state, with stationary availability, the expected update
  sum_{i in S_t} (p_i / r_i) Delta_i equals the full-participation average sum_i p_i Delta_i.
- Selection: S_t follows p_i^2 / r_i^2, so with every client available the selection rates
  settle at r_i = K p_i (equal p_i / r_i), the minimiser of the variance sum_i p_i^2 / r_i
  under sum_i r_i = K.

Data shares p_i come from an unequal Dirichlet split (0.05 to 0.14 of the data for 12
clients), so uniform weights or uniform rates are far from the targets. The tests drive the
hooks ``select`` and ``weights``; that ``round`` turns them into x^{t+1} = x^t + eta_g
sum_{S_t} w_i Delta_i is pinned by the trajectories in test_baselines.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import synthetic_config
from fedmpi import config
from helpers.quadratic import build

M, K = 12, 3
AVAIL = [0.3, 0.9, 0.5, 0.7, 0.4, 0.8, 0.6, 0.35, 0.95, 0.45, 0.75, 0.55]


def f3ast(beta: float, availability: dict, variant: str = "paper", **train):
    data = synthetic_config(seed=0, task__clients=M, task__partition={"kind": "dirichlet", "alpha": 0.3},
                            task__synthetic__samples=1200, task__synthetic__features=6, task__synthetic__classes=3,
                            train={"local_steps": 1, "lr": 0.5, "engine": "sequential", **train},
                            algorithm={"name": "f3ast", "select": K, "rate_beta": beta, "f3ast_variant": variant},
                            availability=availability)
    return build(config.from_dict(data))


STATIONARY = {"kind": "stationary", "base": {"kind": "fixed", "values": AVAIL}}


def shares(algo) -> np.ndarray:
    p = algo.ctx.task.sizes / algo.ctx.task.sizes.sum()
    assert np.max(np.abs(p - 1 / M) / p) > 0.3  # uniform weights would miss some p_i by > 30%
    return p


def test_selection_rates_follow_p_squared_over_r_squared():
    """Everyone available: the greedy p^2 / r^2 rule drives r_i (and the measured selection
    frequency) to K p_i; the old smallest-r rule would give K / M to everyone."""
    algo = f3ast(0.01, {"kind": "always"})
    p = shares(algo)
    every = np.arange(M)
    count = np.zeros(M)
    for t in range(6000):
        S = algo.select(t, every)
        assert len(S) == K
        if t >= 2000:
            count[S] += 1
    freq = count / 4000
    np.testing.assert_allclose(freq, K * p, rtol=0.05)
    np.testing.assert_allclose(algo.r, K * p, rtol=0.05)


def test_steady_state_update_is_unbiased():
    """Stationary Bernoulli availability: the time-average weight of client i,
    mean_t (p_i / r_i^{t+1}) 1{i in S_t}, is p_i; for any fixed changes Delta_i the mean update
    is then sum_i p_i Delta_i. (Clients are not always available: the rates settle below
    K p_i for the rarely available ones, and the weights compensate.)"""
    algo = f3ast(0.005, STATIONARY)
    p = shares(algo)
    T0, T = 4000, 24000
    weight = np.zeros(M)
    for t in range(T):
        S = algo.select(t, algo.ctx.participation.available(t))
        if t >= T0:
            weight[S] += algo.weights(t, S, S)  # the hook ServerAlgorithm multiplies Delta_i by
    mean_weight = weight / (T - T0)
    np.testing.assert_allclose(mean_weight, p, rtol=0.06)
    delta = np.random.default_rng(0).normal(size=(M, 4))
    np.testing.assert_allclose(mean_weight @ delta, p @ delta, atol=0.02 * np.abs(delta).max())


@pytest.mark.parametrize("variant, first, late", [("paper", 1.0, 1.0), ("authors", 1.0, 1 / K)])
def test_step_size_over_time(variant, first, late):
    """Sum of the weights of a round (the step relative to FedAvg's, whose weights sum to 1):
    the paper's estimator is FedAvg-sized from round 0 on; the authors' code starts there and
    decays to 1/K of it as r_i grows from p_i to K p_i."""
    algo = f3ast(0.01, {"kind": "always"}, variant)
    every = np.arange(M)
    sums = []
    for t in range(3000):
        S = algo.select(t, every)
        sums.append(algo.weights(t, S, S).sum())
    assert sums[0] == pytest.approx(first, rel=0.15)
    assert np.mean(sums[-500:]) == pytest.approx(late, rel=0.05)
