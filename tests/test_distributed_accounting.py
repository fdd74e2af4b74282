"""The accounting of distributed noise cross-checked (#45 item 2, docs/PRIVACY.md "Distributed noise",
"Cross-check"): fedmpi's bounds against the exact Renyi divergences of the noise they bound (computed
here by brute force in the log domain), and fedmpi's accountant against the papers' formulas as the
authors' reference code states them, re-derived here in that code's units (real units, gamma = 1 / s,
local standard deviations, tensorflow-privacy's conversion), not fedmpi's (integer units, the summed
variance, dp-accounting's conversion).

The reference: google-research/federated, distributed_dp/accounting_utils.py (``rounded_l2_norm_bound``,
``compute_rdp_dgaussian``, ``ddgauss_epsilon``, ``_skellam_rdp``, ``skellam_epsilon``), the code of
Kairouz, Liu, Steinke (ICML 2021) and Agarwal, Kairouz, Liu (NeurIPS 2021). Neither it nor
tensorflow-federated's distributed_dp_test.py nor tensorflow-privacy's distributed query tests state
an epsilon, so the numbers compared are the formulas' on the papers' settings (the DDG paper's EMNIST
run: 100 clients a round, clip 0.03, beta = exp(-0.5), d = 2^20, 1500 rounds)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedmpi.participation import Sampling
from fedmpi.privacy import discrete
from fedmpi.privacy.distributed import DistributedParams
from fedmpi.privacy.run import Privacy
from fedmpi.runtime import World

pytest.importorskip("dp_accounting")


# ---------------------------------------------------------------- exact divergences, by brute force
def log_convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log of the convolution of two laws given by their log-pmfs on consecutive integers."""
    out = np.full(len(a) + len(b) - 1, -np.inf)
    for j, x in enumerate(a):
        out[j:j + len(b)] = np.logaddexp(out[j:j + len(b)], x + b)
    return out


def shifted_renyi(logp: np.ndarray, shift: int, alpha: float, reach: int) -> float:
    """D_alpha(P(. - shift) || P) for a law on [-h, h] (log-pmf ``logp``), summed over |z| <= reach."""
    h = (len(logp) - 1) // 2
    z = np.arange(-reach, reach + 1)
    terms = alpha * logp[h + z - shift] + (1 - alpha) * logp[h + z]
    top = terms.max()
    return float(top + np.log(np.exp(terms - top).sum())) / (alpha - 1)


def discrete_gaussian_sum(local_var: float, n: int, half: int) -> np.ndarray:
    """The log-pmf of the sum of n independent N_Z(0, local_var), each cut at |z| <= half (the mass
    beyond is below exp(-half^2 / (2 local_var)), nothing at the variances used here)."""
    z = np.arange(-half, half + 1, dtype=np.float64)
    one = -z * z / (2 * local_var)
    one -= np.logaddexp.reduce(one)
    out = one
    for _ in range(n - 1):
        out = log_convolve(out, one)
    return out


def skellam_law(var: float, half: int) -> np.ndarray:
    """The log-pmf of Poisson(var / 2) - Poisson(var / 2) on [-half, half] (each count cut at ``half``)."""
    k = np.arange(half + 1, dtype=np.float64)
    mu = var / 2
    poisson = k * math.log(mu) - mu - np.array([math.lgamma(x + 1) for x in k])
    return log_convolve(poisson, poisson[::-1])[:2 * half + 1]


