"""Sporadicity probabilities, per-iteration indicators, and the emulated delay."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedmpi.config import ProbDistConfig, SporadicityConfig, TopologyConfig
from fedmpi.decentral.delay import iteration_delay
from fedmpi.decentral.sporadicity import Indicators, draw_probabilities
from fedmpi.decentral.topology import build_graph, make_graph
from fedmpi.errors import InputError

GRAPH = build_graph(TopologyConfig(kind="rgg", radius=0.4), 40, 0)


def spor(sgd=None, link=None, **kw):
    return SporadicityConfig(sgd_prob=sgd or ProbDistConfig(), link_prob=link or ProbDistConfig(), **kw)


def test_probability_ranges():
    d, b = draw_probabilities(spor(), GRAPH, 0)
    assert d.shape == (40,) and b.shape == (GRAPH.num_edges,)
    assert np.all((d > 0) & (d <= 1)) and np.all((b > 0) & (b <= 1))
    d, b = draw_probabilities(spor(ProbDistConfig(dist="uniform", lo=0.2, hi=0.6),
                                   ProbDistConfig(dist="uniform", lo=0.0, hi=1.0)), GRAPH, 0)
    assert np.all((d > 0.2) & (d <= 0.6)) and np.all((b > 0) & (b <= 1))
    d, b = draw_probabilities(spor(ProbDistConfig(dist="fixed", value=0.3),
                                   ProbDistConfig(dist="uniform", lo=0.5, hi=0.5)), GRAPH, 0)
    assert np.all(d == 0.3) and np.all(b == 0.5)
    with pytest.raises(InputError, match=r"^sporadicity\.link_prob\.lo: must be <= hi"):
        draw_probabilities(spor(link=ProbDistConfig(dist="uniform", lo=0.7, hi=0.2)), GRAPH, 0)


def test_probabilities_are_per_seed_and_per_epoch():
    d0, b0 = draw_probabilities(spor(), GRAPH, 3)
    d1, b1 = draw_probabilities(spor(), GRAPH, 3)
    assert np.array_equal(d0, d1) and np.array_equal(b0, b1)
    assert not np.array_equal(draw_probabilities(spor(), GRAPH, 4)[0], d0)
    assert not np.array_equal(draw_probabilities(spor(), GRAPH, 3, epoch=1)[0], d0)
    ind = Indicators(spor(redraw_every=10), GRAPH, 3)
    assert np.array_equal(ind.probabilities(9)[0], d0)
    assert np.array_equal(ind.probabilities(10)[0], draw_probabilities(spor(), GRAPH, 3, epoch=1)[0])
    assert np.array_equal(Indicators(spor(), GRAPH, 3).probabilities(10**6)[0], d0)


def binomial_ok(freq, p, n, z=5.0):
    """Within z standard deviations, plus 3 counts of slack for p near 0 or 1 (normal approx. fails there)."""
    return np.all(np.abs(freq - p) <= z * np.sqrt(p * (1 - p) / n) + 3 / n)


def frequencies(ind, n):
    v, e = zip(*(ind.draw(k) for k in range(n)))
    return np.mean(v, 0), np.mean(e, 0)


def test_indicator_frequencies_match_probabilities():
    n = 3000
    ind = Indicators(spor(), GRAPH, 1)
    d, b = ind.probabilities()
    fv, fe = frequencies(ind, n)
    assert binomial_ok(fv, d, n) and binomial_ok(fe, b, n)
    v1, e1 = Indicators(spor(), GRAPH, 1).draw(7)  # another instance (rank) draws the same
    assert np.array_equal(v1, ind.draw(7)[0]) and np.array_equal(e1, ind.draw(7)[1])
    assert not np.array_equal(ind.draw(8)[1], e1)


def test_per_endpoint_links_fire_with_one_minus_square():
    n = 3000
    ind = Indicators(spor(link_draw="per_endpoint"), GRAPH, 2)
    _, b = ind.probabilities()
    _, fe = frequencies(ind, n)
    assert binomial_ok(fe, 1 - (1 - b) ** 2, n)


def test_force_flags_keep_drawn_probabilities():
    ind = Indicators(spor(), GRAPH, 5, force_sgd=True, force_links=True)
    v, e = ind.draw(0)
    assert v.all() and e.all() and e.shape == (GRAPH.num_edges,)
    d, b = ind.probabilities(0)
    assert np.array_equal(d, draw_probabilities(spor(), GRAPH, 5)[0]) and d.max() < 1
    v, e = Indicators(spor(), GRAPH, 5, force_sgd=True).draw(0)
    assert v.all() and not e.all()


def test_delay_on_a_hand_made_path():
    # path 0 - 1 - 2: deg = (1, 2, 1); d = (0.5, 0.25, 1); b_01 = 0.5, b_12 = 0.2
    g = make_graph(3, np.array([[0, 1], [1, 2]]))
    d, b = np.array([0.5, 0.25, 1.0]), np.array([0.5, 0.2])
    v, ve = np.array([1, 0, 1], bool), np.array([1, 1], bool)
    # processing  = (1/3) (1/0.5 + 0 + 1/1) = 1
    # transmission = (1/3) [ 1/0.5  +  (1/2)(1/0.5 + 1/0.2)  +  1/0.2 ] = (1/3)(2 + 3.5 + 5) = 3.5
    assert iteration_delay(v, ve, d, b, g) == pytest.approx((1.0, 3.5))
    # normalized: divided by the all-active delay (1/3)(2 + 4 + 1) + 3.5 = 35/6
    assert iteration_delay(v, ve, d, b, g, "normalized") == pytest.approx((6 / 35, 3.5 * 6 / 35))
    assert iteration_delay(np.zeros(3, bool), np.array([0, 1], bool), d, b, g) == pytest.approx((0.0, 2.5))


def test_raw_delay_has_unit_expected_parts():
    cfg = spor(ProbDistConfig(dist="uniform", lo=0.3, hi=1.0), ProbDistConfig(dist="uniform", lo=0.3, hi=1.0))
    ind = Indicators(cfg, GRAPH, 0)
    d, b = ind.probabilities()
    parts = np.array([iteration_delay(*ind.draw(k), d, b, GRAPH) for k in range(2000)])
    assert np.allclose(parts.mean(0), [1.0, 1.0], atol=0.05)


# ----------------------------------------------------------------------------- the drawn distributions

RING = make_graph(6000, np.stack([np.arange(6000), (np.arange(6000) + 1) % 6000], 1))  # 6000 d_i and 6000 b_ij


def ks_distance(sample: np.ndarray, cdf) -> float:
    """Kolmogorov-Smirnov statistic sup_x |F_n(x) - F(x)|."""
    x = np.sort(sample)
    n = len(x)
    f = cdf(x)
    return float(max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n)))


def beta_cdf_integer(a: int, b: int):
    """I_x(a, b) for integer a, b: P(Binomial(a + b - 1, x) >= a)."""
    n = a + b - 1
    return lambda x: sum(math.comb(n, j) * x ** j * (1 - x) ** (n - j) for j in range(a, n + 1))


ARCSINE = lambda x: 2 / np.pi * np.arcsin(np.sqrt(x))  # noqa: E731  Beta(0.5, 0.5), the paper's FMNIST setting


@pytest.mark.parametrize("a, b, cdf", [(0.5, 0.5, ARCSINE), (2.0, 5.0, beta_cdf_integer(2, 5))])
def test_beta_draws_follow_beta_by_ks(a, b, cdf):
    """d_i and b_ij ~ Beta(a, b): KS distance below the 0.1% critical value 1.95 / sqrt(n).
    U(0, 1] would be 0.10 away from Beta(0.5, 0.5) (6000 draws: 7.7 / sqrt(n))."""
    beta = ProbDistConfig(dist="beta", a=a, b=b)
    d, e = draw_probabilities(spor(beta, beta), RING, 7)
    for sample in (d, e):
        assert ks_distance(sample, cdf) < 1.95 / np.sqrt(len(sample))
    assert ks_distance(np.random.default_rng(0).random(6000), cdf) > 5 / np.sqrt(6000)  # the test can see U(0,1)


def test_beta_draws_have_beta_moments():
    """Beta(0.8, 0.8) (the paper's CIFAR-10 setting): mean 1/2 and variance ab / ((a+b)^2 (a+b+1))
    = 0.0962 (U(0, 1): 0.0833), within 4 standard errors of the sample moments."""
    a = b = 0.8
    beta = ProbDistConfig(dist="beta", a=a, b=b)
    mean, var = a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))
    for sample in draw_probabilities(spor(beta, beta), RING, 11):
        n = len(sample)
        assert abs(sample.mean() - mean) < 4 * np.sqrt(var / n)
        centred = sample - sample.mean()
        se_var = np.sqrt((np.mean(centred ** 4) - centred.var() ** 2) / n)
        assert abs(sample.var() - var) < 4 * se_var
        assert abs(sample.var() - 1 / 12) > 4 * se_var  # U(0, 1] would fail here
