"""Communication graphs: rgg / ring / complete / file, mixing weights, locality relabelling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedmpi.config import TopologyConfig
from fedmpi.decentral.topology import _bfs_order, build_graph, locality_order, make_graph, mixing_matrix, relabel
from fedmpi.errors import InputError


def canonical(g):
    e = g.edges
    assert e.dtype == np.int64 and e.shape == (g.num_edges, 2)
    assert np.all(e[:, 0] < e[:, 1])
    assert np.array_equal(np.lexsort((e[:, 1], e[:, 0])), np.arange(len(e)))
    assert np.array_equal(g.degree, np.bincount(e.ravel(), minlength=g.m))


def connected(g):
    return _bfs_order(g, 0).size == g.m


def cut_edges(g, blocks):
    block = np.arange(g.m) * blocks // g.m
    return int(np.sum(block[g.edges[:, 0]] != block[g.edges[:, 1]]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rgg_is_connected_geometric_and_seeded(seed):
    cfg = TopologyConfig(kind="rgg", radius=0.3)
    g = build_graph(cfg, 30, seed)
    canonical(g)
    assert connected(g)
    dist = np.linalg.norm(g.points[:, None] - g.points[None], axis=-1)
    i, j = np.triu_indices(30, 1)
    expected = np.stack([i, j], 1)[dist[i, j] <= 0.3]
    assert np.array_equal(g.edges, expected)
    assert np.array_equal(build_graph(cfg, 30, seed).edges, g.edges)
    assert not np.array_equal(build_graph(cfg, 30, seed + 10).points, g.points)


def test_rgg_gives_up_after_max_attempts():
    with pytest.raises(InputError) as e:
        build_graph(TopologyConfig(kind="rgg", radius=0.01, max_attempts=3), 50, 0)
    msg = str(e.value)
    assert msg.startswith("topology.radius:") and "m=50" in msg and "after 3 attempts" in msg
    assert "topology.max_attempts" in msg and "\n" not in msg


def test_ring_and_complete_degrees():
    ring = build_graph(TopologyConfig(kind="ring"), 7, 0)
    canonical(ring)
    assert ring.num_edges == 7 and np.all(ring.degree == 2) and connected(ring)
    assert build_graph(TopologyConfig(kind="ring"), 2, 0).edges.tolist() == [[0, 1]]
    assert build_graph(TopologyConfig(kind="ring"), 1, 0).num_edges == 0
    full = build_graph(TopologyConfig(kind="complete"), 6, 0)
    canonical(full)
    assert full.num_edges == 15 and np.all(full.degree == 5)
    assert np.allclose(full.weights, 1 / 6)


def test_metropolis_hastings_weights_on_a_hand_made_graph():
    # 0-1, 0-2, 0-3, 1-2: degrees 3, 2, 2, 1
    g = make_graph(4, np.array([[2, 1], [0, 3], [1, 0], [0, 2]]))
    assert g.edges.tolist() == [[0, 1], [0, 2], [0, 3], [1, 2]]
    assert g.degree.tolist() == [3, 2, 2, 1]
    assert np.allclose(g.weights, [1 / 4, 1 / 4, 1 / 4, 1 / 3])  # 1 / (1 + max(deg_i, deg_j))
    w = mixing_matrix(g)
    assert torch.allclose(w, w.T) and torch.allclose(w.sum(0), torch.ones(4, dtype=torch.float64))
    assert w[3, 3] == pytest.approx(0.75) and w[1, 1] == pytest.approx(1 - 1 / 4 - 1 / 3)


def write(tmp_path, text):
    p = tmp_path / "edges.txt"
    p.write_text(text)
    return str(p)


def test_file_edge_list(tmp_path):
    path = write(tmp_path, "# a path and a chord\n0 1\n\n2 1  # inline comment\n 2 3\n0 3\n")
    g = build_graph(TopologyConfig(kind="file", file=path), 4, 0)
    canonical(g)
    assert g.edges.tolist() == [[0, 1], [0, 3], [1, 2], [2, 3]] and g.points is None


@pytest.mark.parametrize("text, line, words", [
    ("0 1\n1 1\n", 2, "self-loop"),
    ("0 1\n1 2\n2 1\n", 3, "duplicate edge 2 1 (first on line 2)"),
    ("0 1\n1 4\n", 2, "out of range"),
    ("0 1\n1 -1\n", 2, "out of range"),
    ("0 1\n1 x\n", 2, "expected two client ids"),
    ("0 1 2\n", 1, "expected two client ids"),
])
def test_file_errors_name_file_and_line(tmp_path, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(InputError) as e:
        build_graph(TopologyConfig(kind="file", file=path), 4, 0)
    assert str(e.value).startswith(f"{path}:{line}: ") and words in str(e.value)


def test_file_disconnected_missing_and_unset(tmp_path):
    path = write(tmp_path, "0 1\n2 3\n")
    with pytest.raises(InputError, match="disconnected") as e:
        build_graph(TopologyConfig(kind="file", file=path), 4, 0)
    assert str(e.value).startswith(path)
    with pytest.raises(InputError, match=r"^topology\.file: cannot read"):
        build_graph(TopologyConfig(kind="file", file=str(tmp_path / "nope.txt")), 4, 0)
    with pytest.raises(InputError, match=r"^topology\.file: required"):
        build_graph(TopologyConfig(kind="file"), 4, 0)


def test_locality_order_cuts_fewer_edges_than_random_labels():
    g = build_graph(TopologyConfig(kind="rgg", radius=0.15), 200, 0)
    shuffled = relabel(g, np.random.default_rng(0).permutation(200))
    local = relabel(shuffled, locality_order(shuffled))
    canonical(local)
    assert sorted(local.degree) == sorted(g.degree) and local.num_edges == g.num_edges
    assert np.allclose(np.sort(local.weights), np.sort(g.weights))
    assert cut_edges(local, 4) < 0.4 * cut_edges(shuffled, 4)


def test_relabel_maps_edges_and_bfs_order_without_points():
    ring = build_graph(TopologyConfig(kind="ring"), 40, 0)
    order = np.random.default_rng(1).permutation(40)
    shuffled = relabel(ring, order)
    # new id n is old client order[n]: edge (a, b) of shuffled is edge (order[a], order[b]) of the ring
    old = np.sort(order[shuffled.edges], axis=1)
    assert {tuple(e) for e in old.tolist()} == {tuple(e) for e in ring.edges.tolist()}
    local = relabel(shuffled, locality_order(shuffled))
    assert cut_edges(local, 4) <= 8 < cut_edges(shuffled, 4)
    with pytest.raises(ValueError):
        relabel(ring, np.zeros(40, int))
