"""Federated LoRA runs from a config and ``fedmpi run``: the same bits on 1, 2 and 3 ranks, after a
kill -9 and a resume on another number of ranks, and in a packed sweep; checkpoints hold the
adapters' rows, never the frozen base; the per-client perplexity and accuracy arrays; the run
log's memory line; the shipped configs run."""

from __future__ import annotations

import glob
import os

import h5py
import numpy as np
import pytest
import torch
import yaml

import fault_plugin
from conftest import ROOT, fedmpi, write_config
from helpers.text import text_config
from fedmpi import config
from fedmpi.build import build_components
from fedmpi.checkpointer import Checkpointer
from fedmpi.engine.params import frozen
from fedmpi.runtime import World

ROUNDS = 4


def _config(tmp_path, **over) -> str:
    cfg = text_config(True, rounds=ROUNDS, eval_every=2, algorithm={"name": "scaffold"},
                      availability={"kind": "cohort", "size": 5}, evaluation={"clients": {"arrays": True}},
                      runtime={"progress": False, "checkpoint_every": 2}, **over)
    return write_config(tmp_path / "lm.yaml", cfg)


def _same(a: str, b: str) -> None:
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert fa.attrs["status"] == fb.attrs["status"] == "completed"
        for k in fa["metrics"]:
            if k not in ("wall_time", "peak_rss_mb"):
                assert np.array_equal(fa["metrics"][k][:], fb["metrics"][k][:], equal_nan=True), k
        for k in fa.get("clients", {}):
            assert np.array_equal(fa["clients"][k][:], fb["clients"][k][:], equal_nan=True), k
        assert np.array_equal(fa["final/params"][:], fb["final/params"][:])


@pytest.mark.slow
@pytest.mark.mpi
def test_lora_runs_give_the_same_bits_on_1_2_3_ranks_and_after_a_kill(tmp_path):
    cfg = _config(tmp_path)
    one, two, three, cut = (str(tmp_path / f"{n}.h5") for n in ("one", "two", "three", "cut"))
    p = fedmpi(["run", cfg, "--out", one])
    assert "notice: memory: " in p.stderr and "frozen base" in p.stderr and "blocks of" in p.stderr
    fedmpi(["run", cfg, "--out", two, "--quiet"], ranks=2)
    fedmpi(["run", cfg, "--out", three, "--quiet"], ranks=3)
    killed = fedmpi(["run", cfg, "--out", cut, "--quiet"], check=False, env=fault_plugin.env("0:3:kill"))
    assert killed.returncode != 0
    shards = glob.glob(cut + ".ckpt/round-*/shard-*.pt")
    assert shards
    with h5py.File(one, "r") as f:
        d = f["final/params"].shape[0]
        names = set(f["metrics"])
        ppl = f["clients/ppl"][:]
        loss = f["clients/loss"][:]
        assert {"test_ppl", "train_ppl", "client_ppl_p50", "test_acc"} <= names
        assert np.allclose(ppl[np.isfinite(loss)], np.exp(loss[np.isfinite(loss)]))
        assert np.array_equal(f["metrics/test_ppl"][:], np.exp(f["metrics/test_loss"][:]))
    for path in shards:  # the adapters' rows (SCAFFOLD's c_i) and server state: d wide, no base
        for k, v in torch.load(path, weights_only=True).items():
            assert v.dim() == 0 or v.shape[-1] in (d,) or v.numel() < d, (k, tuple(v.shape))
    fedmpi(["run", cfg, "--out", cut, "--quiet"], ranks=2)  # resumes by itself, on 2 ranks
    for other in (two, three, cut):
        _same(one, other)


