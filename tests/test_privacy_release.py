"""Privacy as a release around the sum (issue #43 item 2, docs/PRIVACY.md, docs/DESIGN.md "A
release"): DP for asynchronous FL (DP-FedBuff: each server step a release, each client charged the
releases it contributed to) and local DP (``local_gaussian``: each client's noise before the sum),
on the same seam as DP-FedAvg and banded MF."""

from __future__ import annotations

import copy

import h5py
import numpy as np
import pytest
import torch
from conftest import assert_resume_identical, fedmpi, write_config

from fedmpi import config, rng
from fedmpi.build import build_components
from fedmpi.errors import InputError
from fedmpi.participation import Sampling
from fedmpi.privacy.params import PrivacyParams
from fedmpi.privacy.run import Privacy
from fedmpi.runner import Runner
from fedmpi.runtime import World

dp = pytest.importorskip("dp_accounting")

TASK = {"dataset": "synthetic", "clients": 12, "model": "logreg", "partition": {"kind": "iid"},
        "synthetic": {"samples": 480, "test_samples": 120, "features": 6, "classes": 3}}
BUFF = {"name": "dpbuff", "seed": 5, "rounds": 10, "eval_every": 2, "task": TASK,
        "train": {"local_steps": 3, "batch_size": 8, "lr": 0.2},
        "algorithm": {"name": "fedbuff", "concurrency": 5, "buffer": 3, "global_lr": 1.0},
        "availability": {"kind": "always"},
        "clock": {"kind": "lognormal", "step_time": 1.0, "comm_time": 0.5, "sigma": 0.8, "dropout": 0.1},
        "privacy": {"mechanism": "gaussian", "clip": 0.3, "noise_multiplier": 0.8},
        "runtime": {"progress": False}}
LOCAL = {"name": "ldp", "seed": 5, "rounds": 6, "eval_every": 2, "task": TASK,
         "train": {"local_steps": 3, "batch_size": 8, "lr": 0.2},
         "algorithm": {"name": "fedavg_active"},
         "availability": {"kind": "stationary", "base": {"kind": "fixed", "values": 0.5}},
         "privacy": {"mechanism": "local_gaussian", "clip": 0.3, "noise_multiplier": 0.8},
         "runtime": {"progress": False}}


def with_(base: dict, **over) -> dict:
    cfg = copy.deepcopy(base)
    for key, value in over.items():
        section, _, name = key.partition("__")
        if name:
            cfg[section][name] = value
        else:
            cfg[section] = value
    return cfg


def charges(path: str) -> dict[int, np.ndarray]:
    """From a result file's /events: after each server step r, every client's sum over the steps
    so far of n_{j,r}^2 (n_{j,r}: its kept updates in step r)."""
    with h5py.File(path) as f:
        ev = {k: f["events"][k][:] for k in ("client", "round", "outcome")}
    kept = ev["outcome"] == 0  # events.OUTCOMES[0] == "kept"
    total, out = {}, {}
    for r in range(1, int(ev["round"].max()) + 1):
        ids, n = np.unique(ev["client"][kept & (ev["round"] == r)], return_counts=True)
        for i, c in zip(ids, n):
            total[int(i)] = total.get(int(i), 0) + int(c) ** 2
        out[r] = dict(total)
    return out


# ----------------------------------------------------------------------------- DP-FedBuff

def test_dp_fedbuff_epsilon_is_the_libraries_answer_for_the_event_it_declares(tmp_path):
    """Each server step is a release; the schedule (who arrives in which step) is the clock's,
    public: the accountant composes k Gaussians of multiplier sigma, k = max_j sum_r n_{j,r}^2, the
    releases the most charged client contributed to, recomputed here from /events."""
    from fedmpi.clock.events import OUTCOMES

    assert OUTCOMES[0] == "kept"
    path = str(tmp_path / "r.h5")
    Runner(config.from_dict(BUFF), World(), path, quiet=True).run()
    with h5py.File(path) as f:
        rounds, eps = f["metrics/round"][:], f["metrics/epsilon"][:]
        applied = f["privacy/applied_noise_multiplier"][:]
    assert np.all(applied == 0.8)
    counted = charges(path)
    assert max(max(c.values()) for c in counted.values()) >= 2  # a client contributed to several releases
    for r, e in zip(rounds, eps):
        if r == 0:
            assert e == 0
            continue
        k = max(counted[int(r)].values())
        acc = dp.rdp.RdpAccountant()
        acc.compose(dp.SelfComposedDpEvent(dp.GaussianDpEvent(0.8), k))
        assert e == acc.get_epsilon(1e-6), (r, k)


