"""The process world: MPI ranks, torch.distributed, one device per local rank, sharding.

``World.create(device, backend, timeout_s, threads, tf32)`` (the ``runtime`` keys) works the
same as a single process, under ``mpiexec`` (Open MPI, MPICH) and under ``srun``:

- mpi4py is imported only when a launcher started us with more than one rank (or
  ``FEDMPI_MPI=1``), so a plain ``fedmpi run`` needs no MPI at all;
- torch.distributed is initialised from the MPI world without user variables: rank 0
  picks a free TCP port, and host:port travels by ``MPI.bcast`` (``MASTER_ADDR`` /
  ``MASTER_PORT`` win when set);
- local rank r takes GPU r mod (GPUs it sees); ``choose_backend`` settles the backend from
  the requested one and the ranks and GPUs per node (NCCL when every rank has a GPU of its
  own, gloo with tensors staged through host memory when ranks share a GPU);
  ``torch.cuda.set_device`` happens before the first collective; every collective has
  ``runtime.timeout_s``, so a dead rank ends the job instead of hanging it;
- with several ranks every rank beats a heartbeat to the watch (``watch.py``), so a rank lost
  with its process or node (on another node: no pid to look at, maybe no reset either) ends a
  polled collective within ``runtime.lost_after_s`` with ``RankLost`` naming it and its node.

Tensors move only through the methods below (collectives, ``send_recv_``, ``gather_to_server``).
Collectives on tensors in host memory (CPU runs, and CUDA tensors staged through the host) go
through MPI (``runtime.collectives: mpi``, the default): non-blocking mpi4py collectives on the
tensors' own memory, polled until done, so that ``runtime.timeout_s``, a failed peer and a dead
one end them as they end a torch.distributed one. Why: on one node a gloo collective of a model costs 0.1-0.6 ms of TCP
loopback and thread hand-offs, an MPI one 3-20 us through shared memory, and a round has four
(benchmarks/RESULTS.md). CUDA tensors with NCCL, and the decentralized mode's point-to-point
exchanges, use torch.distributed. Every sum that crosses ranks is exact (``engine.reduce``
pre-rounds), so the transport never changes a bit.
"""

from __future__ import annotations

import collections
import ctypes
import datetime
import os
import pickle
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Sequence

import numpy as np
import psutil
import torch
import torch.distributed as dist

from ..errors import InputError, RankLost
from ..schema import opt
from .launcher import (agree_on_error, announced_size, check_world_size, local_rank_hint, mpi_module, node_name,
                       wants_mpi)
from .watch import BEAT_S, Heartbeat, Hub, advertised_host


@dataclass
class WorldParams:
    """The ``runtime`` keys of the process world (``World.create`` takes them)."""

    backend: Literal["auto", "nccl", "gloo"] = opt(
        "auto", "torch.distributed backend; auto = nccl when every rank has its own GPU, else gloo")
    device: Literal["auto", "cpu", "cuda"] = opt("auto", "auto = CUDA when available (rank r on GPU r mod GPUs)")
    threads: Optional[int] = opt(None, "torch CPU threads per rank; null = cores / local ranks", ge=1, le=1024)
    tf32: bool = opt(False, "let CUDA matmuls and convolutions round inputs to TF32 (faster on Ampere and later, "
                            "~1e-3 relative error); false = full float32, as on CPU")
    timeout_s: float = opt(300.0, "collective timeout: a dead rank ends the job after this", gt=0)
    lost_after_s: float = opt(
        30.0, "a rank not heard from for this long (every rank beats a heartbeat each second from a thread of "
              "its own) is lost, as is one whose connection closed: the run ends failed, resumable (exit 5; "
              "docs/SLURM.md)", ge=3)
    collectives: Literal["mpi", "torch"] = opt(
        "mpi", "transport of collectives on tensors in host memory: mpi (mpi4py, shared memory on a node), "
        "torch (torch.distributed gloo). CUDA tensors with NCCL and point-to-point exchanges always use "
        "torch.distributed")


