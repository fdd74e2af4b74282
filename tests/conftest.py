"""Shared helpers: run the real CLI as a subprocess, optionally under ``mpiexec -n K``.

Hermetic: every test runs in its own temporary folder (its working directory, where a CLI run
with a default output path writes), and the session fails when the suite left files in the
checkout (README: the main job first, then the tests, on one clone).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch
import yaml

from fedmpi.config import _set_dotted

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMNIST = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


_MPI_TESTS: set[str] = set()  # node ids of the tests marked mpi


def pytest_collection_modifyitems(items: list) -> None:
    _MPI_TESTS.update(item.nodeid for item in items if item.get_closest_marker("mpi"))


def mpiexec(n: int) -> list[str]:
    """The mpiexec prefix for n local ranks (Open MPI flags when it is Open MPI); only inside a
    test marked ``mpi``, so that ``-m "not mpi"`` runs exactly the single-process tests."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    if current and current not in _MPI_TESTS:
        raise AssertionError(f"{current} runs mpiexec: mark it @pytest.mark.mpi")
    exe = shutil.which("mpiexec")
    if exe is None:
        pytest.skip("mpiexec not found (install openmpi or mpich)")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    cmd = [exe, "-n", str(n)]
    if "Open MPI" in out or "OpenRTE" in out:
        cmd.insert(1, "--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
    return cmd


def fedmpi(args: list[str], ranks: int = 0, timeout: float = 300, env: dict | None = None,
           check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m fedmpi ARGS`` (under mpiexec when ranks > 0)."""
    cmd = (mpiexec(ranks) if ranks else []) + [sys.executable, "-m", "fedmpi"] + args
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.update(env or {})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)  # in the test's folder
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def cli(args: list[str]) -> subprocess.CompletedProcess:
    """``fedmpi ARGS`` in this process (``fedmpi.cli.main``), its output captured, as ``fedmpi``
    returns it: for commands that end before any training (a refusal, info, table, export), at
    a fraction of a subprocess's start-up (importing torch alone takes ~1.5 s). No plugins (they
    would stay registered; ``$FEDMPI_PLUGINS`` is hidden) and no runs (torch's process-wide
    settings; the thread count a refusal after the world's set-up changed is restored): those
    take ``fedmpi``. Warnings are appended to stderr, as a process would print them.
    The process entry itself (exit codes through ``sys.exit``, signals) is tested in test_cli."""
    from fedmpi.cli import main

    out, err = io.StringIO(), io.StringIO()
    threads, plugins = torch.get_num_threads(), os.environ.pop("FEDMPI_PLUGINS", None)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's defaults for a script, as `python -m fedmpi` has them
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's own exits (--help)
            code = e.code if isinstance(e.code, int) else 1
        finally:  # what a refusal after the world's set-up changed in this process
            torch.set_num_threads(threads)
            if plugins is not None:
                os.environ["FEDMPI_PLUGINS"] = plugins
    # a process would print its warnings on stderr: a one-line check must see them
    text = err.getvalue() + "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
                                    for w in caught)
    return subprocess.CompletedProcess(["fedmpi", *args], code, out.getvalue(), text)


@pytest.fixture(autouse=True)
def _own_folder(tmp_path, monkeypatch) -> None:
    """Each test works in its own temporary folder, never in the checkout, with its own cache folder
    (optimised privacy factors, $FEDMPI_CACHE)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDMPI_CACHE", str(tmp_path / ".fedmpi-cache"))


_CACHES = ("__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache", ".egg-info")


def _checkout_files() -> set[str] | None:
    """Untracked and ignored files of the checkout (caches aside); None outside a git checkout."""
    try:
        p = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    files = {ln[3:] for ln in p.stdout.splitlines() if ln[:2] in ("??", "!!")}
    return {f for f in files if not any(c in f for c in _CACHES)}


def pytest_sessionstart(session) -> None:
    session.config._fedmpi_files_before = _checkout_files()


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the session when the tests left files in the checkout (they must use their own folder)."""
    before = getattr(session.config, "_fedmpi_files_before", None)
    after = _checkout_files() if before is not None else None
    if before is None or after is None:
        return
    left = sorted(after - before)
    if left:
        sys.stderr.write("\nthe tests left files in the checkout (tests must write to their own tmp_path):\n  "
                         + "\n  ".join(left[:20]) + "\n")
        session.exitstatus = 1


def wait_for_rows(path, rows: int, timeout: float = 120) -> None:
    """Poll a result file that a running job writes until it holds ``rows`` evaluations."""
    import time

    import h5py

    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(0.3)
        try:
            with h5py.File(path, "r", locking=False) as f:
                if f["metrics/round"].shape[0] >= rows:
                    return
        except (OSError, KeyError):
            pass
    raise AssertionError(f"{path}: fewer than {rows} evaluations after {timeout} s")


def write_config(path, data: dict) -> str:
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    return str(path)


def synthetic_config(**over) -> dict:
    """A small, fast classification run on the synthetic dataset."""
    cfg = {
        "name": "synth", "seed": 3, "rounds": 6, "eval_every": 2,
        "task": {"dataset": "synthetic", "clients": 12, "model": "logreg",
                 "partition": {"kind": "dirichlet", "alpha": 0.5},
                 "synthetic": {"samples": 1200, "test_samples": 300, "features": 16, "classes": 4}},
        "train": {"local_steps": 3, "batch_size": 8, "lr": 0.1},
        "availability": {"kind": "stationary", "base": {"kind": "uniform", "lo": 0.2, "hi": 0.8}},
        "runtime": {"progress": False},
    }
    for k, v in over.items():
        _set_dotted(cfg, k.replace("__", "."), v)
    return cfg


@pytest.fixture
def fmnist_available() -> None:
    if not os.path.exists(FMNIST):
        pytest.skip("Debian's dataset-fashion-mnist is not installed (.ci/run installs it)")


def assert_resume_identical(cfg, tmp_path, fail_at: int = 5) -> None:
    """Through the runner, in one process: ``cfg`` straight, and ``cfg`` failing at round
    ``fail_at`` (the fault plug-in) then resumed from its last checkpoint, give the same final
    parameters and test-loss rows, bit for bit; the loss must have moved (it trained)."""
    import h5py
    import numpy as np
    from fault_plugin import inject

    from fedmpi.runner import Runner
    from fedmpi.runtime import World

    Runner(cfg, World(), str(tmp_path / "straight.h5"), quiet=True).run()
    with pytest.raises(RuntimeError, match="injected"):
        Runner(cfg, World(), str(tmp_path / "cut.h5"), quiet=True, callbacks=[inject(f"0:{fail_at}:raise")]).run()
    Runner(cfg, World(), str(tmp_path / "cut.h5"), quiet=True, resume=True).run()
    with h5py.File(tmp_path / "straight.h5") as a, h5py.File(tmp_path / "cut.h5") as b:
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
        assert np.array_equal(a["metrics/test_loss"][:], b["metrics/test_loss"][:])
        assert not np.array_equal(a["metrics/test_loss"][0], a["metrics/test_loss"][-1])
