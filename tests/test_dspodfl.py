"""DSpodFL and its special cases (dgd, rg, sporadic_sgd, dfedavg): update rule, presets, delay, ranks."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from conftest import ROOT, mpiexec, write_config
from fedmpi import config
from fedmpi.build import build_components
from fedmpi.cli import main
from fedmpi.decentral.topology import mixing_matrix
from fedmpi.runtime.world import World

U8 = [[float(i), float(-2 * i)] for i in range(8)]  # quadratic optima u_i; mean (3.5, -7)


def build(data: dict):
    """The algorithm of ``data`` (a config dict) on a single process, as the runner builds it."""
    return build_components(config.from_dict(data), World()).algorithm


def quadratic(name: str, **over) -> dict:
    cfg = {"seed": 1, "task": {"dataset": "quadratic", "model": "scalar", "clients": 8, "u": U8, "x0": 10.0},
           "train": {"lr": 0.1}, "algorithm": {"name": name}, "topology": {"kind": "ring"}}
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg


def synthetic(name: str, **over) -> dict:
    cfg = {"name": "dsp", "seed": 3, "rounds": 30, "eval_every": 4,
           "task": {"dataset": "synthetic", "clients": 11, "model": "logreg",
                    "partition": {"kind": "shards", "classes_per_client": 1},
                    "synthetic": {"samples": 1100, "test_samples": 300, "features": 16, "classes": 4}},
           "train": {"batch_size": 8, "lr": 0.1}, "algorithm": {"name": name},
           "topology": {"kind": "rgg", "radius": 0.5}, "sporadicity": {"max_delay": 40.0},
           "runtime": {"progress": False}}
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg


# ------------------------------------------------------------------------ the update rule

def test_iteration_matches_dense_reference():
    """x <- W_v x - alpha v * g(x): mixing and gradient both at the PRE-aggregation models."""
    algo = build(quadratic("dspodfl", topology={"kind": "rgg", "radius": 0.6}))
    u = torch.tensor(U8, dtype=torch.float64)
    x = torch.full((8, 2), 10.0, dtype=torch.float64)
    seen = []
    for k in range(12):
        v, v_edges = algo.sporadic.draw(k)
        seen.append((v.mean(), v_edges.mean()))
        w = mixing_matrix(algo.graph, v_edges)  # W_ij = r_ij v_ij, W_ii = 1 - sum_j W_ij
        x = w @ x - 0.1 * torch.as_tensor(v, dtype=torch.float64)[:, None] * (x - u)  # grad of ||x - u_i||^2 / 2
        assert algo.round(k) == v.sum()
        assert torch.allclose(algo.table.rows.double(), x, atol=1e-5)
    assert 0 < np.mean(seen) < 1  # the indicators really were sporadic


def test_client_scores_in_padded_blocks_have_the_same_bits(monkeypatch):
    """On CUDA the per-client evaluation pads its blocks to one shape (engine.shapes); on CPU,
    forced, the scores must not change a bit (blocks of 4 over 11 clients: the last padded)."""
    import fedmpi.algorithms.decentralized as dec

    algo = build(synthetic("dspodfl"))
    for k in range(3):
        algo.round(k)
    monkeypatch.setattr(dec, "_EVAL_PARAMS", 4 * algo.ctx.spec.dim)  # blocks of 4 models
    plain = algo._client_scores()
    monkeypatch.setattr(dec, "fixed_shapes", lambda device: True)
    seen = []
    evaluate = dec.evaluate

    def counted(task, spec, models, *args):
        seen.append(models.shape[0])
        return evaluate(task, spec, models, *args)

    monkeypatch.setattr(dec, "evaluate", counted)
    padded = algo._client_scores()
    assert seen == [4, 4, 4] and plain.shape == (11, 2) and np.array_equal(plain, padded)


def test_neighbor_sum_gets_the_drawn_links():
    """Only the drawn v_ij reach the exchange (which moves rows only over active edges)."""
    algo = build(synthetic("dspodfl"))
    masks = []
    inner = algo.exchanger.neighbor_sum
    algo.exchanger.neighbor_sum = lambda x, active: masks.append(active.copy()) or inner(x, active)
    for k in range(5):
        algo.round(k)
        assert np.array_equal(masks[-1], algo.sporadic.draw(k)[1])
    assert 0 < np.mean(masks) < 1


def test_sgd_step_bits_do_not_depend_on_the_batch():
    """A client's step is the same alone (one client on its rank) as among others.

    (A batch of one takes other kernels; the engine computes it as a pair.)"""
    algo = build(synthetic("dspodfl", task={"clients": 11, "model": "logreg", "partition": {"kind": "iid"},
                                            "synthetic": {"samples": 1100, "features": 64, "classes": 10}}))
    x = algo.table.rows + 0.1 * torch.randn(algo.table.rows.shape, generator=torch.Generator().manual_seed(0))
    ids = np.arange(11)
    together = algo.ctx.trainer.train(x, ids, 5, steps=1)
    alone = torch.cat([algo.ctx.trainer.train(x[i:i + 1], ids[i:i + 1], 5, steps=1) for i in ids])
    assert torch.equal(together, alone)


def test_unit_probabilities_equal_dgd():
    ones = {"sgd_prob": {"dist": "fixed", "value": 1.0}, "link_prob": {"dist": "fixed", "value": 1.0}}
    runs = [build(synthetic(name, sporadicity=ones)) for name in ("dspodfl", "dgd")]
    runs.append(build(synthetic("dgd")))  # drawn d, b: the same models, a larger delay
    for k in range(6):
        assert {a.round(k) for a in runs} == {11}
    assert torch.equal(runs[0].table.rows, runs[1].table.rows)
    assert torch.equal(runs[0].table.rows, runs[2].table.rows)
    assert runs[0].delay[2] == runs[1].delay[2] == 6 * 2.0  # each iteration: processing 1 + transmission 1
    assert runs[2].delay[2] > 12.0


@pytest.mark.parametrize("name, sgd_forced, links_forced", [("rg", True, False), ("sporadic_sgd", False, True)])
def test_gossip_and_sporadic_sgd_presets(name, sgd_forced, links_forced):
    algo, ref = build(quadratic(name)), build(quadratic("dspodfl"))
    for k in range(4):
        (v, ve), (rv, rve) = algo.indicators(k), ref.indicators(k)
        assert v.all() if sgd_forced else np.array_equal(v, rv)
        assert ve.all() if links_forced else np.array_equal(ve, rve)


def test_quadratic_dgd_average_converges_and_consensus_falls():
    algo = build(quadratic("dgd", train={"lr": 0.1, "lr_schedule": "inv_sqrt"}))
    errors = []
    for k in range(400):
        algo.round(k)
        if k + 1 in (20, 100, 400):
            errors.append(algo.evaluation_snapshot().metrics["consensus_error"])
    assert torch.allclose(algo.final_params(), torch.tensor([3.5, -7.0]), atol=2e-3)  # x_bar: mean of the u_i
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.2  # without links it would be 26.25


# ------------------------------------------------------------------------ delay and dfedavg

def test_delay_on_a_hand_made_graph(tmp_path):
    """Path 0 - 1 - 2 (deg 1, 2, 1), d = (0.5, 0.25, 1), b_01 = 0.5, b_12 = 0.2.

    delay_k = (1/m) sum_i [ v_i / d_i + (1/deg_i) sum_j v_ij / b_ij ]
    k = 0, v = (1, 0, 1), v_01 = 1, v_12 = 0:
        processing   (2 + 0 + 1) / 3                   = 1
        transmission (2 / 1 + (2 + 0) / 2 + 0 / 1) / 3 = 1
    k = 1, everything fires:
        processing   (2 + 4 + 1) / 3                   = 7/3
        transmission (2 / 1 + (2 + 5) / 2 + 5 / 1) / 3 = 7/2
    cumulative after k = 1: 2 + 35/6 = 47/6. DGD forces every indicator, so it pays 35/6 each time.
    """
    edges = tmp_path / "path.txt"
    edges.write_text("0 1\n1 2\n")
    d, b = np.array([0.5, 0.25, 1.0]), np.array([0.5, 0.2])
    fired = {0: (np.array([1, 0, 1], bool), np.array([1, 0], bool)), 1: (np.ones(3, bool), np.ones(2, bool))}

    def make(name, mode="raw"):
        algo = build(quadratic(name, task={"clients": 3, "u": [0.0, 1.0, 2.0]},
                               topology={"kind": "file", "file": str(edges)}, sporadicity={"delay": mode}))
        assert algo.graph.edges.tolist() == [[0, 1], [1, 2]]
        algo.sporadic.probabilities = lambda k=0: (d, b)
        return algo

    algo = make("dspodfl")
    algo.indicators = lambda k: fired[k]
    algo.round(0)
    assert algo.delay == pytest.approx([1.0, 1.0, 2.0])
    algo.round(1)
    assert algo.delay == pytest.approx([1 + 7 / 3, 1 + 7 / 2, 47 / 6])
    dgd = make("dgd")
    dgd.round(0)
    assert dgd.delay[2] == pytest.approx(35 / 6)
    assert algo.evaluation_snapshot().metrics["sim_delay"] == pytest.approx(47 / 6)
    norm = make("dgd", "normalized")  # an iteration where everything fires costs exactly 1
    norm.round(0)
    assert norm.delay[2] == pytest.approx(1.0)


def test_max_delay_stops_the_run():
    algo = build(quadratic("dgd", sporadicity={"sgd_prob": {"dist": "fixed", "value": 0.5},
                                               "link_prob": {"dist": "fixed", "value": 0.5}, "max_delay": 20.0}))
    k = 0
    while not algo.done():
        algo.round(k)
        k += 1
    assert k == 5 and algo.delay[2] == 20.0  # 2 + 2 per iteration


def test_dfedavg_local_steps_and_schedule():
    fixed = build(quadratic("dfedavg", sporadicity={"sgd_prob": {"dist": "fixed", "value": 0.4}}))
    assert fixed.local_steps(0) == 3  # ceil(1 / 0.4)
    schedule = []
    for k in range(8):
        v, ve = fixed.indicators(k)
        assert (v.all() and not ve.any()) or (ve.all() and not v.any())
        schedule.append(bool(ve.all()))
        assert fixed.round(k) == (0 if ve.all() else 8)
    assert schedule == [False, False, False, True] * 2  # D SGD-only iterations, then one aggregation
    drawn = build(quadratic("dfedavg", sporadicity={"sgd_prob": {"dist": "uniform", "lo": 0.1}}))
    d, _ = drawn.sporadic.probabilities(0)
    assert drawn.local_steps(0) == math.ceil(np.mean(1 / d)) > 1


@pytest.mark.parametrize("d, ceil, authors", [(0.5, 2, 3), (0.4, 3, 3), (1.0, 1, 2)])
def test_dfedavg_steps_ceil_vs_authors(d, ceil, authors):
    """D = ceil(mean 1/d_i); the authors' int(mean 1/d_i) + 1 differs when the mean is an integer."""
    fixed = {"sgd_prob": {"dist": "fixed", "value": d}}
    assert build(quadratic("dfedavg", sporadicity=fixed)).local_steps(0) == ceil
    algo = build(quadratic("dfedavg", sporadicity=fixed, algorithm={"dfedavg_steps": "authors"}))
    assert algo.local_steps(0) == authors
    assert [bool(algo.indicators(k)[1].all()) for k in range(authors + 1)] == [False] * authors + [True]