@pytest.mark.parametrize("local_var, n", [(0.1, 3), (0.1, 6), (0.5, 4), (1.0, 5), (4.0, 3)])
def test_ddg_bound_covers_the_exact_divergence_of_a_sum_of_discrete_gaussians(local_var, n):
    """DDG Proposition 14 with Theorem 1's tau (``ddg_rdp``, ``ddg_tau``) against the exact Renyi
    divergence of the sum of n discrete Gaussians shifted by an integer Delta (one coordinate: L1 =
    L2 = Delta): never below it. Where the shares are wide (local variance 4, tau ~ 1e-16) the bound
    is the Gaussian's alpha Delta^2 / (2 V) and the exact value equals it (Canonne, Kamath, Steinke:
    equality for integer shifts); where they are narrow (0.1) the exact value is above the
    Gaussian's, the case tau pays for."""
    law = discrete_gaussian_sum(local_var, n, half=60)
    reach = (len(law) - 1) // 2 - 10
    var, tau = n * local_var, discrete.ddg_tau(local_var, n)
    above_gauss = 0
    for shift in (1, 2, 4):
        for alpha in (2.0, 4.0, 8.0, 16.0):
            if alpha * shift + 8 * math.sqrt(var) > reach / 2:
                continue  # the divergence's mass sits near alpha Delta: keep it well inside the support
            exact = shifted_renyi(law, shift, alpha, reach - shift)
            bound = float(discrete.ddg_rdp(np.array([alpha]), shift / math.sqrt(var), shift / math.sqrt(var),
                                           tau, 1)[0])
            gauss = alpha * shift ** 2 / (2 * var)
            assert exact <= bound * (1 + 1e-9), (shift, alpha, exact, bound)
            if local_var >= 4:
                assert math.isclose(exact, gauss, rel_tol=1e-9) and math.isclose(bound, gauss, rel_tol=1e-9)
            above_gauss += exact > gauss * 1.01
    if local_var <= 0.1:
        assert above_gauss, "narrow shares: the sum is no discrete Gaussian, its divergence exceeds the Gaussian's"


@pytest.mark.parametrize("var", [2.0, 10.0, 50.0, 400.0, 5000.0])
def test_skellam_bound_covers_the_exact_divergence_and_is_tight(var):
    """Agarwal et al.'s bound (``skellam_rdp``) against the exact Renyi divergence of a Skellam law of
    variance V shifted by an integer: never below it, in one coordinate (L1 = L2 = Delta) and for a
    vector (the exact divergence of a product law is the sum over its coordinates; the bound takes
    the vector's L2 and L1 norms); within 0.05% of it at V = 5000 (the bound tends to the exact value
    as V grows: measured 0.018%)."""
    half = int(40 * math.sqrt(var)) + 400
    law = skellam_law(var, half)
    reach = half - 40
    worst = 0.0
    for shift in (1, 3, 10):
        for alpha in (2.0, 8.0, 32.0):
            if alpha * shift + 10 * math.sqrt(var) + 10 * shift > reach / 2:
                continue
            exact = shifted_renyi(law, shift, alpha, reach)
            bound = float(discrete.skellam_rdp(np.array([alpha]), shift, shift, var)[0])
            assert exact <= bound, (shift, alpha, exact, bound)
            worst = max(worst, exact / bound)
    vector = np.array([3, 1, 2])
    for alpha in (2.0, 8.0):
        exact = sum(shifted_renyi(law, int(v), alpha, reach) for v in vector)
        bound = float(discrete.skellam_rdp(np.array([alpha]), float(np.linalg.norm(vector)),
                                           float(np.abs(vector).sum()), var)[0])
        assert exact <= bound, (alpha, exact, bound)
    if var >= 5000:
        assert worst > 0.9995, worst


# ---------------------------------------------------------------- the reference code's formulas
def reference_epsilon(orders: list[int], rdp: list[float], delta: float) -> float:
    """The RDP -> (epsilon, delta) conversion tensorflow-privacy's ``get_privacy_spent`` applies
    (Canonne, Kamath, Steinke 2020, Proposition 12): min over orders of rdp + log1p(-1 / a)
    - (log delta + log a) / (a - 1)."""
    a = np.asarray(orders, dtype=np.float64)
    return float(max(0.0, np.min(np.asarray(rdp) + np.log1p(-1 / a) - (math.log(delta) + np.log(a)) / (a - 1))))


def reference_rounded_l2(l2: float, beta: float, dim: int) -> float:
    """DDG Theorem 1, as ``rounded_l2_norm_bound`` writes it (the scaled norm in, the bound out)."""
    plain = l2 + math.sqrt(dim)
    if beta == 0:
        return plain
    return min(plain, math.sqrt(l2 ** 2 + dim / 4 + math.sqrt(2 * math.log(1 / beta)) * (l2 + math.sqrt(dim) / 2)))


