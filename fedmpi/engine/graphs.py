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
arguments. ``StepGraphs`` holds one graph per (parameter shape, inputs' signature, record),
all in one memory pool (they never run at the same time).

On CPU (tests only: ``LocalTrainer(replay=True)``) a "replay" calls the function again on the
same buffers: it checks the buffer plumbing (what is copied in and out) bit for bit where no
GPU is available; the capture itself is checked by tests/test_gpu.py on a GPU machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

WARMUP = 2  # eager runs on a side stream before a capture (cuBLAS handles, autograd's state)

StepFn = Callable[[torch.Tensor, Any, torch.Tensor, bool], list]  # (x, StepInputs, lr, record) -> losses


@dataclass
class _Entry:
    x: torch.Tensor      # the graph's parameter rows (copied in and out around a replay)
    inputs: Any          # its StepInputs buffers
    lr: torch.Tensor     # its step sizes
    out: list            # its outputs: the step losses of the last replay
    graph: Any = None    # torch.cuda.CUDAGraph; None: eager replay (CPU)


class StepGraphs:
    """The captured step loops of one trainer; see the module docstring. Every rank holds its own."""

    def __init__(self, fn: StepFn, device: torch.device):
        self.fn, self.device = fn, device
        self.entries: dict[tuple, _Entry] = {}
        self.pool = None  # the memory pool all of this trainer's graphs share
        self.captures = 0  # graphs captured so far (tests, benchmarks)

    def run(self, x: torch.Tensor, inputs: Any, lr: torch.Tensor, record: bool) -> list:
        """``fn(x, inputs, lr, record)``, in place on ``x``, by replaying the graph of these shapes
        (captured at their first use)."""
        key = (tuple(x.shape), x.dtype, inputs.signature(), tuple(lr.shape), record)
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = self._capture(x, inputs, lr, record)
        entry.x.copy_(x)
        entry.inputs.copy_(inputs)
        entry.lr.copy_(lr)
        if entry.graph is not None:
            entry.graph.replay()
        else:
            entry.out = self.fn(entry.x, entry.inputs, entry.lr, record)
        x.copy_(entry.x)
        return entry.out

    def _capture(self, x: torch.Tensor, inputs: Any, lr: torch.Tensor, record: bool) -> _Entry:
        entry = _Entry(x.clone(), inputs.clone(), lr.clone(), [])
        self.captures += 1
        if self.device.type != "cuda":
            return entry
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP):  # on the graph's own buffers: they are overwritten before every replay
                self.fn(entry.x, entry.inputs, entry.lr, record)
        torch.cuda.current_stream(self.device).wait_stream(side)
        entry.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(entry.graph, pool=self.pool):
            entry.out = self.fn(entry.x, entry.inputs, entry.lr, record)
        self.pool = entry.graph.pool()
        return entry
