"""The example plug-in (examples/fedmpi_examples): FedAvgM with its own parameter, a residual MLP and
a spirals dataset. Each runs from a plug-in without touching fedmpi: under mpiexec and through
launch/fedmpi-launch with the same bits as one rank, through checkpoint/resume, with one-line
errors naming its keys."""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

import fault_plugin
from conftest import ROOT, fedmpi, mpiexec
from fedmpi import config
from fedmpi.build import build_components
from fedmpi.plugins import load
from fedmpi.runtime import World
from helpers.quadratic import Q, Scripted, scalar

PLUGIN = os.path.join(ROOT, "examples", "fedmpi_examples")
CONFIG = os.path.join(ROOT, "examples", "fedavgm.yaml")
SMALL = ["--set", "rounds=6", "--set", "eval_every=2", "--set", "task.spiral_samples=600", "--set", "task.clients=7",
         "--set", "task.width=8", "--set", "runtime.checkpoint_every=2", "--set", "runtime.progress=false"]


def run(out, *args, ranks: int = 0, env: dict | None = None, check: bool = True):
    return fedmpi(["run", CONFIG, "--out", str(out), "--quiet", "--plugin", PLUGIN, *SMALL, *args],
                  ranks=ranks, env=env, check=check)


def same(a, b) -> None:
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert fb.attrs["status"] == "completed"
        for k in fa["metrics"]:
            if k not in ("wall_time", "peak_rss_mb"):
                assert np.array_equal(fa["metrics"][k][:], fb["metrics"][k][:]), k
        assert np.array_equal(fa["final/params"][:], fb["final/params"][:])


def test_fedavgm_follows_its_definition():
    """Quadratic task, scripted availability: x and v against plain floats (Delta_i = (1 - q)(u_i - x))."""
    load([PLUGIN])
    u, x0, beta, eta_g = [0.0, 8.0, -4.0], 2.0, 0.6, 0.5
    script = [[0, 1], [], [2], [0, 1, 2], [1]]
    cfg = config.from_dict({"seed": 1, "task": {"dataset": "quadratic", "model": "scalar", "clients": 3, "u": u,
                                                "x0": x0},
                            "train": {"local_steps": 2, "lr": 0.5, "batch_size": 1, "engine": "sequential"},
                            "algorithm": {"name": "my_fedavgm", "beta": beta, "global_lr": eta_g}})
    algo = build_components(cfg, World(), participation=Scripted(3, script)).algorithm
    x, v = x0, 0.0
    for t, active in enumerate(script):
        algo.round(t)
        if active:
            v = beta * v + sum((1 - Q) * (u[i] - x) for i in active) / len(active)
            x = x + eta_g * v
        assert scalar(algo.x) == pytest.approx(x, rel=1e-6, abs=1e-6), t
        assert float(algo.momentum[0]) == pytest.approx(v, rel=1e-6, abs=1e-6), t


def test_the_plugin_equals_the_builtin_fedavgm(tmp_path):
    """The plug-in and fedmpi's own fedavgm (server_momentum) compute the same bits."""
    from fedmpi.cli import main

    mine, builtin = tmp_path / "mine.h5", tmp_path / "builtin.h5"
    assert main(["run", CONFIG, "--out", str(mine), "--quiet", "--plugin", PLUGIN, *SMALL]) == 0
    assert main(["run", CONFIG, "--out", str(builtin), "--quiet", "--plugin", PLUGIN, *SMALL,
                 "--set", "algorithm={name: fedavgm, server_momentum: 0.7}"]) == 0
    same(mine, builtin)


def test_model_and_dataset_take_their_own_keys():
    load([PLUGIN])
    cfg = config.load(CONFIG, ["task.width=5", "task.blocks=1", "task.arms=4", "task.spiral_samples=200"])
    task = build_components(cfg, World()).task
    assert task.classes == 4 and task.train_x.shape == (200, 2) and task.test_x.shape == (50, 2)
    shapes = [tuple(p.shape) for p in task.model.parameters()]
    assert shapes == [(5, 2), (5,), (5, 5), (5,), (4, 5), (4,)]