@pytest.mark.slow
def test_a_packed_sweep_of_lora_runs_equals_them_one_by_one(tmp_path, capsys):
    """Cells over one base (one seed) pack into one program and share the base; other seeds are
    other bases, trained in blocks of their own; each cell gets its bits alone."""
    from fedmpi.cli import main
    from fedmpi.results import sweepfile

    base = text_config(True, rounds=3, eval_every=3)
    write_config(tmp_path / "base.yaml", base)
    spec = {"base": "base.yaml", "out": str(tmp_path / "s"),
            "variants": [{"label": "avg", "algorithm.name": "fedavg_active"},
                         {"label": "prox", "algorithm.name": "fedprox", "algorithm.mu": 0.1},
                         {"label": "adam", "algorithm.name": "fedadam", "algorithm.global_lr": 0.01},
                         {"label": "lr", "algorithm.name": "fedavg_active", "train.lr": 0.1}],
            "grid": {"seed": [0, 1]}}
    packed = tmp_path / "p.sweep.yaml"
    packed.write_text(yaml.safe_dump(spec, sort_keys=False))
    alone = tmp_path / "a.sweep.yaml"
    alone.write_text(yaml.safe_dump({**spec, "out": str(tmp_path / "a")}, sort_keys=False))
    assert main(["sweep", str(packed), "--pack", "8", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "trains apart from [1/8 avg/seed=0]: they differ in task.model (frozen base)" in err
    assert main(["sweep", str(alone), "--quiet"]) == 0
    for a, b in zip(sweepfile.load(str(packed)).cells, sweepfile.load(str(alone)).cells):
        _same(b.path, a.path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["shakespeare_lora", "shakespeare_full"])
def test_the_shipped_configs_run(tmp_path, name):
    """configs/llm/ on the embedded default (or its synthetic stand-in without the plays): two
    short rounds from the command line."""
    path = os.path.join(ROOT, "configs", "llm", f"{name}.yaml")
    sets = ["rounds=1", "eval_every=1", "task.clients=4", "availability.size=2", "train.local_steps=1",
            "evaluation.train=false", "evaluation.clients.enabled=false", "evaluation.clients.arrays=false",
            "task.shakespeare.plays=[hamlet]"]
    out = str(tmp_path / "r.h5")
    fedmpi(["run", path, "--out", out, "--quiet"] + [a for s in sets for a in ("--set", s)], timeout=600)
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "completed" and np.isfinite(f["metrics/test_ppl"][:]).all()


def test_a_lora_runs_base_never_changes_and_its_client_rows_are_the_adapters(tmp_path):
    """MIFA keeps a row per client: with LoRA a row is the adapters (lora_A and lora_B, nothing of
    the base); the frozen base keeps its bits over the rounds; the checkpoint's tensors are rows of
    that width or the server's, none as wide as the model and none a base weight; a resumed run
    ends with the same bits."""
    cfg = config.from_dict(text_config(True, rounds=4, algorithm={"name": "mifa"}))
    world = World()
    run = build_components(cfg, world)
    spec = run.trainer.spec
    assert spec.names and all(".lora_A." in n or ".lora_B." in n for n in spec.names)
    base = {k: v.detach().clone() for k, v in frozen(run.task.model).items()}
    everything = sum(v.numel() for v in base.values()) + spec.dim
    for t in range(4):
        run.algorithm.round(t)
    final = run.algorithm.final_params()
    assert final.shape == (spec.dim,)
    assert all(torch.equal(v, base[k]) for k, v in frozen(run.task.model).items())
    cut = build_components(cfg, world)
    for t in range(2):
        cut.algorithm.round(t)
    path = str(tmp_path / "r.h5")
    Checkpointer(cut, path).save(2, 0.0)
    state = cut.algorithm.state_dict()
    rows = [v for v in state.clients.values() if torch.is_tensor(v) and v.dim() == 2]
    assert rows and {tuple(v.shape) for v in rows} == {(cfg.task.clients, spec.dim)}
    shards = glob.glob(path + ".ckpt/round-*/shard-*.pt")
    assert shards
    for shard in shards:
        for k, v in torch.load(shard, weights_only=True).items():
            if torch.is_tensor(v) and v.dim() > 0:
                assert v.shape[-1] <= spec.dim < everything, (k, v.shape)
                assert not any(v.shape == b.shape and torch.equal(v, b) for b in base.values()), k
    resumed = build_components(cfg, world)
    assert Checkpointer(resumed, path, required=True).rounds_done == 2
    for t in range(2, 4):
        resumed.algorithm.round(t)
    assert torch.equal(resumed.algorithm.final_params(), final)
