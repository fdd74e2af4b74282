"""Counter-based random streams: pure functions of (seed, purpose, counters)."""

import numpy as np
import pytest
import torch

from fedmpi import rng
from helpers.properties import given, settings, st


def test_same_key_same_numbers_any_chunking():
    k = rng.key(5, "batch", 3, 1)
    ids = np.arange(1000)
    whole = rng.uniform(k, ids)
    parts = np.concatenate([rng.uniform(k, ids[:317]), rng.uniform(k, ids[317:])])
    assert np.array_equal(whole, parts)
    assert np.array_equal(rng.uniform(k, ids[::-1]), whole[::-1])


def test_keys_separate_streams():
    ids = np.arange(20000)
    a = rng.uniform(rng.key(1, "availability", 0), ids)
    for other in (rng.key(2, "availability", 0), rng.key(1, "batch", 0), rng.key(1, "availability", 1)):
        b = rng.uniform(other, ids)
        assert abs(np.corrcoef(a, b)[0, 1]) < 0.03


def test_distributions():
    ids = np.arange(200000)
    k = rng.key(0, "t")
    u = rng.uniform(k, ids)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.005
    z = rng.normal(k, ids)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    r = rng.integers(k, ids, 7)
    assert r.min() == 0 and r.max() == 6 and np.all(np.abs(np.bincount(r) / len(r) - 1 / 7) < 0.005)


def test_bernoulli_thresholds():
    ids = np.arange(100000)
    w = rng.weyl(ids)
    k = rng.key(9, "b")
    assert np.array_equal(rng.bits_weyl(k, w), rng.bits(k, ids))
    for p in (0.0, 0.01, 0.5, 1.0):
        freq = (rng.bits_weyl(k, w) < rng.threshold(p)).mean()
        assert abs(freq - p) < 4 * np.sqrt(p * (1 - p) / len(ids)) + 1e-12


def test_generator_is_keyed():
    a = rng.generator(1, "partition").random(5)
    assert np.array_equal(a, rng.generator(1, "partition").random(5))
    assert not np.array_equal(a, rng.generator(1, "topology").random(5))


def test_torch_bits_are_numpy_bits():
    """The int64 torch path (dropout masks on any device, under vmap) is the same stream."""
    k = rng.key(3, "dropout", 5, 1)
    idx = np.arange(0, 10**6, 997)
    want = rng.bits(k, idx).view(np.int64)
    got = rng.torch_bits(torch.as_tensor(rng.as_int64(k)), torch.as_tensor(idx)).numpy()
    assert np.array_equal(got, want)
    keys = rng.bits(k, np.arange(3))  # a key per client, broadcast against the counters
    per_client = rng.torch_bits(torch.as_tensor(rng.as_int64(keys))[:, None], torch.arange(50)[None, :]).numpy()
    for c in range(3):
        assert np.array_equal(per_client[c], rng.bits(keys[c], np.arange(50)).view(np.int64))


# ---- rng.below: the chunked Bernoulli draw must pick exactly the ids of the reference draw
def _reference_below(k, thr, n):
    return np.flatnonzero(rng.bits(k, np.arange(n)) < thr)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), t=st.integers(0, 10**6), n=st.integers(0, 3 * rng._CHUNK + 7),
       p=st.one_of(st.sampled_from([0.0, 1e-9, 0.01, 0.5, 1 - 1e-12, 1.0]), st.floats(0, 1)))
def test_below_is_the_reference_draw(seed, t, n, p):
    """Same ids, bit for bit, as flatnonzero(bits < threshold) for one p (chunk edges included)."""
    k = rng.key(seed, "availability", t)
    got = rng.below(k, rng.threshold(p), n)
    want = _reference_below(k, rng.threshold(p), n)
    assert got.dtype == want.dtype and np.array_equal(got, want)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), t=st.integers(0, 10**6), n=st.integers(1, 2 * rng._CHUNK + 3),
       hi=st.floats(0, 1))
def test_below_per_client_thresholds(seed, t, n, hi):
    """One threshold per client (time-varying or heterogeneous p_i), including p = 0 and p = 1."""
    k = rng.key(seed, "availability", t)
    p = rng.generator(seed, "p").uniform(0, hi, size=n)
    p[:: 7] = 0.0
    p[3:: 11] = 1.0
    thr = rng.threshold(p)
    assert np.array_equal(rng.below(k, thr, n), _reference_below(k, thr, n))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), t=st.integers(0, 10**6), low=st.integers(-(2**33), 2**33))
def test_below_at_the_threshold(seed, t, low):
    """Thresholds at a client's own bits, and bits moved in the low 33 (which the pre-filter of
    ``below`` cannot see): the exact comparison decides, strict ``<`` as in the reference."""
    n = 5000
    k = rng.key(seed, "availability", t)
    b = rng.bits(k, np.arange(n))
    for thr in (b, b + np.uint64(1), b + np.uint64(low % 2**64), b ^ np.uint64(abs(low) & (2**33 - 1))):
        assert np.array_equal(rng.below(k, thr, n), _reference_below(k, thr, n))
    for i in (0, 1, n // 2, n - 1):  # one threshold equal to one client's bits
        assert np.array_equal(rng.below(k, b[i], n), _reference_below(k, b[i], n))
        assert i not in rng.below(k, b[i], n) and i in rng.below(k, b[i] + np.uint64(1), n)


def test_below_rejects_a_wrong_shape():
    with pytest.raises(ValueError, match="thr"):
        rng.below(rng.key(0, "x"), np.zeros(3, np.uint64), 4)
