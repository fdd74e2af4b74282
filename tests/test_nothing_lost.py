"""Issue 24, "nothing lost, nothing crashes": each case as a user meets it, through the CLI in
its own process, on real files. A command never replaces a file it did not make for this run
(unless named with --overwrite), and every failure is one line with a documented exit code."""

from __future__ import annotations

import hashlib
import os

import h5py
import numpy as np
import pytest  # noqa: F401  (used by the tests below)

from conftest import fedmpi, synthetic_config, write_config
from fake_results import fake_result


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _one_line_error(proc, code: int = 2, *words: str) -> str:
    """The process ended with ``code`` and one stderr line (no traceback) holding ``words``."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _fake(tmp_path, name="a.h5", **over) -> str:
    return fake_result(tmp_path / name, {"round": [0, 10], "test_acc": [0.1, 0.5]}, **over)


# ----------------------------------------------------------------------------- 2: runtime.csv

def test_runtime_csv_never_replaces_a_file_it_did_not_write(tmp_path):
    trace = tmp_path / "avail.csv"
    trace.write_text("0 1 2\n3 4\n")
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        rounds=2, availability={"kind": "trace", "trace": str(trace)}, runtime__csv=True))
    before = _digest(trace)
    proc = fedmpi(["run", cfg, "--out", str(tmp_path / "avail.h5"), "--quiet"], check=False)
    _one_line_error(proc, 2, "runtime.csv", str(trace))
    assert _digest(trace) == before and not os.path.exists(tmp_path / "avail.h5")
    # its own metric CSV is rewritten when the run is overwritten
    fedmpi(["run", cfg, "--out", str(tmp_path / "r.h5"), "--quiet", "--set", "availability.kind=always"])
    fedmpi(["run", cfg, "--out", str(tmp_path / "r.h5"), "--quiet", "--set", "availability.kind=always",
            "--overwrite"])
    assert open(tmp_path / "r.csv").readline().startswith("round,")


# ----------------------------------------------------------------------------- 3: export

def test_export_never_replaces_a_result_an_input_or_an_existing_csv(tmp_path):
    a, b = _fake(tmp_path, "a.h5"), _fake(tmp_path, "b.h5", seed=4)
    kept = {p: _digest(p) for p in (a, b)}
    _one_line_error(fedmpi(["export", a, "--csv", "--out", b], check=False), 2, "result file")
    os.symlink(a, tmp_path / "link.csv")
    _one_line_error(fedmpi(["export", a, "--out", str(tmp_path / "link.csv")], check=False), 2, "input")
    _one_line_error(fedmpi(["export", a, "--out", b, "--overwrite"], check=False), 2, "result file")
    assert {p: _digest(p) for p in (a, b)} == kept
    (tmp_path / "a.csv").write_text("my notes\n")
    _one_line_error(fedmpi(["export", a, b], check=False), 2, "a.csv", "--overwrite")
    assert (tmp_path / "a.csv").read_text() == "my notes\n" and not (tmp_path / "b.csv").exists()
    fedmpi(["export", a, b, "--overwrite"])
    assert (tmp_path / "a.csv").read_text().startswith("round,")
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
