"""Packed sweeps (issue 36): several cells trained as one program give each cell its own bits.

The engine part (``engine.packed.PackedTrainer``) is checked in process against each run alone;
the driver (``fedmpi.packed``) through ``fedmpi sweep --pack``: packed == unpacked for several
algorithms, on 1 and 2 ranks, after an interruption and resume, and with one cell that fails.
"""

from __future__ import annotations

import json
import os
import signal

import h5py
import numpy as np
import pytest
import torch
import yaml

import fault_plugin
from conftest import fedmpi, synthetic_config, write_config
from fedmpi import config
from fedmpi.algorithms.base import ServerAlgorithm, register
from fedmpi.build import build_components
from fedmpi.cli import main
from fedmpi.engine.local import Training
from fedmpi.engine.packed import PackedTrainer, incompatibility
from fedmpi.packed import pack_key, plan
from fedmpi.results import sweepfile
from fedmpi.runtime import World

# (algorithm block, other sections): every way a run hands the trainer something of its own
RUNS = [
    ({"name": "fedavg_active"}, {}),
    ({"name": "mifa"}, {"train": {"lr": 0.05}}),
    ({"name": "fedprox", "mu": 0.1}, {"train": {"lr_schedule": "inv_sqrt"}}),  # a step term, another schedule
    ({"name": "scaffold"}, {}),  # a step term with client state
    ({"name": "qffl", "q": 2.0}, {}),  # per-client outputs (the losses of the packed pass)
    ({"name": "fedswe", "k": 3}, {}),  # start models of its own
    ({"name": "debiased_fedavg"}, {"availability": {"kind": "markov", "B": 2, "R": 2}}),  # lr_scale
    ({"name": "fedprox", "mu": 0.0}, {}),  # no term at all beside runs that have one
]


def _cfg(seed: int, algorithm: dict, extra: dict, **over) -> config.Config:
    d = synthetic_config(seed=seed, rounds=5, **over)
    d["train"].update({"local_steps_draw": "uniform", "momentum": 0.5, "grad_clip": 2.0})
    d["algorithm"] = dict(algorithm)
    for k, v in extra.items():
        d[k] = {**d.get(k, {}), **v}
    return config.from_dict(d)


def _rounds(runs, packed: PackedTrainer | None, rounds: int = 5) -> list[torch.Tensor]:
    for t in range(rounds):
        if packed is None:
            for r in runs:
                r.algorithm.round(t)
            continue
        requests = [r.algorithm.begin_round(t) for r in runs]
        for r, q, end in zip(runs, requests, packed.train(list(enumerate(requests)))):
            r.algorithm.finish_round(q, end)
    return [r.algorithm.final_params().clone() for r in runs]


@pytest.mark.parametrize("model, blocks", [("logreg", None), ("logreg", 5), ("mlp", 7), ("mlp", "padded")])
def test_each_run_gets_its_own_bits(monkeypatch, model, blocks):
    """Runs of other seeds (so other data, partitions, initial models), algorithms, step sizes and
    schedules trained in one block, or cut into blocks that straddle runs, or padded to one shape
    (CUDA's rule, on CPU): each run's model is the bits it gets alone."""
    cfgs = [_cfg(seed, a, e, task__model=model, task__hidden=8) for seed, (a, e) in enumerate(RUNS)]
    world = World()
    alone = _rounds([build_components(c, world) for c in cfgs], None)
    runs = [build_components(c, world) for c in cfgs]
    if blocks == "padded":
        for r in runs:
            r.trainer.fixed_shape = True
    packed = PackedTrainer([r.trainer for r in runs])
    if blocks is not None:
        monkeypatch.setattr(packed, "block_rows", lambda: 7 if blocks == "padded" else blocks)
        if blocks == "padded":
            monkeypatch.setattr(packed.block, "chunk_size", lambda: 7)
    assert len(set(packed.base)) == len(cfgs)  # every seed drew its own synthetic data: stacked
    together = _rounds(runs, packed)
    for i, (a, b) in enumerate(zip(alone, together)):
        assert torch.equal(a, b), f"run {i} ({RUNS[i][0]['name']})"
    assert not torch.equal(alone[0], alone[1])


