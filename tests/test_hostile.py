"""Hostile input: random configs and corrupt files end with exit 0 or 2 and one line, never a traceback."""

from __future__ import annotations

import gzip
import os

import h5py
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import synthetic_config
from fedmpi.cli import main

_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 50), st.sampled_from([10**12, -10**9, 2**70]),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
                    st.lists(st.integers(-1, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_keys = st.sampled_from([
    "seed", "eval_every", "task.clients", "task.partition.kind", "task.partition.alpha", "task.model",
    "task.synthetic.classes", "task.synthetic.features", "train.lr", "train.batch_size", "train.local_steps",
    "train.grad_clip", "train.global_lr", "train.lr_schedule", "algorithm.name", "algorithm.k",
    "availability.kind", "availability.size", "availability.base.kind", "availability.base.values",
    "availability.period", "availability.gamma", "availability.R", "availability.B", "runtime.device",
    "evaluation.batch_size", "task.x0", "unknown", "task.u"])
_rounds = st.sampled_from([-1, 0, 1, 2, "x", None, 1.5])


def _set(cfg: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    cur = cfg
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
        if not isinstance(cur, dict):
            return
    cur[keys[-1]] = value


def _run(tmp_path, capsys, cfg: dict, out=None) -> tuple[int, str]:
    """``fedmpi run`` of ``cfg`` in this process; the exit code and stderr, checked for one line."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code = main(["run", str(path), "--quiet", "--out", str(out or tmp_path / "r.h5")])
    err = capsys.readouterr().err
    _one_line_or_ok(code, err)
    return code, err


def _one_line_or_ok(code: int, err: str) -> None:
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code == 2:
        ours = [ln for ln in err.strip().splitlines() if not ln.startswith("notice:")]
        assert len(ours) == 1 and ours[0].startswith("fedmpi: error: "), err


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(_keys, _values, max_size=3), _rounds)
def test_random_configs(tmp_path, capsys, changes, rounds):
    cfg = synthetic_config(rounds=rounds, eval_every=1)
    cfg["task"]["synthetic"] = {"samples": 200, "test_samples": 50, "features": 4, "classes": 3}
    for k, v in changes.items():
        _set(cfg, k, v)
    path = tmp_path / "c.yaml"
    try:
        path.write_text(yaml.safe_dump(cfg))
    except (yaml.YAMLError, ValueError):
        return
    code = main(["run", str(path), "--quiet", "--out", str(tmp_path / "r.h5")])
    _one_line_or_ok(code, capsys.readouterr().err)


def _fmnist_root(tmp_path, damage: str) -> str:
    root = tmp_path / "fm"
    root.mkdir()
    import struct

    def idx(name, header, payload):
        with gzip.open(root / name, "wb") as fh:
            fh.write(header + payload)

    n = 20
    idx("train-images-idx3-ubyte.gz", struct.pack(">IIII", 2051, n, 28, 28), bytes(n * 784))
    idx("train-labels-idx1-ubyte.gz", struct.pack(">II", 2049, n), bytes(range(10)) * 2)
    idx("t10k-images-idx3-ubyte.gz", struct.pack(">IIII", 2051, n, 28, 28), bytes(n * 784))
    idx("t10k-labels-idx1-ubyte.gz", struct.pack(">II", 2049, n), bytes(range(10)) * 2)
    target = root / "train-images-idx3-ubyte.gz"
    if damage == "truncate":
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        target.write_bytes(b"not a gzip file at all")
    elif damage == "magic":
        with gzip.open(target, "wb") as fh:
            fh.write(struct.pack(">IIII", 1234, n, 28, 28) + bytes(n * 784))
    elif damage == "missing":
        os.remove(target)
    return str(root)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "magic", "missing"])
def test_corrupt_dataset_files(tmp_path, capsys, damage):
    root = _fmnist_root(tmp_path, damage)
    cfg = synthetic_config(rounds=1)
    cfg["task"].update(dataset="fmnist", root=root, clients=4, cache_dir=str(tmp_path / "cache"))
    code, err = _run(tmp_path, capsys, cfg)
    assert code == 2 and "train-images-idx3-ubyte" in err


@pytest.mark.parametrize("content", [b"", b"\x89HDF\r\n\x1a\n" + b"\x00" * 100, b"plain text"])
def test_corrupt_result_files(tmp_path, capsys, content):
    p = tmp_path / "bad.h5"
    p.write_bytes(content)
    for args in (["info", str(p)], ["plot", str(p), "--out", str(tmp_path / "f.png")]):
        code = main(args)
        err = capsys.readouterr().err
        _one_line_or_ok(code, err)
        assert code == 2 and "bad.h5" in err


def test_corrupt_trace_file(tmp_path, capsys):
    trace = tmp_path / "trace.txt"
    trace.write_text("0 1\n2 banana\n")
    cfg = synthetic_config(rounds=2, availability={"kind": "trace", "trace": str(trace), "trace_format": "ids"})
    code, err = _run(tmp_path, capsys, cfg)
    assert code == 2 and "trace" in err


def test_bad_inline_schedule(tmp_path, capsys):
    cfg = synthetic_config(rounds=2, availability={"kind": "trace", "schedule": [[0, 1], [2, 99]]})
    code, err = _run(tmp_path, capsys, cfg)
    assert code == 2 and "availability.schedule: round 1: client id 99" in err


def test_inline_schedule_runs(tmp_path, capsys):
    cfg = synthetic_config(rounds=3, availability={"kind": "trace", "schedule": [[0, 1], [], [5]]},
                           runtime={"log_availability": True})
    code, err = _run(tmp_path, capsys, cfg)
    assert code == 0, err
    with h5py.File(tmp_path / "r.h5", "r") as f:
        assert [np.flatnonzero(row).tolist() for row in f["availability/mask"][:]] == [[0, 1], [], [5]]


def test_unwritable_output(tmp_path, capsys):
    cfg = synthetic_config(rounds=1)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, err = _run(tmp_path, capsys, cfg, out=blocker / "sub" / "r.h5")
    assert code == 2 and "r.h5" in err


def test_memory_estimate_refuses_huge_tables(tmp_path, capsys, monkeypatch):
    from fedmpi.registry import ALGORITHMS

    monkeypatch.setattr(ALGORITHMS.get("fedavg_active").obj, "client_rows", 10**9)
    cfg = synthetic_config(rounds=1)
    code, err = _run(tmp_path, capsys, cfg)
    assert code == 2 and "GiB" in err and "algorithm.name" in err


def test_huge_synthetic_dataset_is_refused_up_front(tmp_path, capsys):
    """Found by test_random_configs: 10^12 classes once ended in a MemoryError traceback."""
    cfg = synthetic_config(rounds=1)
    cfg["task"]["synthetic"] = {"classes": 10**12}
    code, err = _run(tmp_path, capsys, cfg)
    assert code == 2 and "task.synthetic" in err and "GiB" in err
