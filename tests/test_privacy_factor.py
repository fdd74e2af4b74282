"""banded_mf's factor (issues #34, #45, docs/PRIVACY.md "The factor"): ``privacy.factor: sqrt |
optimized | banded``, the general banded optimum against jax_privacy's numbers, the verified cache
(#44: swapped, crafted, FIFO and oversized files), its error and sensitivity, the factor a run
names in its result file, and ``fedmpi dp-factor``."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT, assert_resume_identical, cli, fedmpi, synthetic_config, write_config

from fedmpi import config, rng
from fedmpi.participation import Sampling
from fedmpi.privacy import factor_cache, factors, general
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


def dense_general(columns: np.ndarray) -> np.ndarray:
    """The n x n matrix C of ``columns`` (jax_privacy's ``params`` layout: columns[j, i] = C[j + i, j])."""
    n, b = columns.shape
    C = np.zeros((n, n))
    for j in range(n):
        for i in range(min(b, n - j)):
            C[j + i, j] = columns[j, i]
    return C


@pytest.mark.parametrize("n, b", [(7, 3), (40, 4), (70, 40), (33, 1), (100, 33), (5, 5)])
def test_the_general_loss_and_its_gradient_are_those_of_the_materialised_factor(n, b):
    """The block recursion (fedmpi/privacy/general.py) against ||A C^{-1}||_F^2 of the dense matrix,
    and its hand-written gradient against autograd through the dense solve."""
    gen = torch.Generator().manual_seed(n * b)
    params = torch.rand(n, b, dtype=torch.float64, generator=gen) * 0.3
    params[:, 0] += 1
    x = params.clone().requires_grad_(True)
    C = torch.zeros(n, n, dtype=torch.float64)
    cols = general.normalized(x)
    for i in range(b):
        C = C + torch.diag(cols[:n - i, i], -i)
    A = torch.tril(torch.ones(n, n, dtype=torch.float64))
    want = (torch.linalg.solve_triangular(C, A, upper=False, left=False) ** 2).sum()
    want.backward()
    got, grad = general.loss_and_gradient(params)
    assert got == pytest.approx(float(want.detach()), rel=1e-12)
    torch.testing.assert_close(grad, x.grad, rtol=1e-9, atol=1e-12 * got)  # b = 1: both 0 (unit columns)
    sq = general.squared_errors(cols.detach()).numpy()  # per-row errors
    B = np.tril(np.ones((n, n))) @ np.linalg.inv(C.detach().numpy())
    np.testing.assert_allclose(sq, (B ** 2).sum(axis=1), rtol=1e-10)


#: jax_privacy's ``banded.optimize`` (its general b-banded optimum; issue #45), rmse = ||A C^-1||_F / sqrt(N)
JAX_PRIVACY_BANDED = {(64, 4): 3.21218, (128, 8): 3.39273, (256, 4): 5.95565}


@pytest.mark.parametrize("n, b", list(JAX_PRIVACY_BANDED))
def test_the_banded_factor_is_jax_privacys_general_optimum(n, b):
    got = factors.factor_errors("banded", n, b)
    assert abs(got["rmse"] - JAX_PRIVACY_BANDED[n, b]) < 1e-4, got
    assert got["rmse"] < factors.factor_errors("optimized", n, b)["rmse"]  # the Toeplitz one: 3.24059, ...
    cols = factors.banded_columns(n, b)
    C = dense_general(cols)
    assert np.allclose(np.linalg.norm(C, axis=0), 1, atol=1e-12) and np.all(np.diag(C) > 0)
    B = np.tril(np.ones((n, n))) @ np.linalg.inv(C)
    assert got["rmse"] == pytest.approx(np.linalg.norm(B) / np.sqrt(n), rel=1e-9)
    assert got["max_error"] == pytest.approx(np.linalg.norm(B, axis=1).max(), rel=1e-9)


def test_more_bands_than_rounds_leave_the_extra_bands_empty():
    cols = factors.banded_columns(6, 9)
    assert cols.shape == (6, 9) and not np.any(cols[:, 6:])
    assert factors.factor_errors("banded", 6, 9)["rmse"] == pytest.approx(factors.factor_errors("banded", 6, 6)["rmse"])


def cached_file(tmp_path) -> str:
    """The one factor file in the test's cache folder."""
    folder = tmp_path / ".fedmpi-cache" / "factors"
    [name] = [f for f in os.listdir(folder) if not f.startswith(".")]
    return str(folder / name)


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
    inputs = {"factor": "optimized", "version": factors.VERSION["optimized"], "rounds": 80, "band": 5}
    assert np.array_equal(factor_cache.read(inputs, (5,))[0], first)
    monkeypatch.delenv("FEDMPI_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert factors.cache_folder() == str(tmp_path / "xdg" / "fedmpi")


def crafted(c: np.ndarray) -> np.ndarray:
    """Another factor of the same shape and unit norm (c_0 > 0), as the cache's reader would accept."""
    other = np.abs(c[::-1]) + 0.1
    return other / np.linalg.norm(other)


@pytest.fixture
def said(monkeypatch) -> list[str]:
    """The cache's warnings (whatever the ``fedmpi`` logger's handlers are in this process)."""
    lines: list[str] = []
    monkeypatch.setattr(factor_cache.log, "warning", lambda msg, *args: lines.append(msg % args))
    return lines


@pytest.mark.parametrize("how", ["swapped", "crafted npy", "crafted digest"])
def test_a_swapped_or_crafted_cache_file_is_not_used(how, tmp_path, said):
    """#44 hostile 2 and item 5: a cache file of the right shape and unit norm that is not what was
    stored for these inputs (another run's factor, an .npy of other numbers, a file whose digest was
    not made from its numbers) is ignored with one warning naming it, and the factor recomputed."""
    n, b = 90, 5
    right = factors.optimize(n, b)
    if how == "swapped":  # the factor of another run, under this one's name
        factors.optimized_coefficients(n - 10, b)
        other = cached_file(tmp_path)
        factors.optimized_coefficients(n, b)
        path = [p for p in os.listdir(os.path.dirname(other)) if not p.startswith(".") and
                os.path.join(os.path.dirname(other), p) != other][0]
        path = os.path.join(os.path.dirname(other), path)
        os.replace(other, path)
    else:
        factors.optimized_coefficients(n, b)
        path = cached_file(tmp_path)
        if how == "crafted npy":
            with open(path, "wb") as fh:
                np.save(fh, crafted(right))
        else:  # the right header, other numbers
            blob = open(path, "rb").read()
            head = blob[:blob.index(b"\n") + 1]
            with open(path, "wb") as fh:
                fh.write(head + crafted(right).astype("<f8").tobytes())
    assert np.array_equal(factors.optimized_coefficients(n, b), right)
    [line] = said
    assert path in line and "\n" not in line
    said.clear()
    assert np.array_equal(factors.optimized_coefficients(n, b), right)  # rewritten: used from now on
    assert not said


def test_a_cache_file_of_the_right_digest_but_not_the_optimum_is_not_used(tmp_path, said):
    """The numbers are re-checked too: a file made, digest and all, from a factor that is not
    stationary for its rounds (here the optimum of other rounds) is ignored."""
    n, b = 70, 4
    inputs = {"factor": "optimized", "version": factors.VERSION["optimized"], "rounds": n, "band": b}
    factor_cache.write(inputs, factors.optimize(2 * n, b))
    assert np.array_equal(factors.optimized_coefficients(n, b), factors.optimize(n, b))
    assert len(said) == 1 and "not the optimum" in said[0]
    columns = factors.banded_columns(20, 3)
    inputs = {"factor": "banded", "version": factors.VERSION["banded"], "rounds": 20, "band": 3}
    factor_cache.write(inputs, general.normalized(torch.from_numpy(columns[::-1].copy())).numpy())
    assert np.array_equal(factors.banded_columns(20, 3), columns)
    assert len(said) == 2 and "banded-v" in said[1] and "not the optimum" in said[1]


def dp_factor(args: list[str], limit_gb: float = 6) -> subprocess.CompletedProcess:
    """``fedmpi dp-factor ARGS`` in a process of at most ``limit_gb`` of memory, 120 s at most."""
    limit = int(limit_gb * 2 ** 30)
    return subprocess.run([sys.executable, "-m", "fedmpi", "dp-factor", *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=ROOT),
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))


@pytest.mark.parametrize("what", ["fifo", "huge header", "directory"])
def test_a_cache_path_that_is_no_factor_file_is_ignored_in_one_line(what, tmp_path):
    """#44 hostile 6: a FIFO at the factor's path does not hang, an .npy header claiming 10^12 values
    is no MemoryError: one warning, the factor recomputed, exit 0."""
    args = ["--rounds", "40", "--band", "3", "--factor", "optimized", "--json"]
    first = dp_factor(args)
    assert first.returncode == 0, first.stderr
    path = cached_file(tmp_path)
    os.unlink(path)
    if what == "fifo":
        os.mkfifo(path)
    elif what == "directory":
        os.mkdir(path)
    else:
        import io

        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False, "shape": (10 ** 12,)})
        with open(path, "wb") as fh:
            fh.write(head.getvalue() + bytes(64))
    try:
        p = dp_factor(args)
    except subprocess.TimeoutExpired:
        pytest.fail(f"dp-factor hangs on a {what} at the cache path")
    assert p.returncode == 0 and p.stdout == first.stdout, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) <= 2 and "ignoring the cached factor" in lines[0] and path in lines[0], p.stderr


