"""Distributed noise on the integer lattice: the pure functions (docs/PRIVACY.md, "Distributed noise").

The distributed discrete Gaussian (Kairouz, Liu, Steinke, ICML 2021, "DDG") and the distributed
Skellam mechanism (Agarwal, Kairouz, Liu, NeurIPS 2021) make a sum private without trusting the
server with it: each client turns its clipped update x (||x|| <= c) into integers and adds its
share of discrete noise, and only the sum modulo 2^bits is revealed (secure aggregation, or in
emulation the plain modular sum). One client's part, in the papers' order:

    x  <- H D pad(x) / sqrt(d')          randomized Hadamard rotation, D = diag(+-1) keyed by the round
                                         (every client the same D), d' the next power of two
    x  <- x / gamma                      scaling (``scale_factor``: the sum fits the bits w.p. 1 - p)
    z  <- round(x)                       randomized rounding, redrawn until ||z|| <= the inflated
                                         bound (``conditional_round``; ``rounded_l2``)
    z  <- z + noise                      discrete Gaussian (``discrete_gaussian``) or Skellam (``skellam``)
    z  <- z mod 2^bits                   what the client sends

and the server's decoding of the sum: centred modulo 2^bits, times gamma, rotated back, cut to d.

Samplers take a numpy ``Generator`` (the caller keys it: fedmpi.rng.generator(seed, purpose, round,
client)), so a client's noise is the same whatever rank draws it. ``discrete_gaussian`` is Canonne,
Kamath and Steinke's rejection sampler (NeurIPS 2020, Algorithm 3) on a discrete Laplace proposal
(the difference of two geometric counts), exact given exact uniforms (numpy's are 53-bit floats).

Accounting (Renyi DP, in integer units: sensitivities and variances after the scaling):
``ddg_rdp`` is DDG's Proposition 14 for a sum of n discrete Gaussians (its Theorem 1's tau);
``skellam_rdp`` is Agarwal et al.'s bound for the Skellam mechanism (sums of Skellam noise are
Skellam: no correction). ``epsilon`` converts a composed curve with dp-accounting's conversion.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import torch

#: Renyi orders of the accountant (the reference code's integer orders 2..128, 256, and more)
ORDERS = np.array([*range(2, 129), 160, 192, 256, 384, 512, 1024], dtype=np.float64)
MAX_ROUNDING_TRIES = 1000  # conditional rounding: each try succeeds w.p. >= 1 - beta


# ---------------------------------------------------------------- samplers
def discrete_gaussian(gen: np.random.Generator, var: float, size: int) -> np.ndarray:
    """``size`` draws of the discrete Gaussian N_Z(0, var) (P(z) proportional to exp(-z^2 / (2 var))
    on the integers), int64: CKS's rejection from the discrete Laplace of scale t = floor(sigma) + 1,
    accepted with probability exp(-(|y| - var / t)^2 / (2 var)); vectorized, the pending draws redrawn."""
    out = np.zeros(size, dtype=np.int64)
    if var <= 0 or size == 0:
        return out
    t = math.floor(math.sqrt(var)) + 1
    p = -math.expm1(-1.0 / t)  # success probability of the geometric counts
    pending = np.arange(size)
    while pending.size:
        n = pending.size
        y = gen.geometric(p, n) - gen.geometric(p, n)  # discrete Laplace: P(y) ~ exp(-|y| / t)
        keep = gen.random(n) < np.exp(-np.square(np.abs(y) - var / t) / (2 * var))
        out[pending[keep]] = y[keep]
        pending = pending[~keep]
    return out


def skellam(gen: np.random.Generator, var: float, size: int) -> np.ndarray:
    """``size`` draws of the symmetric Skellam distribution of variance ``var`` (the difference of two
    Poisson(var / 2) counts), int64. A sum of Skellams is Skellam with the summed variance."""
    if var <= 0 or size == 0:
        return np.zeros(size, dtype=np.int64)
    return gen.poisson(var / 2, size).astype(np.int64) - gen.poisson(var / 2, size).astype(np.int64)


def discrete_gaussian_pmf(var: float, support: np.ndarray) -> np.ndarray:
    """P(z) of N_Z(0, var) on ``support``, normalised over |z| <= 40 sigma + 40 (the rest is below 1e-300)."""
    half = int(40 * math.sqrt(var)) + 40
    z = np.arange(-half, half + 1)
    norm = np.exp(-np.square(z) / (2 * var)).sum()
    return np.exp(-np.square(np.asarray(support, dtype=np.float64)) / (2 * var)) / norm


# ---------------------------------------------------------------- the rotation
def padded(d: int) -> int:
    """d', the power of two the Hadamard transform works in (>= d)."""
    return 1 << max(0, math.ceil(math.log2(max(d, 1))))


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """The orthonormal Walsh-Hadamard transform H / sqrt(d') of the rows of ``x`` (..., d'), d' a power of
    two (its own inverse); float64 butterflies, O(d' log d') a row."""
    d = x.shape[-1]
    if d & (d - 1):
        raise ValueError(f"hadamard: the width {d} is not a power of two")
    y = x.reshape(-1, d).double().clone()
    h = 1
    while h < d:
        v = y.view(y.shape[0], d // (2 * h), 2, h)
        a, b = v[:, :, 0, :].clone(), v[:, :, 1, :]
        v[:, :, 0, :] += b
        v[:, :, 1, :] = a - b
        h *= 2
    return (y / math.sqrt(d)).reshape(*x.shape[:-1], d)


def rotate(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """H D pad(x) / sqrt(d') for the rows of ``x`` (n, d) -> (n, d'), ``signs`` D's diagonal (d',) of +-1."""
    pad = torch.zeros((x.shape[0], signs.shape[0]), dtype=torch.float64, device=x.device)
    pad[:, :x.shape[1]] = x
    return hadamard(pad * signs)


def unrotate(y: torch.Tensor, signs: torch.Tensor, d: int) -> torch.Tensor:
    """The inverse of ``rotate``: D H y / sqrt(d') cut to its first d coordinates."""
    return (hadamard(y.double()) * signs)[..., :d]


# ---------------------------------------------------------------- rounding and scaling
def rounded_l2(norm: float, d: int, beta: float) -> float:
    """The L2 bound after randomized rounding of a vector of norm <= ``norm`` in d coordinates (DDG,
    Theorem 1 / Proposition 22): norm + sqrt(d) always; with conditional rounding (beta > 0) also
    sqrt(norm^2 + d / 4 + sqrt(2 log(1 / beta)) (norm + sqrt(d) / 2)), a rounding exceeding it
    being redrawn (each draw exceeds it with probability <= beta)."""
    always = norm + math.sqrt(d)
    if beta <= 0:
        return always
    conditional = math.sqrt(norm ** 2 + d / 4 + math.sqrt(2 * math.log(1 / beta)) * (norm + math.sqrt(d) / 2))
    return min(always, conditional)


def rounded_l1(l2: float, d: int) -> float:
    """An L1 bound of an integer vector of L2 norm <= ``l2`` in d coordinates: l2 min(sqrt(d), l2)."""
    return l2 * min(math.sqrt(d), l2)


def conditional_round(gen: np.random.Generator, x: np.ndarray, bound: float) -> np.ndarray:
    """Randomized rounding of ``x`` (each coordinate up with probability its fractional part, so
    unbiased), redrawn until ||z||_2 <= ``bound``; int64. ValueError after MAX_ROUNDING_TRIES."""
    low = np.floor(x)
    frac = x - low
    for _ in range(MAX_ROUNDING_TRIES):
        z = low + (gen.random(x.shape) < frac)
        if float(np.dot(z, z)) <= bound * bound:
            return z.astype(np.int64)
    raise ValueError(f"conditional rounding: no rounding within norm {bound:.6g} in {MAX_ROUNDING_TRIES} tries "
                     f"(the input's norm is {float(np.linalg.norm(x)):.6g})")


def stddevs(wrap: float) -> float:
    """k: the standard deviations of a normal beyond which it lies with probability ``wrap`` (two-sided)."""
    return NormalDist().inv_cdf(1 - wrap / 2)


def scale_factor(local_std: float, clip: float, bits: int, n: float, d: int, k: float) -> float:
    """1 / gamma such that k standard deviations of a coordinate of the sum fit in 2^bits (DDG,
    Section 4.2 and 4.4, the aggregate taken as sub-Gaussian): 2^bits = 2 k sqrt(c^2 n^2 / d
    + (gamma^2 / 4 + sigma_l^2) n) / gamma, sigma_l the local noise's std, c the clip. Raises
    ValueError when 2^(2 bits) <= n k^2 (the rounding alone does not fit)."""
    room = 4.0 ** bits - n * k * k
    if room <= 0:
        raise ValueError(f"{bits} bits cannot hold the rounding of {n:g} clients to {k:.3g} standard deviations")
    return math.sqrt(room) / (2 * k * math.sqrt(clip * clip * n * n / d + n * local_std * local_std))


def centred(z: torch.Tensor, bits: int) -> torch.Tensor:
    """``z`` modulo 2^bits, as the representative in [-2^(bits-1), 2^(bits-1))."""
    m, half = 1 << bits, 1 << (bits - 1)
    return torch.remainder(z + half, m) - half


def wrap_bound(n: int, d: int, clip_scaled: float, noise_var: float, bits: int, beta: float,
               exponential: bool) -> float:
    """An upper bound on the probability that some coordinate of the sum of ``n`` clients wraps
    modulo 2^bits: a union over the d coordinates of Bernstein's tail at 2^(bits-1) for the rotated
    sum (sub-Gaussian with variance proxy (n c)^2 / d: the clients share the rotation), the rounding
    (n / 4) and the noise of variance ``noise_var`` (Skellam, ``exponential``: Bernstein's scale
    1/3); divided by (1 - beta)^n, conditioning on every client's accepted rounding."""
    if n == 0:
        return 0.0
    a = float(1 << (bits - 1))
    v = (n * clip_scaled) ** 2 / d + n / 4 + noise_var
    tail = 2 * d * math.exp(-a * a / (2 * (v + (a / 3 if exponential else 0.0))))
    accepted = (1 - beta) ** n if beta > 0 else 1.0
    return min(1.0, tail / accepted) if accepted > 0 else 1.0


# ---------------------------------------------------------------- accounting
def ddg_tau(local_var: float, n: int) -> float:
    """DDG Theorem 1's tau for a sum of n discrete Gaussians of variance ``local_var`` each:
    10 sum_{k=1}^{n-1} exp(-2 pi^2 local_var k / (k + 1)) (0 for one)."""
    k = np.arange(1, max(n, 1), dtype=np.float64)
    return float(10 * np.exp(-2 * math.pi ** 2 * local_var * k / (k + 1)).sum())


def ddg_rdp(orders: np.ndarray, l2: float, l1: float, tau: float, d: int) -> np.ndarray:
    """RDP of the sum of discrete Gaussians (DDG, Proposition 14), per order alpha, with ``l2`` and
    ``l1`` the sensitivities over the std of the summed noise, tau its Theorem 1's, d the dimension:
    min(alpha l2^2 / 2 + tau d, alpha / 2 (l2^2 + 2 l1 tau + tau^2 d), alpha / 2 (l2 + sqrt(d) tau)^2)."""
    a = np.asarray(orders, dtype=np.float64)
    return np.minimum.reduce([a * l2 ** 2 / 2 + tau * d, a / 2 * (l2 ** 2 + 2 * l1 * tau + tau ** 2 * d),
                              a / 2 * (l2 + math.sqrt(d) * tau) ** 2])


def skellam_rdp(orders: np.ndarray, l2: float, l1: float, var: float) -> np.ndarray:
    """RDP of the Skellam mechanism of variance ``var`` per coordinate (Agarwal, Kairouz, Liu 2021), per
    order alpha, for L2 and L1 sensitivities ``l2``, ``l1`` (integer units): alpha l2^2 / (2 var)
    + min(((2 alpha - 1) l2^2 + 6 l1) / (4 var^2), 3 l1 / (2 var))."""
    a = np.asarray(orders, dtype=np.float64)
    return a * l2 ** 2 / (2 * var) + np.minimum(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * var ** 2),
                                                3 * l1 / (2 * var))


def epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """Epsilon at ``delta`` of an RDP curve (dp-accounting's conversion of the composed curve)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    return float(compute_epsilon(np.asarray(orders), np.asarray(rdp), delta)[0])
