"""banded_mf's factor (issue #34, docs/PRIVACY.md "The factor"): ``privacy.factor: sqrt |
optimized``, its cache, its error and sensitivity, and ``fedmpi dp-factor``."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
import torch
from conftest import assert_resume_identical, cli, fedmpi, synthetic_config, write_config

from fedmpi import config, rng
from fedmpi.participation import Sampling
from fedmpi.privacy import factors
from fedmpi.privacy.banded import BandedParams
from fedmpi.privacy.run import Privacy
from fedmpi.runner import Runner
from fedmpi.runtime import World

pytest.importorskip("dp_accounting")


def dense(c: np.ndarray, n: int) -> np.ndarray:
    """The n x n lower-triangular Toeplitz matrix of first column ``c``."""
    return sum(np.diag(np.full(n - j, c[j]), -j) for j in range(min(len(c), n)))


def dense_errors(c: np.ndarray, n: int) -> tuple[float, float, float]:
    """rmse, max_error and max column norm, from the materialised matrices."""
    C = dense(c, n)
    B = np.tril(np.ones((n, n))) @ np.linalg.inv(C)
    return (np.linalg.norm(B) / np.sqrt(n), np.linalg.norm(B, axis=1).max(), np.linalg.norm(C, axis=0).max())


@pytest.mark.parametrize("n", [50, 200, 1000])
@pytest.mark.parametrize("b", [2, 4, 8, 16])
def test_the_optimized_factor_has_less_error_than_the_square_root(n, b):
    sqrt, opt = factors.errors(factors.sqrt_coefficients(b), n), factors.errors(factors.optimize(n, b), n)
    assert opt["rmse"] < sqrt["rmse"] * (1 - 1e-3)  # measured gains: 0.2 % (N = 50, b = 16) to 14 %
    assert abs(opt["sensitivity"] - 1) < 1e-9  # the columns' bound: unit norm


@pytest.mark.parametrize("n, b", [(50, 4), (120, 16), (30, 40)])
def test_errors_and_sensitivity_are_those_of_the_materialised_factor(n, b):
    for c in (factors.sqrt_coefficients(b), factors.optimize(n, b)):
        rmse, max_error, column = dense_errors(c, n)
        got = factors.errors(c, n)
        assert got["rmse"] == pytest.approx(rmse, rel=1e-9) and got["max_error"] == pytest.approx(max_error, rel=1e-9)
        assert abs(got["sensitivity"] - column) < 1e-9 and column <= 1 + 1e-12
    assert abs(dense_errors(factors.optimize(n, b), n)[2] - 1) < 1e-9


def test_the_optimized_factor_is_computed_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDMPI_CACHE", str(tmp_path / "cache"))
    first = factors.optimized_coefficients(80, 5)
    [path] = [os.path.join(tmp_path, "cache", "factors", f) for f in os.listdir(tmp_path / "cache" / "factors")]
    monkeypatch.setattr(factors, "optimize", lambda n, b: pytest.fail("recomputed although cached"))
    assert np.array_equal(factors.optimized_coefficients(80, 5), first)
    monkeypatch.undo()
    monkeypatch.setenv("FEDMPI_CACHE", str(tmp_path / "cache"))
    with open(path, "wb") as fh:  # half a file (a writer killed): recomputed, the same bits
        fh.write(b"\x93NUMPY\x01\x00")
    assert np.array_equal(factors.optimized_coefficients(80, 5), first)
    assert np.array_equal(np.load(path), first)
    monkeypatch.delenv("FEDMPI_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert factors.cache_folder() == str(tmp_path / "xdg" / "fedmpi")


def test_an_unwritable_cache_still_gives_the_factor(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FEDMPI_CACHE", str(blocker))
    assert np.array_equal(factors.optimized_coefficients(40, 3), factors.optimize(40, 3))


def banded_cfg(factor: str | None = None, rounds: int = 8, **over) -> dict:
    privacy = {"mechanism": "banded_mf", "clip": 0.5, "noise_multiplier": 0.3, "band": 3}
    if factor is not None:
        privacy["factor"] = factor
    return synthetic_config(rounds=rounds, algorithm={"name": "fedavg_markov"}, privacy=privacy,
                            availability={"kind": "markov", "B": 3, "R": 2,
                                          "base": {"kind": "uniform", "lo": 0.1, "hi": 0.9}}, **over)


def final(cfg: dict, path) -> np.ndarray:
    Runner(config.from_dict(cfg), World(), str(path), quiet=True).run()
    with h5py.File(path) as f:
        return f["final/params"][:]


def test_factor_sqrt_is_the_default_and_its_noise_the_closed_form(tmp_path):
    """factor: sqrt keeps banded_mf's bits: the noise is C^{-1} z for c_j = binom(2j, j) / 4^j, scaled."""
    assert np.array_equal(final(banded_cfg(), tmp_path / "a.h5"), final(banded_cfg("sqrt"), tmp_path / "b.h5"))
    b, T, d = 4, 9, 3
    priv = Privacy(BandedParams("banded_mf", 1.0, 1.0, band=b, factor="sqrt"), Sampling("none", 1.0, separation=b),
                   T, 5, d, World())
    got = torch.stack([priv.noise(t, d, torch.device("cpu")) for t in range(T)]).numpy()
    c = np.array([1.0, 1 / 2, 3 / 8, 5 / 16])
    Z = np.stack([rng.normal(rng.key(5, "privacy", t), np.arange(d)) for t in range(T)])
    np.testing.assert_allclose(got, np.linalg.solve(dense(c / np.linalg.norm(c), T), Z), rtol=1e-12, atol=1e-12)


