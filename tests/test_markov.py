"""The minimum-separation sampler (ALGORITHMS.md sec. 3): invariants, groups, state, seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedmpi.participation.probs import BaseProbConfig
from fedmpi.errors import InputError
from fedmpi.participation import ClientInfo, build
from fedmpi.participation.markov import NEVER, Markov
from fedmpi.state import State
from helpers import availability_params


def run(chain: Markov, rounds: int, start: int = 0) -> list[np.ndarray]:
    return [chain.available(t).copy() for t in range(start, start + rounds)]


def weights(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.05, 1.0, n)


@pytest.mark.parametrize("n,B,R", [(50, 5, 6), (50, 5, 9), (12, 1, 11), (7, 3, 1), (40, 1, 0)])
def test_each_round_b_distinct_clients_and_minimum_separation(n, B, R):
    last = np.full(n, -(10**9))
    for t, ids in enumerate(run(Markov(weights(n), B, R, seed=3), 3000)):
        assert ids.size == B and np.all(np.diff(ids) > 0) and 0 <= ids[0] and ids[-1] < n
        assert np.all(t - last[ids] > R), f"round {t}: a client came back within R = {R} rounds"
        last[ids] = t


@pytest.mark.parametrize("M,R", [(5, 2), (5, 4), (10, 0)])
def test_groups_variant_selects_one_whole_group(M, R):
    n, size = 20, 20 // M
    last_group = np.full(M, -(10**9))
    for t, ids in enumerate(run(Markov(weights(n), 1, R, seed=1, groups=M), 1000)):
        g = ids[0] // size
        np.testing.assert_array_equal(ids, np.arange(g * size, (g + 1) * size))
        assert t - last_group[g] > R
        last_group[g] = t


def test_state_dict_resumes_the_chain_exactly():
    for groups, B in ((None, 4), (6, 1)):
        a = Markov(weights(30), B, 3, seed=7, groups=groups)
        run(a, 100)
        state = a.state_dict()
        units = 30 if groups is None else groups
        assert state.shared["last"].dtype == torch.int64 and state.shared["last"].shape == (units,)
        state.shared["last"] = state.shared["last"].clone()  # (a view of the live chain state)
        tail = run(a, 100, start=100)
        b = Markov(weights(30), B, 3, seed=7, groups=groups)
        b.load_state_dict(state)
        for x, y in zip(tail, run(b, 100, start=100)):
            np.testing.assert_array_equal(x, y)


def test_fresh_state_is_never_participated():
    assert np.all(Markov(weights(10), 2, 1, seed=0).state_dict().shared["last"].numpy() == NEVER)
    with pytest.raises(InputError, match=r"^checkpoint: last has shape \(9,\), expected \(10,\)"):
        Markov(weights(10), 2, 1, seed=0).load_state_dict(State(shared={"last": torch.zeros(9, dtype=torch.int64)}))


def test_same_seed_same_sequence_regardless_of_anything_else():
    ref = run(Markov(weights(25), 3, 4, seed=11), 200)
    other = Markov(weights(25), 3, 4, seed=12)  # interleaved with another chain and extra calls
    again = Markov(weights(25), 3, 4, seed=11)
    for t in range(200):
        other.available(t)
        again.state_dict()
        assert again.probabilities(t) is None
        np.testing.assert_array_equal(again.available(t), ref[t])
    different = run(Markov(weights(25), 3, 4, seed=12), 200)
    assert any(not np.array_equal(x, y) for x, y in zip(ref, different))


def test_cyclic_when_r_is_m_minus_1():
    # R = M - 1: the first M rounds fix a partition that then repeats in the same order
    seq = run(Markov(weights(12), 3, 3, seed=5), 40)
    for t in range(4, 40):
        np.testing.assert_array_equal(seq[t], seq[t - 4])
    assert np.array_equal(np.sort(np.concatenate(seq[:4])), np.arange(12))


def test_first_stage_favours_heavy_clients_at_r0():
    # B = 1, R = 0: P(i) = p_i / sum p; a 1:9 pair is drawn ~90% for the heavy one
    ids = np.concatenate(run(Markov(np.array([0.1, 0.9]), 1, 0, seed=2), 4000))
    assert abs(np.mean(ids == 1) - 0.9) < 5 * np.sqrt(0.09 / 4000)


def test_registered_kind_and_config_errors():
    def make(m, **kw):
        cfg = availability_params("markov", base=BaseProbConfig(kind="uniform", lo=0.1, hi=0.9), **kw)
        return build(cfg, ClientInfo(m=m, seed=0))

    chain = make(20, B=4, R=3)
    assert isinstance(chain, Markov) and chain.available(0).size == 4
    assert make(20, B=1, R=3, markov_groups=4).available(0).size == 5
    assert make(20, B=5, R=3, markov_groups=4).available(0).size == 5  # B = group size is accepted
    for kw, key in [({"B": 4, "R": 5}, "availability.R"), ({"B": 21}, "availability.B"),
                    ({"markov_groups": 3}, "availability.markov_groups"),
                    ({"markov_groups": 4, "R": 4}, "availability.R"),
                    ({"markov_groups": 4, "B": 2}, "availability.B")]:
        with pytest.raises(InputError, match=f"^{key}:"):
            make(20, **kw)
    cfg = availability_params("markov", base=BaseProbConfig(kind="fixed", values=[0.5, 0.0, 0.2]))
    with pytest.raises(InputError, match="^availability.base: .*p_i > 0"):
        build(cfg, ClientInfo(m=3, seed=0))


def test_allows_n_not_multiple_of_b():
    # N = 7, B = 3: at most R = 1 (7 - 3 R >= 3)
    assert Markov(weights(7), 3, 1, seed=0).available(0).size == 3
    with pytest.raises(InputError, match=r"^availability.R: must be in 0\.\.1"):
        Markov(weights(7), 3, 2, seed=0)
