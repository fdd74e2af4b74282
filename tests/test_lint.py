"""ruff, with the rules in pyproject.toml, finds nothing in the tree (a dev dependency)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import ROOT


def test_ruff_finds_nothing():
    exe = shutil.which("ruff")
    cmd = [exe] if exe else [sys.executable, "-m", "ruff"]
    if not exe and subprocess.run(cmd + ["--version"], capture_output=True).returncode != 0:
        pytest.skip("ruff is not installed (pip install -e .[dev])")
    p = subprocess.run(cmd + ["check", "--no-cache", "."], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
