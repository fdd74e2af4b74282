"""The FedSWE paper's baselines on the quadratic task, against plain-float references that follow
ALGORITHMS.md section 2; plus rank-count independence of FedSWE, MIFA and FedVARP under mpiexec.

F_i(x) = (x - u_i)^2 / 2 with exact gradients: from the server model x, s local steps of size eta_l
give Delta_i = (1 - q)(u_i - x) with q = (1 - eta_l)^s.
"""

from __future__ import annotations

import os
import sys

import h5py
import numpy as np
import pytest
import torch

from conftest import ROOT, assert_resume_identical, mpiexec
from fedmpi.errors import InputError
from fedmpi.runtime import World
from helpers.baselines import PROBS, SCRIPT, X0, M, U, delta
from helpers.quadratic import Scripted, build, quadratic_cfg, scalar

# ----------------------------------------------------------------------------- references

def ref_fedavg_active(eta_g: float) -> list[float]:
    x, out = X0, []
    for A in SCRIPT:
        if A:  # an empty round keeps x
            x = x + eta_g * sum(delta(i, x) for i in A) / len(A)
        out.append(x)
    return out


def ref_fedavg_all(eta_g: float) -> list[float]:
    x, out = X0, []
    for A in SCRIPT:
        x = x + eta_g * sum(delta(i, x) for i in A) / M
        out.append(x)
    return out


def ref_fedknown(eta_g: float) -> list[float]:
    x, out = X0, []
    for t, A in enumerate(SCRIPT):
        x = x + eta_g * sum(delta(i, x) / PROBS[t][i] for i in A) / M
        out.append(x)
    return out


def ref_gfedavg(eta_g: float, a: float = 3.0, P: int = 2) -> list[float]:
    x, anchor, out = X0, X0, []
    for t, A in enumerate(SCRIPT):
        if A:
            x = x + eta_g * sum(delta(i, x) for i in A) / len(A)
        if (t + 1) % P == 0:
            x = x + (a - 1) * (x - anchor)
            anchor = x
        out.append(x)
    return out


def ref_fedau(eta_g: float, K: int = 2) -> list[float]:
    x, c, L, out = X0, [0] * M, [[] for _ in range(M)], []
    for A in SCRIPT:
        w = {i: (sum(L[i]) / len(L[i]) if L[i] else 1.0) for i in A}
        x = x + eta_g * sum(w[i] * delta(i, x) for i in A) / M
        for i in range(M):
            if i in A:
                L[i].append(c[i] + 1)
                c[i] = 0
            else:
                c[i] += 1
                if c[i] == K:
                    L[i].append(K)
                    c[i] = 0
        out.append(x)
    return out


def ref_f3ast(eta_g: float, select: int = 2, beta: float = 0.5, authors: bool = False) -> list[float]:
    p = [1 / M] * M  # data shares: one sample per quadratic client
    x, r, out = X0, [q if authors else select * q for q in p], []
    for A in SCRIPT:
        S = sorted(A, key=lambda i: (-p[i] ** 2 / r[i] ** 2, i))[:select]
        r = [(1 - beta) * r[i] + beta * (i in S) for i in range(M)]  # before the weights
        x = x + eta_g * sum(p[i] / r[i] * delta(i, x) for i in S) / (select if authors else 1)
        out.append(x)
    return out


def ref_mifa(eta_g: float) -> list[float]:
    x, G, out = X0, [0.0] * M, []
    for A in SCRIPT:
        for i in A:
            G[i] = delta(i, x)
        x = x + eta_g * sum(G) / M  # every round, empty ones too
        out.append(x)
    return out


def ref_fedvarp(eta_g: float) -> list[float]:
    x, y, out = X0, [0.0] * M, []
    for A in SCRIPT:
        if A:
            d = {i: delta(i, x) for i in A}
            x = x + eta_g * (sum(d[i] - y[i] for i in A) / len(A) + sum(y) / M)
            for i in A:
                y[i] = d[i]
        out.append(x)
    return out


