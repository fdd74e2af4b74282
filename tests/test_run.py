"""End-to-end runs through the real CLI: result layout, accuracy, ranks, failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import yaml

import fault_plugin
from conftest import wait_for_rows, ROOT, cli, fedmpi, synthetic_config, write_config

QUICKSTART = os.path.join(ROOT, "configs", "quickstart.yaml")


@pytest.mark.slow
def test_quadratic_fedavg_layout(tmp_path):
    out = tmp_path / "q.h5"
    cfg = write_config(tmp_path / "q.yaml", {
        "name": "quad", "rounds": 30, "eval_every": 10, "output": str(out),
        "task": {"dataset": "quadratic", "model": "scalar", "clients": 2, "u": [0.0, 100.0]},
        "train": {"local_steps": 1, "lr": 0.5}, "runtime": {"log_availability": True}})
    fedmpi(["run", cfg, "--quiet"])
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "completed" and f.attrs["rounds_done"] == 30
        assert f.attrs["world_size"] == 1 and f.attrs["seed"] == 0
        assert yaml.safe_load(f.attrs["config"])["task"]["u"] == [0.0, 100.0]
        m = f["metrics"]
        assert list(m["round"][:]) == [0, 10, 20, 30] and m["round"].dtype == np.int64
        assert set(m) == {"round", "test_loss", "train_loss", "x", "n_active", "wall_time", "peak_rss_mb"}
        assert m["x"][-1] == pytest.approx(50.0, abs=1e-3)  # full participation: the true optimum
        assert m["test_loss"][-1] == pytest.approx(1250.0, rel=1e-5)  # F(50) = (50^2 + 50^2) / 4
        assert f["final/params"].dtype == np.float32 and f["final/params"][0] == pytest.approx(50.0, abs=1e-3)
        assert f["availability/mask"].shape == (30, 2) and f["availability/mask"][:].all()
        assert list(f["partition/samples"][:]) == [1, 1]
        assert m["test_loss"].chunks is not None and m["test_loss"].maxshape == (None,)


def _runs_in_process(tmp_path, seeds, **over) -> list[str]:
    """Runs through the CLI's main() in this process (no interpreter start-up per run)."""
    from fedmpi.cli import main

    paths = []
    for seed in seeds:
        out = str(tmp_path / f"s{seed}.h5")
        cfg = write_config(tmp_path / f"c{seed}.yaml", synthetic_config(seed=seed, output=out, **over))
        assert main(["run", cfg, "--quiet"]) == 0
        paths.append(out)
    return paths


@pytest.mark.slow
def test_info_and_plot(tmp_path):
    paths = _runs_in_process(tmp_path, (1, 2))
    info = cli(["info", paths[0]])
    assert info.returncode == 0, info.stderr
    assert "status:     completed" in info.stdout and "test_acc" in info.stdout and "config:" in info.stdout
    png = str(tmp_path / "fig.png")
    assert cli(["plot", *paths, "--metric", "test_acc", "--out", png]).returncode == 0
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    bad = cli(["plot", paths[0], "--metric", "nope", "--out", png])
    assert bad.returncode == 2 and "has no metric 'nope'" in bad.stderr


def test_plot_groups_seeds_into_a_band(tmp_path):
    from fedmpi.results.plot import load_curves

    paths = _runs_in_process(tmp_path, (1, 2, 3), rounds=2)
    curves = load_curves(paths, "test_acc", "round")
    assert len(curves) == 1 and curves[0][4] == 3 and (curves[0][3] >= 0).all()


@pytest.mark.slow
@pytest.mark.usefixtures("fmnist_available")
def test_fmnist_fedavg_learns(tmp_path):
    out = tmp_path / "f.h5"
    fedmpi(["run", os.path.join(ROOT, "configs/quickstart.yaml"), "--out", str(out), "--quiet",
            "--set", "rounds=25", "--set", "eval_every=25", "--set", "availability.size=20",
            "--set", "evaluation.train=false"], timeout=600)
    with h5py.File(out, "r") as f:
        assert f["metrics/test_acc"][-1] >= 0.75
        assert f["metrics/test_acc"][0] < 0.3  # it learned it


