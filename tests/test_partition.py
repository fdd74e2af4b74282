"""Client partitions: coverage, class structure, no empty client, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from fedmpi.config import PartitionConfig
from fedmpi.data.partition import client_groups, label_histogram, partition
from fedmpi.errors import InputError
from helpers.properties import given, settings, st


def labels_of(n_per_class=60, classes=10, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), n_per_class))


def split(labels, m, seed=0, **kw):
    return partition(labels, m, PartitionConfig(**kw), np.random.default_rng(seed))


def check_parts(parts, m, n, all_used=True):
    assert len(parts) == m
    for p in parts:
        assert p.dtype == np.int64 and p.size > 0 and np.all(np.diff(p) > 0)
    flat = np.concatenate(parts)
    assert np.unique(flat).size == flat.size  # no sample given twice
    if all_used:
        assert flat.size == n


@pytest.mark.parametrize("kw", [dict(kind="iid"), dict(kind="dirichlet", alpha=0.1), dict(kind="shards"),
                                dict(kind="shards", classes_per_client=3), dict(kind="groups", alpha=0.1)])
@pytest.mark.parametrize("m", [10, 20, 37])
def test_every_sample_once_no_empty_deterministic(kw, m):
    y = labels_of()
    parts = split(y, m, **kw)
    check_parts(parts, m, y.size)
    again = split(y, m, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = split(y, m, seed=1, **kw)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


def test_iid_sizes_and_mix():
    y = labels_of()
    parts = split(y, 7, kind="iid")
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert (label_histogram(y, parts, 10) > 0).sum(1).min() >= 8  # every client sees most classes


def test_dirichlet_is_skewed_and_unequal():
    y = labels_of(600)
    parts = split(y, 100, kind="dirichlet", alpha=0.1)
    hist = label_histogram(y, parts, 10)
    assert hist.sum() == y.size and hist.shape == (100, 10) and hist.dtype == np.int64
    top = hist.max(1) / hist.sum(1)
    assert np.median(top) > 0.6  # alpha = 0.1: clients are dominated by one class
    assert len({p.size for p in parts}) > 10


def test_shards_one_whole_class_per_client():
    y = labels_of()
    parts = split(y, 10, kind="shards", classes_per_client=1)
    hist = label_histogram(y, parts, 10)
    assert ((hist > 0).sum(1) == 1).all()
    assert sorted(hist.argmax(1)) == list(range(10))
    assert (hist.max(1) == 60).all()  # each client holds its whole class


@pytest.mark.parametrize("m,k", [(10, 3), (20, 1), (7, 2), (4, 10)])
def test_shards_classes_per_client(m, k):
    y = labels_of()
    hist = label_histogram(y, split(y, m, kind="shards", classes_per_client=k), 10)
    assert ((hist > 0).sum(1) == k).all()
    users = (hist > 0).sum(0)
    assert users.max() - users.min() <= 1  # classes used as evenly as possible


def test_shards_fewer_slots_than_classes():
    y = labels_of()
    parts = split(y, 3, kind="shards", classes_per_client=2)
    check_parts(parts, 3, y.size, all_used=False)
    assert np.concatenate(parts).size == 6 * 60


def test_groups_split_classes():
    y = labels_of(100)
    cfg = PartitionConfig(kind="groups", groups=2, alpha=0.1)
    parts = partition(y, 100, cfg, np.random.default_rng(3))
    g = client_groups(100, cfg)
    np.testing.assert_array_equal(g, np.repeat([0, 1], 50))
    hist = label_histogram(y, parts, 10)
    assert hist[g == 0][:, 5:].sum() == 0 and hist[g == 1][:, :5].sum() == 0
    assert hist[g == 0].sum() == 500 and hist[g == 1].sum() == 500
    np.testing.assert_array_equal(client_groups(7, PartitionConfig(kind="groups", groups=3)),
                                  [0, 0, 0, 1, 1, 2, 2])
    assert client_groups(10, PartitionConfig(kind="dirichlet")) is None


def test_empty_clients_repaired():
    y = labels_of(3, classes=4)  # 12 samples, 12 clients, tiny alpha: many would be empty
    for kind in ("dirichlet", "groups", "shards", "iid"):
        check_parts(split(y, 12, kind=kind, alpha=0.01, classes_per_client=1), 12, 12)


@pytest.mark.parametrize("m,kw,key", [
    (601, dict(kind="iid"), "task.partition"),
    (10, dict(kind="shards", classes_per_client=11), "task.partition.classes_per_client"),
    (10, dict(kind="groups", groups=11), "task.partition.groups"),
    (20, dict(kind="groups", groups=10), "task.partition"),  # 10 groups x 2 clients, class of 1 sample
])
def test_impossible_partitions(m, kw, key):
    y = labels_of() if m != 20 else np.arange(10)
    with pytest.raises(InputError) as e:
        split(y, m, **kw)
    assert str(e.value).startswith(key + ":") and "\n" not in str(e.value)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), m=st.integers(1, 40), classes=st.integers(1, 12),
       alpha=st.floats(0.01, 10), kind=st.sampled_from(["iid", "dirichlet", "groups"]), seed=st.integers(0, 9))
def test_property_exact_cover(n, m, classes, alpha, kind, seed):
    y = np.random.default_rng(seed).integers(0, classes, n)
    cfg = PartitionConfig(kind=kind, alpha=alpha, groups=2)
    try:
        parts = partition(y, m, cfg, np.random.default_rng(seed))
    except InputError:
        assert m > n or kind == "groups"
        return
    check_parts(parts, m, n)
