"""Progress in batch logs and terminals, and the CSV / TensorBoard copies of the metric rows."""

from __future__ import annotations

import csv
import fcntl
import io
import os
import pty
import signal
import struct
import subprocess
import sys
import termios

import h5py
import numpy as np
import pytest

import fault_plugin
from conftest import ROOT, fedmpi, synthetic_config, write_config
from fedmpi import progress
from fedmpi.cli import main


def test_lines_without_a_terminal(monkeypatch):
    clock = iter([100.0, 102.0, 104.0])  # start, first line, second line
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    buf = io.StringIO()
    p = progress.start(total=100, done=0, enabled=True, label="[1/3 a]", stream=buf)
    p.evaluated({"round": 0, "test_acc": 0.1, "test_loss": 2.0, "wall_time": 1.0})
    p.update(20)
    p.evaluated({"round": 20, "test_acc": 0.51234, "test_loss": 1.5})
    lines = buf.getvalue().splitlines()
    assert lines[0] == "fedmpi: [1/3 a] round 0/100  test_acc 0.1  test_loss 2"
    assert lines[1] == "fedmpi: [1/3 a] round 20/100  test_acc 0.5123  test_loss 1.5  5 rounds/s  ETA 16s"
    assert progress.start(total=1, done=0, enabled=False) is None


def test_resume_says_so_and_rates_count_this_start(monkeypatch):
    """A resumed run says where it resumed; its rate and ETA count only the rounds run since,
    not the checkpoint's (which would make the first ETA far too optimistic)."""
    clock = iter([100.0, 110.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    buf = io.StringIO()
    p = progress.start(total=100, done=40, enabled=True, stream=buf)
    p.update(10)
    p.evaluated({"round": 50, "test_acc": 0.5})
    assert buf.getvalue().splitlines() == ["fedmpi: resumed from round 40/100 (checkpoint)",
                                           "fedmpi: round 50/100  test_acc 0.5  1 rounds/s  ETA 50s"]


def _progress_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("fedmpi: round ")]


@pytest.mark.slow
def test_a_batch_log_gets_one_line_per_evaluation(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=6, eval_every=2, runtime={"progress": True}))
    p = fedmpi(["run", cfg, "--out", str(tmp_path / "a.h5")])
    lines = _progress_lines(p.stderr)
    assert [ln.split()[2] for ln in lines] == ["0/6", "2/6", "4/6", "6/6"]
    assert "rounds/s" in lines[1] and "ETA" in lines[1] and "test_acc" in lines[1]
    q = fedmpi(["run", cfg, "--out", str(tmp_path / "b.h5"), "--quiet"])
    assert _progress_lines(q.stderr) == [] and q.stderr == ""


@pytest.mark.slow
@pytest.mark.mpi
def test_only_rank_0_reports(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=4, eval_every=2, runtime={"progress": True}))
    p = fedmpi(["run", cfg, "--out", str(tmp_path / "a.h5")], ranks=2)
    assert len(_progress_lines(p.stderr)) == 3


@pytest.mark.slow
def test_tqdm_bar_on_a_zero_column_terminal(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=6, eval_every=2, runtime={"progress": True}))
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "fedmpi", "run", cfg, "--out", str(tmp_path / "a.h5")], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=slave, env=dict(os.environ, PYTHONPATH=ROOT))
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert "6/6" in text and "round" in text and "fedmpi: round" not in text  # a bar, not lines


@pytest.mark.slow
def test_csv_sidecar_follows_the_result_file_also_after_resume(tmp_path):
    out = tmp_path / "r.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        rounds=9, eval_every=1, runtime={"progress": False, "csv": True, "checkpoint_every": 4}))
    p = fedmpi(["run", cfg, "--out", str(out)], check=False, env=fault_plugin.env("0:6:kill"))
    assert p.returncode == -signal.SIGKILL
    assert len(list(csv.reader(open(tmp_path / "r.csv")))) == 1 + 7  # header + rounds 0..6 as they came
    fedmpi(["run", cfg, "--out", str(out), "--quiet"])  # resumes at round 4: rows 5, 6 are made again
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    with h5py.File(out, "r") as f:
        assert [int(r["round"]) for r in rows] == list(f["metrics/round"][:]) == list(range(10))
        assert np.array_equal([float(r["test_acc"]) for r in rows], f["metrics/test_acc"][:])


def test_tensorboard_needs_its_package(tmp_path, capsys, monkeypatch):
    from fedmpi.results import sidecars

    monkeypatch.setattr(sidecars.importlib.util, "find_spec", lambda name: None)
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=1, runtime={"tensorboard": str(tmp_path / "tb")}))
    assert main(["run", cfg, "--out", str(tmp_path / "r.h5"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runtime.tensorboard: needs the tensorboard package" in err[0]
    assert not os.path.exists(tmp_path / "r.h5")  # refused before a result file was made


def test_tensorboard_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=4, eval_every=2,
                                                              runtime={"progress": False, "tensorboard": str(tb)}))
    out = tmp_path / "runs" / "r.h5"
    assert main(["run", cfg, "--out", str(out), "--quiet"]) == 0
    logdir = [d for d, _, files in os.walk(tb) if any(f.startswith("events.") for f in files)]
    assert len(logdir) == 1 and logdir[0].endswith(os.path.join("runs", "r"))
    acc = EventAccumulator(logdir[0])
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("metrics/test_acc")]
    with h5py.File(out, "r") as f:
        want = list(zip(f["metrics/round"][:], f["metrics/test_acc"][:]))
    assert [s for s, _ in got] == [0, 2, 4] and np.allclose([v for _, v in got], [v for _, v in want])
