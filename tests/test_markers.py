"""Single-process and multi-process tests are told apart by the ``mpi`` marker: a test that starts
mpiexec without it fails, so ``pytest -m "not mpi"`` never starts a second process."""

import pytest
from conftest import mpiexec


def test_mpiexec_outside_a_test_marked_mpi_is_refused():
    with pytest.raises(AssertionError, match="mark it @pytest.mark.mpi"):
        mpiexec(2)


@pytest.mark.mpi
def test_mpiexec_inside_a_test_marked_mpi_is_allowed():
    assert "-n" in mpiexec(2)  # skips where mpiexec is missing


@pytest.mark.slow
def test_the_suite_collects_without_the_optional_extras():
    """Without the extras (tests/without_extras) every test file still collects: tests that need
    one skip with the reason instead of breaking their whole file."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = dict(os.environ, FEDMPI_HIDE="dp_accounting,pandas,scipy,hypothesis,tensorboard,wandb,mlflow",
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests", "without_extras")]))
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "--rootdir", ROOT, os.path.join(ROOT, "tests")], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0 and "None in sys.modules" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]
