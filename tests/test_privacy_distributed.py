"""Distributed DP (#45 item 2, docs/PRIVACY.md "Distributed noise"): privacy.mechanism
distributed_dgauss | distributed_skellam -- each client's row encoded on the lattice with its noise
share, the integer sum modulo 2^bits decoded on rank 0; its record, its epsilon, its refusals, 1 == 2
ranks and resume."""

from __future__ import annotations

import copy
import math

import h5py
import numpy as np
import pytest
import torch
from conftest import assert_resume_identical, fedmpi, write_config

from fedmpi import config, rng
from fedmpi.build import build_components
from fedmpi.errors import InputError
from fedmpi.participation import Sampling
from fedmpi.privacy import discrete
from fedmpi.privacy.distributed import DistributedParams
from fedmpi.privacy.run import Privacy
from fedmpi.runner import Runner
from fedmpi.runtime import World

dp = pytest.importorskip("dp_accounting")

TASK = {"dataset": "synthetic", "clients": 12, "model": "logreg", "partition": {"kind": "iid"},
        "synthetic": {"samples": 480, "test_samples": 120, "features": 6, "classes": 3}}
BASE = {"name": "ddp", "seed": 5, "rounds": 6, "eval_every": 2, "task": TASK,
        "train": {"local_steps": 3, "batch_size": 8, "lr": 0.2},
        "algorithm": {"name": "fedavg_active"},
        "availability": {"kind": "stationary", "base": {"kind": "fixed", "values": 0.5}},
        "privacy": {"mechanism": "distributed_skellam", "clip": 0.3, "noise_multiplier": 0.8, "bits": 14},
        "runtime": {"progress": False}}
MECHS = ["distributed_dgauss", "distributed_skellam"]


def with_privacy(**keys) -> dict:
    cfg = copy.deepcopy(BASE)
    cfg["privacy"].update(keys)
    return cfg


def privacy(mechanism: str, sigma: float, dim: int, bits: int = 16, cohort: float = 4.0, m: int = 8,
            beta: float = 0.0) -> Privacy:
    params = DistributedParams(mechanism, 1.0, sigma, bits=bits, beta=beta)
    return Privacy(params, Sampling("none", cohort), 3, 11, dim, World(), m=m)


def release(priv: Privacy, t: int, rows: torch.Tensor) -> torch.Tensor:
    """The release of the mean of ``rows`` (each client's update), as the base algorithm's sum makes it."""
    clients = np.arange(rows.shape[0])
    start = torch.zeros_like(rows)

    def summed(end, reduce):
        return reduce(priv.world, lambda s: (end[s] - start[s]).double() / priv.cohort, len(clients), len(clients))

    return priv.release(t, clients, start, rows, summed, lambda total: (total, 1.0, priv.cohort))[1]


# ---------------------------------------------------------------- the release on the lattice
@pytest.mark.parametrize("mechanism", MECHS)
def test_without_noise_the_release_is_the_mean_up_to_the_rounding(mechanism):
    """sigma 0: the decoded mean is the clipped mean up to randomized rounding (unbiased, each
    coordinate of the rotated sum off by at most n, so the error's norm <= n sqrt(d') / (C s) / n~)."""
    priv = privacy(mechanism, 0.0, 100)
    rows = torch.from_numpy(rng.generator(1, "rows").normal(size=(4, 100)) * 0.05)
    mean = rows.double().sum(0) / 4
    got = release(priv, 0, rows)
    cs = priv.mechanism.last["privacy/scale"]
    assert float((got - mean).norm()) <= 4 * math.sqrt(128) / cs / 4
    assert float((got - mean).norm()) > 0  # the rounding is there
    assert priv.mechanism.last["privacy/wrapped"] == 0


@pytest.mark.parametrize("mechanism", MECHS)
def test_the_server_decodes_the_modular_sum_of_the_clients_integers(mechanism):
    """The release is decode(sum_i z_i mod 2^bits) with z_i each client's own encoding (its key
    (seed, purpose, t, i)): recomputed client by client, the same bits."""
    priv = privacy(mechanism, 0.7, 30, bits=12)
    mech = priv.mechanism
    rows = torch.from_numpy(rng.generator(2, "rows").normal(size=(5, 30)) * 0.2)
    got = release(priv, 3, rows)
    clipped = rows.double() * torch.clamp(1.0 / rows.double().norm(dim=1), max=1.0)[:, None]
    cs = mech.scale(0.7, 4.0)
    signs = mech.signs(3)
    z = sum(mech.encode(3, np.array([i]), clipped[i:i + 1], cs, 1.0, (0.7 * cs) ** 2 / 5, signs)[0] for i in range(5))
    want = mech.decode(discrete.centred(torch.remainder(z, 1 << 12), 12), cs, 1.0, signs) / 4
    assert torch.equal(got, want)


