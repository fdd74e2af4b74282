"""Hostile input: random configs and corrupt files end with exit 0 or 2 and one line, never a traceback."""

from __future__ import annotations

import gzip
import json
import os

import h5py
import numpy as np
import pytest
import torch
import yaml

from conftest import synthetic_config
from fedmpi import checkpoint
from fedmpi.cli import main
from fedmpi.errors import InputError
from fedmpi.runtime import World
from fedmpi.state import State
from helpers.properties import HealthCheck, given, settings, st

_HUGE = [10**12, -10**9, 2**70, 10**23, 2**63, 2**64 - 1, 1e300, -1e300]
_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 50), st.sampled_from(_HUGE),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
                    st.lists(st.integers(-1, 3), max_size=3),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_keys = st.sampled_from([
    "seed", "eval_every", "task.clients", "task.partition.kind", "task.partition.alpha", "task.model",
    "task.synthetic.classes", "task.synthetic.features", "train.lr", "train.batch_size", "train.local_steps",
    "train.grad_clip", "train.global_lr", "algorithm.global_lr", "train.lr_schedule", "algorithm.name", "algorithm.k",
    "availability.kind", "availability.size", "availability.base.kind", "availability.base.values",
    "availability.period", "availability.gamma", "availability.R", "availability.B", "runtime.device",
    "evaluation.batch_size", "task.x0", "unknown", "task.u", "runtime.threads", "task.hidden",
    "availability.base.phi_max", "availability.schedule", "train.augment"])
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
    """Exit 0, or 2 (bad input) / 4 (diverged, e.g. lr: 1e300) with one line on stderr."""
    assert code in (0, 2, 4), err
    assert "Traceback" not in err
    if code in (2, 4):
        ours = [ln for ln in err.strip().splitlines() if not ln.startswith("notice:")]
        prefix = "fedmpi: error: " if code == 2 else "fedmpi: diverged: "
        assert len(ours) == 1 and ours[0].startswith(prefix), err


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


# -------------------------------------------------------------------------- YAML text: nesting, aliases, huge numbers

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 30), st.sampled_from(_HUGE + [float("nan")]),
                     st.text("abc01:e.-", max_size=5))
_nested = st.recursive(_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text("abxy", max_size=2), c,
                                                                                         max_size=3), max_leaves=12)


def _flow(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip().removesuffix("...").strip()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=_keys, value=_nested, depth=st.sampled_from([0, 3, 63, 70, 3000]),
       bomb=st.one_of(st.none(), st.tuples(st.integers(1, 7), st.integers(1, 9))),
       kind=st.sampled_from(["trace", "stationary"]))
def test_random_yaml_text(tmp_path, capsys, key, value, depth, bomb, kind):
    """Config text with deep nesting, anchors/aliases and huge numbers: exit 0 or 2 and one line."""
    cfg = synthetic_config(rounds=1, eval_every=1, availability={"kind": kind})
    cfg["task"]["synthetic"] = {"samples": 200, "test_samples": 50, "features": 4, "classes": 3}
    text = "[" * depth + _flow(value) + "]" * depth
    if bomb:
        levels, width = bomb
        rows = [f"&b0 [{', '.join(['0'] * width)}]"]
        rows += [f"&b{i} [{', '.join([f'*b{i - 1}'] * width)}]" for i in range(1, levels)]
        text = f"[{', '.join(rows)}, {text}]"
    _set(cfg, key, "__VALUE__")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg).replace("__VALUE__", text, 1))
    code = main(["run", str(tmp_path / "c.yaml"), "--quiet", "--out", str(tmp_path / "r.h5")])
    _one_line_or_ok(code, capsys.readouterr().err)


# ----------------------------------------------------------------------------- checkpoint manifests