def reference_ddgauss(gamma: float, local_stddev: float, clients: int, clip: float, beta: float, dim: int,
                      steps: int, delta: float, orders: list[int]) -> float:
    """``ddgauss_epsilon`` at sampling rate 1: the norms rounded at scale 1 / gamma and brought back to
    real units; tau of ``clients`` shares of std local_stddev / gamma; Proposition 14's three terms in
    units of the summed noise's std sqrt(n) local_stddev."""
    scale = 1 / gamma
    l2 = reference_rounded_l2(clip * scale, beta, dim) / scale
    l1 = l2 * scale * min(math.sqrt(dim), l2 * scale) / scale
    tau = 10 * sum(math.exp(-2 * (math.pi * local_stddev * scale) ** 2 * k / (k + 1)) for k in range(1, clients))
    a2, a1 = l2 / (math.sqrt(clients) * local_stddev), l1 / (math.sqrt(clients) * local_stddev)
    rdp = [steps * min(a / 2 * a2 ** 2 + tau * dim, a / 2 * (a2 ** 2 + 2 * a1 * tau + tau ** 2 * dim),
                       a / 2 * (a2 + math.sqrt(dim) * tau) ** 2) for a in orders]
    return reference_epsilon(orders, rdp, delta)


def reference_skellam(scale: float, central_stddev: float, clip: float, beta: float, dim: int, steps: int,
                      delta: float, orders: list[int]) -> float:
    """``skellam_epsilon`` at sampling rate 1 (``_skellam_rdp``: real-unit sensitivities, the
    central variance mu, the scale s): alpha l2^2 / (2 mu) + min(((2 alpha - 1) s l2^2 + 6 l1) /
    (4 s^3 mu^2), 3 l1 / (2 s mu))."""
    l2 = reference_rounded_l2(clip * scale, beta, dim) / scale
    l1 = l2 * scale * min(math.sqrt(dim), l2 * scale) / scale
    mu, s = central_stddev ** 2, scale
    rdp = [steps * (a / (2 * mu) * l2 ** 2 + min(((2 * a - 1) * s * l2 ** 2 + 6 * l1) / (4 * s ** 3 * mu ** 2),
                                                3 * l1 / (2 * s * mu))) for a in orders]
    return reference_epsilon(orders, rdp, delta)


def padded(dim: int) -> int:
    """The Hadamard transform's width, the reference's ``padded_dim`` for rotation 'hd'."""
    return 2 ** math.ceil(math.log2(dim))


#: the reference code's orders (``RDP_ORDERS``): fedmpi's are these and a few more
REFERENCE_ORDERS = [*range(2, 129), 256]

#: (sigma, clip, dim, bits, clients a round, clients in all, beta, rounds, delta): the DDG paper's EMNIST
#: setting (its README's run: clip 0.03, delta 1 / 3400 clients) at 16 and 12 bits, a small model, a
#: low-noise many-client case, plain randomized rounding, and 9 bits for 100 clients, where the shares
#: are narrow (variance ~1) and tau d' is 0.07 a round; a cohort of 50 of 500 clients (tau d' of 500 shares: 1.2)
SETTINGS = [
    (1.0, 0.03, 2 ** 20, 16, 100, 100, math.exp(-0.5), 1500, 1 / 3400),
    (1.0, 0.03, 2 ** 20, 12, 100, 100, math.exp(-0.5), 1500, 1 / 3400),
    (0.8, 1.0, 64, 14, 4, 4, 0.0, 20, 1e-6),
    (0.05, 1.0, 1024, 20, 1000, 1000, math.exp(-0.5), 10, 1e-5),
    (2.0, 0.5, 4096, 18, 50, 50, 0.0, 300, 1e-5),
    (1.0, 1.0, 256, 9, 100, 100, 0.0, 10, 1e-5),
    (1.0, 1.0, 256, 9, 50, 500, 0.0, 10, 1e-5),
    (8.984, 1.0, 7850, 16, 100, 1000, math.exp(-0.5), 50, 1e-6),  # docs/REPRODUCTION.md's 16-bit row
]


def accountant(mechanism: str, sigma: float, clip: float, dim: int, bits: int, cohort: int, m: int,
               beta: float) -> Privacy:
    params = DistributedParams(mechanism, clip, sigma, bits=bits, beta=beta)
    return Privacy(params, Sampling("none", float(cohort)), 1, 3, dim, World(), m=m)