def test_runs_at_different_rounds_and_lengths():
    """A group's runs need not be at the same round (a resumed cell, other checkpoints) nor end
    together: each request trains at its own round, and a run that ended leaves the others."""
    cfgs = [_cfg(seed, a, e) for seed, (a, e) in enumerate(RUNS[:3])]
    world = World()
    alone = _rounds([build_components(c, world) for c in cfgs], None, rounds=6)
    runs = [build_components(c, world) for c in cfgs]
    for t in range(2):  # run 1 is two rounds ahead (as if resumed from a later checkpoint)
        runs[1].algorithm.round(t)
    packed = PackedTrainer([r.trainer for r in runs])
    next_round = [0, 2, 0]
    while any(t < 6 for t in next_round):
        jobs = [(k, runs[k].algorithm.begin_round(t)) for k, t in enumerate(next_round) if t < 6]
        for (k, request), end in zip(jobs, packed.train(jobs)):
            runs[k].algorithm.finish_round(request, end)
            next_round[k] += 1
    assert all(torch.equal(a, r.algorithm.final_params()) for a, r in zip(alone, runs))


def test_a_run_with_no_client_in_a_round_between_others():
    """#44 hostile (7): a packed group crashed (``cannot reshape array of size 0`` in
    engine/local.py, on every rerun) in a round where a run between two others had no client."""
    schedule = {"availability": {"kind": "trace", "schedule": [[0, 3], [], [5], []], "trace_repeat": True}}
    cfgs = [_cfg(0, *RUNS[0]), _cfg(1, RUNS[0][0], schedule), _cfg(2, *RUNS[1])]
    world = World()
    alone = _rounds([build_components(c, world) for c in cfgs], None)
    runs = [build_components(c, world) for c in cfgs]
    together = _rounds(runs, PackedTrainer([r.trainer for r in runs]))
    assert all(torch.equal(a, b) for a, b in zip(alone, together))


def test_a_signal_during_a_groups_set_up_ends_every_cell_as_interrupted(tmp_path, monkeypatch):
    """Set-up is interruptible (#38 item 7): a stop signal while the second cell is set up ended
    the group through its generic error path (a traceback, exit 1 for every cell); now each cell
    ends interrupted (exit 3), the one already set up with its file saying so."""
    import fedmpi.runner as runner_module
    from fedmpi import signals
    from fedmpi.packed import run_group

    cfgs = [_cfg(seed, *RUNS[0]) for seed in range(3)]
    outs = [str(tmp_path / f"r{seed}.h5") for seed in range(3)]
    built = []

    def build(cfg, world):
        built.append(cfg.seed)
        if len(built) == 2:  # the second cell's set-up
            os.kill(os.getpid(), signal.SIGUSR1)
        return build_components(cfg, world)

    monkeypatch.setattr(runner_module, "build_components", build)
    with signals.trapped():
        ended = run_group(cfgs, World(), outs, ["a", "b", "c"], [()] * 3, quiet=True)
    assert [o.code for o in ended] == [3, 3, 3] and built == [0, 1]  # the third is never set up
    with h5py.File(outs[0], "r") as f:
        assert f.attrs["status"] == "interrupted" and f.attrs["rounds_done"] == 0


def test_one_dataset_is_shared_and_its_ids_are_not_shifted():
    """Runs with equal training data (here: one seed, two algorithms) share one copy."""
    cfgs = [_cfg(3, a, e) for a, e in RUNS[:2]]
    world = World()
    alone = _rounds([build_components(c, world) for c in cfgs], None)
    runs = [build_components(c, world) for c in cfgs]
    packed = PackedTrainer([r.trainer for r in runs])
    assert packed.base == [0, 0] and runs[0].task.train_x is runs[1].task.train_x
    assert all(torch.equal(a, b) for a, b in zip(alone, _rounds(runs, packed)))


def test_images_with_augmentation_and_dropout():
    """Per-run augmentation draws and dropout keys (a CNN on tiny images, another seed each)."""
    from helpers.images import image_trainer

    train = {"augment": ["crop", "flip"], "local_steps_draw": "uniform", "local_steps": 3}
    trainers = [image_trainer("batched", seed=s, train=train) for s in (0, 1, 2)]
    g = torch.Generator().manual_seed(0)
    x0 = trainers[0].spec.flatten(trainers[0].task.model)
    jobs = [Training(x0 + 0.01 * torch.randn(3, x0.numel(), generator=g), np.array(ids), t=2)
            for ids in ([0, 3, 4], [1, 2, 4], [4, 0, 2])]
    alone = [tr.run(job) for tr, job in zip(trainers, jobs)]
    together = PackedTrainer(trainers).train(list(enumerate(jobs)))
    assert all(torch.equal(a, b) for a, b in zip(alone, together))