@pytest.mark.parametrize("mechanism", MECHS)
def test_the_summed_noise_has_variance_sigma_c_squared_whatever_the_cohort(mechanism):
    """Zero updates: the decoded mean's coordinates have variance (sigma C / n~)^2, for 3 or 12
    clients sharing the noise (each adds (sigma C s)^2 / n_t), to 5 standard errors."""
    for n in (3, 12):
        priv = privacy(mechanism, 1.5, 4096, bits=20, cohort=4.0, m=12)
        got = release(priv, 0, torch.zeros(n, 4096, dtype=torch.float64))
        se = math.sqrt(2 / 4096)
        assert abs(float(got.var()) / (1.5 / 4) ** 2 - 1) < 5 * se + 0.01, n


def test_too_few_bits_wrap_and_say_so():
    """The scale fits a cohort of n~ = 1 in 6 bits; 32 clients with the same update sum to 32 times it:
    coordinates wrap, the record counts them and its bound is 1. Scaled for 32 clients none wrap, and the
    bound (a union over the 64 coordinates of a Bernstein tail at 3.9 standard deviations) is below 0.1."""
    rows = torch.from_numpy(rng.generator(3, "rows").normal(size=(1, 64))).expand(32, 64) * 0.2
    low = privacy("distributed_dgauss", 1.0, 64, bits=6, cohort=1.0, m=32)
    release(low, 0, rows)
    assert low.mechanism.last["privacy/wrapped"] > 0 and low.mechanism.last["privacy/wrap_bound"] == 1.0
    high = privacy("distributed_dgauss", 1.0, 64, bits=24, cohort=32.0, m=32)
    release(high, 0, rows)
    assert high.mechanism.last["privacy/wrapped"] == 0 and high.mechanism.last["privacy/wrap_bound"] < 0.1


# ---------------------------------------------------------------- accounting
@pytest.mark.parametrize("mechanism", MECHS)
def test_epsilon_is_the_papers_bound_from_what_the_run_recorded(mechanism, tmp_path):
    """The epsilon metric recomputed from the result file's privacy/scale (C s) and sigma: k x the
    papers' RDP of one round (DDG with tau of m = 12 clients; Skellam), converted by dp-accounting; k =
    the rounds (stationary sampling is not amplified here). Never amplified, even on a Poisson kind."""
    cfg = config.from_dict(with_privacy(mechanism=mechanism))
    run = build_components(cfg, World())
    assert not run.privacy.amplified
    Runner(cfg, World(), str(tmp_path / "r.h5"), quiet=True).run()
    with h5py.File(tmp_path / "r.h5") as f:
        eps = f["metrics/epsilon"][:]
        rounds = f["metrics/round"][:]
        cs = float(f["privacy/scale"][-1]) * 0.3 / 0.3  # C s in integer units per unit clip: s C / C
        assert np.all(f["privacy/wrapped"][:] == 0) and np.all(f["privacy/wrap_bound"][:] < 1)
    d = discrete.padded(6 * 3 + 3)
    cs = cs * 0.3
    l2 = discrete.rounded_l2(cs, d, 0.0)
    l1 = discrete.rounded_l1(l2, d)
    var = (0.8 * cs) ** 2
    one = (discrete.ddg_rdp(discrete.ORDERS, l2 / math.sqrt(var), l1 / math.sqrt(var),
                            discrete.ddg_tau(var / 12, 12), d) if mechanism == "distributed_dgauss"
           else discrete.skellam_rdp(discrete.ORDERS, l2, l1, var))
    for r, e in zip(rounds, eps):
        want = 0.0 if r == 0 else discrete.epsilon(discrete.ORDERS, r * one, 1e-6)
        assert math.isclose(e, want, rel_tol=1e-9), (r, e, want)