_json_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 20), st.sampled_from(_HUGE[:6]),
                         st.text(max_size=8), st.lists(st.integers(0, 3), max_size=3),
                         st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_manifest_fields = st.sampled_from(["round", "config_digest", "world_size", "m", "fedmpi_version", "shards",
                                    "manifest_sha256", "new", "shards.0.rank", "shards.0.lo", "shards.0.hi",
                                    "shards.0.file", "shards.0.sha256", "shards.0.new"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=_manifest_fields, value=_json_values, drop=st.booleans(), reseal=st.booleans())
def test_random_manifest_fields(tmp_path_factory, field, value, drop, reseal):
    """A manifest with any field changed, removed or added (checksum recomputed or not): it loads
    the same state, or it is refused in one line naming the manifest."""
    folder = str(tmp_path_factory.mktemp("ck"))
    m = 6
    rows = torch.arange(m * 2, dtype=torch.float32).view(m, 2)
    state = State(shared={"x": torch.ones(3)}, clients={"t": rows})
    checkpoint.save(World(), folder, 8, "abc", m, {"algorithm": state})
    path = folder + "/manifest.json"
    man = json.load(open(path))
    *outer, last = field.split(".")
    target = man
    for k in outer:
        target = target[int(k)] if isinstance(target, list) else target[k]
    if drop:
        target.pop(last, None)
    else:
        target[last] = value
    if reseal:
        man["manifest_sha256"] = checkpoint._manifest_sha256(man)
    with open(path, "w") as fh:
        json.dump(man, fh)
    try:
        rounds, parts = checkpoint.load(World(), folder, "abc", m)
    except InputError as e:
        assert str(e).startswith(f"{path}: ") and "\n" not in str(e), str(e)
        return
    assert rounds == 8 and torch.equal(parts["algorithm"].clients["t"], rows)  # only a no-op change may load


# ----------------------------------------------------------------------------- the campaign's cases

@pytest.mark.parametrize("changes, expected", [
    ({"availability.kind": "trace", "availability.schedule": [[0, 10**23]]},
     "availability.schedule: round 0: client id 100000000000000000000000 outside [0, 12)"),
    ({"availability.base.kind": "dirichlet_phi", "availability.base.phi_max": ["a", "b"]},
     "availability.base.phi_max: needs 4 numbers"),
    ({"runtime.threads": 1099511627776}, "runtime.threads: must be <= 1024"),
    ({"train.batch_size": 2000000000}, "train.batch_size: a local step of 8 clients x 2000000000 samples needs"),
    ({"task.model": "mlp", "task.hidden": 10**6}, "task.model: mlp has"),
    ({"train.augment": ["crop", "flip"]}, "train.augment: crop, flip need image data"),
    ({"task.clients": 2**63}, "task.clients: must be < 2^63"),
    ({"train.local_steps_draw": "lognormal", "train.local_steps_sigma": 1e308, "task.clients": 100},  # #44: a warning
     "train.local_steps_sigma: must be <= 100, got 1e+308"),
])
def test_campaign_cases(tmp_path, capsys, changes, expected):
    """Each of these ended in a traceback (or, for train.augment, was silently ignored)."""
    cfg = synthetic_config(rounds=1)
    for k, v in changes.items():
        _set(cfg, k, v)
    code, err = _run(tmp_path, capsys, cfg)
    assert code == 2 and expected in err, err


@pytest.mark.parametrize("content, expected", [
    ("0 1\n2 100000000000000000000000\n", "line 2: client id 100000000000000000000000 outside [0, 12)"),
    ("[" * 5000 + "]" * 5000, "JSON nested 5000 levels deep, more than the 64 allowed"),
    ('{"1": [[0, 2]], "1": [[3, 4]]}', "duplicate key '1'"),
])
def test_hostile_trace_files(tmp_path, capsys, content, expected):
    trace = tmp_path / ("t.json" if content[0] in "[{" else "t.txt")
    trace.write_text(content)
    cfg = synthetic_config(rounds=2, availability={"kind": "trace", "trace": str(trace)})
    code, err = _run(tmp_path, capsys, cfg)
    assert code == 2 and expected in err and str(trace) in err, err


@pytest.mark.parametrize("damage", ["no_round", "group_metric", "text_metric", "2d_metric", "scalar_round"])
def test_info_on_damaged_result_files(tmp_path, capsys, damage):
    """An HDF5 file with a damaged /metrics made `fedmpi info` print a traceback."""
    out = tmp_path / "r.h5"
    assert _run(tmp_path, capsys, synthetic_config(rounds=2), out=out)[0] == 0
    with h5py.File(out, "a") as f:
        g = f["metrics"]
        name = "round" if damage in ("no_round", "scalar_round") else "test_acc"
        del g[name]
        if damage == "group_metric":
            g.create_group(name)
        elif damage == "text_metric":
            g.create_dataset(name, data=np.array([b"x"] * 2))
        elif damage == "2d_metric":
            g.create_dataset(name, data=np.zeros((2, 3)))
        elif damage == "scalar_round":
            g.create_dataset(name, data=5)
    code = main(["info", str(out)])
    err = capsys.readouterr().err
    _one_line_or_ok(code, err)
    assert code == 2 and f"fedmpi: error: {out}: " in err
