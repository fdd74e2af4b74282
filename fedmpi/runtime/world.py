"""The process world: MPI ranks, torch.distributed, one device per local rank, sharding.

``World.create(cfg)`` works the same as a single process, under ``mpiexec`` (Open MPI,
MPICH) and under ``srun``:

- mpi4py is imported only when a launcher started us with more than one rank (or
  ``FEDMPI_MPI=1``), so a plain ``fedmpi run`` needs no MPI at all;
- torch.distributed is initialised from the MPI world without user variables: rank 0
  picks a free TCP port, and host:port travels by ``MPI.bcast`` (``MASTER_ADDR`` /
  ``MASTER_PORT`` win when set);
- backend ``nccl`` when CUDA is used, else ``gloo``; ``torch.cuda.set_device`` happens
  before the first collective; every collective has ``runtime.timeout_s``, so a dead
  rank ends the job instead of hanging it.

Tensors move with torch.distributed; mpi4py carries only small control data.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..errors import InputError

from .launcher import launched_size


def keep_freed_memory() -> bool:
    """Let glibc keep freed heap memory for reuse; True when applied.

    An iteration allocates and frees tensors of tens of MB (minibatches, gradients, the mixing
    term). With glibc's defaults such frees go back to the OS and the next iteration faults the
    pages in again: with 1000 SVM clients that cost up to 40% of an iteration
    (benchmarks/decentralized.py). Blocks up to 32 MB are now served from the heap, and each
    malloc arena keeps up to 1 GB of freed memory (torch's worker threads may have arenas of
    their own); the resident size stays near its peak, which ``peak_rss_mb`` reports anyway.
    No-op without glibc, or with ``FEDMPI_MALLOC=default``. False also when glibc refused
    one of the two settings (the other may still apply).
    """
    if os.environ.get("FEDMPI_MALLOC") == "default":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
        mmap_ok = libc.mallopt(m_mmap_threshold, 32 << 20)
        trim_ok = libc.mallopt(m_trim_threshold, 1 << 30)
        return bool(mmap_ok and trim_ok)
    except (OSError, AttributeError):  # not glibc
        return False


def _want_mpi() -> bool:
    flag = os.environ.get("FEDMPI_MPI")
    if flag is not None:
        return flag not in ("0", "", "false", "no")
    return launched_size() > 1


@dataclass
class World:
    """Rank, size, device and the two communication layers of this process."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    device: torch.device = torch.device("cpu")
    backend: str = "none"
    comm: Any = None  # mpi4py communicator, or None for a single process without MPI

    # ------------------------------------------------------------------ set-up
    @classmethod
    def create(cls, device: str = "auto", backend: str = "auto", timeout_s: float = 300.0,
               threads: int | None = None) -> "World":
        comm = None
        rank, size, local_rank, local_size = 0, 1, 0, 1
        keep_freed_memory()
        if _want_mpi():
            try:
                from mpi4py import MPI
            except ImportError:
                raise InputError("runtime: launched with several ranks but mpi4py is not installed "
                                 "(pip install 'fedmpi[mpi]')") from None
            comm = MPI.COMM_WORLD
            rank, size = comm.Get_rank(), comm.Get_size()
            node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
            local_rank, local_size = node.Get_rank(), node.Get_size()
            node.Free()
        use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        if device == "cuda" and not torch.cuda.is_available():
            raise InputError("runtime.device: cuda requested but no CUDA device is available")
        if use_cuda:
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
            dev = torch.device("cuda", torch.cuda.current_device())
        else:
            dev = torch.device("cpu")
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            torch.set_num_threads(threads or max(1, cores // local_size))
        if backend == "auto":
            backend = "nccl" if use_cuda else "gloo"
        if backend == "nccl" and not use_cuda:
            raise InputError("runtime.backend: nccl needs CUDA devices; use gloo (or auto) on CPU")
        world = cls(rank, size, local_rank, local_size, dev, backend if size > 1 else "none", comm)
        if size > 1:
            world._init_torch_dist(backend, timeout_s)
        return world

    def _init_torch_dist(self, backend: str, timeout_s: float) -> None:
        addr = os.environ.get("MASTER_ADDR")
        port = os.environ.get("MASTER_PORT")
        if not (addr and port):
            hostnames = self.comm.allgather(socket.gethostname())
            endpoint = None
            if self.rank == 0:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("", 0))
                    free_port = str(s.getsockname()[1])
                single_node = len(set(hostnames)) == 1
                host = "127.0.0.1" if single_node else socket.gethostbyname(socket.gethostname())
                endpoint = (host, free_port)
            addr, port = self.comm.bcast(endpoint, root=0)
        kwargs = {}
        if backend == "nccl":
            kwargs["device_id"] = self.device
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                world_size=self.size, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)

    def close(self) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------------ sharding
    def shard(self, m: int, rank: int | None = None) -> tuple[int, int]:
        """Contiguous block [lo, hi) of the m clients owned by ``rank`` (default: this rank)."""
        r = self.rank if rank is None else rank
        return (m * r) // self.size, (m * (r + 1)) // self.size

    def owner(self, ids: np.ndarray, m: int) -> np.ndarray:
        """Rank owning each client id (inverse of ``shard``)."""
        ids = np.asarray(ids, dtype=np.int64)
        r = (ids * self.size) // m
        # integer division boundaries can be off by one; fix against the exact block starts
        lo = (m * r) // self.size
        r = np.where(ids < lo, r - 1, r)
        hi = (m * (r + 1)) // self.size
        return np.where(ids >= hi, r + 1, r)

    @property
    def is_server(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ collectives
    def sum_to_server_(self, t: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks into rank 0 (other ranks' buffers are unspecified after)."""
        if self.size > 1:
            dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
        return t

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        if self.size > 1:
            dist.broadcast(t, src=src)
        return t

    def allreduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def allreduce_max_(self, t: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def max_float(self, x: float) -> float:
        """Maximum of a float over ranks (control data: via torch to keep one channel)."""
        if self.size == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def allgather_obj(self, obj: Any) -> list:
        return [obj] if self.comm is None else self.comm.allgather(obj)

    def barrier(self) -> None:
        if self.comm is not None:
            self.comm.Barrier()