def test_the_optimized_factor_streams_its_noise(tmp_path):
    """Round t's noise is row t of C^{-1} Z for the factor optimised for the run's rounds."""
    b, T, d = 3, 12, 4
    priv = Privacy(BandedParams("banded_mf", 1.0, 1.0, band=b, factor="optimized"),
                   Sampling("none", 1.0, separation=b), T, 5, d, World())
    c = factors.optimize(T, b)
    assert np.array_equal(priv.mechanism.c, c) and not np.allclose(c, factors.sqrt_coefficients(b))
    got = torch.stack([priv.noise(t, d, torch.device("cpu")) for t in range(T)]).numpy()
    Z = np.stack([rng.normal(rng.key(5, "privacy", t), np.arange(d)) for t in range(T)])
    np.testing.assert_allclose(got, np.linalg.solve(dense(c, T), Z), rtol=1e-10, atol=1e-12)


def test_an_optimized_run_differs_and_resumes_bit_identically(tmp_path):
    assert not np.array_equal(final(banded_cfg("sqrt"), tmp_path / "a.h5"),
                              final(banded_cfg("optimized"), tmp_path / "b.h5"))
    cfg = config.from_dict(banded_cfg("optimized"))
    cfg.eval_every, cfg.runtime.checkpoint_every = 2, 2
    assert_resume_identical(cfg, tmp_path)


@pytest.mark.slow
def test_an_optimized_factor_reads_rounds(tmp_path):
    """The factor is optimised for the run's rounds: a resume with other rounds is refused."""
    from fault_plugin import env

    cfg = banded_cfg("optimized", rounds=12, eval_every=2)
    cfg["runtime"]["checkpoint_every"] = 2
    path, out = write_config(tmp_path / "c.yaml", cfg), str(tmp_path / "r.h5")
    assert fedmpi(["run", path, "--quiet", "--out", out], env=env("0:6:usr1"), check=False).returncode == 3
    p = cli(["run", path, "--quiet", "--out", out, "--set", "rounds=24"])
    assert p.returncode == 2 and "rounds" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.parametrize("value", ["cholesky", 3])
def test_a_bad_factor_is_one_line(value, tmp_path):
    cfg = banded_cfg()
    cfg["privacy"]["factor"] = value
    p = cli(["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "r.h5")])
    assert p.returncode == 2 and "privacy.factor" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.slow
def test_dp_factor_prints_error_and_sensitivity(tmp_path):
    got = {}
    for factor in ("sqrt", "optimized"):
        p = cli(["dp-factor", "--rounds", "60", "--band", "6", "--factor", factor, "--json"])
        assert p.returncode == 0, p.stderr
        got[factor] = json.loads(p.stdout)
        rmse, max_error, column = dense_errors(factors.coefficients(factor, 60, 6), 60)
        assert got[factor]["rmse"] == pytest.approx(rmse, rel=1e-9)
        assert got[factor]["max_error"] == pytest.approx(max_error, rel=1e-9)
        assert abs(got[factor]["sensitivity"] - column) < 1e-9
    assert got["optimized"]["rmse"] < got["sqrt"]["rmse"]
    p = cli(["dp-factor", "--rounds", "60", "--band", "6"])
    assert p.returncode == 0 and "rmse" in p.stdout, p.stderr
    for bad in (["--rounds", "0", "--band", "2"], ["--rounds", "10", "--band", "2", "--factor", "dense"],
                ["--band", "2"]):
        p = cli(["dp-factor", *bad])
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
