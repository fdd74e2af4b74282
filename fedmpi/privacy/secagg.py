"""Secure aggregation's arithmetic (Bonawitz et al. 2017; SecAgg+: Bell et al. 2020), as pure functions.

A round of the protocol, for a cohort U of clients with rows x_u (what each sends for the sum):

    quantize   q_u = SR(clamp(x_u, +-range) * scale) mod M      SR: stochastic rounding, keyed per client;
                                                                 |q_u| <= L = 2^(bits-1) - 1 before the mod
    keys       sk_u, b_u (field elements, keyed per (round, client)); pk_u = g^sk_u mod P
    graph      each u has k neighbours N(u) (a ring of the shuffled cohort, k/2 each side: SecAgg+)
    shares     Shamir t-of-k shares of sk_u and of b_u to N(u) (polynomials over GF(P))
    mask       y_u = q_u + PRG(b_u) + sum_{v in N(u)} sign(u, v) PRG(s_uv)  mod M,
               s_uv = pk_v^sk_u = g^(sk_u sk_v) mod P (both ends compute it), sign = +1 if u < v else -1
    sum        Y = sum_{u in U2} y_u  (U2: the clients whose masked input arrived)
    unmask     the server reconstructs b_u (u in U2) and sk_v (v dropped, not in U2) from t shares of
               neighbours still alive (U3), and removes PRG(b_u) and the pairwise masks of v with its
               survivors: Y - sum PRG(b_u) - sum sign(u, v) PRG(s_uv) = sum_{u in U2} q_u  mod M
    decode     signed(sum mod M) / scale: exact as long as |sum_u q_u| < M / 2 (no modular wrap)

The pairwise masks of two survivors cancel mod M; those of a dropped client are recomputed from
its reconstructed key. Everything is real arithmetic: 127-bit field elements (P = 2^127 - 1, a
Mersenne prime, for both Shamir and the key agreement), Lagrange interpolation, Philox streams keyed
by the agreed seeds, int64 vectors mod M = 2^modulus_bits. What is not emulated is the security of
the key agreement (a 127-bit prime group with generator 3 is not a secure Diffie-Hellman group)
and of the encryption of the shares (docs/PRIVACY.md, "Secure aggregation").

The integer-lattice interface (shared with distributed noise, ``fedmpi.privacy.discrete``): a
client's quantized vector is an int64 array in [0, M); integer noise is added to it (mod M)
before ``mask``.
"""

from __future__ import annotations

import math

import numpy as np

from .. import rng

FIELD = 2**127 - 1  #: P: Shamir's prime field and the (emulated) key agreement's group Z_P^*
GENERATOR = 3  #: g of the key agreement
ELEMENT_BYTES = 16  #: a field element on the wire (127 bits)
ID_BYTES = 4  #: a client id on the wire


# ----------------------------------------------------------------------------- keyed field elements
def field_elements(k: np.uint64, n: int) -> list[int]:
    """n elements of GF(P) from the keyed stream ``k`` (two 64-bit words each)."""
    w = rng.bits(k, np.arange(2 * n))
    return [((int(w[2 * i]) << 64) | int(w[2 * i + 1])) % FIELD for i in range(n)]


def client_secrets(seed: int, t: int, client: int) -> tuple[int, int]:
    """(sk_u, b_u) of client u in round t: its key-agreement secret (in [1, P - 1)) and its self-mask seed."""
    sk = field_elements(rng.key(seed, "secagg_key", t, client), 1)[0] % (FIELD - 2) + 1
    b = field_elements(rng.key(seed, "secagg_self", t, client), 1)[0]
    return sk, b


def public_key(sk: int) -> int:
    """pk = g^sk mod P."""
    return pow(GENERATOR, sk, FIELD)


def agree(sk: int, pk_other: int) -> int:
    """The pairwise seed s_uv = pk_v^sk_u = g^(sk_u sk_v) mod P (the same at both ends)."""
    return pow(pk_other, sk, FIELD)


# ----------------------------------------------------------------------------- streams and masks
def stream(seed: int, dim: int, modulus: int) -> np.ndarray:
    """PRG(seed): ``dim`` uniform int64 in [0, modulus) (a power of two) from Philox keyed by the
    seed (< 2^128)."""
    raw = np.random.Philox(key=seed).random_raw(dim)
    return (raw & np.uint64(modulus - 1)).astype(np.int64)


def sign(u: int, v: int) -> int:
    """+1 if u < v else -1: the sign of the pairwise mask PRG(s_uv) in y_u."""
    return 1 if u < v else -1


def mask(q: np.ndarray, u: int, sk: int, b: int, neighbour_keys: dict[int, int], modulus: int) -> np.ndarray:
    """y_u = q_u + PRG(b_u) + sum_v sign(u, v) PRG(s_uv) mod M (client u; ``neighbour_keys``: v -> pk_v)."""
    y = (q + stream(b, q.shape[0], modulus)) % modulus
    for v, pk in neighbour_keys.items():
        y = (y + sign(u, v) * stream(agree(sk, pk), q.shape[0], modulus)) % modulus
    return y


