"""Privacy findings of issue #44 (docs/PRIVACY.md): the noise a run really applied and whose epsilon
is whose under ``privacy.noise_cohort_size``; privacy keys without a mechanism; centred bits of a
zeroed client; hostile accountant inputs and plug-in mechanisms, each one line with exit 2."""

from __future__ import annotations

import csv
import io

import h5py
import numpy as np
import pytest
import torch
from conftest import cli, fedmpi, write_config

from fedmpi import config
from fedmpi.participation import Sampling
from fedmpi.privacy import accounting
from fedmpi.privacy.params import PrivacyParams
from fedmpi.privacy.run import Privacy
from fedmpi.runner import Runner
from fedmpi.runtime import World

dp = pytest.importorskip("dp_accounting")

HALF = {"kind": "stationary", "base": {"kind": "fixed", "values": 0.5}}


def issue_config(privacy: dict, rounds: int = 20) -> dict:
    """Issue #44's set-up: 20 clients, each available with p = 0.5 (n~ = 10)."""
    return {"name": "ncs", "seed": 3, "rounds": rounds, "eval_every": rounds,
            "task": {"dataset": "synthetic", "clients": 20, "model": "logreg", "partition": {"kind": "iid"},
                     "synthetic": {"samples": 400, "test_samples": 100, "features": 8, "classes": 2}},
            "train": {"local_steps": 2, "batch_size": 8, "lr": 0.1},
            "algorithm": {"name": "fedavg_active"}, "availability": HALF, "privacy": privacy,
            "runtime": {"progress": False}}


def poisson_epsilon(sigma: float, rounds: int, q: float = 0.5, delta: float = 1e-6) -> float:
    acc = dp.rdp.RdpAccountant()
    acc.compose(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(sigma)), rounds)
    return acc.get_epsilon(delta)


