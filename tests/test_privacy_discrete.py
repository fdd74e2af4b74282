"""Distributed noise's pure functions (fedmpi/privacy/discrete.py, docs/PRIVACY.md "Distributed noise"):
the samplers' distributions, the rotation, conditional rounding, the modulus, and the accounting
against dp-accounting's Gaussian and the papers' bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedmpi import rng
from fedmpi.privacy import discrete

dp = pytest.importorskip("dp_accounting")

DRAWS = 200_000


def gen(*counters: int) -> np.random.Generator:
    return rng.generator(3, "test_discrete", *counters)


# ---------------------------------------------------------------- samplers
@pytest.mark.parametrize("var", [0.3, 1.0, 2.5, 9.0])
def test_discrete_gaussian_matches_its_pmf_on_small_cases(var):
    """The empirical law of 2e5 draws is within 0.01 in total variation of exp(-z^2 / 2 var) / norm
    (a rounded continuous Gaussian of variance 0.3 is 0.05 away; the sampling error here is ~0.003)."""
    z = discrete.discrete_gaussian(gen(1, int(var * 10)), var, DRAWS)
    support = np.arange(z.min(), z.max() + 1)
    counts = np.bincount(z - z.min()) / DRAWS
    pmf = discrete.discrete_gaussian_pmf(var, support)
    tv = 0.5 * (np.abs(counts - pmf).sum() + (1 - pmf.sum()))
    assert tv < 0.01, tv
    rounded = np.round(gen(2).normal(0, math.sqrt(0.3), DRAWS)).astype(np.int64)
    if var == 0.3:  # the test tells the discrete Gaussian from a rounded Gaussian
        r = np.bincount(rounded - support[0], minlength=len(support))[:len(support)] / DRAWS
        assert 0.5 * np.abs(r - pmf).sum() > 0.03


@pytest.mark.parametrize("var", [4.0, 100.0, 1e4])
def test_discrete_gaussian_moments(var):
    """Mean 0; the variance is var up to exp(-2 pi^2 var) for var >= 1 (CKS, Fact 20), checked to 4
    standard errors; symmetric."""
    z = discrete.discrete_gaussian(gen(3, int(var)), var, DRAWS).astype(np.float64)
    se = math.sqrt(var / DRAWS)
    assert abs(z.mean()) < 4 * se
    assert abs(z.var() / var - 1) < 4 * math.sqrt(2 / DRAWS)
    assert abs((z ** 3).mean()) < 4 * math.sqrt(15 * var ** 3 / DRAWS)


def test_samplers_are_pure_functions_of_their_key():
    a = discrete.discrete_gaussian(gen(4), 7.0, 1000)
    assert np.array_equal(a, discrete.discrete_gaussian(gen(4), 7.0, 1000))
    assert not np.array_equal(a, discrete.discrete_gaussian(gen(5), 7.0, 1000))
    assert np.array_equal(discrete.skellam(gen(4), 7.0, 10), discrete.skellam(gen(4), 7.0, 10))
    assert not discrete.discrete_gaussian(gen(4), 0.0, 5).any() and not discrete.skellam(gen(4), 0.0, 5).any()


@pytest.mark.parametrize("var", [0.5, 8.0, 300.0])
def test_skellam_moments_and_its_law(var):
    """Skellam(var / 2, var / 2): mean 0, variance var, fourth cumulant var (excess kurtosis 1 / var),
    and P(0) = exp(-var) I_0(var) (the modified Bessel function, by its series)."""
    z = discrete.skellam(gen(6, int(var)), var, DRAWS).astype(np.float64)
    assert abs(z.mean()) < 4 * math.sqrt(var / DRAWS)
    assert abs(z.var() / var - 1) < 5 * math.sqrt((2 + 1 / var) / DRAWS)
    k4 = (z ** 4).mean() - 3 * z.var() ** 2
    assert abs(k4 - var) < 0.1 * var + 6 * math.sqrt(96 * var ** 4 / DRAWS)
    if var <= 8:
        i0 = sum((var / 2) ** (2 * j) / math.factorial(j) ** 2 for j in range(60))
        assert abs((z == 0).mean() - math.exp(-var) * i0) < 4 * math.sqrt(0.25 / DRAWS)


# ---------------------------------------------------------------- the rotation
def test_hadamard_is_the_orthonormal_sylvester_matrix():
    d = 8
    H = np.array([[1.0]])
    while H.shape[0] < d:
        H = np.block([[H, H], [H, -H]])
    x = torch.from_numpy(gen(7).normal(size=(3, d)))
    torch.testing.assert_close(discrete.hadamard(x), x @ torch.from_numpy(H / math.sqrt(d)).T)
    torch.testing.assert_close(discrete.hadamard(discrete.hadamard(x)), x)
    with pytest.raises(ValueError, match="power of two"):
        discrete.hadamard(torch.zeros(2, 6))


def test_rotation_pads_keeps_norms_and_inverts():
    x = torch.from_numpy(gen(8).normal(size=(4, 21)))
    signs = torch.from_numpy(1.0 - 2.0 * (gen(9).random(discrete.padded(21)) < 0.5))
    y = discrete.rotate(x, signs)
    assert y.shape == (4, 32) and discrete.padded(32) == 32 and discrete.padded(1) == 1
    torch.testing.assert_close(torch.linalg.vector_norm(y, dim=1), torch.linalg.vector_norm(x, dim=1))
    torch.testing.assert_close(discrete.unrotate(y, signs, 21), x)


# ---------------------------------------------------------------- rounding, scale, modulus
def test_randomized_rounding_is_unbiased_and_conditional_rounding_bounded():
    x = gen(10).normal(size=64) * 3
    draws = np.stack([discrete.conditional_round(gen(11, j), x, 1e9) for j in range(4000)])
    assert np.all((draws == np.floor(x)) | (draws == np.floor(x) + 1))
    assert np.abs(draws.mean(0) - x).max() < 4 * 0.5 / math.sqrt(4000)
    beta = math.exp(-0.5)
    bound = discrete.rounded_l2(float(np.linalg.norm(x)), 64, beta)
    assert bound < discrete.rounded_l2(float(np.linalg.norm(x)), 64, 0.0) == np.linalg.norm(x) + 8
    z = [discrete.conditional_round(gen(12, j), x, bound) for j in range(200)]
    assert max(np.linalg.norm(v) for v in z) <= bound
    with pytest.raises(ValueError, match="no rounding within norm"):
        discrete.conditional_round(gen(13), x, 0.1)
    assert discrete.rounded_l1(10.0, 64) == 80.0 and discrete.rounded_l1(3.0, 64) == 9.0


def test_scale_fits_k_standard_deviations_of_the_sum_in_the_bits():
    """2^bits = 2 k sqrt(c^2 n^2 / d + (gamma^2 / 4 + sigma^2) n) / gamma at gamma = 1 / s."""
    k = discrete.stddevs(1e-4)
    assert abs(k - 3.8906) < 1e-4  # the two-sided normal quantile TFF uses for 1e-4
    s = discrete.scale_factor(0.3, 1.0, 16, 50, 1024, k)
    gamma = 1 / s
    assert math.isclose(2 * k * math.sqrt(50 ** 2 / 1024 + (gamma ** 2 / 4 + 0.09) * 50) / gamma, 2 ** 16)
    with pytest.raises(ValueError, match="cannot hold"):
        discrete.scale_factor(0.3, 1.0, 2, 50, 1024, k)


def test_centred_modulus_and_wrap_bound():
    z = torch.tensor([-9, -8, -1, 0, 7, 8, 300], dtype=torch.int64)
    assert discrete.centred(z, 4).tolist() == [7, -8, -1, 0, 7, -8, -4]
    assert torch.equal(discrete.centred(torch.remainder(z, 16), 4), discrete.centred(z, 4))
    few = discrete.wrap_bound(10, 1024, 100.0, 400.0, 10, 0.0, False)  # a = 512, v = 1000^2 / 1024 + 2.5 + 400
    assert math.isclose(few, 2048 * math.exp(-512 ** 2 / (2 * (1000 ** 2 / 1024 + 402.5))))
    assert 0 < few < discrete.wrap_bound(10, 1024, 100.0, 400.0, 10, 0.0, True) < 1e-30
    assert few < discrete.wrap_bound(10, 1024, 100.0, 400.0, 10, 0.5, False) == few / 0.5 ** 10
    assert discrete.wrap_bound(10, 1024, 100.0, 400.0, 8, 0.0, False) == 1.0
    assert discrete.wrap_bound(0, 1024, 100.0, 400.0, 16, 0.0, False) == 0.0


# ---------------------------------------------------------------- accounting
def test_one_discrete_gaussian_is_accounted_as_dp_accountings_gaussian():
    """n = 1: tau = 0 and DDG's bound is the Gaussian's alpha Delta^2 / (2 sigma^2) (CKS: the discrete
    Gaussian's concentrated DP equals the continuous one's); over 20 rounds at sigma 1.2 its epsilon is
    dp-accounting's for 20 x Gaussian(1.2) on the same (integer) orders, and within 2% of the library's
    own orders (fractional ones too, which the papers' bounds are not used at)."""
    assert discrete.ddg_tau(4.0, 1) == 0.0
    rdp = 20 * discrete.ddg_rdp(discrete.ORDERS, 1 / 1.2, math.sqrt(64) / 1.2, 0.0, 64)
    ours = discrete.epsilon(discrete.ORDERS, rdp, 1e-5)
    same = dp.rdp.RdpAccountant(orders=discrete.ORDERS)
    same.compose(dp.GaussianDpEvent(1.2), 20)
    assert math.isclose(ours, same.get_epsilon(1e-5), rel_tol=1e-12)
    lib = dp.rdp.RdpAccountant()
    lib.compose(dp.GaussianDpEvent(1.2), 20)
    assert lib.get_epsilon(1e-5) <= ours < lib.get_epsilon(1e-5) * 1.02


def test_ddg_tau_and_its_bound():
    """tau = 10 sum_{k<n} exp(-2 pi^2 s2 k / (k + 1)) by hand for n = 3, s2 = 0.1; it grows with n and
    with it the RDP, and at tau = 0 the three branches of Proposition 14 coincide on the Gaussian's."""
    s2 = 0.1
    by_hand = 10 * (math.exp(-2 * math.pi ** 2 * s2 / 2) + math.exp(-2 * math.pi ** 2 * s2 * 2 / 3))
    assert math.isclose(discrete.ddg_tau(s2, 3), by_hand)
    assert discrete.ddg_tau(s2, 3) < discrete.ddg_tau(s2, 30)
    a = np.array([2.0, 8.0])
    low, high = (discrete.ddg_rdp(a, 0.5, 4.0, discrete.ddg_tau(s2, n), 16) for n in (3, 30))
    assert np.all(low < high)
    torch.testing.assert_close(torch.from_numpy(discrete.ddg_rdp(a, 0.5, 4.0, 0.0, 16)),
                               torch.from_numpy(a * 0.125))
    # the branches: tau d = 16 tau; alpha / 2 (l2^2 + 2 l1 tau + tau^2 d); alpha / 2 (l2 + 4 tau)^2
    tau = 0.01
    want = np.minimum.reduce([a * 0.125 + 16 * tau, a / 2 * (0.25 + 8 * tau + 16 * tau ** 2),
                              a / 2 * (0.5 + 4 * tau) ** 2])
    assert np.allclose(discrete.ddg_rdp(a, 0.5, 4.0, tau, 16), want)


def test_skellam_rdp_is_the_papers_bound_and_tends_to_the_gaussian():
    """Agarwal et al.'s bound in integer units: alpha D2^2 / (2 mu) + min(((2 alpha - 1) D2^2 + 6 D1) /
    (4 mu^2), 3 D1 / (2 mu)), by hand at alpha 3, D2 10, D1 40, mu 400; as mu grows (the scale
    finer) with D2 / sqrt(mu) fixed it tends to the Gaussian's alpha (D2 / sqrt(mu))^2 / 2 from above."""
    by_hand = 3 * 100 / 800 + min((5 * 100 + 240) / (4 * 400 ** 2), 120 / 800)
    assert math.isclose(float(discrete.skellam_rdp(np.array([3.0]), 10, 40, 400)[0]), by_hand)
    gauss = discrete.ORDERS * 0.5
    gaps = [discrete.skellam_rdp(discrete.ORDERS, c, c * 8, c * c) - gauss for c in (10.0, 100.0, 1000.0)]
    assert np.all(gaps[0] > gaps[1]) and np.all(gaps[1] > gaps[2]) and np.all(gaps[2] > 0)
    assert gaps[2].max() < 1e-2