def test_a_cached_factor_is_rechecked_without_a_word_on_stderr(tmp_path):
    """#44's fresh hostile pass: dp-factor --rounds 1 --band 2 printed torch's UserWarning on a
    read-only array when it re-checked its cached banded factor (exit 0); a cached factor crafted
    at 1e300 printed numpy's RuntimeWarning (overflow) beside the one warning that ignores it."""
    args = ["--rounds", "1", "--band", "2", "--factor", "banded", "--json"]
    first = dp_factor(args)
    again = dp_factor(args)  # from the cache, re-checked
    assert first.returncode == again.returncode == 0 and again.stdout == first.stdout
    assert first.stderr == again.stderr == "", again.stderr
    args = ["--rounds", "6", "--band", "2", "--factor", "optimized", "--json"]
    first = dp_factor(args)
    inputs = {"factor": "optimized", "version": factors.VERSION["optimized"], "rounds": 6, "band": 2}
    factor_cache.write(inputs, factors.optimize(6, 2) * 1e300)  # its digest right
    p = dp_factor(args)
    assert p.returncode == 0 and p.stdout == first.stdout, p.stderr
    [line] = p.stderr.strip().splitlines()
    assert "ignoring the cached factor" in line and "not a unit-norm factor" in line, p.stderr


@pytest.mark.parametrize("args", [["--rounds", "1000000000", "--band", "4"], ["--rounds", "100", "--band", "10" * 5],
                                  ["--rounds", "60", "--band", "1000000000", "--factor", "sqrt"],
                                  ["--rounds", "100000", "--band", "100", "--factor", "banded"]])