@pytest.mark.parametrize("sigma, clip, dim, bits, cohort, m, beta, rounds, delta", SETTINGS)
def test_ddg_accountant_equals_the_reference_formulas(sigma, clip, dim, bits, cohort, m, beta, rounds, delta):
    """fedmpi's epsilon for ``distributed_dgauss`` (its scale, Delta_2, tau of m shares, dp-accounting's
    conversion) equals the reference's ``ddgauss_epsilon`` at gamma = C / (C s), local_stddev = sigma C /
    sqrt(n) and n = m clients, on the reference's orders, to 1e-9; with tau of the cohort's n < m
    shares, as the reference counts them, fedmpi's is no smaller (it takes the most a round can hold)."""
    priv = accountant("distributed_dgauss", sigma, clip, dim, bits, cohort, m, beta)
    mech = priv.mechanism
    cs = mech.scale(sigma, cohort)  # the clip in integer units
    orders, rdp = mech.rdp(priv.sampling, sigma, rounds)
    keep = np.isin(orders, REFERENCE_ORDERS)
    ours = discrete.epsilon(orders[keep], rdp[keep], delta)
    gamma = clip / cs
    want = reference_ddgauss(gamma, sigma * clip / math.sqrt(m), m, clip, beta, padded(dim), rounds, delta,
                             REFERENCE_ORDERS)
    assert math.isclose(ours, want, rel_tol=1e-9), (ours, want)
    assert discrete.epsilon(orders, rdp, delta) <= ours  # fedmpi's extra orders only lower it
    if m > 2:
        smaller = accountant("distributed_dgauss", sigma, clip, dim, bits, cohort, m // 2, beta)
        o, r = smaller.mechanism.rdp(smaller.sampling, sigma, rounds)
        assert discrete.epsilon(o[keep], r[keep], delta) <= ours


@pytest.mark.parametrize("sigma, clip, dim, bits, cohort, m, beta, rounds, delta", SETTINGS)
def test_skellam_accountant_equals_the_reference_formulas(sigma, clip, dim, bits, cohort, m, beta, rounds, delta):
    """fedmpi's epsilon for ``distributed_skellam`` equals the reference's ``skellam_epsilon`` at scale
    s = C s / C and central_stddev = sigma C, on the reference's orders, to 1e-9."""
    priv = accountant("distributed_skellam", sigma, clip, dim, bits, cohort, m, beta)
    mech = priv.mechanism
    cs = mech.scale(sigma, cohort)
    orders, rdp = mech.rdp(priv.sampling, sigma, rounds)
    keep = np.isin(orders, REFERENCE_ORDERS)
    ours = discrete.epsilon(orders[keep], rdp[keep], delta)
    want = reference_skellam(cs / clip, sigma * clip, clip, beta, padded(dim), rounds, delta, REFERENCE_ORDERS)
    assert math.isclose(ours, want, rel_tol=1e-9), (ours, want)



@pytest.mark.parametrize("mechanism", ["distributed_dgauss", "distributed_skellam"])
@pytest.mark.parametrize("bits, sigma", [(12, 14.58), (16, 8.984), (20, 8.969)])
def test_the_reproduction_tables_noise_is_epsilon_4_by_the_reference_formulas(mechanism, bits, sigma):
    """docs/REPRODUCTION.md "Distributed noise against bits" calibrated sigma to epsilon 4 (Fashion-MNIST:
    d = 7850, 100 clients a round of 1000, 50 rounds, clip 1, beta exp(-0.5), delta 1e-6) with fedmpi's
    accountant; at the table's sigmas (4 digits) the reference's formulas give epsilon 4 to 1e-3."""
    priv = accountant(mechanism, sigma, 1.0, 7850, bits, 100, 1000, math.exp(-0.5))
    cs = priv.mechanism.scale(sigma, 100)
    if mechanism == "distributed_dgauss":
        eps = reference_ddgauss(1 / cs, sigma / math.sqrt(1000), 1000, 1.0, math.exp(-0.5), 8192, 50, 1e-6,
                                REFERENCE_ORDERS)
    else:
        eps = reference_skellam(cs, sigma, 1.0, math.exp(-0.5), 8192, 50, 1e-6, REFERENCE_ORDERS)
    assert abs(eps - 4) < 1e-3, eps