@pytest.mark.parametrize("mechanism", MECHS)
def test_a_target_epsilon_is_calibrated(mechanism):
    run = build_components(config.from_dict(with_privacy(mechanism=mechanism, noise_multiplier=None,
                                                         epsilon=6.0)), World())
    assert 5.99 < run.privacy.epsilon(6) <= 6.0
    with pytest.raises(InputError, match="privacy.epsilon: 0.01 at delta 1e-06 over 6 rounds is out of reach"):
        build_components(config.from_dict(with_privacy(mechanism=mechanism, noise_multiplier=None, epsilon=0.01,
                                                       bits=4)), World())


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("over, says", [
    ({"algorithm": {"name": "fedswe", "k": 2, "max_echo": 3}},
     "privacy.mechanism: distributed_skellam has each client encode its row of the sum, its weighted clipped update; "
     "algorithm.name fedswe makes its own rows"),
    ({"privacy": {"target_quantile": 0.5}}, "privacy.target_quantile: privacy.mechanism distributed_skellam"),
    ({"privacy": {"noise_cohort_size": 50}}, "privacy.noise_cohort_size: privacy.mechanism distributed_skellam"),
    ({"privacy": {"accountant": "pld"}}, "privacy.accountant: pld has no event for the DistributedSkellam"),
    ({"privacy": {"amplification": "required"}}, "privacy.amplification: required, but privacy.mechanism"),
    ({"algorithm": {"name": "fedbuff", "concurrency": 3, "buffer": 2}, "availability": {"kind": "always"},
      "clock": {"kind": "lognormal", "step_time": 1.0, "comm_time": 0.5, "sigma": 0.8}},
     "privacy.mechanism: distributed_skellam encodes the clients of a round together"),
])
def test_what_distributed_noise_does_not_cover_is_refused_in_one_line(over, says):
    cfg = copy.deepcopy(BASE)
    for section, keys in over.items():
        cfg[section] = {**cfg.get(section, {}), **keys} if section == "privacy" else keys
    with pytest.raises(InputError, match=says.replace("(", r"\(").replace(")", r"\)")) as e:
        build_components(config.from_dict(cfg), World())
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- ranks and resume
@pytest.mark.parametrize("mechanism", MECHS)
def test_distributed_noise_resumes_bit_identically(mechanism, tmp_path):
    cfg = config.from_dict(with_privacy(mechanism=mechanism))
    cfg.runtime.checkpoint_every = 2
    assert_resume_identical(cfg, tmp_path, fail_at=3)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("mechanism", MECHS)
