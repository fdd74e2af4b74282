"""Result files are never lost: busy paths, completed/foreign files, inputs as outputs, buffered rows."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

import fault_plugin
from conftest import ROOT, cli, fedmpi, synthetic_config, wait_for_rows, write_config
from fedmpi.cli import main
from fedmpi.errors import InputError
from fedmpi.results import hdf5


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _run(cfg, out, *extra) -> int:
    return main(["run", str(cfg), "--out", str(out), "--quiet", *extra])


@pytest.mark.slow
def test_a_second_run_on_a_busy_path_leaves_the_first_file_intact(tmp_path):
    """A real process writing a path: a second run on it (here in this process) is refused at once
    with exit 2 (also with --overwrite), the first keeps writing and its file stays readable to the end."""
    out = tmp_path / "r.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=100000, eval_every=1,
                                                              runtime={"progress": False, "flush_s": 0}))
    first = subprocess.Popen([sys.executable, "-m", "fedmpi", "run", cfg, "--out", str(out), "--quiet"], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        wait_for_rows(out, 3)
        for extra in ([], ["--overwrite"]):
            second = cli(["run", cfg, "--out", str(out), "--quiet", *extra])
            assert second.returncode == 2
            assert second.stderr.strip().splitlines() == [
                f"fedmpi: error: {out}: another run is writing this result file; wait for it to end "
                f"or choose another output"]
        with h5py.File(out, "r", locking=False) as f:
            n = f["metrics/round"].shape[0]
        wait_for_rows(out, n + 2)  # the first run is still writing
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    assert first.returncode == 3, err
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "interrupted"
        r = f["metrics/round"][:]
        assert list(r) == list(range(len(r))) and len(r) >= n + 2 and r[-1] == f.attrs["rounds_done"]
        assert np.isfinite(f["metrics/test_acc"][:]).all()
    info = cli(["info", str(out)])
    assert info.returncode == 0 and "status:     interrupted" in info.stdout, info.stderr


def test_claims_conflict_within_one_process(tmp_path):
    path = str(tmp_path / "x.h5")
    c = hdf5.claim(path, "d")
    assert hdf5.is_locked(path)
    with pytest.raises(hdf5.OutputBusy):
        hdf5.claim(path, "d", overwrite=True)
    c.release(discard=True)
    assert not os.path.exists(path) and not hdf5.is_locked(path)


def test_completed_file_needs_overwrite(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=2))
    out = tmp_path / "r.h5"
    assert _run(cfg, out) == 0
    before = _digest(out)
    assert _run(cfg, out) == 2
    assert "holds a completed run; use --overwrite" in capsys.readouterr().err
    assert _digest(out) == before
    assert _run(cfg, out, "--overwrite", "--set", "rounds=3") == 0
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "completed" and f.attrs["rounds_done"] == 3


def test_foreign_file_is_never_touched_without_overwrite(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=1))
    out = tmp_path / "notes.h5"
    out.write_text("my notes\n")
    assert _run(cfg, out) == 2
    assert "is not a fedmpi result file" in capsys.readouterr().err and out.read_text() == "my notes\n"
    empty = tmp_path / "empty.h5"
    empty.write_bytes(b"")
    assert _run(cfg, empty) == 0  # nothing to lose


@pytest.mark.parametrize("target", ["config", "trace"])
def test_output_equal_to_an_input_is_refused(tmp_path, capsys, target):
    trace = tmp_path / "trace.txt"
    trace.write_text("0 1\n2\n")
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        rounds=2, availability={"kind": "trace", "trace": str(trace), "trace_format": "ids"}))
    victim = {"config": tmp_path / "c.yaml", "trace": trace}[target]
    before = _digest(victim)
    assert _run(cfg, victim, "--overwrite") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is an input of this run" in err[0]
    assert _digest(victim) == before


def test_empty_output_paths(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=1))
    assert main(["run", cfg, "--out", ""]) == 2
    assert capsys.readouterr().err.strip() == "fedmpi: error: --out: empty result path"
    cfg2 = write_config(tmp_path / "d.yaml", synthetic_config(rounds=1, output=" "))
    assert main(["run", cfg2]) == 2
    assert "output: empty result path" in capsys.readouterr().err


def test_output_placeholders(tmp_path):
    from fedmpi import config
    from fedmpi.results.paths import output_path

    cfg = config.from_dict(synthetic_config(output=str(tmp_path / "{name}-{algorithm.name}-lr{train.lr}-s{seed}.h5")))
    assert output_path(cfg) == str(tmp_path / "synth-fedavg_active-lr0.1-s3.h5")
    bad = config.from_dict(synthetic_config(output="runs/{train.nope}.h5"))
    with pytest.raises(InputError, match=r"output: unknown config key \{train.nope\}"):
        output_path(bad)


@pytest.mark.slow
def test_unfinished_run_of_another_experiment_needs_overwrite(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=6))
    out = tmp_path / "r.h5"
    p = fedmpi(["run", cfg, "--out", str(out), "--quiet"], check=False, env=fault_plugin.env("0:3:kill"))
    assert p.returncode == -signal.SIGKILL
    before = _digest(out)
    assert _run(cfg, out, "--set", "train.lr=0.3") == 2
    assert "unfinished (running) run of another experiment" in capsys.readouterr().err
    assert _digest(out) == before
    assert _run(cfg, out) == 0  # the same experiment starts again (no checkpoint to resume)
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "completed" and list(f["metrics/round"][:]) == [0, 2, 4, 6]


def test_rows_are_buffered_and_written_at_flush(tmp_path):
    path = str(tmp_path / "b.h5")
    w = hdf5.ResultWriter(path, "{}", 0, 1, ["test_acc"], 4, True, claim_=hdf5.claim(path, "d"), flush_s=3600)

    def on_disk() -> tuple[int, int]:
        with h5py.File(path, "r", locking=False) as f:
            return f["metrics/round"].shape[0], f["availability/mask"].shape[0]

    for t in range(3):
        w.append_mask(np.array([t]))
        w.append({"round": t + 1, "test_acc": 0.5}, t + 1)
    assert on_disk() == (0, 0)  # nothing written yet: the file is as of its creation
    w.flush()
    assert on_disk() == (3, 3)
    w.append({"round": 4, "test_acc": 0.6}, 4)
    w.finish("completed", rounds_done=4)
    with h5py.File(path, "r") as f:
        assert list(f["metrics/round"][:]) == [1, 2, 3, 4] and f.attrs["rounds_done"] == 4
        assert f["availability/mask"][:].tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]
    assert not hdf5.is_locked(path)


@pytest.mark.slow
@pytest.mark.parametrize("flush_s, rows", [(0, 5), (3600, 0)])
def test_killed_run_leaves_the_rows_of_its_last_flush(tmp_path, flush_s, rows):
    out = tmp_path / "k.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=20, eval_every=1,
                                                              runtime={"progress": False, "flush_s": flush_s}))
    p = fedmpi(["run", cfg, "--out", str(out)], check=False, env=fault_plugin.env("0:4:kill"))
    assert p.returncode == -signal.SIGKILL
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "running" and f["metrics/round"].shape[0] == rows
    assert cli(["info", str(out)]).returncode == 0


def test_flush_s_is_a_config_key():
    from fedmpi import config

    with pytest.raises(InputError, match="runtime.flush_s: must be >= 0"):
        config.from_dict(synthetic_config(runtime={"flush_s": -1}))
    assert config.from_dict({}).runtime.flush_s == 5.0


@pytest.mark.parametrize("target", ["missing.h5", "gone/missing.h5"])
def test_dangling_symlink_as_output_says_so(tmp_path, capsys, target):
    """#38.16: a dangling link as --out was refused with "the file keeps being replaced by another
    process". It names the link and its missing target; nothing is created."""
    link = tmp_path / "r.h5"
    os.symlink(tmp_path / target, link)
    with pytest.raises(InputError, match=r"r\.h5: is a symbolic link to .*missing\.h5, which does not exist"):
        hdf5.claim(str(link), "d")
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=2))
    assert _run(cfg, link) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a symbolic link to" in err[0], err
    assert os.path.islink(link) and not os.path.exists(tmp_path / target)
