"""Debiased FedAvg (debiasing paper, Algorithm 1) and the Markov-sampler plots.

On the quadratic task F_i(x) = (x - u_i)^2 / 2 with exact gradients, K local steps of size
alpha nu_i from x give x_i = u_i + (1 - alpha nu_i)^K (x - u_i). FedAvg under the Markov
sampler settles near the pi_R-weighted mean of the u_i (Theorem 1); debiased FedAvg near the
plain mean.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch.func import functional_call

from conftest import fedmpi, synthetic_config, write_config
from fedmpi import algorithms, config
from fedmpi.build import build_components
from fedmpi.cli import _Parser
from fedmpi.errors import InputError
from fedmpi.participation import Participation
from fedmpi.participation.pi import stationary_exact
from fedmpi.results import markov_plots
from fedmpi.runner import Runner
from fedmpi.runtime import World

CPU = torch.device("cpu")


class Scripted(Participation):
    """S_t = script[t]."""

    configuration = ("script",)

    def __init__(self, m: int, script: list[list[int]]):
        super().__init__(m, seed=0)
        self.script = script

    def available(self, t: int) -> np.ndarray:
        return np.asarray(self.script[t], dtype=np.int64)


def make(data: dict, part: Participation | None = None) -> algorithms.Algorithm:
    """The algorithm of config ``data`` in this process (one rank), on ``part`` or the config's sampler."""
    return build_components(config.from_dict(data), World(), participation=part).algorithm


def quadratic(name: str, u: list[float], lr: float, K: int, availability: dict | None = None,
              eta_g: float = 1.0, seed: int = 0, **algo) -> dict:
    return {"seed": seed, "task": {"dataset": "quadratic", "model": "scalar", "clients": len(u), "u": u},
            "train": {"local_steps": K, "lr": lr, "batch_size": 1, "engine": "sequential"},
            "algorithm": {"name": name, "global_lr": eta_g, **algo}, "availability": availability or {"kind": "always"},
            "runtime": {"progress": False}}


# ----------------------------------------------------------------------------- nu_i by hand

U4, LR, K = [0.0, 4.0, -2.0, 10.0], 0.25, 2
SCRIPT = [[0, 1], [0, 2], [1, 3], [0, 1]]
# t_i counted before lambda_i = t_i / ((t + 1) B), B = 2, N = 4, nu_i = 1 / (lambda_i N):
#   t=0: t_0 = t_1 = 1 -> lambda = 1/2          t=1: t_0 = 2 -> 1/2, t_2 = 1 -> 1/4
#   t=2: t_1 = 2 -> 1/3, t_3 = 1 -> 1/6         t=3: t_0 = t_1 = 3 -> 3/8
NU = [[0.5, 0.5], [0.5, 1.0], [0.75, 1.5], [2 / 3, 2 / 3]]


@pytest.mark.parametrize("warmup, nu_max, eta_g", [(0, None, 1.0), (2, None, 0.5), (0, 0.6, 1.0), (1, 0.7, 1.0)])
def test_nu_and_trajectory_by_hand(warmup, nu_max, eta_g):
    algo = make(quadratic("debiased_fedavg", U4, LR, K, eta_g=eta_g, warmup=warmup, nu_max=nu_max),
                Scripted(4, SCRIPT))
    x = 0.0
    for t, (S, nu) in enumerate(zip(SCRIPT, NU)):
        nu = [1.0] * len(S) if t < warmup else [min(v, nu_max or np.inf) for v in nu]
        algo.round(t)
        assert algo.nu(t, np.array(S)) == pytest.approx(nu, rel=1e-12)
        ends = [U4[i] + (1 - LR * v) ** K * (x - U4[i]) for i, v in zip(S, nu)]
        x = x + eta_g * sum(e - x for e in ends) / len(S)
        assert float(algo.x[0]) == pytest.approx(x, rel=1e-6, abs=1e-6), t
    assert algo.counts.tolist() == [3, 3, 1, 1]


def test_state_dict_round_trip():
    data = quadratic("debiased_fedavg", U4, LR, K)
    a, b = make(data, Scripted(4, SCRIPT)), make(data, Scripted(4, SCRIPT))
    for t in range(2):
        a.round(t)
    b.load_state_dict(a.state_dict())
    assert b.counts.tolist() == [2, 1, 1, 0]
    for t in range(2, 4):
        a.round(t), b.round(t)
    assert torch.equal(a.x, b.x) and a.counts.tolist() == b.counts.tolist()


