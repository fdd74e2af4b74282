"""Counter-based random streams: pure functions of (seed, purpose, counters)."""

import numpy as np
import torch

from fedmpi import rng


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