def refusal(tmp_path, cfg: dict, *extra: str) -> str:
    """The one line of a run refused with exit 2 (a plug-in's run in its own process)."""
    args = ["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "r.h5"), *extra]
    p = fedmpi(args, check=False) if "--plugin" in extra else cli(args)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, (p.returncode, p.stderr[-2000:])
    return p.stderr


# ----------------------------------------------------------------------------- noise_cohort_size

def test_the_noise_applied_is_recorded_and_the_production_epsilon_labelled(tmp_path):
    """Issue #44: 20 clients, p = 0.5, sigma 1, noise_cohort_size 1000 reported epsilon 18.27 and
    noise_multiplier 1.0 while the noise applied was sigma n~ / N = 0.01 (epsilon ~1.1e5). Now the
    file records the multiplier applied each round, ``epsilon`` is this run's (recomputed here from
    the file) and ``epsilon_production`` the production cohort's, which table and export show."""
    path = str(tmp_path / "r.h5")
    cfg = issue_config({"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0, "noise_cohort_size": 1000})
    Runner(config.from_dict(cfg), World(), path, quiet=True).run()
    with h5py.File(path) as f:
        applied = f["privacy/applied_noise_multiplier"][:]
        sigma = f["privacy/noise_multiplier"][:]
        eps, production = f["metrics/epsilon"][-1], f["metrics/epsilon_production"][-1]
    assert applied.shape == (20,) and np.all(applied == 0.01) and np.all(sigma == 1.0)
    acc = dp.rdp.RdpAccountant()
    for s in applied:  # the run's epsilon, from what the file says was applied
        acc.compose(dp.PoissonSampledDpEvent(0.5, dp.GaussianDpEvent(float(s))))
    assert eps == pytest.approx(acc.get_epsilon(1e-6), rel=1e-12) and eps > 1e5
    assert production == poisson_epsilon(1.0, 20) == pytest.approx(18.27, abs=0.01)
    p = cli(["table", path, "--metric", "epsilon_production", "--metric", "epsilon"])
    assert p.returncode == 0 and "18.27" in p.stdout and "epsilon_production" in p.stdout, p.stdout + p.stderr
    p = cli(["export", path, "--out", "-"])
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    assert float(rows[-1]["epsilon_production"]) == production and float(rows[-1]["epsilon"]) == eps
    p = cli(["info", path, "--no-config"])
    assert "applied 0.01" in p.stdout and "epsilon_production that cohort's" in p.stdout


def test_without_noise_cohort_size_the_applied_noise_is_sigma():
    priv = Privacy(PrivacyParams("gaussian", 1.0, 1.3), Sampling("none", 5.0), 10, 0, 3, World())
    assert priv.applied == 1.3 and priv.metric_names == ("epsilon",)
    assert priv.round_record() == {"privacy/noise_multiplier": 1.3, "privacy/applied_noise_multiplier": 1.3}
    acc = dp.rdp.RdpAccountant()
    acc.compose(dp.GaussianDpEvent(1.3), 10)
    assert priv.metrics(10) == {"epsilon": acc.get_epsilon(1e-6)}


@pytest.mark.parametrize("key, value", [("clip", 1.0), ("noise_cohort_size", 1000), ("noise_multiplier", 1.0),
                                        ("target_quantile", 0.5), ("delta", 1e-5)])
def test_privacy_keys_without_a_mechanism_are_refused(key, value, tmp_path):
    """Issue #44: privacy.clip or privacy.noise_cohort_size with no mechanism ran without noise and
    without a word."""
    err = refusal(tmp_path, issue_config({"mechanism": "none", key: value}, rounds=2))
    assert err.startswith(f"fedmpi: error: privacy.{key}: set to") and "privacy.mechanism is none" in err
    refusal_free = issue_config({"mechanism": "none"}, rounds=2)
    config.from_dict(refusal_free)  # the section alone is fine


# ----------------------------------------------------------------------------- centred bits, zero-out

def test_a_zeroed_client_adds_nothing_to_the_centred_bits():
    """Issue #44: under zero-out a client's update is replaced by zeros; its centred bit was +1/2 (a
    zero update is unclipped), so the bit sum moved by 1 and at sigma 1, sigma_b 0.55 the pair (sum,
    bits) had the effective multiplier 0.536, not 1. A zero update now adds 0 to the bit sum: the
    bits move by at most 1/2 and the effective multiplier is sigma."""
    def adapted(norms: list[float]) -> float:
        params = PrivacyParams("gaussian", 1.0, 0.0, target_quantile=0.5, count_bits="centred", clip_lr=0.2)
        priv = Privacy(params, Sampling("none", 4.0), 1, 0, 1, World())
        priv.client_side(0, np.arange(len(norms)), torch.zeros(len(norms), 1),
                         torch.tensor(norms, dtype=torch.float32)[:, None])
        return float(priv.C)

    real, zeroed = adapted([5.0, 0.5, 0.5, 0.5]), adapted([0.0, 0.5, 0.5, 0.5])  # client 0: clipped, then zeroed
    moved = abs(np.log(real) - np.log(zeroed)) / 0.2 * 4.0  # |bit sum difference| = |delta share| n~ / eta_C
    assert moved == pytest.approx(0.5)  # was 1
    sigma, sigma_b = 1.0, 0.55
    priv = Privacy(PrivacyParams("gaussian", 1.0, sigma, target_quantile=0.5, count_noise=sigma_b),
                   Sampling("none", 4.0), 1, 0, 1, World())
    effective = (priv.sigma_update ** -2 + (moved / sigma_b) ** 2) ** -0.5
    assert effective == pytest.approx(sigma) and priv.applied == sigma  # was 0.536 with moved = 1


# ----------------------------------------------------------------------------- hostile accounting inputs

def test_pld_at_a_vanishing_noise_multiplier_is_one_line(tmp_path):
    """Issue #44: pld with sigma 1e-6 ended in an OverflowError traceback."""
    err = refusal(tmp_path, issue_config({"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1e-6,
                                          "accountant": "pld"}, rounds=2))
    assert "privacy.noise_multiplier" in err and "privacy.accountant: rdp" in err


def test_an_unreachable_target_epsilon_is_one_line(tmp_path):
    """Issue #44: privacy.epsilon 1e9 ended in dp-accounting's NoBracketIntervalFoundError."""
    for target in (1e9, 1e300):
        err = refusal(tmp_path, issue_config({"mechanism": "gaussian", "clip": 1.0, "epsilon": target}, rounds=2))
        assert "privacy.epsilon" in err and "smaller target" in err


@pytest.mark.parametrize("mechanism, accountant", [("distributed_dgauss", "rdp"), ("distributed_skellam", "rdp"),
                                                   ("local_gaussian", "rdp"), ("local_gaussian", "pld")])
def test_a_noise_multiplier_whose_variance_underflows_is_one_line(mechanism, accountant, tmp_path):
    """The fresh hostile pass of #44: privacy.noise_multiplier 1e-300 under the distributed mechanisms (and
    local_gaussian) printed numpy's RuntimeWarning (the noise's variance, sigma^2, underflows to 0 and the
    accountant divides by it) and ran with exit 0, or refused after the warning. The accountant's floating-
    point warnings are its failure to bound epsilon: one line naming the key, nothing else on stderr."""
    err = refusal(tmp_path, issue_config({"mechanism": mechanism, "clip": 1.0, "noise_multiplier": 1e-300,
                                          "accountant": accountant}, rounds=2))
    assert err.startswith("fedmpi: error: privacy.noise_multiplier: the noise applied (multiplier 1e-300) is too "
                          f"small for privacy.accountant {accountant}") and "Warning" not in err


@pytest.mark.parametrize("mechanism, accountant", [("gaussian", "rdp"), ("banded_mf", "pld")])
def test_a_target_epsilon_beyond_calibrations_reach_is_refused_at_once(mechanism, accountant, tmp_path):
    """The fresh hostile pass of #44: privacy.epsilon 1e-300 searched for minutes (gaussian rdp ~45 s,
    banded_mf pld > 120 s) and ran at sigma ~7e5, where the RDP accountant's epsilon, flat at ~0.006 from
    1e4 on, drops to 0 as delta alone covers the release. Calibration stops at accounting.MOST_NOISE."""
    from helpers.deadline import deadline

    with deadline(25):
        err = refusal(tmp_path, issue_config({"mechanism": mechanism, "clip": 1.0, "epsilon": 1e-300,
                                              "accountant": accountant}, rounds=2))
    assert err.startswith("fedmpi: error: privacy.epsilon: 1e-300 at delta 1e-06 over 2 rounds needs a noise "
                          "multiplier above 10000, the most calibration gives (epsilon 0.00")


@pytest.mark.parametrize("key, value", [("clip", 1e308), ("noise_multiplier", 1e300)])
def test_a_clip_or_noise_beyond_any_use_is_one_line(key, value, tmp_path):
    """The fresh hostile pass of #44: privacy.clip 1e308 ended as exit 4 'diverged ... lower train.lr'
    (and in a traceback under the distributed mechanisms); both keys are bounded at 1e6."""
    err = refusal(tmp_path, issue_config({"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0,
                                          key: value}, rounds=2))
    assert f"privacy.{key}: must be <= 1000000.0" in err


def test_a_calibration_that_misses_its_target_is_refused(monkeypatch):
    """dp-accounting's search may end at a multiplier whose epsilon is above the target (a target
    below the least epsilon its RDP orders certify): refused, not run with more epsilon."""
    from fedmpi.privacy.gaussian import Gaussian

    import dp_accounting.mechanism_calibration as mc

    monkeypatch.setattr(mc, "calibrate_dp_mechanism", lambda *a, **k: 1.0)
    mechanism = Gaussian(PrivacyParams("gaussian", 1.0, None, epsilon=0.5), 1, 0, torch.device("cpu"), 10)
    with pytest.raises(config.InputError, match="privacy.epsilon: 0.5 at delta 1e-06 over 10 rounds is out of reach"):
        accounting.calibrate(mechanism, Sampling("none", 5.0), False, 0.5, 10, 1e-6)


# ----------------------------------------------------------------------------- hostile plug-in mechanisms

ZERO_SENSITIVITY = '''
from fedmpi.privacy import register
from fedmpi.privacy.gaussian import Gaussian


@register("careless")
class Careless(Gaussian):
    def sensitivity(self, sampling, amplified):
        return 0.0
'''


@pytest.mark.slow
def test_hostile_plugin_mechanisms_are_one_line(tmp_path):
    """Issue #44: a plug-in mechanism with NaN/inf coefficients ended as 'diverged', one with
    sensitivity 0 in a ZeroDivisionError traceback."""
    import os

    from conftest import ROOT

    own = os.path.join(ROOT, "examples", "fedmpi_examples")
    for bad in (".nan", ".inf"):
        cfg = issue_config({"mechanism": "own_factor", "clip": 1.0, "noise_multiplier": 1.0, "band": 2,
                            "coefficients": [1.0, 0.5]}, rounds=2)
        cfg["availability"] = {"kind": "cyclic", "groups": 2, "base": {"kind": "fixed", "values": 0.5}}
        path = write_config(tmp_path / "c.yaml", cfg)
        with open(path) as fh:
            text = fh.read().replace("0.5]", f"{bad}]").replace("- 0.5\n", f"- {bad}\n")
        with open(path, "w") as fh:
            fh.write(text)
        p = fedmpi(["run", path, "--quiet", "--out", str(tmp_path / "r.h5"), "--plugin", own], check=False)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr[-2000:]
        assert "privacy.mechanism: own_factor's factor coefficients() must be finite" in p.stderr
    plugin = tmp_path / "careless.py"
    plugin.write_text(ZERO_SENSITIVITY)
    err = refusal(tmp_path, issue_config({"mechanism": "careless", "clip": 1.0, "noise_multiplier": 1.0}, rounds=2),
                  "--plugin", str(plugin))
    assert "privacy.mechanism: careless's sensitivity() is 0.0" in err and "finite number > 0" in err


def test_a_banded_factor_whose_inverse_overflows_is_refused():
    from fedmpi.privacy.banded import BandedMF, BandedParams

    class Exploding(BandedMF):
        def coefficients(self):
            c = np.array([0.1, 0.995])
            return c / np.linalg.norm(c)

    params = BandedParams("banded_mf", 1.0, 1.0, band=2)
    Exploding(params, 3, 0, torch.device("cpu"), 50)  # grows 10x a round: finite for 50 rounds
    with pytest.raises(config.InputError, match="has an inverse that overflows within 400 rounds"):
        Exploding(params, 3, 0, torch.device("cpu"), 400)