def test_trainers_that_differ_in_their_step_are_refused():
    world = World()
    a = build_components(_cfg(0, *RUNS[0]), world).trainer
    b = build_components(_cfg(0, *RUNS[0], train__batch_size=4), world).trainer
    c = build_components(_cfg(0, *RUNS[0], train__lr=0.3, train__lr_schedule="inv_sqrt"), world).trainer
    assert incompatibility(a, b) == "train" and incompatibility(a, c) is None
    with pytest.raises(ValueError, match="differ in train"):
        PackedTrainer([a, b])


@register("test_own_training")
class _OwnTraining(ServerAlgorithm):
    weights_are_cohort_mean = True

    def weights(self, t, active, local):
        return np.full(len(local), 1.0 / self.cohort(active))

    def local_training(self, t, local, start):
        return super().local_training(t, local, start)


def test_which_configs_pack():
    """Seeds, algorithms, step sizes and availability may differ; the task, the rest of the
    local step and the process world may not; some configs never pack, with the reason."""
    base = _cfg(0, *RUNS[0])
    same = [_cfg(1, *RUNS[0]), _cfg(0, *RUNS[2]), _cfg(0, *RUNS[6]), _cfg(0, *RUNS[0], train__lr=1.0)]
    assert all(pack_key(c)[0] == pack_key(base)[0] for c in same)
    other = [_cfg(0, *RUNS[0], train__batch_size=4), _cfg(0, *RUNS[0], task__clients=10),
             _cfg(0, *RUNS[0], runtime__threads=1)]
    assert all(pack_key(c)[0] not in (None, pack_key(base)[0]) for c in other)
    alone = {
        "dspodfl": _cfg(0, {"name": "dspodfl"}, {"availability": {"kind": "always"}, "topology": {"kind": "ring"},
                                                 "train": {"momentum": 0.0, "local_steps_draw": "fixed"}}),
        "its own local_training": _cfg(0, {"name": "test_own_training"}, {}),
        "train.full_gradient": _cfg(0, *RUNS[0], train__full_gradient=True),
    }
    for needle, c in alone.items():
        key, why = pack_key(c)
        assert key is None and needle in why, why
    keys = [("a", None), ("b", None), (None, "x"), ("a", None), ("a", None), ("b", None)]
    assert plan(keys, 2) == [[0, 3], [1, 5], [2], [4]]
    assert plan(keys, lambda count: 3) == [[0, 3, 4], [1, 5], [2]]


# ------------------------------------------------------------------------------ the sweep command

def _sweep(tmp_path, name: str = "s", **extra) -> str:
    base = synthetic_config(rounds=6, eval_every=2, runtime={"progress": False})
    base["train"]["local_steps_draw"] = "uniform"
    write_config(tmp_path / "base.yaml", base)
    data = {"base": "base.yaml", "out": str(tmp_path / name),
            "variants": [{"label": "avg", "algorithm.name": "fedavg_active"},
                         {"label": "mifa", "algorithm.name": "mifa", "train.lr": 0.05},
                         {"label": "prox", "algorithm.name": "fedprox", "algorithm.mu": 0.1},
                         {"label": "scaffold", "algorithm.name": "scaffold"},
                         {"label": "dsp", "algorithm.name": "dspodfl", "availability.kind": "always",
                          "topology.kind": "ring", "train.local_steps_draw": "fixed"}],  # one step an iteration
            "grid": {"seed": [0, 1]}, **extra}
    path = tmp_path / f"{name}.sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _same(a: str, b: str) -> None:
    """Two result files hold the same numbers (all metrics but the clock and memory) and model."""
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert fa.attrs["status"] == fb.attrs["status"] == "completed", (a, fa.attrs["status"])
        for k in fa["metrics"]:
            if k not in ("wall_time", "peak_rss_mb"):
                assert np.array_equal(fa["metrics"][k][:], fb["metrics"][k][:], equal_nan=True), (a, k)
        assert np.array_equal(fa["final/params"][:], fb["final/params"][:]), a


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The sweep's cells run one by one (unpacked), once for the module."""
    folder = tmp_path_factory.mktemp("ref")
    path = _sweep(folder, "ref")
    assert main(["sweep", path, "--quiet"]) == 0
    return {c.name: c.path for c in sweepfile.load(path).cells}


