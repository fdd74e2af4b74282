"""Determinism matrix: every algorithm family gives the same /final/params on 1, 2 and 3 ranks,
after an interruption + resume on another number of ranks, and trained in packed groups."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, mpiexec

SCRIPT = os.path.join(ROOT, "tests", "mpi_scripts", "matrix.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
from matrix import CASES  # noqa: E402


def drive(out: str, mode: str, ranks: int = 0) -> None:
    cmd = (mpiexec(ranks) if ranks else []) + [sys.executable, SCRIPT, out, mode]
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.mpi
def test_every_family_is_rank_count_invariant(tmp_path):
    out = str(tmp_path)
    drive(out, "full")
    drive(out, "interrupt")  # 1 rank, stopped by SIGUSR1 after round 2 with a checkpoint
    drive(out, "full", ranks=3)
    drive(out, "resume", ranks=2)  # the 1-rank checkpoints continue on 2 ranks
    drive(out, "packed", ranks=2)  # every family that packs, in packed groups (fedmpi sweep --pack), on 2 ranks
    ref = np.load(os.path.join(out, "full-1.npz"))
    assert len(ref.files) == len(CASES)
    for other in ("full-3.npz", "resumed-2.npz", "packed-2.npz"):
        got = np.load(os.path.join(out, other))
        if other.startswith("packed"):  # all but the decentralized family
            assert len(got.files) == len(CASES) - 2 and "fedavg_active" in got.files
        else:
            assert sorted(got.files) == sorted(ref.files), other
        for name in got.files:
            assert np.array_equal(ref[name], got[name]), f"{name} differs in {other}"
