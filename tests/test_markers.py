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