def _check(path: str, reference: dict) -> None:
    for c in sweepfile.load(path).cells:
        _same(reference[c.name], c.path)


@pytest.mark.slow
def test_packed_sweep_equals_unpacked(tmp_path, capsys, reference):
    path = _sweep(tmp_path)
    assert main(["sweep", path, "--pack", "8"]) == 0
    err = capsys.readouterr().err
    assert err.count("cannot pack") == 1 and "cells 8-9 cannot pack (algorithm dspodfl is not a centralized" in err
    assert "cells 0-7 packed: 8 runs trained together" in err and "(packed): " in err
    _check(path, reference)
    assert main(["sweep", path, "--pack", "8"]) == 0  # all done: nothing runs again
    assert "10 done, 0 to run" in capsys.readouterr().err


@pytest.mark.slow
def test_sweep_file_pack_key_workers_and_array_groups(tmp_path, capsys, reference):
    path = _sweep(tmp_path, pack=3)
    assert main(["sweep", path, "--print-array-size"]) == 0
    assert capsys.readouterr().out.strip() == "5"  # 8 packable cells in groups of 3, 3, 2; 2 alone
    assert main(["sweep", path, "--print-array-size", "--pack", "1"]) == 0
    assert capsys.readouterr().out.strip() == "10"
    assert main(["sweep", path, "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[2] for ln in lines] == ["0", "0", "0", "1", "1", "1", "2", "2", "3", "4"]
    assert main(["sweep", path, "--index", "1", "--quiet"]) == 0  # group 1: cells 3-5
    states = [sweepfile.cell_state(c)[0] for c in sweepfile.load(path).cells]
    assert states == ["not started"] * 3 + ["done"] * 3 + ["not started"] * 4
    assert main(["sweep", path, "--index", "5"]) == 2
    assert "--index: 5 is out of range (the sweep has 5 packed groups, 0..4)" in capsys.readouterr().err
    p = fedmpi(["sweep", path, "-j", "2"])  # workers take groups; -j 2 halves them: 2 + 2 (+ the done ones)
    assert "with 2 processes" in p.stderr and "10 done" in p.stderr
    _check(path, reference)


@pytest.mark.parametrize("bad, needle", [({"pack": 0}, "pack: must be a whole number >= 1"),
                                         ({"pack": True}, "pack: must be a whole number >= 1")])
def test_bad_pack_values(tmp_path, capsys, bad, needle):
    assert main(["sweep", _sweep(tmp_path, **bad)]) == 2
    assert needle in capsys.readouterr().err
    assert main(["sweep", _sweep(tmp_path), "--pack", "0"]) == 2
    assert "--pack: must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.mpi
def test_packed_group_on_two_ranks(tmp_path, reference):
    path = _sweep(tmp_path, pack=8)
    fedmpi(["sweep", path, "--index", "0", "--quiet"], ranks=2)
    cells = sweepfile.load(path).cells
    for c in cells[:8]:
        with h5py.File(c.path, "r") as f:
            assert f.attrs["world_size"] == 2
        _same(reference[c.name], c.path)


@pytest.mark.slow
def test_interrupted_group_checkpoints_every_cell_and_resumes(tmp_path, reference):
    """SIGUSR1 during round 3 of a packed group: every cell checkpoints after it (exit 3); the
    same command resumes them all and gives the unpacked bits. A kill (no checkpoint at the
    moment) resumes from the last periodic checkpoint."""
    path = _sweep(tmp_path, pack=8, set={"runtime.checkpoint_every": 4})
    cells = sweepfile.load(path).cells[:8]
    p = fedmpi(["sweep", path, "--index", "0", "--quiet"], check=False, env=fault_plugin.env("0:2:usr1"))
    assert p.returncode == 3, p.stderr
    for c in cells:
        assert sweepfile.cell_state(c) == ("interrupted", 3)
        assert os.path.exists(c.path + ".ckpt/manifest.json")
    p = fedmpi(["sweep", path, "--index", "0", "--quiet"], check=False, env=fault_plugin.env("0:5:kill"))
    assert p.returncode == -signal.SIGKILL  # after the checkpoint of round 4
    fedmpi(["sweep", path, "--index", "0", "--quiet"])
    for c in cells:
        _same(reference[c.name], c.path)
        assert json.load(open(c.path + ".ckpt/manifest.json"))["round"] == 6  # the final state, kept


@pytest.mark.slow
def test_one_cell_that_fails_leaves_the_others(tmp_path, capsys, reference):
    """In one packed group: a cell that diverges ends diverged (exit 4), a cell with bad input at
    set-up exit 2, a cell whose plug-in callback raises fails (exit 1), a cell that a callback
    stops early completes there; the others complete with their unpacked bits."""
    plugin = tmp_path / "raising.py"
    plugin.write_text("from fedmpi.registry import CALLBACKS\n"
                      "def boom(run, t):\n"
                      "    if run.cfg.algorithm.name == 'scaffold' and run.cfg.seed == 1 and t == 2:\n"
                      "        raise RuntimeError('boom')\n"
                      "CALLBACKS.register('boom', boom)\n")
    path = _sweep(tmp_path, pack=14, plugins=[str(plugin)])
    data = yaml.safe_load(open(path))
    data["variants"] += [{"label": "blowup", "algorithm.name": "fedavg_active", "train.lr": 1e39,
                          "train.grad_clip": None},
                         {"label": "badstop", "algorithm.name": "fedavg_active",
                          "runtime.stop_at": {"metric": "no_such_metric"}},
                         {"label": "early", "algorithm.name": "mifa", "runtime.stop_at": {"metric": "n_active",
                                                                                          "value": 1}}]
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    assert main(["sweep", path, "--list"]) == 0 and capsys.readouterr().out.count("group   0") == 14
    assert main(["sweep", path, "--index", "0"]) == 1  # codes 1, 2 and 4 in one group: 1
    err = capsys.readouterr().err
    assert "runtime.stop_at.metric: this run logs no metric 'no_such_metric'" in err
    assert "failed; the other runs of its group go on" in err and "RuntimeError: boom" in err
    assert "fedmpi: diverged:" in err
    states = {c.name: sweepfile.cell_state(c)[0] for c in sweepfile.load(path).cells}
    assert states["scaffold/seed=1"] == "failed" and states["blowup/seed=0"] == "failed"  # diverged files
    assert states["badstop/seed=0"] == "not started"
    for c in sweepfile.load(path).cells[:7]:
        _same(reference[c.name], c.path)
    cells = sweepfile.load(path).cells
    with h5py.File(cells[10].path, "r") as f:
        assert f.attrs["status"] == "diverged"
    for c in cells[14:]:  # stopped early at round 2, as when run alone
        with h5py.File(c.path, "r") as f:
            assert f.attrs["status"] == "completed" and f.attrs["rounds_done"] == 2 and "stopped_early" in f.attrs
        alone = str(tmp_path / "alone")
        assert main(["sweep", path, "--pack", "1", "--index", str(c.index), "--out", alone, "--quiet"]) == 0
        _same(os.path.join(alone, c.name + ".h5"), c.path)


@pytest.mark.slow
def test_slurm_array_task_runs_a_packed_group(tmp_path, reference):
    """slurm/sweep_array.sbatch SWEEP --pack 8: array task 0 runs packed group 0 (through
    slurm/job.sh and launch/fedmpi-launch, with srun shimmed as in tests/test_sweep.py)."""
    import subprocess
    import sys

    from conftest import ROOT
    from test_sweep import _shim

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _shim(bin_dir, "srun", 'while [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    path = _sweep(tmp_path)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}"
               f"{os.environ['PATH']}", SLURM_JOB_ID="77", SLURM_ARRAY_JOB_ID="70", SLURM_ARRAY_TASK_ID="0",
               SLURM_SUBMIT_DIR=ROOT, PYTHONPATH=ROOT)
    p = subprocess.run(["bash", os.path.join(ROOT, "slurm", "sweep_array.sbatch"), path, "--pack", "8"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    cells = sweepfile.load(path).cells
    assert [sweepfile.cell_state(c)[0] for c in cells] == ["done"] * 8 + ["not started"] * 2
    for c in cells[:8]:
        _same(reference[c.name], c.path)
