"""fedmpi.saved: what autograd keeps for a backward pass, counted by storage."""

from __future__ import annotations

import torch

from fedmpi.saved import kept


def test_a_storage_saved_by_two_ops_is_counted_once():
    w1, w2 = torch.randn(8, 4, requires_grad=True), torch.randn(8, 4, requires_grad=True)
    x = torch.randn(5, 8)
    both = kept(lambda: ((x @ w1).sum() + (x @ w2).sum()), [w1, w2])  # each product saves x
    assert both == kept(lambda: (x @ w1).sum(), [w1, w2])
    assert both.total == both.largest == 5 * 8 * 4


def test_a_view_counts_the_bytes_it_reaches_and_held_storages_none():
    data = torch.randn(1000, 8)  # a training set: a minibatch of it keeps its rows, not the set
    w = torch.randn(8, 3, requires_grad=True)
    assert kept(lambda: (data[10:14] @ w).sum(), [w]).total == 4 * 8 * 4
    assert kept(lambda: (data[10:14] @ w).sum(), [w, data]).total == 0
    row = torch.randn(8)  # a stride-0 expansion keeps one row
    assert kept(lambda: (row.expand(50, 8) @ w).sum(), [w]).total == 8 * 4
    x = torch.randn(6, 8)
    k = kept(lambda: torch.relu(x @ w).sum(), [w])  # x for the product, relu's output (6 x 3)
    assert (k.total, k.largest) == (4 * (48 + 18), 4 * 48)


def test_views_of_one_storage_count_the_union_of_what_they_reach():
    h = torch.randn(10, 8)  # 320 bytes
    w = torch.randn(8, 2, requires_grad=True)
    top, bottom = h.chunk(2)  # each half saved by its own product: both halves kept
    assert kept(lambda: (top @ w).sum() + (bottom @ w).sum(), [w]).total == 320
    assert kept(lambda: (h[1:3] @ w).sum() + (h[7:9] @ w).sum(), [w]).total == 2 * 2 * 8 * 4  # disjoint rows
    assert kept(lambda: (h[1:5] @ w).sum() + (h[3:7] @ w).sum(), [w]).total == 6 * 8 * 4  # overlapping rows