@pytest.mark.parametrize("args, needle", [
    (["run", "missing.yaml"], "missing.yaml: config file not found"),
    (["run", QUICKSTART, "--set", "train.lr=-1"], "train.lr: must be > 0"),
    (["run", QUICKSTART, "--set", "task.root=/nonexistent"], "/nonexistent"),
    (["run", QUICKSTART, "--set", "task.dataset=cifar10", "--set", "task.root=/tmp"],
     "cifar-10-batches-py"),
    (["info", "nothing.h5"], "nothing.h5: no such result file"),
    (["bogus"], "invalid choice"),
])
def test_bad_input_exit_2_one_line(args, needle):
    p = cli(args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr


def test_corrupt_config_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff\xfe\x00garbage: [")
    p = cli(["run", str(bad)])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_runs_without_mpi4py(tmp_path):
    """A single process must not need mpi4py."""
    out = str(tmp_path / "n.h5")
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(output=out, rounds=2))
    code = ("import sys; sys.modules['mpi4py'] = None; from fedmpi.cli import main; "
            f"sys.exit(main(['run', {cfg!r}, '--quiet']))")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=300)
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "completed"


@pytest.mark.slow
def test_sigkill_leaves_readable_file(tmp_path):
    out = tmp_path / "k.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(output=str(out), rounds=100000, eval_every=1))
    proc = subprocess.Popen([sys.executable, "-m", "fedmpi", "run", cfg, "--quiet"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_rows(out, 5)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "running"
        n = f["metrics/round"].shape[0]
        assert n >= 5 and np.isfinite(f["metrics/test_acc"][: n - 1]).all()
    info = cli(["info", str(out)])
    assert info.returncode == 0 and "status:     running" in info.stdout, info.stderr


def _same_results(a: str, b: str) -> None:
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        for k in fa["metrics"]:
            if k in ("wall_time", "peak_rss_mb"):
                continue
            assert np.array_equal(fa["metrics"][k][:], fb["metrics"][k][:], equal_nan=True), k
        assert np.array_equal(fa["final/params"][:], fb["final/params"][:])


@pytest.mark.mpi
def test_one_and_two_ranks_identical(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=8, task__clients=13))
    one, two = str(tmp_path / "one.h5"), str(tmp_path / "two.h5")
    fedmpi(["run", cfg, "--out", one, "--quiet"])
    fedmpi(["run", cfg, "--out", two, "--quiet"], ranks=2)
    _same_results(one, two)
    with h5py.File(two, "r") as f:
        assert f.attrs["world_size"] == 2


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.usefixtures("fmnist_available")
def test_dropout_model_one_and_two_ranks_identical(tmp_path):
    """cinic_cnn has dropout: its masks come from per-client streams, not torch's generator. Default
    threads (2 on 1 rank, 1 on each of 2 ranks here): the engine computes with one thread anyway."""
    sets = ["task.model=cinic_cnn", "task.clients=5", "rounds=2", "eval_every=2", "availability.size=4",
            "evaluation.train=false", "train.batch_size=8", "train.local_steps=2"]
    args = ["run", os.path.join(ROOT, "configs/quickstart.yaml"), "--quiet"] + [a for s in sets for a in ("--set", s)]
    one, two = str(tmp_path / "one.h5"), str(tmp_path / "two.h5")
    fedmpi(args + ["--out", one])
    fedmpi(args + ["--out", two], ranks=2)
    _same_results(one, two)


@pytest.mark.slow
@pytest.mark.mpi
def test_bad_config_under_mpiexec(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(train={"lr": -1}))
    p = fedmpi(["run", cfg], ranks=2, check=False, timeout=120)
    assert p.returncode == 2
    ours = [ln for ln in p.stderr.splitlines() if ln.startswith("fedmpi:")]
    assert ours == ["fedmpi: error: train.lr: must be > 0, got -1"] and "Traceback" not in p.stderr


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failing_rank_ends_the_job(tmp_path, how):
    """An exception or a SIGKILL on rank 1 ends the whole job promptly; rank 0 marks the file failed."""
    out = tmp_path / "f.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(output=str(out), rounds=10000, eval_every=1,
                                                              availability={"kind": "always"},
                                                              runtime={"timeout_s": 20, "progress": False}))
    start = time.time()
    p = fedmpi(["run", cfg, "--quiet"], ranks=2, check=False, timeout=180,
               env=fault_plugin.env(f"1:3:{how}"))
    assert p.returncode != 0 and time.time() - start < 150
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "failed" and f.attrs["rounds_done"] == 3
    if how == "raise":
        assert p.stderr.count("injected fault at round 3") == 1


def test_plot_labels_tell_groups_apart():
    from fedmpi.results.plot import _labels

    labels = _labels([{"name": "p", "algorithm.name": "fedswe", "algorithm.k": 0},
                      {"name": "p", "algorithm.name": "fedswe", "algorithm.k": 100}])
    assert labels == ["fedswe, k=0", "fedswe, k=100"]