def test_dp_factor_bounds_its_sizes(args):
    """#44 hostile 8: --rounds or --band of 10^9 is one line naming the argument, exit 2, at once."""
    p = dp_factor(args)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and ("--rounds" in lines[0] or "--band" in lines[0]), p.stderr


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


def test_the_banded_factor_streams_its_noise(tmp_path):
    """Round t's noise is row t of C^{-1} Z for the general factor: each round its own row of C."""
    b, T, d = 3, 12, 4
    priv = Privacy(BandedParams("banded_mf", 1.0, 1.0, band=b, factor="banded"),
                   Sampling("none", 1.0, separation=b), T, 5, d, World())
    C = dense_general(factors.banded_columns(T, b))
    got = torch.stack([priv.noise(t, d, torch.device("cpu")) for t in range(T)]).numpy()
    Z = np.stack([rng.normal(rng.key(5, "privacy", t), np.arange(d)) for t in range(T)])
    np.testing.assert_allclose(got, np.linalg.solve(C, Z), rtol=1e-10, atol=1e-12)
    assert not np.allclose(C[b:, b], C[-1, -1])  # not Toeplitz


@pytest.mark.parametrize("factor", ["optimized", "banded"])
def test_a_run_names_the_factor_it_used(factor, tmp_path):
    """#44 item 5: the result file names the factor used (which, for what, the SHA-256 of its
    numbers), and ``fedmpi info`` shows it."""
    out = tmp_path / "r.h5"
    final(banded_cfg(factor), out)
    with h5py.File(out) as f:
        named = json.loads(f.attrs["privacy_factor"])
    numbers = factors.optimized_coefficients(8, 3) if factor == "optimized" else \
        factors.rows_of(factors.banded_columns(8, 3))
    assert named == {"factor": factor, "rounds": 8, "band": 3, "sha256": factor_cache.digest(numbers)}
    p = cli(["info", str(out)])
    assert p.returncode == 0 and f"banded_mf (factor {factor}, band 3)" in p.stdout, p.stdout
    assert f"factor:     {factor} for 8 rounds and 3 bands, sha256 {named['sha256'][:16]}" in p.stdout, p.stdout


