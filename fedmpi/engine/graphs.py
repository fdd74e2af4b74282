"""CUDA graphs of the local step loop: a block's steps launched as one graph instead of kernel by kernel.

On a GPU the anchor task's round is a few dozen small kernels per local step, each launched from
Python; the GPU waits for the launches most of the time. ``train.cuda_graphs`` captures the
step loop of a block (``LocalTrainer.run_steps``: device operations only, reading everything
that changes from round to round from ``StepInputs``) once per shape, and replays it every
round with that round's parameters, minibatch ids, step masks, dropout keys and augmentation
draws copied into the graph's own input buffers. A replay runs the captured kernels on the
same shapes (fixed-shape blocks, ``engine.shapes``), so its bits are those of the loop run
kernel by kernel.

Contract: the captured function reads no host value and allocates nothing that outlives it
except its outputs (the step losses, which live in the graph's memory pool and are read
before the next replay); every input it reads that may differ between rounds is one of its
arguments. ``StepGraphs`` keeps the graphs of the last ``KEEP`` shapes (parameter rows,
inputs' signature -- the step count among them -- and whether losses are recorded), all in one
memory pool (they never run at the same time). A capture that fails is logged once and that
trainer runs its steps kernel by kernel from then on (the same bits).

On CPU (tests only: ``LocalTrainer(replay=True)``) a "replay" calls the function again on the
same buffers: it checks the buffer plumbing (what is copied in and out) bit for bit where no
GPU is available; the capture itself is checked by tests/test_graphs.py and tests/test_gpu.py
on a GPU machine.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from .local import StepInputs

WARMUP = 2  # eager runs on a side stream before a capture (cuBLAS handles, autograd's state)
KEEP = 8    # graphs kept (step counts drawn per round, full-gradient block widths): least recently used go

StepFn = Callable[[torch.Tensor, "StepInputs", torch.Tensor, bool], list]  # (x, inputs, lr, record) -> losses
log = logging.getLogger(__name__)


@dataclass
class _Entry:
    x: torch.Tensor          # the graph's parameter rows (copied in and out around a replay)
    inputs: StepInputs       # its input buffers
    lr: torch.Tensor         # its step sizes
    out: list                # its outputs: the step losses of the last replay
    graph: object = None     # torch.cuda.CUDAGraph; None: eager replay (CPU)


class StepGraphs:
    """The captured step loops of one trainer; see the module docstring. Every rank holds its own."""

    def __init__(self, fn: StepFn, device: torch.device) -> None:
        self.fn, self.device = fn, device
        self.entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self.pool = None     # the memory pool all of this trainer's graphs share
        self.stream = None   # the side stream of warm-ups and captures
        self.captures = 0    # graphs captured so far (tests, benchmarks)
        self.failed = False  # a capture failed: steps run kernel by kernel

    def run(self, x: torch.Tensor, inputs: StepInputs, lr: torch.Tensor, record: bool) -> list:
        """``fn(x, inputs, lr, record)``, in place on ``x``, by replaying the graph of these shapes
        (captured at their first use)."""
        if self.failed:
            return self.fn(x, inputs, lr, record)
        key = (tuple(x.shape), x.dtype, inputs.signature(), tuple(lr.shape), record)
        entry = self.entries.get(key)
        if entry is None:
            try:
                entry = self._capture(x, inputs, lr, record)
            except RuntimeError as e:  # e.g. an operation that cannot be captured: the plain loop, once
                log.warning("train.cuda_graphs: capturing the local steps failed (%s); they run kernel by "
                            "kernel, with the same results", str(e).splitlines()[0])
                self.failed, self.entries = True, OrderedDict()
                return self.fn(x, inputs, lr, record)
            self.entries[key] = entry
            if len(self.entries) > KEEP:
                self.entries.popitem(last=False)
        self.entries.move_to_end(key)
        entry.x.copy_(x)
        entry.inputs.copy_(inputs)
        entry.lr.copy_(lr)
        if entry.graph is not None:
            entry.graph.replay()
        else:
            entry.out = self.fn(entry.x, entry.inputs, entry.lr, record)
        x.copy_(entry.x)
        return entry.out

    def _capture(self, x: torch.Tensor, inputs: StepInputs, lr: torch.Tensor, record: bool) -> _Entry:
        entry = _Entry(x.clone(), inputs.clone(), lr.clone(), [])
        if self.device.type == "cuda":
            if self.stream is None:
                self.stream = torch.cuda.Stream(self.device)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                for _ in range(WARMUP):  # on the graph's own buffers: they are overwritten before every replay
                    self.fn(entry.x, entry.inputs, entry.lr, record)
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            graph = torch.cuda.CUDAGraph()
            # thread_local: other threads' CUDA calls (NCCL's watchdog) do not break this capture
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
                entry.out = self.fn(entry.x, entry.inputs, entry.lr, record)
            entry.graph, self.pool = graph, graph.pool()
        self.captures += 1
        return entry
