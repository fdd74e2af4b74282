"""Client-level differential privacy (issue #27, docs/PRIVACY.md): clipping, DP-FedAvg noise,
banded matrix-factorization noise, the accountant, the refusals, ranks and resume."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from conftest import assert_resume_identical, cli, fedmpi, synthetic_config, write_config

from fedmpi import config, rng
from fedmpi.build import build_components
from fedmpi.participation import Sampling
from fedmpi.privacy.banded import BandedParams, banded_sqrt_coefficients
from fedmpi.privacy.params import PrivacyParams
from fedmpi.privacy.run import Privacy
from fedmpi.runner import Runner
from fedmpi.runtime import World

dp = pytest.importorskip("dp_accounting")


def markov_cfg(privacy: dict | None = None, name: str = "fedavg_markov", R: int = 2, **over) -> dict:
    """12 clients, B = 3 per round, minimum separation R; ``privacy`` the section (None = off)."""
    cfg = synthetic_config(**{"rounds": 8, "algorithm": {"name": name},
                              "availability": {"kind": "markov", "B": 3, "R": R,
                                               "base": {"kind": "uniform", "lo": 0.1, "hi": 0.9}}, **over})
    if privacy is not None:
        cfg["privacy"] = privacy
    return cfg


def run_h5(cfg: dict, path) -> h5py.File:
    Runner(config.from_dict(cfg), World(), str(path), quiet=True).run()
    return h5py.File(path)


# ----------------------------------------------------------------------------- DP-FedAvg

@pytest.mark.parametrize("name", ["fedavg_markov", "debiased_fedavg"])
def test_zero_noise_without_clipping_is_the_algorithm_bit_for_bit(name, tmp_path):
    with run_h5(markov_cfg(None, name), tmp_path / "plain.h5") as a, \
            run_h5(markov_cfg({"mechanism": "gaussian", "noise_multiplier": 0.0}, name), tmp_path / "dp.h5") as b:
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
        assert np.array_equal(a["metrics/test_loss"][:], b["metrics/test_loss"][:])
        assert b["metrics/epsilon"][0] == 0 and np.isinf(b["metrics/epsilon"][-1])  # no noise: no guarantee


def test_noise_std_is_sigma_clip_over_expected_cohort():
    sigma, clip, cohort, d, rounds = 1.3, 0.7, 5.0, 2000, 100
    priv = Privacy(PrivacyParams("gaussian", clip, sigma), Sampling("none", cohort), rounds, 11, d, World())
    noise = torch.stack([priv.noise(t, d, torch.device("cpu")) for t in range(rounds)])
    assert float(noise.std()) == pytest.approx(sigma * clip / cohort, rel=0.01)
    assert abs(float(noise.mean())) < 0.01 * sigma * clip / cohort
    assert not torch.equal(noise[0], noise[1])  # a new draw every round


def test_the_server_adds_the_noise_once_to_the_mean_of_clipped_updates():
    """Round 0 with noise minus round 0 without = eta_g sigma C / n~ z_0; the updates are clipped."""
    def first_round(sigma: float):
        cfg = config.from_dict(markov_cfg({"mechanism": "gaussian", "clip": 0.05, "noise_multiplier": sigma},
                                          train={"local_steps": 3, "batch_size": 8, "lr": 0.5}))
        cfg.algorithm.global_lr = 0.5
        run = build_components(cfg, World())
        x0 = run.algorithm.x.clone()
        run.algorithm.round(0)
        return run.algorithm.x - x0, run.spec.dim

    (step0, d), (step1, _) = first_round(0.0), first_round(2.0)
    assert float(step0.norm()) <= 0.5 * 0.05 * (1 + 1e-5)  # eta_g * mean of B updates of norm <= C
    z0 = torch.from_numpy(rng.normal(rng.key(3, "privacy", 0), np.arange(d))).float()
    torch.testing.assert_close(step1 - step0, 0.5 * 2.0 * 0.05 / 3 * z0, rtol=1e-4, atol=1e-7)


def test_clipping_shrinks_long_updates_only():
    priv = Privacy(PrivacyParams("gaussian", 1.0, 0.0), Sampling("none", 2.0), 1, 0, 3, World())
    start = torch.zeros(2, 3)
    end = torch.tensor([[3.0, 4.0, 0.0], [0.3, 0.4, 0.0]])
    out = priv.client_side(0, np.arange(2), start, end)
    torch.testing.assert_close(out, torch.tensor([[0.6, 0.8, 0.0], [0.3, 0.4, 0.0]]))


def test_adaptive_clipping_follows_the_quantile_of_the_update_norms():
    params = PrivacyParams("gaussian", clip=0.1, noise_multiplier=0.0, target_quantile=0.3)
    priv = Privacy(params, Sampling("none", 10.0), 300, 0, 1, World())
    start, end = torch.zeros(10, 1), torch.arange(1.0, 11.0)[:, None]  # update norms 1..10
    for t in range(300):
        priv.client_side(t, np.arange(10), start, end)
    assert 3.0 <= priv.C < 4.0  # 3 of the 10 updates unclipped


def test_adaptive_clipping_spends_part_of_the_budget_on_the_count():
    def privacy(sigma: float, count_noise: float | None, cohort: float = 10.0) -> Privacy:
        params = PrivacyParams("gaussian", 1.0, sigma, target_quantile=0.5, count_noise=count_noise,
                               count_bits="uncentred")  # centred: tests/test_privacy_reports.py
        return Privacy(params, Sampling("none", cohort), 10, 0, 1, World())

    assert privacy(2.0, 4.0).sigma_update == pytest.approx((2.0 ** -2 - 4.0 ** -2) ** -0.5)
    assert privacy(2.0, None, cohort=100.0).clipping.sigma_count == 5.0  # n~ / 20
    with pytest.raises(config.InputError, match="privacy.count_noise"):
        privacy(2.0, 1.5)


def test_epsilon_is_the_libraries_answer_for_poisson_sampling(tmp_path):
    q, sigma, delta = 0.4, 1.1, 1e-6
    cfg = synthetic_config(algorithm={"name": "fedavg_active"},
                           availability={"kind": "stationary", "base": {"kind": "fixed", "values": [q]}},
                           privacy={"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": sigma, "delta": delta})
    with run_h5(cfg, tmp_path / "r.h5") as f:
        rounds, eps = f["metrics/round"][:], f["metrics/epsilon"][:]
    for T, e in zip(rounds[1:], eps[1:]):
        acc = dp.rdp.RdpAccountant()
        acc.compose(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(sigma)), int(T))
        assert e == acc.get_epsilon(delta)
    assert eps[0] == 0 and np.all(np.diff(eps) > 0)


@pytest.mark.slow
def test_the_pld_accountant_gives_the_libraries_answer(tmp_path):
    q, sigma, delta = 0.4, 1.1, 1e-6
    cfg = synthetic_config(algorithm={"name": "fedavg_active"},
                           availability={"kind": "stationary", "base": {"kind": "fixed", "values": [q]}},
                           privacy={"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": sigma, "delta": delta,
                                    "accountant": "pld"})
    with run_h5(cfg, tmp_path / "r.h5") as f:
        rounds, eps = f["metrics/round"][:], f["metrics/epsilon"][:]
    for T, e in zip(rounds[1:], eps[1:]):
        pld, rdp = dp.pld.PLDAccountant(), dp.rdp.RdpAccountant()
        for acc in (pld, rdp):
            acc.compose(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(sigma)), int(T))
        assert e == pld.get_epsilon(delta) and e < rdp.get_epsilon(delta)  # PLD is the tighter one
    assert eps[0] == 0 and np.all(np.diff(eps) > 0)


def test_pld_refuses_the_fixed_size_cohort_it_has_no_event_for(tmp_path):
    cfg = markov_cfg({"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0, "accountant": "pld"},
                     "fedavg_active")
    cfg["availability"] = {"kind": "cohort", "size": 4}
    assert "privacy.accountant: pld has no event" in cli_error(tmp_path, cfg)


@pytest.mark.slow
def test_a_pld_target_epsilon_calibrates_with_pld():
    cfg = config.from_dict(markov_cfg({"mechanism": "gaussian", "clip": 1.0, "epsilon": 4.0, "accountant": "pld"},
                                      rounds=30))
    priv = build_components(cfg, World()).algorithm.privacy
    acc = dp.pld.PLDAccountant()
    acc.compose(dp.GaussianDpEvent(priv.sigma), 10)  # R = 2: at most 10 of 30 rounds
    assert priv.epsilon(30) == acc.get_epsilon(1e-6) and priv.epsilon(30) == pytest.approx(4.0, rel=1e-3)


def test_a_target_epsilon_calibrates_the_noise_multiplier():
    cfg = config.from_dict(markov_cfg({"mechanism": "gaussian", "clip": 1.0, "epsilon": 4.0}, rounds=30))
    priv = build_components(cfg, World()).algorithm.privacy
    assert priv.epsilon(30) <= 4.0 and priv.epsilon(30) == pytest.approx(4.0, rel=1e-3)
    # min separation R = 2: a client takes part in at most ceil(30 / 3) = 10 rounds, no amplification
    acc = dp.rdp.RdpAccountant()
    acc.compose(dp.GaussianDpEvent(priv.sigma), 10)
    assert priv.epsilon(30) == acc.get_epsilon(1e-6)


@pytest.mark.parametrize("availability, want", [
    ({"kind": "always"}, Sampling("none", 12.0)),
    ({"kind": "cohort", "size": 4}, Sampling("fixed_size", 4.0, q=1 / 3, m=12, size=4)),
    ({"kind": "stationary", "base": {"kind": "fixed", "values": [0.25]}},
     Sampling("poisson", 3.0, q=0.25, period=1)),
    ({"kind": "cyclic", "groups": 3, "base": {"kind": "fixed", "values": [0.5]}},
     Sampling("poisson", 2.0, q=0.5, separation=3, separation_key="availability.groups", period=3)),
    ({"kind": "markov", "B": 3, "R": 2}, Sampling("none", 3.0, separation=3, separation_key="availability.R + 1")),
])
def test_the_sampling_each_availability_gives_the_accountant(availability, want):
    cfg = markov_cfg({"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0}, "fedavg_active")
    cfg["availability"] = availability
    assert build_components(config.from_dict(cfg), World()).algorithm.privacy.sampling == want


def test_a_fixed_size_cohort_is_accounted_as_sampling_without_replacement():
    s = Sampling("fixed_size", 4.0, q=1 / 3, m=12, size=4)
    priv = Privacy(PrivacyParams("gaussian", 1.0, 2.0), s, 10, 0, 1, World())
    acc = dp.rdp.RdpAccountant(neighboring_relation=dp.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp.SampledWithoutReplacementDpEvent(12, 4, dp.GaussianDpEvent(1.0)), 10)  # sensitivity 2C
    assert priv.epsilon(10) == acc.get_epsilon(1e-6)


def test_a_resumed_run_keeps_its_calibrated_noise_when_given_more_rounds():
    def algorithm(rounds: int):
        cfg = markov_cfg({"mechanism": "gaussian", "clip": 1.0, "epsilon": 4.0}, rounds=rounds)
        return build_components(config.from_dict(cfg), World()).algorithm

    first, longer = algorithm(30), algorithm(60)
    assert longer.privacy.sigma > first.privacy.sigma
    longer.load_state_dict(first.state_dict())
    assert longer.privacy.sigma == first.privacy.sigma and longer.privacy.epsilon(60) > 4.0


# ----------------------------------------------------------------------------- banded MF

def test_banded_coefficients_are_the_square_root_of_prefix_sums():
    n = 7
    c = banded_sqrt_coefficients(n)
    c = c / c[0]  # before the unit-norm scaling: c_j = binom(2j, j) / 4^j
    C = sum(np.diag(np.full(n - j, c[j]), -j) for j in range(n))
    np.testing.assert_allclose(C @ C, np.tril(np.ones((n, n))), atol=1e-12)
    assert np.linalg.norm(banded_sqrt_coefficients(3)) == pytest.approx(1.0)


def test_banded_noise_is_the_dense_triangular_solve():
    """Round t's noise is the t-th row of C^{-1} Z: incremental (O(b d)) == plain triangular solve."""
    from scipy.linalg import solve_triangular

    b, T, d, seed, sigma, clip, cohort = 3, 10, 4, 5, 1.5, 2.0, 4.0
    priv = Privacy(BandedParams("banded_mf", clip, sigma, band=b), Sampling("none", cohort, separation=b), T, seed, d,
                   World())
    got = torch.stack([priv.noise(t, d, torch.device("cpu")) for t in range(T)]).numpy()
    c = banded_sqrt_coefficients(b)
    C = sum(np.diag(np.full(T - j, c[j]), -j) for j in range(b))
    Z = np.stack([rng.normal(rng.key(seed, "privacy", t), np.arange(d)) for t in range(T)])
    want = solve_triangular(C, Z, lower=True) * sigma * clip / cohort
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("availability, message", [
    ({"kind": "markov", "B": 3, "R": 1}, "privacy.band: banded_mf needs participations >= b = 3 rounds apart"),
    ({"kind": "cyclic", "groups": 2}, "availability.groups >= 3"),
    ({"kind": "stationary"}, "privacy.band"),
])
def test_banded_is_refused_without_separation(availability, message, tmp_path):
    cfg = markov_cfg({"mechanism": "banded_mf", "clip": 1.0, "noise_multiplier": 1.0, "band": 3})
    cfg["availability"] = availability
    assert message in cli_error(tmp_path, cfg)