def test_dp_fedbuff_adds_sigma_clip_once_to_each_buffer():
    """Step 0 with noise minus step 0 without = eta_g sigma C / K z_0 (z from the keyed stream of the
    first release); every update is clipped to C where it is made."""
    def first_step(sigma: float):
        cfg = config.from_dict(with_(BUFF, privacy={"mechanism": "gaussian", "clip": 0.01, "noise_multiplier": sigma},
                                     algorithm={"name": "fedbuff", "concurrency": 5, "buffer": 3, "global_lr": 0.5}))
        run = build_components(cfg, World())
        x0 = run.algorithm.x.clone()
        run.algorithm.round(0)
        assert run.privacy.ledger.releases == 1
        return run.algorithm.x - x0, run.spec.dim

    (step0, d), (step1, _) = first_step(0.0), first_step(1.5)
    assert float(step0.norm()) <= 0.5 * 0.01 * (1 + 1e-5)  # eta_g * (sum of 3 updates of norm <= C) / 3
    z0 = torch.from_numpy(rng.normal(rng.key(5, "privacy", 0), np.arange(d))).float()
    torch.testing.assert_close(step1 - step0, 0.5 * 1.5 * 0.01 / 3 * z0, rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("over, says", [
    ({"privacy": {"mechanism": "gaussian", "clip": 0.3, "epsilon": 4.0}},
     "privacy.epsilon: algorithm.name fedbuff is an asynchronous server"),
    ({"privacy": {"mechanism": "gaussian", "clip": 0.3, "noise_multiplier": 1.0, "target_quantile": 0.5}},
     "privacy.target_quantile: algorithm.name fedbuff is an asynchronous server"),
    ({"privacy": {"mechanism": "gaussian", "clip": 0.3, "noise_multiplier": 1.0, "noise_cohort_size": 100}},
     "privacy.noise_cohort_size: algorithm.name fedbuff is an asynchronous server"),
    ({"algorithm": {"name": "fedasync", "concurrency": 5}},
     "privacy.mechanism: algorithm.name 'fedasync' is not covered by the privacy mechanism: it mixes"),
    ({"train": {"local_epochs": 1.0, "batch_size": 8, "lr": 0.2}},
     "train.local_epochs: with it a task of algorithm.name fedbuff (an asynchronous server) lasts"),
    ({"privacy": {"mechanism": "banded_mf", "clip": 0.3, "noise_multiplier": 1.0, "band": 2}},
     "privacy.band: banded_mf needs participations >= b = 2 rounds apart"),
])
def test_what_dp_fedbuff_does_not_cover_is_refused_in_one_line(over, says):
    with pytest.raises(InputError) as e:
        build_components(config.from_dict(with_(BUFF, **over)), World())
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


@pytest.mark.slow
def test_dp_fedbuff_resumes_bit_identically(tmp_path):
    cfg = config.from_dict(BUFF)
    cfg.runtime.checkpoint_every = 2
    assert_resume_identical(cfg, tmp_path, fail_at=5)


# ----------------------------------------------------------------------------- local DP

def test_local_noise_is_each_clients_own_before_the_sum():
    """client_side adds sigma C z_{t,i} to each clipped update, z from (seed, "privacy_local", t, i):
    the same rows whichever clients share the call (any number of ranks)."""
    params = PrivacyParams("local_gaussian", 0.5, 2.0)
    priv = Privacy(params, Sampling("none", 4.0), 3, 11, 5, World())
    start = torch.zeros(3, 5)
    out = priv.client_side(1, np.array([2, 7, 9]), start, start.clone())  # zero updates: the noise alone
    for row, i in zip(out, (2, 7, 9)):
        z = rng.normal(rng.key(11, "privacy_local", 1, i), np.arange(5))
        torch.testing.assert_close(row, torch.from_numpy(2.0 * 0.5 * z).float())
    alone = priv.client_side(1, np.array([7]), start[:1], start[:1].clone())
    assert torch.equal(alone[0], out[1])
    assert priv.mechanism.noise_at == "clients"


def test_local_dp_adds_no_noise_on_the_server_and_is_not_amplified():
    """The sum of a round is the sum of noisy updates (no central noise), and since the server sees
    who sent them, Poisson sampling does not amplify: k x Gaussian(sigma)."""
    run = build_components(config.from_dict(LOCAL), World())
    assert not run.privacy.amplified
    acc = dp.rdp.RdpAccountant()
    acc.compose(dp.GaussianDpEvent(0.8), 6)
    assert run.privacy.epsilon(6) == acc.get_epsilon(1e-6)
    total = torch.zeros(4, dtype=torch.float64)
    assert torch.equal(run.privacy.server_side(0, total), torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize("key, value", [("target_quantile", 0.5), ("noise_cohort_size", 100)])
def test_local_dp_refuses_what_the_clients_cannot_noise_themselves(key, value):
    with pytest.raises(InputError, match=f"privacy.{key}: privacy.mechanism local_gaussian adds the noise on each"):
        config.from_dict(with_(LOCAL, privacy={**LOCAL["privacy"], key: value}))


@pytest.mark.slow
def test_local_dp_resumes_bit_identically(tmp_path):
    cfg = config.from_dict(LOCAL)
    cfg.runtime.checkpoint_every = 2
    assert_resume_identical(cfg, tmp_path, fail_at=3)


# ----------------------------------------------------------------------------- ranks

@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("base", [LOCAL, BUFF], ids=["local_dp", "dp_fedbuff"])
def test_one_and_two_ranks_are_bit_identical(base, tmp_path):
    cfg = with_(base, train={**base["train"], "engine": "sequential"})
    fedmpi(["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "two.h5")], ranks=2)
    Runner(config.from_dict(cfg), World(), str(tmp_path / "one.h5"), quiet=True).run()
    with h5py.File(tmp_path / "one.h5") as a, h5py.File(tmp_path / "two.h5") as b:
        assert b.attrs["world_size"] == 2
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
        for key in ("test_loss", "epsilon"):
            assert np.array_equal(a["metrics"][key][:], b["metrics"][key][:]), key
        assert not np.array_equal(a["metrics/test_loss"][0], a["metrics/test_loss"][-1])