def unmask(total: np.ndarray, self_seeds: dict[int, int], dropped_keys: dict[int, int],
           graph: dict[int, np.ndarray], public: dict[int, int], survivors: set[int], modulus: int) -> np.ndarray:
    """sum_{u in U2} q_u mod M from Y = sum_{u in U2} y_u (the server): minus PRG(b_u) of every
    survivor (``self_seeds``: u -> reconstructed b_u), minus the masks sign(u, v) PRG(s_uv) that each
    dropped v (``dropped_keys``: v -> reconstructed sk_v) left in its surviving neighbours' y_u."""
    dim = total.shape[0]
    s = total % modulus
    for b in self_seeds.values():
        s = (s - stream(b, dim, modulus)) % modulus
    for v, sk in dropped_keys.items():
        for u in graph[v]:
            if int(u) in survivors:
                s = (s - sign(int(u), v) * stream(agree(sk, public[int(u)]), dim, modulus)) % modulus
    return s


# ----------------------------------------------------------------------------- the neighbour graph
def default_degree(n: int) -> int:
    """k = 2 ceil(log2 n) (SecAgg+: degree O(log n)), at most n - 1."""
    return min(n - 1, 2 * math.ceil(math.log2(n))) if n > 1 else 0


def neighbour_graph(cohort: np.ndarray, k: int, key: np.uint64) -> dict[int, np.ndarray]:
    """Each client's neighbours: the cohort shuffled by ``key`` (by client id: the same whatever the
    order given) on a ring, k / 2 on each side (the Harary graph H_{k,n}); every other client when
    k >= n - 1. Symmetric; sorted arrays."""
    ids = np.sort(np.asarray(cohort, dtype=np.int64))
    n = len(ids)
    if k >= n - 1:
        return {int(u): ids[ids != u] for u in ids}
    ring = ids[np.argsort(rng.bits(key, ids), kind="stable")]
    graph = {}
    for i, u in enumerate(ring):
        near = [ring[(i + j) % n] for j in range(1, k // 2 + 1)] + [ring[(i - j) % n] for j in range(1, k // 2 + 1)]
        graph[int(u)] = np.sort(np.asarray(near, dtype=np.int64))
    return graph


# ----------------------------------------------------------------------------- Shamir over GF(P)
def share(secret: int, holders: np.ndarray, threshold: int, key: np.uint64) -> dict[int, int]:
    """Shamir shares of ``secret``: f(h + 1) for each holder h, f of degree threshold - 1 with
    f(0) = secret and the other coefficients from ``key``."""
    coeffs = [secret % FIELD] + field_elements(key, threshold - 1)
    out = {}
    for h in holders:
        x, y = int(h) + 1, 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % FIELD
        out[int(h)] = y
    return out


def reconstruct(shares: dict[int, int]) -> int:
    """f(0) from shares {holder h: f(h + 1)} (Lagrange interpolation at 0; as many shares as the
    threshold, or more)."""
    xs = [h + 1 for h in shares]
    secret = 0
    for xj, y in zip(xs, shares.values()):
        num = den = 1
        for xm in xs:
            if xm != xj:
                num = num * xm % FIELD
                den = den * (xm - xj) % FIELD
        secret = (secret + y * num * pow(den, -1, FIELD)) % FIELD
    return secret


# ----------------------------------------------------------------------------- quantization
def levels(bits: int) -> int:
    """L = 2^(bits-1) - 1: a quantized coordinate is an integer in [-L, L]."""
    return 2 ** (bits - 1) - 1


def quantize(rows: np.ndarray, scale: float, bits: int, uniforms: np.ndarray, modulus: int) -> tuple[np.ndarray, int]:
    """Rows (n, d) float64 -> (q int64 in [0, M), coordinates clamped): each coordinate times
    ``scale``, clamped to [-L, L] and rounded stochastically (up with probability its fraction,
    by ``uniforms`` in [0, 1) of the same shape: unbiased), then taken mod M."""
    lim = levels(bits)
    v = rows * scale
    clamped = int(np.count_nonzero(np.abs(v) > lim))
    np.clip(v, -lim, lim, out=v)
    low = np.floor(v)
    q = low.astype(np.int64) + (uniforms < v - low)
    return q % modulus, clamped


def signed(s: np.ndarray, modulus: int) -> np.ndarray:
    """Integers mod M mapped back to [-M/2, M/2)."""
    s = s % modulus
    return np.where(s >= modulus // 2, s - modulus, s)


def decode(s: np.ndarray, modulus: int, scale: float) -> np.ndarray:
    """The decoded sum: signed(sum mod M) / scale, float64."""
    return signed(s, modulus).astype(np.float64) / scale


def wraps(n: int, bits: int, modulus: int) -> bool:
    """Whether n quantized coordinates (each in [-L, L]) can sum outside [-M/2, M/2): a modular wrap."""
    return n * levels(bits) >= modulus // 2