@pytest.mark.parametrize("privacy, key", [
    ({"mechanism": "gaussian", "clip": 1.0}, "privacy.noise_multiplier"),
    ({"mechanism": "gaussian", "noise_multiplier": 1.0}, "privacy.clip"),
    ({"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0, "epsilon": 2.0}, "privacy.noise_multiplier"),
])
def test_incomplete_sections_are_refused(privacy, key):
    with pytest.raises(config.InputError, match=key):
        config.from_dict(markov_cfg(privacy))


@pytest.mark.parametrize("name", ["scaffold", "mifa"])
def test_algorithms_whose_sum_is_not_a_clipped_mean_are_refused(name):
    with pytest.raises(config.InputError, match=f"privacy.mechanism: algorithm.name '{name}'"):
        config.from_dict(markov_cfg({"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0}, name))


BANDED = {"mechanism": "banded_mf", "clip": 0.5, "noise_multiplier": 0.3, "band": 3}
ADAPTIVE = {"mechanism": "gaussian", "clip": 0.05, "noise_multiplier": 0.3, "target_quantile": 0.5,
            "count_noise": 2.0}


@pytest.mark.slow
@pytest.mark.parametrize("privacy", [BANDED, ADAPTIVE], ids=["banded", "adaptive"])
def test_resume_is_bit_identical_with_privacy(privacy, tmp_path):
    cfg = config.from_dict(markov_cfg(privacy, "debiased_fedavg"))
    cfg.rounds, cfg.eval_every, cfg.runtime.checkpoint_every = 8, 2, 2
    assert_resume_identical(cfg, tmp_path)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("privacy", [BANDED, ADAPTIVE], ids=["banded", "adaptive"])
def test_one_and_two_ranks_are_bit_identical_with_privacy(privacy, tmp_path):
    cfg = markov_cfg(privacy, "debiased_fedavg", train={"engine": "sequential", "local_steps": 3,
                                                        "batch_size": 8, "lr": 0.1})
    fedmpi(["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "two.h5")], ranks=2)
    with run_h5(cfg, tmp_path / "one.h5") as a, h5py.File(tmp_path / "two.h5") as b:
        assert b.attrs["world_size"] == 2
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
        for key in ("test_loss", "epsilon"):
            assert np.array_equal(a["metrics"][key][:], b["metrics"][key][:]), key


# ----------------------------------------------------------------------------- FedSWE

GAUSSIAN = {"mechanism": "gaussian", "clip": 0.05, "noise_multiplier": 0.5}


def fedswe_cfg(privacy: dict | None = None, **algorithm) -> dict:
    """FedSWE (k = m unless given) on the synthetic task's stationary availability, eta_g = 0.5."""
    cfg = synthetic_config(rounds=8, algorithm={"name": "fedswe", "global_lr": 0.5, **algorithm},
                           train={"local_steps": 3, "batch_size": 8, "lr": 0.1})
    if privacy is not None:
        cfg["privacy"] = privacy
    return cfg


@pytest.mark.parametrize("algorithm", [{}, {"k": 0}, {"k": 0, "server_clip": 0.5}, {"max_echo": 2}],
                         ids=["fedswe", "fedawe", "server_clip", "max_echo"])
def test_fedswe_zero_noise_without_clipping_is_fedswe_bit_for_bit(algorithm, tmp_path):
    zero = {"mechanism": "gaussian", "noise_multiplier": 0.0}
    with run_h5(fedswe_cfg(None, **algorithm), tmp_path / "plain.h5") as a, \
            run_h5(fedswe_cfg(zero, **algorithm), tmp_path / "dp.h5") as b:
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
        for key in ("test_loss", "test_loss_server", "consensus_error"):
            assert np.array_equal(a["metrics"][key][:], b["metrics"][key][:]), key


def fedswe_algorithm(privacy: dict, **algorithm):
    return build_components(config.from_dict(fedswe_cfg(privacy, **algorithm)), World()).algorithm


@pytest.mark.parametrize("algorithm", [{"max_echo": 3}, {"max_echo": 3, "k": 0, "server_clip": 0.5}],
                         ids=["fedswe", "fedawe_server_clip"])
def test_fedswe_noise_std_is_sigma_clip_eta_g_max_echo(algorithm):
    """The noise goes on the echoed innovations with std sigma C |eta_g| E (server_clip: sigma C E on
    the innovation half, nothing on the x_i half), over many rounds within 1%."""
    sigma, clip, E, eta_g, d, rounds = 0.5, 0.05, 3, 0.5, 2000, 100
    algo = fedswe_algorithm({"mechanism": "gaussian", "clip": clip, "noise_multiplier": sigma}, **algorithm)
    width = 2 * d if "server_clip" in algorithm else d
    sums = []
    for t in range(rounds):  # what ServerAlgorithm.round does to the summed buffer
        total = torch.zeros(width, dtype=torch.float64)
        part, bound, divisor = algo.private_part(t, total)
        part += algo.privacy.noise(t, part.shape[0], part.device, bound, divisor)
        sums.append(total)
    noise = torch.stack(sums)
    if "server_clip" in algorithm:
        assert not noise[:, :d].any()
        noise, want = noise[:, d:], sigma * clip * E
    else:
        want = sigma * clip * eta_g * E
    assert float(noise.std()) == pytest.approx(want, rel=0.01)


def test_fedswe_round_adds_the_noise_once_to_the_echoed_sum():
    """Round 0 with noise minus round 0 without = eta_g sigma C E z_0 / (|A_0| + k)."""
    def first_round(sigma: float):
        algo = fedswe_algorithm({**GAUSSIAN, "noise_multiplier": sigma}, max_echo=2)
        x0 = algo.x.clone()
        n = algo.round(0)
        return algo.x - x0, n, algo.k

    (step0, n, k), (step1, _, _) = first_round(0.0), first_round(2.0)
    z0 = torch.from_numpy(rng.normal(rng.key(3, "privacy", 0), np.arange(step0.numel()))).float()
    torch.testing.assert_close(step1 - step0, 0.5 * 2.0 * 0.05 * 2 * z0 / (n + k), rtol=1e-4, atol=1e-8)


def test_fedswe_is_private_between_zero_out_neighbours_from_a_nonzero_start(tmp_path):
    """FedSWE's rows hold the participants' stored models x_i, so its release shows who took part
    (``hides_participation=False``): the neighbouring-run check there keeps the client and zeroes its
    update. From LoRA's start (A random, so x^0 != 0) a removed client would move the sum by ||x_i||
    too, beyond E C (what the full matrix caught); zeroed, it moves it by at most E C, and does."""
    from helpers import combinations as C
    from helpers.neighbours import check

    C.steps_file(str(tmp_path))
    cfg = config.from_dict(C.Combo("fedswe", "cohort", "gaussian", "fixed", "none", "lora").data(str(tmp_path), 0.0))
    assert float(build_components(cfg, World()).algorithm.x.norm()) > cfg.privacy.clip * cfg.algorithm.max_echo
    assert check(cfg, 3, client=1) >= 1  # the client's zeroed update moved the sum, within E C


def test_fedswe_clip_bounds_each_clients_echoed_contribution():
    """Every row's private part, x_i^dag - x_i = eta_g e_i Delta_i, has norm <= eta_g E C, and the
    bound is reached (clipped updates echoed by the cap)."""
    clip, E, eta_g = 0.05, 2, 0.5
    algo = fedswe_algorithm({**GAUSSIAN, "clip": clip}, max_echo=E)
    norms = []
    contribution = algo.contribution

    def spy(t, active, local, start, end):
        rows = contribution(t, active, local, start, end)
        norms.extend((rows - start.double()).norm(dim=1).tolist())
        return rows

    algo.contribution = spy
    for t in range(8):
        algo.round(t)
    norms = np.array(norms)
    assert len(norms) > 8 and np.all(norms <= eta_g * E * clip * (1 + 1e-5))
    assert np.isclose(norms, eta_g * E * clip, rtol=1e-5).sum() > 0


def test_fedswe_is_accounted_without_amplification(tmp_path):
    """FedSWE's release shows who took part (|A_t| + k, the x_i it averages): on stationary
    availability epsilon is T Gaussians, not T Poisson-subsampled ones."""
    sigma = 1.1
    cfg = fedswe_cfg({"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": sigma}, max_echo=4)
    with run_h5(cfg, tmp_path / "r.h5") as f:
        rounds, eps = f["metrics/round"][:], f["metrics/epsilon"][:]
    for T, e in zip(rounds[1:], eps[1:]):
        acc = dp.rdp.RdpAccountant()
        acc.compose(dp.GaussianDpEvent(sigma), int(T))
        assert e == acc.get_epsilon(1e-6)


def test_time_varying_availability_describes_itself_to_the_accountant():
    """FedSWE runs on its paper's availabilities without amplification; DP-FedAvg on the same sine
    is Poisson sampling with q the largest p_i^t of a period, n~ the mean of sum_i p_i^t over it."""
    sine = {"kind": "sine", "period": 10, "base": {"kind": "uniform", "lo": 0.2, "hi": 0.8}}
    cfg = fedswe_cfg(GAUSSIAN, max_echo=4)
    cfg["availability"] = sine
    algo = build_components(config.from_dict(cfg), World()).algorithm
    assert not algo.privacy.amplified and 0 < algo.privacy.cohort < 12
    cfg["algorithm"] = {"name": "fedavg_active"}
    algo = build_components(config.from_dict(cfg), World()).algorithm
    p = np.stack([algo.ctx.participation.probabilities(t) for t in range(10)])
    assert algo.privacy.amplified and algo.privacy.sampling.kind == "poisson"
    assert algo.privacy.sampling.q == p.max() and algo.privacy.cohort == pytest.approx(p.sum() / 10, rel=1e-12)


def test_fedswe_under_privacy_needs_max_echo(tmp_path):
    assert "algorithm.max_echo: set a cap E" in cli_error(tmp_path, fedswe_cfg(GAUSSIAN))


FEDSWE_BANDED = {"mechanism": "banded_mf", "clip": 0.05, "noise_multiplier": 0.5, "band": 3}


@pytest.mark.slow
@pytest.mark.parametrize("privacy, algorithm", [(GAUSSIAN, {"max_echo": 3}),
                                                (FEDSWE_BANDED, {"max_echo": 3, "k": 0, "server_clip": 0.5})],
                         ids=["gaussian", "fedawe_banded"])
def test_fedswe_resume_is_bit_identical_with_privacy(privacy, algorithm, tmp_path):
    data = fedswe_cfg(privacy, **algorithm)
    if privacy is FEDSWE_BANDED:
        data["availability"] = {"kind": "markov", "B": 3, "R": 2}
    cfg = config.from_dict(data)
    cfg.eval_every, cfg.runtime.checkpoint_every = 2, 2
    assert_resume_identical(cfg, tmp_path)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", [{"max_echo": 3}, {"max_echo": 3, "k": 0}], ids=["fedswe", "fedawe"])
def test_fedswe_one_and_two_ranks_are_bit_identical_with_privacy(algorithm, tmp_path):
    cfg = fedswe_cfg(GAUSSIAN, **algorithm)
    cfg["train"]["engine"] = "sequential"
    fedmpi(["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "two.h5")], ranks=2)
    with run_h5(cfg, tmp_path / "one.h5") as a, h5py.File(tmp_path / "two.h5") as b:
        assert b.attrs["world_size"] == 2
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
        for key in ("test_loss", "test_loss_server", "consensus_error", "epsilon"):
            assert np.array_equal(a["metrics"][key][:], b["metrics"][key][:]), key


# ----------------------------------------------------------------------------- issue #32's findings

SPARSE = {"kind": "stationary", "base": {"kind": "fixed", "values": [0.1]}}  # 12 clients: ~28% of rounds empty


@pytest.mark.parametrize("name", ["fedavgm", "fedadam", "fedyogi", "fedadagrad"])
def test_server_optimizers_release_a_step_in_every_round_under_privacy(name):
    """E1: amplification by sampling hides whether a round was empty only if an empty round
    releases a step too (the noise alone); the server optimizers used to keep x^t, showing it."""
    cfg = synthetic_config(rounds=12, algorithm={"name": name}, availability=SPARSE,
                           privacy={"mechanism": "gaussian", "clip": 0.5, "noise_multiplier": 1.0})
    algo = build_components(config.from_dict(cfg), World()).algorithm
    assert algo.privacy.amplified and algo.privacy.sampling.q == 0.1  # amplification is claimed
    empty = 0
    for t in range(12):
        before = algo.x.clone()
        n = algo.round(t)
        empty += n == 0
        assert not torch.equal(before, algo.x), f"round {t} ({n} clients) released no step"
    assert empty >= 1


def test_debiased_fedavg_divides_by_the_expected_cohort_under_privacy():
    """E2: with B = |S_t| a client that joins changes every other client's step size nu_i; under
    privacy B is the fixed expected cohort n~, so the neighbouring runs differ by one clipped update."""
    from helpers.neighbours import check

    cfg = synthetic_config(rounds=6, algorithm={"name": "debiased_fedavg"},
                           privacy={"mechanism": "gaussian", "clip": 0.2, "noise_multiplier": 0.0})
    assert check(config.from_dict(cfg), 6, client=4) > 0


def resumable(tmp_path, privacy: dict, rounds: int = 12) -> str:
    cfg = synthetic_config(rounds=rounds, eval_every=2, algorithm={"name": "fedavg_active"}, privacy=privacy,
                           availability=SPARSE_HALF)
    cfg["runtime"]["checkpoint_every"] = 2
    return write_config(tmp_path / "c.yaml", cfg)


@pytest.mark.slow
def test_a_resume_that_changes_rounds_under_a_target_epsilon_is_refused(tmp_path):
    """E3: the noise was calibrated to the first rounds; resuming with other rounds would compose
    noise of two calibrations and report neither's epsilon."""
    from fault_plugin import env

    cfg, out = resumable(tmp_path, {"mechanism": "gaussian", "clip": 1.0, "epsilon": 8.0}), str(tmp_path / "r.h5")
    assert fedmpi(["run", cfg, "--quiet", "--out", out], env=env("0:6:usr1"), check=False).returncode == 3
    p = cli(["run", cfg, "--quiet", "--out", out, "--set", "rounds=24"])
    assert p.returncode == 2 and "rounds" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    fedmpi(["run", cfg, "--quiet", "--out", out])  # the same rounds resume


@pytest.mark.slow
def test_the_result_file_records_the_noise_multiplier_of_every_round(tmp_path):
    """E3: /privacy/noise_multiplier holds the multiplier each round used, one value per round run,
    also across an interruption and resume."""
    from fault_plugin import env

    cfg, out = resumable(tmp_path, {"mechanism": "gaussian", "clip": 1.0, "epsilon": 8.0}), str(tmp_path / "r.h5")
    assert fedmpi(["run", cfg, "--quiet", "--out", out], env=env("0:7:usr1"), check=False).returncode == 3
    fedmpi(["run", cfg, "--quiet", "--out", out])
    with h5py.File(out) as f:
        sigma = f["privacy/noise_multiplier"][:]
        eps = f["metrics/epsilon"][-1]
    assert sigma.shape == (12,) and np.all(sigma == sigma[0]) and sigma[0] > 0
    acc = dp.rdp.RdpAccountant()
    for s in sigma:  # the reported epsilon is the composition of the noise used (stationary: Poisson)
        acc.compose(dp.PoissonSampledDpEvent(0.5, dp.GaussianDpEvent(float(s))))
    assert eps == pytest.approx(acc.get_epsilon(1e-6), rel=1e-9) and eps <= 8.0


def cli_error(tmp_path, cfg: dict, *extra: str) -> str:
    """The one line of a run refused with exit 2 (in this process, but with a plug-in in its own:
    a plug-in would stay registered here)."""
    args = ["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "r.h5"), *extra]
    p = fedmpi(args, check=False) if "--plugin" in extra else cli(args)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, (p.returncode, p.stderr[-2000:])
    return p.stderr


def test_data_dependent_availability_is_refused_under_privacy(tmp_path):
    """dirichlet_phi draws p_i from the clients' label histograms: who is sampled depends on the data."""
    cfg = synthetic_config(availability={"kind": "stationary", "base": {"kind": "dirichlet_phi"}},
                           privacy={"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0})
    err = cli_error(tmp_path, cfg)
    assert "availability.base.kind" in err and "privacy.mechanism" in err


LOSS_PICK = '''
import numpy as np
from fedmpi.algorithms import register
from fedmpi.algorithms.fedavg import FedAvgActive


@register("loss_pick")
class LossPick(FedAvgActive):
    """Oort-like: the clients with the largest last training loss (their unnoised losses)."""

    client_outputs = True

    def select(self, t, available):
        if self.outputs is None or len(available) <= 2:
            return available
        loss = np.zeros(self.m)
        loss[self.outputs.ids] = self.outputs.loss
        return np.sort(available[np.argsort(-loss[available], kind="stable")[:2]])
'''


@pytest.mark.slow
def test_a_plugin_that_selects_by_client_losses_is_refused_under_privacy(tmp_path):
    """A selection that reads client data (here the unnoised training losses) voids the guarantee:
    a plug-in that overrides select below a privacy declaration must declare its own."""
    plugin = tmp_path / "loss_pick.py"
    plugin.write_text(LOSS_PICK)
    cfg = synthetic_config(algorithm={"name": "loss_pick"},
                           privacy={"mechanism": "gaussian", "clip": 1.0, "epsilon": 8.0})
    err = cli_error(tmp_path, cfg, "--plugin", str(plugin))
    assert "select" in err and "privacy.mechanism" in err
    del cfg["privacy"]
    fedmpi(["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "plain.h5"),
            "--plugin", str(plugin)])


def test_an_expected_cohort_of_zero_is_one_line(tmp_path):
    cfg = synthetic_config(availability={"kind": "stationary", "base": {"kind": "fixed", "values": [0.0]}},
                           privacy={"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0})
    assert "availability" in cli_error(tmp_path, cfg)


def test_a_target_epsilon_needs_rounds(tmp_path):
    """#38 item 12: rounds 0 with privacy.epsilon was a ValueError traceback."""
    cfg = synthetic_config(rounds=0, privacy={"mechanism": "gaussian", "clip": 1.0, "epsilon": 4.0})
    err = cli_error(tmp_path, cfg)
    assert "rounds" in err and "privacy.epsilon" in err


def test_the_banded_noise_history_is_in_the_memory_check(tmp_path, monkeypatch):
    """#38 item 11: banded_mf keeps b - 1 model-sized float64 rows on every rank; with memory for
    less than that it is refused up front, naming the key (a large band x model tried 800 GB)."""
    from fedmpi import build
    from fedmpi.errors import InputError

    cfg = config.from_dict(markov_cfg({"mechanism": "banded_mf", "clip": 1.0, "noise_multiplier": 1.0, "band": 3}))
    d = build.build_components(cfg, World()).spec.dim
    monkeypatch.setattr(build.guards, "step_bytes", lambda *args: 0)  # local steps that need no memory
    monkeypatch.setattr(build.guards, "step_inputs_bytes", lambda *args: 0)
    monkeypatch.setattr(World, "free_memory", lambda self: (int(2 * d * 8 / 0.9) + 8, "host memory per rank"))
    build.build_components(cfg, World())  # two rows fit
    monkeypatch.setattr(World, "free_memory", lambda self: (int(2 * d * 8 / 0.9) - 8, "host memory per rank"))
    with pytest.raises(InputError, match="privacy.band"):
        build.build_components(cfg, World())


def test_pld_at_a_small_noise_multiplier_stays_small(tmp_path):
    """#38 item 10: the PLD accountant's discretisation grew without bound at a small sigma (1.5 GB
    at sigma 0.1); now it holds a bounded number of points and epsilon stays an upper bound."""
    import tracemalloc

    def pld_epsilon(sigma: float, rounds: int) -> float:
        cfg = markov_cfg({"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": sigma, "accountant": "pld"},
                         "fedavg_active", availability=SPARSE_HALF, rounds=rounds)
        priv = build_components(config.from_dict(cfg), World()).algorithm.privacy
        tracemalloc.start()
        try:
            eps = priv.epsilon(rounds)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 400 * 2**20, f"sigma {sigma}: {peak / 2**20:.0f} MB"
        return eps

    acc = dp.rdp.RdpAccountant()
    acc.compose(dp.PoissonSampledDpEvent(0.5, dp.GaussianDpEvent(0.05)), 30)
    assert pld_epsilon(0.05, 30) <= acc.get_epsilon(1e-6)  # below RDP's bound, still computed


SPARSE_HALF = {"kind": "stationary", "base": {"kind": "fixed", "values": [0.5]}}


def test_a_trace_is_accounted_by_its_own_participations(tmp_path):
    """A trace is public and replayed, so no amplification: k = the most rounds any client takes
    part in, and the separation banded_mf needs is measured from the trace."""
    schedule = [[0, 1], [2, 3], [4, 5], [0, 6], [1, 2], [3, 4], [5, 6], [0, 1]]  # client 0: 3 times, gaps >= 3
    cfg = synthetic_config(rounds=8, task={"dataset": "synthetic", "clients": 7, "model": "logreg",
                                           "synthetic": {"samples": 700, "test_samples": 100, "features": 8,
                                                         "classes": 3}},
                           availability={"kind": "trace", "schedule": schedule},
                           privacy={"mechanism": "banded_mf", "clip": 1.0, "noise_multiplier": 1.3, "band": 3})
    priv = build_components(config.from_dict(cfg), World()).algorithm.privacy
    acc = dp.rdp.RdpAccountant()
    acc.compose(dp.GaussianDpEvent(1.3), 3)
    assert priv.epsilon(8) == acc.get_epsilon(1e-6)
    assert priv.cohort == 2.0
    cfg["privacy"]["band"] = 4  # client 0 takes part in rounds 0 and 3: 3 apart
    err = cli_error(tmp_path, cfg)
    assert "privacy.band" in err and "availability" in err


@pytest.mark.slow
def test_a_plugin_mechanism_is_one_file(tmp_path):
    """examples/fedmpi_examples/mechanism.py registers ``own_factor``: banded noise with a factor of
    your own. Given fedmpi's coefficients (binom(2j, j) / 4^j) it gives banded_mf's bits and epsilon;
    its own key is checked, and banded_mf's need of a separation holds for it too."""
    import os

    from conftest import ROOT

    plugin = os.path.join(ROOT, "examples", "fedmpi_examples")
    banded = {"mechanism": "banded_mf", "clip": 0.5, "noise_multiplier": 0.3, "band": 3}
    own = {**banded, "mechanism": "own_factor", "coefficients": [1.0, 0.5, 0.375]}
    outs = {}
    for name, privacy in (("banded", banded), ("own", own)):
        outs[name] = str(tmp_path / f"{name}.h5")
        fedmpi(["run", write_config(tmp_path / f"{name}.yaml", markov_cfg(privacy)), "--quiet", "--out", outs[name],
                "--plugin", plugin])
    with h5py.File(outs["banded"]) as a, h5py.File(outs["own"]) as b:
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
        assert np.array_equal(a["metrics/epsilon"][:], b["metrics/epsilon"][:])
    assert "privacy.coefficients" in cli_error(tmp_path, markov_cfg({**own, "coefficients": [1.0, 0.5]}), "--plugin",
                                             plugin)
    assert "privacy.band" in cli_error(tmp_path, markov_cfg(own, R=1), "--plugin", plugin)
