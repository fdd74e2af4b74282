"""Collectives of the process world: the MPI transport of host tensors (``runtime.collectives``)
gives what torch.distributed gives, a failed or stopped peer ends a rank's wait, and the
transport never changes a bit of a run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from conftest import ROOT, fedmpi, mpiexec, synthetic_config, write_config

SCRIPT = os.path.join(ROOT, "tests", "mpi_scripts", "collectives_check.py")


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("transport", ["mpi", "torch"])
def test_every_collective_on_both_transports(transport):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(mpiexec(2) + [sys.executable, SCRIPT, transport], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 0 and p.stdout.count("OK") == 2, p.stdout + p.stderr


def _final(path: str) -> np.ndarray:
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == "completed"
        return f["final/params"][:]


@pytest.mark.slow
@pytest.mark.mpi
def test_the_transport_changes_no_bit(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=8))
    one = tmp_path / "one.h5"
    fedmpi(["run", cfg, "--out", str(one), "--quiet"])
    for transport in ("mpi", "torch"):
        out = tmp_path / f"{transport}.h5"
        fedmpi(["run", cfg, "--out", str(out), "--quiet", "--set", f"runtime.collectives={transport}"], ranks=2)
        assert np.array_equal(_final(str(one)), _final(str(out))), transport


@pytest.mark.slow
@pytest.mark.mpi
def test_a_failed_rank_ends_its_peers_wait_at_once(tmp_path):
    """Rank 1 raises at round 3: rank 0, waiting in the round's first MPI collective, hears of it
    through the failure notice (not after runtime.timeout_s) and marks the file failed."""
    from fault_plugin import env

    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=20, runtime__timeout_s=120))
    out = tmp_path / "r.h5"
    start = time.monotonic()
    proc = fedmpi(["run", cfg, "--out", str(out), "--quiet"], ranks=2, check=False, timeout=100,
                  env=env("1:3:raise"))
    assert proc.returncode != 0 and time.monotonic() - start < 60, proc.stderr
    assert "rank 1 failed" in proc.stderr and "injected fault at round 3" in proc.stderr
    assert "rank 0: lost contact with another rank (ConnectionError)" in proc.stderr, proc.stderr
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "failed"


@pytest.mark.slow
def test_unknown_transport_is_exit_2(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(runtime__collectives="shm"))
    p = fedmpi(["run", cfg, "--out", str(tmp_path / "r.h5")], check=False)
    assert p.returncode == 2 and "runtime.collectives" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
@pytest.mark.mpi
def test_a_killed_rank_is_seen_by_its_peer_before_the_launcher_ends_the_job(tmp_path):
    """Rank 1 dies of SIGKILL at round 3. MPI says nothing (its launcher kills the job a moment
    later); rank 0, waiting in the round's first collective, sees the dead pid on its node and
    marks the file failed first (it stayed ``running`` before this check). Whether the pid check or
    the watch (the dead rank's heartbeat connection closed) sees it first, it is reported once as
    the watch's verdict: the lost rank, its node and what the checkpoint keeps."""
    from fault_plugin import env

    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=20, runtime__timeout_s=120))
    out = tmp_path / "r.h5"
    proc = fedmpi(["run", cfg, "--out", str(out), "--quiet"], ranks=2, check=False, timeout=100,
                  env=env("1:3:kill"))
    assert proc.returncode != 0
    assert "fedmpi: lost rank 1 (node " in proc.stderr, proc.stderr
    assert "lost contact with another rank" not in proc.stderr, proc.stderr
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "failed"