def set_cuda_math(tf32: bool) -> None:
    """How CUDA computes in this process: deterministic cuDNN algorithms (torch's default may
    pick convolution backward kernels that sum with atomics, whose bits vary run to run), and
    TF32 (10-bit mantissa inputs) for float32 matmuls and convolutions, or full float32.
    torch's default is TF32 for convolutions only, which puts CUDA runs ~1e-3 away from CPU
    runs and the batched engine ~1e-3 away from the sequential one; fedmpi's default is off."""
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9
        mode = "tf32" if tf32 else "ieee"
        torch.backends.cuda.matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
    else:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


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


def _test_staged() -> bool:
    """Test hook: FEDMPI_TEST_STAGED=1 makes a multi-rank CPU world stage through host copies,
    so the staged path runs (and is compared bitwise) on machines without a GPU."""
    return os.environ.get("FEDMPI_TEST_STAGED") == "1"


@dataclass(frozen=True)
class Backend:
    """What a world runs on: device type, torch.distributed backend, host staging."""

    device: str         # "cuda" or "cpu"
    name: str           # "nccl" or "gloo"
    staged: bool        # tensors cross ranks through host copies (gloo cannot send CUDA tensors)
    notice: str = ""    # one line rank 0 prints when the choice is not the obvious one


def choose_backend(backend: str, device: str, ranks_per_node: int, gpus_per_node: int) -> Backend:
    """The device and backend for ``runtime.backend`` / ``runtime.device`` on nodes running
    ``ranks_per_node`` ranks bound to ``gpus_per_node`` distinct GPUs (0: none visible).

    Every rank of a job must get the same answer: pass the counts of the node that decides
    (``deciding_node``). Raises InputError for a request that cannot work.

    Why gloo with host staging when ranks share a GPU: NCCL refuses a communicator with two
    ranks on one GPU ("duplicate GPU"). The alternative, NCCL among one GPU-owning rank per GPU
    with the other ranks forwarding through it, needs a second communicator and a second hop
    for every tensor. Gloo takes CUDA tensors only in broadcast and all_reduce (not in send,
    recv, reduce or gather, per the torch.distributed backend table), so every tensor is copied
    to host memory, communicated by gloo and copied back: one code path for every operation,
    and the copies are exact, so results keep their bits. What it costs: a device-host round
    trip per communication, a few model-sized tensors per round (not yet measured on a GPU).
    """
    if device == "cuda" and gpus_per_node == 0:
        raise InputError("runtime.device: cuda requested but no CUDA device is available")
    use_cuda = device == "cuda" or (device == "auto" and gpus_per_node > 0)
    if not use_cuda:
        if backend == "nccl":
            raise InputError("runtime.backend: nccl needs CUDA devices; use gloo (or auto) on CPU")
        return Backend("cpu", "gloo", False)
    if ranks_per_node <= gpus_per_node:
        if backend == "gloo":  # asked for: works, through host memory
            return Backend("cuda", "gloo", True)
        return Backend("cuda", "nccl", False)
    shared = f"{ranks_per_node} ranks share {gpus_per_node} GPU{'s' if gpus_per_node > 1 else ''} on a node"
    if backend == "nccl":
        raise InputError(f"runtime.backend: nccl needs one GPU per rank, but {shared}; use auto or gloo, "
                         f"or launch at most {gpus_per_node} rank{'s' if gpus_per_node > 1 else ''} per node")
    return Backend("cuda", "gloo", True, f"notice: {shared}: using gloo with tensors staged through host "
                                         f"memory (NCCL needs one GPU per rank); this emulates more ranks but "
                                         f"is slower than one rank per GPU (docs/GPUS.md)")


