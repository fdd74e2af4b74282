"""Process set-up of runtime.World: host memory, the backend choice, staged communication."""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, fedmpi, mpiexec, synthetic_config, write_config
from fedmpi.errors import InputError
from fedmpi.runtime.world import (Backend, World, choose_backend, deciding_node, keep_freed_memory,
                                  set_cuda_math)


def test_set_cuda_math_sets_tf32_and_deterministic_convolutions():
    """runtime.tf32 (default false: full float32, as on CPU; torch's own default is TF32 convs)."""
    import torch

    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    new_api = hasattr(matmul, "fp32_precision")
    before = (matmul.fp32_precision, cudnn.conv.fp32_precision) if new_api else (matmul.allow_tf32, cudnn.allow_tf32)
    try:
        for on in (True, False):
            set_cuda_math(on)
            assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
            if new_api:
                assert (matmul.fp32_precision, cudnn.conv.fp32_precision) == (("tf32",) * 2 if on else ("ieee",) * 2)
            else:
                assert (matmul.allow_tf32, cudnn.allow_tf32) == (on, on)
    finally:
        if new_api:
            matmul.fp32_precision, cudnn.conv.fp32_precision = before
        else:
            matmul.allow_tf32, cudnn.allow_tf32 = before


def test_the_world_holds_only_its_last_communicated_tensors_until_close():
    """World._hold: gloo's worker thread must never free the last reference (an abort at exit
    on CUDA); the hold is bounded and ends at close."""
    import torch

    w = World()
    w._hold(*[torch.zeros(3) for _ in range(40)])
    assert len(w._held) == 4  # a few: the tensors of the last operation, not a history
    w.close()
    assert len(w._held) == 0


def test_keep_freed_memory_applies_on_glibc_and_can_be_turned_off(monkeypatch):
    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")
    monkeypatch.setenv("FEDMPI_MALLOC", "default")
    assert keep_freed_memory() is False


# ---------------------------------------------------------------- backend choice (pure)

@pytest.mark.parametrize("backend, device, ranks, gpus, want", [
    ("auto", "auto", 4, 0, ("cpu", "gloo", False)),    # no GPU: gloo on CPU
    ("auto", "cpu", 2, 4, ("cpu", "gloo", False)),     # CPU asked for on a GPU node
    ("gloo", "auto", 1, 0, ("cpu", "gloo", False)),
    ("auto", "auto", 2, 2, ("cuda", "nccl", False)),   # one GPU per rank: NCCL
    ("auto", "cuda", 2, 8, ("cuda", "nccl", False)),
    ("nccl", "auto", 4, 4, ("cuda", "nccl", False)),
    ("gloo", "cuda", 2, 2, ("cuda", "gloo", True)),    # gloo cannot send CUDA tensors: staged
    ("auto", "auto", 2, 1, ("cuda", "gloo", True)),    # ranks share a GPU: NCCL would refuse
    ("auto", "cuda", 8, 4, ("cuda", "gloo", True)),
    ("gloo", "auto", 3, 1, ("cuda", "gloo", True)),
])
def test_choose_backend(backend, device, ranks, gpus, want):
    got = choose_backend(backend, device, ranks, gpus)
    assert (got.device, got.name, got.staged) == want


def test_auto_says_in_one_line_why_ranks_sharing_a_gpu_use_gloo():
    note = choose_backend("auto", "auto", 2, 1).notice
    assert note.startswith("notice: 2 ranks share 1 GPU on a node") and "gloo" in note and "\n" not in note
    assert "slower than one rank per GPU (docs/GPUS.md)" in note  # what sharing costs, and where it is measured
    assert "8 ranks share 4 GPUs" in choose_backend("auto", "cuda", 8, 4).notice
    assert choose_backend("auto", "auto", 2, 2).notice == "" and choose_backend("auto", "auto", 2, 0).notice == ""


@pytest.mark.parametrize("backend, device, ranks, gpus, needle", [
    ("nccl", "auto", 2, 1, "runtime.backend: nccl needs one GPU per rank, but 2 ranks share 1 GPU on a node"),
    ("nccl", "cuda", 8, 4, "8 ranks share 4 GPUs on a node; use auto or gloo, or launch at most 4 ranks per node"),
    ("nccl", "auto", 2, 0, "runtime.backend: nccl needs CUDA devices"),
    ("nccl", "cpu", 1, 4, "runtime.backend: nccl needs CUDA devices"),
    ("auto", "cuda", 1, 0, "runtime.device: cuda requested but no CUDA device is available"),
])
def test_choose_backend_refuses_what_cannot_work(backend, device, ranks, gpus, needle):
    with pytest.raises(InputError, match=needle):
        choose_backend(backend, device, ranks, gpus)


