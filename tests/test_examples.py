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
import torch

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
                                "model, adapter, init, width, blocks, spiral_samples, arms, noise)"),
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


# ----------------------------------------------------------------------------- the Oort example (docs/PLUGINS.md)

OORT = ["--set", "algorithm={name: my_oort, select: 3, epsilon: 0.6, epsilon_min: 0.3}",
        "--set", "availability={kind: stationary, base: {kind: uniform, lo: 0.5, hi: 0.9}}"]


def same_client_rounds(a, b) -> None:
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        x, y = fa["client_rounds/sq_loss"][:], fb["client_rounds/sq_loss"][:]
        assert x.shape == (6, 7) and np.array_equal(x, y, equal_nan=True)
        assert np.isfinite(x).sum(1).tolist() == [3] * 6  # K = 3 clients trained each round, NaN for the rest


@pytest.mark.slow
@pytest.mark.mpi
def test_oort_selection_is_the_same_on_one_and_two_ranks_and_after_a_kill(tmp_path):
    """The Oort-style example: its draws, utilities and per-client quantity are the same bits on 1
    and 2 ranks, and after a kill and a resume (its state is declared; ``self.outputs`` is not
    needed across rounds)."""
    one, two, killed = tmp_path / "one.h5", tmp_path / "two.h5", tmp_path / "killed.h5"
    run(one, *OORT)
    run(two, *OORT, ranks=2)
    same(one, two)
    same_client_rounds(one, two)
    p = run(killed, *OORT, env=fault_plugin.env("0:3:kill"), check=False)
    assert p.returncode != 0
    run(killed, *OORT, ranks=2)  # resumed on 2 ranks
    same(one, killed)
    same_client_rounds(one, killed)


ASYNC_MOMENTUM = ["--set", "availability={kind: always}",
                  "--set", "clock={kind: lognormal, step_time: 1.0, comm_time: 2.0, sigma: 0.8, dropout: 0.1}",
                  "--set", "algorithm={name: my_fedbuff_momentum, concurrency: 4, buffer: 2, beta: 0.5}"]


