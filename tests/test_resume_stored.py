"""Runs stored by an earlier fedmpi still resume and extend, bit for bit (#43 item 4).

tests/data/resume_main/CASE/ holds a run interrupted after round 3 of 6 (interrupted.h5 and its
checkpoint) and the same config completed with rounds 4 (short.h5, its final state kept), both
written by main at 4880dc6 (tests/data/resume_main/make.py), when the resume digest was a
hand-kept list with "old digests stay valid" cases; each case is one of those cases.
tests/data/resume_f400d91/CASE/ holds the same for the cases added since (an adapter, local DP,
banded MF with its own band and another accountant, an asynchronous server on the clock), written
by main at f400d91, the last main with the hand-kept list. Continuing either with the stored config
must give the bits of a straight run of 6 rounds today.
"""

from __future__ import annotations

import os
import shutil

import h5py
import numpy as np
import pytest

from conftest import ROOT
from fedmpi import config
from fedmpi.runner import Runner
from fedmpi.runtime import World

STORED = [os.path.join(ROOT, "tests", "data", folder) for folder in ("resume_main", "resume_f400d91")]
CASES = sorted(os.path.join(os.path.basename(data), d) for data in STORED for d in os.listdir(data)
               if os.path.isdir(os.path.join(data, d)))
VARYING = ("wall_time", "peak_rss_mb")  # measured, not computed


def _arrays(path: str) -> dict[str, np.ndarray]:
    """Every dataset of a result file but the measured metrics."""
    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset)
                     and name.split("/")[-1] not in VARYING else None)
        assert f.attrs["status"] == "completed" and f.attrs["rounds_done"] == 6
    return out


def _same(a: str, b: str, added: set[str] = frozenset()) -> None:
    """``b`` holds ``a``'s bits; ``added``: datasets the stored file did not have (a series a later
    fedmpi records), logged from the resume on: NaN in the rows before it."""
    x, y = _arrays(a), _arrays(b)
    assert sorted(x) == sorted(y)
    for name in x:
        before = np.isnan(y[name]) if name in added and y[name].dtype.kind == "f" else None
        if before is not None and before.any():
            assert not before[np.argmin(before):].any(), name  # a prefix of NaN rows
            np.testing.assert_array_equal(x[name][~before], y[name][~before], err_msg=name)
        else:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)


def _names(path: str) -> set[str]:
    with h5py.File(path, "r") as f:
        names: list[str] = []
        f.visit(names.append)
    return set(names)


def test_every_case_is_stored():
    assert CASES == [f"resume_f400d91/{c}" for c in ("banded_mf", "fedbuff", "local_gaussian", "lora")] + [
        f"resume_main/{c}" for c in ("clock", "dgd", "fedavg", "fedswe", "global_lr", "local_test", "lognormal",
                                     "privacy")]


def _times(path: str) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f["metrics/wall_time"][:]


@pytest.mark.parametrize("case", [c if c.endswith(("/fedavg", "/lora")) else pytest.param(c, marks=pytest.mark.slow)
                                  for c in CASES])
def test_a_run_stored_by_an_earlier_fedmpi_resumes_and_extends_bit_for_bit(tmp_path, case):
    work = tmp_path / case
    shutil.copytree(os.path.join(ROOT, "tests", "data", case), work)
    cfg = config.load(str(work / "config.yaml"))
    straight = str(tmp_path / "straight.h5")
    assert Runner(cfg, World(), straight, quiet=True).run() == 0
    for stored in ("interrupted.h5", "short.h5"):  # resumed after round 3; extended from 4 to 6 rounds
        path = str(work / stored)
        before, had = _times(path), _names(path)
        assert Runner(cfg, World(), path, quiet=True).run() == 0, stored
        _same(straight, path, _names(straight) - had)
        # continued, not started afresh: the rows written before keep their measured times
        np.testing.assert_array_equal(_times(path)[:len(before)], before)
