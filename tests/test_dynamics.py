"""Availability dynamics, base probabilities and the ``fedmpi availability`` preview."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from fedmpi.participation.probs import BaseProbConfig
from fedmpi.errors import InputError
from fedmpi.participation import ClientInfo, base_probabilities, build, show
from fedmpi.participation.probs import class_weights
from helpers import availability_params
from helpers.properties import given, settings, st


def make(kind: str, p, m: int | None = None, seed: int = 0, group=None, hist=None, **kw):
    """Participation of ``kind`` with fixed base probabilities ``p`` (list, or one value)."""
    p = list(np.atleast_1d(p))
    m = m or len(p)
    cfg = availability_params(kind, base=BaseProbConfig(kind="fixed", values=p), **kw)
    return build(cfg, ClientInfo(m=m, seed=seed, group=group, label_hist=hist))


# ----------------------------------------------------------------------------- formulas

def test_staircase_formula():
    part = make("staircase", [0.5, 0.9], period=20, low=0.4)
    for t, f in [(0, 1.0), (9, 1.0), (10, 0.4), (19, 0.4), (20, 1.0), (35, 0.4)]:
        np.testing.assert_allclose(part.probabilities(t), [0.5 * f, 0.9 * f])


def test_sine_formula():
    # f(t) = 0.3 sin(2 pi t / 20) + 0.7: t=0 -> 0.7, t=5 -> 1.0, t=10 -> 0.7, t=15 -> 0.4
    part = make("sine", [0.5, 0.9], period=20, gamma=0.3)
    for t, f in [(0, 0.7), (5, 1.0), (10, 0.7), (15, 0.4), (25, 1.0)]:
        np.testing.assert_allclose(part.probabilities(t), [0.5 * f, 0.9 * f], atol=1e-12)


def test_interleaved_sine_zeros_below_cutoff():
    # gamma 0.5, P 20: f(0) = 0.5, f(5) = 1, f(13) = 0.5 sin(2.6 pi) + 0.5 = 0.0955
    part = make("interleaved_sine", [0.15, 0.9], period=20, gamma=0.5, cutoff=0.1)
    np.testing.assert_allclose(part.probabilities(0), [0.0, 0.45])   # 0.075 < 0.1 -> 0
    np.testing.assert_allclose(part.probabilities(5), [0.15, 0.9])
    np.testing.assert_allclose(part.probabilities(13), [0.0, 0.0])   # 0.014, 0.086 -> 0
    for t in range(400):
        p = part.probabilities(t)
        assert np.all((p == 0) | (p >= 0.1))
        assert np.all(p[part.available(t)] > 0)


def test_periodic_groups_static_and_staircase_windows():
    p = [0.2, 0.4, 0.6, 0.8]  # no data groups: M1 = {0, 1}, M2 = {2, 3}
    static = make("periodic_groups", p, period=10, window="static")
    stair = make("periodic_groups", p, period=10, window="staircase", low=0.4)
    for t in range(5):  # M1's window t mod 10 < 5
        np.testing.assert_allclose(static.probabilities(t), [0.2, 0.4, 0, 0])
    for t in range(5, 10):
        np.testing.assert_allclose(static.probabilities(t + 10), [0, 0, 0.6, 0.8])
    # staircase inside the 5-round window: 1 for its first half (2.5 rounds), then low
    for t, f in [(0, 1), (2, 1), (3, 0.4), (4, 0.4), (14, 0.4)]:
        np.testing.assert_allclose(stair.probabilities(t), [0.2 * f, 0.4 * f, 0, 0])
    for t, f in [(5, 1), (7, 1), (8, 0.4), (9, 0.4), (25, 1)]:
        np.testing.assert_allclose(stair.probabilities(t), [0, 0, 0.6 * f, 0.8 * f])


def test_periodic_groups_uses_data_groups_and_never_crosses_windows():
    group = np.array([1, 0, 1, 0, 0, 1])
    part = make("periodic_groups", [1.0] * 6, period=8, group=group)
    for t in range(200):
        ids = part.available(t)
        owner = 0 if t % 8 < 4 else 1
        assert ids.tolist() == np.flatnonzero(group == owner).tolist()  # p = 1: the whole group, nobody else
    half = make("periodic_groups", [0.7] * 6, period=100, window="staircase", seed=3)
    for t in range(1000):
        ids = half.available(t)
        assert np.all(ids < 3) if t % 100 < 50 else np.all(ids >= 3)


def test_cyclic_only_group_t_mod_k():
    m, k = 7, 3  # G(i) = floor(3 i / 7) = [0, 0, 0, 1, 1, 2, 2]
    g = np.array([0, 0, 0, 1, 1, 2, 2])
    full = make("cyclic", [1.0], m=m, groups=k)
    part = make("cyclic", [0.3, 0.5, 0.7, 0.2, 0.4, 0.6, 0.8], groups=k, seed=5)
    np.testing.assert_allclose(part.probabilities(4), [0, 0, 0, 0.2, 0.4, 0, 0])
    for t in range(300):
        assert full.available(t).tolist() == np.flatnonzero(g == t % k).tolist()
        assert set(part.available(t)) <= set(np.flatnonzero(g == t % k))


# ----------------------------------------------------------------------------- statistics and seeds

KINDS = [dict(kind="stationary"), dict(kind="staircase", period=20), dict(kind="sine", period=20, gamma=0.3),
         dict(kind="interleaved_sine", period=20, gamma=0.5), dict(kind="periodic_groups", period=100),
         dict(kind="cyclic", groups=3)]


@pytest.mark.parametrize("spec", KINDS, ids=lambda s: s["kind"])
def test_empirical_frequency_matches_mean_probability(spec):
    m, rounds = 8, 2000
    p = list(np.linspace(0.1, 0.9, m))
    part = make(p=p, seed=11, **spec)
    probs = np.stack([part.probabilities(t) for t in range(rounds)])
    freq = show.simulate(make(p=p, seed=11, **spec), rounds)[0] / rounds  # availability counts / rounds
    # count_i is a sum of independent Bernoulli(p_i^t): std = sqrt(sum_t p(1-p)); allow 4.5 std
    tol = 4.5 * np.sqrt((probs * (1 - probs)).sum(axis=0)) / rounds + 1e-12
    assert np.all(np.abs(freq - probs.mean(axis=0)) <= tol), (freq, probs.mean(axis=0), tol)


@pytest.mark.parametrize("spec", KINDS, ids=lambda s: s["kind"])
def test_same_seed_same_pattern_different_seed_differs(spec):
    p = [0.5] * 30

    def pattern(seed):
        part = make(p=p, seed=seed, **spec)
        return [part.available(t).tolist() for t in range(60)]

    assert pattern(4) == pattern(4)
    assert pattern(4) != pattern(5)


# ----------------------------------------------------------------------------- base probabilities

def test_beta_base_deterministic_with_right_mean():
    cfg = BaseProbConfig(kind="beta", a=2.0, b=5.0)
    p = base_probabilities(cfg, ClientInfo(m=20000, seed=1))
    np.testing.assert_array_equal(p, base_probabilities(cfg, ClientInfo(m=20000, seed=1)))
    assert not np.array_equal(p, base_probabilities(cfg, ClientInfo(m=20000, seed=2)))
    var = 2 * 5 / (7**2 * 8)  # Beta(2, 5) variance; tolerance: 5 std of the sample mean
    assert abs(p.mean() - 2 / 7) < 5 * math.sqrt(var / p.size)


def test_dirichlet_phi_uses_actual_histograms():
    hist = np.array([[30, 0, 0, 0], [0, 0, 0, 7], [5, 5, 5, 5], [1, 3, 0, 0], [0, 0, 0, 0]])
    cfg = BaseProbConfig(kind="dirichlet_phi")
    phi = class_weights(cfg, seed=7, classes=4)
    p = base_probabilities(cfg, ClientInfo(m=5, seed=7, label_hist=hist))
    np.testing.assert_allclose(p, [phi[0], phi[3], phi.mean(), 0.25 * phi[0] + 0.75 * phi[1], 0.0])
    floored = base_probabilities(BaseProbConfig(kind="dirichlet_phi", p_min=0.05),
                                 ClientInfo(m=5, seed=7, label_hist=hist))
    assert floored[4] == 0.05


def test_dirichlet_phi_caps_and_phi_max():
    phis = np.stack([class_weights(BaseProbConfig(kind="dirichlet_phi"), s, 10) for s in range(200)])
    assert phis[:, :5].max() > 0.9 and phis[:, 5:].max() <= 0.5 and phis.min() >= 0
    caps = [0.1] * 3
    assert class_weights(BaseProbConfig(kind="dirichlet_phi", phi_max=caps), 0, 3).max() <= 0.1
    with pytest.raises(InputError, match=r"^availability\.base\.phi_max: needs 3"):
        class_weights(BaseProbConfig(kind="dirichlet_phi", phi_max=[1, 1]), 0, 3)


def test_dirichlet_phi_rank_independent():
    """p_i depends only on (seed, client i's histogram): any shard/subset of clients agrees."""
    rs = np.random.default_rng(0)
    hist = rs.integers(0, 50, size=(9, 10))
    cfg = BaseProbConfig(kind="dirichlet_phi")
    full = base_probabilities(cfg, ClientInfo(m=9, seed=3, label_hist=hist))
    part = base_probabilities(cfg, ClientInfo(m=4, seed=3, label_hist=hist[[8, 2, 5, 0]]))
    np.testing.assert_array_equal(part, full[[8, 2, 5, 0]])


def test_dirichlet_phi_needs_labels():
    with pytest.raises(InputError, match=r"^availability\.base\.kind: 'dirichlet_phi' needs"):
        base_probabilities(BaseProbConfig(kind="dirichlet_phi"), ClientInfo(m=3, seed=0))


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["stationary", "staircase", "sine", "interleaved_sine", "periodic_groups", "cyclic"]),
       base=st.sampled_from(["uniform", "beta", "fixed"]), m=st.integers(1, 25), seed=st.integers(0, 2**31),
       period=st.integers(1, 60), gamma=st.floats(0, 1), low=st.floats(0, 1), cutoff=st.floats(0, 1),
       window=st.sampled_from(["static", "staircase"]), groups=st.integers(1, 6), value=st.floats(0, 1),
       t=st.integers(0, 10**6))
