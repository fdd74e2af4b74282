"""Model exchange: neighbour sums against a dense reference, and bitwise rank independence."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedmpi.config import TopologyConfig
from fedmpi.decentral.exchange import Exchanger
from fedmpi.decentral.topology import build_graph, mixing_matrix
from fedmpi.runtime.world import World

SCRIPT = Path(__file__).parent / "mpi_scripts" / "exchange_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("exchange_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kind", ["rgg", "ring", "complete"])
def test_neighbor_sum_matches_dense_reference(kind):
    g = build_graph(TopologyConfig(kind=kind, radius=0.3), 25, 0)
    ex = Exchanger(World(), g, 25)
    x = torch.randn(25, 9, generator=torch.Generator().manual_seed(0))
    masks = np.random.default_rng(0).random((3, g.num_edges)) < [[0.0], [0.5], [1.0]]
    for active in masks:
        # sum_j W_ij v_ij (x_j - x_i) = ((W_v - I) x)_i
        ref = (mixing_matrix(g, active) - torch.eye(25, dtype=torch.float64)) @ x.double()
        out = ex.neighbor_sum(x, active)
        assert out.dtype == torch.float32 and out.shape == x.shape
        assert torch.allclose(out.double(), ref, atol=1e-5)
    assert not ex.neighbor_sum(x, masks[0]).any()
    assert ex.sent_rows == 0 and ex.sent_ops == 0


def test_neighbor_sum_bits_do_not_depend_on_threads():
    """Each client's mixing term is one bag of a fixed order: threads split the bags, never a
    bag (that a bag's bits do not depend on its rank's block is test_mpi_exchange_...)."""
    g = build_graph(TopologyConfig(kind="rgg", radius=0.4), 30, 1)
    active = np.random.default_rng(1).random(g.num_edges) < 0.6
    x = torch.randn(30, 131, generator=torch.Generator().manual_seed(1))  # 131: vector body + tail
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = Exchanger(World(), g).neighbor_sum(x, active)
        torch.set_num_threads(2)
        two = Exchanger(World(), g).neighbor_sum(x, active)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_neighbor_sum_of_a_strided_tensor_has_the_contiguous_bits():
    g = build_graph(TopologyConfig(kind="rgg", radius=0.4), 30, 2)
    active = np.random.default_rng(2).random(g.num_edges) < 0.6
    x = torch.randn(131, 30, generator=torch.Generator().manual_seed(2)).t()  # (30, 131), strided
    ex = Exchanger(World(), g)
    assert torch.equal(ex.neighbor_sum(x, active), ex.neighbor_sum(x.contiguous(), active))


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_mixing_kernel_bits_do_not_depend_on_row_placement(device):
    """What rank-count invariance rests on: a bag's result depends only on its sequence of (row,
    weight), not on where the rows sit in the buffer or which other bags share the call."""
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(40, 131, generator=gen)
    bags = [torch.randperm(40, generator=gen)[:k] for k in (1, 5, 9, 17)]
    weights = [torch.randn(len(b), generator=gen) for b in bags]

    def mix(place: torch.Tensor, which: list[int], pad: int = 0) -> torch.Tensor:
        buf = torch.zeros(pad + 40, 131)
        buf[pad + place] = rows  # row r sits at buffer row pad + place[r]
        index = torch.cat([pad + place[bags[i]] for i in which])
        offsets = torch.tensor([0] + [len(bags[i]) for i in which[:-1]]).cumsum(0)
        return F.embedding_bag(index.to(device), buf.to(device), offsets.to(device), mode="sum",
                               per_sample_weights=torch.cat([weights[i] for i in which]).to(device)).cpu()

    ref = mix(torch.arange(40), [0, 1, 2, 3])
    moved = mix(torch.randperm(40, generator=gen), [3, 1], pad=7)
    assert torch.equal(moved[0], ref[3]) and torch.equal(moved[1], ref[1])


def test_single_process_mean_consensus_and_gather():
    g = build_graph(TopologyConfig(kind="ring"), 6, 0)
    ex = Exchanger(World(), g)
    x = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    mean, cons = ex.mean_and_consensus(x)
    assert torch.equal(mean, torch.tensor([5.0, 6.0]))
    assert cons == pytest.approx(float(((x - mean) ** 2).sum()) / 6)
    assert torch.equal(ex.gather_all(x), x)
    with pytest.raises(ValueError):
        Exchanger(World(), g, 7)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")
def test_mpi_exchange_is_bitwise_rank_independent(tmp_path):
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    root_flag = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    procs = {}
    for n in (2, 3):  # 3 ranks: uneven shards (7, 8, 8) and two peers per rank
        cmd = ["mpiexec", "--oversubscribe", "-n", str(n)] + root_flag + [sys.executable, str(SCRIPT),
                                                                          str(tmp_path / f"r{n}.npz")]
        procs[n] = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for p in procs.values():  # both launches run side by side (torch import dominates)
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out

    script = load_script()
    ref = script.run(World())
    graph = script.make_graph()
    for n in (2, 3):
        r = np.load(tmp_path / f"r{n}.npz")
        assert np.array_equal(r["final"], ref["final"]), f"{n} ranks differ from 1"
        intra_ref = Exchanger(World(), graph).neighbor_sum(torch.from_numpy(r["final"]), r["intra_mask"])
        assert np.array_equal(r["intra_term"], intra_ref.numpy())
        assert r["loop_rows"].sum() > 0            # active cross-rank edges moved rows
        assert not r["quiet"].any()                # no active cross-rank edge: 0 rows, 0 sends
        assert np.allclose(r["mean"], ref["mean"], rtol=0, atol=1e-6)
        assert float(r["consensus"]) == pytest.approx(ref["consensus"], rel=1e-12)
