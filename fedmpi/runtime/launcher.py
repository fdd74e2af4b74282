"""What the launcher told this process: its rank and the world size, from the environment.

Torch-free, so the command line can ask before anything heavy is imported. Variables of Open
MPI, MPICH / Intel MPI (PMI), PMIx and SLURM, in that order of preference.
"""

from __future__ import annotations

import os

RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS")


def _first(names: tuple[str, ...], default: int) -> int:
    for var in names:
        v = os.environ.get(var)
        if v and v.isdigit():
            return int(v)
    return default


def launched_rank() -> int:
    """This process's rank announced by the launcher (0 when none)."""
    return _first(RANK_VARS, 0)


def launched_size() -> int:
    """World size announced by the launcher's environment (1 when none)."""
    return _first(SIZE_VARS, 1)