def test_probabilities_in_unit_interval(kind, base, m, seed, period, gamma, low, cutoff, window, groups, value, t):
    cfg = availability_params(kind, lenient=True, base=BaseProbConfig(kind=base, values=[value]),
                              period=period, gamma=gamma, low=low, cutoff=cutoff, window=window, groups=groups)
    part = build(cfg, ClientInfo(m=m, seed=seed))
    p = part.probabilities(t)
    assert p.shape == (m,) and np.all((p >= 0) & (p <= 1))
    ids = part.available(t)
    assert np.all(p[ids] > 0)


# ----------------------------------------------------------------------------- the preview CLI

def _args(path, **kw):
    d = dict(config=str(path), set=[], rounds=None, clients=None, out=None, json=False)
    d.update(kw)
    return argparse.Namespace(**d)


@pytest.fixture
def yaml_cfg(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 2\ntask: {clients: 6}\n"
                    "availability: {kind: sine, period: 10, base: {kind: fixed, values: [0.5]}}\n")
    return path


def test_show_json_shape(yaml_cfg, capsys):
    assert show.run_cli(_args(yaml_cfg, rounds=25, clients="0,4", json=True)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["clients"] == [0, 4] and out["rounds"] == 25
    assert np.array(out["p"]).shape == (2, 25) and np.array(out["available"]).shape == (2, 25)
    np.testing.assert_allclose(out["p"][0][:3], 0.5 * (0.3 * np.sin(2 * np.pi * np.arange(3) / 10) + 0.7), atol=1e-6)


def test_show_overrides_table_and_png(yaml_cfg, tmp_path, capsys):
    show.run_cli(_args(yaml_cfg, set=["availability.kind=cyclic", "availability.groups=2"], rounds=4))
    text = capsys.readouterr().out
    assert "cyclic" in text and len(text.splitlines()) == 2 + 4 + 1
    png = tmp_path / "figs" / "a.png"
    assert show.run_cli(_args(yaml_cfg, out=str(png), clients="0,1,2,5")) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_show_bad_clients(yaml_cfg):
    with pytest.raises(InputError, match=r"^--clients:"):
        show.run_cli(_args(yaml_cfg, clients="0,6"))


def test_show_dirichlet_phi_needs_data(yaml_cfg, capsys):
    over = ["availability.base.kind=dirichlet_phi"]
    hist = np.eye(6, 10, dtype=int) * 10  # client i holds only class i
    loader = lambda cfg: ClientInfo(m=cfg.task.clients, seed=cfg.seed, label_hist=hist)  # noqa: E731
    assert show.run_cli(_args(yaml_cfg, set=over, clients="0,1,2,3,4,5", json=True), loader=loader) == 0
    p = np.array(json.loads(capsys.readouterr().out)["p"])
    phi = class_weights(BaseProbConfig(kind="dirichlet_phi"), 2, 10)  # seed 2
    np.testing.assert_allclose(p[:, 0], 0.7 * phi[:6], atol=1e-6)  # f(0) = 1 - gamma = 0.7


@pytest.mark.parametrize("kind", ["always", "cohort", "stationary", "markov", "cyclic", "trace"])
def test_show_every_kind_without_rounds(tmp_path, kind, capsys):
    """#38 item 9: every kind without a period failed with AttributeError 'period' (and those
    without a base with 'base') unless --rounds was given."""
    path = tmp_path / "c.yaml"
    extra = {"trace": "schedule: [[0, 1], [2]]", "cohort": "size: 2"}.get(kind, "")
    path.write_text(f"seed: 2\ntask: {{clients: 6}}\navailability: {{kind: {kind}, {extra}}}\n")
    png = tmp_path / "p.png"
    assert show.run_cli(_args(path, out=str(png))) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert show.run_cli(_args(path, json=True)) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["kind"] == kind and out["rounds"] == 40 and len(out["available"][0]) == 40