@pytest.mark.parametrize("nodes, want", [
    ([(4, 4), (4, 4)], (4, 4)),
    ([(2, 2), (3, 2), (4, 1)], (3, 2)),   # the first node with more ranks than GPUs
    ([(2, 1), (2, 0)], (2, 0)),           # a node without GPUs puts everyone on CPU
    ([(1, 0)], (1, 0)),
])
def test_deciding_node(nodes, want):
    assert deciding_node(nodes) == want
    assert isinstance(choose_backend("auto", "auto", *deciding_node(nodes)), Backend)


# ---------------------------------------------------------------- real runs

@pytest.mark.slow
@pytest.mark.mpi
def test_nccl_without_cuda_is_exit_2_in_one_line(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(runtime={"backend": "nccl", "progress": False}))
    p = fedmpi(["run", cfg, "--out", str(tmp_path / "r.h5")], ranks=2, check=False, timeout=120)
    assert p.returncode == 2
    ours = [ln for ln in p.stderr.splitlines() if ln.startswith("fedmpi:")]
    assert ours == ["fedmpi: error: runtime.backend: nccl needs CUDA devices; use gloo (or auto) on CPU"]
    assert "Traceback" not in p.stderr and not (tmp_path / "r.h5").exists()


def _compare():
    spec = importlib.util.spec_from_file_location("compare_runs", Path(ROOT) / "benchmarks" / "compare_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.compare


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["fedswe", "dspodfl"])
def test_staged_two_ranks_match_one_rank_bitwise(tmp_path, algorithm):
    """FEDMPI_TEST_STAGED=1: every reduction, broadcast, gather and batch_isend_irecv goes through
    host copies, as with ranks sharing a GPU; the results keep their bits."""
    cfg = synthetic_config(rounds=6, task__clients=13, algorithm__name=algorithm)
    if algorithm == "dspodfl":
        cfg.update(availability={"kind": "always"}, topology={"kind": "rgg", "radius": 0.5})
    cfg = write_config(tmp_path / "c.yaml", cfg)
    one, two = str(tmp_path / "one.h5"), str(tmp_path / "two.h5")
    fedmpi(["run", cfg, "--out", one, "--quiet"])
    p = fedmpi(["run", cfg, "--out", two, "--quiet"], ranks=2, env={"FEDMPI_TEST_STAGED": "1"})
    assert "notice: FEDMPI_TEST_STAGED: tensors staged through host copies" in p.stderr.splitlines()
    same, line = _compare()(one, two)
    assert same, line


@pytest.mark.slow
@pytest.mark.mpi
def test_staged_exchange_is_bitwise_rank_independent(tmp_path):
    script = Path(ROOT) / "tests" / "mpi_scripts" / "exchange_check.py"
    env = dict(os.environ, FEDMPI_TEST_STAGED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    p = subprocess.run(mpiexec(3) + [sys.executable, str(script), str(tmp_path / "r.npz")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    spec = importlib.util.spec_from_file_location("exchange_check", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ref = mod.run(World())
    r = np.load(tmp_path / "r.npz")
    assert bool(r["staged"]) and r["loop_rows"].sum() > 0
    assert np.array_equal(r["final"], ref["final"])
    assert np.allclose(r["mean"], ref["mean"], rtol=0, atol=1e-6)


def _result(path, params, acc, status="completed"):
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs["status"] = status
        f["metrics/round"] = np.array([0, 5])
        f["metrics/test_acc"] = np.array(acc)
        f["metrics/wall_time"] = np.random.default_rng().random(2)  # timing: never compared
        f["final/params"] = np.array(params, dtype=np.float32)
    return str(path)


def test_compare_runs_bits_and_tolerance(tmp_path):
    compare = _compare()
    ref = _result(tmp_path / "a.h5", [1.0, -2.0], [0.1, 0.5])
    same = _result(tmp_path / "b.h5", [1.0, -2.0], [0.1, 0.5])
    assert compare(ref, same) == (True, "identical bits (metrics and final/params)")
    near = _result(tmp_path / "c.h5", [1.0, -2.001], [0.1, 0.505])
    ok, line = compare(ref, near)
    assert not ok and line.startswith("NOT identical")
    assert compare(ref, near, rtol=1e-3, metric_atol=0.01)[0]           # 0.001 <= 1e-3 * 2
    assert not compare(ref, near, rtol=1e-4, metric_atol=0.01)[0]
    assert not compare(ref, near, rtol=1e-3, metric_atol=0.001)[0]
    assert compare(ref, _result(tmp_path / "d.h5", [1.0, -2.0], [0.1, 0.5], "failed")) == \
        (False, f"{tmp_path / 'd.h5'}: status 'failed', not completed")


def test_memory_check_uses_the_worlds_share():
    from fedmpi import config
    from fedmpi.build import check_memory

    cfg = config.from_dict(synthetic_config(algorithm__name="mifa"))
    check_memory(cfg, World(), 100, 1000)  # 0.4 MB: fits
    with pytest.raises(InputError, match=r"mifa keeps 372\.5 GiB .* GiB host memory per rank available"):
        check_memory(cfg, World(), 100_000, 1_000_000)
    free, where = World(local_size=4).free_memory()
    assert where == "host memory per rank" and 0 < free < World().free_memory()[0]