# ------------------------------------------------------------------------ end to end

def _load(path):
    with h5py.File(path, "r") as f:
        metrics = {k: f["metrics"][k][:] for k in f["metrics"] if k not in ("wall_time", "peak_rss_mb")}
        return f["final/params"][:], metrics, int(f.attrs["rounds_done"])


@pytest.mark.slow
@pytest.mark.mpi
def test_one_two_three_ranks_identical_and_file_layout(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic("dspodfl"))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = {n: subprocess.Popen(mpiexec(n) + [sys.executable, "-m", "fedmpi", "run", cfg, "--out",
                                               str(tmp_path / f"r{n}.h5"), "--quiet"],
                                 cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for n in (2, 3)}  # 3 ranks: uneven shards (3, 4, 4); both launches run side by side
    assert main(["run", cfg, "--out", str(tmp_path / "r1.h5"), "--quiet"]) == 0  # 1 rank, meanwhile, in-process
    for n, p in procs.items():
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, f"{n} ranks:\n{out}"
    params, metrics, done = _load(tmp_path / "r1.h5")
    assert 0 < done < 30  # max_delay stopped it
    for n in (2, 3):
        p, m, d = _load(tmp_path / f"r{n}.h5")
        assert d == done and np.array_equal(p, params), f"{n} ranks: final params differ"
        assert m.keys() == metrics.keys()
        for key in metrics:
            assert np.array_equal(m[key], metrics[key]), f"{n} ranks: {key} differs"

    path = str(tmp_path / "r1.h5")
    with h5py.File(path, "r") as f:
        topo = f["topology"]
        n_edges = topo["edges"].shape[0]
        assert topo["edges"].shape == (n_edges, 2) and topo["weights"].shape == topo["b"].shape == (n_edges,)
        assert topo["d"].shape == topo["degree"].shape == (11,)
        assert np.array_equal(np.bincount(topo["edges"][:].ravel(), minlength=11), topo["degree"][:])
    assert {"sim_delay", "sim_delay_processing", "sim_delay_transmission", "test_acc", "test_loss",
            "test_acc_avg_model", "consensus_error"} <= metrics.keys()
    delay = metrics["sim_delay"]
    assert delay[0] == 0 and np.all(np.diff(delay) > 0) and delay[-1] >= 40.0
    assert np.allclose(metrics["sim_delay_processing"] + metrics["sim_delay_transmission"], delay)
    png = str(tmp_path / "acc.png")
    assert main(["plot", path, "--metric", "test_acc", "--x", "sim_delay", "--out", png]) == 0
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_bad_topology_exit_2_one_line(tmp_path, capfd):
    cfg = write_config(tmp_path / "c.yaml", synthetic("dgd"))
    code = main(["run", cfg, "--set", "topology.radius=0.01", "--set", "topology.max_attempts=3"])
    err = capfd.readouterr().err
    assert code == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedmpi: error: topology.radius:"), err
