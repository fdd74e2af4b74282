"""Privacy, second step (issue #34): what a DP researcher reports (the noise multiplier in the
result file and ``fedmpi info``), amplified banded MF, accounting of fixed-size cohorts, centred
adaptive clipping and production-cohort noise (docs/PRIVACY.md)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import synthetic_config

from fedmpi import config
from fedmpi.cli import main
from fedmpi.runner import Runner
from fedmpi.runtime import World

dp = pytest.importorskip("dp_accounting")

SPARSE = {"kind": "stationary", "base": {"kind": "fixed", "values": [0.5]}}


def run(cfg: dict, path) -> str:
    Runner(config.from_dict(cfg), World(), str(path), quiet=True).run()
    return str(path)


# ----------------------------------------------------------------------------- what users report

@pytest.mark.slow
def test_info_shows_the_calibrated_noise_multiplier(tmp_path, capsys):
    cfg = synthetic_config(rounds=4, algorithm={"name": "fedavg_active"}, availability=SPARSE,
                           privacy={"mechanism": "gaussian", "clip": 1.0, "epsilon": 8.0})
    out = run(cfg, tmp_path / "r.h5")
    with h5py.File(out) as f:
        sigma = f["privacy/noise_multiplier"][:]
    assert sigma.shape == (4,) and sigma[0] > 0
    assert main(["info", out, "--no-config"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("privacy:"))
    assert f"noise multiplier {sigma[0]:.6g} (calibrated to epsilon 8 over 4 rounds)" in line, line
    assert "gaussian" in line and "delta 1e-06" in line and "accountant rdp" in line


def test_info_shows_a_given_noise_multiplier_beside_other_runs(tmp_path, capsys):
    cfg = synthetic_config(rounds=2, algorithm={"name": "fedavg_active"}, availability=SPARSE)
    plain = run(cfg, tmp_path / "plain.h5")
    cfg["privacy"] = {"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 0.75}
    private = run(cfg, tmp_path / "dp.h5")
    assert main(["info", private, "--no-config"]) == 0
    assert "noise multiplier 0.75 (given)" in capsys.readouterr().out
    assert main(["info", plain, private, "--no-config"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("noise multiplier"))
    assert row.split()[2:] == ["-", "0.75"]


# ----------------------------------------------------------------------------- amplified banded MF

def cyclic_cfg(privacy: dict, groups: int = 3, q: float = 0.5, name: str = "fedavg_active", rounds: int = 9) -> dict:
    return synthetic_config(rounds=rounds, eval_every=3, algorithm={"name": name, **({"max_echo": 2} if name ==
                                                                                     "fedswe" else {})},
                            availability={"kind": "cyclic", "groups": groups, "base": {"kind": "fixed", "values": [q]}},
                            privacy={"clip": 1.0, "noise_multiplier": 1.5, **privacy})


def library(event) -> float:
    acc = dp.rdp.RdpAccountant()
    acc.compose(event)
    return acc.get_epsilon(1e-6)


@pytest.mark.parametrize("groups, band", [(3, 3), (4, 2)])
def test_amplified_banded_mf_is_the_libraries_answer(groups, band, tmp_path):
    """cyclic with groups >= band and Poisson sampling inside: k = ceil(T / groups) Poisson-sampled
    Gaussians (jax_privacy's amplified_bandmf_event), at every evaluation of a real run."""
    out = run(cyclic_cfg({"mechanism": "banded_mf", "band": band}, groups), tmp_path / "r.h5")
    with h5py.File(out) as f:
        rounds, eps = f["metrics/round"][:], f["metrics/epsilon"][:]
    for T, e in zip(rounds[1:], eps[1:]):
        k = -(-int(T) // groups)
        assert e == library(dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(0.5, dp.GaussianDpEvent(1.5)), k))
        assert e < library(dp.SelfComposedDpEvent(dp.GaussianDpEvent(1.5), k))  # what was reported before


def epsilon_of(cfg: dict, rounds: int = 9) -> float:
    from fedmpi.build import build_components

    return build_components(config.from_dict(cfg), World()).algorithm.privacy.epsilon(rounds)


def test_amplification_off_charges_every_participation_in_full():
    for mechanism in ({"mechanism": "banded_mf", "band": 3}, {"mechanism": "gaussian"}):
        got = epsilon_of(cyclic_cfg({**mechanism, "amplification": "off"}))
        assert got == library(dp.SelfComposedDpEvent(dp.GaussianDpEvent(1.5), 3))


def test_a_banded_run_that_shows_who_took_part_is_not_amplified():
    """FedSWE's release shows who took part: k x Gaussian(sigma) on cyclic too."""
    got = epsilon_of(cyclic_cfg({"mechanism": "banded_mf", "band": 3}, name="fedswe"))
    assert got == library(dp.SelfComposedDpEvent(dp.GaussianDpEvent(1.5), 3))


@pytest.mark.parametrize("change, keys", [
    ({"availability": {"kind": "markov", "B": 3, "R": 2}}, ["availability.kind 'markov'"]),
    ({"algorithm": {"name": "fedswe", "max_echo": 2}}, ["algorithm.name 'fedswe'"]),
    ({"availability": {"kind": "cohort", "size": 4}, "band": 1},
     ["privacy.mechanism 'banded_mf'", "availability.kind 'cohort'"]),
])
def test_required_amplification_is_refused_in_one_line_where_it_cannot_be_claimed(change, keys, tmp_path):
    from conftest import cli, write_config

    cfg = cyclic_cfg({"mechanism": "banded_mf", "band": 3, "amplification": "required"})
    for k, v in change.items():
        if k == "band":
            cfg["privacy"]["band"] = v
        else:
            cfg[k] = v
    p = cli(["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "r.h5")])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "privacy.amplification: required" in p.stderr and all(k in p.stderr for k in keys), p.stderr
    cfg["privacy"]["amplification"] = "auto"  # the same run is accepted, charged in full
    assert epsilon_of(cfg) > 0


@pytest.mark.parametrize("privacy, name, said", [
    ({"mechanism": "banded_mf", "band": 3}, "fedavg_active",
     "banded_mf (factor sqrt, band 3)|amplification by sampling claimed (poisson sampling of availability.kind "
     "'cyclic')"),
    ({"mechanism": "gaussian", "amplification": "off"}, "fedavg_active",
     "amplification by sampling not claimed: privacy.amplification is off"),
    ({"mechanism": "banded_mf", "band": 3}, "fedswe",
     "amplification by sampling not claimed: algorithm.name 'fedswe' shows who took part"),
])
def test_info_says_whether_amplification_was_claimed_and_why(privacy, name, said, tmp_path, capsys):
    """#46 (4): with amplification: auto nobody could tell from a file that DP-FedAvg on cyclic
    participation was amplified; ``fedmpi info`` says it (and banded_mf's factor and band)."""
    out = run(cyclic_cfg(privacy, name=name, rounds=3), tmp_path / "r.h5")
    assert main(["info", out, "--no-config"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("privacy:"))
    assert all(part in line for part in said.split("|")), line


def test_a_target_epsilon_calibrates_the_amplified_banded_noise():
    from fedmpi.build import build_components

    def sigma(amplification: str) -> float:
        cfg = cyclic_cfg({"mechanism": "banded_mf", "band": 3, "epsilon": 4.0, "amplification": amplification},
                         q=0.1, rounds=30)
        del cfg["privacy"]["noise_multiplier"]
        return float(build_components(config.from_dict(cfg), World()).algorithm.privacy.sigma)

    amplified, full = sigma("required"), sigma("off")
    assert amplified < full / 2
    event = dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(0.1, dp.GaussianDpEvent(amplified)), 10)
    assert library(event) == pytest.approx(4.0, rel=1e-3) and library(event) <= 4.0


# ----------------------------------------------------------------------------- adaptive clipping, production noise

def adaptive(sigma: float, count_noise: float | None = None, bits: str = "centred", cohort: float = 10.0,
             noise_cohort_size: int | None = None):
    from fedmpi.participation import Sampling
    from fedmpi.privacy.params import PrivacyParams
    from fedmpi.privacy.run import Privacy

    params = PrivacyParams("gaussian", 1.0, sigma, target_quantile=0.5, count_noise=count_noise, count_bits=bits,
                           noise_cohort_size=noise_cohort_size)
    return Privacy(params, Sampling("none", cohort), 10, 0, 4, World())


def test_centred_bits_cost_a_quarter_of_the_budget():
    """Centred bits b_i - 1/2 move by 1/2 per client: the pair (sum, bits) at multipliers sigma_u and
    sigma_b costs 1 / sigma_u^2 + 1 / (2 sigma_b)^2 = 1 / sigma^2 in RDP."""
    centred, uncentred = adaptive(2.0, 3.0), adaptive(2.0, 3.0, "uncentred")
    assert centred.sigma_update == pytest.approx((2.0 ** -2 - 6.0 ** -2) ** -0.5)
    assert uncentred.sigma_update == pytest.approx((2.0 ** -2 - 3.0 ** -2) ** -0.5)
    assert 2.0 < centred.sigma_update < uncentred.sigma_update
    adaptive(2.0, 1.5)  # 2 x 1.5 > 2: accepted with centred bits
    with pytest.raises(config.InputError, match="privacy.count_noise: adaptive clipping needs 2 x"):
        adaptive(2.0, 0.9)


def test_centred_bits_estimate_the_same_share():
    """With the noise at 0 and the realised cohort n~, the centred estimate is the unclipped share."""
    import torch

    for bits in ("centred", "uncentred"):
        priv = adaptive(0.0, bits=bits, cohort=10.0)
        start, end = torch.zeros(10, 1), torch.arange(1.0, 11.0)[:, None]  # norms 1..10, C = 1: 1 unclipped
        priv.client_side(0, np.arange(10), start, end)
        assert priv.C == pytest.approx(np.exp(-0.2 * (0.1 - 0.5)))


def test_noise_cohort_size_scales_the_noise_as_for_that_cohort():
    import torch

    plain, production = adaptive(2.0, 30.0), adaptive(2.0, 30.0, noise_cohort_size=1000)
    y0, y1 = (p.noise(0, 4, torch.device("cpu")) for p in (plain, production))
    torch.testing.assert_close(y1, y0 * (10.0 / 1000), rtol=1e-12, atol=0)
    assert production.clipping.sigma_count == 30.0
    assert adaptive(2.0, noise_cohort_size=1000).clipping.sigma_count == 50.0
    assert production.epsilon(10, production=True) == plain.epsilon(10)  # the production cohort's epsilon
    assert production.applied == 2.0 * 10.0 / 1000 and production.epsilon(10) > plain.epsilon(10)  # this run's


def test_noise_cohort_size_in_a_run_labels_the_production_epsilon(tmp_path, capsys):
    cfg = synthetic_config(rounds=4, algorithm={"name": "fedavg_active"}, availability=SPARSE,
                           privacy={"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0,
                                    "noise_cohort_size": 600})
    out = run(cfg, tmp_path / "r.h5")
    with h5py.File(out) as f:
        eps = f["metrics/epsilon_production"][-1]
    assert main(["info", out, "--no-config"]) == 0
    assert "noise as for a cohort of 600: applied" in capsys.readouterr().out
    acc = dp.rdp.RdpAccountant()
    acc.compose(dp.PoissonSampledDpEvent(0.5, dp.GaussianDpEvent(1.0)), 4)
    assert eps == acc.get_epsilon(1e-6)
    cfg["privacy"]["noise_cohort_size"] = 0
    with pytest.raises(config.InputError, match="privacy.noise_cohort_size"):
        config.from_dict(cfg)
