"""CUDA paths (skipped without a GPU; run by benchmarks/device_check.sh on a GPU machine)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import synthetic_config
from fedmpi import config
from fedmpi.config import TopologyConfig
from fedmpi.build import build_task
from fedmpi.decentral.exchange import Exchanger
from fedmpi.decentral.topology import build_graph
from fedmpi.engine.local import LocalTrainer
from fedmpi.models.dropout import KeyedDropout
from fedmpi.runtime.world import World, set_cuda_math

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def full_float32():
    """What a run does (runtime.tf32: false): no TF32 rounding in CUDA matmuls or convolutions."""
    set_cuda_math(False)


def test_dropout_masks_are_the_same_on_cuda_and_cpu():
    drop = KeyedDropout(0.3, salt=2).train()
    x = torch.ones(64, 300)
    key = {"key": torch.tensor(123456789)}
    cpu = torch.func.functional_call(drop, key, (x,))
    gpu = torch.func.functional_call(drop.to(CUDA), {"key": key["key"].to(CUDA)}, (x.to(CUDA),))
    assert torch.equal(gpu.cpu(), cpu)  # integer hashing: exact on both devices


def test_neighbor_sum_on_cuda_matches_cpu():
    g = build_graph(TopologyConfig(kind="rgg", radius=0.3), 60, 0)
    active = np.random.default_rng(0).random(g.num_edges) < 0.5
    x = torch.randn(60, 1000, generator=torch.Generator().manual_seed(0))
    cpu = Exchanger(World(), g).neighbor_sum(x, active)
    gpu = Exchanger(World(device=CUDA), g).neighbor_sum(x.to(CUDA), active)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=1e-5)


def test_dropout_keys_reach_the_model_on_cuda():
    """cinic_cnn on CUDA (batched, keys on the device): the same as on CPU up to conv rounding."""
    from helpers.images import image_trainer

    cpu = image_trainer("sequential")
    gpu = image_trainer("batched", device=CUDA)
    ids = np.array([0, 2, 3])
    x0 = cpu.spec.flatten(cpu.task.model).expand(len(ids), -1)
    torch.testing.assert_close(gpu.train(x0.to(CUDA), ids, t=1).cpu(), cpu.train(x0, ids, t=1), rtol=0, atol=1e-4)


def test_batched_training_on_cuda_does_not_depend_on_companions():
    cfg = config.from_dict(synthetic_config(task__model="mlp", task__hidden=32))
    task = build_task(cfg, CUDA)
    tr = LocalTrainer(task, cfg.train, cfg.seed, path="batched")
    ids = np.array([0, 3, 4, 7, 11])
    x0 = tr.spec.flatten(task.model).to(CUDA).expand(len(ids), -1)
    together = tr.train(x0, ids, t=1)
    for k in range(len(ids)):
        assert torch.equal(tr.train(x0[k:k + 1], ids[k:k + 1], t=1)[0], together[k])


def test_cuda_blocks_have_one_shape_whatever_the_cohort():
    """engine.shapes: every batched block on CUDA is padded to chunk_size rows."""
    cfg = config.from_dict(synthetic_config())
    tr = LocalTrainer(build_task(cfg, CUDA), cfg.train, cfg.seed, path="batched")
    seen = []
    block = tr._train_block
    tr._train_block = lambda x, ids, *a: (seen.append(x.shape[0]), block(x, ids, *a))
    x0 = tr.spec.flatten(tr.task.model).to(CUDA)
    for n in (1, 3, 7):
        tr.train(x0.expand(n, -1), np.arange(n), t=0)
    assert tr.fixed_shape and seen == [tr.chunk_size()] * 3


def test_the_world_of_a_run_sets_the_float32_precision():
    set_cuda_math(True)
    World.create("cuda")
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    World.create("cuda", tf32=True)
    assert torch.backends.cudnn.conv.fp32_precision == "tf32"


def test_ranks_sharing_a_gpu_split_its_free_memory():
    one, where1 = World(device=CUDA, ranks_on_device=1).free_memory()
    two, where2 = World(device=CUDA, ranks_on_device=2).free_memory()
    assert abs(two - one // 2) < 64 << 20  # free memory may move a little between the two reads
    assert "shared by 2 ranks" in where2 and "shared" not in where1


def test_local_ranks_beyond_the_gpu_count_bind_to_the_same_gpu():
    from fedmpi.runtime.world import _gpu_identity

    n = torch.cuda.device_count()
    assert _gpu_identity(0) == _gpu_identity(n)
    assert len({_gpu_identity(r) for r in range(n)}) == n


@pytest.mark.parametrize("model,train", [("logreg", {}), ("mlp", {"momentum": 0.9, "grad_clip": 1.0}),
                                         ("mlp", {"local_steps_draw": "uniform"})])
def test_cuda_graph_replays_give_the_step_loop_bits(model, train):
    """train.cuda_graphs (engine/graphs.py): captured once per shape, replayed every round with
    that round's inputs; the end models and losses equal the kernel-by-kernel loop bit for bit."""
    from fedmpi.engine.local import LocalStats

    over = {f"train__{k}": v for k, v in train.items()}
    cfg = config.from_dict(synthetic_config(task__model=model, task__hidden=32, **over))
    task = build_task(cfg, CUDA)
    plain = LocalTrainer(task, cfg.train, cfg.seed, path="batched")
    graphs = LocalTrainer(task, cfg.train, cfg.seed, path="batched", replay=True)
    assert graphs._graphs is not None and plain.fixed_shape
    x0 = plain.spec.flatten(task.model).to(CUDA)
    for t, ids in enumerate([np.array([0, 3, 4, 7, 11]), np.array([1, 2]), np.array([5, 6, 8, 9, 10, 0])]):
        stats = [LocalStats(), LocalStats()]
        a = plain.train(x0.expand(len(ids), -1), ids, t=t, stats=stats[0])
        b = graphs.train(x0.expand(len(ids), -1), ids, t=t, stats=stats[1])
        assert torch.equal(a, b)
        np.testing.assert_array_equal(stats[0].loss, stats[1].loss)
    assert not graphs._graphs.failed  # captured, not fallen back to the plain loop
    if "local_steps_draw" not in train:  # one shape: one graph, replayed every round
        assert graphs._graphs.captures == 1


