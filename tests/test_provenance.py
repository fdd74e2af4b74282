"""Provenance (fedmpi.provenance): result files know the code and data that made them; a sweep
cell whose plug-in or data file changed is outdated, and a dataset cache is keyed by content."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
import yaml

from conftest import cli, fedmpi, write_config
from fedmpi import config, plugins, provenance
from fedmpi.data.datasets import dataset_arrays
from fedmpi.registry import DATASETS

PLUGIN = '''
from dataclasses import dataclass
import numpy as np
from fedmpi.data.arrays import DataArrays
from fedmpi.data.datasets import DatasetParams, register_dataset
from fedmpi.metrics import register_metric
from fedmpi.schema import opt


@dataclass
class CsvParams(DatasetParams):
    csv: str = opt("", "features..., label per line")


@register_dataset("prov_csv", params=CsvParams, cache=True)
def prov_csv(cfg):
    a = np.loadtxt(cfg.task.csv, delimiter=",", dtype=np.float32)
    x, y = a[:, :-1], a[:, -1].astype(np.int64)
    return DataArrays(x, y, x, y, 2)


@register_metric("acc_gap", clients=True)
def acc_gap(m):
    return float(np.nanmax(m.clients["acc"]) - np.nanmin(m.clients["acc"]))
'''


def _csv(path, seed: int) -> str:
    r = np.random.default_rng(seed)
    x = r.normal(size=(120, 3))
    np.savetxt(path, np.c_[x, (x[:, seed % 3] > 0).astype(int)], delimiter=",", fmt="%+.6f")
    return str(path)


def test_fingerprints_see_content_not_time(tmp_path, monkeypatch):
    p = tmp_path / "f.bin"
    p.write_bytes(b"a" * 1000)
    fp = provenance.fingerprint(str(p))
    os.utime(p, ns=(1, 1))  # touched only
    assert not provenance.file_changed(str(p), fp)
    p.write_bytes(b"b" * 1000)
    assert provenance.file_changed(str(p), fp)
    assert provenance.file_changed(str(tmp_path / "gone"), fp)
    monkeypatch.setattr(provenance, "FULL_HASH_BYTES", 4096)  # a "large" file: sampled blocks
    monkeypatch.setattr(provenance, "BLOCK", 256)
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(100_000))
    before = provenance.fingerprint(str(big))
    data = bytearray(100_000)
    data[-1] = 1  # in the last block, which is always read
    big.write_bytes(bytes(data))
    assert provenance.file_changed(str(big), before)


def test_the_dataset_cache_never_serves_a_regenerated_file(tmp_path):
    path = tmp_path / "plug.py"
    path.write_text(PLUGIN)
    plugins.load([str(path)])
    try:
        csv = _csv(tmp_path / "d.csv", 0)
        cfg = config.from_dict({"task": {"dataset": "prov_csv", "csv": csv, "clients": 4, "model": "logreg",
                                         "cache_dir": str(tmp_path / "cache")}})
        first = dataset_arrays(cfg)
        st = os.stat(csv)
        _csv(csv, 1)  # same path, same size (fixed format), same time: only the content differs
        os.utime(csv, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.path.getsize(csv) == st.st_size
        again = dataset_arrays(cfg)
        assert not np.array_equal(first.y_train, again.y_train)
        assert len(os.listdir(tmp_path / "cache")) == 2
    finally:
        DATASETS._entries.pop("prov_csv", None)
        from fedmpi.registry import METRICS
        METRICS._entries.pop("acc_gap", None)
        plugins._done.discard(str(path))


@pytest.mark.slow
def test_sweep_cells_outdated_by_a_plugin_or_data_change(tmp_path):
    plug = tmp_path / "plug.py"
    plug.write_text(PLUGIN)
    csv = _csv(tmp_path / "d.csv", 0)
    write_config(tmp_path / "base.yaml", {
        "rounds": 4, "eval_every": 2, "runtime": {"progress": False},
        "task": {"dataset": "prov_csv", "csv": csv, "clients": 4, "model": "logreg",
                 "cache_dir": str(tmp_path / "cache"), "partition": {"local_test": 0.2}},
        "train": {"local_steps": 2, "batch_size": 8, "lr": 0.1}, "evaluation": {"metrics": ["acc_gap"]}})
    sweep = tmp_path / "s.sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": "base.yaml", "out": str(tmp_path / "out"),
                                     "variants": [{"algorithm.name": "fedavg_active"}, {"algorithm.name": "fedswe"}],
                                     "grid": {"seed": [0]}}))
    fedmpi(["sweep", str(sweep), "--plugin", str(plug), "--quiet"])
    table = fedmpi(["table", str(sweep), "--metric", "acc_gap", "--rounds-to", "test_acc=0.5"],
                   env={"FEDMPI_PLUGINS": str(plug)}).stdout
    assert "acc_gap" in table and "fedavg_active" in table and "fedswe" in table
    status = lambda: fedmpi(["sweep", str(sweep), "--status", "--plugin", str(plug)]).stdout  # noqa: E731
    assert "2 cells: 2 done" in status()
    cell = next(p for p in (tmp_path / "out").rglob("*.h5"))
    with h5py.File(cell) as f:
        assert json.loads(f.attrs["inputs"])[csv]["size"] == os.path.getsize(csv)
        assert [p["path"] for p in json.loads(f.attrs["plugins"]).values()] == [str(plug)]
        assert f.attrs["fedmpi_source"] == provenance.fedmpi_source()
    info = cli(["info", str(cell)])  # reads the plug-in's record without loading it: in this process
    assert info.returncode == 0 and "changed since: nothing" in info.stdout, info.stderr

    plug.write_text(PLUGIN + "# a bug fix\n")
    out = status()
    assert "2 outdated" in out and "(plug-in plug.py changed)" in out
    plug.write_text(PLUGIN)  # the same source again: the results are current
    assert "2 cells: 2 done" in status()
    _csv(csv, 1)
    out = status()
    assert "2 outdated" in out and "(data d.csv changed)" in out
    info = cli(["info", str(cell)])
    assert info.returncode == 0 and "changed since: data d.csv changed" in info.stdout, info.stderr
    p = fedmpi(["sweep", str(sweep), "--plugin", str(plug), "--quiet"], check=False)
    assert p.returncode == 2 and "data d.csv changed" in p.stderr


@pytest.mark.slow
def test_refusing_another_experiment_names_the_keys_that_differ(tmp_path):
    from conftest import synthetic_config

    a = config.from_dict(synthetic_config())
    b = config.from_dict(synthetic_config(train__lr=0.3, seed=4, rounds=99))  # rounds: not part of the experiment
    assert a.resume_differences(b) == ["seed", "train.lr"]
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=9, runtime={"checkpoint_every": 2}))
    import fault_plugin

    out = str(tmp_path / "r.h5")
    fedmpi(["run", cfg, "--out", out, "--quiet"], check=False, env=fault_plugin.env("0:5:kill"))
    p = cli(["run", cfg, "--out", out, "--set", "train.lr=0.3", "--set", "task.clients=10"])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "another experiment (differs in task.clients, train.lr)" in p.stderr
    os.rename(out, out + ".keep")  # without the result file, the checkpoint itself refuses, naming the keys
    p = cli(["run", cfg, "--out", out, "--set", "train.lr=0.3"])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "different config" in p.stderr and "differs in train.lr)" in p.stderr


def test_fedmpi_source_changes_show_in_info_only():
    attrs = {"fedmpi_source": "0" * 32, "fedmpi_version": "0.0.1", "plugins": "{}", "inputs": "{}"}
    assert provenance.outdated(attrs) is None  # a sweep's cells stay done across fedmpi updates
    assert provenance.outdated(attrs, fedmpi=True) == "fedmpi source (was 0.0.1) changed"
    assert provenance.outdated({"status": "completed"}) is None  # a file of an older fedmpi
