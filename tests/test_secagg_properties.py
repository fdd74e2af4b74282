"""Secure aggregation's arithmetic, property-based (hypothesis, a test extra: skipped without it):
masks cancel exactly for any cohort, degree, modulus and dropouts; any threshold of Shamir shares
rebuilds the secret and fewer do not."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_secagg import _protocol  # noqa: E402

from fedmpi import rng  # noqa: E402
from fedmpi.privacy import secagg as S  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 12), half=st.integers(1, 4), dim=st.integers(1, 9), bits=st.integers(8, 40),
       seed=st.integers(0, 2**32), drops=st.sets(st.integers(0, 11), max_size=5))
def test_masks_cancel_exactly_and_a_dropped_clients_masks_are_removed(n, half, dim, bits, seed, drops):
    """Whatever the cohort, degree, modulus and dropouts: Y unmasked = sum of the survivors' q mod M."""
    ids = np.sort(rng.generator(seed, "ids").choice(100, n, replace=False))
    dropped = {int(ids[i]) for i in drops if i < n}
    got, plain = _protocol(ids, 2 * half, dim, 2**bits, dropped, seed=seed)
    assert np.array_equal(got, plain)


@settings(max_examples=30, deadline=None)
@given(secret=st.integers(0, S.FIELD - 1), k=st.integers(1, 10), data=st.data())
def test_any_threshold_of_shamir_shares_reconstructs_the_secret_and_fewer_do_not(secret, k, data):
    threshold = data.draw(st.integers(1, k))
    holders = np.asarray(data.draw(st.lists(st.integers(0, 500), min_size=k, max_size=k, unique=True)))
    shares = S.share(secret, holders, threshold, rng.key(5, "share", secret % 1000))
    pick = data.draw(st.permutations(list(shares)))
    assert S.reconstruct({h: shares[h] for h in pick[:threshold]}) == secret
    assert S.reconstruct(shares) == secret
    if threshold > 1:  # t - 1 shares: a random field element, not the secret (probability 1 - 1/P)
        assert S.reconstruct({h: shares[h] for h in pick[:threshold - 1]}) != secret