def test_cuda_graph_replays_with_dropout_on_cuda():
    from helpers.images import image_trainer

    plain = image_trainer("batched", device=CUDA)
    graphs = image_trainer("batched", device=CUDA, replay=True)
    ids = np.array([0, 2, 3])
    x0 = plain.spec.flatten(plain.task.model).to(CUDA).expand(len(ids), -1)
    for t in range(3):
        assert torch.equal(plain.train(x0, ids, t=t), graphs.train(x0, ids, t=t))


@pytest.mark.parametrize("graphs", [False, True])
def test_packed_runs_get_their_own_bits_on_cuda(graphs):
    """engine.packed on CUDA: a packed group's blocks keep one run's padded shape, so each run of
    other seeds and algorithms gets the bits it gets alone (with and without train.cuda_graphs)."""
    from fedmpi.build import build_components
    from fedmpi.engine.packed import PackedTrainer

    world = World(device=CUDA)
    algos = [{"name": "fedavg_active"}, {"name": "mifa"}, {"name": "fedprox", "mu": 0.1}, {"name": "qffl", "q": 2.0}]
    cfgs = [config.from_dict(synthetic_config(seed=s, task__model="mlp", task__hidden=32, algorithm=a,
                                              train__local_steps_draw="uniform", train__cuda_graphs=graphs,
                                              runtime__device="cuda"))
            for s, a in enumerate(algos)]
    alone = [build_components(c, world) for c in cfgs]
    runs = [build_components(c, world) for c in cfgs]
    packed = PackedTrainer([r.trainer for r in runs])
    assert packed.block_rows() == runs[0].trainer.chunk_size() and packed.block.fixed_shape
    for t in range(4):
        for r in alone:
            r.algorithm.round(t)
        requests = [r.algorithm.begin_round(t) for r in runs]
        for r, q, end in zip(runs, requests, packed.train(list(enumerate(requests)))):
            r.algorithm.finish_round(q, end)
    for a, b in zip(alone, runs):
        assert torch.equal(a.algorithm.final_params(), b.algorithm.final_params())