def final_params(path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f["final/params"][:]


@pytest.mark.slow
@pytest.mark.mpi
def test_the_asynchronous_plugin_is_fedbuff_at_beta_0_and_resumes_to_its_bits(tmp_path):
    """``my_fedbuff_momentum`` (asyncmomentum.py): beta = 0 gives the built-in fedbuff's bits; with
    beta = 0.5 its velocity changes the model, and 1 rank, 2 ranks, and a run killed at step 3 and
    resumed on 2 ranks give the same bits (the velocity is declared state)."""
    plain, zero = tmp_path / "fedbuff.h5", tmp_path / "zero.h5"
    run(plain, *ASYNC_MOMENTUM, "--set", "algorithm={name: fedbuff, concurrency: 4, buffer: 2}")
    run(zero, *ASYNC_MOMENTUM, "--set", "algorithm.beta=0")
    same(plain, zero)
    assert np.array_equal(final_params(plain), final_params(zero))
    one, two, killed = tmp_path / "one.h5", tmp_path / "two.h5", tmp_path / "killed.h5"
    run(one, *ASYNC_MOMENTUM)
    assert not np.array_equal(final_params(one), final_params(zero))
    run(two, *ASYNC_MOMENTUM, ranks=2)
    same(one, two)
    p = run(killed, *ASYNC_MOMENTUM, env=fault_plugin.env("0:3:kill"), check=False)
    assert p.returncode != 0
    run(killed, *ASYNC_MOMENTUM, ranks=2)  # resumed on 2 ranks
    same(one, killed)
    for other in (two, killed):
        assert np.array_equal(final_params(one), final_params(other))


@pytest.mark.slow
def test_oort_is_refused_under_privacy_with_one_line(tmp_path):
    pytest.importorskip("dp_accounting")
    p = run(tmp_path / "r.h5", *OORT, "--set", "privacy={mechanism: gaussian, clip: 1.0, noise_multiplier: 1.0}",
            check=False)
    # --set algorithm={...} merges into the file's section (as a sweep's set: does), so the notices name
    # the keys of fedavgm.yaml that my_oort and stationary do not take; the refusal itself is one line
    errors = [line for line in p.stderr.strip().splitlines() if not line.startswith("notice: ")]
    assert p.returncode == 2 and len(errors) == 1, p.stderr
    assert "privacy.mechanism: algorithm.name 'my_oort' selects clients by their data" in errors[0]


def test_oort_explores_then_exploits_by_its_utility():
    """In process: the first rounds try untried clients; a client's utility is |B_i| sqrt(sq_loss)
    from its own per-sample losses; once every client is tried, the exploited ones are among the
    best scores (above the cutoff), and the draws do not depend on anything but seed and round."""
    load([PLUGIN])
    cfg = config.load(CONFIG, ["rounds=12", "task.spiral_samples=600", "task.clients=8", "task.width=8",
                               "algorithm={name: my_oort, select: 4, epsilon: 0.5, epsilon_min: 0.25, cutoff: 0.9}",
                               "availability={kind: always}"])
    algo = build_components(cfg, World()).algorithm
    algo.round(0)
    first = algo.active.copy()
    assert len(first) == 4 and algo.tried.sum() == 4
    out = algo.outputs
    b = cfg.train.batch_size
    assert np.array_equal(algo.utility[out.ids], out.steps * b * np.sqrt(out.extra["sq_loss"]))
    algo.round(1)
    assert algo.tried.sum() == 6  # eps_1 K = 0.49 x 4 -> 2 untried ones explored, 2 tried ones exploited
    for t in range(2, 12):
        before = algo.utility.copy()
        bonus = np.sqrt(0.1 * np.log(t) / np.maximum(algo.last, 1))
        picked = algo.select(t, np.arange(8))
        assert len(picked) == 4 and len(set(picked)) == 4
        score = before + bonus
        assert np.array_equal(picked, algo.select(t, np.arange(8)))  # keyed draws: the same again
        floor = np.sort(score)[::-1][3] * 0.9
        exploit = [i for i in picked if score[i] >= floor]
        assert len(exploit) >= 4 - round(max(0.25, 0.5 * 0.98 ** t) * 4)
        algo.round(t)
    again = build_components(cfg, World()).algorithm
    again.round(0)
    assert np.array_equal(again.active, first)


@pytest.mark.slow
def test_oort_cells_pack_in_a_sweep_with_their_own_quantities(tmp_path):
    """A sweep of Oort cells (two seeds) and FedAvgM cells run packed in one process: each Oort
    cell's file, its /client_rounds/sq_loss included, is the bits of the cell run alone."""
    import yaml

    overrides = dict(a.split("=", 1) for a in SMALL[1::2] + OORT[3::2])
    data = {"base": CONFIG, "out": str(tmp_path / "cells"),
            "set": {k: yaml.safe_load(v) for k, v in overrides.items()},
            "variants": [{"label": "oort", "algorithm": yaml.safe_load(OORT[1].split("=", 1)[1])},
                         {"label": "avgm", "algorithm": {"name": "my_fedavgm"}}],
            "grid": {"seed": [0, 1]}}
    sweep = tmp_path / "s.sweep.yaml"
    sweep.write_text(yaml.safe_dump(data, sort_keys=False))
    p = fedmpi(["sweep", str(sweep), "--pack", "4", "--plugin", PLUGIN])
    assert "4 runs trained together" in p.stderr, p.stderr
    for seed in (0, 1):
        alone = tmp_path / f"alone{seed}.h5"
        run(alone, *OORT, "--set", f"seed={seed}")
        packed = tmp_path / "cells" / "oort" / f"seed={seed}.h5"
        same(alone, packed)
        same_client_rounds(alone, packed)


IA3 = {"kind": "my_ia3", "target_modules": ["k_proj", "v_proj", "down_proj"]}


def test_the_adapter_plugin_trains_its_scales_stacked():
    """my_ia3 (an adapter type from a plug-in, with its stacked rule): only its scales are the
    clients' own, the stacked rule trains them as vmap does, and a client's bits do not depend on
    its block."""
    from helpers.text import text_config

    from fedmpi.build import build_task
    from fedmpi.engine.local import LocalTrainer

    load([PLUGIN])
    cfg = config.from_dict(text_config(False, task__adapter=IA3))
    task = build_task(cfg, torch.device("cpu"))
    stacked, vmapped = (LocalTrainer(task, cfg.train, cfg.seed, stacked=s) for s in (True, False))
    assert stacked.net is not None and all(n.endswith(".ia3_l") for n in stacked.spec.names)
    x0 = stacked.spec.flatten(task.model).expand(4, -1)
    ids = np.arange(4)
    together = stacked.train(x0, ids, 0)
    assert (together - x0).abs().max() > 1e-5
    torch.testing.assert_close(vmapped.train(x0, ids, 0), together, rtol=0, atol=1e-6)
    assert torch.equal(stacked.train(x0[:1], ids[2:3], 0)[0], together[2])


@pytest.mark.slow
@pytest.mark.mpi
def test_the_adapter_plugin_on_one_and_two_ranks(tmp_path):
    from helpers.text import text_config

    from conftest import write_config

    cfg = write_config(tmp_path / "ia3.yaml", text_config(False, task__adapter=IA3))
    one, two = tmp_path / "one.h5", tmp_path / "two.h5"
    for out, ranks in ((one, 0), (two, 2)):
        fedmpi(["run", cfg, "--out", str(out), "--quiet", "--plugin", PLUGIN], ranks=ranks)
    same(one, two)