CASES = {
    "fedavg_active": (ref_fedavg_active, {}),
    "fedavg_all": (ref_fedavg_all, {}),
    "fedknown": (ref_fedknown, {}),
    "gfedavg": (ref_gfedavg, {"amplification": 3.0, "anchor_period": 2}),
    "fedau": (ref_fedau, {"fedau_cap": 2}),
    "f3ast": (ref_f3ast, {"select": 2, "rate_beta": 0.5}),
    "f3ast_authors": (lambda eta_g: ref_f3ast(eta_g, authors=True),
                      {"select": 2, "rate_beta": 0.5, "f3ast_variant": "authors"}),
    "mifa": (ref_mifa, {}),
    "fedvarp": (ref_fedvarp, {}),
}


def make(case: str, eta_g: float = 1.0):
    name = case.split("_authors")[0]  # f3ast_authors: f3ast with f3ast_variant: authors
    return build(quadratic_cfg(name, U, X0, eta_g=eta_g, **CASES[case][1]), Scripted(M, SCRIPT, PROBS))


@pytest.mark.parametrize("eta_g", [1.0, 0.5])
@pytest.mark.parametrize("name", list(CASES))
def test_trajectory_matches_definition(name, eta_g):
    ref = CASES[name][0](eta_g)
    algo = make(name, eta_g)
    got = []
    for t in range(len(SCRIPT)):
        algo.round(t)
        got.append(scalar(algo.evaluation_snapshot().models[""]))
    assert got == pytest.approx(ref, rel=1e-6, abs=1e-6)  # float32 models: a few ulps over 6 rounds


def test_empty_round_behaviour():
    """Round 1 has no active client: only MIFA moves (it re-applies its stored updates)."""
    for name in CASES:
        algo = make(name)
        algo.round(0)
        before = algo.x.clone()
        algo.round(1)
        moved = not torch.equal(algo.x, before)
        assert moved == (name in ("mifa", "gfedavg")), name  # gfedavg: round 1 ends an anchor period


@pytest.mark.parametrize("name", list(CASES))
def test_state_dict_round_trip(name):
    a = make(name)
    for t in range(3):
        a.round(t)
    state = a.state_dict()
    assert "x" in state.shared and all(isinstance(v, torch.Tensor) for v in state.shared.values())
    b = make(name)
    b.load_state_dict(state)
    for t in range(3, len(SCRIPT)):
        a.round(t), b.round(t)
    assert torch.equal(a.x, b.x)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedswe", "gfedavg", "fedau", "f3ast", "mifa", "fedvarp"])
def test_checkpoint_resume_gives_the_same_run(name, tmp_path):
    """Through the runner: fail at round 5, resume from the round-4 checkpoint, finish as if uninterrupted."""
    cfg = quadratic_cfg(name, [[0.0, 1.0], [8.0, -2.0], [-4.0, 3.0], [1.0, 1.0], [2.0, -6.0]],
                        availability={"kind": "stationary", "base": {"kind": "fixed", "values": [0.4]}},
                        k=2, anchor_period=3, fedau_cap=3, select=2, rate_beta=0.3)
    cfg.rounds, cfg.eval_every, cfg.runtime.checkpoint_every = 8, 2, 2
    assert_resume_identical(cfg, tmp_path)


def test_fedknown_refuses_unknown_probabilities():
    with pytest.raises(InputError, match="availability.kind"):
        build(quadratic_cfg("fedknown", U, X0), Scripted(M, SCRIPT, probs=None))


def test_f3ast_selects_largest_p2_over_r2_among_available_ties_by_id():
    algo = make("f3ast")  # p = (1/3, 1/3, 1/3)
    algo.r = np.array([0.3, 0.1, 0.2])  # p^2 / r^2 largest for 1, then 2: the smallest r with equal p
    assert algo.select(0, np.array([0, 1, 2])).tolist() == [1, 2]
    algo.r = np.array([0.2, 0.2, 0.2])
    assert algo.select(0, np.array([0, 1, 2])).tolist() == [0, 1]
    assert algo.select(0, np.array([2])).tolist() == [2]  # fewer than K available: all of them
    # unequal shares: the rule is p^2 / r^2, neither the largest p ...
    algo.p, algo.r = np.array([0.6, 0.3, 0.1]), np.array([0.9, 0.2, 0.05])  # p / r = 0.67, 1.5, 2
    assert algo.select(0, np.array([0, 1, 2])).tolist() == [1, 2]
    algo.p, algo.r = np.array([0.6, 0.3, 0.1]), np.array([0.4, 0.3, 0.2])  # p / r = 1.5, 1, 0.5
    assert algo.select(0, np.array([0, 1, 2])).tolist() == [0, 1]  # ... nor the smallest r
    assert algo.select(0, np.array([1, 2])).tolist() == [1, 2]  # unavailable 0 is never chosen


