"""Secure aggregation's arithmetic (fedmpi/privacy/secagg.py, docs/PRIVACY.md "Secure aggregation"):
masks that cancel mod M, Shamir shares over GF(2^127 - 1), the key agreement, quantization and its
decoding, each alone."""

from __future__ import annotations

import numpy as np
import pytest

from fedmpi import rng
from fedmpi.privacy import secagg as S


def _protocol(ids: np.ndarray, k: int, dim: int, modulus: int, dropped: set[int], seed: int = 0, t: int = 0):
    """Clients ``ids`` mask keyed random vectors; the server unmasks the survivors' sum with the
    seeds it would reconstruct. Returns (unmasked, plain sum of the survivors' vectors mod M)."""
    graph = S.neighbour_graph(ids, k, rng.key(seed, "g", t))
    secrets = {int(u): S.client_secrets(seed, t, int(u)) for u in ids}
    public = {u: S.public_key(sk) for u, (sk, _) in secrets.items()}
    q = {int(u): rng.integers(rng.key(seed, "q", t, int(u)), np.arange(dim), modulus).astype(np.int64) for u in ids}
    survivors = {int(u) for u in ids} - dropped
    Y = np.zeros(dim, np.int64)
    for u in survivors:
        y = S.mask(q[u], u, *secrets[u], {int(v): public[int(v)] for v in graph[u]}, modulus)
        assert y.min() >= 0 and y.max() < modulus
        Y += y
    got = S.unmask(Y, {u: secrets[u][1] for u in survivors},
                   {v: secrets[v][0] for v in dropped}, graph, public, survivors, modulus)
    plain = sum((q[u] for u in survivors), np.zeros(dim, np.int64)) % modulus
    return got, plain


def test_the_masked_inputs_alone_look_nothing_like_the_vectors():
    """A masked input is not its vector (the masks are uniform mod M); only the sum is."""
    ids = np.arange(6)
    graph = S.neighbour_graph(ids, 2, rng.key(0, "g"))
    sk, b = S.client_secrets(0, 0, 0)
    keys = {int(v): S.public_key(S.client_secrets(0, 0, int(v))[0]) for v in graph[0]}
    q = np.zeros(1000, np.int64)
    y = S.mask(q, 0, sk, b, keys, 2**32)
    assert np.count_nonzero(y) > 990 and abs(y.mean() / 2**31 - 1) < 0.1


def test_the_key_agreement_is_symmetric_and_keyed_by_round_and_client():
    a, b = S.client_secrets(1, 3, 4)[0], S.client_secrets(1, 3, 9)[0]
    assert S.agree(a, S.public_key(b)) == S.agree(b, S.public_key(a))
    assert S.client_secrets(1, 3, 4) != S.client_secrets(1, 4, 4) != S.client_secrets(2, 3, 4)
    assert all(0 < x < S.FIELD for x in S.client_secrets(1, 3, 4))


def test_the_neighbour_graph_is_a_symmetric_ring_of_degree_k_and_complete_for_small_cohorts():
    ids = np.arange(3, 40, 3)
    for k in (2, 4, 6):
        g = S.neighbour_graph(ids, k, rng.key(0, "g"))
        assert all(len(v) == k for v in g.values())
        assert all(u in g[int(v)] for u in g for v in g[u])
        again = S.neighbour_graph(ids[::-1], k, rng.key(0, "g"))  # by client id, not by position
        assert all(np.array_equal(g[u], again[u]) for u in g)
    full = S.neighbour_graph(ids[:4], 6, rng.key(0, "g"))
    assert all(len(v) == 3 for v in full.values())
    assert S.default_degree(100) == 14 and S.default_degree(5) == 4 and S.default_degree(1) == 0


def test_quantization_is_unbiased_clamped_and_decodes_to_the_exact_integer_sum():
    bits, M = 10, 2**20
    L = S.levels(bits)
    assert L == 511
    rows = np.array([[0.3, -0.7, 2.5, -3.0], [0.001, 0.5, -0.25, 0.0]])
    scale = L / 1.0  # range 1: the 2.5 and -3.0 are clamped
    u = rng.uniform(rng.key(0, "u"), np.arange(rows.size)).reshape(rows.shape)
    q, clamped = S.quantize(rows.copy(), scale, bits, u, M)
    assert clamped == 2 and q.dtype == np.int64 and q.min() >= 0 and q.max() < M
    s = S.signed(q, M)
    assert np.all(np.abs(s) <= L) and s[0, 2] == L and s[0, 3] == -L
    assert np.all(np.abs(s[:, :2] - rows[:, :2] * scale) < 1)
    total = q.sum(0) % M
    assert np.array_equal(S.decode(total, M, scale), s.sum(0) / scale)
    # unbiased: the mean of many stochastic roundings of 0.3 L + 0.25 is 0.3 L + 0.25
    x = np.full((1, 20000), (0.3 * L + 0.25) / scale)
    qs = S.signed(S.quantize(x, scale, bits, rng.uniform(rng.key(1, "u"), np.arange(20000))[None], M)[0], M)
    assert set(np.unique(qs)) <= {153, 154} and abs(qs.mean() - (0.3 * L + 0.25)) < 0.01


def test_a_wrap_is_foreseen_and_signed_decoding_holds_up_to_it():
    assert not S.wraps(258, 8, 2**16) and S.wraps(259, 8, 2**16)  # 258 * 127 < 2^15 <= 259 * 127
    M = 2**16
    q = np.full(259, -127) % M  # 259 clients at -L: the sum passes -M/2 and wraps
    assert S.signed(np.array([q[:258].sum()]), M)[0] == -258 * 127
    assert S.signed(np.array([q.sum()]), M)[0] != -259 * 127


@pytest.mark.parametrize("modulus_bits", [8, 32, 48])
def test_streams_are_uniform_in_the_modulus_and_keyed(modulus_bits):
    a, b = S.stream(12345, 4000, 2**modulus_bits), S.stream(12346, 4000, 2**modulus_bits)
    assert a.dtype == np.int64 and a.min() >= 0 and a.max() < 2**modulus_bits
    assert not np.array_equal(a, b) and np.array_equal(a, S.stream(12345, 4000, 2**modulus_bits))
    assert abs(a.mean() / 2 ** (modulus_bits - 1) - 1) < 0.05
