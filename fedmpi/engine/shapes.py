"""Fixed-shape blocks: a client's bits must not depend on how many clients share a kernel call.

On CPU the engine's kernels compute each client's slice the same way whatever the batch
count (tested bit for bit: alone == with batch-mates, 1 rank == 2 ranks). On CUDA they do
not: cuBLAS chooses its GEMM kernel (tiling, split-K) by the shapes, batch count included,
so a rank training 25 clients rounds differently from one training 50 (measured on an H200:
2 ranks vs 1 differed by ~1e-8 after 6 rounds). There every batched call therefore gets the
same shape on every rank: blocks of a fixed number of rows, the last one padded with copies
of its last row, whose results are dropped. The padding costs compute, never bits.
"""

from __future__ import annotations

import numpy as np
import torch


MAX_FIXED_BLOCK = 256  # rows of a fixed-shape block at most: bounds the padding of a small cohort


def fixed_shapes(device: torch.device) -> bool:
    """Whether batched calls on ``device`` must have a fixed shape to be reproducible (CUDA)."""
    return device.type == "cuda"


def pad_rows(rows: torch.Tensor | np.ndarray | None, extra: int) -> torch.Tensor | np.ndarray | None:
    """``rows`` (n >= 1, ...) followed by ``extra`` copies of its last row (None stays None)."""
    if rows is None or extra <= 0:
        return rows
    if isinstance(rows, np.ndarray):
        return np.concatenate([rows, np.repeat(rows[-1:], extra, axis=0)])
    return torch.cat([rows, rows[-1:].expand(extra, *rows.shape[1:])])
