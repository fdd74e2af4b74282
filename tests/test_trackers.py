"""Run trackers beside TensorBoard (results/sidecars.py): Weights & Biases (offline: no account)
and MLflow (a local store), one tracker run per result file, the config as parameters, rank 0
only, and a killed-and-resumed run continuing the same tracker run."""

from __future__ import annotations

import os
import signal

import h5py
import numpy as np
import pytest
import yaml

import fault_plugin
from conftest import fedmpi, mpiexec, synthetic_config, write_config
from fedmpi.cli import main
from fedmpi.results import sidecars


def _env(tmp_path) -> dict:
    """W&B offline, everything it writes inside the test's folder; no login anywhere."""
    return {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
            "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
            "WANDB_DATA_DIR": str(tmp_path / "wandb-data"), "WANDB_API_KEY": ""}


def _config(tmp_path, **runtime) -> str:
    return write_config(tmp_path / "c.yaml", synthetic_config(
        rounds=9, eval_every=1, runtime={"progress": False, "checkpoint_every": 4, **runtime}))


def _trackers(path) -> dict:
    with h5py.File(path) as f:
        return yaml.safe_load(f.attrs["trackers"])


@pytest.mark.parametrize("key, package", [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_tracker_without_its_package_is_one_line(tmp_path, capsys, monkeypatch, key, package):
    real = sidecars.importlib.util.find_spec
    monkeypatch.setattr(sidecars.importlib.util, "find_spec", lambda name: None if name == package else real(name))
    cfg = _config(tmp_path, **{key: "proj" if key == "wandb" else str(tmp_path / "mlruns")})
    assert main(["run", cfg, "--out", str(tmp_path / "r.h5"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fedmpi: error: runtime.{key}: needs the {package} package (pip install 'fedmpi[{package}]'), "
                   f"or set it to null"], err
    assert not os.path.exists(tmp_path / "r.h5")  # refused before a result file was made


def test_wandb_online_without_a_login_is_one_line_not_a_prompt(tmp_path, capsys, monkeypatch):
    """wandb.init without a login prompts for one on a terminal (and fails without): refused first."""
    pytest.importorskip("wandb")
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    cfg = _config(tmp_path, wandb="proj")
    assert main(["run", cfg, "--out", str(tmp_path / "r.h5"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runtime.wandb: no W&B login" in err[0] and "WANDB_MODE=offline" in err[0], err
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert sidecars._wandb_credentials()
    monkeypatch.setenv("WANDB_MODE", "offline")
    sidecars.WandbTracker.check()  # offline: no login needed


def test_mlflow_targets(tmp_path):
    assert sidecars.mlflow_uri("http://host:5000") == "http://host:5000"
    assert sidecars.mlflow_uri("sqlite:///x.db") == "sqlite:///x.db"
    assert sidecars.mlflow_uri("runs/mlflow.db") == f"sqlite:///{os.path.abspath('runs/mlflow.db')}"
    assert sidecars.mlflow_uri("mlruns") == f"file://{os.path.abspath('mlruns')}"


@pytest.mark.slow
def test_a_killed_and_resumed_run_continues_the_same_tracker_runs(tmp_path, monkeypatch):
    """One W&B run and one MLflow run per result file: the config as parameters, every evaluation
    at step = round; killed at round 6 and resumed from its round-4 checkpoint, the run continues
    both (the same W&B id in both offline pieces, the same MLflow run, FINISHED), the rounds run
    again logged again with the same values; --overwrite starts new ones."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # to read the folder store back here
    from helpers.trackers import mlflow_history, mlflow_runs, wandb_offline_runs

    store = tmp_path / "mlruns"
    cfg, out, env = _config(tmp_path, wandb="fedmpi-test", mlflow=str(store)), tmp_path / "r.h5", _env(tmp_path)
    p = fedmpi(["run", cfg, "--out", str(out)], check=False, env={**env, **fault_plugin.env("0:6:kill")})
    assert p.returncode == -signal.SIGKILL, p.stderr
    first = _trackers(out)  # recorded at the checkpoint, before the kill
    fedmpi(["run", cfg, "--out", str(out), "--quiet"], env=env)
    assert _trackers(out) == first
    wandb_id, run_id, uri = first["wandb"]["id"], first["mlflow"]["run_id"], first["mlflow"]["tracking_uri"]
    with h5py.File(out) as f:
        rounds, acc = list(f["metrics/round"][:]), f["metrics/test_acc"][:]
        config = yaml.safe_load(f.attrs["config"])
    pieces = wandb_offline_runs(str(tmp_path / "wandb"))
    assert [r["file_id"] for r in pieces] == [wandb_id, wandb_id]  # the killed piece and its continuation
    last = pieces[-1]
    assert last["id"] == wandb_id and last["project"] == "fedmpi-test" and first["wandb"]["mode"] == "offline"
    assert last["config"]["train"] == config["train"] and last["config"]["seed"] == 3
    assert [r["round"] for r in last["rows"]] == rounds == list(range(10))
    assert np.allclose([r["test_acc"] for r in last["rows"]], acc)
    runs = mlflow_runs(uri)
    assert [r.info.run_id for r in runs] == [run_id] and runs[0].info.status == "FINISHED"
    params = runs[0].data.params
    assert params["train.lr"] == "0.1" and params["task.clients"] == "12" and params["seed"] == "3"
    history = mlflow_history(uri, run_id, "test_acc")
    assert sorted({s for s, _ in history}) == rounds
    assert dict(history) == dict(zip(rounds, acc))  # the rounds 5, 6 run again: the same values
    assert [s for s, _ in history].count(5) == 2 and [s for s, _ in history].count(3) == 1
    fedmpi(["run", cfg, "--out", str(out), "--quiet", "--overwrite"], env=env)
    fresh = _trackers(out)
    assert fresh["wandb"]["id"] != wandb_id and fresh["mlflow"]["run_id"] != run_id
    assert len(mlflow_runs(uri)) == 2


@pytest.mark.slow
@pytest.mark.mpi
def test_trackers_log_from_rank_0_only(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    import subprocess
    import sys

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from conftest import ROOT
    from helpers.trackers import mlflow_runs, wandb_offline_runs

    cfg, out = _config(tmp_path, wandb="fedmpi-test", mlflow=str(tmp_path / "mlruns")), tmp_path / "r.h5"
    env = dict(os.environ, PYTHONPATH=ROOT, **_env(tmp_path))
    p = subprocess.run(mpiexec(2) + [sys.executable, "-m", "fedmpi", "run", cfg, "--out", str(out), "--quiet"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    recorded = _trackers(out)
    assert [r["id"] for r in wandb_offline_runs(str(tmp_path / "wandb"))] == [recorded["wandb"]["id"]]
    assert [r.info.run_id for r in mlflow_runs(recorded["mlflow"]["tracking_uri"])] == [recorded["mlflow"]["run_id"]]


@pytest.mark.slow
def test_a_packed_sweep_gives_each_cell_its_own_tracker_runs(tmp_path, monkeypatch):
    """Cells trained together in one process each get their own W&B and MLflow run (W&B's runs
    open at once), and a tracker's store is an output: the next cell does not take the file the
    first one wrote for an input (which made it 'outdated' in --status)."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from helpers.trackers import mlflow_runs, wandb_offline_runs

    write_config(tmp_path / "base.yaml", synthetic_config(rounds=3, eval_every=1, runtime={
        "progress": False, "wandb": "p", "mlflow": str(tmp_path / "ml.db")}))
    sweep = write_config(tmp_path / "s.sweep.yaml", {"base": "base.yaml", "out": "out", "grid": {"seed": [0, 1]},
                                                     "variants": [{"label": "a"}]})
    p = fedmpi(["sweep", sweep, "--pack", "2"], env=_env(tmp_path))
    assert "2 done" in p.stderr.splitlines()[-1], p.stderr
    status = fedmpi(["sweep", sweep, "--status"], env=_env(tmp_path)).stdout
    assert "2 done" in status and " 0 outdated" in status.splitlines()[-1], status
    ids = {_trackers(tmp_path / "out" / "a" / f"seed={s}.h5")["wandb"]["id"] for s in (0, 1)}
    runs = wandb_offline_runs(str(tmp_path / "wandb"))
    assert {r["id"] for r in runs} == ids and len(ids) == 2
    assert all([row["round"] for row in r["rows"]] == [0, 1, 2, 3] for r in runs)
    assert sorted(r.info.run_name for r in mlflow_runs(f"sqlite:///{tmp_path / 'ml.db'}")) == \
        ["out/a/seed=0", "out/a/seed=1"]