# ----------------------------------------------------------------------------- fixed points

U8 = [float(i) for i in range(8)]
P8 = [0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.85, 1.0]
MARKOV8 = {"kind": "markov", "B": 2, "R": 1, "base": {"kind": "fixed", "values": P8}}


def tail_mean(name: str, rounds: int = 800, availability: dict = MARKOV8) -> float:
    """Mean of x over rounds T/4..T: the fixed point, up to the O(alpha) fluctuation."""
    algo = make(quadratic(name, U8, lr=0.3, K=1, availability=availability))
    xs = []
    for t in range(rounds):
        algo.round(t)
        xs.append(float(algo.x[0]))
    return float(np.mean(xs[rounds // 4:]))


@pytest.mark.slow
def test_fixed_points_fedavg_biased_debiased_not():
    """N = 8, B = 2, R = 1: the pi_R-weighted mean is 3.99, the plain mean 3.5. Tolerances:
    0.1 for FedAvg vs pi_R (seen: within 0.04 over 5 seeds), 0.15 for debiased FedAvg vs the
    plain mean (seen: 0.00-0.09 below it, a transient of the online estimate of pi_R)."""
    pi = stationary_exact(np.array(P8), 2, 1)
    target, biased = float(np.mean(U8)), float(pi @ np.array(U8))
    assert biased - target > 0.45
    fedavg, debiased = tail_mean("fedavg_markov"), tail_mean("debiased_fedavg")
    assert abs(fedavg - biased) < 0.1 and abs(fedavg - target) > 0.35
    assert abs(debiased - target) < 0.15


GROUPS8 = {"kind": "markov", "markov_groups": 4, "B": 2, "R": 1, "base": {"kind": "fixed", "values": P8}}


@pytest.mark.slow
def test_markov_groups_uses_the_group_size_and_debiases():
    """The paper's experiments: M = 4 groups of B = 2 clients, the chain over groups (R = 1), a
    drawn group trains fully. lambda_i = t_i / ((t + 1) B) with B the GROUP size sums to 1 over
    the clients every round; FedAvg settles at the pi_R-weighted mean of the u_i (4.68 here,
    groups weighted by (0.15, 0.5, 1.2, 1.85)), debiased FedAvg near the plain mean 3.5.
    Tolerances: FedAvg within 0.15 of 4.68 (seen: 0.0-0.13 over 4 seeds); debiased within 0.35
    of 3.5 (seen: 0.0-0.33 below it: at this constant step the rare groups take steps
    alpha nu_i > 1, and under R = 1 the next group depends on the last, so x_t and S_t correlate)."""
    algo = make(quadratic("debiased_fedavg", U8, lr=0.3, K=1, availability=GROUPS8))
    for t in range(200):
        algo.round(t)
        S = algo.active
        assert len(S) == 2 and S[1] == S[0] + 1 and S[0] % 2 == 0  # one whole group
        lam = algo.counts / ((t + 1) * 2)
        assert lam.sum() == pytest.approx(1.0)
        assert algo.nu(t, S) == pytest.approx(1 / (lam[S] * 8))
    pi = stationary_exact(np.array(P8), 1, 1, groups=4)
    biased, target = float(pi @ np.array(U8)), float(np.mean(U8))
    assert biased - target > 1.0
    fedavg = tail_mean("fedavg_markov", availability=GROUPS8)
    debiased = tail_mean("debiased_fedavg", availability=GROUPS8)
    assert abs(fedavg - biased) < 0.15 and abs(debiased - target) < 0.35


# ----------------------------------------------------------------------------- full gradient

def test_full_gradient_local_steps_scaled_by_nu():
    """train.full_gradient: x <- x - alpha nu_i grad f_i(x) over all of client i's samples,
    against plain autograd on each client's whole data set."""
    data = synthetic_config(rounds=3, task__clients=6, task__synthetic__samples=120, task__synthetic__features=5,
                            task__synthetic__classes=3, train__full_gradient=True, train__local_steps=2,
                            train__lr=0.5, train__engine="sequential", algorithm={"name": "debiased_fedavg"},
                            availability={"kind": "markov", "B": 2, "R": 1})
    algo = make(data)
    task, spec, N, B, lr = algo.ctx.task, algo.ctx.spec, 6, 2, 0.5
    x, counts, nus = algo.x.clone().double(), np.zeros(N), []
    for t in range(3):
        algo.round(t)
        S = algo.active
        counts[S] += 1
        ends = []
        for i in S:
            nu = 1.0 / (counts[i] / ((t + 1) * B) * N)
            nus.append(nu)
            idx = task.order[task.offsets[i]:task.offsets[i + 1]]
            xi = x.clone()
            for _ in range(2):
                p = xi.float().requires_grad_(True)
                loss = task.loss(functional_call(task.model, spec.views(p), (task.inputs(task.train_x[idx]),)),
                                 task.train_y[idx])
                xi = xi - lr * nu * torch.autograd.grad(loss, p)[0].double()
            ends.append(xi)
        x = x + sum(e - x for e in ends) / len(S)
        assert torch.allclose(algo.x.double(), x, atol=1e-5), t
    assert nus[:2] == pytest.approx([1 / 3, 1 / 3]) and counts.sum() == 6  # lambda = 1 / B at t = 0


def test_fedvarp_runs_under_markov():
    algo = make(quadratic("fedvarp", U8, lr=0.3, K=1, availability=MARKOV8))
    for t in range(5):
        assert algo.round(t) == 2


# ----------------------------------------------------------------------------- ranks and plots

def markov_run(out: str) -> dict:
    return synthetic_config(rounds=8, output=out, task__clients=12, train__engine="sequential",
                            algorithm={"name": "debiased_fedavg", "nu_max": 3.0},
                            availability={"kind": "markov", "B": 3, "R": 1,
                                          "base": {"kind": "uniform", "lo": 0.1, "hi": 0.9}},
                            runtime={"progress": False, "log_availability": True})


def plot_cli(argv: list[str]) -> int:
    parser = _Parser(prog="fedmpi markov-plot")
    markov_plots.add_arguments(parser)
    args = parser.parse_args(argv)
    return args._handler(args)


@pytest.mark.slow
@pytest.mark.mpi
def test_two_ranks_identical_and_plots(tmp_path):
    one, two = str(tmp_path / "one.h5"), str(tmp_path / "two.h5")
    fedmpi(["run", write_config(tmp_path / "two.yaml", markov_run(two)), "--quiet"], ranks=2)
    Runner(config.from_dict(markov_run(one)), World(), one, quiet=True).run()
    with h5py.File(one) as a, h5py.File(two) as b:
        assert a.attrs["world_size"] == 1 and b.attrs["world_size"] == 2
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
        assert np.array_equal(a["availability/mask"][:], b["availability/mask"][:])
        assert a["availability/mask"][:].sum(axis=1).tolist() == [3] * 8
        for key in a["metrics"]:
            if key not in ("wall_time", "peak_rss_mb"):
                assert np.array_equal(a["metrics"][key][:], b["metrics"][key][:]), key

    # the plot commands on this run (pi_R of N = 12, B = 3, R = 1 is exact) and a small Figure 1
    for argv in (["freq", one, "--out", str(tmp_path / "freq.png")],
                 ["fig1", "--N", "8", "--B", "2", "--R", "0:3:1", "--rounds", "300",
                  "--out", str(tmp_path / "f1.png")]):
        assert plot_cli(argv) == 0
        assert open(argv[-1], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    shares, rounds, _ = markov_plots.participation_shares(one)
    assert rounds == 8 and shares.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("argv, key", [
    (["fig1", "--N", "10", "--B", "2", "--R", "0,5", "--out", "x.png"], "--R"),
    (["fig1", "--N", "10", "--B", "11", "--out", "x.png"], "--B"),
    (["fig1", "--R", "1:x", "--out", "x.png"], "--R"),
    (["fig1", "--rounds", "0", "--out", "x.png"], "--rounds"),
    (["freq", "/no/such/run.h5", "--out", "x.png"], "/no/such/run.h5"),
])
def test_plot_cli_bad_input(argv, key):
    with pytest.raises(InputError, match="^" + key):
        plot_cli(argv)


def test_freq_needs_a_mask(tmp_path):
    out = str(tmp_path / "nomask.h5")
    data = quadratic("debiased_fedavg", U4, LR, K, availability={"kind": "markov", "B": 2, "R": 1})
    Runner(config.from_dict({**data, "rounds": 2}), World(), out, quiet=True).run()
    with pytest.raises(InputError, match="has no /availability/mask"):
        plot_cli(["freq", out, "--out", str(tmp_path / "x.png")])
