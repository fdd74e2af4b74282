"""One intra-op thread for the engine's CPU arithmetic.

Multi-threaded CPU kernels split their work by the thread count and the tensor shapes: MKL's
batched matrix products, for one, give a client other bits when it shares a ``bmm`` with
another number of clients, or runs with another number of threads (measured: 2 threads, 1 vs
2 clients; 4 threads, 2 vs 4 clients), and oneDNN convolutions round differently with other
thread counts. With one thread each client's arithmetic is the same whoever its batch-mates
are and however many ranks share the machine, which is what the bit-identical results across
rank counts rest on. Parallelism on CPUs comes from ranks (``mpiexec -n <cores>``); the
engine's ops on a few clients are too small to gain from intra-op threads anyway, and on a busy
machine threads that wait for each other cost many times the work (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def one_thread(device: torch.device) -> Iterator[None]:
    """Run CPU tensor ops with one intra-op thread (restored afterwards); no-op off the CPU."""
    if device.type != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