@pytest.mark.parametrize("rounds, band", [(10 ** 6, 64), (10 ** 9, 3)])
def test_a_banded_factor_too_large_is_one_line(rounds, band, tmp_path):
    cfg = banded_cfg("banded", rounds=rounds)
    cfg["privacy"]["band"] = band
    p = cli(["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "r.h5")])
    assert p.returncode == 2 and "privacy.band" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_banded_run_differs_and_resumes_bit_identically(tmp_path):
    assert not np.array_equal(final(banded_cfg("optimized"), tmp_path / "a.h5"),
                              final(banded_cfg("banded"), tmp_path / "b.h5"))
    cfg = config.from_dict(banded_cfg("banded"))
    cfg.eval_every, cfg.runtime.checkpoint_every = 2, 2
    assert_resume_identical(cfg, tmp_path)


def test_an_optimized_run_differs_and_resumes_bit_identically(tmp_path):
    assert not np.array_equal(final(banded_cfg("sqrt"), tmp_path / "a.h5"),
                              final(banded_cfg("optimized"), tmp_path / "b.h5"))
    cfg = config.from_dict(banded_cfg("optimized"))
    cfg.eval_every, cfg.runtime.checkpoint_every = 2, 2
    assert_resume_identical(cfg, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("factor", ["optimized", "banded"])
def test_an_optimized_factor_reads_rounds(factor, tmp_path):
    """The factor is optimised for the run's rounds: a resume with other rounds is refused."""
    from fault_plugin import env

    cfg = banded_cfg(factor, rounds=12, eval_every=2)
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
    for factor in ("sqrt", "optimized", "banded"):
        p = cli(["dp-factor", "--rounds", "60", "--band", "6", "--factor", factor, "--json"])
        assert p.returncode == 0, p.stderr
        got[factor] = json.loads(p.stdout)
        C = dense_general(factors.banded_columns(60, 6)) if factor == "banded" else \
            dense(factors.coefficients(factor, 60, 6), 60)
        B = np.tril(np.ones((60, 60))) @ np.linalg.inv(C)
        rmse, max_error, column = np.linalg.norm(B) / np.sqrt(60), np.linalg.norm(B, axis=1).max(), \
            np.linalg.norm(C, axis=0).max()
        assert got[factor]["rmse"] == pytest.approx(rmse, rel=1e-9)
        assert got[factor]["max_error"] == pytest.approx(max_error, rel=1e-9)
        assert abs(got[factor]["sensitivity"] - column) < 1e-9
    assert got["banded"]["rmse"] < got["optimized"]["rmse"] < got["sqrt"]["rmse"]
    p = cli(["dp-factor", "--rounds", "60", "--band", "6", "--json"])  # all three by default
    assert p.returncode == 0 and [json.loads(line) for line in p.stdout.splitlines()] == list(got.values()), p.stderr
    p = cli(["dp-factor", "--rounds", "60", "--band", "6"])
    assert p.returncode == 0 and p.stdout.count("rmse") == 3, p.stderr
    for bad in (["--rounds", "0", "--band", "2"], ["--rounds", "10", "--band", "2", "--factor", "dense"],
                ["--band", "2"]):
        p = cli(["dp-factor", *bad])
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
