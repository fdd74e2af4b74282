"""The reproducible reduction (engine.reduce): the same bits as the plain pre-rounding recipe,
in place or not, in one block or many, and the caller's rows left alone unless it allows."""

from __future__ import annotations

import math

import pytest
import torch

from fedmpi.engine.reduce import grid, preround, reproducible_sum, reproducible_sum_blocks
from fedmpi.runtime import World


def reference(rows: torch.Tensor, n_total: int) -> torch.Tensor:
    """The recipe in the module docstring, spelled out: sigma = 2^(e + k) with 2^e above max|row|
    per coordinate and 2^k >= 2 n, every term rounded to ulp(sigma), then summed."""
    r = rows.double()
    _, e = torch.frexp(r.abs().amax(0))
    k = math.ceil(math.log2(n_total)) + 1
    sigma = torch.ldexp(torch.ones_like(r[0]), e + k)
    return ((r + sigma) - sigma).sum(0)


def awkward_rows(n: int = 37, width: int = 300, seed: int = 0) -> torch.Tensor:
    """Mixed magnitudes (1e-30 .. 1e30 across coordinates, 1e-8 .. 1 within one), both signs,
    zero columns, zero entries, exact powers of two and ties at a column's maximum."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(n, width, generator=g, dtype=torch.float64)
    rows *= torch.logspace(-30, 30, width, dtype=torch.float64)
    rows *= torch.logspace(-8, 0, n, dtype=torch.float64)[torch.randperm(n, generator=g)][:, None]
    rows[:, :7] = 0.0
    rows[torch.rand(n, width, generator=g) < 0.1] = 0.0
    rows[3, 10:20] = torch.ldexp(torch.ones(10, dtype=torch.float64), torch.arange(-5, 5))
    rows[4, 20:30] = -rows[:, 20:30].abs().amax(0)  # a negative entry at the maximum |row|
    return rows


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("block_bytes", [1 << 20, 8 * 300 * 5])  # one block; blocks of 5 rows
def test_reduction_equals_the_reference_bit_for_bit(seed, overwrite, block_bytes):
    rows = awkward_rows(seed=seed)
    got = reproducible_sum_blocks(World(), lambda s: rows[s].clone(), rows.shape[0], rows.shape[0],
                                  block_bytes=block_bytes, overwrite=overwrite)
    assert torch.equal(got, reference(rows, rows.shape[0]))


def test_float32_rows_and_a_larger_total_count():
    rows = awkward_rows(n=20, seed=5).clamp(-1e30, 1e30).float()  # another rank holds 44 more rows
    got = reproducible_sum(World(), rows, n_total=64)
    assert torch.equal(got, reference(rows, 64)) and got.dtype == torch.float64


def test_rows_are_left_alone_unless_overwrite():
    rows = awkward_rows()
    before = rows.clone()
    reproducible_sum(World(), rows, rows.shape[0])
    assert torch.equal(rows, before)
    made = []
    reproducible_sum_blocks(World(), lambda s: made.append(rows[s].clone()) or made[-1], rows.shape[0],
                            rows.shape[0], overwrite=True)
    assert not torch.equal(made[-1], before)  # pre-rounded in place: the rows given were the buffer


def test_preround_in_place_and_with_a_known_grid():
    rows = awkward_rows()
    biggest = rows.abs().amax(0)
    fresh = preround(rows, biggest, 37)
    same = preround(rows.clone(), biggest, 37, sigma=grid(biggest, 37))
    inplace = rows.clone()
    assert preround(inplace, biggest, 37, out=inplace) is inplace
    assert torch.equal(fresh, same) and torch.equal(fresh, inplace)