def deciding_node(nodes: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The (ranks, GPUs) of the node that decides the backend for all: one without GPUs, else
    one with more ranks than GPUs, else the first."""
    for bad in (lambda r, g: g == 0, lambda r, g: r > g):
        for r, g in nodes:
            if bad(r, g):
                return r, g
    return nodes[0]


def _gpu_identity(local_rank: int) -> str:
    """Which physical GPU local rank ``local_rank`` binds to (two ranks may see it by other indices)."""
    index = local_rank % torch.cuda.device_count()
    try:
        return str(torch.cuda.get_device_properties(index).uuid)
    except (AttributeError, RuntimeError):  # no uuid in this torch: visible-set and index
        return f"{os.environ.get('CUDA_VISIBLE_DEVICES', '*')}/{index}"


def _span(ranks: list[int]) -> str:
    """"0-3" for consecutive ranks, else "0,2"."""
    consecutive = ranks == list(range(ranks[0], ranks[-1] + 1))
    return f"{ranks[0]}-{ranks[-1]}" if consecutive and len(ranks) > 2 else ",".join(map(str, ranks))


_SPIN_S = 0.005  # longest spin of a waiting rank before it naps between polls


def _completes(request: Any, grace_s: float = 0.05) -> bool:
    """Whether ``request`` completes within ``grace_s`` of polling: a peer that failed or exited
    just after its part of this collective (its data is here) must not fail it."""
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        if request.Test():
            return True
    return False


def _crowded() -> bool:
    """More runnable tasks on this machine than cores (``/proc/loadavg``'s running count, which
    includes the caller): a spinning rank would take a core that another task needs."""
    try:
        with open("/proc/loadavg", "rb") as fh:
            running = int(fh.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return True  # no /proc: never spin long
    return running > (os.cpu_count() or 1)


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
    staged: bool = False  # tensors cross ranks through host copies (gloo + CUDA)
    ranks_on_device: int = 1  # ranks of this node sharing this rank's GPU (1 on CPU)
    mpi_collectives: bool = False  # host-memory collectives through MPI (``runtime.collectives``)
    timeout_s: float = 300.0  # runtime.timeout_s: how long a polled MPI collective waits
    _notices: Any = field(default=None, repr=False, compare=False)  # communicator of "I failed" notices
    _node_peers: tuple = field(default=(), repr=False, compare=False)  # (rank, pid) of the other ranks here
    nodes: tuple = ()  # the node of each rank, by rank (``launcher.node_name``)
    _watch: Optional[Heartbeat] = field(default=None, repr=False, compare=False)  # this rank's heartbeat
    _hub: Optional[Hub] = field(default=None, repr=False, compare=False)  # rank 0's hub, without fedmpi-launch's
    # the last tensors handed to torch.distributed, held until ``close`` (see ``_hold``)
    _held: collections.deque = field(default_factory=lambda: collections.deque(maxlen=4), repr=False,
                                   compare=False)

    # ------------------------------------------------------------------ set-up
    @classmethod
    def create(cls, device: str = "auto", backend: str = "auto", timeout_s: float = 300.0,
               threads: int | None = None, tf32: bool = False, collectives: str = "mpi",
               lost_after_s: float = 30.0) -> "World":
        """This process's world. Collective over the MPI job (mpi4py only, before any torch
        collective); raises InputError, on every rank alike, for a device/backend that cannot work.
        On CUDA it sets deterministic cuDNN and the float32 precision (``set_cuda_math``).

        Nodes: which ranks share a node comes from the launcher (``SLURMD_NODENAME``, else the
        host name) within MPI's shared-memory groups (a machine), so two Slurm nodes on one
        machine are two nodes; a rank's local rank is its place among its node's ranks. With
        several ranks every rank beats a heartbeat to the watch (``runtime.watch``)."""
        comm = None
        rank, size, local_rank, local_size = 0, 1, 0, 1
        keep_freed_memory()
        looks_for_gpu = device != "cpu" and torch.cuda.is_available()
        gpu_of = _gpu_identity if looks_for_gpu else (lambda r: None)
        node_gpus = [gpu_of(0)]  # the GPU each rank of this node binds to, by local rank
        peers: tuple = ()
        node_names: tuple = (node_name(),)
        all_local = True
        if wants_mpi():
            announced = announced_size()  # before MPI starts (a singleton sets variables of its own)
            MPI = mpi_module()  # InputError when mpi4py or an MPI library is missing
            comm = MPI.COMM_WORLD
            rank, size = comm.Get_rank(), comm.Get_size()
            check_world_size(size, announced)
            node_names = tuple(comm.allgather(node_names[0]))
            machine = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
            all_local = machine.Get_size() == size
            names = sorted(set(node_names))
            node = machine.Split(color=names.index(node_names[rank]), key=local_rank_hint(rank))
            machine.Free()
            local_rank, local_size = node.Get_rank(), node.Get_size()
            node_gpus = node.allgather(gpu_of(local_rank))
            peers = tuple(p for p in node.allgather((rank, os.getpid())) if p[0] != rank)
            peers = peers if os.path.isdir("/proc/self") else ()  # checked through /proc (Linux)
            node.Free()
        n_gpus = 0 if None in node_gpus else len(set(node_gpus))
        nodes = comm.allgather((local_size, n_gpus)) if comm is not None else [(local_size, n_gpus)]
        choice = choose_backend(backend, device, *deciding_node(nodes))
        if _test_staged() and choice.device == "cpu":
            choice = Backend("cpu", "gloo", True, "notice: FEDMPI_TEST_STAGED: tensors staged through host copies")
        if choice.device == "cuda":
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
            dev = torch.device("cuda", torch.cuda.current_device())
            set_cuda_math(tf32)
        else:
            dev = torch.device("cpu")
            from ..cores import available_cores

            torch.set_num_threads(threads or max(1, available_cores() // local_size))
        sharing = node_gpus.count(node_gpus[local_rank]) if choice.device == "cuda" else 1
        world = cls(rank, size, local_rank, local_size, dev, choice.name if size > 1 else "none", comm,
                    staged=choice.staged and size > 1, ranks_on_device=sharing, timeout_s=timeout_s,
                    mpi_collectives=size > 1 and collectives != "torch")
        world.nodes = node_names
        if world.mpi_collectives:
            world._notices = comm.Dup()  # collective: on every rank alike
            world._node_peers = peers
        if size > 1:
            world._join_watch(lost_after_s, all_local)
            if rank == 0 and len(set(node_names)) > 1:  # which rank runs where, for the job's log
                where = {n: [r for r in range(size) if node_names[r] == n] for n in dict.fromkeys(node_names)}
                print(f"fedmpi: {size} ranks on {len(where)} nodes: "
                      + ", ".join(f"{n} (rank{'s' if len(rs) > 1 else ''} {_span(rs)})" for n, rs in where.items()),
                      file=sys.stderr)
            if rank == 0 and choice.notice:
                print(choice.notice, file=sys.stderr)
            world._init_torch_dist(choice.name, timeout_s)
        return world

    def _join_watch(self, lost_after_s: float, all_local: bool) -> None:
        """Collective: every rank's heartbeat to the hub of ``FEDMPI_WATCH`` (launch/fedmpi-launch's),
        else to one that rank 0 starts in a thread. InputError on every rank when one cannot reach it."""
        address = os.environ.get("FEDMPI_WATCH", "")
        if not address and self.rank == 0:
            self._hub = Hub().start()
            address = f"{advertised_host(all_local)}:{self._hub.port}"
        address = address or self.comm.bcast(None, root=0)
        if self._hub is not None:
            self.comm.bcast(address, root=0)
        error = None
        try:
            self._watch = Heartbeat(address, self.rank, self.nodes[self.rank], lost_after_s)
        except OSError as e:
            error = InputError(f"runtime: rank {self.rank} on node {self.nodes[self.rank]} cannot reach the watch "
                               f"at {address} ({e.strerror or e}); set FEDMPI_WATCH_ADDR to an address of "
                               f"{'the launching node' if os.environ.get('FEDMPI_WATCH') else 'rank 0'}"
                               f"that every node reaches")
        agree_on_error(self.comm.allgather, error)

    def report(self, line: str) -> None:
        """Tell the watch something that whoever settles a lost run needs (rank 0: ``file OUT\tCKPT``
        when it starts writing a result file, ``closed`` when it has finished it). Not collective."""
        if self._watch is not None:
            self._watch.report(line)

    def lost(self) -> str:
        """The watch's verdict: which rank (and node) was lost, "" while every rank is alive."""
        return self._watch.lost if self._watch is not None else ""

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

    def close(self, finished: bool = False) -> None:
        """End torch.distributed. ``finished``: every rank ended its work normally, so close is
        collective and a barrier first lets every rank's last operation finish everywhere
        (after a failure it is skipped: a peer may be gone). The held tensors are dropped
        last, here in the main thread (``_hold``)."""
        if dist.is_available() and dist.is_initialized():
            if finished:
                dist.barrier()
            dist.destroy_process_group()
        if finished and self._notices is not None:
            self._notices.Free()  # collective, as close(finished=True) is (a sweep makes a world per cell)
            self._notices = None
        self.leave_watch()
        self._held.clear()

    def leave_watch(self) -> None:
        """Say goodbye to the watch (this rank's end is no loss) and stop rank 0's own hub. Not collective."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if self._hub is not None:
            self._hub.close()
            self._hub = None

    def abandon(self) -> None:
        """This rank failed on its own (not collective): tell the other ranks, so that one
        waiting in an MPI collective stops with ConnectionError instead of waiting
        ``timeout_s``, and close torch.distributed, which fails a pending gloo collective.
        Only for a genuine failure: a rank that merely ends first must not, since a peer may
        still be completing a collective this rank has finished (``close``)."""
        self._tell_peers()
        self.close(finished=False)

    _NOTICE_TAG = 77

    def _tell_peers(self) -> None:
        """Send every other rank this rank's "I failed" notice (see ``abandon``)."""
        if self._notices is None or self.size == 1:
            return
        for r in range(self.size):
            if r != self.rank:
                self._notices.isend(self.rank, dest=r, tag=self._NOTICE_TAG)  # small: sent eagerly

    def _node_peers_dead(self) -> str:
        """"RANK (pid PID)" of a rank on this node that has died (gone, or a zombie), else "".
        MPI does not say so: its launcher kills the whole job a moment later, which left the
        result file ``running``; a torch.distributed collective fails at once (its socket closes)."""
        for rank, pid in self._node_peers:
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    state = fh.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                state = b"X"  # gone
            if state in (b"Z", b"X"):
                return f"{rank} (pid {pid})"
        return ""

    def _wait(self, request: Any, what: str) -> None:
        """Wait for the non-blocking MPI ``request`` of collective ``what``: poll it (progress
        happens inside ``Test``). Spin while the machine has a core for every runnable task (up
        to ``_SPIN_S``: the ranks of a round arrive within a few ms of each other), else nap 0.1
        ms between polls, so that a rank waiting for a slow or descheduled peer leaves the core to
        it and to other work (benchmarks/RESULTS.md: a 2 ms spin made 2 ranks sharing their cores
        with busy processes 20% slower than 1 rank; napping after 0.2 ms cost 10% on a quiet
        machine). Raises ConnectionError when another rank says it failed or a rank on this node
        died, TimeoutError after ``timeout_s``."""
        start = time.monotonic()
        polls, next_check, spin = 0, 0.0, True
        while not request.Test():
            polls += 1
            if spin and polls % 32:
                continue  # the spin: the clock, the notices and the machine every 32 polls
            if self._notices.Iprobe(tag=self._NOTICE_TAG) and not _completes(request):
                raise ConnectionError(f"{what}: rank {self._notices.recv(tag=self._NOTICE_TAG)} failed")
            if self._watch is not None and self._watch.lost and not _completes(request):
                raise self._verdict(what)
            waited = time.monotonic() - start
            if waited > self.timeout_s:
                raise TimeoutError(f"{what}: timed out after runtime.timeout_s = {self.timeout_s:g} s "
                                   f"waiting for another rank")
            spin = spin and waited < _SPIN_S and not _crowded()
            if not spin:
                if waited >= next_check:  # every 10 ms: are this node's other ranks alive?
                    next_check = waited + 0.01
                    dead = self._node_peers_dead()
                    if dead and not _completes(request):
                        self._raise_watch_verdict(what)  # the watch names the lost rank and node: preferred
                        raise ConnectionError(f"{what}: rank {dead} died")
                time.sleep(0.0001)

    def _raise_watch_verdict(self, what: str) -> None:
        """A peer on this node died: its heartbeat connection closed with it, so the watch's
        verdict (``RankLost``: rank, node, what the checkpoint keeps; exit 5) follows within a
        beat. Wait up to two beats for it, so that how a killed rank is reported does not depend
        on which of the two checks saw it first; return if none comes."""
        end = time.monotonic() + 2 * BEAT_S
        while self._watch is not None and time.monotonic() < end:
            if self._watch.lost:
                raise self._verdict(what)
            time.sleep(0.01)

    def _verdict(self, what: str) -> RankLost:
        """The watch's verdict (a rank lost, by rank and node) as this rank's error, waiting in ``what``."""
        return RankLost(f"{self._watch.lost}; this rank was waiting in: {what}")

    def _hold(self, *tensors: torch.Tensor) -> None:
        """Keep a Python reference to tensors just given to gloo, so that its worker thread,
        which drops its own reference a moment after the operation returns, never frees the
        last one: that free takes the GIL, and if the interpreter is already shutting down
        the thread is killed and the process aborts (seen with torch 2.11 on 2 ranks sharing
        a GPU: 'terminate called without an active exception' after a complete run). Only the
        last few are kept: the operation in flight at exit is the last one."""
        self._held.extend(tensors)

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

    # ------------------------------------------------------------------ memory
    def free_memory(self) -> tuple[int, str]:
        """(bytes this rank may plan to use, where): its GPU's free memory split among the
        ranks sharing that GPU, or the host's available memory split among the node's ranks."""
        if self.device.type == "cuda":
            free = torch.cuda.mem_get_info(self.device)[0] // self.ranks_on_device
            shared = f" shared by {self.ranks_on_device} ranks" if self.ranks_on_device > 1 else ""
            return free, f"GPU {self.device}{shared}"
        return psutil.virtual_memory().available // max(self.local_size, 1), "host memory per rank"

    # ------------------------------------------------------------------ communication
    # Every method here is collective over all ranks unless it says otherwise, and a no-op
    # (no torch.distributed call) in a single process. Tensors travel through ``_through_host``.

    def _through_host(self, t: torch.Tensor, op: Callable[[torch.Tensor], object],
                      copy_back: bool = True) -> torch.Tensor:
        """Run the communication ``op`` on ``t``; when staged, on a host copy of ``t`` whose
        result is copied back into ``t`` (if ``copy_back``). Returns ``t``."""
        if not self.staged:
            op(t)
            self._hold(t)
            return t
        host = t.to("cpu", copy=True)
        op(host)
        self._hold(host)
        if copy_back:
            t.copy_(host)
        return t

    def _mpi(self, t: torch.Tensor, start: Callable[[Any, np.ndarray], Any], what: str,
             copy_back: bool = True) -> bool:
        """Run the non-blocking MPI collective ``start(MPI, buffer)`` on ``t``'s memory (or a
        contiguous host copy, copied back if ``copy_back``) and wait for it; False (nothing
        done) when ``t``'s collectives do not go through MPI (``runtime.collectives``, NCCL)."""
        if not self.mpi_collectives or (t.device.type != "cpu" and not self.staged):
            return False
        from mpi4py import MPI

        host = t if t.device.type == "cpu" and t.is_contiguous() else t.to("cpu").contiguous()
        self._wait(start(MPI, host.detach().numpy()), what)
        if host is not t and copy_back:
            t.copy_(host)
        return True

    def sum_to_server_(self, t: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks into rank 0 (other ranks' buffers are unspecified after)."""
        def ireduce(MPI: Any, b: np.ndarray) -> Any:  # rank 0 sums in place, the others only send
            return self.comm.Ireduce(MPI.IN_PLACE, b, op=MPI.SUM, root=0) if self.rank == 0 else \
                self.comm.Ireduce(b, None, op=MPI.SUM, root=0)

        if self.size > 1 and not self._mpi(t, ireduce, "sum", copy_back=self.rank == 0):
            self._through_host(t, lambda h: dist.reduce(h, dst=0, op=dist.ReduceOp.SUM), copy_back=self.rank == 0)
        return t

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank ``src``'s ``t`` into every rank's ``t``."""
        if self.size > 1 and not self._mpi(t, lambda MPI, b: self.comm.Ibcast(b, root=src), "broadcast",
                                           self.rank != src):
            self._through_host(t, lambda h: dist.broadcast(h, src=src), copy_back=self.rank != src)
        return t

    def allreduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        if self.size > 1 and not self._mpi(t, lambda MPI, b: self.comm.Iallreduce(MPI.IN_PLACE, b, op=MPI.SUM),
                                           "all-reduce"):
            self._through_host(t, lambda h: dist.all_reduce(h, op=dist.ReduceOp.SUM))
        return t

    def allreduce_max_(self, t: torch.Tensor) -> torch.Tensor:
        if self.size > 1 and not self._mpi(t, lambda MPI, b: self.comm.Iallreduce(MPI.IN_PLACE, b, op=MPI.MAX),
                                           "all-reduce"):
            self._through_host(t, lambda h: dist.all_reduce(h, op=dist.ReduceOp.MAX))
        return t

    def max_float(self, x: float) -> float:
        """Maximum of a float over ranks (control data, through the collectives' own channel)."""
        if self.size == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64, device="cpu" if self.staged or self.mpi_collectives
                         else self.device)
        return float(self.allreduce_max_(t).item())

    def gather_to_server(self, t: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's ``t`` (same shape and dtype everywhere), in rank order, on rank 0 (on
        ``t``'s device); None on the other ranks."""
        if self.size == 1:
            return [t]
        if self.mpi_collectives and (t.device.type == "cpu" or self.staged):
            host = t.to("cpu").contiguous()
            parts = torch.empty((self.size, *host.shape), dtype=host.dtype) if self.rank == 0 else None
            self._wait(self.comm.Igather(host.numpy(), None if parts is None else parts.numpy(), root=0), "gather")
            return None if parts is None else [p.to(t.device) for p in parts]
        host = t.to("cpu", copy=True) if self.staged else t
        if self.rank != 0:
            dist.gather(host, dst=0)
            self._hold(host)
            return None
        parts = [torch.empty_like(host) for _ in range(self.size)]
        dist.gather(host, parts, dst=0)
        self._hold(host, *parts)
        return [p.to(t.device) for p in parts]

    def send_recv_(self, send: torch.Tensor, recv: torch.Tensor,
                   peers: Sequence[tuple[int, int, int, int, int]]) -> None:
        """Point-to-point rows with several peers in one ``batch_isend_irecv``, waited for.

        For each ``(peer, s0, s1, r0, r1)``: rows ``send[s0:s1]`` go to ``peer`` and its rows
        land in ``recv[r0:r1]``. Not collective: only the listed peers take part, each listing
        this rank with matching row counts, and each pair ordered the same on both sides.
        """
        if not peers:
            return
        out = send.to("cpu", copy=True) if self.staged else send
        into = torch.empty(recv.shape, dtype=recv.dtype) if self.staged else recv
        ops = []
        for p, s0, s1, r0, r1 in peers:
            ops += [dist.P2POp(dist.isend, out[s0:s1], p), dist.P2POp(dist.irecv, into[r0:r1], p)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        self._hold(out, into)
        if self.staged:
            for _, _, _, r0, r1 in peers:
                recv[r0:r1].copy_(into[r0:r1])

    def allgather_obj(self, obj: Any) -> list:
        """Every rank's ``obj`` (picklable), in rank order. Polled like the tensor collectives (a
        lost or failed peer ends it, ``_wait``) when collectives go through MPI."""
        if self.comm is None:
            return [obj]
        if self._notices is None:
            return self.comm.allgather(obj)
        from mpi4py import MPI

        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        sizes = np.zeros(self.size, dtype=np.int64)
        self._wait(self.comm.Iallgather(np.array([data.size], dtype=np.int64), sizes), "gather of objects")
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        self._wait(self.comm.Iallgatherv(data, [out, sizes, starts, MPI.BYTE]), "gather of objects")
        return [pickle.loads(out[a:a + n].tobytes()) for a, n in zip(starts, sizes)]

    def barrier(self) -> None:
        """Every rank waits for all (polled like ``allgather_obj``)."""
        if self.comm is None:
            return
        if self._notices is None:
            self.comm.Barrier()
        else:
            self._wait(self.comm.Ibarrier(), "barrier")