@pytest.mark.slow
@pytest.mark.parametrize("args, needle", [
    (["--set", "algorithm.betta=0.5"], "algorithm.betta: unknown key (allowed: name, global_lr, beta)"),
    (["--set", "algorithm.beta=1.5"], "algorithm.beta: must be < 1, got 1.5"),
    (["--set", "task.widht=3"], "task.widht: unknown key (allowed: dataset, root, cache_dir, clients, partition, "
                                "model, width, blocks, spiral_samples, arms, noise)"),
    (["--set", "task.arms=1"], "task.arms: must be >= 2, got 1"),
])
def test_a_typo_in_a_plugin_parameter_is_exit_2_naming_the_key(tmp_path, args, needle):
    p = run(tmp_path / "r.h5", *args, check=False)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == f"fedmpi: error: {needle}" and "Traceback" not in p.stderr


@pytest.mark.slow
@pytest.mark.mpi
def test_one_rank_equals_two_ranks_with_mpiexec_and_the_launcher(tmp_path):
    one, two, launched = tmp_path / "one.h5", tmp_path / "two.h5", tmp_path / "launch.h5"
    run(one)
    run(two, ranks=2)
    mpiexec(2)  # skips without MPI
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHON=sys.executable, FEDMPI_PLUGINS=PLUGIN)
    p = subprocess.run([os.path.join(ROOT, "launch", "fedmpi-launch"), "-n", "2", CONFIG, "--out", str(launched),
                        "--quiet", *SMALL], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    same(one, two)
    same(one, launched)
    with h5py.File(launched) as f:
        assert f.attrs["world_size"] == 2 and "name: my_fedavgm" in f.attrs["config"]


@pytest.mark.slow
@pytest.mark.mpi
def test_checkpoint_and_resume(tmp_path):
    """Killed at round 3 (checkpoint of round 2) then resumed, and stopped by SIGUSR1 then resumed
    on 2 ranks: the uninterrupted numbers both times (the momentum buffer is in the checkpoint)."""
    full, killed, preempted = tmp_path / "full.h5", tmp_path / "killed.h5", tmp_path / "preempted.h5"
    run(full)
    p = run(killed, env=fault_plugin.env("0:3:kill"), check=False)
    assert p.returncode != 0
    with h5py.File(killed) as f:
        assert f.attrs["status"] == "running"
    run(killed)  # the same command resumes by itself
    same(full, killed)
    p = run(preempted, env=fault_plugin.env("0:3:usr1"), check=False)
    assert p.returncode == 3 and "interrupted: signal SIGUSR1 at round 4" in p.stderr
    run(preempted, "--resume", ranks=2)
    same(full, preempted)


def test_loss_weighted_reads_the_per_client_losses():
    """Quadratic task: w_i = ell_i / sum ell_j, ell_i the mean of the losses at x and at the step
    after (s = 2, eta_l = 0.5: x_1 = u + (x - u) / 2)."""
    load([PLUGIN])
    u, x0 = [0.0, 8.0, -4.0], 2.0
    script = [[0, 1], [], [2], [0, 1, 2], [1]]
    cfg = config.from_dict({"seed": 1, "task": {"dataset": "quadratic", "model": "scalar", "clients": 3, "u": u,
                                                "x0": x0},
                            "train": {"local_steps": 2, "lr": 0.5, "batch_size": 1, "engine": "sequential"},
                            "algorithm": {"name": "my_loss_weighted"}})
    algo = build_components(cfg, World(), participation=Scripted(3, script)).algorithm
    x = x0
    for t, active in enumerate(script):
        algo.round(t)
        if active:
            ell = [((x - u[i]) ** 2 / 2 + ((x - u[i]) / 2) ** 2 / 2) / 2 for i in active]
            x = x + sum(e * (1 - Q) * (u[i] - x) for e, i in zip(ell, active)) / sum(ell)
        assert scalar(algo.x) == pytest.approx(x, rel=1e-6, abs=1e-6), t