def test_f3ast_rates_start_at_k_p_and_move_before_the_weights():
    algo = make("f3ast")  # K = 2, beta = 0.5, p_i = 1/3
    assert algo.r == pytest.approx([2 / 3] * 3)
    S = algo.select(0, np.array([0, 1, 2]))
    assert S.tolist() == [0, 1] and algo.r == pytest.approx([5 / 6, 5 / 6, 1 / 3])
    assert algo.weights(0, S, S) == pytest.approx([0.4, 0.4])  # p / r^{t+1} = (1/3) / (5/6)
    authors = make("f3ast_authors")
    assert authors.r == pytest.approx([1 / 3] * 3)
    S = authors.select(0, np.array([0, 1, 2]))
    assert authors.weights(0, S, S) == pytest.approx([(1 / 3) / (2 / 3) / 2] * 2)  # p / r^{t+1} / K


def test_table_sum_tracks_the_rows():
    """The server's running sum S equals the sum of the sharded table rows."""
    for name in ("mifa", "fedvarp"):
        algo = make(name)
        for t in range(len(SCRIPT)):
            algo.round(t)
            assert torch.allclose(algo.table_sum, algo.table.rows.double().sum(0), rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- MPI

@pytest.mark.slow
@pytest.mark.mpi
def test_two_ranks_match_one_rank_bit_for_bit(tmp_path):
    import subprocess

    sys.path.insert(0, os.path.join(ROOT, "tests", "mpi_scripts"))
    from unavailability_check import RUNS, run

    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    script = os.path.join(ROOT, "tests", "mpi_scripts", "unavailability_check.py")
    proc = subprocess.run(mpiexec(2) + [sys.executable, script, str(two)], capture_output=True, text=True,
                          timeout=240, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run(World(), str(one))
    for name in RUNS:
        with h5py.File(one / f"{name}.h5") as a, h5py.File(two / f"{name}.h5") as b:
            assert a.attrs["world_size"] == 1 and b.attrs["world_size"] == 2
            assert np.array_equal(a["final/params"][:], b["final/params"][:]), name
            for key in a["metrics"]:
                if key not in ("wall_time", "peak_rss_mb"):
                    assert np.array_equal(a["metrics"][key][:], b["metrics"][key][:]), (name, key)
            assert a["metrics/n_active"][:].sum() > 0


@pytest.mark.parametrize("name, even", [("fedavg_active", True), ("fedprox", True), ("fedau", True),
                                        ("scaffold", False), ("mifa", False), ("fedswe", False)])
def test_who_trains_an_active_client(name, even):
    """``clients_anywhere`` (no per-client state on the owner): the active clients split evenly
    over the ranks by position, whoever owns them; otherwise each rank trains the clients it owns.
    Either way the ranks' shares partition the active set (1 rank == 2 == 3 ranks: test_matrix)."""
    algo = build(quadratic_cfg(name, [float(i) for i in range(12)], availability={
        "kind": "stationary", "base": {"kind": "fixed", "values": [0.5]}}))
    active = np.array([0, 1, 2, 3, 4, 5, 6, 11])  # 7 of the 8 owned by rank 0 of 2
    for size in (2, 3):
        shares = []
        for rank in range(size):
            algo.world = algo.ctx.world = World(rank=rank, size=size)
            shares.append(algo.assigned(active))
            lo, hi = algo.world.shard(12)
            owned = active[(active >= lo) & (active < hi)]
            assert np.array_equal(shares[-1], active[len(active) * rank // size:len(active) * (rank + 1) // size]
                                  if even else owned)
        assert np.array_equal(np.sort(np.concatenate(shares)), active)
