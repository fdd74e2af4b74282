"""pi_R: exact stationary solve, Monte Carlo agreement, the paper's properties, the CLI."""

from __future__ import annotations

import argparse
import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from fedmpi.errors import InputError
from fedmpi.participation.pi import (
    add_arguments, figure1, l1_to_uniform, run_cli, state_space_size, stationary_exact, stationary_mc)
from helpers.properties import given, settings, st

P5 = np.array([0.1, 0.2, 0.3, 0.5, 0.9])


def test_exact_by_hand_n3_b1_r1():
    # N = 3, B = 1, R = 1: the state is the last client s; next j != s w.p. p_j / (P - p_s),
    # P = sum p. Balance: zeta_j = p_j * sum_{s != j} zeta_s / (P - p_s). With a_s = zeta_s / (P - p_s),
    # A = sum a_s: a_j (P - p_j) = p_j (A - a_j)  =>  a_j = A p_j / P  =>  zeta_j ∝ p_j (P - p_j).
    # pi_j = P(next = j) = zeta_j (stationarity). p = (1, 2, 3), P = 6: p (P - p) = (5, 8, 9) / 22.
    np.testing.assert_allclose(stationary_exact(np.array([1.0, 2.0, 3.0]), 1, 1),
                               np.array([5, 8, 9]) / 22, rtol=0, atol=1e-12)


def test_exact_by_hand_r0_subset_distribution():
    # N = 3, B = 2, R = 0: P(S) ∝ sum_S p over pairs: {0,1}: 3, {0,2}: 4, {1,2}: 5 (total 12).
    # P(i in S) = (7, 8, 9) / 12, divided by B = 2: (7, 8, 9) / 24.
    np.testing.assert_allclose(stationary_exact(np.array([1.0, 2.0, 3.0]), 2, 0),
                               np.array([7, 8, 9]) / 24, rtol=0, atol=1e-12)


def test_exact_closed_forms_n8():
    # B = 1, R = 1 (the hand derivation above, any N): pi_j ∝ p_j (P - p_j).
    # R = 0, any B: P(i in S) = [C(N-1, B-1) p_i + C(N-2, B-2) (P - p_i)] / (C(N-1, B-1) P)
    #                         = p_i / P + (B - 1) / (N - 1) * (1 - p_i / P).
    p = np.random.default_rng(1).uniform(0.05, 1.0, 8)
    P = p.sum()
    np.testing.assert_allclose(stationary_exact(p, 1, 1), p * (P - p) / (p * (P - p)).sum(), rtol=0, atol=1e-12)
    for B in (1, 3):
        q = p / P + (B - 1) / 7 * (1 - p / P)
        np.testing.assert_allclose(stationary_exact(p, B, 0), q / B, rtol=0, atol=1e-12)


def rational_pi(p: list[Fraction], B: int, R: int) -> list[Fraction]:
    """pi_R in exact rational arithmetic, independently of fedmpi.participation.pi (R >= 1):
    the chain over the last R selected sets (oldest first), reached from an empty history; from a
    state, S (|S| = B) among the n_e eligible clients has probability
    sum_S p / (C(n_e - 1, B - 1) sum_eligible p); solved by Gauss-Jordan elimination over Q."""
    n = len(p)
    start: tuple = ()
    index, order, rows = {start: 0}, [start], []
    while len(rows) < len(order):
        state = order[len(rows)]
        eligible = [i for i in range(n) if not any(i in S for S in state)]
        total = sum(p[i] for i in eligible) * math.comb(len(eligible) - 1, B - 1)
        row: dict[int, Fraction] = {}
        for S in itertools.combinations(eligible, B):
            nxt = (state + (frozenset(S),))[-R:]
            if nxt not in index:
                index[nxt] = len(order)
                order.append(nxt)
            row[index[nxt]] = row.get(index[nxt], Fraction(0)) + sum(p[i] for i in S) / total
        rows.append(row)
    k = len(order)  # solve mu (P - I) = 0, sum mu = 1: unknowns mu, one equation per state
    a = [[(rows[s].get(j, Fraction(0)) - (s == j)) for s in range(k)] + [Fraction(0)] for j in range(k)]
    a[-1] = [Fraction(1)] * k + [Fraction(1)]
    for c in range(k):
        r = next(r for r in range(c, k) if a[r][c] != 0)
        a[c], a[r] = a[r], a[c]
        a[c] = [v / a[c][c] for v in a[c]]
        for r in range(k):
            if r != c and a[r][c] != 0:
                a[r] = [v - a[r][c] * w for v, w in zip(a[r], a[c])]
    mu = [a[s][-1] for s in range(k)]
    return [sum(mu[s] for s in range(k) if order[s] and i in order[s][-1]) / B for i in range(n)]


