"""fedmpi sweep: cells and their paths, local and parallel executors, resume, --index, SLURM array."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

import h5py
import numpy as np
import pytest
import yaml

import fault_plugin
from conftest import ROOT, fedmpi, synthetic_config, write_config
from fedmpi import results
from fedmpi.cli import main
from fedmpi.errors import InputError
from fedmpi.results import hdf5, sweepfile


def _sweep_file(tmp_path, **extra) -> str:
    write_config(tmp_path / "base.yaml", synthetic_config(rounds=4, eval_every=2, runtime={"progress": False}))
    data = {"base": "base.yaml", "out": str(tmp_path / "out"),
            "variants": [{"label": "avg", "algorithm.name": "fedavg_active"},
                         {"algorithm": {"name": "mifa"}, "train.lr": 0.05}],
            "grid": {"seed": [0, 1]}, **extra}
    path = tmp_path / "s.sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _same_numbers(a: str, b: str) -> None:
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        for k in fa["metrics"]:
            if k not in ("wall_time", "peak_rss_mb"):
                assert np.array_equal(fa["metrics"][k][:], fb["metrics"][k][:], equal_nan=True), k
        assert np.array_equal(fa["final/params"][:], fb["final/params"][:])


def test_cells_paths_and_overrides(tmp_path):
    s = sweepfile.load(_sweep_file(tmp_path))
    out = str(tmp_path / "out")
    assert [c.name for c in s.cells] == ["avg/seed=0", "avg/seed=1", "algorithm.name=mifa,train.lr=0.05/seed=0",
                                         "algorithm.name=mifa,train.lr=0.05/seed=1"]
    assert s.cells[3].path == os.path.join(out, "algorithm.name=mifa,train.lr=0.05", "seed=1.h5")
    cfg = s.config(s.cells[3])
    assert (cfg.algorithm.name, cfg.train.lr, cfg.seed, cfg.output) == ("mifa", 0.05, 1, s.cells[3].path)
    assert cfg.rounds == 4  # from the base config
    cell = sweepfile.load(_sweep_file(tmp_path), out="elsewhere").cells[0]
    assert cell.path == os.path.join("elsewhere", "avg", "seed=0.h5")


@pytest.mark.parametrize("extra, needle", [
    ({"grid": {"seed": [0], "algorithm.name": ["mifa"]}}, "variants[0].algorithm.name: also a grid key"),
    ({"variants": [{"label": "a", "train.lr": 0.1}, {"label": "a", "train.lr": 0.2}]},
     "get the same file name 'a/seed=0'"),
    ({"grid": {"seed": 3}}, "grid.seed: must be a non-empty list"),
    ({"set": {"train.lr": -1}}, "cell 0 (avg/seed=0): train.lr: must be > 0"),
    ({"set": {"output": "x.h5"}}, "set.output: a sweep names each cell's result file"),
    ({"colour": 1}, "colour: unknown key"),
])
def test_bad_sweep_files(tmp_path, capsys, extra, needle):
    path = _sweep_file(tmp_path, **extra)
    assert main(["sweep", path]) == 2  # a whole sweep checks every cell before running any
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_local_sweep_skips_done_cells_and_tabulates(tmp_path, capsys):
    path = _sweep_file(tmp_path)
    assert main(["sweep", path, "--quiet"]) == 0
    s = sweepfile.load(path)
    assert [sweepfile.cell_state(c)[0] for c in s.cells] == ["done"] * 4
    stamps = [os.stat(c.path).st_mtime_ns for c in s.cells]
    assert main(["sweep", path]) == 0
    assert "4 cells in" in capsys.readouterr().err and [os.stat(c.path).st_mtime_ns for c in s.cells] == stamps
    # one cell equals the same run made with `fedmpi run`
    ref = str(tmp_path / "ref.h5")
    assert main(["run", str(tmp_path / "base.yaml"), "--out", ref, "--quiet", "--set", "algorithm.name=mifa",
                 "--set", "train.lr=0.05", "--set", "seed=1"]) == 0
    _same_numbers(ref, s.cells[3].path)
    # the table of the sweep: one row per variant, mean over the two seeds
    capsys.readouterr()
    assert main(["table", path, "--metric", "test_acc", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("variant,") and lines[1].startswith("avg,") and len(lines) == 3
    expect = np.mean([results.load(c.path).metrics["test_acc"][-1] for c in s.cells[:2]])
    assert float(lines[1].split(",")[1]) == pytest.approx(expect, abs=1e-12)
    assert main(["sweep", path, "--status"]) == 0
    assert "4 cells: 4 done, 0 running" in capsys.readouterr().out


@pytest.mark.slow
def test_status_of_every_state(tmp_path, capsys):
    path = _sweep_file(tmp_path)
    s = sweepfile.load(path)
    fedmpi(["sweep", path, "--index", "0", "--quiet"])
    p = fedmpi(["sweep", path, "--index", "1", "--quiet"], check=False, env=fault_plugin.env("0:2:kill"))
    assert p.returncode == -signal.SIGKILL
    p = fedmpi(["sweep", path, "--index", "2", "--quiet"], check=False, env=fault_plugin.env("0:2:raise"))
    assert p.returncode == 1
    held = hdf5.claim(s.cells[3].path, "x")  # as a run that is writing this cell
    try:
        states = [sweepfile.cell_state(c)[0] for c in s.cells]
        assert states == ["done", "interrupted", "failed", "running"]
        assert main(["sweep", path, "--status"]) == 0
        assert "4 cells: 1 done, 1 running, 1 interrupted, 1 failed, 0 not started" in capsys.readouterr().out
    finally:
        held.release(discard=True)
    assert sweepfile.cell_state(s.cells[3])[0] == "not started"


def test_a_changed_sweep_does_not_reuse_finished_cells(tmp_path, capsys):
    path = _sweep_file(tmp_path, variants=None, grid={"seed": [0]})
    assert main(["sweep", path, "--quiet"]) == 0
    changed = _sweep_file(tmp_path, variants=None, grid={"seed": [0]}, set={"train.lr": 0.3, "runtime.csv": True})
    assert [sweepfile.cell_state(c)[0] for c in sweepfile.load(changed).cells] == ["outdated"]
    assert main(["sweep", changed]) == 2
    assert "train.lr: 0.1 in the file, 0.3 in the sweep" in capsys.readouterr().err
    runtime_only = _sweep_file(tmp_path, variants=None, grid={"seed": [0]}, set={"runtime.csv": True})
    assert [sweepfile.cell_state(c)[0] for c in sweepfile.load(runtime_only).cells] == ["done"]


def test_a_cell_another_process_writes_is_skipped(tmp_path, capsys):
    path = _sweep_file(tmp_path, variants=None)
    cells = sweepfile.load(path).cells
    held = hdf5.claim(cells[0].path, "x")
    try:
        assert main(["sweep", path]) == 0
        err = capsys.readouterr().err
        assert "cell 0 (seed=0) is being run by another process; skipped" in err
        assert [sweepfile.cell_state(c)[0] for c in cells] == ["running", "done"]
    finally:
        held.release(discard=True)


@pytest.mark.slow
def test_interrupted_cell_resumes_from_its_checkpoint(tmp_path):
    path = _sweep_file(tmp_path, set={"rounds": 8, "runtime.checkpoint_every": 2})
    s = sweepfile.load(path)
    p = fedmpi(["sweep", path, "--index", "2", "--quiet"], check=False, env=fault_plugin.env("0:5:kill"))
    assert p.returncode == -signal.SIGKILL and os.path.exists(s.cells[2].path + ".ckpt/manifest.json")
    fedmpi(["sweep", path, "--quiet"])  # the whole sweep: the killed cell continues from round 4
    ref = str(tmp_path / "ref.h5")
    fedmpi(["run", str(tmp_path / "base.yaml"), "--out", ref, "--quiet", "--set", "algorithm.name=mifa",
            "--set", "train.lr=0.05", "--set", "seed=0", "--set", "rounds=8"])
    _same_numbers(ref, s.cells[2].path)
    assert json.load(open(s.cells[2].path + ".ckpt/manifest.json"))["round"] == 8  # the final state, kept


@pytest.mark.slow
def test_parallel_workers_give_the_same_results(tmp_path):
    path = _sweep_file(tmp_path)
    seq = str(tmp_path / "seq")
    p = fedmpi(["sweep", path, "-j", "2"])
    assert "with 2 processes" in p.stderr and "4 done" in p.stderr
    fedmpi(["sweep", path, "--out", seq, "--quiet"])
    for c in sweepfile.load(path).cells:
        _same_numbers(c.path, c.path.replace(str(tmp_path / "out"), seq))


@pytest.mark.slow
def test_parallel_sweep_preempted(tmp_path):
    """SIGTERM to `fedmpi sweep -j 2` reaches the workers: each running cell checkpoints and the sweep exits 3."""
    from conftest import wait_for_rows

    path = _sweep_file(tmp_path, set={"rounds": 100000, "runtime.checkpoint_every": 50, "runtime.flush_s": 0})
    cells = sweepfile.load(path).cells
    proc = subprocess.Popen([sys.executable, "-m", "fedmpi", "sweep", path, "-j", "2", "--quiet"], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_for_rows(cells[0].path, 2)
    wait_for_rows(cells[1].path, 2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 3, err
    assert [sweepfile.cell_state(c)[0] for c in cells] == ["interrupted", "interrupted", "not started", "not started"]
    assert all(os.path.exists(c.path + ".ckpt/manifest.json") for c in cells[:2])


def test_index_and_array_size(tmp_path, capsys):
    path = _sweep_file(tmp_path)
    assert main(["sweep", path, "--print-array-size"]) == 0 and capsys.readouterr().out.strip() == "4"
    assert main(["sweep", path, "--index", "4"]) == 2
    assert "--index: 4 is out of range (the sweep has 4 cells, 0..3)" in capsys.readouterr().err
    assert main(["sweep", path, "--index", "1", "--quiet"]) == 0
    states = [sweepfile.cell_state(c)[0] for c in sweepfile.load(path).cells]
    assert states == ["not started", "done", "not started", "not started"]


@pytest.mark.slow
@pytest.mark.mpi
def test_index_on_two_ranks(tmp_path):
    path = _sweep_file(tmp_path)
    fedmpi(["sweep", path, "--index", "3", "--quiet"], ranks=2)
    with h5py.File(sweepfile.load(path).cells[3].path, "r") as f:
        assert f.attrs["status"] == "completed" and f.attrs["world_size"] == 2
    p = fedmpi(["sweep", path, "--quiet"], ranks=2, check=False)
    assert p.returncode == 2 and "give --index" in p.stderr


def _shim(folder, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.slow
def test_slurm_array_template(tmp_path):
    """slurm/sweep_array.sbatch: array task -> its cell; USR1 checkpoints, exits 3 and requeues;
    the requeued task continues the cell to the end."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _shim(bin_dir, "srun", 'while [[ "$1" == --* ]]; do shift; done\n"$@" &\nchild=$!\n'
                           'trap \'kill -USR1 $child\' USR1\ntrap \'kill -TERM $child\' TERM\n'
                           'while true; do code=0; wait $child || code=$?; '
                           'kill -0 $child 2>/dev/null || exit $code; done\n')
    _shim(bin_dir, "scontrol", f'echo "$@" >> {tmp_path}/scontrol.log\n')
    path = _sweep_file(tmp_path, set={"rounds": 100000, "runtime.checkpoint_every": 50})
    cell = sweepfile.load(path).cells[1]
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}"
               f"{os.environ['PATH']}", SLURM_JOB_ID="77", SLURM_ARRAY_JOB_ID="70", SLURM_ARRAY_TASK_ID="1",
               SLURM_SUBMIT_DIR=ROOT, PYTHONPATH=ROOT)
    proc = subprocess.Popen(["bash", os.path.join(ROOT, "slurm", "sweep_array.sbatch"), path], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    from conftest import wait_for_rows

    wait_for_rows(cell.path, 2)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "round" in err  # progress lines in the batch log
    assert "requeue 77" in (tmp_path / "scontrol.log").read_text()
    assert sweepfile.cell_state(cell)[0] == "interrupted" and os.path.exists(cell.path + ".ckpt/manifest.json")


def _shipped_sweeps() -> list[str]:
    return sorted(os.path.join(root, f) for root, _, files in os.walk(os.path.join(ROOT, "configs"))
                  for f in files if f.endswith(".sweep.yaml"))


@pytest.mark.parametrize("path", _shipped_sweeps(), ids=lambda p: p.rsplit("configs/", 1)[-1])
def test_sweep_examples_in_configs_are_valid(path):
    """Each shipped sweep file loads; one with privacy: cells is skipped without the [privacy] extra."""
    import importlib.util

    try:
        s = sweepfile.load(path)
    except InputError as e:
        if "dp-accounting" in str(e) and importlib.util.find_spec("dp_accounting") is None:
            pytest.skip("a privacy sweep needs the [privacy] extra (dp-accounting)")
        raise
    assert s.cells and len({c.path for c in s.cells}) == len(s.cells)


def test_checking_a_sweep_prints_no_notices(capsys):
    """The sine sweep switches the base config's FedSWE to other algorithms: its FedSWE keys are ignored
    with a notice when a cell runs, not once per cell whenever the sweep is read."""
    path = os.path.join(ROOT, "configs/unavailability/fmnist_sine.sweep.yaml")
    assert main(["sweep", path, "--status", "--out", "/nonexistent/folder"]) == 0
    captured = capsys.readouterr()
    assert "notice" not in captured.err and f"{len(sweepfile.load(path).cells)} cells: 0 done" in captured.out


def test_missing_sweep_file(capsys):
    assert main(["sweep", "nope.sweep.yaml"]) == 2
    assert capsys.readouterr().err.strip() == "fedmpi: error: nope.sweep.yaml: sweep file not found"
    with pytest.raises(InputError):
        sweepfile.load("nope.yaml")


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_notice_the_cells_share_is_said_once_per_sweep(tmp_path, capsys, jobs):
    """The base config's fedswe key is ignored by every mifa cell: one notice, not one per cell."""
    write_config(tmp_path / "base.yaml", synthetic_config(rounds=2, eval_every=2, algorithm={"name": "fedswe", "k": 3}))
    path = tmp_path / "s.sweep.yaml"
    path.write_text(yaml.safe_dump({"base": "base.yaml", "set": {"algorithm.name": "mifa"},
                                    "grid": {"seed": [0, 1, 2]}}))
    if jobs == 1:
        assert main(["sweep", str(path), "--quiet"]) == 0
        err = capsys.readouterr().err
    else:
        err = fedmpi(["sweep", str(path), "--quiet", "-j", "2"]).stderr
    assert err.count("notice: algorithm.k: not a parameter of mifa (only of fedswe); ignored") == 1, err
    assert len([f for f in os.listdir(tmp_path / "runs" / "s") if f.endswith(".h5")]) == 3
