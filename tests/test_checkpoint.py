"""Checkpoint/resume: killed or preempted runs continue to the same numbers, on any rank count."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from conftest import wait_for_rows, ROOT, fedmpi, synthetic_config, write_config
from fedmpi import checkpoint
from fedmpi.errors import InputError
from fedmpi.runtime import World


def ck_config(tmp_path, rounds=30, **over):
    return write_config(tmp_path / "c.yaml", synthetic_config(
        rounds=rounds, eval_every=3, runtime={"checkpoint_every": 4, "progress": False, "log_availability": True},
        **over))


def same(a: str, b: str) -> None:
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        for k in fa["metrics"]:
            if k not in ("wall_time", "peak_rss_mb"):
                assert np.array_equal(fa["metrics"][k][:], fb["metrics"][k][:]), k
        assert np.array_equal(fa["final/params"][:], fb["final/params"][:])
        assert np.array_equal(fa["availability/mask"][:], fb["availability/mask"][:])
        assert fb.attrs["status"] == "completed"


def test_kill9_then_resume_is_bit_identical(tmp_path):
    cfg = ck_config(tmp_path)
    full, cut = str(tmp_path / "full.h5"), str(tmp_path / "cut.h5")
    fedmpi(["run", cfg, "--out", full, "--quiet"])
    # a random round right after a checkpoint that follows the last evaluation (checkpoints every
    # 4 rounds, evaluations every 3): rows written since the last flush must not be lost
    kill_at = int(os.environ.get("FEDMPI_TEST_KILL_AT", np.random.default_rng().choice([8, 16, 20, 28])))
    p = fedmpi(["run", cfg, "--out", cut, "--quiet"], check=False, env={"FEDMPI_TEST_FAULT": f"0:{kill_at}:kill"})
    assert p.returncode == -signal.SIGKILL
    with h5py.File(cut, "r") as f:
        assert f.attrs["status"] == "running"
    man = json.load(open(cut + ".ckpt/manifest.json"))
    assert man["round"] == kill_at // 4 * 4
    fedmpi(["run", cfg, "--out", cut, "--quiet"])  # the same command resumes by itself
    same(full, cut)
    assert not os.path.exists(cut + ".ckpt")  # a completed run needs no checkpoint


@pytest.mark.mpi
def test_sigterm_exit3_then_resume_on_two_ranks(tmp_path):
    cfg = ck_config(tmp_path, rounds=3000)
    full, cut = str(tmp_path / "full.h5"), str(tmp_path / "cut.h5")
    proc = subprocess.Popen([sys.executable, "-m", "fedmpi", "run", cfg, "--out", cut, "--quiet"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_rows(cut, 3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert "interrupted: signal SIGTERM" in err and "Traceback" not in err
    with h5py.File(cut, "r") as f:
        assert f.attrs["status"] == "interrupted"
        stopped = int(f.attrs["rounds_done"])
    # finish a shorter run: the interrupted one continues to the same numbers on 2 ranks
    rounds = stopped + 7
    fedmpi(["run", cfg, "--out", full, "--quiet", "--set", f"rounds={rounds}"])
    fedmpi(["run", cfg, "--out", cut, "--quiet", "--resume", "--set", f"rounds={rounds}"], ranks=2)
    same(full, cut)
    with h5py.File(cut, "r") as f:
        assert f.attrs["world_size"] == 2


def test_resume_errors(tmp_path):
    cfg = ck_config(tmp_path, rounds=9)
    out = str(tmp_path / "r.h5")
    p = fedmpi(["run", cfg, "--out", out, "--resume"], check=False)
    assert p.returncode == 2 and "--resume: no checkpoint at" in p.stderr
    fedmpi(["run", cfg, "--out", out, "--quiet", "--set", "rounds=9"],
           check=False, env={"FEDMPI_TEST_FAULT": "0:6:kill"})
    p = fedmpi(["run", cfg, "--out", out, "--set", "train.lr=0.3"], check=False)  # the result file refuses first
    assert p.returncode == 2 and "run of another experiment" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    os.rename(out, out + ".keep")  # without the result file, the checkpoint itself refuses
    p = fedmpi(["run", cfg, "--out", out, "--set", "train.lr=0.3"], check=False)
    assert p.returncode == 2 and "different config" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not os.path.exists(out)  # and no empty file is left behind
    os.rename(out + ".keep", out)
    with open(out + ".ckpt/manifest.json", "w") as fh:
        fh.write("{not json")
    p = fedmpi(["run", cfg, "--out", out], check=False)
    assert p.returncode == 2 and "corrupt checkpoint manifest" in p.stderr


def test_resharding_client_rows(tmp_path):
    """A checkpoint written by 1 rank loads as the right slices on 3 ranks (and the union/ entries everywhere)."""
    folder = str(tmp_path / "ck")
    m = 10
    rows = torch.arange(m * 2, dtype=torch.float32).view(m, 2)
    state = {"client/table": rows, "union/version/3": torch.ones(2), "x": torch.zeros(2)}
    checkpoint.save(World(), folder, 12, "abc", m, state)
    got = []
    for r in range(3):
        rounds, st = checkpoint.load(World(rank=r, size=3), folder, "abc", m)
        lo, hi = World(rank=r, size=3).shard(m)
        assert rounds == 12 and torch.equal(st["client/table"], rows[lo:hi])
        assert torch.equal(st["union/version/3"], torch.ones(2)) and torch.equal(st["x"], torch.zeros(2))
        got.append(st["client/table"])
    assert torch.equal(torch.cat(got), rows)
    with pytest.raises(InputError, match="different config"):
        checkpoint.load(World(), folder, "other", m)
    shard = os.path.join(folder, "round-00000012", "shard-00000.pt")
    with open(shard, "r+b") as fh:
        fh.seek(10)
        fh.write(b"XXXX")
    with pytest.raises(InputError, match="missing or corrupt"):
        checkpoint.load(World(), folder, "abc", m)