@pytest.mark.parametrize("p, B, R, expected", [
    # N = 4, B = 1, R = 2: each round picks one of the two clients outside the last two
    ((1, 2, 3, 4), 1, 2, (Fraction(13, 75), Fraction(19, 75), Fraction(21, 75), Fraction(22, 75))),
    # N = 5, B = 2, R = 1: each round picks a pair among the three clients outside the last pair
    ((Fraction(1, 10), Fraction(2, 10), Fraction(3, 10), Fraction(5, 10), Fraction(9, 10)), 2, 1,
     tuple(Fraction(v, 1680) for v in (299, 316, 331, 355, 379)))])
def test_exact_pi_against_rational_values(p, B, R, expected):
    """pi_R of two cases with R >= 1 and several eligible subsets, as exact fractions; the
    fractions were computed independently and are re-derived here over Q."""
    p = [Fraction(v) for v in p]
    assert rational_pi(p, B, R) == list(expected)
    got = stationary_exact(np.array([float(v) for v in p]), B, R)
    np.testing.assert_allclose(got, [float(v) for v in expected], rtol=0, atol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("B,R", [(1, 1), (1, 2), (2, 1), (2, 0)])
def test_monte_carlo_matches_exact(B, R):
    # Client i participates in a round with q_i = B pi_i. Over T rounds the count's binomial std
    # is sqrt(T q (1 - q)); min separation only makes participation more regular (smaller
    # variance). Allow 5 binomial std on pi_i = count / (T B).
    T = 12_000
    exact = stationary_exact(P5, B, R)
    mc = stationary_mc(P5, B, R, rounds=T, seed=4)
    q = B * exact
    tol = 5 * np.sqrt(q * (1 - q) / T) / B
    assert np.all(np.abs(mc - exact) <= tol), (mc, exact, tol)
    assert mc.sum() == pytest.approx(1.0)


def test_groups_exact_and_monte_carlo():
    # 8 clients in M = 4 groups of 2: the chain over group weights (B = 1), pi split in the group
    p = np.array([0.1, 0.3, 0.2, 0.2, 0.6, 0.1, 0.9, 0.5])
    exact = stationary_exact(p, 1, 1, groups=4)
    by_group = stationary_exact(p.reshape(4, 2).sum(axis=1), 1, 1)
    np.testing.assert_allclose(exact, np.repeat(by_group, 2) / 2, atol=1e-14)
    mc = stationary_mc(p, 1, 1, rounds=8000, seed=0, groups=4)
    q = 2 * exact  # a client participates when its group is drawn
    assert np.all(np.abs(mc - exact) <= 5 * np.sqrt(q * (1 - q) / 8000) / 2)


def test_r_is_m_minus_1_gives_uniform():
    p = np.array([0.1, 0.2, 0.4, 0.8, 0.05, 0.9])
    for B, R in ((1, 5), (2, 2), (3, 1)):
        np.testing.assert_allclose(stationary_exact(p, B, R), np.full(6, 1 / 6), atol=1e-15)
        # the sampler cycles: over a multiple of M rounds every client participates equally
        np.testing.assert_allclose(stationary_mc(p, B, R, rounds=60 * (R + 1), seed=1), np.full(6, 1 / 6))
    np.testing.assert_allclose(stationary_mc(p, 1, 2, rounds=30, seed=0, groups=3), np.full(6, 1 / 6))


def test_monotone_towards_uniform_as_r_grows():
    ls = [l1_to_uniform(stationary_exact(P5, 1, R)) for R in range(5)]
    assert all(a > b for a, b in zip(ls, ls[1:])) and ls[-1] == 0.0


def test_n_not_multiple_of_b():
    exact = stationary_exact(P5, 2, 1)  # 3 eligible clients after each round
    assert exact.sum() == pytest.approx(1.0) and np.all(exact > 0)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(1, n).flatmap(lambda b: st.tuples(st.just(b), st.integers(0, n // b - 1))),
    st.lists(st.floats(0.01, 1.0), min_size=n, max_size=n))))
def test_property_exact_pi_is_a_distribution_and_uniform_for_equal_p(case):
    n, (B, R), p = case
    pi = stationary_exact(np.array(p), B, R)
    assert pi.shape == (n,) and pi.sum() == pytest.approx(1.0, abs=1e-12) and np.all(pi > 0)
    # the paper's proposition: equal p_i => pi_R uniform for every R
    np.testing.assert_allclose(stationary_exact(np.full(n, p[0]), B, R), np.full(n, 1 / n), atol=1e-12)


def test_state_space_refusal():
    assert state_space_size(20, 1, 10) == 670_442_572_800  # 20! / 10!
    with pytest.raises(InputError, match="670,442,572,800 states.*200,000"):
        stationary_exact(np.ones(20), 1, 10)
    with pytest.raises(InputError, match="transitions"):  # one state, C(40, 10) transitions
        stationary_exact(np.ones(40), 10, 0)


def test_figure1_distance_falls_to_zero():
    p = np.random.default_rng(0).uniform(0.05, 1.0, 20)
    l1 = figure1(p, 1, [0, 5, 19], rounds=2000, seed=0)
    assert l1[0] > l1[1] > l1[2] and l1[2] == pytest.approx(0.0, abs=1e-12)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fedmpi pi")
    add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_json(capsys):
    assert run_cli(parse("--p", "1,2,3", "--B", "1", "--R", "1", "--exact", "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"pi", "l1_to_uniform"}
    np.testing.assert_allclose(out["pi"], np.array([5, 8, 9]) / 22, atol=1e-12)
    assert out["l1_to_uniform"] == pytest.approx(l1_to_uniform(np.array([5, 8, 9]) / 22))
    assert run_cli(parse("--p", "uniform:10:0.1:0.9:3", "--B", "2", "--R", "2", "--mc", "500", "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["pi"]) == 10 and sum(out["pi"]) == pytest.approx(1.0)


def test_cli_table_and_file(capsys, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("# weights\n0.1, 0.2\n0.3 0.4\n")
    assert run_cli(parse("--p-file", str(f), "--R", "3")) == 0
    out = capsys.readouterr().out
    assert "l1 distance to uniform: 0" in out and len(out.splitlines()) == 4 + 3  # title, header, 4 clients, l1


@pytest.mark.parametrize("argv,key", [
    (("--p", "1,x"), "--p"), (("--p", "1,0,2"), "--p"), (("--p", "uniform:3:0.1"), "--p"),
    (("--p", "1,2,3", "--R", "3"), "--R"), (("--p", "1,2,3", "--B", "4"), "--B"),
    (("--p", "1,2,3,4", "--groups", "3"), "--groups"), (("--p-file", "/nonexistent/p.txt"), "/nonexistent/p.txt"),
    (("--p", "uniform:20:0.1:1", "--R", "10"), "--exact"), (("--p", "1,2", "--mc", "0"), "--mc"),
])
def test_cli_bad_arguments(argv, key):
    with pytest.raises(InputError, match=f"^{key}:"):
        run_cli(parse(*argv))