def test_one_and_two_ranks_are_bit_identical(mechanism, tmp_path):
    cfg = with_privacy(mechanism=mechanism, beta=math.exp(-0.5))
    cfg["train"]["engine"] = "sequential"
    fedmpi(["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "two.h5")], ranks=2)
    Runner(config.from_dict(cfg), World(), str(tmp_path / "one.h5"), quiet=True).run()
    with h5py.File(tmp_path / "one.h5") as a, h5py.File(tmp_path / "two.h5") as b:
        assert b.attrs["world_size"] == 2
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
        for key in ("metrics/test_loss", "metrics/epsilon", "privacy/wrapped", "privacy/wrap_bound"):
            assert np.array_equal(a[key][:], b[key][:]), key
        assert not np.array_equal(a["metrics/test_loss"][0], a["metrics/test_loss"][-1])


# ---------------------------------------------------------------- the distributed matrix mechanism (#45 item 3)
BANDED = {**BASE, "rounds": 8, "privacy": {**BASE["privacy"], "bits": 16, "band": 3},
          "availability": {"kind": "cyclic", "groups": 3, "base": {"kind": "fixed", "values": 0.8}}}


def test_banded_releases_decode_c_inverse_of_the_lattice_rows():
    """b = 2: round t's lattice holds c_0 X_t + c_1 X_{t-1} + z_t, X_{t-1} re-sent by its clients (their
    own keys (t, i, 1)), and the release is s_t = (w_t - c_1 s_{t-1}) / c_0; recomputed client by client."""
    params = DistributedParams("distributed_skellam", 1.0, 0.6, band=2, bits=16)
    priv = Privacy(params, Sampling("none", 3.0, separation=2), 4, 11, 20, World(), m=9)
    mech = priv.mechanism
    c = mech.c
    assert len(c) == 2 and math.isclose(float(np.dot(c, c)), 1.0)
    rounds = [torch.from_numpy(rng.generator(5, "rows", t).normal(size=(3, 20)) * 0.1).float() for t in range(3)]
    ids = [np.array([0, 1, 2]), np.array([3, 4, 5]), np.array([0, 1, 2])]
    cs = mech.scale(0.6, 3.0)
    s_prev = None
    for t, (rows, who) in enumerate(zip(rounds, ids)):
        start = torch.zeros_like(rows)

        def summed(end, reduce, who=who, start=start):
            return reduce(priv.world, lambda k: (end[k] - start[k]).double() / 3.0, len(who), len(who))

        got = priv.release(t, who, start, rows, summed, lambda total: (total, 1.0, 3.0))[1]
        signs = mech.signs(t)
        u = rows.double() * torch.clamp(1.0 / rows.double().norm(dim=1), max=1.0)[:, None]
        senders = 3 + (3 if t else 0)
        var = (0.6 * cs) ** 2 / senders
        z = mech.encode(t, who, u, cs, 1.0, var, signs).sum(0)
        if t:
            before = rounds[t - 1].double()
            before = before * torch.clamp(1.0 / before.norm(dim=1), max=1.0)[:, None]
            z = z + mech.encode(t, ids[t - 1], before, cs, 1.0, var, signs, lag=1).sum(0)
        w = mech.decode(discrete.centred(torch.remainder(z, 1 << 16), 16), cs, 1.0, signs)
        s = w / c[0] if s_prev is None else (w - c[1] * s_prev) / c[0]
        torch.testing.assert_close(got, s / 3.0, rtol=0, atol=1e-12, msg=f"round {t}")
        s_prev = s


def test_banded_without_noise_recovers_the_sums():
    """sigma 0: s = C^{-1} w = X + C^{-1} (rounding): each release within the rounding of the mean."""
    params = DistributedParams("distributed_dgauss", 1.0, 0.0, band=3, bits=20)
    priv = Privacy(params, Sampling("none", 4.0, separation=3), 6, 11, 50, World(), m=12)
    for t in range(6):
        rows = torch.from_numpy(rng.generator(6, "rows", t).normal(size=(4, 50)) * 0.1)
        got = release(priv, t, rows)
        assert float((got - rows.double().sum(0) / 4).norm()) < 1e-3


def test_banded_epsilon_composes_each_rows_rounded_sensitivity(tmp_path):
    """k participations, each entering b rounds' sums with its rounded c_j u: k sum_j RDP(Delta_2(|c_j| C s))."""
    cfg = config.from_dict(BANDED)
    Runner(cfg, World(), str(tmp_path / "r.h5"), quiet=True).run()
    mech = build_components(cfg, World()).privacy.mechanism
    with h5py.File(tmp_path / "r.h5") as f:
        eps, rounds, cs = f["metrics/epsilon"][:], f["metrics/round"][:], float(f["privacy/scale"][-1]) * 0.3
    var = (0.8 * cs) ** 2
    one = sum(discrete.skellam_rdp(discrete.ORDERS, *mech.bounds(abs(cj) * cs), var) for cj in mech.c)
    assert len(mech.c) == 3
    for r, e in zip(rounds[1:], eps[1:]):
        k = math.ceil(r / 3)  # cyclic with 3 groups: a client in one round of every 3
        assert math.isclose(e, discrete.epsilon(discrete.ORDERS, k * one, 1e-6), rel_tol=1e-9)
    plain = build_components(config.from_dict({**BANDED, "privacy": {**BANDED["privacy"], "band": 1}}), World())
    assert plain.privacy.epsilon(8) < eps[-1]  # the re-sends' rounding costs privacy


def test_banded_needs_separation_of_b_rounds():
    cfg = {**BASE, "privacy": {**BASE["privacy"], "band": 2}}
    with pytest.raises(InputError, match="privacy.band: distributed_skellam needs participations >= b = 2 "
                                         "rounds apart") as e:
        build_components(config.from_dict(cfg), World())
    assert "\n" not in str(e.value)


def test_banded_resumes_bit_identically(tmp_path):
    cfg = config.from_dict(BANDED)
    cfg.runtime.checkpoint_every = 2
    assert_resume_identical(cfg, tmp_path, fail_at=5)


@pytest.mark.slow
@pytest.mark.mpi
def test_banded_one_and_two_ranks_are_bit_identical(tmp_path):
    cfg = copy.deepcopy(BANDED)
    cfg["train"]["engine"] = "sequential"
    fedmpi(["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "two.h5")], ranks=2)
    Runner(config.from_dict(cfg), World(), str(tmp_path / "one.h5"), quiet=True).run()
    with h5py.File(tmp_path / "one.h5") as a, h5py.File(tmp_path / "two.h5") as b:
        assert b.attrs["world_size"] == 2
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
        assert np.array_equal(a["metrics/epsilon"][:], b["metrics/epsilon"][:])
